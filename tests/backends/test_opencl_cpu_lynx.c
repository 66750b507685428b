/* test_opencl_cpu_lynx.c — the OpenCL CPU-device (PoCL) encode and pack of TOKEN groups
 * (kernels_cpu_codec.cl: kv_cpu_encode_groups, kv_cpu_pack_group and their stream writer
 * kv_cpu_put16, whose widths other than 1, 2, 4, 8 and 16, and every short chunk, go through
 * the vector packer kv_cpu_halves16) against the CPU reference, bit for bit: every width
 * 1..16 with anchors 0, 1, w/2 and w-1 where valid, groups of 16, 32, 48 and 128 values,
 * rows that are not a multiple of 16 (short last groups, short last 16-value chunks), group
 * counts that are not a multiple of the 16 groups of a work-item, and inputs with rounding
 * ties, NaN-free extremes (±FLT_MAX, ±Inf, ±65504, fp32 subnormals, ±0) and constant
 * groups. Every output starts as 0xa5, so a byte a kernel forgets (or a byte past a stream
 * it writes) shows. Without an OpenCL device each test says "skipped: opencl: ..." and is
 * reported as skipped. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

/* rows x cols in token groups of G: short last groups of 4, 8, 20 and 44 values, a row
   shorter than its group (90 of 128), whole 128-value groups, and group counts of 7x7,
   37x7, 5x4, 9x3 and 17x1 (none a multiple of 16). */
static const kv_quant_layout shapes[] = {
    {7, 100, 16, KV_GROUP_TOKEN}, {37, 200, 32, KV_GROUP_TOKEN}, {5, 164, 48, KV_GROUP_TOKEN},
    {9, 300, 128, KV_GROUP_TOKEN}, {17, 128, 128, KV_GROUP_TOKEN}, {3, 90, 128, KV_GROUP_TOKEN},
    {11, 47, 48, KV_GROUP_TOKEN}, {21, 64, 32, KV_GROUP_TOKEN},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* n values for b-bit codes, group by group (G values; the layout's groups are runs of G in
   a row, so whole rows of cols values are filled group by group): groups of exact ties
   (values k + 1/2 on a span [0, 2^b - 1] whose scale is 1 in fp16 for b <= 11), constant
   groups, groups with extremes and normal(0, 2) values, with a few fp32 subnormals. */
static void lynx_values(kv_rng *rng, float *x, const kv_quant_layout *l, unsigned bits)
{
    static const float extremes[] = {FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, 65504.0f, -65504.0f,
                                     65520.0f, 1e-40f, -1e-40f, 0.0f, -0.0f, 1e30f};
    float maxq = (float)((1u << bits) - 1u);
    for (uint32_t r = 0; r < l->rows; r++) {
        for (uint32_t c0 = 0; c0 < l->cols; c0 += l->group_size) {
            uint32_t n = l->cols - c0 < l->group_size ? l->cols - c0 : l->group_size;
            float *g = x + (size_t)r * l->cols + c0;
            uint64_t kind = kv_rng_below(rng, 4);
            for (uint32_t j = 0; j < n; j++) {
                if (kind == 0) { /* ties: 0 and maxq pin the span, the rest sit on k + 1/2 */
                    g[j] = j == 0 ? 0.0f : j == 1 ? maxq : (float)kv_rng_below(rng, (uint64_t)maxq) + 0.5f;
                } else if (kind == 1) { /* constant */
                    g[j] = j == 0 ? (float)(kv_rng_normal(rng) * 3.0) : g[0];
                } else if (kind == 2) { /* extremes among ordinary values */
                    uint64_t k = kv_rng_below(rng, 24);
                    g[j] = k < 12 ? extremes[k] : (float)(kv_rng_normal(rng) * 2.0);
                } else {
                    g[j] = (float)(kv_rng_normal(rng) * 2.0);
                    if (kv_rng_below(rng, 9) == 0)
                        g[j] = (float)(kv_rng_normal(rng) * 1e-40);
                }
            }
        }
    }
}

/* Bytes past each output plane, also 0xa5 and compared: a stream's last chunk
   written too long shows there (inside the plane the next group overwrites it). */
#define TAIL 64

/* The bytes of one backend buffer, read back. */
typedef struct plane {
    unsigned char *p;
    size_t bytes;
} plane;

/* Encode of x (b bits, anchor a) on be; outputs anchor, residual, scale, zero (each with
   TAIL bytes more), from 0xa5. */
static void run_encode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned a, const float *x,
                       plane out[4])
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    size_t pa = kv_layout_packed_bytes(l, a ? a : bits), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
    kv_buffer *bx = kvt_put(be, x, n * 4), *ba = kvt_fill(be, pa + TAIL, 0xa5), *br = kvt_fill(be, pr + TAIL, 0xa5);
    kv_buffer *bs = kvt_fill(be, groups * 2 + TAIL, 0xa5), *bz = kvt_fill(be, groups * 2 + TAIL, 0xa5);
    kv_error err = {0};
    kv_encode_args e = {*l, bits, a, {bx, 0}, {ba, 0}, a ? (kv_bref){br, 0} : (kv_bref){NULL, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    out[0] = (plane){kvt_get(be, ba, pa + TAIL), pa + TAIL};
    out[1] = (plane){kvt_get(be, br, pr + TAIL), pr + TAIL};
    out[2] = (plane){kvt_get(be, bs, groups * 2 + TAIL), groups * 2 + TAIL};
    out[3] = (plane){kvt_get(be, bz, groups * 2 + TAIL), groups * 2 + TAIL};
    kv_buffer_free(be, bx), kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
}

/* Pack of codes (b bits; bits above b set at random) on be, into 0xa5 (TAIL bytes more). */
static void run_pack(kv_backend *be, const kv_quant_layout *l, unsigned bits, const uint16_t *codes, plane *out)
{
    size_t n = (size_t)l->rows * l->cols, pb = kv_layout_packed_bytes(l, bits);
    kv_buffer *bc = kvt_put(be, codes, n * 2), *bp = kvt_fill(be, pb + TAIL, 0xa5);
    kv_error err = {0};
    kv_pack_args p = {*l, bits, {bc, 0}, {bp, 0}};
    cr_assert_eq(kv_backend_pack(be, &p, &err), KV_OK, "%s", err.msg);
    *out = (plane){kvt_get(be, bp, pb + TAIL), pb + TAIL};
    kv_buffer_free(be, bc), kv_buffer_free(be, bp);
}

/* 1 when the planes are equal; else one message naming the case and the byte. */
static int same(const char *what, const char *name, const kv_quant_layout *l, unsigned bits, unsigned a, plane got,
                plane want)
{
    cr_assert_eq(got.bytes, want.bytes);
    long d = kvt_first_diff(got.p, want.p, got.bytes);
    if (d >= 0)
        cr_expect(0, "%s %ux%u G %u, b %u a %u: %s byte %ld of %zu differs (0x%02x, want 0x%02x)", what, l->rows,
                  l->cols, l->group_size, bits, a, name, d, got.bytes, got.p[d], want.p[d]);
    free(got.p), free(want.p);
    return d < 0;
}

/* The anchors of a b-bit code: 0, 1, b/2, b-1 where 0 < a < b, each once; returns the count. */
static int anchors_of(unsigned bits, unsigned out[4])
{
    const unsigned cand[4] = {0, 1, bits / 2, bits - 1};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        unsigned a = cand[i];
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= out[j] == a;
        if (!dup && (a == 0 || a < bits))
            out[n++] = a;
    }
    return n;
}

Test(opencl_cpu_lynx, encode_every_width_and_anchor_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    static const char *const names[4] = {"anchor", "residual", "scale", "zero"};
    kv_rng rng;
    kv_rng_seed(&rng, 2210);
    size_t checked = 0, failed = 0;
    for (size_t s = 0; s < N_SHAPES; s++) {
        const kv_quant_layout *l = &shapes[s];
        float *x = malloc((size_t)l->rows * l->cols * 4);
        cr_assert(x);
        for (unsigned bits = 1; bits <= 16; bits++) {
            lynx_values(&rng, x, l, bits);
            unsigned an[4];
            int na = anchors_of(bits, an);
            for (int k = 0; k < na; k++) {
                plane o1[4], o2[4];
                run_encode(be, l, bits, an[k], x, o1);
                run_encode(ref, l, bits, an[k], x, o2);
                int ok = 1;
                for (int p = 0; p < 4; p++)
                    ok &= same("encode", names[p], l, bits, an[k], o1[p], o2[p]);
                failed += !ok;
                checked++;
            }
        }
        free(x);
    }
    /* 16 widths: 1 case for b 1, 2 for b 2, 3 for b 3, then 4 each */
    cr_assert_eq(checked, N_SHAPES * (1 + 2 + 3 + 13 * 4), "only %zu cases ran", checked);
    cr_assert_eq(failed, 0, "%zu of %zu encode cases differ", failed, checked);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_lynx, pack_every_width_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    kv_rng rng;
    kv_rng_seed(&rng, 2211);
    size_t checked = 0, failed = 0;
    for (size_t s = 0; s < N_SHAPES; s++) {
        const kv_quant_layout *l = &shapes[s];
        size_t n = (size_t)l->rows * l->cols;
        uint16_t *codes = malloc(n * 2);
        cr_assert(codes);
        for (unsigned bits = 1; bits <= 16; bits++) {
            for (size_t i = 0; i < n; i++) /* all ones, all zeros, then random bits (above b too) */
                codes[i] = i % 97 < 16 ? 0xffff : i % 97 < 32 ? 0 : (uint16_t)kv_rng_below(&rng, 65536);
            plane o1, o2;
            run_pack(be, l, bits, codes, &o1);
            run_pack(ref, l, bits, codes, &o2);
            failed += !same("pack", "packed", l, bits, 0, o1, o2);
            checked++;
        }
        free(codes);
    }
    cr_assert_eq(checked, N_SHAPES * 16);
    cr_assert_eq(failed, 0, "%zu of %zu pack cases differ", failed, checked);
    kv_backend_close(be);
    kv_backend_close(ref);
}
