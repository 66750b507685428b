/* test_lynx_feed.c — Lynx acceptance measured per bit split by default, cached on disk; results.json records
 * policy parameters and --set overrides; a missing reference model is a clear exit 2. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/study/study.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

/* Fetches the reference model (once; cached) or says visibly why it cannot be had. */
static int model_available(void)
{
    char reason[512];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path) {
        fprintf(stderr, "skipped: lynx acceptance from the reference model: %s\n", reason);
        return 0;
    }
    free(path);
    return 1;
}

/* Three Lynx splits of 8 bits, ideal network, one request at a time (no queueing: the splits differ only in
   their anchor); lynx.from left at its default. */
static char *write_splits(const char *dir, const char *more)
{
    char text[4096];
    snprintf(text, sizeof text,
             "name: splits\n"
             "model: llama-3.1-8b\n"
             "seed: 5\n"
             "network: {model: ideal, nic_bandwidth_gbps: 25}\n"
             "workload: {requests: 24, arrival: fixed, rate_per_s: 0.5, prompt: {dist: fixed, value: 16000}, "
             "output: {dist: fixed, value: 32}}\n"
             "lynx: {ttkt_k: 10}\n"
             "outputs: {trace: false, csv: false}\n"
             "policies: [a2, a3, a4]\n"
             "policy:\n"
             "  a2: {file: policies/lynx.lua, anchor_bits: 2}\n"
             "  a3: {file: policies/lynx.lua, anchor_bits: 3}\n"
             "  a4: {file: policies/lynx.lua, anchor_bits: 4}\n%s",
             more ? more : "");
    return kvt_write(dir, "splits.yaml", text);
}

static int count_entries(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        n += l > s && strcmp(e->d_name + l - s, suffix) == 0;
    }
    closedir(d);
    return n;
}

/* The default measures each split: a thinner anchor is accepted less, and ttkt follows. */
Test(lynx_feed, acceptance_depends_on_the_anchor_split_by_default, .timeout = 1800)
{
    if (!model_available())
        cr_skip("reference model not available");
    char *dir = kvt_tempdir();
    char cache[512];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    char *path = write_splits(dir, NULL);
    kv_error err = {0};
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load(path, NULL, 0, &s, &err), 0, "%s", err.msg);
    cr_expect_eq(s->lynx.from, KV_LYNX_FROM_REFERENCE_MODEL, "the default");
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(st, &err), 0, "%s", err.msg);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 3);
    for (size_t i = 0; i < n; i++) {
        cr_expect(strstr(o[i].run.acceptance_source, "reference model smollm2-135m") != NULL, "%s: %s", o[i].name,
                  o[i].run.acceptance_source);
        cr_expect(strstr(o[i].run.acceptance_source, "clamped to 1024") != NULL, "%s", o[i].run.acceptance_source);
        cr_expect_gt(o[i].acceptance_samples, 8, "%s: %ld samples", o[i].name, o[i].acceptance_samples);
        fprintf(stderr, "lynx_feed: %s accept %.3f ttft_spec %.1f ttft %.1f ttkt@10 %.1f ms\n", o[i].name,
                o[i].summary.spec_accept_rate, o[i].summary.ttft_spec_ms.mean, o[i].summary.ttft_ms.mean,
                o[i].summary.ttkt_ms.mean);
    }
    const kv_summary *a2 = &o[0].summary, *a3 = &o[1].summary, *a4 = &o[2].summary;
    cr_expect_lt(a2->spec_accept_rate, a4->spec_accept_rate, "2+6 %.3f must be accepted less than 4+4 %.3f",
                 a2->spec_accept_rate, a4->spec_accept_rate);
    cr_expect(a2->spec_accept_rate != a3->spec_accept_rate && a3->spec_accept_rate != a4->spec_accept_rate,
              "each split measures its own rate: %.3f %.3f %.3f", a2->spec_accept_rate, a3->spec_accept_rate,
              a4->spec_accept_rate);
    /* The thinner anchor arrives first, but fewer of its tokens survive: the 10th committed token comes later. */
    cr_expect_lt(a2->ttft_spec_ms.mean, a4->ttft_spec_ms.mean);
    cr_expect_gt(a2->ttkt_ms.mean, a4->ttkt_ms.mean, "ttkt@10: 2+6 %.1f ms, 4+4 %.1f ms", a2->ttkt_ms.mean,
                 a4->ttkt_ms.mean);
    cr_expect_eq(count_entries(cache, ".feed"), 3, "one cache entry per split");
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* The second run reads the cache: the same bytes, no measurement; the cached numbers are what it uses. */
Test(lynx_feed, second_run_hits_the_cache, .timeout = 900)
{
    if (!model_available())
        cr_skip("reference model not available");
    char *dir = kvt_tempdir();
    char cache[512], args[2048];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    /* Small and fast: 4 speculations on 64..128-token prompts; one split. */
    char *path = write_splits(dir, "");
    const char *small = "--set lynx.samples=4 --set lynx.max_prompt_tokens=128 --set 'policies=[a2]' "
                        "--set 'policy={a2: {file: policies/lynx.lua, anchor_bits: 2}}' --quiet";
    char *out1 = NULL, *out2 = NULL, *out3 = NULL;
    snprintf(args, sizeof args, "run %s %s --out %s/r1", path, small, dir);
    cr_assert_eq(kvt_kvsim(args, &out1), 0, "%s", out1);
    cr_expect(strstr(out1, "measuring Lynx acceptance") != NULL, "the cold run measures:\n%s", out1);
    cr_assert_eq(count_entries(cache, ".feed"), 1);
    snprintf(args, sizeof args, "run %s %s --out %s/r2", path, small, dir);
    cr_assert_eq(kvt_kvsim(args, &out2), 0, "%s", out2);
    cr_expect(strstr(out2, "measuring") == NULL && strstr(out2, "from the feed cache") != NULL,
              "the second run reads the cache:\n%s", out2);
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/r1/results.json", dir);
    snprintf(p2, sizeof p2, "%s/r2/results.json", dir);
    size_t n1 = 0, n2 = 0;
    char *j1 = kvt_read(p1, &n1), *j2 = kvt_read(p2, &n2);
    cr_assert(j1 && j2);
    cr_expect(n1 == n2 && memcmp(j1, j2, n1) == 0, "a cached run writes the same results.json byte for byte");
    cr_expect(strstr(j1, "\"acceptance_samples\":4,") != NULL, "%s", j1);

    /* Doctor the entry: every position always accepted. A run that used it must accept every token. */
    DIR *d = opendir(cache);
    cr_assert(d);
    struct dirent *e;
    char entry[1024] = "";
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".feed"))
            snprintf(entry, sizeof entry, "%s/%s", cache, e->d_name);
    closedir(d);
    size_t len = 0;
    char *text = kvt_read(entry, &len);
    char *values = strstr(text, "\nvalues ");
    cr_assert(values, "%s", text);
    int n_values = atoi(values + 8);
    cr_assert_eq(n_values, 2 + 1 + 8, "positions, lengths (1: 4 samples), speculations, 8 conditional rates");
    char *line = strchr(values + 1, '\n') + 1; /* positions */
    line = strchr(line, '\n') + 1;             /* lengths */
    line = strchr(line, '\n') + 1;             /* speculations */
    line = strchr(line, '\n') + 1;             /* the first rate */
    char doctored[8192];
    int at = snprintf(doctored, sizeof doctored, "%.*s", (int)(line - text), text);
    for (int i = 0; i < 8; i++)
        at += snprintf(doctored + at, sizeof doctored - (size_t)at, "1\n");
    snprintf(doctored + at, sizeof doctored - (size_t)at, "end\n");
    FILE *f = fopen(entry, "wb");
    fputs(doctored, f);
    fclose(f);
    snprintf(args, sizeof args, "run %s %s --out %s/r3", path, small, dir);
    cr_assert_eq(kvt_kvsim(args, &out3), 0, "%s", out3);
    char p3[600];
    snprintf(p3, sizeof p3, "%s/r3/results.json", dir);
    char *j3 = kvt_read(p3, NULL);
    cr_assert(j3);
    cr_expect(strstr(j3, "\"spec_accept_rate\":1,") != NULL, "the run used the cached rates (all 1):\n%s", j3);
    free(text);
    free(j1);
    free(j2);
    free(j3);
    free(out1);
    free(out2);
    free(out3);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* Without the model: exit 2, the message says how to fetch it and how to opt out; no output is written. */
Test(lynx_feed, missing_model_is_exit_2_with_the_fix)
{
    char *dir = kvt_tempdir();
    char models[512], args[2048], results[600];
    snprintf(models, sizeof models, "%s/no-models-here", dir);
    setenv("KVSIM_MODEL_DIR", models, 1);
    snprintf(results, sizeof results, "%s/out/results.json", dir);
    char *path = write_splits(dir, NULL);
    char *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out %s/out", path, dir);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    cr_expect(strstr(out, "sh scripts/fetch-model.sh") != NULL, "names the fetch command:\n%s", out);
    cr_expect(strstr(out, "lynx.from: scenario") != NULL, "names the opt-out:\n%s", out);
    cr_expect(strstr(out, path) != NULL, "names the scenario file:\n%s", out);
    cr_expect(kvt_read(results, NULL) == NULL, "no results.json after the error");
    free(out);
    /* Opting out needs no model. */
    snprintf(args, sizeof args, "run %s --quiet --set lynx.from=scenario --out %s/out", path, dir);
    cr_expect_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    /* Policies that do not speculate need no model either. */
    snprintf(args, sizeof args, "run scenarios/quickstart.yaml --quiet --set workload.requests=4 --out %s/q", dir);
    cr_expect_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* results.json: every policy's parameters in effect, every --set override in order, the acceptance source. */
Test(lynx_feed, results_json_records_params_and_overrides)
{
    char *dir = kvt_tempdir();
    char args[2048], results[600];
    char *path = write_splits(dir, NULL);
    char *out = NULL;
    snprintf(args, sizeof args,
             "run %s --quiet --set lynx.from=scenario --set 'policies=[a3, int8]' "
             "--set 'policy={a3: {file: policies/lynx.lua, anchor_bits: 3}}' --set policy.a3.speculate=4 "
             "--set 'policy.a3.order=concurrent' --seed 9 --out %s/out",
             path, dir);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    snprintf(results, sizeof results, "%s/out/results.json", dir);
    char *json = kvt_read(results, NULL);
    cr_assert(json);
    const char *want_overrides = "\"overrides\":[{\"key\":\"lynx.from\",\"value\":\"scenario\"},"
                                 "{\"key\":\"policies\",\"value\":\"[a3, int8]\"},"
                                 "{\"key\":\"policy\",\"value\":\"{a3: {file: policies/lynx.lua, anchor_bits: 3}}\"},"
                                 "{\"key\":\"policy.a3.speculate\",\"value\":\"4\"},"
                                 "{\"key\":\"policy.a3.order\",\"value\":\"concurrent\"},"
                                 "{\"key\":\"seed\",\"value\":\"9\"}],";
    cr_expect(strstr(json, want_overrides) != NULL, "overrides in order:\n%s", json);
    const char *a3 = strstr(json, "{\"name\":\"a3\"");
    cr_assert(a3, "%s", json);
    cr_expect(strstr(a3, "\"params\":{\"anchor_bits\":\"3\",") != NULL, "a3's params:\n%s", a3);
    cr_expect(strstr(a3, "\"speculate\":\"4\"") != NULL, "%s", a3);
    cr_expect(strstr(a3, "\"bits\":\"8\"") != NULL, "%s", a3);
    cr_expect(strstr(a3, "\"acceptance_source\":\"scenario (lynx.acceptance)\",\"acceptance_samples\":0,") != NULL,
              "%s", a3);
    const char *i8 = strstr(json, "{\"name\":\"int8\"");
    cr_assert(i8);
    cr_expect(strstr(i8, "\"params\":{\"bits\":\"8\",\"group_size\":\"32\"}") != NULL, "int8's params:\n%s", i8);
    free(json);
    free(out);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
