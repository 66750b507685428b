/* cpu_fast_avx2.h — the AVX2 codecs of the fast CPU device (cpu_fast_avx2.c),
 * for token groups that tile the rows with G a multiple of 8: group g is
 * x[g*G, (g+1)*G) and its w-bit stream starts at byte g*G*w/8 of its plane.
 * Channel groups (KIVI keys) have an encode and a decode of their own.
 * cpu_fast.c calls them when the device's isa is "avx2" (x86-64 with AVX2,
 * FMA, F16C and BMI2); they are bit-exact with the reference kernels. */
#ifndef KV_CPU_FAST_AVX2_H
#define KV_CPU_FAST_AVX2_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

/* Quantize + split + pack of groups [g0, g1) of G values: the anchor (or full)
   codes of abits (or bits) to `anchor`, the residuals to `residual` (abits > 0;
   else unused), the fp16 metadata to scale[g] and zero[g]. codes16 (abits 0):
   the codes as u16 elements to `anchor` instead (the quantize kernel). */
void kv_cpu_avx2_encode(const float *x, uint32_t G, unsigned bits, unsigned abits, int codes16, uint8_t *anchor,
                        uint8_t *residual, uint16_t *scale, uint16_t *zero, size_t g0, size_t g1);

/* Unpack (+ merge) + dequantize of groups [g0, g1) to out[g*G, (g+1)*G);
   residual NULL with abits > 0: anchor-only midpoints. codes16 (residual
   NULL): `anchor` holds u16 codes, masked to abits (or bits) first. */
void kv_cpu_avx2_decode(const uint8_t *anchor, const uint8_t *residual, uint32_t G, unsigned bits, unsigned abits,
                        int codes16, const uint16_t *scale, const uint16_t *zero, float *out, size_t g0, size_t g1);

/* Pack / unpack of the u16 codes [e0, e1) (multiples of 8) as a w-bit stream
   (code & (2^w − 1); element e at bit e*w). */
void kv_cpu_avx2_pack(const uint16_t *codes, uint8_t *packed, size_t e0, size_t e1, unsigned w);
void kv_cpu_avx2_unpack(const uint8_t *packed, uint16_t *codes, size_t e0, size_t e1, unsigned w);

/* Encode / decode of the channel groups [g0, g1) of l (KV_GROUP_CHANNEL), as
   kv_cpu_fast_encode / kv_cpu_fast_decode. */
void kv_cpu_avx2_encode_channel(const kv_quant_layout *l, unsigned bits, unsigned abits, const float *x,
                                uint8_t *anchor, uint8_t *residual, uint16_t *scale, uint16_t *zero, size_t g0,
                                size_t g1);
void kv_cpu_avx2_decode_channel(const kv_quant_layout *l, unsigned bits, unsigned abits, const uint8_t *anchor,
                                const uint8_t *residual, const uint16_t *scale, const uint16_t *zero, float *out,
                                size_t g0, size_t g1);

#endif
