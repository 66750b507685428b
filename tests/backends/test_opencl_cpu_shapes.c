/* test_opencl_cpu_shapes.c — the OpenCL kernels' CPU-device shapes (kernels.cl:
 * the vector encode of token groups, kv_cpu_encode_group; the attention of
 * KV_CPU_ATTENTION with its vector row readers, batches of GQA heads and
 * double or float-float dot products; the scores' vector logits) against the
 * CPU reference: encode bit for bit over odd group counts and lengths, every
 * width 1..16 and anchor split, awkward values; attention within the
 * conformance tolerance (relative 1e-5) over 1, 63, 65 and 4097 tokens, tile
 * and split-chunk remainders, GQA groups of 1, 3, 4, 12 (two head batches),
 * every reader (f32, bf16, 2/4/8-bit and anchor-only token groups, and the
 * scalar fallbacks: channel groups, 3 and 16 bits, groups or head_dims not a
 * multiple of 16), verification, prefill, empty pages and scores, with the
 * double dot product and with KVSIM_OPENCL_FP64=0. Without an OpenCL device
 * every test says "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

/* ---- Encode ------------------------------------------------------------------------ */

typedef struct planes {
    unsigned char *anchor, *residual;
    uint16_t *scale, *zero;
} planes;

static planes encode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned a, const float *x)
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    size_t pa = kv_layout_packed_bytes(l, a ? a : bits), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
    kv_buffer *bx = kvt_put(be, x, n * 4), *ba = kvt_fill(be, pa, 0xa5), *br = a ? kvt_fill(be, pr, 0xa5) : NULL;
    kv_buffer *bs = kvt_fill(be, groups * 2, 0xa5), *bz = kvt_fill(be, groups * 2, 0xa5);
    kv_error err = {0};
    kv_encode_args e = {*l, bits, a, {bx, 0}, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    planes p = {kvt_get(be, ba, pa), a ? kvt_get(be, br, pr) : NULL, kvt_get(be, bs, groups * 2),
                kvt_get(be, bz, groups * 2)};
    kv_buffer_free(be, bx), kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
    return p;
}

/* rows x cols in token groups of G: odd group counts, groups shorter than 16,
   not a multiple of 16, a short last group in every row, G > cols. */
static const kv_quant_layout enc_shapes[] = {
    {1, 1, 1, KV_GROUP_TOKEN},      {3, 5, 1, KV_GROUP_TOKEN},     {7, 15, 15, KV_GROUP_TOKEN},
    {5, 16, 16, KV_GROUP_TOKEN},    {9, 17, 16, KV_GROUP_TOKEN},   {11, 100, 32, KV_GROUP_TOKEN},
    {13, 60, 20, KV_GROUP_TOKEN},   {3, 111, 37, KV_GROUP_TOKEN},  {17, 96, 48, KV_GROUP_TOKEN},
    {6, 72, 128, KV_GROUP_TOKEN},   {33, 128, 32, KV_GROUP_TOKEN}, {2, 257, 64, KV_GROUP_TOKEN},
};

static void check_encode(kv_backend *be, kv_backend *ref, const kv_quant_layout *l, unsigned bits, unsigned a,
                         const float *x)
{
    size_t groups = kv_layout_groups(l);
    size_t pa = kv_layout_packed_bytes(l, a ? a : bits), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
    planes p1 = encode(be, l, bits, a, x), p2 = encode(ref, l, bits, a, x);
    long d;
    d = kvt_first_diff(p1.scale, p2.scale, groups * 2);
    cr_expect(d < 0, "%ux%u G %u, b %u a %u: scale of group %ld differs", l->rows, l->cols, l->group_size, bits, a,
              d / 2);
    d = kvt_first_diff(p1.zero, p2.zero, groups * 2);
    cr_expect(d < 0, "%ux%u G %u, b %u a %u: zero of group %ld differs", l->rows, l->cols, l->group_size, bits, a,
              d / 2);
    d = kvt_first_diff(p1.anchor, p2.anchor, pa);
    cr_expect(d < 0, "%ux%u G %u, b %u a %u: %s plane byte %ld of %zu differs (0x%02x, want 0x%02x)", l->rows,
              l->cols, l->group_size, bits, a, a ? "anchor" : "packed", d, pa, d >= 0 ? p1.anchor[d] : 0,
              d >= 0 ? p2.anchor[d] : 0);
    if (a) {
        d = kvt_first_diff(p1.residual, p2.residual, pr);
        cr_expect(d < 0, "%ux%u G %u, b %u a %u: residual plane byte %ld of %zu differs", l->rows, l->cols,
                  l->group_size, bits, a, d, pr);
    }
    free(p1.anchor), free(p1.residual), free(p1.scale), free(p1.zero);
    free(p2.anchor), free(p2.residual), free(p2.scale), free(p2.zero);
}

/* Every shape, every width 1..16 with no anchor, a 1-bit anchor and a half
   split (the vector packers for 1, 2, 4, 8, 16 bits and the shift-and-or one
   for the others), on normal values with NaN, ±Inf, ±0, fp16 overflow and
   constant runs mixed in. */
Test(opencl_cpu_shapes, encode_token_groups_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", NULL), *ref = kvt_open_reference();
    kv_rng rng;
    kv_rng_seed(&rng, 2207);
    for (size_t s = 0; s < sizeof enc_shapes / sizeof enc_shapes[0]; s++) {
        const kv_quant_layout *l = &enc_shapes[s];
        size_t n = (size_t)l->rows * l->cols;
        float *x = malloc(n * 4);
        kvt_values(&rng, x, n, 2.0f, 1);
        for (unsigned bits = 1; bits <= 16; bits++) {
            check_encode(be, ref, l, bits, 0, x);
            if (bits > 1)
                check_encode(be, ref, l, bits, 1, x);
            if (bits > 2)
                check_encode(be, ref, l, bits, bits / 2, x);
        }
        free(x);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

/* Groups where the order-preserving keys decide: only -0 and +0 (min and max
   are equal as floats), no finite value at all, one finite value among
   NaN/Inf, the extremes of fp32, and subnormals. */
Test(opencl_cpu_shapes, encode_min_max_keys_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", NULL), *ref = kvt_open_reference();
    enum { COLS = 40, ROWS = 8 };
    float x[ROWS * COLS];
    for (int i = 0; i < COLS; i++) {
        x[0 * COLS + i] = (i % 2) ? -0.0f : 0.0f;
        x[1 * COLS + i] = (i % 3) ? NAN : (i % 2 ? INFINITY : -INFINITY);
        x[2 * COLS + i] = i == 17 ? -3.5f : NAN;
        x[3 * COLS + i] = (i % 2) ? 3.4028235e38f : -3.4028235e38f;
        x[4 * COLS + i] = (float)(i - 20) * 1e-42f; /* subnormals */
        x[5 * COLS + i] = -0.0f;
        x[6 * COLS + i] = (float)(COLS - i) * -0.25f;
        x[7 * COLS + i] = i == 39 ? 1.0f : -0.0f;
    }
    const unsigned gs[] = {1, 8, 16, 20, 40};
    for (size_t g = 0; g < sizeof gs / sizeof gs[0]; g++) {
        kv_quant_layout l = {ROWS, COLS, gs[g], KV_GROUP_TOKEN};
        for (unsigned bits = 1; bits <= 16; bits += 3)
            check_encode(be, ref, &l, bits, bits > 1 ? bits - 1 : 0, x);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

/* ---- Attention ----------------------------------------------------------------------- */

#define Q8 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}
#define Q4 {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 32}
#define Q2 {KV_STORE_QUANT, 2, 0, KV_GROUP_TOKEN, 16}
#define Q3 {KV_STORE_QUANT, 3, 0, KV_GROUP_TOKEN, 32}
#define Q16 {KV_STORE_QUANT, 16, 0, KV_GROUP_TOKEN, 32}
#define Q8G48 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 48}
#define Q4G20 {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 20}
#define Q8G256 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 256}
#define QC2 {KV_STORE_QUANT, 2, 0, KV_GROUP_CHANNEL, 32}
#define QA {KV_STORE_QUANT, 8, 4, KV_GROUP_TOKEN, 32}
#define QA2 {KV_STORE_QUANT, 6, 2, KV_GROUP_TOKEN, 16}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}
#define F32 {KV_STORE_F32, 0, 0, 0, 0}

typedef struct attn_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[3], v[3];
    uint32_t n_formats;
    int scores, empty_pages;
} attn_case;

static const attn_case cases[] = {
    {"1 token, GQA 4, int8", 1, 8, 2, 128, 1, 32, {Q8}, {Q8}, 1, 1, 0},
    {"63 tokens: a tile remainder of 15, int4 K, int2 V", 1, 8, 2, 128, 63, 32, {Q4}, {Q2}, 1, 1, 0},
    {"65 tokens in one 65-token page: 4 tiles and 1, anchor-only K, f32 V", 1, 8, 2, 64, 65, 65, {QA}, {F32}, 1, 1,
     0},
    {"4097 tokens: 129 pages per KV head, 8 chunks of 17 (the last 10)", 1, 8, 2, 128, 4097, 32, {Q8}, {Q4}, 1, 1, 0},
    {"4097 tokens, 7-token pages: channel K, 3-bit and 16-bit (the scalar readers)", 1, 4, 1, 96, 4097, 7,
     {Q8, QC2, BF16},
     {QA, Q3, Q16},
     3,
     1,
     0},
    {"GQA 12: two head batches (8 + 4)", 1, 24, 2, 128, 700, 16, {Q8, BF16}, {Q4, QA2}, 2, 1, 0},
    {"GQA 3, head_dim 40 (not a multiple of 16), G 20", 1, 6, 2, 40, 333, 16, {Q4G20, F32}, {Q8, Q4G20}, 2, 1, 0},
    {"G 48 and G 256 (> head_dim 96)", 1, 8, 2, 96, 515, 32, {Q8G48, Q8G256}, {Q8G256, Q8G48}, 2, 1, 0},
    {"MHA (group 1), head_dim 256", 1, 4, 4, 256, 600, 32, {BF16}, {Q8}, 1, 0, 0},
    {"verify k=4 over a split context", 4, 8, 2, 128, 2049, 16, {Q8, QA}, {Q4, Q8}, 2, 1, 0},
    {"prefill of 40 tokens: causal masks inside tiles", 40, 4, 2, 64, 40, 16, {Q8}, {BF16}, 1, 1, 0},
    {"empty pages before each KV head's pages", 1, 8, 2, 128, 300, 32, {Q8}, {Q8}, 1, 1, 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Every case against the reference, on opencl:0 with KVSIM_OPENCL_FP64=fp64. */
static void check_attention(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_CASES; i++) {
        const attn_case *c = &cases[i];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, c->scores, c->empty_pages, 700 + i};
        double e, es;
        kvt_attention_errors(be, ref, &spec, 0, 1, 1, c->name, &e, &es);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        if (c->scores) { /* per KV head */
            cr_expect(es <= 1e-5, "fp64 %s, %s: scores differ from the reference by %.3g relative",
                      fp64 ? fp64 : "default", c->name, es);
        }
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_shapes, attention_default_dot_product)
{
    check_attention(NULL);
}

Test(opencl_cpu_shapes, attention_float_float_dot_product)
{
    check_attention("0");
}

Test(opencl_cpu_shapes, bad_fp64_is_bad_input_naming_the_variable)
{
    kvt_require_opencl();
    setenv("KVSIM_OPENCL_FP64", "2", 1);
    kv_backend *be = NULL;
    kv_error err = {0};
    int rc = kv_backend_open("opencl", 0, &be, &err);
    unsetenv("KVSIM_OPENCL_FP64");
    cr_assert_eq(rc, KV_EINPUT, "KVSIM_OPENCL_FP64=2 was accepted (rc %d)", rc);
    cr_assert(strstr(err.msg, "KVSIM_OPENCL_FP64=2"), "%s", err.msg);
    cr_assert_null(be);
}
