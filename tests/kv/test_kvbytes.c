/* test_kvbytes.c — the simulator's byte counts (core/kv/kvbytes.c) are the bytes the kernels write:
 * against a hand count of byte-aligned groups, and against the CPU reference's pack kernel, which
 * must fill exactly that many bytes and no more. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/rng.h"
#include "core/kv/kvbytes.h"
#include "tests/kernels_util.h"

/* Bytes of one plane of `bits`-bit codes, counted group by group (each group starts on a byte). */
static size_t hand_plane_bytes(uint32_t rows, uint32_t cols, uint32_t g, int per_channel, unsigned bits,
                               size_t *groups)
{
    uint32_t along = per_channel ? rows : cols, across = per_channel ? cols : rows;
    size_t bytes = 0, n = 0;
    for (uint32_t line = 0; line < across; line++)
        for (uint32_t start = 0; start < along; start += g) {
            uint32_t len = along - start < g ? along - start : g;
            bytes += ((size_t)len * bits + 7) / 8;
            n++;
        }
    *groups = n;
    return bytes;
}

/* Packs random codes on the reference device into a buffer with a guard zone; returns the bytes
   the kernel changed at or past `expected` (0 when it kept to its plane) and checks the round trip. */
static size_t pack_overrun(kv_backend *be, kv_quant_layout l, unsigned bits, size_t expected, kv_rng *rng)
{
    size_t n = (size_t)l.rows * l.cols, guard = 64;
    uint16_t *codes = malloc(n * sizeof *codes);
    for (size_t i = 0; i < n; i++)
        codes[i] = (uint16_t)(kv_rng_below(rng, 1u << bits));
    kv_buffer *c = kvt_put(be, codes, n * sizeof *codes);
    kv_buffer *p = kvt_fill(be, expected + guard, 0xA5);
    kv_buffer *back = kvt_fill(be, n * sizeof *codes, 0);
    kv_error err = {0};
    kv_pack_args a = {.layout = l, .bits = bits, .codes = {c, 0}, .packed = {p, 0}};
    cr_assert_eq(kv_backend_pack(be, &a, &err), KV_OK, "%s", err.msg);
    kv_pack_args u = {.layout = l, .bits = bits, .codes = {back, 0}, .packed = {p, 0}};
    cr_assert_eq(kv_backend_unpack(be, &u, &err), KV_OK, "%s", err.msg);
    unsigned char *packed = kvt_get(be, p, expected + guard);
    uint16_t *round = kvt_get(be, back, n * sizeof *codes);
    cr_assert(memcmp(round, codes, n * sizeof *codes) == 0, "pack/unpack round trip at %u bits", bits);
    size_t changed = 0;
    for (size_t i = expected; i < expected + guard; i++)
        changed += packed[i] != 0xA5;
    free(packed);
    free(round);
    free(codes);
    kv_buffer_free(be, c);
    kv_buffer_free(be, p);
    kv_buffer_free(be, back);
    return changed;
}

Test(kvbytes, planes_are_the_bytes_the_pack_kernel_writes)
{
    kv_backend *be = kvt_open_reference();
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    const int tokens[] = {1, 5, 63, 64, 65, 300}, dims[] = {64, 128}, groups[] = {7, 32, 64, 128};
    for (unsigned bits = 1; bits <= 16; bits++)
        for (int per_channel = 0; per_channel <= 1; per_channel++)
            for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++)
                for (size_t ti = 0; ti < sizeof tokens / sizeof *tokens; ti++)
                    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
                        /* anchor 0 (one plane) and, from 2 bits up, one split that varies with the shape */
                        unsigned anchors[2] = {0, bits >= 2 ? 1 + (unsigned)(ti + gi) % (bits - 1) : 0};
                        for (int ai = 0; ai < (bits >= 2 ? 2 : 1); ai++) {
                            unsigned a = anchors[ai];
                            kv_tensor_enc t = {.kind = KV_TENSOR_INT, .bits = (int)bits, .anchor_bits = (int)a,
                                               .group_size = groups[gi], .per_channel = per_channel};
                            uint32_t rows = (uint32_t)tokens[ti], cols = (uint32_t)dims[di];
                            double anchor, residual;
                            kv_tensor_bytes(&t, tokens[ti], dims[di], &anchor, &residual);
                            size_t ng;
                            unsigned first = a ? a : bits;
                            size_t first_bytes = hand_plane_bytes(rows, cols, (uint32_t)groups[gi], per_channel,
                                                                  first, &ng);
                            size_t second_bytes = a ? hand_plane_bytes(rows, cols, (uint32_t)groups[gi],
                                                                       per_channel, bits - a, &ng)
                                                    : 0;
                            cr_assert_eq((size_t)anchor, first_bytes + 4 * ng,
                                         "anchor plane, %u bits (a %u), G %d, %s, %u x %u", bits, a, groups[gi],
                                         per_channel ? "per channel" : "per token", rows, cols);
                            cr_assert_eq((size_t)residual, second_bytes, "residual plane, %u bits (a %u)", bits,
                                         a);
                            if (di == 0 && (ti == 2 || ti == 5)) { /* the kernel, on a few shapes */
                                kv_quant_layout l = {rows, cols, (uint32_t)groups[gi],
                                                     per_channel ? KV_GROUP_CHANNEL : KV_GROUP_TOKEN};
                                cr_assert_eq(pack_overrun(be, l, first, first_bytes, &rng), 0,
                                             "the pack kernel wrote past %zu bytes (%u bits)", first_bytes, first);
                                if (a)
                                    cr_assert_eq(pack_overrun(be, l, bits - a, second_bytes, &rng), 0,
                                                 "the pack kernel wrote past %zu bytes (%u bits)", second_bytes,
                                                 bits - a);
                            }
                        }
                    }
    kv_backend_close(be);
}

Test(kvbytes, bf16_and_kivi_window)
{
    kv_tensor_enc bf16 = {.kind = KV_TENSOR_BF16};
    double anchor, residual;
    kv_tensor_bytes(&bf16, 100, 128, &anchor, &residual);
    cr_assert_eq(anchor, 2.0 * 100 * 128);
    cr_assert_eq(residual, 0);
    /* KIVI: the last R tokens stay bf16, the rest are quantized (keys per channel) */
    kv_encoding e = {.key = {.kind = KV_TENSOR_INT, .bits = 2, .group_size = 32, .per_channel = 1},
                     .value = {.kind = KV_TENSOR_INT, .bits = 2, .group_size = 32},
                     .full_precision_window = 32};
    kv_head_bytes b;
    kv_encoding_bytes(&e, 96, 128, NULL, &b);
    double k, v, w;
    kv_tensor_bytes(&e.key, 64, 128, &k, &residual);
    kv_tensor_bytes(&e.value, 64, 128, &v, &residual);
    kv_tensor_bytes(&bf16, 32, 128, &w, &residual);
    cr_assert_eq(b.anchor, k + v + 2 * w);
    cr_assert_eq(b.kept_tokens, 96);
}
