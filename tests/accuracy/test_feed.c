/* test_feed.c — DiffKV's default significance, measured on SmolLM2-135M and cached, drives the engine. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/study/study.h"
#include "tests/support.h"
#include "tests/model_fixture.h"

/* Fetches the reference model (once; cached); skips visibly, or fails where the
   model is required, when it cannot be had. */
static void need_model(void)
{
    char reason[512];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    free(path);
}

/* The default diffkv.scores: measured on SmolLM2-135M (in a fresh cache folder), then the second
   run reads the cache: same table, same results, the same tiers_source (a rerun writes the same bytes). */
Test(feed, diffkv_significance_measured_on_reference_model_then_cached, .timeout = 900)
{
    need_model();
    char *dir = kvt_tempdir();
    setenv("KVSIM_CACHE_DIR", dir, 1);
    const char *sets[] = {"policies=[bf16,diffkv]", "workload.requests=6", "workload.output.min=64",
                          "workload.output.max=128", "diffkv.measure_tokens=256"};
    double high[2] = {0}, low[2] = {0};
    char first_src[1024] = "";
    for (int run = 0; run < 2; run++) {
        kv_error err = {0};
        kv_scenario *s = NULL;
        kv_study *st = NULL;
        cr_assert_eq(kv_scenario_load("scenarios/diffkv.yaml", sets, 5, &s, &err), 0, "%s", err.msg);
        cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(kv_study_run(st, &err), 0, "%s", err.msg);
        size_t n = 0;
        const kv_policy_outcome *o = kv_study_outcomes(st, &n);
        cr_assert_eq(n, 2);
        const char *src = o[1].run.tiers_source;
        cr_expect(strstr(src, "measured on reference model smollm2-135m") != NULL, "%s", src);
        if (run == 0) {
            snprintf(first_src, sizeof first_src, "%s", src);
            char cmd[4200]; /* the measurement went into the cache folder */
            snprintf(cmd, sizeof cmd, "test -n \"$(ls -A '%s')\"", dir);
            cr_expect_eq(system(cmd), 0, "nothing cached in %s", dir);
        } else {
            cr_expect_str_eq(src, first_src, "tiers_source differs between the measuring and the cached run");
        }
        high[run] = o[1].run.tier_high_fraction;
        low[run] = o[1].run.tier_low_fraction;
        kv_study_destroy(st);
        kv_scenario_destroy(s);
    }
    cr_expect_eq(high[0], high[1]);
    cr_expect_eq(low[0], low[1]);
    /* Real attention gives each tier something at these alphas (1, 0.02). */
    cr_expect(high[0] > 0 && low[0] > 0, "high %g low %g", high[0], low[0]);
    unsetenv("KVSIM_CACHE_DIR");
    kvt_rmtree(dir);
    free(dir);
}
