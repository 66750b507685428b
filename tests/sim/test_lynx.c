/* test_lynx.c — Lynx phases against hand computation on the ideal network, and its guarantees. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/study/study.h"
#include "tests/model_fixture.h"

#define ONE "tests/fixtures/scenarios/lynx-one.yaml"

typedef struct run {
    kv_scenario *s;
    kv_study *st;
    const kv_policy_outcome *o; /* int4, int8, lynx (as in the fixture) */
    size_t n;
} run;

static void run_one(run *r, const char **sets, int n_sets)
{
    kv_error err = {0};
    cr_assert_eq(kv_scenario_load(ONE, sets, n_sets, &r->s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(r->s, &r->st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(r->st, &err), 0, "%s", err.msg);
    r->o = kv_study_outcomes(r->st, &r->n);
    cr_assert_eq(r->n, 3);
}

static void run_free(run *r)
{
    kv_study_destroy(r->st);
    kv_scenario_destroy(r->s);
}

static const kv_request_result *req(const run *r, int policy)
{
    return &r->o[policy].run.requests[0];
}

/* 25 Gbit/s, 5 us per NIC, H100 profile bandwidth 3350 GB/s at efficiency 0.8. */
static const double LAT = 2 * 5e-6, BW_BITS = 25e9, KERNEL_BW = 3350e9 * 0.8;

Test(lynx, phases_equal_hand_computation)
{
    run r;
    run_one(&r, NULL, 0);
    const kv_request_result *i4 = req(&r, 0), *ly = req(&r, 2);
    /* The anchor plane (4-bit codes + metadata) is int4's whole payload, byte for byte. */
    cr_expect_eq(ly->anchor_bytes, i4->anchor_bytes);
    cr_expect_eq(i4->residual_bytes, 0);
    cr_expect(ly->residual_bytes > 0);
    /* Encode: int4 writes the anchor plane; Lynx also writes the residual plane. */
    double split_cost = ly->residual_bytes / KERNEL_BW;
    cr_expect(fabs((ly->encode_end_s - ly->prefill_end_s) - (i4->encode_end_s - i4->prefill_end_s) - split_cost) <
              1e-12);
    /* Transfer: anchor first, then the residual (lynx.lua: order anchor_first). */
    double anchor_at = ly->encode_end_s + LAT + ly->anchor_bytes * 8 / BW_BITS;
    double residual_at = anchor_at + LAT + ly->residual_bytes * 8 / BW_BITS;
    cr_expect(fabs(ly->anchor_arrived_s - anchor_at) < 1e-12, "anchor %.15g vs %.15g", ly->anchor_arrived_s,
              anchor_at);
    cr_expect(fabs(ly->kv_arrived_s - residual_at) < 1e-12, "residual %.15g vs %.15g", ly->kv_arrived_s,
              residual_at);
    /* Token 1 comes from the prefill; the first speculative token (token 2) is one decode step on the anchor,
       which costs what int4's step to its token 2 costs (same bytes read). */
    double i4_second = i4->second_commit_s;
    cr_expect(fabs((ly->first_spec_s - ly->arrival_s) - (i4_second - i4->arrival_s) - split_cost) < 1e-8,
              "ttft_spec %.12g, int4 token 2 %.12g, split %.3g", ly->first_spec_s, i4_second, split_cost);
    cr_expect(fabs(i4->first_token_s - i4->kv_arrived_s) < 1e-15, "int4's token 1 is committed when its KV is in");
    cr_expect(ly->spec_tokens > 0);
    /* Committed: token 1 when the residual has arrived too; the rest only after verification. */
    cr_expect_eq(ly->first_token_s, ly->kv_arrived_s);
    cr_expect(ly->kth_token_s > ly->kv_arrived_s);
    run_free(&r);
}

Test(lynx, full_acceptance_commits_every_speculated_token_at_verification)
{
    run r;
    run_one(&r, NULL, 0); /* acceptance 1.0, ttkt_k 5, speculate 8 */
    const kv_request_result *ly = req(&r, 2);
    cr_expect_eq(ly->accepted_tokens, ly->spec_tokens);
    cr_expect(ly->spec_tokens >= 5, "speculated %d", ly->spec_tokens);
    /* K <= speculated tokens + 1: tokens 2..K are committed by the verification itself, in one commit. */
    cr_expect(ly->kth_token_s > ly->first_token_s);
    cr_expect(fabs(ly->kth_token_s - ly->second_commit_s) < 1e-6, "kth %.9g, first %.9g",
              ly->kth_token_s, ly->first_token_s);
    cr_expect(r.o[2].summary.spec_accept_rate == 1.0);
    run_free(&r);
}

Test(lynx, zero_acceptance_wastes_every_token_and_is_no_faster_than_int8)
{
    run r;
    const char *sets[] = {"lynx.acceptance=0"};
    run_one(&r, sets, 1);
    const kv_request_result *i8 = req(&r, 1), *ly = req(&r, 2);
    cr_expect_eq(ly->accepted_tokens, 0);
    cr_expect(r.o[2].summary.wasted_tokens == ly->spec_tokens);
    cr_expect(ly->first_token_s >= i8->first_token_s, "lynx ttft %.9g < int8 ttft %.9g", ly->first_token_s,
              i8->first_token_s);
    /* Every output token is still produced. */
    cr_expect(ly->done_s > 0);
    run_free(&r);
}

Test(lynx, speculated_tokens_never_counted_before_verification)
{
    run r;
    const char *sets[] = {"lynx.acceptance=0.5", "workload.output.value=64"};
    run_one(&r, sets, 2);
    const kv_request_result *ly = req(&r, 2);
    cr_expect(ly->first_spec_s < ly->kv_arrived_s, "speculation should start before the residual arrives");
    /* Only token 1 (the prefill's) is committed when the KV is complete; speculated ones wait for verification. */
    cr_expect_eq(ly->first_token_s, ly->kv_arrived_s);
    cr_expect(ly->second_commit_s > ly->kv_arrived_s);
    cr_expect(ly->kth_token_s > ly->kv_arrived_s);
    cr_expect(ly->verifications >= 1);
    run_free(&r);
}

Test(lynx, no_speculation_waits_for_the_whole_cache)
{
    run r;
    const char *sets[] = {"policy={lynx: {speculate: 0}}"};
    run_one(&r, sets, 1);
    const kv_request_result *ly = req(&r, 2);
    cr_expect_eq(ly->spec_tokens, 0);
    cr_expect_eq(ly->first_token_s, ly->kv_arrived_s);
    cr_expect_eq(ly->first_spec_s, ly->first_token_s);
    run_free(&r);
}

/* lynx.from: reference-model — acceptance measured on SmolLM2-135M drives the speculation. */
Test(lynx, acceptance_from_reference_model, .timeout = 600)
{
    char reason[512];
    char *model = kvt_real_model(reason, sizeof reason);
    if (!model)
        KVT_MODEL_MISSING(reason);
    free(model);
    run r;
    const char *sets[] = {"lynx.from=reference-model", "policies=[int4,int8,lynx]"};
    run_one(&r, sets, 2);
    const kv_run_result *ly = &r.o[2].run;
    cr_expect(strstr(ly->acceptance_source, "reference model smollm2-135m") != NULL, "%s", ly->acceptance_source);
    cr_expect(strstr(r.o[0].run.acceptance_source, "scenario") != NULL || r.o[0].summary.spec_tokens == 0);
    cr_expect(ly->requests[0].spec_tokens > 0);
    run_free(&r);
}
