/* test_validate_feasible.c — kvsim validate's feasibility checks (weights per device, context, KV of a
   request), --strict, and that it measures nothing: every shipped scenario validates in seconds. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support.h"

/* A scenario around the given cluster and workload lines; written to a fresh folder (*dir). */
static char *scenario(char **dir, const char *model, const char *cluster, const char *workload)
{
    *dir = kvt_tempdir();
    cr_assert(*dir);
    char *text = NULL;
    cr_assert(asprintf(&text,
                       "name: feasible\n"
                       "model: %s\n"
                       "cluster:\n%s"
                       "network: {model: ideal}\n"
                       "workload:\n%s"
                       "policies: [bf16, int4]\n",
                       model, cluster, workload) > 0);
    char *path = kvt_write(*dir, "s.yaml", text);
    cr_assert(path);
    free(text);
    return path;
}

static int validate(const char *path, const char *extra, char **out)
{
    char *args = NULL;
    cr_assert(asprintf(&args, "validate '%s' %s", path, extra ? extra : "") > 0);
    int rc = kvt_kvsim(args, out);
    free(args);
    return rc;
}

static void done(char *dir, char *path)
{
    kvt_rmtree(dir);
    free(dir);
    free(path);
}

Test(feasible, weights_70b_tp1_on_80gb_is_an_error)
{
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-70b",
                          "  prefill: {nodes: 1, device: h100-sxm, tp: 4}\n"
                          "  decode:\n    nodes: 1\n    device: h100-sxm\n    tp: 1\n",
                          "  requests: 4\n  prompt: {dist: fixed, value: 1024}\n  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 2, "%s", out);
    /* file:line:col of cluster.decode.tp (line 8), the key, and what to do */
    cr_expect(strstr(out, "s.yaml:8:9: cluster.decode.tp:") && strstr(out, "do not fit one H100") &&
                  strstr(out, "raise cluster.decode.tp to at least 2"), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, weights_on_the_prefill_pool)
{
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-70b",
                          "  prefill: {nodes: 1, device: h100-sxm, tp: 1}\n"
                          "  decode: {nodes: 1, device: h100-sxm, tp: 4}\n",
                          "  requests: 4\n  prompt: {dist: fixed, value: 1024}\n  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:4:") && strstr(out, "cluster.prefill.tp:") && strstr(out, "at tp 1"), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, prompts_longer_than_the_context_are_an_error)
{
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-8b", "  prefill: {nodes: 1}\n  decode: {nodes: 1}\n",
                          "  requests: 4\n  prompt: {dist: fixed, value: 32768}\n  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:9:") && strstr(out, "workload.prompt:") && strstr(out, "4 of 4 requests") &&
                  strstr(out, "context of 8192 tokens"), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, some_requests_past_the_context_warn_or_fail_strict)
{
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-8b", "  prefill: {nodes: 1}\n  decode: {nodes: 1}\n",
                          "  requests: 20\n  prompt: {dist: empirical, samples: [1000, 8190]}\n"
                          "  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 0, "%s", out);
    cr_expect(strstr(out, "warning: ") && strstr(out, "workload.prompt:") && strstr(out, "ok: "), "%s", out);
    free(out);
    cr_expect_eq(validate(path, "--strict", &out), 2, "%s", out);
    cr_expect(strstr(out, "workload.prompt:") && strstr(out, "--strict") && !strstr(out, "ok: "), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, no_request_fits_kv_memory)
{
    /* 70B at tp 2 with memory_fraction 0.885: 141.6 GB usable less 141.2 GB of weights leaves 0.4 GB,
       less than a 2112-token bf16 request (0.69 GB). */
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-70b",
                          "  prefill: {nodes: 1, tp: 4}\n"
                          "  decode: {nodes: 1, tp: 2, memory_fraction: 0.885, max_batch_tokens: 512}\n",
                          "  requests: 4\n  prompt: {dist: fixed, value: 2048}\n  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:5:") && strstr(out, "cluster.decode.tp:") && strstr(out, "policy bf16") &&
                  strstr(out, "smallest request's KV (2112 tokens"), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, largest_request_past_kv_memory_warns)
{
    /* 0.89: about 1.2 GB for KV; 1100 tokens of bf16 fit (0.36 GB), 8100 do not (2.65 GB). */
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-70b",
                          "  prefill: {nodes: 1, tp: 4}\n"
                          "  decode: {nodes: 1, tp: 2, memory_fraction: 0.89, max_batch_tokens: 512}\n",
                          "  requests: 40\n  prompt: {dist: empirical, samples: [1000, 8000]}\n"
                          "  output: {dist: fixed, value: 100}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, NULL, &out), 0, "%s", out);
    cr_expect(strstr(out, "warning: ") && strstr(out, "largest request's KV (8100 tokens") && strstr(out, "ok: "),
              "%s", out);
    free(out);
    cr_expect_eq(validate(path, "--strict", &out), 2, "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, a_feasible_scenario_has_no_warning)
{
    char *dir = NULL;
    char *path = scenario(&dir, "llama-3-8b", "  prefill: {nodes: 1}\n  decode: {nodes: 1}\n",
                          "  requests: 4\n  prompt: {dist: fixed, value: 2048}\n  output: {dist: fixed, value: 64}\n");
    char *out = NULL;
    cr_expect_eq(validate(path, "--strict", &out), 0, "%s", out);
    cr_expect(!strstr(out, "warning") && strstr(out, "ok: "), "%s", out);
    free(out);
    done(dir, path);
}

Test(feasible, every_shipped_scenario_validates_quickly, .timeout = 120)
{
    /* validate measures nothing: no kernels, no reference model (lynx.from: reference-model and
       diffkv.scores: measured took a minute before), so each scenario takes well under 5 s. */
    const char *patterns[] = {KV_SOURCE_DIR "/scenarios/*.yaml", KV_SOURCE_DIR "/scenarios/tutorial/*.yaml"};
    size_t checked = 0;
    for (size_t k = 0; k < 2; k++) {
        glob_t g;
        cr_assert_eq(glob(patterns[k], 0, NULL, &g), 0);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            char *out = NULL;
            int rc = validate(g.gl_pathv[i], NULL, &out);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
            cr_expect_eq(rc, 0, "%s: %s", g.gl_pathv[i], out);
            cr_expect(s < 5.0, "%s: validate took %.1f s", g.gl_pathv[i], s);
            cr_expect(!strstr(out, "reference model"), "%s measured: %s", g.gl_pathv[i], out);
            free(out);
            checked++;
        }
        globfree(&g);
    }
    cr_expect(checked >= 8, "only %zu shipped scenarios found", checked);
}
