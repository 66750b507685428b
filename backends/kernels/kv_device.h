/* kv_device.h — the dialect layer and the scalar numerics shared by the OpenCL,
 * CUDA and HIP kernels (backends/kernels/kernels.cl), so that one kernel source
 * serves every GPU-style backend.
 *
 * The same text is compiled as OpenCL C 1.2 (at run time, embedded in kvsim),
 * as CUDA C++ by nvcc, as HIP by hipcc, and as plain C11 by the tests (only
 * the scalar helpers, to check them against backends/numerics.h). Each
 * dialect maps a handful of names: fixed-width integer types (kv_u8 ...),
 * kernel and address-space qualifiers, work-item indices, barriers, bit casts
 * and the few math functions the kernels use. KV_FN marks device functions,
 * KV_FN_INLINE those that must be inlined (inner-loop bodies), KV_HD_FN the
 * integer layout helpers that CUDA/HIP host code calls as well.
 *
 * The scalar functions below are a transcription of backends/numerics.h
 * (the normative CPU numerics, choices N1..N6) into that common subset; any
 * change there must be repeated here, and the conformance suite checks that
 * both agree bit for bit.
 *
 * Division. Quantization needs correctly rounded fp32 division. kv_div_rn
 * uses, by KV_DIV_MODE: 0 the native `/` (OpenCL built with
 * -cl-fp32-correctly-rounded-divide-sqrt on a device that reports
 * CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT; CUDA's __fdiv_rn; HIP's correctly
 * rounded default), 1 division in double and one rounding to float (correct:
 * 53 >= 2*24 + 2, so the double rounding is innocuous), 2 an integer long
 * division (kv_div_soft) for devices with neither.
 */
#ifndef KV_DEVICE_H
#define KV_DEVICE_H

#ifndef KV_DIV_MODE
#define KV_DIV_MODE 0
#endif

#if defined(__OPENCL_VERSION__) /* ---------------------------------- OpenCL C 1.2 */

#pragma OPENCL FP_CONTRACT OFF
#if KV_DIV_MODE == 1
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef uchar kv_u8;
typedef ushort kv_u16;
typedef uint kv_u32;
typedef int kv_i32;
typedef ulong kv_u64;
#define KV_KERNEL __kernel void
#define KV_GLOBAL __global
#define KV_LOCAL __local
#define KV_FN static inline
#define KV_FN_INLINE static inline __attribute__((always_inline)) /* inner-loop bodies: a call there stops vectorisation */
#define KV_HD_FN static inline
#define KV_GLOBAL_ID() ((kv_u64)get_global_id(0))
#define KV_LOCAL_ID() ((kv_u32)get_local_id(0))
#define KV_GROUP_ID() ((kv_u64)get_group_id(0))
#define KV_GLOBAL_SIZE() ((kv_u64)get_global_size(0))
#define KV_NUM_GROUPS() ((kv_u64)get_num_groups(0))
#define KV_BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#define KV_KERNEL_END() ((void)0)
#define KV_F32_BITS(f) as_uint(f)
#define KV_F32_FROM_BITS(u) as_float(u)
#define KV_FMA(a, b, c) fma((a), (b), (c))
#define KV_RINT(x) rint(x)
#define KV_EXP(x) exp(x)
#define KV_ISNAN(x) isnan(x)
#define KV_ISINF(x) isinf(x)
#define KV_ISFINITE(x) isfinite(x)
#define KV_INF INFINITY

#elif defined(__CUDACC__) || defined(__HIPCC__) /* ------------------ CUDA and HIP */

typedef unsigned char kv_u8;
typedef unsigned short kv_u16;
typedef unsigned int kv_u32;
typedef int kv_i32;
typedef unsigned long long kv_u64;
#define KV_KERNEL extern "C" __global__ void
#define KV_GLOBAL
#define KV_LOCAL __shared__
#define KV_FN static __device__ __forceinline__
#define KV_FN_INLINE KV_FN
#define KV_HD_FN static __host__ __device__ __forceinline__ /* also used by the host code */
#define KV_GLOBAL_ID() ((kv_u64)blockIdx.x * (kv_u64)blockDim.x + (kv_u64)threadIdx.x)
#define KV_LOCAL_ID() ((kv_u32)threadIdx.x)
#define KV_GROUP_ID() ((kv_u64)blockIdx.x)
#define KV_GLOBAL_SIZE() ((kv_u64)gridDim.x * (kv_u64)blockDim.x)
#define KV_NUM_GROUPS() ((kv_u64)gridDim.x)
#define KV_BARRIER() __syncthreads()
#define KV_KERNEL_END() ((void)0)
#define KV_F32_BITS(f) __float_as_uint(f)
#define KV_F32_FROM_BITS(u) __uint_as_float(u)
#define KV_FMA(a, b, c) fmaf((a), (b), (c))
#define KV_RINT(x) rintf(x)
#define KV_EXP(x) expf(x)
#define KV_ISNAN(x) isnan(x)
#define KV_ISINF(x) isinf(x)
#define KV_ISFINITE(x) isfinite(x)
#define KV_INF __uint_as_float(0x7f800000u)

#elif defined(KV_ASCEND_KERNEL) /* ------------------- Ascend C (never compiled here) */

/* The Ascend port runs every kernel as scalar code on one AI Core (the host
   launches a single block): scalar writes to global memory go through each
   core's data cache and are written back a 64-byte line at a time, so two
   cores writing neighbouring outputs would overwrite each other. A work-group
   is one work-item (KV_WG 1): local arrays are plain arrays, barriers vanish.
   Division, fma and rint are the integer versions (KV_DIV_MODE 2,
   kv_fma_soft, kv_rint_soft_u32; the tests check them against IEEE), exp the
   float polynomial: the AI Core's scalar math is not documented as IEEE. Each
   kernel ends by writing its data cache back (KV_KERNEL_END). */
#include "kernel_operator.h"
typedef uint8_t kv_u8;
typedef uint16_t kv_u16;
typedef uint32_t kv_u32;
typedef int32_t kv_i32;
typedef uint64_t kv_u64;
#define KV_KERNEL extern "C" __global__ __aicore__ void
#define KV_GLOBAL __gm__
#define KV_LOCAL
#define KV_FN static __aicore__ inline
#define KV_FN_INLINE KV_FN
#define KV_HD_FN static __aicore__ inline
#define KV_GLOBAL_ID() ((kv_u64)AscendC::GetBlockIdx())
#define KV_LOCAL_ID() 0u
#define KV_GROUP_ID() ((kv_u64)AscendC::GetBlockIdx())
#define KV_GLOBAL_SIZE() ((kv_u64)AscendC::GetBlockNum())
#define KV_NUM_GROUPS() ((kv_u64)AscendC::GetBlockNum())
#define KV_BARRIER() ((void)0)
static __aicore__ inline void kv_ascend_flush(void)
{
    AscendC::GlobalTensor<uint8_t> any; /* ENTIRE_DATA_CACHE does not look at the address */
    AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::ENTIRE_DATA_CACHE, AscendC::DcciDst::CACHELINE_OUT>(any);
}
#define KV_KERNEL_END() kv_ascend_flush()
union kv_ascend_pun {
    float f;
    uint32_t u;
};
static __aicore__ inline uint32_t kv_ascend_bits(float f)
{
    union kv_ascend_pun p;
    p.f = f;
    return p.u;
}
static __aicore__ inline float kv_ascend_float(uint32_t u)
{
    union kv_ascend_pun p;
    p.u = u;
    return p.f;
}
#define KV_F32_BITS(f) kv_ascend_bits(f)
#define KV_F32_FROM_BITS(u) kv_ascend_float(u)
#define KV_FMA(a, b, c) kv_fma_soft((a), (b), (c))
#define KV_RINT_U32(x) kv_rint_soft_u32(x)
#define KV_EXP(x) kv_exp_soft(x)
#define KV_ISNAN(x) ((KV_F32_BITS(x) & 0x7fffffffu) > 0x7f800000u)
#define KV_ISINF(x) ((KV_F32_BITS(x) & 0x7fffffffu) == 0x7f800000u)
#define KV_ISFINITE(x) ((KV_F32_BITS(x) & 0x7f800000u) != 0x7f800000u)
#define KV_INF KV_F32_FROM_BITS(0x7f800000u)
#undef KV_DIV_MODE
#define KV_DIV_MODE 2
#undef KV_WG
#define KV_WG 1

#else /* ------------------------------------------- host C11 (tests of the helpers) */

#include <math.h>
#include <stdint.h>
#include <string.h>
typedef uint8_t kv_u8;
typedef uint16_t kv_u16;
typedef uint32_t kv_u32;
typedef int32_t kv_i32;
typedef uint64_t kv_u64;
#define KV_GLOBAL
#define KV_FN static inline
#define KV_FN_INLINE static inline
#define KV_HD_FN static inline
static inline uint32_t kv_dev_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float kv_dev_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define KV_F32_BITS(f) kv_dev_f32_bits(f)
#define KV_F32_FROM_BITS(u) kv_dev_f32_from_bits(u)
#define KV_FMA(a, b, c) fmaf((a), (b), (c))
#define KV_RINT(x) rintf(x)
#define KV_EXP(x) expf(x)
#define KV_ISNAN(x) isnan(x)
#define KV_ISINF(x) isinf(x)
#define KV_ISFINITE(x) isfinite(x)
#define KV_INF INFINITY

#endif

#ifndef KV_RINT_U32
#define KV_RINT_U32(x) ((kv_u32)KV_RINT(x))
#endif

/* ---- Correctly rounded fp32 division ------------------------------------------- */

/* a / b correctly rounded to nearest even, by integer long division; every IEEE
   case (zeros, infinities, NaN, subnormal operands and results) included.
   Used when the device offers neither a correctly rounded `/` nor doubles. */
KV_FN float kv_div_soft(float a, float b)
{
    kv_u32 ua = KV_F32_BITS(a), ub = KV_F32_BITS(b);
    kv_u32 sign = (ua ^ ub) & 0x80000000u;
    kv_i32 ea = (kv_i32)((ua >> 23) & 0xffu), eb = (kv_i32)((ub >> 23) & 0xffu);
    kv_u32 ma = ua & 0x7fffffu, mb = ub & 0x7fffffu;
    if (ea == 255 || eb == 255) {
        if (ea == 255 && ma)
            return KV_F32_FROM_BITS(ua | 0x400000u); /* NaN in, quiet NaN out */
        if (eb == 255 && mb)
            return KV_F32_FROM_BITS(ub | 0x400000u);
        if (ea == 255 && eb == 255)
            return KV_F32_FROM_BITS(0x7fc00000u); /* Inf / Inf */
        return KV_F32_FROM_BITS(ea == 255 ? sign | 0x7f800000u : sign);
    }
    if (eb == 0 && mb == 0) /* x / 0 */
        return KV_F32_FROM_BITS((ea == 0 && ma == 0) ? 0x7fc00000u : (sign | 0x7f800000u));
    if (ea == 0 && ma == 0)
        return KV_F32_FROM_BITS(sign);
    /* Normalise both significands to [2^23, 2^24) with unbiased exponents. */
    if (ea == 0) {
        ea = 1;
        while (!(ma & 0x800000u)) {
            ma <<= 1;
            ea--;
        }
    } else {
        ma |= 0x800000u;
    }
    if (eb == 0) {
        eb = 1;
        while (!(mb & 0x800000u)) {
            mb <<= 1;
            eb--;
        }
    } else {
        mb |= 0x800000u;
    }
    kv_i32 e = ea - eb + 127; /* biased exponent of the quotient once it is in [1, 2) */
    if (ma < mb) {
        ma <<= 1;
        e--;
    }
    /* q in [2^26, 2^27): 24 significant bits and 3 more; the remainder is the sticky bit. */
    kv_u64 num = (kv_u64)ma << 26;
    kv_u32 q = (kv_u32)(num / mb);
    kv_u32 sticky = (num % mb) != 0;
    if (e >= 255)
        return KV_F32_FROM_BITS(sign | 0x7f800000u);
    kv_u32 drop = 3; /* bits of q below the result's last place */
    if (e <= 0) {    /* subnormal result: fewer significant bits */
        kv_u32 extra = (kv_u32)(1 - e);
        if (extra > 27) {
            sticky |= q != 0;
            q = 0;
        } else {
            sticky |= (q & ((1u << extra) - 1u)) != 0;
            q >>= extra;
        }
        e = 0;
    }
    kv_u32 keep = q >> drop;
    kv_u32 rem = q & ((1u << drop) - 1u), halfway = 1u << (drop - 1u);
    kv_u32 up = rem > halfway || (rem == halfway && (sticky || (keep & 1u)));
    /* keep carries the hidden bit for a normal result: adding (e - 1) << 23
       places the exponent; a rounding carry moves into the exponent, and up to
       Inf at the top, as IEEE wants. */
    kv_u32 bits = e > 0 ? ((kv_u32)(e - 1) << 23) + keep : keep;
    bits += up;
    if (bits >= 0x7f800000u)
        bits = 0x7f800000u;
    return KV_F32_FROM_BITS(sign | bits);
}

/* Position of the highest set bit of x != 0. */
KV_FN kv_u32 kv_dev_msb64(kv_u64 x)
{
    kv_u32 k = 0;
    while (x >>= 1)
        k++;
    return k;
}

/* Splits a finite non-zero float into m * 2^e with m < 2^24 an integer. */
KV_FN kv_u32 kv_dev_unpack_f32(kv_u32 u, kv_i32 *e)
{
    kv_u32 ex = (u >> 23) & 0xffu, m = u & 0x7fffffu;
    if (ex == 0) {
        *e = -149;
        return m;
    }
    *e = (kv_i32)ex - 150;
    return m | 0x800000u;
}

/* Rounds the exact value r * 2^e (r > 0) to the nearest-even float of the
   given sign, with subnormals and overflow to Inf. */
KV_FN float kv_dev_round_f32(kv_u32 sign, kv_u64 r, kv_i32 e)
{
    kv_i32 k = (kv_i32)kv_dev_msb64(r);
    kv_i32 top = e + k; /* r * 2^e lies in [2^top, 2^(top + 1)) */
    if (top > 127)
        return KV_F32_FROM_BITS(sign | 0x7f800000u);
    kv_i32 biased = top + 127;
    kv_i32 shift = biased >= 1 ? k - 23 : -149 - e; /* bits of r below the result's last place */
    kv_u64 q;
    kv_u32 up = 0;
    if (shift <= 0) {
        q = r << (kv_u32)(-shift); /* exact */
    } else if (shift >= 64) {
        q = 0; /* below half the smallest subnormal */
    } else {
        q = r >> (kv_u32)shift;
        kv_u64 rem = r & (((kv_u64)1 << (kv_u32)shift) - 1u), halfway = (kv_u64)1 << (kv_u32)(shift - 1);
        up = rem > halfway || (rem == halfway && (q & 1u));
    }
    kv_u32 bits = biased >= 1 ? ((kv_u32)(biased - 1) << 23) + (kv_u32)q : (kv_u32)q;
    bits += up; /* a carry moves into the exponent, up to Inf */
    if (bits >= 0x7f800000u)
        bits = 0x7f800000u;
    return KV_F32_FROM_BITS(sign | bits);
}

/* fmaf(a, b, c) with one rounding, in integer arithmetic: for devices whose
   fused multiply-add is not known to be IEEE (the Ascend port). */
KV_FN float kv_fma_soft(float a, float b, float c)
{
    kv_u32 ua = KV_F32_BITS(a), ub = KV_F32_BITS(b), uc = KV_F32_BITS(c);
    kv_u32 sp = (ua ^ ub) & 0x80000000u, sc = uc & 0x80000000u;
    kv_u32 aa = ua & 0x7fffffffu, ab = ub & 0x7fffffffu, ac = uc & 0x7fffffffu;
    if (aa > 0x7f800000u || ab > 0x7f800000u || ac > 0x7f800000u)
        return KV_F32_FROM_BITS(0x7fc00000u);
    if (aa == 0x7f800000u || ab == 0x7f800000u) {
        if (aa == 0 || ab == 0 || (ac == 0x7f800000u && sc != sp))
            return KV_F32_FROM_BITS(0x7fc00000u); /* Inf * 0, Inf - Inf */
        return KV_F32_FROM_BITS(sp | 0x7f800000u);
    }
    if (ac == 0x7f800000u)
        return c;
    if (aa == 0 || ab == 0) { /* exact zero product: ±0 + c */
        if (ac == 0)
            return KV_F32_FROM_BITS(sp & sc);
        return c;
    }
    kv_i32 ea, eb, ec = 0;
    kv_u64 p = (kv_u64)kv_dev_unpack_f32(aa, &ea) * kv_dev_unpack_f32(ab, &eb); /* exact, < 2^48 */
    kv_i32 ep = ea + eb;
    if (ac == 0)
        return kv_dev_round_f32(sp, p, ep);
    kv_u64 m = kv_dev_unpack_f32(ac, &ec);
    /* Both terms with their leading bit at 61, then the smaller shifted right
       with a sticky bit (36+ guard bits keep it clear of the rounding place). */
    kv_i32 kp = (kv_i32)kv_dev_msb64(p), kc = (kv_i32)kv_dev_msb64(m);
    p <<= (kv_u32)(61 - kp);
    ep -= 61 - kp;
    m <<= (kv_u32)(61 - kc);
    ec -= 61 - kc;
    kv_u64 big = p, small = m;
    kv_i32 e = ep, d = ep - ec;
    kv_u32 sbig = sp, ssmall = sc;
    if (d < 0 || (d == 0 && m > p)) {
        big = m;
        small = p;
        e = ec;
        d = -d;
        sbig = sc;
        ssmall = sp;
    }
    if (d >= 64)
        small = small != 0;
    else if (d > 0)
        small = (small >> (kv_u32)d) | ((small & (((kv_u64)1 << (kv_u32)d) - 1u)) != 0);
    kv_u64 r = sbig == ssmall ? big + small : big - small;
    if (r == 0)
        return KV_F32_FROM_BITS(0); /* exact cancellation: +0 */
    return kv_dev_round_f32(sbig, r, e);
}

/* rint for 0 <= v < 2^23 (the clamped quotient of quantization), in integer
   arithmetic: exact, round half to even. */
KV_FN kv_u32 kv_rint_soft_u32(float v)
{
    kv_u32 i = (kv_u32)v; /* truncation */
    float frac = v - (float)i; /* exact */
    if (frac > 0.5f || (frac == 0.5f && (i & 1u)))
        i++;
    return i;
}

/* e^x in float arithmetic (Cody-Waite reduction, degree-7 polynomial): about
   2 ulp, for devices without a library exp (the Ascend port's attention,
   which needs relative 1e-5, not bit-exactness). */
KV_FN float kv_exp_soft(float x)
{
    if (x != x)
        return x;
    if (x > 88.72283f)
        return KV_F32_FROM_BITS(0x7f800000u);
    if (x < -103.97208f)
        return 0.0f;
    float kf = x * 1.44269504f;
    kv_i32 k = (kv_i32)(kf < 0.0f ? kf - 0.5f : kf + 0.5f);
    float r = (x - (float)k * 0.693145752f) - (float)k * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f +
              r * (8.33333377e-3f + r * (1.38888892e-3f + r * 1.98412701e-4f))))));
    /* p * 2^k, in two steps so that 2^k never leaves the normal range */
    kv_i32 k1 = k / 2, k2 = k - k1;
    p = p * KV_F32_FROM_BITS((kv_u32)(k1 + 127) << 23);
    return p * KV_F32_FROM_BITS((kv_u32)(k2 + 127) << 23);
}

KV_FN float kv_div_rn(float a, float b)
{
#if KV_DIV_MODE == 2
    return kv_div_soft(a, b);
#elif KV_DIV_MODE == 1
    return (float)((double)a / (double)b);
#elif defined(__CUDACC__) || defined(__HIPCC__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- fp16 and bf16 (numerics.h N1, N2, N6) ------------------------------------- */

KV_FN kv_u16 kv_dev_f16_from_f32(float f)
{
    kv_u32 x = KV_F32_BITS(f);
    kv_u32 sign = (x >> 16) & 0x8000u;
    kv_u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (kv_u16)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u)
        return (kv_u16)(sign | 0x7c00u);
    if (ax < 0x33000000u)
        return (kv_u16)sign;
    if (ax < 0x38800000u) {
        kv_u32 e = ax >> 23;
        kv_u32 m = (ax & 0x7fffffu) | 0x800000u;
        kv_u32 shift = 126u - e;
        kv_u32 q = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u)))
            q++;
        return (kv_u16)(sign | q);
    }
    kv_u32 r = ax - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return (kv_u16)(sign | (r >> 13));
}

KV_FN float kv_dev_f16_to_f32(kv_u32 h)
{
    /* Branch-free (every case computed, one selected), so that loops of
       conversions vectorise. */
    kv_u32 sign = (h & 0x8000u) << 16;
    kv_u32 exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float sub = (float)man * 5.9604644775390625e-8f; /* 2^-24; exact */
    kv_u32 subnormal = KV_F32_BITS(sub) | sign;
    kv_u32 special = sign | 0x7f800000u | (man << 13);
    kv_u32 normal = sign | ((exp + 112u) << 23) | (man << 13);
    return KV_F32_FROM_BITS(exp == 0 ? subnormal : exp == 31 ? special : normal);
}

/* Metadata: ±Inf saturates to ±65504 (N2). */
KV_FN kv_u16 kv_dev_f16_from_f32_sat(float f)
{
    kv_u16 h = kv_dev_f16_from_f32(f);
    if ((h & 0x7fffu) == 0x7c00u)
        h = (kv_u16)((h & 0x8000u) | 0x7bffu);
    return h;
}

KV_FN kv_u16 kv_dev_bf16_from_f32(float f)
{
    kv_u32 x = KV_F32_BITS(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (kv_u16)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (kv_u16)(x >> 16);
}

KV_FN float kv_dev_bf16_to_f32(kv_u32 h)
{
    return KV_F32_FROM_BITS((h & 0xffffu) << 16);
}

/* ---- Quantization (N3, N4) and dequantization --------------------------------------- */

KV_FN kv_u32 kv_dev_code_max(kv_u32 bits)
{
    return (1u << bits) - 1u;
}

/* Stored metadata of a group from its finite min and max; scale_h in the low
   16 bits, zero_h in the high 16 bits. have == 0: no finite value. */
KV_FN kv_u32 kv_dev_quant_meta(float mn, float mx, int have, kv_u32 bits)
{
    if (!have)
        return 0;
    mn = mn + 0.0f; /* N3: -0 becomes +0 */
    mx = mx + 0.0f;
    kv_u32 scale_h = kv_dev_f16_from_f32_sat(kv_div_rn(mx - mn, (float)kv_dev_code_max(bits)));
    kv_u32 zero_h = kv_dev_f16_from_f32_sat(mn);
    return scale_h | (zero_h << 16);
}

KV_FN kv_u32 kv_dev_quant_code(float x, float s, float z, kv_u32 bits)
{
    float maxq = (float)kv_dev_code_max(bits);
    if (KV_ISNAN(x))
        return 0;
    if (KV_ISINF(x))
        return x > 0.0f ? kv_dev_code_max(bits) : 0u;
    if (s == 0.0f)
        return 0;
    float v = kv_div_rn(x - z, s);
    v = v < 0.0f ? 0.0f : v;
    v = v > maxq ? maxq : v;
    return KV_RINT_U32(v);
}

KV_FN float kv_dev_dequant(kv_u32 q, float s, float z)
{
    return KV_FMA((float)q, s, z);
}

/* Anchor-only reconstruction at its bin's midpoint; r = b - a. */
KV_FN float kv_dev_dequant_anchor(kv_u32 anchor, kv_u32 r, float s, float z)
{
    float mid = (float)((1u << r) - 1u) / 2.0f; /* exact */
    return KV_FMA((float)(anchor << r) + mid, s, z);
}

/* ---- Layout arithmetic (backend.h's file comment; same as backend.c) ---------------- */

typedef struct kv_dev_layout {
    kv_u32 rows, cols, group_size, grouping; /* grouping: 0 TOKEN, 1 CHANNEL */
} kv_dev_layout;

KV_HD_FN kv_u64 kv_dev_ceil_div(kv_u64 a, kv_u64 b)
{
    return (a + b - 1) / b;
}

KV_HD_FN kv_u64 kv_dev_groups(kv_dev_layout l)
{
    if (l.grouping == 0)
        return (kv_u64)l.rows * kv_dev_ceil_div(l.cols, l.group_size);
    return kv_dev_ceil_div(l.rows, l.group_size) * l.cols;
}

KV_HD_FN kv_u32 kv_dev_group_len(kv_dev_layout l, kv_u64 g)
{
    if (l.grouping == 0) {
        kv_u64 per_row = kv_dev_ceil_div(l.cols, l.group_size);
        kv_u64 left = l.cols - (g % per_row) * l.group_size;
        return (kv_u32)(left < l.group_size ? left : l.group_size);
    }
    kv_u64 left = l.rows - (g / l.cols) * l.group_size;
    return (kv_u32)(left < l.group_size ? left : l.group_size);
}

/* Bytes of one group's stream of n codes at `bits` bits. */
KV_HD_FN kv_u64 kv_dev_stream_bytes(kv_u64 n, kv_u32 bits)
{
    return (n * bits + 7) / 8;
}

/* Byte offset of group g's stream in a packed plane of `bits`-bit codes. */
KV_HD_FN kv_u64 kv_dev_group_offset(kv_dev_layout l, kv_u32 bits, kv_u64 g)
{
    kv_u64 full = kv_dev_stream_bytes(l.group_size, bits);
    if (l.grouping == 0) {
        kv_u64 per_row = kv_dev_ceil_div(l.cols, l.group_size);
        kv_u64 last = l.cols % l.group_size;
        kv_u64 row_bytes = (l.cols / l.group_size) * full + (last ? kv_dev_stream_bytes(last, bits) : 0);
        return (g / per_row) * row_bytes + (g % per_row) * full;
    }
    kv_u64 block = g / l.cols, col = g % l.cols;
    return block * l.cols * full + col * kv_dev_stream_bytes(kv_dev_group_len(l, g), bits);
}

/* Index (row * cols + col) of element i of group g. */
KV_HD_FN kv_u64 kv_dev_group_elem(kv_dev_layout l, kv_u64 g, kv_u32 i)
{
    if (l.grouping == 0) {
        kv_u64 per_row = kv_dev_ceil_div(l.cols, l.group_size);
        return (g / per_row) * l.cols + (g % per_row) * l.group_size + i;
    }
    return ((g / l.cols) * l.group_size + i) * l.cols + g % l.cols;
}

/* Attention's split over the context (kernels.cl, kv_attention): how many
   chunks each KV head's page list is cut into. It depends on the launch's
   shape only, never on the device, so every backend splits alike: chunks of
   at least KV_SPLIT_PAGES pages (a chunk's partial result costs head_dim + 3
   floats and the merge reads them all), at most KV_MAX_SPLITS chunks. */
#define KV_SPLIT_PAGES 16u
#define KV_MAX_SPLITS 32u
KV_HD_FN kv_u32 kv_dev_attn_splits(kv_u32 n_pages, kv_u32 n_kv_heads)
{
    kv_u32 per_head = n_kv_heads ? n_pages / n_kv_heads : 0;
    kv_u32 s = per_head / KV_SPLIT_PAGES;
    return s < 1 ? 1 : s > KV_MAX_SPLITS ? KV_MAX_SPLITS : s;
}

/* Group and position in the group of element (row, col): returns g, sets *i. */
KV_HD_FN kv_u64 kv_dev_elem_group(kv_dev_layout l, kv_u64 row, kv_u64 col, kv_u32 *i)
{
    if (l.grouping == 0) {
        *i = (kv_u32)(col % l.group_size);
        return row * kv_dev_ceil_div(l.cols, l.group_size) + col / l.group_size;
    }
    *i = (kv_u32)(row % l.group_size);
    return (row / l.group_size) * l.cols + col;
}

#endif
