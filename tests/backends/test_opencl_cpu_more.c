/* test_opencl_cpu_more.c — the OpenCL CPU-device attention (kernels.cl,
 * KV_CPU_ATTENTION) in the shapes session 8 added, against the CPU reference
 * within the conformance tolerance (relative 1e-5): batches of (query, head)
 * slots that decode each K and V row once for several queries (verification
 * k = 1, 2, 4, 7 with causal masks, prefill, GQA groups 1, 2, 3, 4, 8, 12, odd
 * token counts 1, 63, 65, 4097), and a tile's fp16 metadata converted 16 at a
 * time by integer vector ops (kv_cpu_meta) on hand-made pages whose scales and
 * zeros are fp16 subnormals, ±0 and the largest finite halves. Both dot
 * products (double and KVSIM_OPENCL_FP64=0). Without an OpenCL device every
 * test says "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "core/base/rng.h"
#include "backends/numerics.h"
#include "tests/kernels_util.h"

#define Q8 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}
#define Q4 {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 32}
#define Q2 {KV_STORE_QUANT, 2, 0, KV_GROUP_TOKEN, 16}
#define QA {KV_STORE_QUANT, 8, 4, KV_GROUP_TOKEN, 32}
#define QC2 {KV_STORE_QUANT, 2, 0, KV_GROUP_CHANNEL, 32}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}

typedef struct batch_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[2], v[2];
    uint32_t n_formats;
    int scores;
} batch_case;

/* Queries are the context's last n_queries tokens, so each sees one token
   more than the one before: masks inside the last tile. A batch holds
   8 / min(group, 8) queries. */
static const batch_case batch_cases[] = {
    {"verify k=1, GQA 4 (a batch of 1 query)", 1, 8, 2, 128, 63, 32, {Q8}, {Q4}, 1, 1},
    {"verify k=2, GQA 4, 65 tokens", 2, 8, 2, 128, 65, 32, {Q8, QA}, {Q4, Q8}, 2, 1},
    {"verify k=4, GQA 4 (2 batches of 2 queries), 4097 tokens", 4, 8, 2, 128, 4097, 32, {Q8}, {Q8}, 1, 1},
    {"verify k=7, GQA 4 (batches of 2, 2, 2, 1)", 7, 8, 2, 128, 1000, 16, {Q4, BF16}, {QA, Q2}, 2, 1},
    {"verify k=7, MHA (one batch of 7 queries)", 7, 4, 4, 64, 63, 32, {Q8}, {Q8}, 1, 1},
    {"verify k=7, GQA 2 (batches of 4 and 3), 1 token + 6", 7, 4, 2, 64, 7, 32, {Q8}, {Q4}, 1, 1},
    {"verify k=4, GQA 3 (batches of 2 queries, 3 heads)", 4, 6, 2, 96, 333, 16, {Q8, QC2}, {Q4, Q8}, 2, 1},
    {"verify k=2, GQA 8 (one query per batch)", 2, 16, 2, 128, 300, 32, {Q8}, {Q8}, 1, 1},
    {"verify k=7, GQA 12 (head batches 8 + 4)", 7, 24, 2, 64, 129, 32, {Q8}, {BF16}, 1, 1},
    {"prefill of 65 tokens, GQA 2: 17 query batches over masked tiles", 65, 4, 2, 64, 65, 16, {Q8}, {Q4}, 1, 1},
    {"prefill of 9 tokens, MHA: a batch of 8 and 1", 9, 2, 2, 32, 9, 32, {QA}, {Q8}, 1, 0},
};
#define N_BATCH_CASES (sizeof batch_cases / sizeof batch_cases[0])

static void check_batches(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_BATCH_CASES; i++) {
        const batch_case *c = &batch_cases[i];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, c->scores, 0, 800 + i};
        double e, es;
        kvt_attention_errors(be, ref, &spec, 0, 1, 1, c->name, &e, &es);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        if (c->scores) {
            cr_expect(es <= 1e-5, "fp64 %s, %s: scores differ from the reference by %.3g relative",
                      fp64 ? fp64 : "default", c->name, es);
        }
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_more, query_batches_default_dot_product)
{
    check_batches(NULL);
}

Test(opencl_cpu_more, query_batches_float_float_dot_product)
{
    check_batches("0");
}

/* ---- fp16 metadata extremes on hand-made pages ----------------------------------- */

/* Metadata drawn for every group of a store. */
typedef enum meta_kind {
    META_MODERATE,  /* scale in [2^-8, 2^-6), zero in (-1, 0): ordinary keys */
    META_SUBNORMAL, /* scale and zero fp16 subnormals or ±0 (|x| < 2^-14) */
    META_MAXIMA,    /* scale and zero among the largest finite halves (±65504, ±65472, 32768) */
} meta_kind;

static uint16_t draw_half(kv_rng *rng, meta_kind kind)
{
    uint32_t r = (uint32_t)kv_rng_u64(rng);
    if (kind == META_SUBNORMAL) {
        static const uint16_t edge[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0200};
        if (r % 4 == 0)
            return edge[(r >> 8) % (sizeof edge / sizeof edge[0])];
        return (uint16_t)(((r >> 8) & 0x3ffu) | (r & 0x10000u ? 0x8000u : 0));
    }
    if (kind == META_MAXIMA) {
        static const uint16_t big[] = {0x7bff, 0xfbff, 0x7bfe, 0xfbfe, 0x7800, 0x0400, 0x8400};
        return big[(r >> 8) % (sizeof big / sizeof big[0])];
    }
    return 0;
}

typedef struct meta_case {
    const char *name;
    uint32_t n_queries, n_heads, ntok, head_dim;
    unsigned bits; /* K and V: token groups of 16 at `bits`, or anchor-only 8/4 when bits == 84 */
    meta_kind k, v;
    float q_scale;
} meta_case;

static const meta_case meta_cases[] = {
    {"V metadata subnormal, int8, 33 tokens", 1, 4, 33, 32, 8, META_MODERATE, META_SUBNORMAL, 4.0f},
    {"K metadata subnormal (q large), int4, 17 tokens, k=3", 3, 4, 17, 64, 4, META_SUBNORMAL, META_MODERATE,
     2.0e5f},
    {"V metadata at the largest halves, int8, 63 tokens, k=2", 2, 2, 63, 32, 8, META_MODERATE, META_MAXIMA, 4.0f},
    {"V metadata at the largest halves, anchor-only 8/4, 16 tokens", 1, 4, 16, 48, 84, META_MODERATE, META_MAXIMA,
     4.0f},
    {"both subnormal, int2, 1 token", 1, 2, 1, 16, 2, META_SUBNORMAL, META_SUBNORMAL, 2.0e5f},
};
#define N_META_CASES (sizeof meta_cases / sizeof meta_cases[0])

/* One KV head, one page of ntok tokens, K then V: random codes, metadata of
   the case's kinds. Returns the bytes of kv_data. */
static size_t meta_page(const meta_case *c, kv_rng *rng, uint8_t **out, kv_page_desc *pg)
{
    kv_store_format f = {KV_STORE_QUANT, (uint8_t)(c->bits == 84 ? 8 : c->bits), (uint8_t)(c->bits == 84 ? 4 : 0),
                         KV_GROUP_TOKEN, 16};
    kv_quant_layout l = {c->ntok, c->head_dim, 16, KV_GROUP_TOKEN};
    unsigned pb = f.anchor_bits ? f.anchor_bits : f.bits;
    size_t plane = kv_layout_packed_bytes(&l, pb), groups = kv_layout_groups(&l);
    size_t store = (plane + 3) / 4 * 4 + groups * 4, bytes = 2 * store;
    uint8_t *kv = calloc(bytes, 1);
    for (int s = 0; s < 2; s++) {
        uint8_t *base = kv + s * store;
        for (size_t i = 0; i < plane; i++)
            base[i] = (uint8_t)kv_rng_u64(rng);
        uint16_t *meta = (uint16_t *)(base + (plane + 3) / 4 * 4);
        meta_kind kind = s == 0 ? c->k : c->v;
        for (size_t g = 0; g < groups; g++) {
            if (kind == META_MODERATE) {
                float sc = 0.00390625f * (1.0f + (float)(kv_rng_u64(rng) % 1000) / 334.0f);
                meta[g] = kv_f16_from_f32(sc);
                meta[groups + g] = kv_f16_from_f32(-(float)(kv_rng_u64(rng) % 1000) / 1000.0f);
            } else {
                meta[g] = draw_half(rng, kind);
                meta[groups + g] = draw_half(rng, kind);
            }
        }
    }
    memset(pg, 0, sizeof *pg);
    pg->ntokens = c->ntok;
    pg->pos_index = 0;
    pg->key = pg->value = f;
    pg->key_data = 0;
    pg->key_meta = (plane + 3) / 4 * 4;
    pg->value_data = store;
    pg->value_meta = store + pg->key_meta;
    *out = kv;
    return bytes;
}

static void check_meta(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_META_CASES; i++) {
        const meta_case *c = &meta_cases[i];
        kv_rng rng;
        kv_rng_seed(&rng, 900 + i);
        uint8_t *kv = NULL;
        kv_page_desc pg;
        size_t kv_bytes = meta_page(c, &rng, &kv, &pg);
        double e = kvt_page_error(be, ref, c->name, c->n_queries, c->n_heads, c->head_dim, c->ntok, kv, kv_bytes, &pg,
                                  950 + i, c->q_scale, NULL);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        free(kv);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_more, half_metadata_extremes_default_dot_product)
{
    check_meta(NULL);
}

Test(opencl_cpu_more, half_metadata_extremes_float_float_dot_product)
{
    check_meta("0");
}
