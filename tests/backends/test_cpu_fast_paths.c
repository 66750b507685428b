/* test_cpu_fast_paths.c — the fast CPU attention (cpu:0) against the
 * reference on the shapes that reach the edges of its blocked loops: the K
 * pass takes four tokens at a time, so pages of 1 to 9 tokens (tails of 0-3
 * tokens and pages shorter than a block), row counts that are not multiples
 * of 4 (padding rows inside a block), causal masks that differ between the
 * rows and tokens of one block (verification), and every page reader
 * (f32, bf16, 8/16-bit, 4-bit and 2-bit tables, anchors, odd widths, channel
 * groups). Run on the AVX-512 paths (when this CPU has them), on the AVX2
 * paths (forced with KVSIM_CPU_ISA=avx2 on AVX-512 CPUs; skipped without
 * AVX2) and on the portable paths, within the conformance tolerance 1e-5;
 * the AVX2 readers (8 values per chunk: 8-element groups, 1- to 16-bit codes)
 * also over 1 to 4097 tokens, GQA 1/4/8, huge and subnormal queries. And the fused
 * encode of token groups, whose 16-group batches take their minima and
 * maxima from one tree: every batch tail, signed zeros, groups without a
 * finite value, bit for bit against the reference. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "tests/kernels_util.h"

#define F32 {KV_STORE_F32, 0, 0, 0, 0}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}
#define Q(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_TOKEN, g}
#define QC(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_CHANNEL, g}
#define QA(bits, a, g) {KV_STORE_QUANT, bits, a, KV_GROUP_TOKEN, g}

typedef struct reader_case {
    const char *name;
    kv_store_format k, v;
} reader_case;

/* One of each page reader of cpu_attention_avx512.c and cpu_attention_avx2.c. */
static const reader_case readers[] = {
    {"f32", F32, F32},
    {"bf16", BF16, BF16},
    {"int8 g32", Q(8, 32), Q(8, 32)},
    {"int16 g64", Q(16, 64), Q(16, 64)},
    {"int4 g32 (table)", Q(4, 32), Q(4, 32)},
    {"lynx anchor-only b8/a4", QA(8, 4, 32), QA(8, 4, 32)},
    {"anchor-only b16/a8", QA(16, 8, 32), QA(12, 8, 16)},
    {"int5 g32 (any width)", Q(5, 32), Q(3, 16)},
    {"int2 g32 (2-bit table)", Q(2, 32), Q(2, 32)},
    {"kivi2 channel keys", QC(2, 32), Q(2, 32)},
    {"int4 g16 (not a table: G % 32 != 0)", Q(4, 16), Q(8, 16)},
    {"int1 g32 / anchor-only b6/a2 g16", Q(1, 32), QA(6, 2, 16)},
    {"int4 g8 / int6 g8 (8-element groups)", Q(4, 8), Q(6, 8)},
    {"int12 g16 / int16 g16", Q(12, 16), Q(16, 16)},
    {"int3 g4 / int4 g4 (f32 tile: G % 8 != 0)", Q(3, 4), Q(4, 4)},
};
#define N_READERS (sizeof readers / sizeof readers[0])

/* Attention of `spec` on cpu:0 and on the reference; returns the larger of
   the output and score errors. */
static double attention_error(kv_backend *be, kv_backend *ref, const kv_attn_spec *spec, const char *label)
{
    double e, es;
    kvt_attention_errors(be, ref, spec, 0, 0, 0, label, &e, &es);
    return es > e ? es : e;
}

/* Every reader x page sizes 1..9 x {decode with GQA 4, decode with GQA 3
   (a block's fourth row is padding), verification of k = 3 with GQA 2 (rows
   of one block see different tokens)}, head_dim 64 and 128. */
static void run_matrix(const char *paths)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    kv_backend_props props;
    kv_backend_get_props(be, &props);
    cr_log_info("cpu:0 (%s paths): %s", paths, props.device);
    static const uint32_t shapes[][3] = {{1, 8, 2}, {1, 6, 2}, {3, 4, 2}}; /* n_queries, n_heads, n_kv_heads */
    int checked = 0;
    for (size_t ri = 0; ri < N_READERS; ri++)
        for (uint32_t pt = 1; pt <= 9; pt++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const reader_case *rc = &readers[ri];
                uint32_t hd = (pt + (uint32_t)si) % 2 ? 64 : 128, tokens = 4 * pt + 3 + (uint32_t)si;
                if (rc->k.grouping == KV_GROUP_CHANNEL && rc->k.group_size > tokens)
                    tokens = rc->k.group_size + pt; /* at least one full channel group */
                kv_attn_spec spec = {shapes[si][0], shapes[si][1], shapes[si][2], hd, tokens, pt, &rc->k, &rc->v,
                                     1, si == 0, 0, 7000 + 97 * ri + 11 * pt + si};
                double e = attention_error(be, ref, &spec, rc->name);
                cr_expect(e <= 1e-5,
                          "%s paths, %s: %u-token pages, %u queries, %u heads / %u KV heads, head_dim %u: "
                          "relative error %.3g",
                          paths, rc->name, pt, spec.n_queries, spec.n_heads, spec.n_kv_heads, hd, e);
                checked++;
            }
    cr_assert_eq(checked, (int)(N_READERS * 9 * 3));
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_fast_paths, blocked_attention_tails_native)
{
    run_matrix("native");
}

Test(cpu_fast_paths, blocked_attention_tails_avx2)
{
    kvt_force_cpu_avx2();
    kv_backend *be = kvt_open("cpu", 0);
    kvt_expect_cpu_isa(be, "avx2");
    kv_backend_close(be);
    run_matrix("avx2");
}

Test(cpu_fast_paths, blocked_attention_tails_generic)
{
    setenv("KVSIM_CPU_ISA", "generic", 1); /* each Criterion test runs in its own process */
    run_matrix("generic");
}

/* A 2048-token decode with 32-token pages: the K pass's blocks then cover
   whole pages and the softmax runs over many blocks; the output must stay
   within 1e-5 for the long-context readers the benchmark times. */
static void run_long_context(void)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const size_t pick[] = {2, 4, 5, 9};
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
        const reader_case *rc = &readers[pick[i]];
        kv_attn_spec spec = {1, 32, 8, 128, 2048, 32, &rc->k, &rc->v, 1, 0, 0, 4242 + i};
        double e = attention_error(be, ref, &spec, rc->name);
        cr_expect(e <= 1e-5, "%s: 2048-token decode: relative error %.3g", rc->name, e);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_fast_paths, long_context_decode)
{
    run_long_context();
}

Test(cpu_fast_paths, long_context_decode_avx2)
{
    kvt_force_cpu_avx2();
    run_long_context();
}

/* Token-group readers over contexts of 1, 15, 17, 63, 65 and 4097 tokens
   (inside and across the K pass's token pairs, 8-value chunks and 32-token
   pages), GQA 1, 4 and 8 (one, one and two row groups), decode and k = 4
   verification (16 and 32 rows: the two-row-group passes), scores on every
   other case, and queries normal, huge (x4), tiny (x1e-30) and mixed (every
   5th element x4, the rest x1e-40: subnormal floats). */
static void run_shapes(const char *paths)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const size_t pick[] = {0, 1, 2, 4, 5, 6, 7, 8, 11, 12, 13, 14};
    static const uint32_t ctxs[] = {1, 15, 17, 63, 65, 4097}, gqa[] = {1, 4, 8}, ks[] = {1, 4};
    static const struct {
        const char *name;
        uint32_t stride;
        float big, small;
    } qs[] = {{"normal", 0, 1, 1}, {"huge", 1, 4, 1}, {"tiny", 1, 1e-30f, 1}, {"mixed", 5, 4, 1e-40f}};
    int checked = 0, qmodes[4] = {0, 0, 0, 0};
    for (size_t pi = 0; pi < sizeof pick / sizeof pick[0]; pi++)
        for (size_t xi = 0; xi < sizeof ctxs / sizeof ctxs[0]; xi++)
            for (size_t gi = 0; gi < sizeof gqa / sizeof gqa[0]; gi++)
                for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                    const reader_case *rc = &readers[pick[pi]];
                    uint32_t T = ctxs[xi], k = ks[ki];
                    size_t idx = pi + xi + gi + ki, qi = (idx / 2 + gi + xi) % 4;
                    if (k > T || (T == 4097 && (gi + ki + pi) % 3 != 0))
                        continue; /* the long context for a third of the cases */
                    kv_attn_spec spec = {k, 2 * gqa[gi], 2, (pi + xi) % 2 ? 64 : 128, T, 32, &rc->k, &rc->v, 1,
                                         (int)(idx % 2), 0, 8800 + 101 * pi + 13 * xi + 3 * gi + ki};
                    double e, es;
                    kvt_attention_errors(be, ref, &spec, qs[qi].stride, qs[qi].big, qs[qi].small, rc->name, &e, &es);
                    e = es > e ? es : e;
                    cr_expect(e <= 1e-5,
                              "%s paths, %s: %u tokens, k = %u, GQA %u, head_dim %u, %s queries%s: relative error %.3g",
                              paths, rc->name, T, k, gqa[gi], spec.head_dim, qs[qi].name,
                              spec.scores ? ", scores" : "", e);
                    qmodes[qi]++, checked++;
                }
    cr_assert_gt(checked, 300);
    for (int i = 0; i < 4; i++)
        cr_assert_gt(qmodes[i], 50, "query mode %s ran %d times", qs[i].name, qmodes[i]);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_fast_paths, token_group_shapes_native)
{
    run_shapes("native");
}

Test(cpu_fast_paths, token_group_shapes_avx2)
{
    kvt_force_cpu_avx2();
    run_shapes("avx2");
}

/* ---- Encode of token groups: 16 groups per batch, min/max by one tree ---- */

/* cpu:0's fused encode against the reference, bit for bit, for rows x cols
   of token groups of G with b bits and anchor a (0: none). mode 0: normal
   values with NaN/±Inf/±0/huge/tiny and constant runs; 1: only ±0 (with a
   NaN now and then): the metadata must not depend on which zero the min/max
   tree meets first; 2: groups with no finite value (NaN and ±Inf only). */
static void check_encode(kv_backend *be, kv_backend *ref, uint32_t rows, uint32_t cols, uint32_t G, unsigned b,
                         unsigned a, int mode, uint64_t seed)
{
    kv_quant_layout l = {rows, cols, G, KV_GROUP_TOKEN};
    size_t n = (size_t)rows * cols, groups = kv_layout_groups(&l);
    size_t ab = kv_layout_packed_bytes(&l, a ? a : b), rb = a ? kv_layout_packed_bytes(&l, b - a) : 0;
    float *x = malloc(n * sizeof *x + 4);
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    kvt_values(&rng, x, n, 2.0f, 1);
    for (size_t i = 0; i < n && mode; i++) {
        uint64_t k = kv_rng_below(&rng, 16);
        if (mode == 1)
            x[i] = k == 0 ? NAN : k & 1 ? -0.0f : 0.0f;
        else
            x[i] = k < 6 ? NAN : k < 11 ? INFINITY : -INFINITY;
    }
    unsigned char *out[2][4];
    kv_backend *bes[2] = {be, ref};
    size_t bytes[4] = {ab, rb, groups * 2, groups * 2};
    for (int d = 0; d < 2; d++) {
        kv_buffer *bx = kvt_put(bes[d], x, n * sizeof *x), *buf[4];
        for (int k = 0; k < 4; k++)
            buf[k] = kvt_fill(bes[d], bytes[k], 0xA5);
        kv_encode_args e = {l, b, a, {bx, 0}, {buf[0], 0}, {a ? buf[1] : NULL, 0}, {buf[2], 0}, {buf[3], 0}};
        kv_error err = {0};
        cr_assert_eq(kv_backend_encode(bes[d], &e, &err), KV_OK, "%s", err.msg);
        for (int k = 0; k < 4; k++) {
            out[d][k] = kvt_get(bes[d], buf[k], bytes[k]);
            kv_buffer_free(bes[d], buf[k]);
        }
        kv_buffer_free(bes[d], bx);
    }
    static const char *part[4] = {"anchor (or code) plane", "residual plane", "scale", "zero"};
    for (int k = 0; k < 4; k++)
        if (k != 1 || a)
            cr_expect(memcmp(out[0][k], out[1][k], bytes[k]) == 0,
                      "encode %u x %u, G %u, b %u, a %u, mode %d: %s differs from the reference", rows, cols, G, b,
                      a, mode, part[k]);
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++)
            free(out[d][k]);
    free(x);
}

/* Group counts 1..17, 31 and 33 (batches of 16 ending with 1..16 groups),
   G 16..64 tiling rows of 1-3 groups, on the AVX-512 paths (when present). */
Test(cpu_fast_paths, encode_token_groups_bit_exact)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const uint32_t Gs[] = {16, 32, 48, 64};
    static const unsigned bits[][2] = {{8, 0}, {8, 4}, {3, 0}, {12, 2}};
    static const uint32_t totals[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33};
    int cases = 0;
    for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++)
        for (uint32_t per_row = 1; per_row <= 3; per_row++)
            for (size_t ti = 0; ti < sizeof totals / sizeof totals[0]; ti++) {
                if (totals[ti] % per_row)
                    continue;
                for (size_t bi = 0; bi < sizeof bits / sizeof bits[0]; bi++)
                    for (int mode = 0; mode < 3; mode++, cases++)
                        check_encode(be, ref, totals[ti] / per_row, Gs[gi] * per_row, Gs[gi], bits[bi][0],
                                     bits[bi][1], mode, 900 + (uint64_t)cases);
            }
    cr_assert_gt(cases, 300);
    kv_backend_close(be);
    kv_backend_close(ref);
}
