/* test_profile_batch.c — timing.source: profile on splitwise-sim's cross-shaped table
 * (scenarios/profiles/perf_model.csv): prefill cost follows total batch tokens (core/timing/profile.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/timing/profile.h"

#define TABLE KV_SOURCE_DIR "/scenarios/profiles/perf_model.csv"

/* Every (model, hardware, tp) the table holds. */
static const struct {
    const char *model, *hw;
    int tp;
} combos[] = {{"llama2-70b", "a100-80gb", 2},  {"llama2-70b", "a100-80gb", 4},      {"llama2-70b", "a100-80gb", 8},
              {"llama2-70b", "h100-80gb", 2},  {"llama2-70b", "h100-80gb", 4},      {"llama2-70b", "h100-80gb", 8},
              {"llama2-70b", "h100-80gb-pcap", 2}, {"llama2-70b", "h100-80gb-pcap", 4},
              {"llama2-70b", "h100-80gb-pcap", 8}, {"bloom-176b", "a100-80gb", 8},  {"bloom-176b", "h100-80gb", 8},
              {"bloom-176b", "h100-80gb-pcap", 8}};
#define N_COMBOS (sizeof combos / sizeof combos[0])

static kv_profile *load(const char *model, const char *hw, int tp)
{
    kv_error err = {0};
    kv_profile *p = NULL;
    cr_assert_eq(kv_profile_load(TABLE, model, hw, tp, NULL, &p, &err), KV_OK, "%s", err.msg);
    return p;
}

/* The stated tolerance (docs/timing.md): a batch of short prompts costs what the table's single prompt of
   the same total tokens costs, within 6%; the old separable rule priced 16 x 128 at 5.9x. */
Test(profile_batch, short_prompts_batched_cost_their_total_tokens)
{
    kv_profile *p = load("llama2-70b", "h100-80gb", 8);
    double one_2048 = kv_profile_prefill_s(p, 1, 2048), four_512 = kv_profile_prefill_s(p, 4, 512);
    double sixteen_128 = kv_profile_prefill_s(p, 16, 128);
    cr_expect(fabs(one_2048 - 136.576e-3) < 1e-5, "1 x 2048: %.6g s (the table: 136.6 ms)", one_2048);
    cr_expect(fabs(four_512 - 132.610e-3) < 1e-5, "4 x 512: %.6g s (the table: 132.6 ms)", four_512);
    cr_expect(fabs(sixteen_128 / one_2048 - 1) <= 0.06, "16 x 128: %.4g ms vs 1 x 2048 %.4g ms", sixteen_128 * 1e3,
              one_2048 * 1e3);
    cr_expect(fabs(sixteen_128 / four_512 - 1) <= 0.03, "16 x 128: %.4g ms vs 4 x 512 %.4g ms", sixteen_128 * 1e3,
              four_512 * 1e3);
    /* 8 x 512 and 1 x 4096 are both in the table (377.6 and 378.6 ms): each is reproduced. */
    cr_expect(fabs(kv_profile_prefill_s(p, 8, 512) - 377.6145e-3) < 1e-6);
    cr_expect(fabs(kv_profile_prefill_s(p, 1, 4096) - 378.6478e-3) < 1e-6);
    kv_profile_destroy(p);
}

Test(profile_batch, every_table_point_is_reproduced)
{
    for (size_t c = 0; c < N_COMBOS; c++) {
        kv_profile *p = load(combos[c].model, combos[c].hw, combos[c].tp);
        for (int decode = 0; decode < 2; decode++) {
            size_t n = kv_profile_point_count(p, decode);
            cr_expect(n >= 8, "%s: %zu points", kv_profile_describe(p), n);
            for (size_t i = 0; i < n; i++) {
                double b, x, t;
                kv_profile_point(p, decode, i, &b, &x, &t);
                double got = decode ? kv_profile_decode_s(p, b, x) : kv_profile_prefill_s(p, b, x);
                cr_expect(fabs(got - t) <= 1e-12 * t, "%s %s (%g, %g): %.15g, the table %.15g",
                          kv_profile_describe(p), decode ? "decode" : "prefill", b, x, got, t);
            }
        }
        kv_profile_destroy(p);
    }
}

/* Cost never falls with more prompts or longer ones once the batch holds the table's reference 512 tokens
   (below that the table itself dips: Llama-2-70B tp 8 on H100 prefills 256 tokens in 52.5 ms and 128 in
   55.3 ms, and the interpolation goes through its points, so 2 x 128 costs less than 1 x 128 there). */
Test(profile_batch, monotone_in_batch_and_length)
{
    for (size_t c = 0; c < N_COMBOS; c++) {
        kv_profile *p = load(combos[c].model, combos[c].hw, combos[c].tp);
        for (double x = 128; x <= 8192; x *= 2) {
            double prev = 0;
            for (double b = 1; b <= 64; b++) {
                double t = kv_profile_prefill_s(p, b, x);
                if ((b - 1) * x >= 512)
                    cr_expect(t >= prev, "%s: prefill(%g, %g) = %.6g < prefill(%g, %g) = %.6g",
                              kv_profile_describe(p), b, x, t, b - 1, x, prev);
                prev = t;
            }
        }
        for (double b = 1; b <= 64; b *= 2) {
            double prev = 0;
            for (double x = 512; x <= 8192; x += 64) {
                double t = kv_profile_prefill_s(p, b, x);
                cr_expect(t >= prev, "%s: prefill(%g, %g) = %.6g < prefill(%g, %g) = %.6g", kv_profile_describe(p),
                          b, x, t, b, x - 64, prev);
                prev = t;
            }
        }
        kv_profile_destroy(p);
    }
}
