/* test_kvquant_backend.c — the reference model's host quantization equals the CPU reference kernel, bit for bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backends/backend.h"
#include "core/refmodel/kvquant.h"

/* Quantizes rows x cols per token (groups of g along cols) both ways and compares codes and metadata. */
static void compare(const float *x, uint32_t rows, uint32_t cols, uint32_t g, unsigned bits)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open("cpu", 1, &be, &err), 0, "%s", err.msg); /* cpu:1, the reference device */
    kv_quant_layout l = {rows, cols, g, KV_GROUP_TOKEN};
    size_t n = (size_t)rows * cols, groups = kv_layout_groups(&l);
    kv_buffer *bx = NULL, *bc = NULL, *bs = NULL, *bz = NULL;
    cr_assert_eq(kv_buffer_alloc(be, n * 4, &bx, &err), 0);
    cr_assert_eq(kv_buffer_alloc(be, n * 2, &bc, &err), 0);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bs, &err), 0);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bz, &err), 0);
    cr_assert_eq(kv_buffer_write(be, bx, 0, x, n * 4, &err), 0);
    kv_quantize_args q = {l, bits, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_quantize(be, &q, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_backend_synchronize(be, &err), 0);
    uint16_t codes[4096], scale[512], zero[512];
    cr_assert(n <= 4096 && groups <= 512);
    kv_buffer_read(be, bc, 0, codes, n * 2, &err);
    kv_buffer_read(be, bs, 0, scale, groups * 2, &err);
    kv_buffer_read(be, bz, 0, zero, groups * 2, &err);
    size_t gi = 0;
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c0 = 0; c0 < cols; c0 += g, gi++) {
            uint32_t len = cols - c0 < g ? cols - c0 : g;
            uint16_t host[4096], s, z;
            kv_group_quantize(x + (size_t)r * cols + c0, len, 1, bits, host, &s, &z);
            cr_expect_eq(s, scale[gi], "group %zu (%u bits): scale %04x vs kernel %04x", gi, bits, s, scale[gi]);
            cr_expect_eq(z, zero[gi], "group %zu (%u bits): zero %04x vs kernel %04x", gi, bits, z, zero[gi]);
            for (uint32_t i = 0; i < len; i++)
                cr_expect_eq(host[i], codes[(size_t)r * cols + c0 + i], "group %zu element %u", gi, i);
        }
    }
    kv_buffer_free(be, bx);
    kv_buffer_free(be, bc);
    kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
    kv_backend_close(be);
}

Test(kvquant_backend, random_groups_all_widths)
{
    float x[16 * 72];
    uint32_t state = 7;
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * (float)(1 + i % 9);
    }
    for (unsigned bits = 1; bits <= 16; bits++)
        compare(x, 16, 72, 32, bits); /* 72 = 32 + 32 + 8: a short last group */
}

Test(kvquant_backend, edge_values)
{
    /* Non-finite values, −0, a constant group, and a range whose scale overflows fp16 (saturates). */
    float x[4 * 8] = {NAN, -INFINITY, 1.0f, INFINITY, -0.0f, 0.0f, 2.0f, 3.0f,
                      5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f,
                      -3.0e38f, 3.0e38f, 0.0f, 1.0f, -1.0f, 7.0f, 1e-8f, -1e-8f,
                      NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    for (unsigned bits = 1; bits <= 16; bits += 3)
        compare(x, 4, 8, 8, bits);
}
