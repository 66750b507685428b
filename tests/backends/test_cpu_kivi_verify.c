/* test_cpu_kivi_verify.c — the fast CPU attention (cpu:0) on KIVI's
 * channel-grouped K pages, which the AVX-512 item reads channel by channel
 * for 16 or 32 tokens at a time (no f32 tile), and on verification rows (k
 * queries over one KV head), against the reference within the conformance
 * tolerance 1e-5: context lengths 1, 31, 33 and 4097 (pages that end inside
 * a group and inside a 16-token vector), pages of several groups, group
 * sizes 16/32/64, every code width class (1, 2, 4 bits by table; 8, 16; odd
 * widths; anchors), a residual window of f32 pages between the quantized
 * ones, and GQA groups of 4, 3 and 1. Run on the AVX-512 paths (when this
 * CPU has them), on the AVX2 paths (KIVI keys of 1, 2, 4 and 8 bits read
 * channel by channel 8 tokens at a time, other widths through the f32 tile;
 * forced on AVX-512 CPUs, skipped without AVX2) and on the portable paths. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "tests/kernels_util.h"

#define F32 {KV_STORE_F32, 0, 0, 0, 0}
#define Q(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_TOKEN, g}
#define QC(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_CHANNEL, g}
#define QCA(bits, a, g) {KV_STORE_QUANT, bits, a, KV_GROUP_CHANNEL, g}

/* Attention of one problem on cpu:0 and on the reference: the larger of the
   output and score errors. */
static double attention_error(kv_backend *be, kv_backend *ref, const kv_attn_spec *spec)
{
    double e, es;
    kvt_attention_errors(be, ref, spec, 0, 1, 1, "attention", &e, &es);
    return es > e ? es : e;
}

typedef struct kcase {
    const char *name;
    kv_store_format k[2], v[2]; /* page p uses [p % n] */
    uint32_t n;                 /* 2: every other page is an f32 residual page */
} kcase;

static const kcase kcases[] = {
    {"kivi2 g32", {QC(2, 32)}, {Q(2, 32)}, 1},
    {"kivi2 g32 + f32 residual window", {QC(2, 32), F32}, {Q(2, 32), F32}, 2},
    {"kivi4 g64", {QC(4, 64)}, {Q(4, 32)}, 1},
    {"kivi1 g16", {QC(1, 16)}, {Q(8, 32)}, 1},
    {"kivi8 g32", {QC(8, 32)}, {Q(2, 32)}, 1},
    {"kivi16 g16", {QC(16, 16)}, {F32}, 1},
    {"kivi3 g32 (any width)", {QC(3, 32)}, {Q(4, 32)}, 1},
    {"kivi anchor-only b8/a4 g32", {QCA(8, 4, 32)}, {Q(2, 32)}, 1},
    {"kivi anchor-only b12/a5 g16", {QCA(12, 5, 16)}, {Q(8, 16)}, 1},
    {"kivi anchor-only b16/a8 g32", {QCA(16, 8, 32)}, {Q(4, 32)}, 1},
};
#define N_KCASES (sizeof kcases / sizeof kcases[0])

/* n_queries, n_heads, n_kv_heads: decode with GQA 4, 3 and 1, verification of 4 with GQA 4 and 3 */
static const uint32_t shapes[][3] = {{1, 8, 2}, {1, 6, 2}, {1, 2, 2}, {4, 8, 2}, {4, 6, 2}};

static void run_kivi(const char *paths)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const uint32_t ctxs[] = {1, 31, 33, 4097};
    static const uint32_t page_tokens[] = {32, 64, 48};
    int checked = 0;
    for (size_t ci = 0; ci < N_KCASES; ci++)
        for (size_t xi = 0; xi < sizeof ctxs / sizeof ctxs[0]; xi++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const kcase *kc = &kcases[ci];
                uint32_t tokens = ctxs[xi], pt = page_tokens[(ci + xi + si) % 3];
                uint32_t hd = (ci + si) % 3 == 0 ? 64 : (ci + si) % 3 == 1 ? 128 : 96;
                if (shapes[si][0] > tokens || (tokens == 4097 && si > 1 && ci > 2))
                    continue; /* a query per context token at most; the long context for a few cases */
                kv_attn_spec spec = {shapes[si][0], shapes[si][1], shapes[si][2], hd, tokens, pt, kc->k, kc->v,
                                     kc->n, si == 0, 0, 9100 + 131 * ci + 17 * xi + si};
                double e = attention_error(be, ref, &spec);
                cr_expect(e <= 1e-5,
                          "%s paths, %s: %u tokens in %u-token pages, %u queries, %u heads / %u KV heads, "
                          "head_dim %u: relative error %.3g",
                          paths, kc->name, tokens, pt, spec.n_queries, spec.n_heads, spec.n_kv_heads, hd, e);
                checked++;
            }
    cr_assert_gt(checked, 100);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_kivi_verify, kivi_channel_pages_native)
{
    run_kivi("native");
}

Test(cpu_kivi_verify, kivi_channel_pages_avx2)
{
    kvt_force_cpu_avx2();
    run_kivi("avx2");
}

Test(cpu_kivi_verify, kivi_channel_pages_generic)
{
    setenv("KVSIM_CPU_ISA", "generic", 1); /* each Criterion test runs in its own process */
    run_kivi("generic");
}

/* Verification: k = 2..5 queries of one sequence (each sees one more token
   than the previous) over int8, int4, 2-bit and KIVI pages, GQA 4, 3 and 1,
   odd context lengths, with and without scores. */
static void run_verify(const char *paths)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const kv_store_format ks[][1] = {{Q(8, 32)}, {Q(4, 32)}, {Q(2, 32)}, {QC(2, 32)}, {F32}};
    static const kv_store_format vs[][1] = {{Q(8, 32)}, {Q(4, 32)}, {Q(2, 32)}, {Q(2, 32)}, {F32}};
    static const char *names[] = {"int8 g32", "int4 g32", "int2 g32", "kivi2", "f32"};
    static const uint32_t ctxs[] = {31, 33, 4097};
    static const uint32_t heads[][2] = {{8, 2}, {6, 2}, {2, 2}, {32, 8}};
    int checked = 0;
    for (size_t fi = 0; fi < sizeof ks / sizeof ks[0]; fi++)
        for (size_t xi = 0; xi < sizeof ctxs / sizeof ctxs[0]; xi++)
            for (uint32_t k = 2; k <= 5; k++) {
                size_t hi = (fi + xi + k) % 4;
                if (ctxs[xi] == 4097 && hi == 3)
                    hi = 0; /* the long context with small head counts */
                kv_attn_spec spec = {k, heads[hi][0], heads[hi][1], 128, ctxs[xi], 32, ks[fi], vs[fi], 1,
                                     (int)(k % 2), 0, 5200 + 41 * fi + 7 * xi + k};
                double e = attention_error(be, ref, &spec);
                cr_expect(e <= 1e-5, "%s paths, verify k = %u, %s: %u tokens, %u heads / %u KV heads: relative error %.3g",
                          paths, k, names[fi], ctxs[xi], spec.n_heads, spec.n_kv_heads, e);
                checked++;
            }
    cr_assert_eq(checked, 5 * 3 * 4);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_kivi_verify, verify_rows_native)
{
    run_verify("native");
}

Test(cpu_kivi_verify, verify_rows_avx2)
{
    kvt_force_cpu_avx2();
    run_verify("avx2");
}

Test(cpu_kivi_verify, verify_rows_generic)
{
    setenv("KVSIM_CPU_ISA", "generic", 1);
    run_verify("generic");
}

/* ---- Session 8 (#22): the 16-row verification passes and the inlined KIVI reader ---- */

/* One problem on cpu:0 and on the reference, with its queries scaled by
   kv_attn_problem_scale_q(stride, big, small) first (stride 0: unscaled): the output error. */
static double scaled_error(kv_backend *be, kv_backend *ref, const kv_attn_spec *spec, uint32_t stride, float big,
                           float small)
{
    double e, es;
    kvt_attention_errors(be, ref, spec, stride, big, small, "attention", &e, &es);
    return e;
}

/* KIVI-2 (channel-grouped 2-bit K, token-grouped 2-bit V), int8 and f32
   pages: context lengths 1, 15, 17, 63, 65, 4097 (inside and across 16- and
   32-token vectors and groups); residual windows of 0 tokens (all pages
   quantized), 1 (a last f32 page of one token) and the full context (all
   f32); k = 1, 2, 4, 7 queries (query i at position T - k + i: the causal
   mask cuts the last page of every row differently); GQA groups 1, 4, 8
   (so 16 rows and more take the four-row-group passes, and 28 or 56 rows
   leave a pair and a single group after them); queries normal, huge (x4:
   logits some 100 apart, a softmax of a few tokens; from about x10 the f32
   logits of the old and the new passes alike leave 1e-5 against the
   reference's double ones), tiny (x1e-30: a flat softmax), and mixed (every
   5th element x4, the rest x1e-40, subnormal floats). */
static void run_rows16(void)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const kv_store_format kq[][2] = {{QC(2, 32), F32}, {Q(8, 32), F32}, {F32, F32}};
    static const kv_store_format vq[][2] = {{Q(2, 32), F32}, {Q(8, 32), F32}, {F32, F32}};
    static const kv_store_format all_f32[1] = {F32};
    static const char *names[] = {"kivi2", "int8 g32", "f32"};
    static const uint32_t ctxs[] = {1, 15, 17, 63, 65, 4097}, ks[] = {1, 2, 4, 7}, gqa[] = {1, 4, 8};
    static const struct {
        const char *name;
        uint32_t stride;
        float big, small;
    } qs[] = {{"normal", 0, 1, 1}, {"huge", 1, 4, 1}, {"tiny", 1, 1e-30f, 1}, {"mixed", 5, 4, 1e-40f}};
    int checked = 0, windows[3] = {0, 0, 0}, qmodes[4] = {0, 0, 0, 0};
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t xi = 0; xi < sizeof ctxs / sizeof ctxs[0]; xi++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t gi = 0; gi < sizeof gqa / sizeof gqa[0]; gi++) {
                    uint32_t T = ctxs[xi], k = ks[ki];
                    if (k > T)
                        continue;
                    size_t idx = fi + xi + ki + gi, wi = idx % 3, qi = (idx / 3 + gi) % 4;
                    /* window 0: 32-token pages, all quantized; 1: a quantized page of T - 1
                       tokens then an f32 page of 1 (T > 1); full: every page f32 */
                    kv_attn_spec spec = {k, 2 * gqa[gi], 2, 128, T, 32, kq[fi], vq[fi], 1, 0, 0,
                                         7700 + 97 * fi + 31 * xi + 11 * ki + gi};
                    if (wi == 1 && T > 1)
                        spec.page_tokens = T - 1, spec.n_formats = 2;
                    else if (wi == 2)
                        spec.key_formats = spec.value_formats = all_f32;
                    double e = scaled_error(be, ref, &spec, qs[qi].stride, qs[qi].big, qs[qi].small);
                    cr_expect(e <= 1e-5,
                              "%s, %u tokens, residual window %s, k = %u, GQA %u, %s queries: relative error %.3g",
                              names[fi], T, wi == 0 ? "0" : wi == 1 && T > 1 ? "1" : "full", k, gqa[gi],
                              qs[qi].name, e);
                    windows[wi]++, qmodes[qi]++, checked++;
                }
    cr_assert_gt(checked, 150);
    for (int i = 0; i < 3; i++)
        cr_assert_gt(windows[i], 20, "residual window case %d ran %d times", i, windows[i]);
    for (int i = 0; i < 4; i++)
        cr_assert_gt(qmodes[i], 20, "query mode %s ran %d times", qs[i].name, qmodes[i]);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_kivi_verify, rows16_kivi_shapes)
{
    run_rows16();
}

Test(cpu_kivi_verify, rows16_kivi_shapes_avx2)
{
    kvt_force_cpu_avx2();
    run_rows16();
}
