/* test_stats_keys.c — `stats:`, `lynx.from: file`, `diffkv.scores: file` through the binary (docs/stats-format.md). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/accuracy/model_stats.h"
#include "tests/support.h"

static char *dir;

static void setup(void)
{
    dir = kvt_tempdir();
}

static void teardown(void)
{
    kvt_rmtree(dir);
    free(dir);
}

TestSuite(stats_keys, .init = setup, .fini = teardown);

/* A hand-written statistics file of a 2-layer, 1-KV-head model: Lynx 8 + 4/4 (lynx.lua's encodings)
   at 512 and 2,048 tokens, DiffKV window 64 (diffkv.lua's) with 129 quantiles a head. Numbers are
   written short ("%.6g"), as a person or another tool would, so the bytes kvsim writes back differ. */
static char *stats_text(void)
{
    size_t cap = 1 << 20, n = 0;
    char *t = malloc(cap);
#define PUT(...) (n += (size_t)snprintf(t + n, cap - n, __VA_ARGS__))
    PUT("{\"format\": \"kvsim-model-stats\", \"version\": 1,\n"
        "\"model\": {\"name\": \"tiny\", \"file\": \"tiny.gguf\", \"sha256\": \"\", \"layers\": 2, \"heads\": 2,"
        " \"kv_heads\": 1, \"head_dim\": 8, \"context\": 8192},\n"
        "\"producer\": {\"tool\": \"hand\", \"command\": \"test_stats_keys\", \"measurement\": 2},\n"
        "\"texts\": [],\n"
        "\"lynx\": [{\"encodings\": [\"k=int8a4g32,v=int8a4g32\"], \"positions\": 8, \"lengths\": [512, 2048],\n"
        "  \"accept\": [[0.97, 0.95, 0.9, 0.9, 0.85, 0.8, 0.8, 0.7], [0.7, 0.6, 0.6, 0.5, 0.5, 0.4, 0.4, 0.3]],"
        " \"samples\": [32, 32]}],\n"
        "\"diffkv\": [{\"window\": 64, \"points\": 129, \"lengths\": [512, 2048]");
    for (int which = 0; which < 2; which++) {
        PUT(", \"%s\": [", which ? "exit" : "prefill");
        for (int len = 0; len < 2; len++) {
            PUT("%s[", len ? ", " : "");
            for (int l = 0; l < 2; l++) {
                PUT("%s[[", l ? ", " : "");
                for (int u = 0; u <= 128; u++) {
                    double x = (double)u / 128.0;
                    PUT("%s%.6g", u ? ", " : "", (len ? 6.0 : 3.0) * x * x * x / (1.0 + which + l));
                }
                PUT("]]");
            }
            PUT("]");
        }
        PUT("]");
    }
    PUT("}]}\n");
#undef PUT
    cr_assert_lt(n, cap);
    return t;
}

static const char *const SCENARIO =
    "name: statsfile\n"
    "model: llama-3.1-8b\n"
    "stats: stats.json\n"
    "cluster:\n"
    "  prefill: {nodes: 1, device: h100-sxm}\n"
    "  decode: {nodes: 1, device: h100-sxm}\n"
    "network: {model: ideal, nic_bandwidth_gbps: 25, nic_latency_us: 5}\n"
    "workload:\n"
    "  requests: 8\n"
    "  rate_per_s: 2\n"
    "  prompt: {dist: lognormal, value: 1024, sigma: 0.8, max: 6000}\n"
    "  output: {dist: fixed, value: 32}\n"
    "lynx: {from: file}\n"
    "diffkv: {scores: file}\n"
    "policies: [lynx, diffkv, int8]\n";

/* Writes the scenario (with `from` replaced by `to` when from is not NULL) and the stats file; returns the
   scenario's path. */
static char *write_inputs(const char *from, const char *to)
{
    char *text = strdup(SCENARIO);
    if (from) {
        char *at = strstr(text, from);
        cr_assert(at, "\"%s\" is not in the scenario", from);
        size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
        char *t = malloc(n);
        snprintf(t, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
        free(text);
        text = t;
    }
    char *stats = stats_text();
    free(kvt_write(dir, "stats.json", stats));
    free(stats);
    char *path = kvt_write(dir, "s.yaml", text);
    free(text);
    return path;
}

/* kvsim run scenario --out dir/out [extra]; returns the exit code, output in *out. */
static int run(const char *scenario, const char *out_name, const char *extra, char **out)
{
    char args[2048];
    snprintf(args, sizeof args, "run %s --out %s/%s %s", scenario, dir, out_name, extra ? extra : "");
    return kvt_kvsim(args, out);
}

static char *results(const char *out_name)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/results.json", dir, out_name);
    char *r = kvt_read(p, NULL);
    cr_assert(r, "no %s", p);
    return r;
}

Test(stats_keys, lynx_and_diffkv_from_file_run_reproducibly)
{
    char *scenario = write_inputs(NULL, NULL), *out = NULL;
    cr_assert_eq(run(scenario, "a", NULL, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(run(scenario, "b", NULL, &out), 0, "%s", out);
    free(out);
    char *a = results("a"), *b = results("b");
    cr_expect_str_eq(a, b, "two runs, same results.json");
    cr_expect(strstr(a, "\"lynx_acceptance_from\":\"file\""), "%s", a);
    cr_expect(strstr(a, "\"acceptance_source\":\"file stats.json: model tiny (sha256 none), measurement 2, 64 "
                        "speculations of k=8 on anchor-only KV at prompt lengths 512, 2048 tokens\""),
              "%s", a);
    cr_expect(strstr(a, "\"tiers_source\":\"file stats.json: model tiny"), "%s", a);
    cr_expect(strstr(a, "window 64, at prompt lengths 512, 2048 tokens"), "%s", a);
    cr_expect(strstr(a, "\"acceptance_samples\":64"), "%s", a);
    free(a);
    free(b);
    free(scenario);
}

/* The round trip: the file read and written back by kvsim (other bytes, the same numbers) gives
   the same results.json. */
Test(stats_keys, written_back_file_gives_identical_results)
{
    char *scenario = write_inputs(NULL, NULL), *out = NULL;
    cr_assert_eq(run(scenario, "a", NULL, &out), 0, "%s", out);
    free(out);
    char *path = kvt_path(dir, "stats.json");
    char *before = kvt_read(path, NULL);
    kv_model_stats s;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(path, &s, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_model_stats_write(path, &s, &err), KV_OK, "%s", err.msg);
    kv_model_stats_free(&s);
    char *after = kvt_read(path, NULL);
    cr_expect_str_neq(before, after, "kvsim writes the numbers in its own form (17 digits)");
    cr_assert_eq(run(scenario, "b", NULL, &out), 0, "%s", out);
    free(out);
    char *a = results("a"), *b = results("b");
    cr_expect_str_eq(a, b, "written back: same results.json");
    free(a);
    free(b);
    free(before);
    free(after);
    free(path);
    free(scenario);
}

/* A copy of lynx.lua with another bit split has other encodings: not given lynx's acceptance. */
Test(stats_keys, other_encodings_are_not_given_lynx_acceptance)
{
    char *scenario = write_inputs("policies: [lynx, diffkv, int8]", "policies: [lynx, lynx2]"), *out = NULL;
    char *src = kvt_source("policies/lynx.lua");
    char *lua = kvt_read(src, NULL);
    cr_assert(lua);
    char *at = strstr(lua, "anchor_bits = 4,");
    cr_assert(at);
    at[strlen("anchor_bits = ")] = '2';
    char *pdir = kvt_path(dir, "policies");
    cr_assert_eq(mkdir(pdir, 0755), 0);
    free(kvt_write(pdir, "lynx2.lua", lua));
    cr_expect_eq(run(scenario, "a", NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:13:"), "position of lynx.from: %s", out);
    cr_expect(strstr(out, "stats.json has no Lynx acceptance for policy 'lynx2' (encodings k=int8a2g32,v=int8a2g32"),
              "%s", out);
    cr_expect(strstr(out, "kvsim measure"), "%s", out);
    cr_expect(strstr(out, "lynx.from: reference-model"), "%s", out);
    char *listing = kvt_listing(dir);
    cr_expect_str_eq(listing, "policies s.yaml stats.json", "no output folder: %s", listing);
    free(listing);
    free(out);
    free(pdir);
    free(lua);
    free(src);
    free(scenario);
}

Test(stats_keys, missing_diffkv_window)
{
    char *scenario = write_inputs(NULL, NULL), *out = NULL;
    cr_expect_eq(run(scenario, "a", "--set policy.diffkv.window=32", &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:14:"), "position of diffkv.scores: %s", out);
    cr_expect(strstr(out, "stats.json has no DiffKV significance for window 32 (policy 'diffkv')"), "%s", out);
    free(out);
    free(scenario);
}

Test(stats_keys, lynx_from_file_needs_stats)
{
    char *scenario = write_inputs("stats: stats.json\n", ""), *out = NULL;
    cr_expect_eq(run(scenario, "a", NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:12:") && strstr(out, "lynx.from: file needs `stats: PATH`"), "%s", out);
    free(out);
    free(scenario);
}

Test(stats_keys, diffkv_scores_file_needs_stats)
{
    char *scenario = write_inputs("stats: stats.json\n", ""), *out = NULL;
    cr_expect_eq(run(scenario, "a", "--set lynx.from=scenario", &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:13:") && strstr(out, "diffkv.scores: file needs `stats: PATH`"), "%s", out);
    free(out);
    free(scenario);
}

Test(stats_keys, stats_file_missing_or_bad)
{
    char *scenario = write_inputs("stats: stats.json", "stats: absent.json"), *out = NULL;
    cr_expect_eq(run(scenario, "a", NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "absent.json") && strstr(out, "stats"), "%s", out);
    free(out);
    free(kvt_write(dir, "absent.json", "{\"format\": \"kvsim-model-stats\",\n \"version\": 2}\n"));
    cr_expect_eq(run(scenario, "a", NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "absent.json:2: version is 2"), "%s", out);
    free(out);
    free(scenario);
}

/* The table's legend says "fixed" only when a row's acceptance is the scenario's fixed value: with the
   acceptance from the file it said so anyway, under measured rows. */
Test(stats_keys, fixed_legend_only_for_fixed_acceptance)
{
    char *scenario = write_inputs(NULL, NULL), *out = NULL;
    cr_assert_eq(run(scenario, "file", NULL, &out), 0, "%s", out);
    cr_expect(strstr(out, "accept = accepted / speculated;") != NULL, "%s", out);
    cr_expect(strstr(out, "fixed") == NULL, "no row nor legend says fixed: %s", out);
    free(out);
    cr_assert_eq(run(scenario, "fixed", "--set lynx.from=scenario", &out), 0, "%s", out);
    cr_expect(strstr(out, " fixed\n") != NULL, "the lynx row says fixed: %s", out);
    cr_expect(strstr(out, "(fixed: drawn from lynx.acceptance, not measured)") != NULL, "%s", out);
    free(out);
    free(scenario);
}
