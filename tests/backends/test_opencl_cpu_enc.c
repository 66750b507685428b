/* test_opencl_cpu_enc.c — the OpenCL CPU-device (PoCL) TOKEN-group encode with its widths
 * fixed at compile time (kernels_cpu_codec.cl: kv_cpu_encode_groups calls kv_cpu_encode_codes
 * with the constant widths of int8, int4, Lynx b8/a4 and b16/a4, else with the run-time ones)
 * against the CPU reference, bit for bit: each fixed format and its run-time neighbours
 * (b16/a3, b16/a5, b8/a3, b8/a5, b4/a2, b7, b9), groups of 16, 32, 64 and 128 values, short
 * last groups and 16-value chunks, group counts that are not a multiple of a work-item's 16,
 * ordinary and awkward values (NaN, ±Inf, ±0, fp16 overflow and subnormals, constant groups),
 * default lanes and KVSIM_OPENCL_LANES=8. Every output plane starts as 0xa5 with TAIL bytes
 * more, so a forgotten byte, or one written past a plane, shows. Without an OpenCL device each
 * test says "skipped: opencl: ..." and is reported as skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "core/base/rng.h"
#include "tests/kernels_util.h"

/* rows x cols in token groups of G: 7x5 groups, 35x4 with a short last group of 8 (and a
   short 16-value chunk), 3x2 of 128, 17x3 with a row shorter than its group's 128 (44 of
   them), 1 row of a single group, and 33x4 groups of 16. */
static const kv_quant_layout shapes[] = {
    {7, 160, 32, KV_GROUP_TOKEN}, {35, 104, 32, KV_GROUP_TOKEN}, {3, 256, 128, KV_GROUP_TOKEN},
    {17, 300, 128, KV_GROUP_TOKEN}, {1, 64, 64, KV_GROUP_TOKEN}, {33, 64, 16, KV_GROUP_TOKEN},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* (bits, anchor): the four fixed formats first, then neighbours on the run-time path. */
static const unsigned formats[][2] = {{8, 0}, {4, 0}, {8, 4}, {16, 4}, {16, 3}, {16, 5},
                                      {8, 3}, {8, 5}, {4, 2}, {7, 0}, {9, 0}};
#define N_FORMATS (sizeof formats / sizeof formats[0])

/* Bytes past each output plane, also 0xa5 and compared. */
#define TAIL 64

/* The four outputs (anchor, residual, scale, zero) of an encode of x on be, each with TAIL
   bytes more, from 0xa5; out[k] gets a malloc'd copy (the caller frees it), bytes[k] its size. */
static void run_encode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned a, const float *x,
                       unsigned char *out[4], size_t bytes[4])
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    bytes[0] = kv_layout_packed_bytes(l, a ? a : bits) + TAIL;
    bytes[1] = (a ? kv_layout_packed_bytes(l, bits - a) : 0) + TAIL;
    bytes[2] = bytes[3] = groups * 2 + TAIL;
    kv_buffer *bx = kvt_put(be, x, n * 4), *b[4];
    for (int k = 0; k < 4; k++)
        b[k] = kvt_fill(be, bytes[k], 0xa5);
    kv_error err = {0};
    kv_encode_args e = {*l, bits, a, {bx, 0}, {b[0], 0}, a ? (kv_bref){b[1], 0} : (kv_bref){NULL, 0}, {b[2], 0},
                        {b[3], 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    for (int k = 0; k < 4; k++) {
        out[k] = kvt_get(be, b[k], bytes[k]);
        kv_buffer_free(be, b[k]);
    }
    kv_buffer_free(be, bx);
}

/* Every shape and format with both kinds of values on be against the reference; returns the
   number of cases that differ (each named once) and counts the cases in *checked. */
static size_t check_all(kv_backend *be, kv_backend *ref, const char *label, size_t *checked)
{
    static const char *const names[4] = {"anchor", "residual", "scale", "zero"};
    kv_rng rng;
    kv_rng_seed(&rng, 2290);
    size_t failed = 0;
    for (size_t s = 0; s < N_SHAPES; s++) {
        const kv_quant_layout *l = &shapes[s];
        size_t n = (size_t)l->rows * l->cols;
        float *x = malloc(n * 4);
        cr_assert(x);
        for (size_t f = 0; f < N_FORMATS; f++)
            for (int awkward = 0; awkward < 2; awkward++) {
                unsigned bits = formats[f][0], a = formats[f][1];
                kvt_values(&rng, x, n, 2.0f, awkward);
                unsigned char *o1[4], *o2[4];
                size_t b1[4], b2[4];
                run_encode(be, l, bits, a, x, o1, b1);
                run_encode(ref, l, bits, a, x, o2, b2);
                int bad = 0;
                for (int k = 0; k < 4; k++) {
                    cr_assert_eq(b1[k], b2[k]);
                    long d = kvt_first_diff(o1[k], o2[k], b1[k]);
                    if (d >= 0 && !bad)
                        cr_expect(0, "%s: %ux%u G %u, b %u a %u%s: %s byte %ld of %zu is 0x%02x, want 0x%02x",
                                  label, l->rows, l->cols, l->group_size, bits, a, awkward ? " (awkward)" : "",
                                  names[k], d, b1[k], o1[k][d], o2[k][d]);
                    bad |= d >= 0;
                    free(o1[k]), free(o2[k]);
                }
                failed += bad;
                (*checked)++;
            }
        free(x);
    }
    return failed;
}

Test(opencl_cpu_enc, fixed_and_runtime_widths_bit_exact)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", NULL), *ref = kvt_open_reference();
    size_t checked = 0, failed = check_all(be, ref, "default lanes", &checked);
    cr_assert_eq(checked, N_SHAPES * N_FORMATS * 2, "only %zu cases ran", checked);
    cr_assert_eq(failed, 0, "%zu of %zu encode cases differ", failed, checked);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_cpu_enc, fixed_widths_bit_exact_with_8_lanes)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", "8"), *ref = kvt_open_reference();
    size_t checked = 0, failed = check_all(be, ref, "8 lanes", &checked);
    cr_assert_eq(checked, N_SHAPES * N_FORMATS * 2, "only %zu cases ran", checked);
    cr_assert_eq(failed, 0, "%zu of %zu encode cases differ", failed, checked);
    kv_backend_close(be);
    kv_backend_close(ref);
}
