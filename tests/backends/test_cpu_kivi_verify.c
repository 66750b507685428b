/* test_cpu_kivi_verify.c — the fast CPU attention (cpu:0) on KIVI's
 * channel-grouped K pages, which the AVX-512 item reads channel by channel
 * for 16 or 32 tokens at a time (no f32 tile), and on verification rows (k
 * queries over one KV head), against the reference within the conformance
 * tolerance 1e-5: context lengths 1, 31, 33 and 4097 (pages that end inside
 * a group and inside a 16-token vector), pages of several groups, group
 * sizes 16/32/64, every code width class (1, 2, 4 bits by table; 8, 16; odd
 * widths; anchors), a residual window of f32 pages between the quantized
 * ones, and GQA groups of 4, 3 and 1. Run on the AVX-512 paths (when this
 * CPU has them) and on the portable paths. */
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
    kv_attn_problem *prob = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_attn_problem_create(spec, &prob, &err), KV_OK, "%s", err.msg);
    size_t no = kv_attn_problem_out_floats(prob), ns = kv_attn_problem_score_floats(prob);
    float *o[2] = {malloc(no * 4 + 4), malloc(no * 4 + 4)}, *sc[2] = {malloc(ns * 4 + 4), malloc(ns * 4 + 4)};
    kv_backend *bes[2] = {be, ref};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kv_attn_solve(prob, bes[i], o[i], sc[i], &err), KV_OK, "%s", err.msg);
    }
    double e = kv_attn_rel_error(o[0], o[1], (size_t)spec->n_queries * spec->n_heads, spec->head_dim);
    if (spec->scores) {
        double es = kv_attn_rel_error(sc[0], sc[1], spec->n_kv_heads, spec->tokens);
        e = es > e ? es : e;
    }
    free(o[0]), free(o[1]), free(sc[0]), free(sc[1]);
    kv_attn_problem_destroy(prob);
    return e;
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

Test(cpu_kivi_verify, verify_rows_generic)
{
    setenv("KVSIM_CPU_ISA", "generic", 1);
    run_verify("generic");
}
