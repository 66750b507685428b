/* kvquant.h — the KV numerics of docs/kernels.md ("Numerics") on the host, for the reference model's KV store.
 *
 * Group quantization (b bits, fp16 scale and zero, round half to even), the
 * Lynx anchor midpoint reconstruction and bf16 rounding, value for value as
 * "Numerics" specifies, so that the values the reference model attends over
 * are those any backend's decode kernel reconstructs from the same codes.
 */
#ifndef KV_KVQUANT_H
#define KV_KVQUANT_H

#include <stddef.h>
#include <stdint.h>

/* fp32 → IEEE fp16 bits, round to nearest even (overflow → inf, NaN kept). */
uint16_t kv_f32_to_f16(float x);
/* fp32 → bf16 (round to nearest even) → fp32. */
float kv_bf16_round(float x);

/* Quantizes one group of n values x[0], x[stride], ... to b-bit codes
   (codes[i] for element i) and returns fp16 scale and zero bits. */
void kv_group_quantize(const float *x, size_t n, size_t stride, unsigned bits, uint16_t *codes, uint16_t *scale_h,
                       uint16_t *zero_h);

/* x̂ = fmaf(q, s, z) with s, z from the fp16 bits. */
float kv_group_dequantize(uint16_t code, uint16_t scale_h, uint16_t zero_h);
/* Anchor-only (midpoint) reconstruction of a b-bit code's a-bit anchor:
   fmaf((A << r) + (2^r - 1) / 2, s, z), r = b - a, A = code >> r. */
float kv_group_dequantize_anchor(uint16_t code, unsigned bits, unsigned anchor_bits, uint16_t scale_h,
                                 uint16_t zero_h);

/* Bytes of one group of n codes at b bits, split into an a-bit anchor plane
   and a (b-a)-bit residual plane when 0 < a < b (each plane byte-aligned),
   plus 4 bytes of fp16 scale and zero. */
size_t kv_group_bytes(size_t n, unsigned bits, unsigned anchor_bits);

#endif
