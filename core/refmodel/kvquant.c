/* kvquant.c — group quantization, anchor reconstruction and bf16 rounding per docs/kernels.md "Numerics". */
#include "core/refmodel/kvquant.h"

#include <math.h>
#include <string.h>

#include "backends/numerics.h"

/* Every value here comes from backends/numerics.h, the same inline arithmetic the
   CPU reference kernels use, so the reference model's KV is bit for bit what a
   backend's encode and decode produce (fp16 metadata saturating at ±65504, −0
   normalised, round half to even). */

uint16_t kv_f32_to_f16(float x)
{
    return kv_f16_from_f32(x);
}

float kv_bf16_round(float x)
{
    return kv_bf16_to_f32(kv_bf16_from_f32(x));
}

void kv_group_quantize(const float *x, size_t n, size_t stride, unsigned bits, uint16_t *codes, uint16_t *scale_h,
                       uint16_t *zero_h)
{
    float mn = INFINITY, mx = -INFINITY;
    int have_finite = 0;
    for (size_t i = 0; i < n; i++) {
        float v = x[i * stride];
        if (isfinite(v)) {
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            have_finite = 1;
        }
    }
    kv_qparams p = kv_quant_params(mn, mx, have_finite, bits);
    *scale_h = p.scale_h;
    *zero_h = p.zero_h;
    for (size_t i = 0; i < n; i++)
        codes[i] = kv_quant_code(x[i * stride], p.s, p.z, bits);
}

float kv_group_dequantize(uint16_t code, uint16_t scale_h, uint16_t zero_h)
{
    return kv_dequant(code, kv_f16_to_f32(scale_h), kv_f16_to_f32(zero_h));
}

float kv_group_dequantize_anchor(uint16_t code, unsigned bits, unsigned anchor_bits, uint16_t scale_h,
                                 uint16_t zero_h)
{
    unsigned r = bits - anchor_bits;
    return kv_dequant_anchor((uint32_t)code >> r, r, kv_f16_to_f32(scale_h), kv_f16_to_f32(zero_h));
}

size_t kv_group_bytes(size_t n, unsigned bits, unsigned anchor_bits)
{
    if (anchor_bits > 0 && anchor_bits < bits)
        return (n * anchor_bits + 7) / 8 + (n * (bits - anchor_bits) + 7) / 8 + 4;
    return (n * bits + 7) / 8 + 4;
}
