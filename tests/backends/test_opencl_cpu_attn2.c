/* test_opencl_cpu_attn2.c — the OpenCL CPU-device attention paths of #22's
 * fourth pass (kernels.cl, KV_CPU_ATTENTION) against the CPU reference within
 * the conformance tolerance (relative 1e-5): the K dot products of 4 (query,
 * head) slots at once and the slots left over (kv_cpu_dot_d4 / kv_cpu_dot_d:
 * GQA 1, 3, 4, 8, 12, verification k = 1, 2, 4, 7), the V update of 4 slots at
 * once only when all 4 see the token (queries out of position order), the
 * tile's probability sum by halves, tile and page remainders (1, 63, 65,
 * 4097 tokens, pages of 16, 17 and 32; the prefetch of the next tile runs in
 * all of them but changes no result, so no case here can catch it),
 * the scores of a page 16 tokens at a time with double dot products
 * (kv_cpu_scores_page: slots <= 8; more slots keep the per-token path),
 * queries scaled by 1e-30, by 4 and mixed, and pages whose codes all sit on
 * the zero point (K or V exactly 0). Both dot products (double and
 * KVSIM_OPENCL_FP64=0). Without an OpenCL device every test says
 * "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

#define Q8 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}
#define Q4 {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 32}
#define Q2 {KV_STORE_QUANT, 2, 0, KV_GROUP_TOKEN, 16}
#define QA {KV_STORE_QUANT, 8, 4, KV_GROUP_TOKEN, 32}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}

typedef struct slot_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[2], v[2];
    uint32_t n_formats;
    int scores;
    uint32_t q_stride; /* 0: q as drawn; else kv_attn_problem_scale_q(stride, big, small) */
    float q_big, q_small;
} slot_case;

/* Slots per work-group: min(GQA, 8) heads x 8 / min(GQA, 8) queries. */
static const slot_case slot_cases[] = {
    {"decode, GQA 1 (1 slot: the leftover dot only), 1 token", 1, 4, 4, 128, 1, 32, {Q8}, {Q8}, 1, 1, 0, 0, 0},
    {"decode, GQA 3 (3 leftover slots), 63 tokens", 1, 6, 2, 96, 63, 32, {Q4}, {Q8}, 1, 1, 0, 0, 0},
    {"decode, GQA 4 (4 slots at once), 65 tokens", 1, 8, 2, 128, 65, 32, {Q8, QA}, {Q4, Q8}, 2, 1, 0, 0, 0},
    {"decode, GQA 8 (8 slots: 2 x 4), 4097 tokens", 1, 16, 2, 128, 4097, 32, {Q8}, {Q8}, 1, 1, 0, 0, 0},
    {"decode, GQA 12 (head batches 8 + 4), 4097 tokens, pages of 16", 1, 24, 2, 64, 4097, 16, {Q4}, {QA}, 1, 1, 0,
     0, 0},
    {"verify k=1, GQA 4, pages of 17 (tile and page remainders)", 1, 8, 2, 128, 1000, 17, {Q8}, {Q4}, 1, 1, 0, 0, 0},
    {"verify k=2, GQA 3 (6 slots: 4 + 2 leftover, across queries)", 2, 6, 2, 64, 65, 32, {Q8}, {Q8}, 1, 1, 0, 0, 0},
    {"verify k=4, GQA 4 (8 slots, 2 queries per batch), 4097 tokens", 4, 8, 2, 128, 4097, 32, {Q8}, {Q8}, 1, 1, 0, 0,
     0},
    {"verify k=7, GQA 4 (batches of 8, 8, 8, 4 slots; scores per token)", 7, 8, 2, 128, 333, 32, {Q4, BF16}, {QA, Q2},
     2, 1, 0, 0, 0},
    {"verify k=7, GQA 1 (batches of 7 queries: 4 + 3 leftover)", 7, 2, 2, 64, 129, 32, {Q8}, {Q4}, 1, 1, 0, 0, 0},
    {"decode, GQA 4, queries x 1e-30 (flat softmax)", 1, 8, 2, 128, 1000, 32, {Q8}, {Q8}, 1, 1, 1, 1e-30f, 1e-30f},
    {"decode, GQA 4, queries x 4 (peaked softmax)", 1, 8, 2, 128, 4097, 32, {Q8}, {Q4}, 1, 1, 1, 4.0f, 4.0f},
    {"verify k=4, GQA 4, queries mixed (every 3rd x 4, others x 1e-30)", 4, 8, 2, 128, 1000, 32, {Q8}, {QA}, 1, 1, 3,
     4.0f, 1e-30f},
    {"verify k=2, GQA 8, bf16 pages, queries x 4", 2, 16, 2, 128, 300, 32, {BF16}, {BF16}, 1, 1, 1, 4.0f,
     4.0f},
};
#define N_SLOT_CASES (sizeof slot_cases / sizeof slot_cases[0])

static void check_slots(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_SLOT_CASES; i++) {
        const slot_case *c = &slot_cases[i];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, c->scores, 0, 1300 + i};
        double e, es;
        kvt_attention_errors(be, ref, &spec, c->q_stride, c->q_big, c->q_small, c->name, &e, &es);
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

Test(opencl_cpu_attn2, slots_default_dot_product)
{
    check_slots(NULL);
}

Test(opencl_cpu_attn2, slots_float_float_dot_product)
{
    check_slots("0");
}

/* ---- Hand-made pages: codes on the zero point, queries out of order --------------- */

typedef struct page_case {
    const char *name;
    uint32_t n_queries, n_heads, ntok, head_dim;
    int k_zero, v_zero;  /* 1: every code of K (V) on the zero point, so the values are exactly 0 */
    uint32_t early;      /* a query (index < n_queries) placed at position `early` instead of a last token; ~0u: none */
} page_case;

static const page_case page_cases[] = {
    {"K codes all on the zero point (logits 0: uniform), int8, 65 tokens, GQA 4", 1, 4, 65, 128, 1, 0, ~0u},
    {"V codes all on the zero point (output 0), int8, 63 tokens, GQA 8", 1, 8, 63, 64, 0, 1, ~0u},
    {"both on the zero point, 4097 tokens, k=2, GQA 4", 2, 4, 4097, 32, 1, 1, ~0u},
    {"MHA k=4, query 1 at position 5 (4 slots, one sees less)", 4, 1, 100, 64, 0, 0, 1},
    {"MHA k=8, query 2 at position 0 (two batches of 4 slots)", 8, 1, 40, 32, 0, 0, 2},
};
#define N_PAGE_CASES (sizeof page_cases / sizeof page_cases[0])

/* One KV head, one page of ntok tokens, K then V, int8 token groups of 32:
   random codes, or every code 128 with zero = -128 scale (scale 2^-6, so the
   dequantised value s q + z is exactly 0). Returns the bytes of kv_data. */
static size_t make_page(const page_case *c, kv_rng *rng, uint8_t **out, kv_page_desc *pg)
{
    kv_store_format f = Q8;
    kv_quant_layout l = {c->ntok, c->head_dim, 32, KV_GROUP_TOKEN};
    size_t plane = kv_layout_packed_bytes(&l, 8), groups = kv_layout_groups(&l);
    size_t store = (plane + 3) / 4 * 4 + groups * 4, bytes = 2 * store;
    uint8_t *kv = calloc(bytes, 1);
    for (int s = 0; s < 2; s++) {
        int zero = s == 0 ? c->k_zero : c->v_zero;
        uint8_t *base = kv + s * store;
        for (size_t i = 0; i < plane; i++)
            base[i] = zero ? 128 : (uint8_t)kv_rng_u64(rng);
        uint16_t *meta = (uint16_t *)(base + (plane + 3) / 4 * 4);
        for (size_t g = 0; g < groups; g++) {
            float sc = zero ? 0.015625f : 0.00390625f * (1.0f + (float)(kv_rng_u64(rng) % 1000) / 334.0f);
            meta[g] = kv_f16_from_f32(sc);
            meta[groups + g] = kv_f16_from_f32(zero ? -128.0f * sc : -(float)(kv_rng_u64(rng) % 1000) / 1000.0f);
        }
    }
    memset(pg, 0, sizeof *pg);
    pg->ntokens = c->ntok;
    pg->key = pg->value = f;
    pg->key_meta = (plane + 3) / 4 * 4;
    pg->value_data = store;
    pg->value_meta = store + pg->key_meta;
    *out = kv;
    return bytes;
}

static void check_pages(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_PAGE_CASES; i++) {
        const page_case *c = &page_cases[i];
        kv_rng rng;
        kv_rng_seed(&rng, 1400 + i);
        uint8_t *kv = NULL;
        kv_page_desc pg;
        size_t kv_bytes = make_page(c, &rng, &kv, &pg);
        size_t nq = (size_t)c->n_queries * c->n_heads * c->head_dim;
        float *q = malloc(nq * 4), *o1 = malloc(nq * 4), *o2 = malloc(nq * 4);
        kv_fixture_normal(q, nq, 1450 + i);
        for (size_t j = 0; j < nq; j++)
            q[j] *= 4.0f;
        uint32_t *pos = malloc(c->ntok * 4), qpos[8];
        for (uint32_t t = 0; t < c->ntok; t++)
            pos[t] = t;
        for (uint32_t j = 0; j < c->n_queries; j++)
            qpos[j] = c->ntok - c->n_queries + j;
        if (c->early != ~0u)
            qpos[c->early] = c->early == 1 ? 5 : 0;
        kvt_attention_page(be, c->name, c->n_queries, c->n_heads, c->head_dim, c->ntok, kv, kv_bytes, &pg, q, qpos, pos,
                           o1);
        kvt_attention_page(ref, c->name, c->n_queries, c->n_heads, c->head_dim, c->ntok, kv, kv_bytes, &pg, q, qpos, pos,
                           o2);
        double e = kv_attn_rel_error(o1, o2, (size_t)c->n_queries * c->n_heads, c->head_dim);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        if (c->v_zero) { /* the output is exactly 0 */
            size_t bad = 0;
            while (bad < nq && o1[bad] == 0.0f)
                bad++;
            cr_expect(bad == nq, "fp64 %s, %s: out[%zu] = %g, want 0", fp64 ? fp64 : "default", c->name, bad,
                      bad < nq ? (double)o1[bad] : 0.0);
        }
        free(q), free(o1), free(o2), free(pos), free(kv);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_attn2, hand_made_pages_default_dot_product)
{
    check_pages(NULL);
}

Test(opencl_cpu_attn2, hand_made_pages_float_float_dot_product)
{
    check_pages("0");
}
