/* test_model_kvstore.c — KV numerics (fp16, bf16, group quantization, anchors) and the KV store:
 * encodings, compression arithmetic, the KIVI window, Lynx views, DiffKV tiers, bad encodings. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kv/diffkv.h"
#include "core/refmodel/gguf.h"
#include "core/refmodel/kvquant.h"
#include "core/refmodel/kvstore.h"
#include "tests/model_fixture.h"

/* ---- Numerics ------------------------------------------------------------------------------- */

Test(kvquant, f16_round_trips_every_half)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kv_half_to_float((uint16_t)h);
        uint16_t back = kv_f32_to_f16(f);
        if (isnan(f))
            cr_assert(isnan(kv_half_to_float(back)), "nan %04x", h);
        else
            cr_assert_eq(back, h, "half %04x → %g → %04x", h, (double)f, back);
    }
}

/* Random floats round to the nearest half, ties to even. */
Test(kvquant, f16_rounds_to_nearest_even)
{
    uint64_t seed = 42;
    for (int i = 0; i < 200000; i++) {
        float f = kvt_rand(&seed) * ldexpf(1.0f, (int)(kvt_rand(&seed) * 15.0f)); /* about 2^-15 .. 2^15 */
        uint16_t h = kv_f32_to_f16(f);
        double x = f, d = fabs(kv_half_to_float(h) - x);
        for (int delta = -1; delta <= 1; delta += 2) {
            uint16_t o = (uint16_t)(h + delta);
            if ((o & 0x7c00) == 0x7c00 || ((o ^ h) & 0x8000))
                continue;
            double od = fabs(kv_half_to_float(o) - x);
            cr_assert(d < od || (d == od && (h & 1) == 0), "%.9g → %04x (%.9g), neighbour %04x is closer or even",
                      x, h, (double)kv_half_to_float(h), o);
        }
    }
    cr_assert_eq(kv_f32_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
    cr_assert_eq(kv_f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(kv_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* half of the smallest subnormal: tie to even (0) */
    cr_assert_eq(kv_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 units: tie to even (2) */
}

Test(kvquant, bf16_rounding)
{
    cr_assert_eq(kv_bf16_round(1.0f), 1.0f);
    cr_assert_eq(kv_bf16_round(1.00390625f), 1.0f);       /* exactly half an ulp: to even */
    cr_assert_eq(kv_bf16_round(1.01171875f), 1.015625f);  /* half an ulp above an odd one: up */
    cr_assert_eq(kv_bf16_round(-3.0f), -3.0f);
    cr_assert(isnan(kv_bf16_round(NAN)));
    cr_assert(isinf(kv_bf16_round(INFINITY)));
}

Test(kvquant, group_quantization)
{
    float x[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    uint16_t q[4], s, z;
    kv_group_quantize(x, 4, 1, 2, q, &s, &z);
    cr_assert_eq(kv_half_to_float(s), 1.0f);
    cr_assert_eq(kv_half_to_float(z), 0.0f);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(q[i], i);
        cr_assert_eq(kv_group_dequantize(q[i], s, z), x[i]);
    }
    /* Non-finite values stay out of min/max; NaN and -inf encode 0, +inf the top code. */
    float y[5] = {NAN, -1.0f, INFINITY, 1.0f, -INFINITY};
    uint16_t q5[5];
    kv_group_quantize(y, 5, 1, 4, q5, &s, &z);
    cr_assert_eq(kv_half_to_float(z), -1.0f);
    cr_assert_eq(q5[0], 0);
    cr_assert_eq(q5[1], 0);
    cr_assert_eq(q5[2], 15);
    cr_assert_eq(q5[3], 15);
    cr_assert_eq(q5[4], 0);
    /* A constant group: scale 0, every code 0, reconstruction = zero point. */
    float c[3] = {2.5f, 2.5f, 2.5f};
    kv_group_quantize(c, 3, 1, 8, q, &s, &z);
    cr_assert_eq(s, 0);
    cr_assert_eq(q[0] | q[1] | q[2], 0);
    cr_assert_eq(kv_group_dequantize(q[1], s, z), 2.5f);
    /* Strided groups (per channel). */
    float m[6] = {0, 10, 1, 20, 2, 30};
    kv_group_quantize(m + 1, 3, 2, 8, q, &s, &z);
    cr_assert_eq(kv_half_to_float(z), 10.0f);
    cr_assert_eq(q[2], 255);
    /* The anchor: code 0xAB at b = 8, a = 4 reconstructs at the middle of bin 0xA. */
    uint16_t one = kv_f32_to_f16(1.0f), zero = kv_f32_to_f16(0.0f);
    cr_assert_eq(kv_group_dequantize_anchor(0xAB, 8, 4, one, zero), 160.0f + 7.5f);
    cr_assert_eq(kv_group_bytes(32, 4, 0), 20u);
    cr_assert_eq(kv_group_bytes(32, 16, 4), 16u + 48u + 4u);
}

/* ---- Stores ---------------------------------------------------------------------------------- */

#define HD 64
#define NH 4
#define NKV 2
#define NTOK 200

static const kv_kvstore_shape shape = {1, NH, NKV, HD};

static kv_tensor_enc int_enc(int bits, int group, int anchor, int per_channel)
{
    return (kv_tensor_enc){KV_TENSOR_INT, bits, anchor, group, per_channel};
}

static kv_tensor_enc bf16_enc(void)
{
    return (kv_tensor_enc){KV_TENSOR_BF16, 16, 0, 0, 0};
}

/* A prefilled exact store with random K/V (keys with a few outlier channels). */
static kv_kvstore *prefilled(uint64_t seed, float *q_last)
{
    kv_kvstore *s;
    kv_error err;
    cr_assert_eq(kv_kvstore_create(&shape, NULL, KV_KVSTORE_SCORES, &s, &err), KV_OK);
    float *k = malloc(sizeof(float) * NTOK * NKV * HD), *v = malloc(sizeof(float) * NTOK * NKV * HD);
    float *q = malloc(sizeof(float) * NTOK * NH * HD), *o = malloc(sizeof(float) * NTOK * NH * HD);
    int32_t pos[NTOK];
    for (int t = 0; t < NTOK; t++) {
        pos[t] = t;
        for (int i = 0; i < NKV * HD; i++) {
            k[t * NKV * HD + i] = kvt_rand(&seed) * ((i % HD) < 4 ? 8.0f : 1.0f);
            v[t * NKV * HD + i] = kvt_rand(&seed);
        }
        for (int i = 0; i < NH * HD; i++)
            q[t * NH * HD + i] = kvt_rand(&seed);
    }
    kv_kvstore_append(s, 0, k, v, pos, NTOK);
    kv_kvstore_attention(s, 0, q, pos, NTOK, o, NULL);
    if (q_last)
        memcpy(q_last, q + (NTOK - 1) * NH * HD, sizeof(float) * NH * HD);
    free(k);
    free(v);
    free(q);
    free(o);
    return s;
}

/* Relative L2 error of one decode query over a sealed copy with encoding e. */
static double decode_error(const kv_kvstore *pre, const kv_encoding *e, bool residual, kv_kvstore_layer_stats *st)
{
    kv_encoding enc[NKV] = {*e, *e};
    kv_kvstore *s;
    kv_error err;
    cr_assert_eq(kv_kvstore_clone(pre, enc, KV_KVSTORE_MEASURE, &s, &err), KV_OK, "%s", err.msg);
    kv_kvstore_seal(s);
    kv_kvstore_set_residual(s, residual);
    float kv[NKV * HD], q[NH * HD], o[NH * HD];
    uint64_t seed = 9;
    for (int i = 0; i < NKV * HD; i++)
        kv[i] = kvt_rand(&seed);
    for (int i = 0; i < NH * HD; i++)
        q[i] = kvt_rand(&seed) * 2.0f;
    int32_t p = NTOK;
    kv_kvstore_append(s, 0, kv, kv, &p, 1);
    kv_kvstore_attention(s, 0, q, &p, 1, o, NULL);
    kv_kvstore_get_layer_stats(s, 0, st);
    kv_kvstore_destroy(s);
    return st->att_ref_sq > 0 ? sqrt(st->att_err_sq / st->att_ref_sq) : -1.0;
}

Test(kvstore, error_grows_as_bits_shrink)
{
    kv_kvstore *pre = prefilled(1, NULL);
    kv_kvstore_layer_stats st;
    kv_encoding bf = {.key = bf16_enc(), .value = bf16_enc()};
    kv_encoding i8 = {.key = int_enc(8, 32, 0, 0), .value = int_enc(8, 32, 0, 0)};
    kv_encoding i4 = {.key = int_enc(4, 32, 0, 0), .value = int_enc(4, 32, 0, 0)};
    kv_encoding i2 = {.key = int_enc(2, 32, 0, 0), .value = int_enc(2, 32, 0, 0)};
    double e_bf = decode_error(pre, &bf, true, &st);
    cr_assert_eq(e_bf, 0.0, "bf16 KV is the reference itself");
    cr_assert_eq(st.stored_bytes, st.bf16_bytes);
    double e8 = decode_error(pre, &i8, true, &st);
    /* int8, G = 32, head_dim 64: 2 groups of 32 bytes + 4 bytes metadata, for K and V. */
    cr_assert_eq(st.stored_bytes, (double)NKV * (NTOK + 1) * 2 * (2 * (32 + 4)));
    double e4 = decode_error(pre, &i4, true, &st);
    cr_assert_eq(st.bf16_bytes / st.stored_bytes, 128.0 / 40.0); /* 3.2x */
    double e2 = decode_error(pre, &i2, true, &st);
    cr_assert(e8 > 0 && e8 < e4 && e4 < e2, "errors int8 %g, int4 %g, int2 %g", e8, e4, e2);
    cr_assert_lt(e8, 0.02);
    kv_kvstore_destroy(pre);
}

/* Lynx: anchor-only KV is worse than merged KV; the view switches both ways
   and merged KV equals the same b-bit encoding without a split. */
Test(kvstore, lynx_views)
{
    kv_kvstore *pre = prefilled(2, NULL);
    kv_kvstore_layer_stats st, st_plain;
    kv_encoding lynx = {.key = int_enc(8, 32, 4, 0), .value = int_enc(8, 32, 4, 0)};
    kv_encoding i8 = {.key = int_enc(8, 32, 0, 0), .value = int_enc(8, 32, 0, 0)};
    double anchor = decode_error(pre, &lynx, false, &st);
    double merged = decode_error(pre, &lynx, true, &st);
    double plain = decode_error(pre, &i8, true, &st_plain);
    cr_assert(anchor > 4 * merged, "anchor %g, merged %g", anchor, merged);
    cr_assert_eq(merged, plain, "merged planes are the 8-bit codes");
    /* Planes: 4-bit anchor (16 bytes) + 4-bit residual (16 bytes) + metadata per group of 32. */
    cr_assert_eq(st.stored_bytes, st_plain.stored_bytes);
    /* Switching back and forth gives the same outputs bit for bit. */
    kv_encoding enc[NKV] = {lynx, lynx};
    kv_kvstore *s;
    kv_error err;
    cr_assert_eq(kv_kvstore_clone(pre, enc, 0, &s, &err), KV_OK);
    kv_kvstore_seal(s);
    float q[NH * HD], o1[NH * HD], o2[NH * HD], o3[NH * HD];
    uint64_t seed = 5;
    for (int i = 0; i < NH * HD; i++)
        q[i] = kvt_rand(&seed);
    int32_t p = NTOK - 1;
    kv_kvstore_attention(s, 0, q, &p, 1, o1, NULL);
    kv_kvstore_set_residual(s, true);
    kv_kvstore_attention(s, 0, q, &p, 1, o2, NULL);
    kv_kvstore_set_residual(s, false);
    kv_kvstore_attention(s, 0, q, &p, 1, o3, NULL);
    cr_assert_eq(memcmp(o1, o3, sizeof o1), 0);
    cr_assert_neq(memcmp(o1, o2, sizeof o1), 0);
    /* Truncation forgets later tokens. */
    kv_kvstore_truncate(s, 150);
    cr_assert_eq(kv_kvstore_length(s), 150);
    kv_kvstore_get_layer_stats(s, 0, &st);
    cr_assert_eq(st.tokens, NKV * 150);
    kv_kvstore_destroy(s);
    kv_kvstore_destroy(pre);
}

/* KIVI: per-channel key groups of G tokens leave the bf16 window of R tokens whole. */
Test(kvstore, kivi_window)
{
    kv_kvstore *pre = prefilled(3, NULL);
    kv_encoding kivi = {.key = int_enc(2, 8, 0, 1), .value = int_enc(2, 8, 0, 0), .full_precision_window = 16};
    kv_encoding enc[NKV] = {kivi, kivi};
    kv_kvstore *s;
    kv_error err;
    cr_assert_eq(kv_kvstore_clone(pre, enc, 0, &s, &err), KV_OK);
    kv_kvstore_seal(s);
    kv_kvstore_layer_stats st;
    kv_kvstore_get_layer_stats(s, 0, &st);
    /* 200 tokens: the first floor((200 - 16) / 8) * 8 = 184 are quantized, 16 stay bf16. */
    cr_assert_eq(st.tokens_high, NKV * 184.0);
    cr_assert_eq(st.tokens_window, NKV * 16.0);
    float kv[NKV * HD] = {0};
    for (int i = 0; i < 7; i++) {
        int32_t p = NTOK + i;
        kv_kvstore_append(s, 0, kv, kv, &p, 1);
        kv_kvstore_get_layer_stats(s, 0, &st);
        /* A block of 8 leaves the window only when 16 + 8 tokens are outside the quantized part. */
        double want_window = i < 7 ? 16.0 + (i + 1) : 16.0;
        cr_assert_eq(st.tokens_window, NKV * want_window, "after %d appends: %g", i + 1, st.tokens_window);
    }
    int32_t p = NTOK + 7;
    kv_kvstore_append(s, 0, kv, kv, &p, 1); /* 24 outside: one block of 8 is quantized */
    kv_kvstore_get_layer_stats(s, 0, &st);
    cr_assert_eq(st.tokens_window, NKV * 16.0);
    cr_assert_eq(st.tokens_high, NKV * 192.0);
    /* Keys: 2 bits per channel over 8 tokens: 64 channels x (2 + 4) bytes / 8 tokens;
       values: 8 groups of 8 along head_dim, (2 + 4) bytes each. */
    double per_token = 64.0 * 6.0 / 8.0 + 8 * (2.0 + 4.0);
    cr_assert_eq(st.stored_bytes, NKV * (192.0 * per_token + 16.0 * 4.0 * HD));
    kv_kvstore_destroy(s);
    kv_kvstore_destroy(pre);
}

/* DiffKV: tokens the last queries attend to stay high, the rest are demoted or
   pruned; in decode each step decides at most the one token leaving the window. */
Test(kvstore, diffkv_tiers)
{
    kv_kvstore *s0;
    kv_error err;
    cr_assert_eq(kv_kvstore_create(&shape, NULL, KV_KVSTORE_SCORES, &s0, &err), KV_OK);
    /* Keys: tokens 0..9 align with every query, the others are nearly orthogonal noise. */
    float *k = calloc(NTOK * NKV * HD, sizeof *k), *v = calloc(NTOK * NKV * HD, sizeof *v);
    float *q = calloc(NTOK * NH * HD, sizeof *q), *o = calloc(NTOK * NH * HD, sizeof *o);
    int32_t pos[NTOK];
    uint64_t seed = 4;
    for (int t = 0; t < NTOK; t++) {
        pos[t] = t;
        for (int i = 0; i < NKV * HD; i++) {
            k[t * NKV * HD + i] = (t < 10 && i % HD == 0) ? 8.0f : 0.3f * kvt_rand(&seed);
            v[t * NKV * HD + i] = kvt_rand(&seed);
        }
        for (int i = 0; i < NH * HD; i++)
            q[t * NH * HD + i] = i % HD == 0 ? 8.0f : 0.0f;
    }
    kv_kvstore_append(s0, 0, k, v, pos, NTOK);
    kv_kvstore_attention(s0, 0, q, pos, NTOK, o, NULL);
    kv_encoding d = {.key = int_enc(8, 32, 0, 0), .value = int_enc(4, 32, 0, 0), .diffkv = true,
                     .key_low = int_enc(4, 32, 0, 0), .value_low = int_enc(2, 32, 0, 0),
                     .alpha_high = 1.0, .alpha_low = 0.2, .window = 16};
    kv_encoding enc[NKV] = {d, d};
    kv_kvstore *s;
    cr_assert_eq(kv_kvstore_clone(s0, enc, 0, &s, &err), KV_OK, "%s", err.msg);
    kv_kvstore_seal(s);
    kv_kvstore_layer_stats st;
    kv_kvstore_get_layer_stats(s, 0, &st);
    cr_assert_eq(st.tokens, NKV * (double)NTOK);
    cr_assert_eq(st.tokens_high, NKV * (10.0 + 16.0), "high %g", st.tokens_high);
    cr_assert_gt(st.tokens_pruned + st.tokens_low, NKV * 170.0);
    cr_assert_gt(st.tokens_pruned, 0);
    cr_assert_gt(st.bf16_bytes / st.stored_bytes, 3.0);
    /* Decode: each step the token leaving the window is decided; others stay put. */
    double prev_high = st.tokens_high;
    float kv[NKV * HD] = {0}, qq[NH * HD] = {0}, oo[NH * HD];
    for (int i = 0; i < 20; i++) {
        int32_t p = NTOK + i;
        kv_kvstore_append(s, 0, kv, kv, &p, 1);
        kv_kvstore_attention(s, 0, qq, &p, 1, oo, NULL);
        kv_kvstore_get_layer_stats(s, 0, &st);
        /* One new high token per lane, at most one decided per lane. */
        cr_assert(st.tokens_high <= prev_high + NKV && st.tokens_high >= prev_high, "step %d: %g → %g", i,
                  prev_high, st.tokens_high);
        prev_high = st.tokens_high;
    }
    cr_assert_eq(st.tokens, NKV * (double)(NTOK + 20));
    kv_kvstore_destroy(s);
    kv_kvstore_destroy(s0);
    free(k);
    free(v);
    free(q);
    free(o);
}

/* DiffKV's one rule: the store's significance is the probability every later query gave the token
   (not only the last 64: NTOK = 200), max over the GQA group, and its tiers are core/kv/diffkv.c's on
   those very scores, in prefill and at each decode step. */
Test(kvstore, diffkv_uses_core_rule_on_all_later_queries)
{
    kv_kvstore *s0;
    kv_error err;
    cr_assert_eq(kv_kvstore_create(&shape, NULL, KV_KVSTORE_SCORES, &s0, &err), KV_OK);
    float *k = malloc(sizeof(float) * NTOK * NKV * HD), *v = malloc(sizeof(float) * NTOK * NKV * HD);
    float *q = malloc(sizeof(float) * NTOK * NH * HD), *o = malloc(sizeof(float) * NTOK * NH * HD);
    int32_t pos[NTOK];
    uint64_t seed = 17;
    for (int t = 0; t < NTOK; t++) {
        pos[t] = t;
        for (int i = 0; i < NKV * HD; i++) {
            k[t * NKV * HD + i] = kvt_rand(&seed) * ((i % HD) < 4 ? 4.0f : 1.0f);
            v[t * NKV * HD + i] = kvt_rand(&seed);
        }
        for (int i = 0; i < NH * HD; i++)
            q[t * NH * HD + i] = kvt_rand(&seed) * ((i % HD) < 4 ? 2.0f : 1.0f);
    }
    kv_kvstore_append(s0, 0, k, v, pos, NTOK);
    kv_kvstore_attention(s0, 0, q, pos, NTOK, o, NULL);
    /* Independently: softmax in double per query head, summed over every query t >= i, max over the
       G = NH / NKV heads of the group. */
    const int G = NH / NKV;
    double scale = 1.0 / sqrt((double)HD);
    for (int g = 0; g < NKV; g++) {
        double *sum = calloc((size_t)G * NTOK, sizeof *sum), *p = malloc(NTOK * sizeof *p);
        for (int hh = 0; hh < G; hh++)
            for (int t = 0; t < NTOK; t++) {
                const float *qr = q + ((size_t)t * NH + (size_t)(g * G + hh)) * HD;
                double mx = -INFINITY, z = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int c = 0; c < HD; c++)
                        d += (double)qr[c] * k[((size_t)j * NKV + g) * HD + c];
                    p[j] = d * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= t; j++)
                    z += (p[j] = exp(p[j] - mx));
                for (int j = 0; j <= t; j++)
                    sum[(size_t)hh * NTOK + j] += p[j] / z;
            }
        const int32_t *sp;
        const float *ss, *sq;
        cr_assert_eq(kv_kvstore_scores(s0, 0, g, &sp, &ss, &sq), NTOK);
        for (int i = 0; i < NTOK; i++) {
            double best = 0;
            for (int hh = 0; hh < G; hh++)
                best = sum[(size_t)hh * NTOK + i] > best ? sum[(size_t)hh * NTOK + i] : best;
            cr_expect_eq(sp[i], i);
            cr_expect_eq(sq[i], (float)(NTOK - i), "token %d: %g queries, want %d", i, (double)sq[i], NTOK - i);
            cr_expect(fabs(ss[i] - best) <= 1e-4 * (best > 1 ? best : 1), "head %d token %d: sum %g, want %g", g, i,
                      (double)ss[i], best);
        }
        free(sum);
        free(p);
    }
    /* Seal with DiffKV: the tiers are kv_diffkv_prefill_tiers' on the store's own sums. Random keys give
       near-uniform attention, where z = N x mean over t >= i of ~1/(t + 1) runs from ~6 (early tokens)
       down to ~1 (late ones): alphas 2 and 1.2 cut that range in three. */
    kv_encoding d = {.key = int_enc(8, 32, 0, 0), .value = int_enc(4, 32, 0, 0), .diffkv = true,
                     .key_low = int_enc(4, 32, 0, 0), .value_low = int_enc(2, 32, 0, 0),
                     .alpha_high = 2.0, .alpha_low = 1.2, .window = 16};
    kv_encoding enc[NKV] = {d, d};
    kv_kvstore *s;
    cr_assert_eq(kv_kvstore_clone(s0, enc, 0, &s, &err), KV_OK, "%s", err.msg);
    kv_kvstore_seal(s);
    int count[3] = {0};
    for (int g = 0; g < NKV; g++) {
        const float *ss;
        kv_kvstore_scores(s0, 0, g, NULL, &ss, NULL);
        uint8_t want[NTOK], got[NTOK];
        kv_diffkv_prefill_tiers(ss, NTOK, 2.0f, 1.2f, 16, want);
        kv_kvstore_tiers(s, 0, g, got, NTOK);
        for (int i = 0; i < NTOK; i++) {
            cr_expect_eq(got[i], want[i], "head %d token %d: store tier %d, core rule %d", g, i, got[i], want[i]);
            count[want[i]]++;
        }
    }
    cr_expect(count[KV_TIER_HIGH] > 2 * 16 && count[KV_TIER_LOW] > 0 && count[KV_TIER_PRUNED] > 0,
              "a test that exercises every tier: %d / %d / %d", count[0], count[1], count[2]);
    /* Decode: after each step the token that left the window has core's tier on its sums at L. */
    for (int step = 0; step < 30; step++) {
        float kv[NKV * HD], qq[NH * HD], oo[NH * HD];
        for (int i = 0; i < NKV * HD; i++)
            kv[i] = kvt_rand(&seed);
        for (int i = 0; i < NH * HD; i++)
            qq[i] = kvt_rand(&seed);
        int32_t p = NTOK + step, leaving = p - 16;
        kv_kvstore_append(s, 0, kv, kv, &p, 1);
        kv_kvstore_attention(s, 0, qq, &p, 1, oo, NULL);
        for (int g = 0; g < NKV; g++) {
            const int32_t *sp;
            const float *ss, *sq;
            int n = kv_kvstore_scores(s, 0, g, &sp, &ss, &sq);
            uint8_t tiers[NTOK + 30];
            kv_kvstore_tiers(s, 0, g, tiers, p + 1);
            for (int i = 0; i < n; i++)
                if (sp[i] == leaving) {
                    kv_tier want = kv_diffkv_classify(ss[i], sq[i], p + 1, 2.0f, 1.2f);
                    cr_expect_eq(tiers[leaving], want, "step %d head %d: tier %d, core %d", step, g, tiers[leaving],
                                 want);
                    cr_expect_eq(sq[i], 17.0f, "the leaving token has its own query and 16 later ones");
                }
        }
    }
    kv_kvstore_destroy(s);
    kv_kvstore_destroy(s0);
    free(k);
    free(v);
    free(q);
    free(o);
}

Test(kvstore, bad_encodings)
{
    kv_kvstore *s;
    kv_error err;
    kv_encoding bad[NKV] = {{.key = int_enc(0, 32, 0, 0), .value = bf16_enc()}, {.key = bf16_enc(), .value = bf16_enc()}};
    cr_assert_eq(kv_kvstore_create(&shape, bad, 0, &s, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "bits 0"), "%s", err.msg);
    bad[0] = (kv_encoding){.key = int_enc(8, 32, 8, 0), .value = bf16_enc()};
    cr_assert_eq(kv_kvstore_create(&shape, bad, 0, &s, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "anchor"), "%s", err.msg);
    bad[0] = (kv_encoding){.key = int_enc(8, 0, 0, 0), .value = bf16_enc()};
    cr_assert_eq(kv_kvstore_create(&shape, bad, 0, &s, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "group size"), "%s", err.msg);
    bad[1] = (kv_encoding){.key = int_enc(8, 32, 0, 1), .value = bf16_enc(), .diffkv = true,
                           .key_low = int_enc(4, 32, 0, 0), .value_low = int_enc(2, 32, 0, 0), .alpha_high = 1};
    bad[0] = bad[1];
    cr_assert_eq(kv_kvstore_create(&shape, bad, 0, &s, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "per-token"), "%s", err.msg);
    kv_kvstore_shape odd = {1, 3, 2, 8};
    cr_assert_eq(kv_kvstore_create(&odd, NULL, 0, &s, &err), KV_EINPUT);
    kv_kvstore *pre = prefilled(7, NULL), *c;
    kv_kvstore_seal(pre);
    cr_assert_eq(kv_kvstore_clone(pre, NULL, 0, &c, &err), KV_EINPUT);
    kv_kvstore_destroy(pre);
}

/* The backend's attention over the encoded pages gives what the built-in loop
   gives over the reconstructed values, for every kind of page: this checks the
   page layout (packing, metadata, anchors, per-channel blocks, mixed tiers)
   against the CPU backend's decode numerics. */
Test(kvstore, backend_attention_matches_the_reference_loop)
{
    kv_backend *be;
    kv_error err;
    cr_assert_eq(kv_backend_open("cpu", 0, &be, &err), KV_OK, "%s", err.msg);
    kv_tensor_enc bf = bf16_enc();
    kv_encoding cases[] = {
        {.key = bf, .value = bf},
        {.key = int_enc(8, 32, 0, 0), .value = int_enc(8, 32, 0, 0)},
        {.key = int_enc(3, 24, 0, 0), .value = int_enc(5, 64, 0, 0)},
        {.key = int_enc(2, 8, 0, 1), .value = int_enc(2, 8, 0, 0), .full_precision_window = 16},
        {.key = int_enc(8, 32, 4, 0), .value = int_enc(8, 32, 4, 0)},
        {.key = int_enc(16, 32, 4, 0), .value = int_enc(16, 32, 4, 0)},
        {.key = int_enc(8, 32, 0, 0), .value = int_enc(4, 32, 0, 0), .diffkv = true,
         .key_low = int_enc(4, 32, 0, 0), .value_low = int_enc(2, 32, 0, 0), .alpha_high = 1.0, .alpha_low = 0.3,
         .window = 16},
    };
    kv_kvstore *pre = prefilled(11, NULL);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int residual = 0; residual < 2; residual++) {
            kv_encoding enc[NKV] = {cases[c], cases[c]};
            kv_kvstore *a, *b;
            cr_assert_eq(kv_kvstore_clone(pre, enc, 0, &a, &err), KV_OK, "%s", err.msg);
            cr_assert_eq(kv_kvstore_clone(pre, enc, 0, &b, &err), KV_OK, "%s", err.msg);
            kv_kvstore_set_backend(b, be);
            kv_kvstore *both[2] = {a, b};
            float kv[NKV * HD], q[3 * NH * HD], o[2][3 * NH * HD];
            uint64_t seed = 100 + c;
            for (int st = 0; st < 2; st++) {
                kv_kvstore_seal(both[st]);
                kv_kvstore_set_residual(both[st], residual);
            }
            /* Decode steps (one or three queries at a time), the same inputs for both stores. */
            int32_t p = NTOK;
            for (int step = 0; step < 12; step++) {
                int T = step % 4 == 3 ? 3 : 1;
                int32_t pos[3];
                for (int t = 0; t < T; t++)
                    pos[t] = p + t;
                for (int i = 0; i < NH * HD * T; i++)
                    q[i] = kvt_rand(&seed) * 2.0f;
                for (int st = 0; st < 2; st++) {
                    uint64_t ks = seed;
                    for (int t = 0; t < T; t++) {
                        for (int i = 0; i < NKV * HD; i++)
                            kv[i] = kvt_rand(&ks);
                        kv_kvstore_append(both[st], 0, kv, kv, &pos[t], 1);
                    }
                    cr_assert_eq(kv_kvstore_attention(both[st], 0, q, pos, T, o[st], &err), KV_OK,
                                 "case %zu: %s", c, err.msg);
                }
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < NKV * HD; i++)
                        (void)kvt_rand(&seed);
                float scale = 0, diff = 0;
                for (int i = 0; i < NH * HD * T; i++) {
                    scale = fmaxf(scale, fabsf(o[0][i]));
                    diff = fmaxf(diff, fabsf(o[0][i] - o[1][i]));
                }
                cr_assert_lt(diff, 1e-5f * scale + 1e-7f, "case %zu (residual %d) step %d: backend differs by %g",
                             c, residual, step, (double)diff);
                p += T;
            }
            kv_kvstore_layer_stats sa, sb;
            kv_kvstore_get_layer_stats(a, 0, &sa);
            kv_kvstore_get_layer_stats(b, 0, &sb);
            cr_assert_eq(sa.tokens_high, sb.tokens_high, "case %zu: tiers differ", c);
            cr_assert_eq(sa.tokens_pruned, sb.tokens_pruned, "case %zu: tiers differ", c);
            kv_kvstore_destroy(a);
            kv_kvstore_destroy(b);
        }
    kv_kvstore_destroy(pre);
    kv_backend_close(be);
}
