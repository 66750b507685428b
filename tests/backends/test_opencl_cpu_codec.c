/* test_opencl_cpu_codec.c — the OpenCL codec kernels' CPU-device shapes
 * (kernels.cl, KV_CPU_CODEC: one work-item per TOKEN group, 16 values at a
 * time: kv_cpu_decode_group, _dequantize_group, _pack_group, _unpack_group,
 * _quantize_group) against the CPU reference, bit for bit: odd group counts
 * and lengths (1, 5, 15, 17, 20, 37, 48, 100 values; rows not a multiple of
 * 16; groups longer than a row), every width 1..16 with no anchor, a 1-bit
 * anchor and a half split, decode with and without the residual plane.
 * Inputs are random bytes: packed planes with garbage in the unused bits of a
 * stream's last byte, codes with bits set above their width, fp16 metadata
 * of every class (NaN, ±Inf, −0, subnormals); quantize sees NaN, ±Inf, ±0,
 * fp16 overflow, subnormals and constant runs. Every output buffer starts
 * filled with 0xa5, so a byte a kernel forgets to write shows. Without an
 * OpenCL device every test says "skipped: opencl: ..." and is reported as
 * skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

/* rows x cols in token groups of G: one value, groups of 1 and 5, of 15 and
   17 (one short and one long 16-value chunk), a short last group in every
   row, G > cols, odd group counts; and one CHANNEL layout (the per-element
   kernels, which the CPU shape leaves alone). */
static const kv_quant_layout shapes[] = {
    {1, 1, 1, KV_GROUP_TOKEN},      {3, 5, 1, KV_GROUP_TOKEN},     {7, 15, 15, KV_GROUP_TOKEN},
    {5, 16, 16, KV_GROUP_TOKEN},    {9, 17, 16, KV_GROUP_TOKEN},   {11, 100, 32, KV_GROUP_TOKEN},
    {13, 60, 20, KV_GROUP_TOKEN},   {3, 111, 37, KV_GROUP_TOKEN},  {17, 96, 48, KV_GROUP_TOKEN},
    {6, 72, 128, KV_GROUP_TOKEN},   {33, 128, 32, KV_GROUP_TOKEN}, {2, 257, 64, KV_GROUP_TOKEN},
    {5, 7, 5, KV_GROUP_TOKEN},      {37, 40, 16, KV_GROUP_CHANNEL},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void random_bytes(kv_rng *rng, void *p, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)kv_rng_below(rng, 256);
}

/* fp16 metadata with every class mixed in: mostly moderate normals, then
   NaN, ±Inf, ±0, subnormals, the largest finite and arbitrary bits. */
static void random_meta(kv_rng *rng, uint16_t *m, size_t n)
{
    static const uint16_t special[] = {0x7e00, 0xfc00, 0x7c00, 0x8000, 0x0000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x7d01};
    for (size_t i = 0; i < n; i++) {
        uint64_t k = kv_rng_below(rng, 40);
        if (k < sizeof special / sizeof special[0])
            m[i] = special[k];
        else if (k < 20)
            m[i] = (uint16_t)kv_rng_below(rng, 65536);
        else
            m[i] = (uint16_t)(0x2000 + kv_rng_below(rng, 0x2800) + (kv_rng_below(rng, 2) << 15));
    }
}

/* Inputs of one shape: x (floats), codes (u16), two planes, scale and zero. */
typedef struct inputs {
    float *x;
    uint16_t *codes, *scale, *zero;
    unsigned char *anchor, *residual;
} inputs;

static inputs make_inputs(kv_rng *rng, const kv_quant_layout *l)
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l), pmax = kv_layout_packed_bytes(l, 16);
    inputs in = {malloc(n * 4), malloc(n * 2), malloc(groups * 2), malloc(groups * 2), malloc(pmax), malloc(pmax)};
    kvt_values(rng, in.x, n, 2.0f, 1);
    for (size_t i = 0; i < n; i += 7)
        in.x[i] = (float)(kv_rng_normal(rng) * 1e-40); /* fp32 subnormals */
    random_bytes(rng, in.codes, n * 2);
    random_meta(rng, in.scale, groups);
    random_meta(rng, in.zero, groups);
    random_bytes(rng, in.anchor, pmax);
    random_bytes(rng, in.residual, pmax);
    return in;
}

static void free_inputs(inputs *in)
{
    free(in->x), free(in->codes), free(in->scale), free(in->zero), free(in->anchor), free(in->residual);
}

/* ---- One kernel on one backend: its outputs ------------------------------------------ */

enum { OP_DECODE, OP_DEQUANTIZE, OP_PACK, OP_UNPACK, OP_QUANTIZE, OP_ENCODE };

typedef struct outputs {
    void *out[4];
    size_t bytes[4];
    int count;
} outputs;

static outputs run_op(kv_backend *be, int op, const kv_quant_layout *l, unsigned bits, unsigned a, int residual,
                      const inputs *in)
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    kv_error err = {0};
    outputs o = {{0}, {0}, 0};
    kv_bref none = {NULL, 0};
    if (op == OP_DECODE) {
        size_t pa = kv_layout_packed_bytes(l, a ? a : bits), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
        kv_buffer *ba = kvt_put(be, in->anchor, pa), *br = residual ? kvt_put(be, in->residual, pr) : NULL;
        kv_buffer *bs = kvt_put(be, in->scale, groups * 2), *bz = kvt_put(be, in->zero, groups * 2);
        kv_buffer *bo = kvt_fill(be, n * 4, 0xa5);
        kv_decode_args d = {*l, bits, a, {ba, 0}, residual ? (kv_bref){br, 0} : none, {bs, 0}, {bz, 0}, {bo, 0}};
        cr_assert_eq(kv_backend_decode(be, &d, &err), KV_OK, "%s", err.msg);
        o.out[0] = kvt_get(be, bo, n * 4), o.bytes[0] = n * 4, o.count = 1;
        kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs), kv_buffer_free(be, bz);
        kv_buffer_free(be, bo);
    } else if (op == OP_DEQUANTIZE) {
        kv_buffer *bc = kvt_put(be, in->codes, n * 2), *bs = kvt_put(be, in->scale, groups * 2);
        kv_buffer *bz = kvt_put(be, in->zero, groups * 2), *bo = kvt_fill(be, n * 4, 0xa5);
        kv_dequantize_args d = {*l, bits, a, {bc, 0}, {bs, 0}, {bz, 0}, {bo, 0}};
        cr_assert_eq(kv_backend_dequantize(be, &d, &err), KV_OK, "%s", err.msg);
        o.out[0] = kvt_get(be, bo, n * 4), o.bytes[0] = n * 4, o.count = 1;
        kv_buffer_free(be, bc), kv_buffer_free(be, bs), kv_buffer_free(be, bz), kv_buffer_free(be, bo);
    } else if (op == OP_PACK || op == OP_UNPACK) {
        size_t pb = kv_layout_packed_bytes(l, bits);
        kv_buffer *bc = op == OP_PACK ? kvt_put(be, in->codes, n * 2) : kvt_fill(be, n * 2, 0xa5);
        kv_buffer *bp = op == OP_PACK ? kvt_fill(be, pb, 0xa5) : kvt_put(be, in->anchor, pb);
        kv_pack_args p = {*l, bits, {bc, 0}, {bp, 0}};
        if (op == OP_PACK) {
            cr_assert_eq(kv_backend_pack(be, &p, &err), KV_OK, "%s", err.msg);
            o.out[0] = kvt_get(be, bp, pb), o.bytes[0] = pb;
        } else {
            cr_assert_eq(kv_backend_unpack(be, &p, &err), KV_OK, "%s", err.msg);
            o.out[0] = kvt_get(be, bc, n * 2), o.bytes[0] = n * 2;
        }
        o.count = 1;
        kv_buffer_free(be, bc), kv_buffer_free(be, bp);
    } else if (op == OP_ENCODE) {
        size_t pa = kv_layout_packed_bytes(l, a ? a : bits), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
        kv_buffer *bx = kvt_put(be, in->x, n * 4), *ba = kvt_fill(be, pa, 0xa5), *br = kvt_fill(be, pr ? pr : 1, 0xa5);
        kv_buffer *bs = kvt_fill(be, groups * 2, 0xa5), *bz = kvt_fill(be, groups * 2, 0xa5);
        kv_encode_args e = {*l, bits, a, {bx, 0}, {ba, 0}, a ? (kv_bref){br, 0} : none, {bs, 0}, {bz, 0}};
        cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
        o.out[0] = kvt_get(be, ba, pa), o.bytes[0] = pa;
        o.out[1] = kvt_get(be, br, pr), o.bytes[1] = pr;
        o.out[2] = kvt_get(be, bs, groups * 2), o.bytes[2] = groups * 2;
        o.out[3] = kvt_get(be, bz, groups * 2), o.bytes[3] = groups * 2, o.count = 4;
        kv_buffer_free(be, bx), kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs);
        kv_buffer_free(be, bz);
    } else {
        kv_buffer *bx = kvt_put(be, in->x, n * 4), *bc = kvt_fill(be, n * 2, 0xa5);
        kv_buffer *bs = kvt_fill(be, groups * 2, 0xa5), *bz = kvt_fill(be, groups * 2, 0xa5);
        kv_quantize_args q = {*l, bits, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
        cr_assert_eq(kv_backend_quantize(be, &q, &err), KV_OK, "%s", err.msg);
        o.out[0] = kvt_get(be, bc, n * 2), o.bytes[0] = n * 2;
        o.out[1] = kvt_get(be, bs, groups * 2), o.bytes[1] = groups * 2;
        o.out[2] = kvt_get(be, bz, groups * 2), o.bytes[2] = groups * 2, o.count = 3;
        kv_buffer_free(be, bx), kv_buffer_free(be, bc), kv_buffer_free(be, bs), kv_buffer_free(be, bz);
    }
    return o;
}

static const char *const op_names[] = {"decode", "dequantize", "pack", "unpack", "quantize", "encode"};
static const char *const out_names[][4] = {
    {"out"}, {"out"}, {"packed"}, {"codes"}, {"codes", "scale", "zero"}, {"anchor", "residual", "scale", "zero"},
};

/* op on opencl and the reference; returns 1 when every output is equal. */
static int check_op(kv_backend *be, kv_backend *ref, int op, const kv_quant_layout *l, unsigned bits, unsigned a,
                    int residual, const inputs *in)
{
    outputs o1 = run_op(be, op, l, bits, a, residual, in), o2 = run_op(ref, op, l, bits, a, residual, in);
    int ok = 1;
    for (int k = 0; k < o1.count; k++) {
        long d = kvt_first_diff(o1.out[k], o2.out[k], o1.bytes[k]);
        if (d >= 0 && ok)
            cr_expect(0, "%s %ux%u G %u %s, b %u a %u%s: %s byte %ld of %zu differs (0x%02x, want 0x%02x)",
                      op_names[op], l->rows, l->cols, l->group_size,
                      l->grouping == KV_GROUP_TOKEN ? "token" : "channel", bits, a,
                      residual ? " +residual" : "", out_names[op][k], d, o1.bytes[k],
                      ((unsigned char *)o1.out[k])[d], ((unsigned char *)o2.out[k])[d]);
        ok = ok && d < 0;
        free(o1.out[k]), free(o2.out[k]);
    }
    return ok;
}

/* op over every shape and width (and, for decode and dequantize, splits);
   stops at the first shape with a difference (one message per shape). */
static void check_shapes(int op, const kv_quant_layout *shapes, size_t n_shapes)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    kv_rng rng;
    kv_rng_seed(&rng, 2209 + (uint64_t)op);
    size_t checked = 0;
    for (size_t s = 0; s < n_shapes; s++) {
        const kv_quant_layout *l = &shapes[s];
        inputs in = make_inputs(&rng, l);
        int ok = 1;
        for (unsigned bits = 1; bits <= 16 && ok; bits++) {
            unsigned splits[3] = {0, bits > 1 ? 1 : 0, bits > 2 ? bits / 2 : 0};
            int nsplit = op == OP_DECODE || op == OP_DEQUANTIZE || op == OP_ENCODE ? 3 : 1;
            for (int k = 0; k < nsplit && ok; k++) {
                if (k > 0 && !splits[k])
                    continue;
                ok = check_op(be, ref, op, l, bits, splits[k], 0, &in);
                checked++;
                if (ok && op == OP_DECODE && splits[k]) {
                    ok = check_op(be, ref, op, l, bits, splits[k], 1, &in);
                    checked++;
                }
            }
        }
        free_inputs(&in);
    }
    cr_assert_gt(checked, n_shapes * 16 - 1, "%s: only %zu cases ran", op_names[op], checked);
    kv_backend_close(be);
    kv_backend_close(ref);
}

static void check_all(int op)
{
    check_shapes(op, shapes, N_SHAPES);
}

Test(opencl_cpu_codec, decode_bit_exact)
{
    check_all(OP_DECODE);
}

Test(opencl_cpu_codec, dequantize_bit_exact)
{
    check_all(OP_DEQUANTIZE);
}

Test(opencl_cpu_codec, pack_bit_exact)
{
    check_all(OP_PACK);
}

Test(opencl_cpu_codec, unpack_bit_exact)
{
    check_all(OP_UNPACK);
}

Test(opencl_cpu_codec, quantize_bit_exact)
{
    check_all(OP_QUANTIZE);
}

/* KIVI's CHANNEL groups (kv_cpu_encode_channels: 16 columns a work-item):
   columns not a multiple of 16 (a short last chunk of 1, 4 and 15), rows
   not a multiple of G (a short last block), one block, G 1, and streams of
   more than 32 bits (the accumulator's flush), every width and split. */
static const kv_quant_layout channel_shapes[] = {
    {1, 1, 1, KV_GROUP_CHANNEL},     {5, 7, 5, KV_GROUP_CHANNEL},     {37, 40, 16, KV_GROUP_CHANNEL},
    {64, 32, 32, KV_GROUP_CHANNEL},  {70, 33, 32, KV_GROUP_CHANNEL},  {3, 47, 1, KV_GROUP_CHANNEL},
    {100, 20, 48, KV_GROUP_CHANNEL}, {9, 128, 32, KV_GROUP_CHANNEL},  {129, 17, 128, KV_GROUP_CHANNEL},
};

Test(opencl_cpu_codec, encode_channel_groups_bit_exact)
{
    check_shapes(OP_ENCODE, channel_shapes, sizeof channel_shapes / sizeof channel_shapes[0]);
}

/* Planes made by encode itself (the reference's), decoded on both: the
   round trip the engine runs, over a bench-sized block of 4-, 8- and
   anchor/residual widths. */
Test(opencl_cpu_codec, decode_of_encoded_planes_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    kv_rng rng;
    kv_rng_seed(&rng, 2231);
    kv_quant_layout l = {257, 128, 32, KV_GROUP_TOKEN};
    size_t n = (size_t)l.rows * l.cols, groups = kv_layout_groups(&l);
    inputs in = make_inputs(&rng, &l);
    const unsigned cases[][2] = {{8, 0}, {4, 0}, {2, 0}, {8, 4}, {16, 4}, {6, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned bits = cases[c][0], a = cases[c][1];
        size_t pa = kv_layout_packed_bytes(&l, a ? a : bits), pr = a ? kv_layout_packed_bytes(&l, bits - a) : 0;
        kv_buffer *bx = kvt_put(ref, in.x, n * 4), *ba = kvt_fill(ref, pa, 0), *br = kvt_fill(ref, pr ? pr : 1, 0);
        kv_buffer *bs = kvt_fill(ref, groups * 2, 0), *bz = kvt_fill(ref, groups * 2, 0);
        kv_error err = {0};
        kv_encode_args e = {l, bits, a, {bx, 0}, {ba, 0}, a ? (kv_bref){br, 0} : (kv_bref){NULL, 0}, {bs, 0}, {bz, 0}};
        cr_assert_eq(kv_backend_encode(ref, &e, &err), KV_OK, "%s", err.msg);
        inputs enc = in;
        enc.anchor = kvt_get(ref, ba, pa);
        enc.residual = kvt_get(ref, br, pr ? pr : 1);
        enc.scale = kvt_get(ref, bs, groups * 2);
        enc.zero = kvt_get(ref, bz, groups * 2);
        check_op(be, ref, OP_DECODE, &l, bits, a, a != 0, &enc);
        if (a)
            check_op(be, ref, OP_DECODE, &l, bits, a, 0, &enc);
        free(enc.anchor), free(enc.residual), free(enc.scale), free(enc.zero);
        kv_buffer_free(ref, bx), kv_buffer_free(ref, ba), kv_buffer_free(ref, br), kv_buffer_free(ref, bs);
        kv_buffer_free(ref, bz);
    }
    free_inputs(&in);
    kv_backend_close(be);
    kv_backend_close(ref);
}

/* Groups whose fp16 metadata lands on the conversion's edges (the vector
   kv_cpu_meta16): scales and zeros that are exact ties between fp16
   subnormals (k + 1/2 quanta of 2^-24, k even and odd), negative subnormal
   zeros, values at 2^-25 (rounding to 0 or to the smallest subnormal), the
   normal/subnormal boundary 2^-14, and spans at 65504, 65519 and 65520 (the
   last rounds to Inf and saturates, N2); with token groups (16 to a
   work-item) and the same groups as columns (channel groups). */
Test(opencl_cpu_codec, metadata_fp16_edges_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    enum { G = 4, NG = 160 };
    static float rows[NG][G];
    size_t k = 0;
    const float q = 5.9604644775390625e-8f; /* 2^-24 */
    for (int i = 0; i < 48; i++, k++) { /* [0, (i + 1/2) q]: scale a tie at b = 1 */
        rows[k][0] = 0.0f, rows[k][1] = ((float)i + 0.5f) * q, rows[k][2] = rows[k][1] * 0.5f, rows[k][3] = 0.0f;
    }
    for (int i = 0; i < 48; i++, k++) { /* [-(i + 1/2) q, 0]: zero a negative tie */
        rows[k][0] = -((float)i + 0.5f) * q, rows[k][1] = 0.0f, rows[k][2] = -0.0f, rows[k][3] = rows[k][0];
    }
    const float edges[] = {2.98023224e-8f, 2.98023259e-8f, 2.9802319e-8f,   6.10351562e-5f, 6.1035153e-5f,
                           6.0975552e-5f,  65504.0f,       65519.0f,        65520.0f,       1e30f,
                           -65520.0f,      -6.0975552e-5f, -2.98023224e-8f, 1.5e-45f,       -1.5e-45f};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0] && k + 3 < NG; e++) {
        float v = edges[e];
        rows[k][0] = 0.0f, rows[k][1] = v, rows[k][2] = v, rows[k][3] = 0.0f, k++;  /* span v from 0 */
        rows[k][0] = v, rows[k][1] = v, rows[k][2] = v, rows[k][3] = v, k++;        /* constant v */
        rows[k][0] = -v, rows[k][1] = v, rows[k][2] = NAN, rows[k][3] = INFINITY, k++; /* span 2v */
        rows[k][0] = v, rows[k][1] = v * 3.0f, rows[k][2] = -INFINITY, rows[k][3] = v, k++;
    }
    for (; k < NG; k++)
        for (int j = 0; j < G; j++)
            rows[k][j] = (float)(k * G + j) * 1e-9f - 3e-6f;
    float tr[G][NG]; /* the same groups as columns */
    for (size_t g = 0; g < NG; g++)
        for (int j = 0; j < G; j++)
            tr[j][g] = rows[g][j];
    kv_quant_layout tok = {NG, G, G, KV_GROUP_TOKEN}, chan = {G, NG, G, KV_GROUP_CHANNEL};
    inputs in_t = {&rows[0][0], NULL, NULL, NULL, NULL, NULL}, in_c = {&tr[0][0], NULL, NULL, NULL, NULL, NULL};
    const unsigned widths[] = {1, 2, 3, 8, 16};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        unsigned b = widths[w];
        check_op(be, ref, OP_QUANTIZE, &tok, b, 0, 0, &in_t);
        check_op(be, ref, OP_ENCODE, &tok, b, 0, 0, &in_t);
        check_op(be, ref, OP_ENCODE, &chan, b, 0, 0, &in_c);
        if (b > 1)
            check_op(be, ref, OP_ENCODE, &chan, b, 1, 0, &in_c);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}
