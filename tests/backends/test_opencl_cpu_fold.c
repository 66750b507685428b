/* test_opencl_cpu_fold.c — the OpenCL CPU-device attention paths of #22's session 10
 * (kernels_cpu_attention.cl, KV_CPU_ATTENTION) against the CPU reference within the
 * conformance tolerance (relative 1e-5): the token-group row reader kv_cpu_row_tg (8-bit
 * codes in one pass; 4-bit codes two chunks per 16-byte load and 2-bit codes four, with
 * the odd last chunks on short loads) for 2-, 4- and 8-bit groups of 16, 32, 64 and 128
 * values, head_dim 48, 80, 112 and 128 (every remainder of chunks per load, a short last
 * group); and the V update of two rows at once when every slot sees both (odd token
 * counts leave a single row; verification's last tokens are seen by some queries only).
 * Tokens 1, 15, 17, 63, 65, 4097; GQA 1, 4, 8; verification k = 1, 2, 4; queries x1e-30,
 * x4 and mixed; diffkv (K8/K4, V4/V2 pages alternating) and lynx anchor-only pages;
 * hand-made pages whose codes are all equal or sit next to the zero point (the values
 * cancel to a few scales). Both dot products (double and KVSIM_OPENCL_FP64=0). Without
 * an OpenCL device every test says "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

#define QT(b, g) {KV_STORE_QUANT, b, 0, KV_GROUP_TOKEN, g}
#define QA(b, a, g) {KV_STORE_QUANT, b, a, KV_GROUP_TOKEN, g}

typedef struct fold_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[2], v[2];
    uint32_t n_formats;
    uint32_t q_stride; /* 0: q as drawn; else kv_attn_problem_scale_q(stride, big, small) */
    float q_big, q_small;
} fold_case;

static const fold_case fold_cases[] = {
    {"8-bit g16, hd 48, GQA 4, 65 tokens", 1, 8, 2, 48, 65, 32, {QT(8, 16)}, {QT(8, 16)}, 1, 0, 0, 0},
    {"8-bit g128, hd 128, GQA 8, 4097 tokens", 1, 16, 2, 128, 4097, 32, {QT(8, 128)}, {QT(8, 128)}, 1, 0, 0, 0},
    {"4-bit g16, hd 80 (odd last chunk), GQA 4, 63 tokens", 1, 8, 2, 80, 63, 32, {QT(4, 16)}, {QT(4, 16)}, 1, 0, 0,
     0},
    {"4-bit g32, hd 128, GQA 1, 1 token", 1, 2, 2, 128, 1, 32, {QT(4, 32)}, {QT(4, 32)}, 1, 0, 0, 0},
    {"4-bit g64, hd 80 (short last group), GQA 4, 15 tokens", 1, 8, 2, 80, 15, 16, {QT(4, 64)}, {QT(4, 64)}, 1, 0,
     0, 0},
    {"4-bit g128, hd 128, GQA 8, 4097 tokens", 1, 16, 2, 128, 4097, 32, {QT(4, 128)}, {QT(4, 128)}, 1, 0, 0, 0},
    {"2-bit g16, hd 112 (3 chunks after the last 4), GQA 4, 17 tokens", 1, 8, 2, 112, 17, 16, {QT(2, 16)},
     {QT(2, 16)}, 1, 0, 0, 0},
    {"2-bit g32, hd 80 (1 chunk after 4), GQA 1, 65 tokens", 1, 2, 2, 80, 65, 32, {QT(2, 32)}, {QT(2, 32)}, 1, 0, 0,
     0},
    {"2-bit g64, hd 128, GQA 4, 4097 tokens", 1, 8, 2, 128, 4097, 32, {QT(2, 64)}, {QT(2, 64)}, 1, 0, 0, 0},
    {"2-bit g128, hd 128, GQA 8, 63 tokens", 1, 16, 2, 128, 63, 32, {QT(2, 128)}, {QT(2, 128)}, 1, 0, 0, 0},
    {"mixed widths K 4/8 V 2/4, hd 48, GQA 4, 65 tokens", 1, 8, 2, 48, 65, 16, {QT(4, 16), QT(8, 48)},
     {QT(2, 16), QT(4, 48)}, 2, 0, 0, 0},
    {"verify k=1, 4-bit g32, GQA 4, 4097 tokens", 1, 8, 2, 128, 4097, 32, {QT(4, 32)}, {QT(4, 32)}, 1, 0, 0, 0},
    {"verify k=2, 2-bit g16, GQA 4, 65 tokens", 2, 8, 2, 80, 65, 32, {QT(2, 16)}, {QT(2, 16)}, 1, 0, 0, 0},
    {"verify k=4, 4-bit g64, GQA 4, 4097 tokens", 4, 8, 2, 128, 4097, 32, {QT(4, 64)}, {QT(8, 32)}, 1, 0, 0, 0},
    {"verify k=4, 8-bit g32, GQA 1, 17 tokens", 4, 2, 2, 64, 17, 16, {QT(8, 32)}, {QT(2, 32)}, 1, 0, 0, 0},
    {"decode 4-bit g32, queries x 1e-30", 1, 8, 2, 128, 1000, 32, {QT(4, 32)}, {QT(4, 32)}, 1, 1, 1e-30f, 1e-30f},
    {"decode 2-bit g32, queries x 4", 1, 8, 2, 112, 4097, 32, {QT(2, 32)}, {QT(2, 32)}, 1, 1, 4.0f, 4.0f},
    {"verify k=2 8-bit g16, queries mixed (every 3rd x 4, others x 1e-30)", 2, 8, 2, 80, 1000, 32, {QT(8, 16)},
     {QT(4, 16)}, 1, 3, 4.0f, 1e-30f},
    {"diffkv K8V4/K4V2 pages, GQA 4, 4097 tokens", 1, 8, 2, 128, 4097, 32, {QT(8, 32), QT(4, 32)},
     {QT(4, 32), QT(2, 32)}, 2, 0, 0, 0},
    {"lynx anchor-only b8/a4 g32, GQA 4, 65 tokens", 1, 8, 2, 128, 65, 32, {QA(8, 4, 32)}, {QA(8, 4, 32)}, 1, 0, 0,
     0},
    {"lynx anchor-only b8/a2 g16, hd 80, verify k=2, 63 tokens", 2, 8, 2, 80, 63, 16, {QA(8, 2, 16)},
     {QA(8, 2, 16)}, 1, 1, 4.0f, 4.0f},
};
#define N_FOLD_CASES (sizeof fold_cases / sizeof fold_cases[0])

static void check_fold(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_FOLD_CASES; i++) {
        const fold_case *c = &fold_cases[i];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, 0, 0, 1600 + i};
        double e, es;
        kvt_attention_errors(be, ref, &spec, c->q_stride, c->q_big, c->q_small, c->name, &e, &es);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_fold, token_groups_default_dot_product)
{
    check_fold(NULL);
}

Test(opencl_cpu_fold, token_groups_float_float_dot_product)
{
    check_fold("0");
}

/* ---- Hand-made pages: codes all equal, codes next to the zero point ----------------- */

typedef struct code_case {
    const char *name;
    unsigned bits, group;
    uint32_t n_queries, n_heads, ntok, head_dim;
    int near_zero; /* 1: codes zp - 1, zp, zp + 1 at random, zero -(zp + 0.375) s; 0: every code 2^bits - 2 */
} code_case;

static const code_case code_cases[] = {
    {"2-bit g16 codes next to the zero point, 65 tokens, GQA 4", 2, 16, 1, 4, 65, 112, 1},
    {"2-bit g64 codes all equal, 4097 tokens, k=2", 2, 64, 2, 4, 4097, 128, 0},
    {"4-bit g32 codes next to the zero point, 4097 tokens, GQA 8", 4, 32, 1, 8, 4097, 80, 1},
    {"4-bit g128 codes all equal, 63 tokens, k=4", 4, 128, 4, 4, 63, 128, 0},
    {"8-bit g16 codes next to the zero point, 17 tokens, k=2", 8, 16, 2, 4, 17, 48, 1},
    {"8-bit g64 codes all equal, 65 tokens, GQA 1", 8, 64, 1, 1, 65, 128, 0},
    {"4-bit g16 codes next to the zero point, 15 tokens, MHA k=4", 4, 16, 4, 1, 15, 80, 1},
};
#define N_CODE_CASES (sizeof code_cases / sizeof code_cases[0])

/* One KV head, one page of ntok tokens, K then V, token groups of c->group at c->bits,
   codes packed low bits first. Returns the bytes of kv_data. */
static size_t make_code_page(const code_case *c, kv_rng *rng, uint8_t **out, kv_page_desc *pg)
{
    kv_store_format f = QT(c->bits, c->group);
    kv_quant_layout l = {c->ntok, c->head_dim, c->group, KV_GROUP_TOKEN};
    size_t plane = kv_layout_packed_bytes(&l, c->bits), groups = kv_layout_groups(&l);
    size_t meta_at = (plane + 3) / 4 * 4, store = meta_at + groups * 4, bytes = 2 * store;
    size_t n = (size_t)c->ntok * c->head_dim;
    unsigned zp = 1u << (c->bits - 1), top = (1u << c->bits) - 1;
    uint8_t *kv = calloc(bytes, 1);
    cr_assert(kv);
    for (int s = 0; s < 2; s++) {
        uint8_t *base = kv + s * store;
        for (size_t i = 0; i < n; i++) {
            unsigned code = c->near_zero ? zp - 1 + (unsigned)(kv_rng_u64(rng) % 3) : top - 1;
            size_t bit = i * c->bits;
            base[bit / 8] |= (uint8_t)(code << (bit % 8));
        }
        uint16_t *meta = (uint16_t *)(base + meta_at);
        for (size_t g = 0; g < groups; g++) {
            float sc = 0.0078125f * (1.0f + (float)(kv_rng_u64(rng) % 1000) / 250.0f);
            float z = c->near_zero ? -((float)zp + 0.375f) * sc : (float)(kv_rng_u64(rng) % 2001) / 1000.0f - 1.0f;
            meta[g] = kv_f16_from_f32(sc);
            meta[groups + g] = kv_f16_from_f32(z);
        }
    }
    memset(pg, 0, sizeof *pg);
    pg->ntokens = c->ntok;
    pg->key = pg->value = f;
    pg->key_meta = meta_at;
    pg->value_data = store;
    pg->value_meta = store + meta_at;
    *out = kv;
    return bytes;
}

static void check_codes(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_CODE_CASES; i++) {
        const code_case *c = &code_cases[i];
        kv_rng rng;
        kv_rng_seed(&rng, 1700 + i);
        uint8_t *kv = NULL;
        kv_page_desc pg;
        size_t kv_bytes = make_code_page(c, &rng, &kv, &pg);
        double e = kvt_page_error(be, ref, c->name, c->n_queries, c->n_heads, c->head_dim, c->ntok, kv, kv_bytes, &pg,
                                  1750 + i, 4.0f, NULL);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        free(kv);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_fold, hand_made_codes_default_dot_product)
{
    check_codes(NULL);
}

Test(opencl_cpu_fold, hand_made_codes_float_float_dot_product)
{
    check_codes("0");
}
