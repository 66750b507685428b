/* test_mixed_encodings.c — requests of different encodings (DiffKV, INT8, bf16) share one decode node's paged KV memory. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/study/study.h"

#define MIXED "tests/fixtures/scenarios/mixed-encodings.yaml"

Test(mixed_encodings, share_one_decode_node_within_capacity)
{
    kv_error err = {0};
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load(MIXED, NULL, 0, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    /* Today's code refused this run: the page tables were shaped by the first request's encoding. */
    cr_assert_eq(kv_study_run(st, &err), 0, "%s", err.msg);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 1);
    const kv_run_result *r = &o[0].run;
    cr_assert_eq(r->n_requests, 64);
    int kinds[3] = {0, 0, 0}; /* DiffKV (< 8 bits), INT8 (9 bits), bf16 (16 bits) */
    for (size_t i = 0; i < r->n_requests; i++) {
        const kv_request_result *q = &r->requests[i];
        cr_expect(q->done_s > 0, "request %zu did not finish", i);
        double bits = q->bits;
        if (q->id % 4 == 3) {
            cr_expect_eq(bits, 16.0, "request %llu: %g bits", (unsigned long long)q->id, bits);
            kinds[2]++;
        } else if (q->id % 2 == 1) {
            cr_expect_eq(bits, 9.0, "request %llu: %g bits", (unsigned long long)q->id, bits);
            kinds[1]++;
        } else {
            cr_expect(bits > 0 && bits < 9.0, "request %llu: %g bits", (unsigned long long)q->id, bits);
            cr_expect(q->tier_high_fraction >= 0, "request %llu has no DiffKV tiers", (unsigned long long)q->id);
            kinds[0]++;
        }
    }
    cr_expect(kinds[0] == 32 && kinds[1] == 16 && kinds[2] == 16);
    /* Memory never over capacity, and it was the limit: the burst waited for pages. */
    cr_expect(r->kv_pages_peak <= r->kv_pages_capacity);
    cr_expect(r->kv_mem_peak_bytes <= r->kv_mem_capacity_bytes, "peak %g > capacity %g", r->kv_mem_peak_bytes,
              r->kv_mem_capacity_bytes);
    cr_expect(r->max_decode_batch < 64, "the fixture should be memory-bound (max batch %d)", r->max_decode_batch);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}
