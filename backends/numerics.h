/* numerics.h — the normative scalar numerics of docs/kernels.md "Numerics": fp16/bf16
 * conversion, group quantization parameters, codes, dequantization and the
 * anchor/residual split. Every backend must reproduce these bit for bit; the
 * CPU reference backend and the tests call them directly.
 *
 * The finer rules (docs/kernels.md "Numerics" N1-N6 states them too):
 *  N1. fp16 conversion is IEEE round-to-nearest-even with subnormals; a value
 *      whose magnitude rounds past 65504 becomes ±Inf; NaN stays a quiet NaN.
 *  N2. Metadata (scale, zero) saturates instead: a scale or zero whose fp16
 *      rounding would be ±Inf is stored as ±65504 (0x7bff / 0xfbff), so that
 *      dequantization of a stored group is always finite. (mx − mn can even
 *      overflow fp32 to +Inf; the stored scale is then 65504.)
 *  N3. mn and mx are canonicalised with `+ 0.0f`, which turns −0 into +0, so
 *      the metadata bits do not depend on the order of the min/max reduction.
 *  N4. Codes: NaN → 0, −Inf → 0, +Inf → 2^b − 1, decided before the s == 0
 *      rule (so +Inf is 2^b − 1 even in a constant group); otherwise 0 when
 *      s == 0, else clamp(rint((x − z) / s), 0, 2^b − 1) with correctly
 *      rounded fp32 division and round-half-even. Clamping before rounding
 *      gives the same result (the bounds are integers) and keeps the value
 *      below 2^23.
 *  N5. Out-of-range inputs to pack/split/merge are masked: pack stores
 *      code & (2^b − 1); split takes q & (2^b − 1) first; merge masks A to a
 *      bits and R to r bits. Unused bits of a group's last byte are 0.
 *  N6. bf16 rounding is round-to-nearest-even (overflow to ±Inf); NaN stays
 *      NaN: its top 16 bits with the quiet bit (0x0040) set.
 * No FMA contraction: the build passes -ffp-contract=off; fmaf is explicit.
 */
#ifndef KV_NUMERICS_H
#define KV_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t kv_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kv_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 → IEEE fp16 bits, round to nearest even (N1). */
static inline uint16_t kv_f16_from_f32(float f)
{
    uint32_t x = kv_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (halfway past 65504, odd mantissa): Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
        return (uint16_t)sign;
    if (ax < 0x38800000u) { /* below 2^-14: an fp16 subnormal, units of 2^-24 */
        uint32_t e = ax >> 23;                      /* 102..112 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;  /* with the hidden bit */
        uint32_t shift = 126u - e;                  /* value / 2^-24 = m >> shift */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++; /* may carry into the smallest normal, 0x0400: still correct */
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias the exponent from 127 to 15 */
    r += 0x0fffu + ((r >> 13) & 1u); /* round to nearest even; carries into the exponent */
    return (uint16_t)(sign | (r >> 13));
}

/* IEEE fp16 bits → fp32 (exact). */
static inline float kv_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f; /* exact: man < 2^10 */
        return kv_f32_from_bits(kv_f32_bits(v) | sign);
    }
    if (exp == 31)
        return kv_f32_from_bits(sign | 0x7f800000u | (man << 13));
    return kv_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* fp32 → fp16 bits for metadata: like kv_f16_from_f32 but ±Inf saturates to
   ±65504 (N2). Metadata inputs are never NaN. */
static inline uint16_t kv_f16_from_f32_sat(float f)
{
    uint16_t h = kv_f16_from_f32(f);
    if ((h & 0x7fffu) == 0x7c00u)
        h = (uint16_t)((h & 0x8000u) | 0x7bffu);
    return h;
}

/* fp32 → bf16 bits, round to nearest even (N6). */
static inline uint16_t kv_bf16_from_f32(float f)
{
    uint32_t x = kv_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float kv_bf16_to_f32(uint16_t h)
{
    return kv_f32_from_bits((uint32_t)h << 16);
}

/* Largest b-bit code, 2^b − 1, for 1 <= b <= 16. */
static inline uint32_t kv_code_max(unsigned bits)
{
    return (1u << bits) - 1u;
}

/* A group's quantization parameters: the stored fp16 bits and their fp32 values. */
typedef struct kv_qparams {
    uint16_t scale_h, zero_h; /* stored metadata, fp16 bits */
    float s, z;               /* fp32(scale_h), fp32(zero_h): what codes and dequantization use */
} kv_qparams;

/* Parameters from a group's finite min and max (have_finite = 0 when the group
   holds no finite value, or is empty: scale 0, zero 0). */
static inline kv_qparams kv_quant_params(float mn, float mx, int have_finite, unsigned bits)
{
    kv_qparams p = {0, 0, 0.0f, 0.0f};
    if (!have_finite)
        return p;
    mn = mn + 0.0f; /* N3: −0 → +0 */
    mx = mx + 0.0f;
    p.scale_h = kv_f16_from_f32_sat((mx - mn) / (float)kv_code_max(bits));
    p.zero_h = kv_f16_from_f32_sat(mn);
    p.s = kv_f16_to_f32(p.scale_h);
    p.z = kv_f16_to_f32(p.zero_h);
    return p;
}

/* The code of one value (N4). */
static inline uint16_t kv_quant_code(float x, float s, float z, unsigned bits)
{
    float maxq = (float)kv_code_max(bits);
    if (isnan(x))
        return 0;
    if (isinf(x))
        return x > 0.0f ? (uint16_t)kv_code_max(bits) : 0;
    if (s == 0.0f)
        return 0;
    float v = (x - z) / s; /* correctly rounded fp32 division, never NaN here */
    v = v < 0.0f ? 0.0f : v;
    v = v > maxq ? maxq : v;
    return (uint16_t)rintf(v); /* round half to even (the default rounding mode) */
}

/* Dequantization of a full b-bit code. */
static inline float kv_dequant(uint32_t q, float s, float z)
{
    return fmaf((float)q, s, z);
}

/* Anchor-only reconstruction at the midpoint of the anchor's bin of 2^r codes,
   r = b − a. (2^r − 1) / 2 is computed in float; every step is exact except the fma. */
static inline float kv_dequant_anchor(uint32_t anchor, unsigned r, float s, float z)
{
    float mid = (float)((1u << r) - 1u) / 2.0f;
    return fmaf((float)(anchor << r) + mid, s, z);
}

/* Split (N5): anchor = a MSBs, residual = r = b − a LSBs of q & (2^b − 1). */
static inline uint16_t kv_split_anchor(uint32_t q, unsigned bits, unsigned anchor_bits)
{
    return (uint16_t)((q & kv_code_max(bits)) >> (bits - anchor_bits));
}

static inline uint16_t kv_split_residual(uint32_t q, unsigned bits, unsigned anchor_bits)
{
    return (uint16_t)(q & kv_code_max(bits - anchor_bits));
}

static inline uint16_t kv_merge_code(uint32_t anchor, uint32_t residual, unsigned bits, unsigned anchor_bits)
{
    unsigned r = bits - anchor_bits;
    return (uint16_t)(((anchor & kv_code_max(anchor_bits)) << r) | (residual & kv_code_max(r)));
}

#endif
