/* test_opencl_cpu_kivi.c — the OpenCL CPU-device attention (kernels_cpu_attention.cl,
 * KV_CPU_ATTENTION) on KIVI's channel-grouped K pages, which session 10 reads 16
 * tokens of one channel at a time (kv_cpu_rd fast 4: kv_cpu_ch_tile and
 * kv_cpu_ch_logits, 2-, 4- and 8-bit planes, anchor-only included), against the
 * CPU reference within the conformance tolerance (relative 1e-5): contexts of
 * 1, 15, 16, 17, 31, 33, 63, 65 and 4097 tokens (partial tiles, which keep the
 * scalar reader, next to full ones), group sizes 16, 32, 64 and 128 (tiles at
 * every place in a block; short last blocks), pages of one to three blocks,
 * residual windows of 0 tokens, 1 (an f32 page of one token after the
 * quantized one) and the full context (f32 only), GQA 1, 4 and 8, verification
 * k = 1, 2, 4 and 7 (1 to 8 slots: the 4-slot dots and the slots left over),
 * queries normal, x4, x1e-30 and mixed (every 5th x4, the rest x1e-40), the
 * scores of every other case (kv_cpu_scores_page reads channel tiles too when
 * GQA x k <= 8, with doubles; else the per-token path), and hand-made pages whose codes are all equal (per-block, per-channel metadata).
 * Both dot products (double and KVSIM_OPENCL_FP64=0). Without an OpenCL device
 * every test says "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

#define F32 {KV_STORE_F32, 0, 0, 0, 0}
#define QT(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_TOKEN, g}
#define QC(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_CHANNEL, g}
#define QCA(bits, a, g) {KV_STORE_QUANT, bits, a, KV_GROUP_CHANNEL, g}

/* K plane widths the channel tile reads: 2, 4, 8 bits, and anchor-only planes of 4 and 2 bits. */
typedef struct kform {
    const char *name;
    uint8_t bits, anchor;
} kform;

static const kform kforms[] = {{"kivi2", 2, 0}, {"kivi4", 4, 0}, {"kivi8", 8, 0}, {"anchor-only b8/a4", 8, 4},
                               {"anchor-only b5/a2", 5, 2}};
#define N_KFORMS (sizeof kforms / sizeof kforms[0])

static const struct {
    const char *name;
    uint32_t stride;
    float big, small;
} qmodes[] = {{"normal", 0, 1, 1}, {"x4", 1, 4, 1}, {"x1e-30", 1, 1e-30f, 1}, {"mixed", 5, 4, 1e-40f}};
#define N_QMODES (sizeof qmodes / sizeof qmodes[0])

static void check_sweep(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    static const uint32_t ctxs[] = {1, 15, 16, 17, 31, 33, 63, 65, 4097}, gs[] = {16, 32, 64, 128};
    static const uint32_t ks[] = {1, 2, 4, 7}, gqa[] = {1, 4, 8};
    static const kv_store_format all_f32[2] = {F32, F32};
    int checked = 0, windows[3] = {0}, modes[N_QMODES] = {0}, forms[N_KFORMS] = {0}, slots[9] = {0}, scored = 0;
    for (size_t xi = 0; xi < sizeof ctxs / sizeof ctxs[0]; xi++)
        for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                uint32_t T = ctxs[xi], G = gs[gi], k = ks[ki];
                if (k > T || (T == 4097 && k == 7))
                    continue;
                size_t idx = xi + gi + ki, wi = idx % 3, fi = (idx + xi) % N_KFORMS, hi = (xi + 2 * ki + 2 * gi) % 3;
                size_t qi = (xi + gi + 2 * ki) % N_QMODES;
                if (T == 4097 && gqa[hi] == 8 && k > 2)
                    hi = 1; /* keeps the long context cheap on the reference */
                kv_store_format kf[2] = {QCA(kforms[fi].bits, kforms[fi].anchor, G), F32};
                kv_store_format vf[2] = {QT(4, 32), F32};
                /* window 0: pages of 1-3 blocks, all quantized; 1: a quantized page of T - 1 tokens then an
                   f32 page of one (T > 1); full: every page f32 */
                int scores = (xi + ki) % 2 == 0;
                kv_attn_spec spec = {k, 2 * gqa[hi], 2, 128, T, G * (uint32_t)(1 + idx % 3), kf, vf, 1, scores, 0,
                                     3100 + 131 * xi + 17 * gi + ki};
                if (wi == 1 && T > 1)
                    spec.page_tokens = T - 1, spec.n_formats = 2;
                else if (wi == 2)
                    spec.key_formats = spec.value_formats = all_f32;
                int win = wi == 1 && T > 1 ? 1 : (int)wi;
                double e, es;
                char label[200];
                snprintf(label, sizeof label, "fp64 %s, %s g%u, %u tokens, residual window %s, k = %u, GQA %u, %s q",
                         fp64 ? fp64 : "default", kforms[fi].name, G, T, win == 0 ? "0" : win == 1 ? "1" : "full", k,
                         gqa[hi], qmodes[qi].name);
                kvt_attention_errors(be, ref, &spec, qmodes[qi].stride, qmodes[qi].big, qmodes[qi].small, label, &e,
                                     &es);
                cr_expect(e <= 1e-5, "%s: attention differs from the reference by %.3g relative", label, e);
                if (scores)
                    cr_expect(es <= 1e-5, "%s: scores differ from the reference by %.3g relative", label, es);
                if (scores && win != 2 && gqa[hi] * k <= 8 && T >= 16)
                    scored++; /* scored 16 tokens at a time from channel tiles (with doubles) */
                uint32_t hb = gqa[hi] < 8 ? gqa[hi] : 8, nr = (k < 8 / hb ? k : 8 / hb) * hb;
                windows[win]++, modes[qi]++, checked++;
                if (win != 2)
                    forms[fi]++, slots[nr]++;
            }
    cr_assert_gt(checked, 100, "%d cases", checked);
    cr_assert_gt(scored, 15, "%d cases scored from channel tiles", scored);
    for (int i = 0; i < 3; i++)
        cr_assert_gt(windows[i], 20, "residual window case %d ran %d times", i, windows[i]);
    for (size_t i = 0; i < N_QMODES; i++)
        cr_assert_gt(modes[i], 15, "query mode %s ran %d times", qmodes[i].name, modes[i]);
    for (size_t i = 0; i < N_KFORMS; i++)
        cr_assert_gt(forms[i], 5, "K format %s ran %d times on quantized pages", kforms[i].name, forms[i]);
    static const uint32_t nrs[] = {1, 2, 4, 7, 8}; /* slots of a batch: 1-slot dots, 4-slot, 4 + 3 */
    for (size_t i = 0; i < sizeof nrs / sizeof nrs[0]; i++)
        cr_assert_gt(slots[nrs[i]], 2, "batches of %u slots ran %d times", nrs[i], slots[nrs[i]]);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_kivi, channel_k_sweep_default_dot_product, .timeout = 600)
{
    check_sweep(NULL);
}

Test(opencl_cpu_kivi, channel_k_sweep_float_float_dot_product, .timeout = 600)
{
    check_sweep("0");
}

/* ---- Hand-made pages: every K code equal ------------------------------------------- */

typedef struct eq_case {
    const char *name;
    uint32_t n_queries, n_heads, ntok, head_dim, group_size;
    uint8_t bits, anchor;
    uint32_t code; /* every K code */
} eq_case;

static const eq_case eq_cases[] = {
    {"kivi2 g32, code 1, 65 tokens, GQA 4", 1, 4, 65, 128, 32, 2, 0, 1},
    {"kivi2 g16, code 3, 4097 tokens, k=2, GQA 4", 2, 4, 4097, 64, 16, 2, 0, 3},
    {"kivi4 g64, code 9, 100 tokens, k=4, GQA 1", 4, 1, 100, 128, 64, 4, 0, 9},
    {"kivi8 g128, code 200, 300 tokens, GQA 8", 1, 8, 300, 128, 128, 8, 0, 200},
    {"anchor-only b8/a4 g32, anchor 7, 64 tokens, k=7, GQA 1", 7, 1, 64, 32, 32, 8, 4, 7},
};
#define N_EQ_CASES (sizeof eq_cases / sizeof eq_cases[0])

/* One KV head, one page of ntok tokens: K channel groups whose codes are all
   c->code, with a scale and zero drawn per (block, channel), so that K is
   constant within a block and differs between blocks; V int8 token groups of
   32, random. Returns the bytes of kv_data. */
static size_t eq_page(const eq_case *c, kv_rng *rng, uint8_t **out, kv_page_desc *pg)
{
    kv_store_format kf = QCA(c->bits, c->anchor, c->group_size), vf = QT(8, 32);
    kv_quant_layout kl = {c->ntok, c->head_dim, c->group_size, KV_GROUP_CHANNEL};
    kv_quant_layout vl = {c->ntok, c->head_dim, 32, KV_GROUP_TOKEN};
    unsigned pb = c->anchor ? c->anchor : c->bits;
    size_t kplane = kv_layout_packed_bytes(&kl, pb), kgroups = kv_layout_groups(&kl);
    size_t vplane = kv_layout_packed_bytes(&vl, 8), vgroups = kv_layout_groups(&vl);
    size_t kmeta = (kplane + 3) / 4 * 4, vdata = kmeta + kgroups * 4, vmeta = vdata + (vplane + 3) / 4 * 4;
    size_t bytes = vmeta + vgroups * 4;
    uint8_t *kv = calloc(bytes, 1);
    cr_assert(kv);
    /* every code equal: the byte that repeats it (2 bits: 4 per byte, 4 bits: 2, 8 bits: 1) */
    uint8_t byte = pb == 2 ? (uint8_t)(c->code * 0x55u) : pb == 4 ? (uint8_t)(c->code * 0x11u) : (uint8_t)c->code;
    memset(kv, byte, kplane);
    /* each stream's unused high bits stay 0: the short last block's streams of ntok % G codes */
    uint32_t last = c->ntok % c->group_size;
    if (last && (last * pb) % 8) {
        size_t first = (size_t)(c->ntok / c->group_size) * c->head_dim;
        for (uint32_t d = 0; d < c->head_dim; d++) {
            size_t off = kv_layout_group_offset(&kl, pb, first + d), sb = (last * pb + 7) / 8;
            kv[off + sb - 1] &= (uint8_t)((1u << ((last * pb) % 8)) - 1u);
        }
    }
    uint16_t *km = (uint16_t *)(kv + kmeta), *vm = (uint16_t *)(kv + vmeta);
    for (size_t g = 0; g < kgroups; g++) {
        km[g] = kv_f16_from_f32(0.015625f * (1.0f + (float)(kv_rng_u64(rng) % 1000) / 250.0f));
        km[kgroups + g] = kv_f16_from_f32(-(float)(kv_rng_u64(rng) % 1000) / 500.0f);
    }
    for (size_t i = 0; i < vplane; i++)
        kv[vdata + i] = (uint8_t)kv_rng_u64(rng);
    for (size_t g = 0; g < vgroups; g++) {
        vm[g] = kv_f16_from_f32(0.00390625f * (1.0f + (float)(kv_rng_u64(rng) % 1000) / 334.0f));
        vm[vgroups + g] = kv_f16_from_f32(-(float)(kv_rng_u64(rng) % 1000) / 1000.0f);
    }
    memset(pg, 0, sizeof *pg);
    pg->ntokens = c->ntok;
    pg->key = kf;
    pg->value = vf;
    pg->key_meta = kmeta;
    pg->value_data = vdata;
    pg->value_meta = vmeta;
    *out = kv;
    return bytes;
}

static void check_equal_codes(const char *fp64)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_FP64", fp64), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_EQ_CASES; i++) {
        const eq_case *c = &eq_cases[i];
        kv_rng rng;
        kv_rng_seed(&rng, 3700 + i);
        uint8_t *kv = NULL;
        kv_page_desc pg;
        size_t kv_bytes = eq_page(c, &rng, &kv, &pg);
        double e = kvt_page_error(be, ref, c->name, c->n_queries, c->n_heads, c->head_dim, c->ntok, kv, kv_bytes, &pg,
                                  3750 + i, 4.0f, NULL);
        cr_expect(e <= 1e-5, "fp64 %s, %s: attention differs from the reference by %.3g relative",
                  fp64 ? fp64 : "default", c->name, e);
        free(kv);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_kivi, equal_codes_default_dot_product)
{
    check_equal_codes(NULL);
}

Test(opencl_cpu_kivi, equal_codes_float_float_dot_product)
{
    check_equal_codes("0");
}
