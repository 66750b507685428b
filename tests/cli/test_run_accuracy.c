/* test_run_accuracy.c — accuracy beside latency (#20): `kvsim run` shows each policy's accuracy from kvsim eval's
 * figures (feed cache) with the model named, says what is not measured and how to measure it, and writes an
 * "accuracy" member per policy in results.json; `kvsim eval --set` changes what is evaluated; `kvsim eval
 * --stats FILE` merges the figures into a statistics file's accuracy[] entries. On the tiny random model. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/model_fixture.h"
#include "tests/support.h"

typedef struct fixture {
    char *dir, *model, *text, *scenario;
} fixture;

/* A tiny model and text in a fresh folder, that folder's cache/ as the feed cache, and a scenario whose
   simulation needs no measurement (ideal network, fixed acceptance) and whose accuracy section is the tiny
   model's. */
static void setup(fixture *f, const char *stats_line)
{
    f->dir = kvt_tempdir();
    f->model = kvt_tiny_model_file(f->dir, 5);
    f->text = kvt_tiny_model_text(f->dir);
    cr_assert(f->model && f->text);
    char cache[600], body[4096];
    snprintf(cache, sizeof cache, "%s/cache", f->dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    snprintf(body, sizeof body,
             "seed: 3\nmodel: smollm2-135m\nnetwork: {model: ideal, nic_bandwidth_gbps: 100, nic_latency_us: 5}\n"
             "workload: {requests: 4, prompt: {dist: fixed, value: 1000}, output: {dist: fixed, value: 8}}\n"
             "lynx: {from: scenario, acceptance: 0.9}\npolicies: [bf16, int4, lynx]\n%s"
             "accuracy:\n  model: %s\n  texts: [%s]\n  context_tokens: 48\n  score_tokens: 64\n"
             "  generate_tokens: 4\n  needle: {count: 1, context_tokens: 160}\n  speculation_points: 2\n",
             stats_line, f->model, f->text);
    f->scenario = kvt_write(f->dir, "scenario.yaml", body);
}

static void teardown(fixture *f)
{
    kvt_rmtree(f->dir);
    free(f->dir);
    free(f->model);
    free(f->text);
    free(f->scenario);
}

static char *kvsim_ok(const char *args)
{
    char *out = NULL;
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "kvsim %s exited %d:\n%s", args, rc, out);
    cr_assert_null(strstr(out, "AddressSanitizer"), "%s", out);
    return out;
}

/* The line of `out` that starts with name + " " after the text `after`, copied into line. */
static void row_after(const char *out, const char *after, const char *name, char *line, size_t size)
{
    const char *from = strstr(out, after);
    cr_assert_not_null(from, "no '%s' in:\n%s", after, out);
    char key[64];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(from, key);
    cr_assert_not_null(p, "no row %s after '%s' in:\n%s", name, after, out);
    p++;
    size_t n = strcspn(p, "\n");
    n = n < size - 1 ? n : size - 1;
    memcpy(line, p, n);
    line[n] = '\0';
}

Test(run_accuracy, columns_then_eval_figures)
{
    fixture f;
    setup(&f, "");
    char args[4096], line[512];
    /* Nothing measured yet: the columns are there, every cell "-", and one line says how to measure. */
    snprintf(args, sizeof args, "run %s --out %s/r1", f.scenario, f.dir);
    char *out = kvsim_ok(args);
    cr_assert(strstr(out, "accuracy     ttft ms  tpot ms       delta ppl  top1 agree%"), "%s", out);
    row_after(out, "accuracy     ttft ms", "int4", line, sizeof line);
    cr_assert(strstr(line, "  -            -            -            -"), "int4: '%s'", line);
    cr_assert(strstr(out, "accuracy: kvsim eval on the reference model kvsim tiny random llama (tiny.gguf): 1 text(s) x "
                          "64 scored tokens after 48-token prompts"), "%s", out);
    char how[1024];
    snprintf(how, sizeof how, "accuracy: not measured for bf16, int4, lynx: run `kvsim eval %s` (about ", f.scenario);
    cr_assert(strstr(out, how), "%s", out);
    snprintf(args, sizeof args, "%s/r1/results.json", f.dir);
    char *json = kvt_read(args, NULL);
    cr_assert(json && strstr(json, "\"accuracy\":{\"measured\":false,\"source\":\"not measured\"}"), "%s", json);
    free(json);
    free(out);

    /* kvsim eval of the same scenario; then run shows its figures, from the cache. */
    snprintf(args, sizeof args, "eval %s --quiet", f.scenario);
    char *eval = kvsim_ok(args);
    char eline[512], delta[64], pm[64];
    row_after(eval, "delta ±95%", "int4", eline, sizeof eline);
    cr_assert_eq(sscanf(eline, "%*s %*s %*s %63s %63s", delta, pm), 2, "'%s'", eline);
    snprintf(args, sizeof args, "run %s --out %s/r2", f.scenario, f.dir);
    out = kvsim_ok(args);
    row_after(out, "accuracy     ttft ms", "int4", line, sizeof line);
    cr_assert(strstr(line, delta) && strstr(line, pm), "run's int4 row '%s' lacks eval's %s %s", line, delta, pm);
    row_after(out, "accuracy     ttft ms", "lynx", line, sizeof line);
    cr_assert(strstr(line, "\u00b1"), "lynx: '%s'", line);
    cr_assert(strstr(out, "from the eval cache"), "%s", out);
    cr_assert_null(strstr(out, "accuracy: not measured"), "%s", out);
    snprintf(args, sizeof args, "%s/r2/results.json", f.dir);
    json = kvt_read(args, NULL);
    cr_assert(json && strstr(json, "\"accuracy\":{\"measured\":true,\"source\":\"eval cache\",\"context_tokens\":48,"
                                   "\"scored_tokens\":64,\"delta_ppl\":"), "%s", json);
    cr_assert(strstr(json, "\"delta_ppl_ci95\":["), "%s", json);
    free(json);
    free(out);

    /* Other eval settings are another measurement: not measured again, and the hint repeats the --set. */
    snprintf(args, sizeof args, "run %s --set accuracy.score_tokens=32", f.scenario);
    out = kvsim_ok(args);
    snprintf(how, sizeof how, "run `kvsim eval %s --set 'accuracy.score_tokens=32'`", f.scenario);
    cr_assert(strstr(out, "accuracy: not measured for bf16, int4, lynx") && strstr(out, how), "%s", out);
    free(out);
    free(eval);
    teardown(&f);
}

Test(run_accuracy, eval_set_changes_what_is_evaluated)
{
    fixture f;
    setup(&f, "");
    char args[4096];
    snprintf(args, sizeof args, "eval %s --quiet --set accuracy.score_tokens=16 --set policies=[bf16,int4]", f.scenario);
    char *out = kvsim_ok(args);
    cr_assert(strstr(out, "1 text prompt(s) (16 scored tokens each row)"), "%s", out);
    cr_assert(strstr(out, "\nint4 ") && !strstr(out, "\nlynx "), "%s", out);
    free(out);
    snprintf(args, sizeof args, "eval %s --quiet --set accuracy.score_tokenz=16", f.scenario);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "score_tokenz"), "the message names the bad key:\n%s", out);
    free(out);
    teardown(&f);
}

/* A statistics file of the tiny model's shape, with kv_heads KV heads, and no entries. */
static void stats_body(char *body, size_t size, int kv_heads)
{
    snprintf(body, size,
             "{\"format\": \"kvsim-model-stats\", \"version\": 1,\n"
             " \"model\": {\"name\": \"tiny\", \"file\": \"tiny.gguf\", \"sha256\": \"\", \"layers\": 2, "
             "\"heads\": 4, \"kv_heads\": %d, \"head_dim\": 16, \"context\": 512},\n"
             " \"producer\": {\"tool\": \"test\", \"command\": \"test\", \"measurement\": 1},\n"
             " \"texts\": [], \"lynx\": [], \"diffkv\": []}\n",
             kv_heads);
}

Test(run_accuracy, eval_stats_merges_accuracy_entries)
{
    fixture f;
    setup(&f, "");
    char body[1024], args[4096];
    stats_body(body, sizeof body, 2);
    char *stats = kvt_write(f.dir, "stats.json", body);
    snprintf(args, sizeof args, "eval %s --quiet --stats %s", f.scenario, stats);
    for (int pass = 0; pass < 2; pass++) { /* the second pass replaces the entries: still two */
        free(kvsim_ok(args));
        char *json = kvt_read(stats, NULL);
        int n = 0;
        for (const char *p = json; (p = strstr(p, "\"delta_ppl_ci95\"")); p++)
            n++;
        cr_assert_eq(n, 3, "bf16, int4 and lynx, pass %d:\n%s", pass, json);
        cr_assert(strstr(json, "\"encodings\": [\"k=int4"), "%s", json);
        cr_assert(strstr(json, "\"scored_tokens\": 64"), "%s", json);
        cr_assert(strstr(json, "\"accepted_share\": "), "lynx's entry carries its accepted share:\n%s", json);
        /* producer.command says what wrote the accuracy entries, each pass once more */
        char step[600];
        snprintf(step, sizeof step, "; then kvsim eval %s --quiet --stats %s", f.scenario, stats);
        const char *at = strstr(json, step);
        cr_assert(at, "no '%s' in:\n%s", step, json);
        if (pass == 1)
            cr_assert(strstr(at + 1, step), "the second pass adds its step too:\n%s", json);
        free(json);
    }
    /* kvsim run of a scenario whose `stats:` is that file shows its figures, with an empty eval cache. */
    char body2[4096], cache2[600];
    char *plain = kvt_read(f.scenario, NULL);
    snprintf(body2, sizeof body2, "stats: %s\n%s", stats, plain);
    free(plain);
    char *with_stats = kvt_write(f.dir, "with-stats.yaml", body2);
    snprintf(cache2, sizeof cache2, "%s/cache2", f.dir);
    setenv("KVSIM_CACHE_DIR", cache2, 1);
    snprintf(args, sizeof args, "run %s", with_stats);
    char *run = kvsim_ok(args);
    char line[512];
    row_after(run, "accuracy     ttft ms", "int4", line, sizeof line);
    cr_assert(strstr(line, "\u00b1"), "int4 from the file: '%s'\n%s", line, run);
    cr_assert(strstr(run, "; from the stats file ") && !strstr(run, "accuracy: not measured"), "%s", run);
    /* lynx's accept% comes from the file too (it showed '-' for a stats file's figures) */
    row_after(run, "accuracy     ttft ms", "lynx", line, sizeof line);
    size_t len = strlen(line);
    cr_assert(len > 0 && line[len - 1] != '-', "lynx's accept%% from the file: '%s'\n%s", line, run);
    free(run);
    /* Without the model file the run still shows the file's figures (the shape comes from the file). */
    char moved[700];
    snprintf(moved, sizeof moved, "%s.away", f.model);
    cr_assert_eq(rename(f.model, moved), 0);
    run = kvsim_ok(args);
    row_after(run, "accuracy     ttft ms", "int4", line, sizeof line);
    cr_assert(strstr(line, "\u00b1"), "int4 from the file without the model: '%s'\n%s", line, run);
    cr_assert(strstr(run, "; from the stats file "), "%s", run);
    cr_assert_eq(rename(moved, f.model), 0);
    free(run);
    free(with_stats);
    snprintf(args, sizeof args, "eval %s --quiet --stats %s", f.scenario, stats);
    /* Another model's shape: exit 2 naming the file, before any measurement. */
    stats_body(body, sizeof body, 1);
    free(stats);
    stats = kvt_write(f.dir, "stats.json", body);
    char *out = NULL;
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--stats") && strstr(out, "stats.json") && strstr(out, "KV heads"), "%s", out);
    free(out);
    char *json = kvt_read(stats, NULL);
    cr_assert_str_eq(json, body, "the file is left as it was");
    free(json);
    free(stats);
    teardown(&f);
}

Test(run_accuracy, no_accuracy_section_says_so)
{
    char *dir = kvt_tempdir();
    char *sc = kvt_fixture_copy("scenarios/one-request.yaml", dir, "one.yaml");
    char args[1024];
    snprintf(args, sizeof args, "run %s --out %s/r", sc, dir);
    char *out = kvsim_ok(args);
    cr_assert(strstr(out, "accuracy: not measured: the scenario has no `accuracy:` section"), "%s", out);
    snprintf(args, sizeof args, "%s/r/results.json", dir);
    char *json = kvt_read(args, NULL);
    cr_assert(json && !strstr(json, "\"accuracy\""), "no accuracy member without the section:\n%s", json);
    free(json);
    free(out);
    free(sc);
    kvt_rmtree(dir);
    free(dir);
}
