/* test_diffkv.c — DiffKV tier decisions: hand-worked prefill and decode examples, alpha = 0 keeps
 * everything high (= K8V4), the count process against the exact running-sum process, determinism. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kv/diffkv.h"
#include "core/kv/kvbytes.h"
#include "core/base/rng.h"

/* ---- Hand-worked prefill ---------------------------------------------------------------------- */

/* T = 100 tokens (more than 64: every later query counts, not the last 64), W = 2, alpha_high = 1,
   alpha_low = 0.2. Thresholds: 1/100 * 1 = 0.01 (high), 1/100 * 0.2 = 0.002 (low), in fp32.
   Token i is seen by the T - i queries at positions i..99, so its mean is sum / (100 - i).
     i   sum       queries  mean        tier     (last 64 queries only: sum / min(100 - i, 64))
     0   2.0       100      0.02        high
     10  0.8       90       0.00889     low      (0.8 / 64 = 0.0125: high)
     20  0.15      80       0.001875    pruned   (0.15 / 64 = 0.00234: low)
     30  0.7       70       0.01        high     (exactly the high threshold: not below it)
     40  60*t_l    60       t_l         low      (exactly the low threshold: not pruned)
     50  0.06      50       0.0012      pruned
     97  0.02      3        0.00667     low      (no longer the window: 100 - 97 = 3 > W)
     98  0         -        -           high     (window)
     99  0         -        -           high     (window)
   Every other token has sum 0: pruned. */
Test(diffkv, prefill_hand_example)
{
    float t_low = (1.0f / 100.0f) * 0.2f;
    float sums[100] = {0};
    sums[0] = 2.0f;
    sums[10] = 0.8f;
    sums[20] = 0.15f;
    sums[30] = 0.7f;
    sums[40] = t_low * 60.0f;
    sums[50] = 0.06f;
    sums[97] = 0.02f;
    uint8_t tiers[100];
    kv_diffkv_prefill_tiers(sums, 100, 1.0f, 0.2f, 2, tiers);
    uint8_t want[100];
    memset(want, KV_TIER_PRUNED, sizeof want);
    want[0] = KV_TIER_HIGH;
    want[10] = KV_TIER_LOW;
    want[30] = KV_TIER_HIGH;
    want[40] = KV_TIER_LOW;
    want[97] = KV_TIER_LOW;
    want[98] = want[99] = KV_TIER_HIGH;
    for (int i = 0; i < 100; i++)
        cr_expect_eq(tiers[i], want[i], "token %d: tier %d, want %d", i, tiers[i], want[i]);
    /* The rule itself, one token at a time. */
    cr_expect_eq(kv_diffkv_classify(0.8f, 90.0f, 100, 1.0f, 0.2f), KV_TIER_LOW);
    cr_expect_eq(kv_diffkv_classify(0.8f, 0.0f, 100, 1.0f, 0.2f), KV_TIER_PRUNED); /* no queries: 0 */
    cr_expect_eq(kv_diffkv_classify_z(1.0, 1.0, 0.2), KV_TIER_HIGH);
    cr_expect_eq(kv_diffkv_classify_z(0.2, 1.0, 0.2), KV_TIER_LOW);
    cr_expect_eq(kv_diffkv_classify_z(0.19, 1.0, 0.2), KV_TIER_PRUNED);
}

/* ---- Hand-worked decode ------------------------------------------------------------------------ */

static void expect_tokens(const kv_diffkv_head *h, const int64_t *pos, const kv_tier *tier, int n)
{
    cr_assert_eq(kv_diffkv_head_stored(h), n, "stored %d, want %d", kv_diffkv_head_stored(h), n);
    for (int i = 0; i < n; i++) {
        int64_t p;
        kv_tier t;
        kv_diffkv_head_token(h, i, &p, &t, NULL, NULL);
        cr_expect_eq(p, pos[i], "token %d: position %lld, want %lld", i, (long long)p, (long long)pos[i]);
        cr_expect_eq(t, tier[i], "position %lld: tier %d, want %d", (long long)p, t, tier[i]);
    }
}

/* W = 1, alpha_high = 1, alpha_low = 0.5; prefill of 4 tokens, each seen by every later query.
   Prefill thresholds 0.25 / 0.125: sums 2.0, 0.39, 0.56, 1.0 over 4, 3, 2, 1 queries give means
   0.5 (high), 0.13 (low), 0.28 (high), window (high).
   Each step the new token enters high and the token leaving the window (position L - 1 - W) is
   decided, once, by its mean at L; decided tokens never change (the paper's Algorithm 1).
   Step 1, L = 5, new 4, leaving 3; probabilities 0, 0, 0, 0.9 | 0.1 (new).
     3: (1.0 + 0.9) / 2 = 0.95 >= t_h = 0.2 -> stays high.                               [keep]
   Step 2, L = 6, new 5, leaving 4; probabilities 0, 0, 0, 0.8, 0.15 | 0.05.
     4: (0.1 + 0.15) / 2 = 0.125, t_h = 0.1667, t_l = 0.0833 -> demoted.                  [low]
   Step 3, L = 7, new 6, leaving 5; probabilities 0, 0, 0, 0.9, 0, 0.05 | 0.05.
     5: (0.05 + 0.05) / 2 = 0.05 < t_l = 0.0714 -> pruned.                                [pruned]
   Step 4, L = 8, new 7, leaving 6 (stored 0, 1, 2, 3, 4, 6); probabilities 0, 0, 0, 0.5, 0, 0.4 | 0.1.
     6: (0.05 + 0.4) / 2 = 0.225 >= t_h = 0.125 -> stays high.                            [keep]
   Token 2's mean falls to 0.56 / 6 = 0.093 < t_h, but it was decided at the prefill: it stays high
   (DiffKV's released kernel would demote it; see core/kv/diffkv.h). */
Test(diffkv, decode_hand_example)
{
    kv_error err = {0};
    kv_diffkv_head *h = kv_diffkv_head_create(1.0f, 0.5f, 1, &err);
    cr_assert(h, "%s", err.msg);
    float sums[4] = {2.0f, 0.39f, 0.56f, 1.0f};
    kv_diffkv_head_prefill(h, sums, 4);
    {
        int64_t pos[4] = {0, 1, 2, 3};
        kv_tier t[4] = {KV_TIER_HIGH, KV_TIER_LOW, KV_TIER_HIGH, KV_TIER_HIGH};
        expect_tokens(h, pos, t, 4);
    }
    kv_diffkv_change ch;
    float p1[5] = {0, 0, 0, 0.9f, 0.1f};
    kv_diffkv_head_step(h, p1, &ch);
    cr_expect_eq(ch.demoted, -1);
    cr_expect_eq(ch.pruned, -1);
    float p2[6] = {0, 0, 0, 0.8f, 0.15f, 0.05f};
    kv_diffkv_head_step(h, p2, &ch);
    cr_expect_eq(ch.demoted, 4);
    cr_expect_eq(ch.pruned, -1);
    float p3[7] = {0, 0, 0, 0.9f, 0.0f, 0.05f, 0.05f};
    kv_diffkv_head_step(h, p3, &ch);
    cr_expect_eq(ch.demoted, -1);
    cr_expect_eq(ch.pruned, 5);
    cr_expect_eq(ch.pruned_tier, KV_TIER_HIGH);
    float p4[7] = {0, 0, 0, 0.5f, 0.0f, 0.4f, 0.1f};
    kv_diffkv_head_step(h, p4, &ch);
    cr_expect_eq(ch.demoted, -1);
    cr_expect_eq(ch.pruned, -1);
    {
        int64_t pos[7] = {0, 1, 2, 3, 4, 6, 7};
        kv_tier t[7] = {KV_TIER_HIGH, KV_TIER_LOW, KV_TIER_HIGH, KV_TIER_HIGH, KV_TIER_LOW, KV_TIER_HIGH, KV_TIER_HIGH};
        expect_tokens(h, pos, t, 7);
    }
    cr_expect_eq(kv_diffkv_head_context(h), 8);
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_HIGH), 5);
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_LOW), 2);
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_PRUNED), 1);
    /* Running sums and query counts: token 4 got 0.1 (its own), 0.15, 0, 0 over 4 queries. */
    float sum;
    uint32_t q;
    kv_diffkv_head_token(h, 4, NULL, NULL, &sum, &q);
    cr_expect_eq(q, 4);
    cr_expect_eq(sum, ((0.1f + 0.15f) + 0.0f) + 0.0f);
    kv_diffkv_head_destroy(h);
}

Test(diffkv, head_rejects_bad_thresholds)
{
    kv_error err = {0};
    cr_expect_null(kv_diffkv_head_create(0.5f, 1.0f, 64, &err));
    cr_expect_eq(err.code, KV_EINPUT);
    cr_expect_null(kv_diffkv_head_create(1.0f, -0.1f, 64, &err));
    cr_expect_null(kv_diffkv_head_create(1.0f, 0.1f, -1, &err));
}

/* ---- alpha_low = alpha_high = 0: nothing pruned or demoted; bytes are K8V4's -------------------- */

/* Random attention over 300 prompt tokens and 200 decode steps: every token stays high. */
Test(diffkv, zero_alphas_keep_everything_high_exact)
{
    kv_error err = {0};
    kv_diffkv_head *h = kv_diffkv_head_create(0.0f, 0.0f, 64, &err);
    cr_assert(h, "%s", err.msg);
    kv_rng rng;
    kv_rng_seed(&rng, 3);
    float sums[300];
    for (int i = 0; i < 300; i++)
        sums[i] = (float)(kv_rng_uniform(&rng) * 1e-6); /* tiny: any positive threshold would prune them */
    kv_diffkv_head_prefill(h, sums, 300);
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_HIGH), 300);
    float *p = calloc(600, sizeof *p);
    for (int s = 0; s < 200; s++) {
        for (int i = 0; i <= kv_diffkv_head_stored(h); i++)
            p[i] = (float)(kv_rng_uniform(&rng) * 1e-7);
        kv_diffkv_change ch;
        kv_diffkv_head_step(h, p, &ch);
        cr_assert_eq(ch.demoted, -1);
        cr_assert_eq(ch.pruned, -1);
    }
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_HIGH), 500);
    cr_expect_eq(kv_diffkv_head_count(h, KV_TIER_LOW), 0);
    free(p);
    kv_diffkv_head_destroy(h);
}

/* The count process with alpha = 0 keeps every token of every head high, and the bytes it stores
   are exactly a K8V4 encoding's (kvbytes: what the kernels produce). */
Test(diffkv, zero_alphas_keep_everything_high_counts_and_bytes_equal_k8v4)
{
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = 3.0, .head_spread = 0.5};
    enum { HEADS = 32 };
    kv_diffkv_head_params hp[HEADS];
    double factors[HEADS];
    kv_diffkv_head_factors(&m, 11, HEADS, factors);
    for (int i = 0; i < HEADS; i++)
        hp[i] = (kv_diffkv_head_params){0, 0, 64, factors[i]};
    kv_diffkv_seq *s = kv_diffkv_seq_create(&m, hp, HEADS, 99);
    kv_diffkv_seq_prefill(s, 1000);
    for (int i = 0; i < 500; i++)
        kv_diffkv_seq_step(s);
    uint64_t high, low, pruned;
    kv_diffkv_seq_totals(s, &high, &low, &pruned);
    cr_expect_eq(high, (uint64_t)1500 * HEADS);
    cr_expect_eq(low, 0);
    cr_expect_eq(pruned, 0);
    kv_encoding diffkv = {.key = {KV_TENSOR_INT, 8, 0, 32, 0}, .value = {KV_TENSOR_INT, 4, 0, 32, 0},
                          .diffkv = true, .key_low = {KV_TENSOR_INT, 4, 0, 32, 0},
                          .value_low = {KV_TENSOR_INT, 2, 0, 32, 0}, .window = 64};
    kv_encoding k8v4 = {.key = {KV_TENSOR_INT, 8, 0, 32, 0}, .value = {KV_TENSOR_INT, 4, 0, 32, 0}};
    for (int h = 0; h < HEADS; h++) {
        kv_head_bytes a, b;
        kv_tier_split split = {(double)(kv_diffkv_seq_high(s)[h] - 64) / (1500 - 64),
                               (double)kv_diffkv_seq_low(s)[h] / (1500 - 64)};
        kv_encoding_bytes(&diffkv, 1500, 128, &split, &a);
        kv_encoding_bytes(&k8v4, 1500, 128, NULL, &b);
        cr_expect_eq(a.anchor, b.anchor, "head %d: %g bytes, K8V4 %g", h, a.anchor, b.anchor);
    }
    kv_diffkv_seq_destroy(s);
}

/* ---- The count process ------------------------------------------------------------------------- */

Test(diffkv, lognormal_tier_probabilities)
{
    /* s = 2: ln z ~ N(-2, 2). P(z >= 1) = 1 - Phi(1) = 0.158655; P(z < 0.02) = Phi((ln 0.02 + 2) / 2). */
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = 2.0};
    kv_diffkv_head_params p = {1.0, 0.02, 64, 1.0};
    double h, l, pr;
    kv_diffkv_tier_probabilities(&m, &p, &h, &l, &pr);
    cr_expect(fabs(h - 0.158655) < 1e-6, "high %.7f", h);
    cr_expect(fabs(pr - 0.5 * erfc(-((log(0.02) + 2.0) / 2.0) / sqrt(2.0))) < 1e-12, "pruned %.7f", pr);
    cr_expect(fabs(h + l + pr - 1) < 1e-12);
    /* A sparser head (larger s) keeps fewer tokens high. */
    p.head_factor = 1.5;
    double h2, l2, p2;
    kv_diffkv_tier_probabilities(&m, &p, &h2, &l2, &p2);
    cr_expect_lt(h2, h);
    cr_expect_gt(p2, pr);
    /* Fixed fractions ignore the alphas. */
    kv_diffkv_score_model f = {.kind = KV_DIFFKV_SCORES_FIXED, .high_fraction = 0.3, .low_fraction = 0.5};
    kv_diffkv_tier_probabilities(&f, &p, &h, &l, &pr);
    cr_expect(fabs(h - 0.3) < 1e-15 && fabs(l - 0.5) < 1e-15 && fabs(pr - 0.2) < 1e-12);
}

/* Per head and step: the new token joins high; at most one token leaves the window's decision
   (kept high, demoted or pruned), so high grows by 0 or 1, low by 0 or 1, never both. */
Test(diffkv, count_process_changes_at_most_one_token_per_head_per_step)
{
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = 2.0, .head_spread = 0.4};
    enum { HEADS = 64 };
    kv_diffkv_head_params hp[HEADS];
    double f[HEADS];
    kv_diffkv_head_factors(&m, 5, HEADS, f);
    for (int i = 0; i < HEADS; i++)
        hp[i] = (kv_diffkv_head_params){1.0, 0.02, 64, f[i]};
    kv_diffkv_seq *s = kv_diffkv_seq_create(&m, hp, HEADS, 1234);
    kv_diffkv_seq_prefill(s, 10); /* shorter than the window: all high, nothing leaves yet */
    for (int h = 0; h < HEADS; h++)
        cr_expect_eq(kv_diffkv_seq_high(s)[h], 10);
    uint32_t prev_h[HEADS], prev_l[HEADS];
    for (int step = 0; step < 3000; step++) {
        memcpy(prev_h, kv_diffkv_seq_high(s), sizeof prev_h);
        memcpy(prev_l, kv_diffkv_seq_low(s), sizeof prev_l);
        kv_diffkv_seq_step(s);
        for (int h = 0; h < HEADS; h++) {
            uint32_t dh = kv_diffkv_seq_high(s)[h] - prev_h[h], dl = kv_diffkv_seq_low(s)[h] - prev_l[h];
            cr_assert(dh <= 1 && dl <= 1 && dh + dl <= 1, "step %d head %d: high +%u low +%u", step, h, dh, dl);
            if (kv_diffkv_seq_tokens(s) <= 64)
                cr_assert_eq(dh, 1, "inside the window every token stays high");
        }
    }
    /* Sparse heads (large s) end with fewer tokens kept than dense ones. */
    int sparse = 0, dense = 0;
    for (int h = 1; h < HEADS; h++) {
        if (f[h] > f[sparse])
            sparse = h;
        if (f[h] < f[dense])
            dense = h;
    }
    const uint32_t *hi = kv_diffkv_seq_high(s), *lo = kv_diffkv_seq_low(s);
    cr_expect_lt(hi[sparse] + lo[sparse], hi[dense] + lo[dense]);
    kv_diffkv_seq_destroy(s);
}

/* A token's fate depends on (seed, head, position) only: prefill(T) then n steps gives the same counts
   as a prefill of T + n (what a recompute after preemption relies on), and the same seed gives the
   same counts. */
Test(diffkv, count_process_is_deterministic_and_recompute_consistent)
{
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = 2.5, .head_spread = 0.3};
    enum { HEADS = 16 };
    kv_diffkv_head_params hp[HEADS];
    for (int i = 0; i < HEADS; i++)
        hp[i] = (kv_diffkv_head_params){1.0, 0.05, 32 + i, 1.0 + 0.05 * i};
    kv_diffkv_seq *a = kv_diffkv_seq_create(&m, hp, HEADS, 77), *b = kv_diffkv_seq_create(&m, hp, HEADS, 77);
    kv_diffkv_seq_prefill(a, 500);
    for (int i = 0; i < 700; i++)
        kv_diffkv_seq_step(a);
    kv_diffkv_seq_prefill(b, 1200);
    cr_expect_eq(memcmp(kv_diffkv_seq_high(a), kv_diffkv_seq_high(b), HEADS * 4), 0);
    cr_expect_eq(memcmp(kv_diffkv_seq_low(a), kv_diffkv_seq_low(b), HEADS * 4), 0);
    kv_diffkv_seq *c = kv_diffkv_seq_create(&m, hp, HEADS, 78);
    kv_diffkv_seq_prefill(c, 1200);
    cr_expect_neq(memcmp(kv_diffkv_seq_high(a), kv_diffkv_seq_high(c), HEADS * 4), 0);
    kv_diffkv_seq_destroy(a);
    kv_diffkv_seq_destroy(b);
    kv_diffkv_seq_destroy(c);
}

/* The exact running-sum process, fed with attention from a stationary model (token weights w with
   mean 1; each query's probabilities proportional to the weights of the tokens still stored), decides
   each token as the count process does: by its normalised significance z = w when it leaves the
   window. (The count process then draws z from the lognormal; the previous tests check those draws.) */
Test(diffkv, exact_process_decides_by_significance_at_window_exit)
{
    const double sigma = 2.0;
    const float alpha_high = 1.0f, alpha_low = 0.02f;
    const int W = 64, T = 1024, steps = 3072, total = T + steps;
    kv_rng rng;
    kv_rng_seed(&rng, 42);
    double *w = malloc((size_t)total * sizeof *w), mean = 0;
    for (int i = 0; i < total; i++) {
        w[i] = exp(-sigma * sigma / 2 + sigma * kv_rng_normal(&rng));
        mean += w[i] / total;
    }
    for (int i = 0; i < total; i++)
        w[i] /= mean; /* sample mean exactly 1, so running sums stay near the context length */
    /* Prefill: every query, each over all earlier tokens (nothing is pruned yet). */
    float *sums = calloc((size_t)T, sizeof *sums);
    for (int q = 0; q < T; q++) {
        double z = 0;
        for (int i = 0; i <= q; i++)
            z += w[i];
        for (int i = 0; i <= q; i++)
            sums[i] += (float)(w[i] / z);
    }
    kv_error err = {0};
    kv_diffkv_head *h = kv_diffkv_head_create(alpha_high, alpha_low, W, &err);
    cr_assert(h, "%s", err.msg);
    kv_diffkv_head_prefill(h, sums, T);
    float *p = malloc((size_t)(total + 1) * sizeof *p);
    for (int s = 0; s < steps; s++) {
        int n = kv_diffkv_head_stored(h);
        int64_t newpos = kv_diffkv_head_context(h);
        double z = w[newpos];
        for (int i = 0; i < n; i++) {
            int64_t pos;
            kv_diffkv_head_token(h, i, &pos, NULL, NULL, NULL);
            z += w[pos];
        }
        for (int i = 0; i < n; i++) {
            int64_t pos;
            kv_diffkv_head_token(h, i, &pos, NULL, NULL, NULL);
            p[i] = (float)(w[pos] / z);
        }
        p[n] = (float)(w[newpos] / z);
        kv_diffkv_head_step(h, p, NULL);
    }
    /* Per token: the final tier against the class of its weight. */
    uint8_t *tier = malloc((size_t)total);
    memset(tier, KV_TIER_PRUNED, (size_t)total);
    for (int i = 0; i < kv_diffkv_head_stored(h); i++) {
        int64_t pos;
        kv_tier t;
        kv_diffkv_head_token(h, i, &pos, &t, NULL, NULL);
        tier[pos] = (uint8_t)t;
    }
    /* The decode tokens: decided at window exit by W + 1 queries over about L tokens each, so
       their z is their weight. (A prompt token's z = T x mean over the T - i queries at positions
       >= i, which saw i + 1 .. T tokens: above its weight for early tokens, as the paper's 1/N
       normalisation has it; the measured score model keeps a separate prefill table for that.) */
    int decided = total - W - T, agree = 0, by_w[3] = {0}, got[3] = {0};
    for (int i = T; i < total - W; i++) {
        int want = w[i] < alpha_low ? KV_TIER_PRUNED : w[i] < alpha_high ? KV_TIER_LOW : KV_TIER_HIGH;
        by_w[want]++;
        got[tier[i]]++;
        agree += tier[i] == want;
    }
    for (int t = 0; t < 3; t++)
        cr_expect(fabs((double)(got[t] - by_w[t]) / decided) < 0.02, "tier %d: exact process %.4f, by weight %.4f",
                  t, (double)got[t] / decided, (double)by_w[t] / decided);
    cr_expect_gt((double)agree / decided, 0.95, "only %.3f of the tokens got the tier of their weight",
                 (double)agree / decided);
    /* And the lognormal's probabilities describe these weights (4000 draws: within sampling noise). */
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = sigma};
    kv_diffkv_head_params hp = {alpha_high, alpha_low, W, 1.0};
    double ph, pl, pp;
    kv_diffkv_tier_probabilities(&m, &hp, &ph, &pl, &pp);
    cr_expect(fabs((double)by_w[KV_TIER_PRUNED] / decided - pp) < 0.04, "pruned by weight %.4f, model %.4f",
              (double)by_w[KV_TIER_PRUNED] / decided, pp);
    kv_diffkv_head_destroy(h);
    free(tier);
    free(p);
    free(sums);
    free(w);
}

/* ---- The measured score model ------------------------------------------------------------------- */

/* A table of z quantiles: z(u) = 4u^2 for u in [0, 1], so P(z < x) = sqrt(x) / 2 for x in [0, 4]. */
static double *square_table(void)
{
    double *q = malloc(KV_DIFFKV_TABLE_POINTS * sizeof *q);
    for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++) {
        double u = (double)k / (KV_DIFFKV_TABLE_POINTS - 1);
        q[k] = 4 * u * u;
    }
    return q;
}

Test(diffkv, measured_table_cdf_and_rule)
{
    double *q = square_table();
    cr_expect_eq(kv_diffkv_table_cdf(q, 0.0), 0.0);
    cr_expect_eq(kv_diffkv_table_cdf(q, 5.0), 1.0);
    cr_expect(fabs(kv_diffkv_table_cdf(q, 1.0) - 0.5) < 1e-12, "%g", kv_diffkv_table_cdf(q, 1.0));
    cr_expect(fabs(kv_diffkv_table_cdf(q, 0.25) - 0.25) < 1e-3, "%g", kv_diffkv_table_cdf(q, 0.25));
    /* The count process's thresholds are the rule on z = F^-1(u): z < alpha <=> u < F(alpha). */
    const double ah = 1.0, al = 0.09;
    kv_diffkv_table t = {1, 1, q, q};
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_MEASURED, .table = t};
    kv_diffkv_head_params hp = {ah, al, 64, 1.0, 0};
    double ph, pl, pp;
    kv_diffkv_tier_probabilities(&m, &hp, &ph, &pl, &pp);
    int n[3] = {0};
    const int draws = 100000;
    for (int i = 0; i < draws; i++) {
        double u = (i + 0.5) / draws, x = u * (KV_DIFFKV_TABLE_POINTS - 1);
        int k = (int)x;
        double z = k + 1 < KV_DIFFKV_TABLE_POINTS ? q[k] + (x - k) * (q[k + 1] - q[k]) : q[k];
        n[kv_diffkv_classify_z(z, ah, al)]++;
    }
    cr_expect(fabs(n[KV_TIER_HIGH] / (double)draws - ph) < 1e-4, "high %g vs %g", n[KV_TIER_HIGH] / (double)draws, ph);
    cr_expect(fabs(n[KV_TIER_PRUNED] / (double)draws - pp) < 1e-4, "pruned %g vs %g",
              n[KV_TIER_PRUNED] / (double)draws, pp);
    cr_expect(fabs(pp - 0.15) < 2e-3 && fabs(ph - 0.5) < 1e-9, "pruned %g high %g", pp, ph);
    free(q);
}

/* The measured model: the policy's alphas decide, through the table (not fixed fractions), and a
   simulated head reads the reference head at its relative depth. */
Test(diffkv, measured_count_process_follows_the_alphas)
{
    double *q = square_table(), *flat = malloc(KV_DIFFKV_TABLE_POINTS * sizeof *flat);
    for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++)
        flat[k] = 10.0 + k; /* a head whose every token is far above alpha_high: all high */
    double *two = malloc(2 * KV_DIFFKV_TABLE_POINTS * sizeof *two);
    memcpy(two, q, KV_DIFFKV_TABLE_POINTS * sizeof *two);
    memcpy(two + KV_DIFFKV_TABLE_POINTS, flat, KV_DIFFKV_TABLE_POINTS * sizeof *two);
    kv_diffkv_table t = {2, 1, two, two}; /* 2 reference layers, 1 KV head */
    cr_expect_eq(kv_diffkv_table_row(&t, 0, 4, 0, 8), 0);
    cr_expect_eq(kv_diffkv_table_row(&t, 1, 4, 7, 8), 0);
    cr_expect_eq(kv_diffkv_table_row(&t, 2, 4, 3, 8), 1);
    cr_expect_eq(kv_diffkv_table_row(&t, 3, 4, 0, 8), 1);
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_MEASURED, .table = t};
    double frac[2][3];
    const double alphas[2][2] = {{1.0, 0.09}, {2.25, 0.25}};
    for (int a = 0; a < 2; a++) {
        enum { HEADS = 64 };
        kv_diffkv_head_params hp[HEADS];
        for (int h = 0; h < HEADS; h++)
            hp[h] = (kv_diffkv_head_params){alphas[a][0], alphas[a][1], 64, 1.0, 0};
        kv_diffkv_seq *s = kv_diffkv_seq_create(&m, hp, HEADS, 3);
        kv_diffkv_seq_prefill(s, 512);
        for (int i = 0; i < 2048; i++)
            kv_diffkv_seq_step(s);
        uint64_t sh, sl, sp;
        kv_diffkv_seq_totals(s, &sh, &sl, &sp);
        double n = (2560.0 - 64) * HEADS;
        frac[a][0] = (sh - 64.0 * HEADS) / n;
        frac[a][1] = sl / n;
        frac[a][2] = sp / n;
        kv_diffkv_seq_destroy(s);
    }
    /* F(1) = 0.5, F(0.09) = 0.15; F(2.25) = 0.75, F(0.25) = 0.25. */
    cr_expect(fabs(frac[0][0] - 0.5) < 0.01 && fabs(frac[0][2] - 0.15) < 0.01, "high %g pruned %g", frac[0][0],
              frac[0][2]);
    cr_expect(fabs(frac[1][0] - 0.25) < 0.01 && fabs(frac[1][2] - 0.25) < 0.01, "high %g pruned %g", frac[1][0],
              frac[1][2]);
    /* Row 1 (all z >= 10) keeps everything high whatever the alphas. */
    kv_diffkv_head_params one = {2.25, 0.25, 64, 1.0, 1};
    double ph, pl, pp;
    kv_diffkv_tier_probabilities(&m, &one, &ph, &pl, &pp);
    cr_expect_eq(ph, 1.0);
    free(q);
    free(flat);
    free(two);
}

/* The count process over many heads lands on the model's probabilities. */
Test(diffkv, count_process_matches_tier_probabilities)
{
    kv_diffkv_score_model m = {.kind = KV_DIFFKV_SCORES_LOGNORMAL, .sigma = 2.0};
    kv_diffkv_head_params hp = {1.0, 0.02, 64, 1.0};
    double ph, pl, pp;
    kv_diffkv_tier_probabilities(&m, &hp, &ph, &pl, &pp);
    enum { HEADS = 64 };
    kv_diffkv_head_params many[HEADS];
    for (int i = 0; i < HEADS; i++)
        many[i] = hp;
    kv_diffkv_seq *s = kv_diffkv_seq_create(&m, many, HEADS, 9);
    kv_diffkv_seq_prefill(s, 1024);
    for (int i = 0; i < 3072; i++)
        kv_diffkv_seq_step(s);
    uint64_t sh, sl, sp;
    kv_diffkv_seq_totals(s, &sh, &sl, &sp);
    double n = (4096.0 - 64) * HEADS;
    cr_expect(fabs((sh - 64.0 * HEADS) / n - ph) < 0.005, "high %.4f vs %.4f", (sh - 64.0 * HEADS) / n, ph);
    cr_expect(fabs(sl / n - pl) < 0.005, "low %.4f vs %.4f", sl / n, pl);
    cr_expect(fabs(sp / n - pp) < 0.005, "pruned %.4f vs %.4f", sp / n, pp);
    kv_diffkv_seq_destroy(s);
}

/* ---- The engine: DiffKV and paged KV in a run --------------------------------------------------- */

#include "core/study/study.h"
#include "tests/support.h"

/* Runs a scenario through the C API with overrides, under the lognormal score model (these tests
   check the engine's mechanics; the measured default is tests/accuracy/test_diffkv_measured.c's). */
static kv_study *run_scenario(const char *path, const char **sets, int n_sets, kv_scenario **s)
{
    const char *all[16];
    cr_assert(n_sets < 16);
    for (int i = 0; i < n_sets; i++)
        all[i] = sets[i];
    all[n_sets] = "diffkv.scores=lognormal";
    return kvt_study_run(path, all, n_sets + 1, s);
}

static const kv_policy_outcome *outcome(const kv_study *st, const char *name)
{
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(o[i].name, name) == 0)
            return &o[i];
    cr_assert_fail("no policy %s in the run", name);
    return NULL;
}

static void expect_all_done(const kv_policy_outcome *o)
{
    for (size_t i = 0; i < o->run.n_requests; i++)
        cr_expect_geq(o->run.requests[i].done_s, 0, "%s: request %zu never finished", o->name, i);
    cr_expect_eq(o->summary.completed, o->run.n_requests);
}

/* scenarios/diffkv.yaml, small: DiffKV's tiers follow its thresholds, its KV is several times smaller, its
   manager runs and is charged to its steps; bf16 runs on the same pages with one tier. */
Test(diffkv_engine, scenario_small_run)
{
    const char *sets[] = {"workload.requests=12", "workload.output.min=200", "workload.output.max=400"};
    kv_scenario *s = NULL;
    kv_study *st = run_scenario("scenarios/diffkv.yaml", sets, 3, &s);
    const kv_policy_outcome *bf = outcome(st, "bf16"), *dk = outcome(st, "diffkv");
    expect_all_done(bf);
    expect_all_done(dk);
    /* alpha_high = 1, alpha_low = 0.02 over the lognormal of sigma 2 (heads spread): ~16% high, ~17% pruned of
       the tokens that left the window; the window's 64 tokens per head are high too. */
    cr_expect(dk->run.tier_high_fraction > 0.10 && dk->run.tier_high_fraction < 0.40, "high %.3f",
              dk->run.tier_high_fraction);
    cr_expect(dk->run.tier_pruned_fraction > 0.08 && dk->run.tier_pruned_fraction < 0.30, "pruned %.3f",
              dk->run.tier_pruned_fraction);
    cr_expect(fabs(dk->run.tier_high_fraction + dk->run.tier_low_fraction + dk->run.tier_pruned_fraction - 1) < 1e-9);
    for (size_t i = 0; i < dk->run.n_requests; i++) {
        cr_expect(!isnan(dk->run.requests[i].tier_high_fraction));
        cr_expect(isnan(bf->run.requests[i].tier_high_fraction));
    }
    cr_expect_gt(dk->summary.compression_ratio, 3.0, "diffkv ratio %.2f", dk->summary.compression_ratio);
    cr_expect_gt(dk->run.kv_manager_calls, 0);
    cr_expect_gt(dk->run.kv_manager_charged_s, 0);
    cr_expect_eq(bf->run.kv_manager_charged_s, 0, "bf16's paging is vLLM's block manager, not charged");
    cr_expect(isnan(dk->run.kv_manager_measured_s), "wall time is reported only when memory.measure_manager");
    cr_expect_lt(dk->run.kv_manager_charged_s, 0.01 * dk->run.decode_busy_s);
    /* Per-head pages for DiffKV (its heads differ); one table a sequence for bf16 (vLLM's blocks). */
    cr_expect_eq(bf->run.kv_tokens_per_page[0], 16);
    cr_expect_eq(bf->run.kv_page_bytes, 16.0 * 32 * 8 * 128 * 2 * 2);
    cr_expect_gt(dk->run.kv_tokens_per_page[1], dk->run.kv_tokens_per_page[0]);
    cr_expect_lt(dk->run.kv_mem_peak_bytes, bf->run.kv_mem_peak_bytes / 2.5);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

/* Capacity drives throughput: with KV memory for a handful of bf16 requests, bf16 preempts and runs small
   batches; DiffKV's smaller KV admits several times more requests per step and finishes sooner. */
Test(diffkv_engine, compression_turns_into_batch_and_throughput)
{
    const char *sets[] = {"workload.requests=64", "workload.output.min=1500", "workload.output.max=3000",
                          "cluster.decode.memory_fraction=0.25", "policies=[bf16, diffkv]"};
    kv_scenario *s = NULL;
    kv_study *st = run_scenario("scenarios/diffkv.yaml", sets, 5, &s);
    const kv_policy_outcome *bf = outcome(st, "bf16"), *dk = outcome(st, "diffkv");
    expect_all_done(bf);
    expect_all_done(dk);
    cr_expect_gt(bf->run.preemptions, 0, "bf16 never ran out of pages: the test does not test capacity");
    cr_expect_gt(dk->run.mean_decode_batch, 2.5 * bf->run.mean_decode_batch, "batch %.1f vs %.1f",
                 dk->run.mean_decode_batch, bf->run.mean_decode_batch);
    cr_expect_gt(dk->summary.output_throughput, 1.9 * bf->summary.output_throughput, "tok/s %.0f vs %.0f",
                 dk->summary.output_throughput, bf->summary.output_throughput);
    /* Neither ever holds more KV than the node has (invariant 3). */
    cr_expect_leq(bf->run.kv_mem_peak_bytes, bf->run.kv_mem_capacity_bytes);
    cr_expect_leq(dk->run.kv_mem_peak_bytes, dk->run.kv_mem_capacity_bytes);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

/* The policy chooses what preemption does: recompute drops the KV (no copies), swap copies the pages out
   and back. Both runs commit every token of every request. */
Test(diffkv_engine, preemption_by_recompute_or_swap)
{
    char *dir = kvt_tempdir();
    char *lua = kvt_write(dir, "bf16swap.lua",
                          "return { name = 'bf16swap',\n"
                          "  encode = function(ctx) return 'bf16' end,\n"
                          "  transfer = function(ctx) return { preempt = 'swap' } end }\n");
    char file_set[4200];
    snprintf(file_set, sizeof file_set, "policy.bf16swap.file=%s", lua);
    const char *sets[] = {"workload.requests=24", "workload.output.min=1500", "workload.output.max=3000",
                          "cluster.decode.memory_fraction=0.25", "policies=[bf16, bf16swap]", file_set};
    kv_scenario *s = NULL;
    kv_study *st = run_scenario("scenarios/diffkv.yaml", sets, 6, &s);
    const kv_policy_outcome *re = outcome(st, "bf16"), *sw = outcome(st, "bf16swap");
    expect_all_done(re);
    expect_all_done(sw);
    cr_expect_gt(re->run.preemptions, 0);
    cr_expect_gt(sw->run.preemptions, 0);
    cr_expect_eq(re->run.swap_bytes, 0);
    cr_expect_gt(sw->run.swap_bytes, 0);
    uint64_t per_request = 0;
    for (size_t i = 0; i < sw->run.n_requests; i++)
        per_request += (uint64_t)sw->run.requests[i].preemptions;
    cr_expect_eq(per_request, sw->run.preemptions);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    kvt_rmtree(dir);
    free(dir);
    free(lua);
}

/* alpha_low = alpha_high = 0: nothing is pruned or demoted, and what DiffKV sends is a K8V4 encoding's
   planes plus DiffKV's 8 bytes of score and position per token and head. Disaggregated, so the bytes cross
   the network. */
Test(diffkv_engine, zero_alphas_send_k8v4)
{
    char *dir = kvt_tempdir();
    char *lua = kvt_write(dir, "k8v4.lua",
                          "return { name = 'k8v4',\n"
                          "  encode = function(ctx) return { key = { bits = 8, group_size = 32 },\n"
                          "                                  value = { bits = 4, group_size = 32 } } end }\n");
    char file_set[4200];
    snprintf(file_set, sizeof file_set, "policy.k8v4.file=%s", lua);
    const char *sets[] = {"workload.requests=6", "workload.output.min=100", "workload.output.max=200",
                          "cluster.colocated=false", "policies=[k8v4, diffkv]", "policy.diffkv.alpha_high=0",
                          "policy.diffkv.alpha_low=0", file_set};
    kv_scenario *s = NULL;
    kv_study *st = run_scenario("scenarios/diffkv.yaml", sets, 8, &s);
    const kv_policy_outcome *k = outcome(st, "k8v4"), *dk = outcome(st, "diffkv");
    expect_all_done(k);
    expect_all_done(dk);
    double heads = 32 * 8;
    for (size_t i = 0; i < k->run.n_requests; i++) {
        const kv_request_result *a = &k->run.requests[i], *b = &dk->run.requests[i];
        cr_expect_eq(b->anchor_bytes, a->anchor_bytes + 8.0 * a->prompt_tokens * heads,
                     "request %zu: diffkv %.0f bytes, k8v4 %.0f + meta", i, b->anchor_bytes, a->anchor_bytes);
        cr_expect_eq(b->tier_high_fraction, 1.0);
        cr_expect_eq(b->tier_pruned_fraction, 0.0);
        cr_expect_eq(b->kept_tokens_fraction, 1.0);
        cr_expect_gt(b->kv_arrived_s, b->encode_end_s); /* it did cross the network */
    }
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    kvt_rmtree(dir);
    free(dir);
    free(lua);
}

/* Disaggregated: the prefill node sends only the kept tiers, so DiffKV's transfer is several times shorter. */
Test(diffkv_engine, disaggregated_transfer_sends_only_kept_tiers)
{
    const char *sets[] = {"workload.requests=8", "workload.output.min=100", "workload.output.max=200",
                          "cluster.colocated=false", "policies=[bf16, diffkv]", "network.nic_bandwidth_gbps=25"};
    kv_scenario *s = NULL;
    kv_study *st = run_scenario("scenarios/diffkv.yaml", sets, 6, &s);
    const kv_policy_outcome *bf = outcome(st, "bf16"), *dk = outcome(st, "diffkv");
    expect_all_done(dk);
    cr_expect_gt(bf->summary.mean_kv_wire_bytes, 3 * dk->summary.mean_kv_wire_bytes);
    cr_expect_gt(bf->summary.transfer_ms.mean, 3 * dk->summary.transfer_ms.mean, "transfer %.2f vs %.2f ms",
                 bf->summary.transfer_ms.mean, dk->summary.transfer_ms.mean);
    for (size_t i = 0; i < dk->run.n_requests; i++)
        cr_expect_lt(dk->run.requests[i].kept_tokens_fraction, 0.95);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(diffkv_engine, request_larger_than_the_node_is_an_input_error)
{
    const char *sets[] = {"workload.requests=2", "workload.prompt.min=60000", "workload.prompt.max=60000",
                          "workload.output.min=10", "workload.output.max=10", "cluster.decode.memory_fraction=0.25",
                          "policies=[bf16]"};
    kv_scenario *s = NULL;
    kv_error err = {0};
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load("scenarios/diffkv.yaml", sets, 7, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    cr_expect_eq(kv_study_run(st, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "KV memory") != NULL, "%s", err.msg);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

/* Both DiffKV scenarios run through the kvsim binary (small), print both tables, and give identical
   results.json twice (the manager's wall time is not reported unless asked for). */
Test(diffkv_engine, scenarios_run_and_are_deterministic)
{
    const char *files[] = {"scenarios/diffkv.yaml", "scenarios/diffkv-qwen2.5-32b.yaml"};
    char *dir = kvt_tempdir();
    for (int f = 0; f < 2; f++) {
        char args[4096], *out = NULL;
        for (int i = 0; i < 2; i++) {
            snprintf(args, sizeof args,
                     "run %s --set workload.requests=6 --set workload.output.min=64 --set workload.output.max=128 "
                     "--set diffkv.scores=lognormal --out %s/s%d-r%d",
                     files[f], dir, f, i);
            cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
            if (i == 0) {
                cr_expect(strstr(out, "memory ") && strstr(out, "pruned") && strstr(out, "diffkv"), "%s", out);
            }
            free(out);
        }
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/s%d-r0/results.json", dir, f);
        snprintf(b, sizeof b, "%s/s%d-r1/results.json", dir, f);
        size_t la = 0, lb = 0;
        char *ta = kvt_read(a, &la), *tb = kvt_read(b, &lb);
        cr_assert(ta && tb);
        cr_expect(la == lb && memcmp(ta, tb, la) == 0, "%s: results.json differs between identical runs", files[f]);
        cr_expect(strstr(ta, "\"tier_high_fraction\"") && strstr(ta, "\"kv_manager_fraction\""), "fields missing");
        free(ta);
        free(tb);
    }
    kvt_rmtree(dir);
    free(dir);
}

/* The policy host reads `preempt` from the transfer answer and rejects other values. */
Test(diffkv_engine, preempt_field_of_the_transfer_answer)
{
    char *dir = kvt_tempdir();
    char *good = kvt_write(dir, "good.lua", "return { transfer = function(ctx) return { preempt = 'swap' } end }\n");
    char *bad = kvt_write(dir, "bad.lua", "return { transfer = function(ctx) return { preempt = 'later' } end }\n");
    kv_policy *p = NULL;
    kv_error err = {0};
    kv_policy_request r = {1, 100, 10, 0};
    kv_transfer_plan plan;
    cr_assert_eq(kv_policy_load("good", good, NULL, 0, NULL, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_policy_transfer(p, &r, &plan, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.preempt, KV_PREEMPT_SWAP);
    kv_policy_destroy(p);
    cr_assert_eq(kv_policy_load("bad", bad, NULL, 0, NULL, &p, &err), 0, "%s", err.msg);
    cr_expect_eq(kv_policy_transfer(p, &r, &plan, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "preempt") != NULL, "%s", err.msg);
    kv_policy_destroy(p);
    kvt_rmtree(dir);
    free(dir);
    free(good);
    free(bad);
}
