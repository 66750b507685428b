/* kvquant.c — group quantization, anchor reconstruction and bf16 rounding per DESIGN.md "Numerics". */
#include "core/model/kvquant.h"

#include <math.h>
#include <string.h>

#include "core/model/gguf.h"

uint16_t kv_f32_to_f16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, or nan kept quiet */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a half subnormal, units of 2^-24 (exact scaling) */
        float f;
        memcpy(&f, &a, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(f * 16777216.0f));
    }
    /* normal: drop 13 mantissa bits, round half to even; a carry moves into the exponent */
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

float kv_bf16_round(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        b |= 0x00400000u; /* quiet nan */
    else
        b += 0x7fffu + ((b >> 16) & 1u);
    b &= 0xffff0000u;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

void kv_group_quantize(const float *x, size_t n, size_t stride, unsigned bits, uint16_t *codes, uint16_t *scale_h,
                       uint16_t *zero_h)
{
    float mn = INFINITY, mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float v = x[i * stride];
        if (isfinite(v)) {
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
    }
    float qmax = (float)((1u << bits) - 1u);
    if (mn > mx) { /* no finite value */
        *scale_h = 0;
        *zero_h = 0;
    } else {
        *scale_h = kv_f32_to_f16((mx - mn) / qmax);
        *zero_h = kv_f32_to_f16(mn);
    }
    float s = kv_half_to_float(*scale_h), z = kv_half_to_float(*zero_h);
    for (size_t i = 0; i < n; i++) {
        float v = x[i * stride], q;
        if (isnan(v) || v == -INFINITY)
            q = 0.0f;
        else if (v == INFINITY)
            q = qmax;
        else if (s == 0.0f)
            q = 0.0f;
        else {
            q = rintf((v - z) / s);
            q = q < 0.0f ? 0.0f : (q > qmax ? qmax : q);
        }
        codes[i] = (uint16_t)q;
    }
}

float kv_group_dequantize(uint16_t code, uint16_t scale_h, uint16_t zero_h)
{
    return fmaf((float)code, kv_half_to_float(scale_h), kv_half_to_float(zero_h));
}

float kv_group_dequantize_anchor(uint16_t code, unsigned bits, unsigned anchor_bits, uint16_t scale_h,
                                 uint16_t zero_h)
{
    unsigned r = bits - anchor_bits;
    uint32_t a = (uint32_t)code >> r;
    float mid = (float)(a << r) + (float)((1u << r) - 1u) / 2.0f;
    return fmaf(mid, kv_half_to_float(scale_h), kv_half_to_float(zero_h));
}

size_t kv_group_bytes(size_t n, unsigned bits, unsigned anchor_bits)
{
    if (anchor_bits > 0 && anchor_bits < bits)
        return (n * anchor_bits + 7) / 8 + (n * (bits - anchor_bits) + 7) / 8 + 4;
    return (n * bits + 7) / 8 + 4;
}
