/* test_feed.c — diffkv.from: reference-model: tier fractions measured on SmolLM2-135M drive the engine. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/study.h"
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

Test(feed, diffkv_tiers_from_reference_model, .timeout = 600)
{
    need_model();
    const char *sets[] = {"diffkv.from=reference-model", "policies=[bf16,diffkv]", "workload.requests=6",
                          "workload.output.min=64", "workload.output.max=128"};
    kv_error err = {0};
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load("scenarios/diffkv.yaml", sets, 5, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(st, &err), 0, "%s", err.msg);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 2);
    cr_expect(strstr(o[1].run.tiers_source, "reference model smollm2-135m") != NULL, "%s", o[1].run.tiers_source);
    cr_expect(strstr(o[0].run.tiers_source, "scenario") != NULL, "%s", o[0].run.tiers_source);
    /* Some tokens are demoted: the measured low tier is not empty. */
    cr_expect(o[1].run.tier_low_fraction > 0.0, "low tier %g", o[1].run.tier_low_fraction);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}
