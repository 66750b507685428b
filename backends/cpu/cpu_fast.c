/* cpu_fast.c — the CPU backend's fast quantization paths: fused encode
 * (quantize + split + pack) and decode (unpack + merge + dequantize), plus
 * pack and unpack, in a portable version and an AVX-512 version chosen at
 * run time. Both must equal the reference kernels (cpu_ref.c) bit for bit:
 * the conformance suite and `kvsim bench kernels` check it.
 *
 * Why they are bit-exact: every value goes through the same IEEE operations
 * as numerics.h — fp32 subtraction, correctly rounded division (vdivps),
 * conversion with the default round-to-nearest-even mode (vcvtps2dq == rint
 * on a value already clamped to [0, 2^b − 1]; maxps returns its second
 * operand for NaN, which maps NaN to 0 as N4 requires), and a single-rounding
 * fma for dequantization. The min/max reduction order does not matter because
 * the result is canonicalised (N3).
 *
 * Each group is processed contiguously: a KV_GROUP_CHANNEL group is gathered
 * into a scratch array first and scattered back on decode. Packing works on
 * chunks of 8 codes, which always fill exactly w bytes of a w-bit stream. */
#include <stdint.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/numerics.h"
#include "core/alloc.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_HAVE_X86 1
#include <immintrin.h>
#endif

/* ---- Portable streams ------------------------------------------------------ */

/* Packs the w-bit field (c >> shift) & (2^w − 1) of n codes into a stream. */
static void pack_stream(const uint16_t *c, uint32_t n, unsigned shift, unsigned w, uint8_t *out)
{
    uint64_t acc = 0;
    unsigned nb = 0;
    uint32_t mask = kv_code_max(w);
    for (uint32_t i = 0; i < n; i++) {
        acc |= (uint64_t)((c[i] >> shift) & mask) << nb;
        nb += w;
        while (nb >= 8) {
            *out++ = (uint8_t)acc;
            acc >>= 8;
            nb -= 8;
        }
    }
    if (nb)
        *out = (uint8_t)acc;
}

/* Reads n w-bit codes of a stream, reading no byte past its end. */
static void unpack_stream(const uint8_t *in, uint32_t n, unsigned w, uint16_t *c)
{
    uint64_t acc = 0;
    unsigned nb = 0;
    uint32_t mask = kv_code_max(w);
    for (uint32_t i = 0; i < n; i++) {
        while (nb < w) {
            acc |= (uint64_t)*in++ << nb;
            nb += 8;
        }
        c[i] = (uint16_t)(acc & mask);
        acc >>= w;
        nb -= w;
    }
}

typedef kv_cpu_scratch scratch;

void kv_cpu_scratch_init(kv_cpu_scratch *s, uint32_t group_size)
{
    s->cap = ((size_t)group_size + 15) / 16 * 16 + 32;
    s->x = kv_malloc(s->cap * sizeof *s->x);
    s->a = kv_calloc(s->cap, sizeof *s->a);
    s->r = kv_calloc(s->cap, sizeof *s->r);
}

void kv_cpu_scratch_free(kv_cpu_scratch *s)
{
    if (!s)
        return;
    kv_free(s->x);
    kv_free(s->a);
    kv_free(s->r);
    memset(s, 0, sizeof *s);
}

/* Uses the caller's scratch if it is large enough, else a private one. */
static scratch *scratch_get(scratch *given, scratch *own, uint32_t group_size)
{
    if (given && given->cap >= ((size_t)group_size + 15) / 16 * 16 + 32)
        return given;
    kv_cpu_scratch_init(own, group_size);
    return own;
}

static void scratch_put(scratch *used, scratch *own)
{
    if (used == own)
        kv_cpu_scratch_free(own);
}

/* The group's values, contiguous: the input itself when stride is 1. */
static const float *gather(const float *x, cpu_group_view v, scratch *s)
{
    if (v.stride == 1)
        return x + v.first;
    for (uint32_t i = 0; i < v.len; i++)
        s->x[i] = x[v.first + i * v.stride];
    return s->x;
}

/* ---- Portable encode / decode ---------------------------------------------- */

static void encode_group_generic(const float *xs, uint32_t n, unsigned bits, unsigned abits, uint8_t *aout,
                                 uint8_t *rout, uint16_t *scale, uint16_t *zero, scratch *s)
{
    float mn = 0.0f, mx = 0.0f;
    int have = 0;
    for (uint32_t i = 0; i < n; i++) {
        float xi = xs[i];
        if (xi - xi != 0.0f) /* NaN or ±Inf */
            continue;
        mn = have && mn < xi ? mn : xi;
        mx = have && mx > xi ? mx : xi;
        have = 1;
    }
    kv_qparams p = kv_quant_params(mn, mx, have, bits);
    *scale = p.scale_h;
    *zero = p.zero_h;
    for (uint32_t i = 0; i < n; i++)
        s->a[i] = kv_quant_code(xs[i], p.s, p.z, bits);
    if (abits) {
        pack_stream(s->a, n, bits - abits, abits, aout);
        pack_stream(s->a, n, 0, bits - abits, rout);
    } else {
        pack_stream(s->a, n, 0, bits, aout);
    }
}

static void decode_group_generic(const uint8_t *ain, const uint8_t *rin, uint32_t n, unsigned bits,
                                 unsigned abits, float sc, float zr, float *out, size_t stride, scratch *s)
{
    unsigned r = bits - abits;
    if (!abits) {
        unpack_stream(ain, n, bits, s->a);
        for (uint32_t i = 0; i < n; i++)
            out[i * stride] = kv_dequant(s->a[i], sc, zr);
    } else if (!rin) {
        unpack_stream(ain, n, abits, s->a);
        for (uint32_t i = 0; i < n; i++)
            out[i * stride] = kv_dequant_anchor(s->a[i], r, sc, zr);
    } else {
        unpack_stream(ain, n, abits, s->a);
        unpack_stream(rin, n, r, s->r);
        for (uint32_t i = 0; i < n; i++)
            out[i * stride] = kv_dequant(((uint32_t)s->a[i] << r) | s->r[i], sc, zr);
    }
}

/* ---- AVX-512 (with BMI2 for pext/pdep) -------------------------------------- */

#ifdef KV_HAVE_X86
#define KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,fma")))

static inline uint64_t lane_mask(unsigned w) /* low w bits of each of four 16-bit lanes */
{
    uint64_t m = kv_code_max(w);
    return m | m << 16 | m << 32 | m << 48;
}

/* Packs n codes (u16, zero-padded to a multiple of 8) of width w into
   ceil(n*w/8) bytes. 8 codes fill exactly w bytes, so every chunk starts on a
   byte; a chunk is written with one 16-byte store while that stays inside the
   stream (later chunks overwrite the excess), bytewise at the end. */
KV_AVX512 static void pack_stream_bmi2(const uint16_t *c, uint32_t n, unsigned w, uint8_t *out)
{
    size_t total = ((size_t)n * w + 7) / 8, done = 0;
    uint64_t m = lane_mask(w);
    for (uint32_t i = 0; done < total; i += 8) {
        uint64_t lo, hi;
        memcpy(&lo, c + i, 8);
        memcpy(&hi, c + i + 4, 8);
        unsigned __int128 v = (unsigned __int128)_pext_u64(lo, m) | (unsigned __int128)_pext_u64(hi, m) << (4 * w);
        if (total - done >= 16) {
            memcpy(out + done, &v, 16);
        } else {
            size_t k = total - done < w ? total - done : w;
            memcpy(out + done, &v, k);
        }
        done += w;
    }
}

/* Unpacks n codes of width w (n rounded up to 8 in c, garbage-free: the pad
   codes come out as zero bits or as the stream's own zero padding). */
KV_AVX512 static void unpack_stream_bmi2(const uint8_t *in, uint32_t n, unsigned w, uint16_t *c)
{
    size_t total = ((size_t)n * w + 7) / 8, done = 0;
    uint64_t m = lane_mask(w);
    uint64_t low = w * 4 == 64 ? ~0ull : (1ull << (4 * w)) - 1;
    for (uint32_t i = 0; i < n; i += 8) {
        unsigned __int128 v = 0;
        if (total - done >= 16)
            memcpy(&v, in + done, 16);
        else
            memcpy(&v, in + done, total - done < w ? total - done : w);
        uint64_t lo = _pdep_u64((uint64_t)v & low, m);
        uint64_t hi = _pdep_u64((uint64_t)(v >> (4 * w)) & low, m);
        memcpy(c + i, &lo, 8);
        memcpy(c + i + 4, &hi, 8);
        done += w;
    }
}

KV_AVX512 static void encode_group_avx512(const float *xs, uint32_t n, unsigned bits, unsigned abits, uint8_t *aout,
                                          uint8_t *rout, uint16_t *scale, uint16_t *zero, scratch *s)
{
    const __m512 zero_v = _mm512_setzero_ps();
    __m512 vmn = _mm512_set1_ps(__builtin_inff()), vmx = _mm512_set1_ps(-__builtin_inff());
    for (uint32_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(m, xs + i);
        __mmask16 fin = _mm512_mask_cmp_ps_mask(m, _mm512_sub_ps(x, x), zero_v, _CMP_EQ_OQ);
        vmn = _mm512_mask_min_ps(vmn, fin, vmn, x);
        vmx = _mm512_mask_max_ps(vmx, fin, vmx, x);
    }
    float mn = _mm512_reduce_min_ps(vmn), mx = _mm512_reduce_max_ps(vmx);
    kv_qparams p = kv_quant_params(mn, mx, mn <= mx, bits);
    *scale = p.scale_h;
    *zero = p.zero_h;
    uint32_t padded = (n + 15) / 16 * 16;
    if (p.s == 0.0f) {
        for (uint32_t i = 0; i < n; i++)
            s->a[i] = kv_quant_code(xs[i], p.s, p.z, bits);
        for (uint32_t i = n; i < padded; i++)
            s->a[i] = 0;
    } else {
        const __m512 vz = _mm512_set1_ps(p.z), vs = _mm512_set1_ps(p.s);
        const __m512 vmax = _mm512_set1_ps((float)kv_code_max(bits));
        for (uint32_t i = 0; i < n; i += 16) {
            __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
            __m512 x = _mm512_maskz_loadu_ps(m, xs + i);
            __m512 v = _mm512_div_ps(_mm512_sub_ps(x, vz), vs);
            v = _mm512_max_ps(v, zero_v); /* NaN → 0 (second operand) */
            v = _mm512_min_ps(v, vmax);
            __m512i q = _mm512_maskz_cvtps_epi32(m, v); /* round half to even; pad lanes 0 */
            _mm256_storeu_si256((__m256i *)(s->a + i), _mm512_cvtepi32_epi16(q));
        }
    }
    if (abits) {
        unsigned r = bits - abits;
        const __m512i rmask = _mm512_set1_epi16((short)kv_code_max(r));
        for (uint32_t i = 0; i < padded; i += 32) { /* s->a has room for 32 past n */
            __m512i q = _mm512_loadu_si512(s->a + i);
            _mm512_storeu_si512(s->r + i, _mm512_and_si512(q, rmask));
            _mm512_storeu_si512(s->a + i, _mm512_srl_epi16(q, _mm_cvtsi32_si128((int)r)));
        }
        pack_stream_bmi2(s->a, n, abits, aout);
        pack_stream_bmi2(s->r, n, r, rout);
    } else {
        pack_stream_bmi2(s->a, n, bits, aout);
    }
}

KV_AVX512 static void decode_group_avx512(const uint8_t *ain, const uint8_t *rin, uint32_t n, unsigned bits,
                                          unsigned abits, float sc, float zr, float *out, scratch *s)
{
    unsigned r = bits - abits;
    const __m512 vs = _mm512_set1_ps(sc), vz = _mm512_set1_ps(zr);
    const __m128i shift = _mm_cvtsi32_si128((int)r);
    unpack_stream_bmi2(ain, n, abits ? abits : bits, s->a);
    if (abits && rin)
        unpack_stream_bmi2(rin, n, r, s->r);
    const __m512 mid = _mm512_set1_ps(abits && !rin ? (float)kv_code_max(r) / 2.0f : 0.0f);
    for (uint32_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512i q = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s->a + i)));
        __m512 f;
        if (!abits) {
            f = _mm512_cvtepi32_ps(q);
        } else if (!rin) {
            f = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sll_epi32(q, shift)), mid); /* exact */
        } else {
            __m512i res = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s->r + i)));
            f = _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_sll_epi32(q, shift), res));
        }
        _mm512_mask_storeu_ps(out + i, m, _mm512_fmadd_ps(f, vs, vz));
    }
}
#endif

/* ---- Dispatch --------------------------------------------------------------- */

const char *kv_cpu_fast_isa(void)
{
#ifdef KV_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma"))
        return "avx512";
#endif
    return "generic";
}

static int use_avx512(const char *isa)
{
#ifdef KV_HAVE_X86
    return isa[0] == 'a';
#else
    (void)isa;
    return 0;
#endif
}

void kv_cpu_fast_encode(const char *isa, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                        const float *x, uint8_t *anchor, uint8_t *residual, uint16_t *scale, uint16_t *zero,
                        size_t g0, size_t g1, kv_cpu_scratch *given)
{
    scratch own, *sp = scratch_get(given, &own, l->group_size), s = *sp;
    unsigned aw = anchor_bits ? anchor_bits : bits, rw = bits - anchor_bits;
    int fast = use_avx512(isa);
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        const float *xs = gather(x, v, &s);
        uint8_t *ao = anchor + kv_layout_group_offset(l, aw, g);
        uint8_t *ro = anchor_bits ? residual + kv_layout_group_offset(l, rw, g) : NULL;
#ifdef KV_HAVE_X86
        if (fast) {
            encode_group_avx512(xs, v.len, bits, anchor_bits, ao, ro, scale + g, zero + g, &s);
            continue;
        }
#endif
        (void)fast;
        encode_group_generic(xs, v.len, bits, anchor_bits, ao, ro, scale + g, zero + g, &s);
    }
    scratch_put(sp, &own);
}

void kv_cpu_fast_decode(const char *isa, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                        const uint8_t *anchor, const uint8_t *residual, const uint16_t *scale,
                        const uint16_t *zero, float *out, size_t g0, size_t g1, kv_cpu_scratch *given)
{
    scratch own, *sp = scratch_get(given, &own, l->group_size), s = *sp;
    unsigned aw = anchor_bits ? anchor_bits : bits, rw = bits - anchor_bits;
    int fast = use_avx512(isa);
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        const uint8_t *ai = anchor + kv_layout_group_offset(l, aw, g);
        const uint8_t *ri = anchor_bits && residual ? residual + kv_layout_group_offset(l, rw, g) : NULL;
        float sc = kv_f16_to_f32(scale[g]), zr = kv_f16_to_f32(zero[g]);
#ifdef KV_HAVE_X86
        if (fast) {
            float *dst = v.stride == 1 ? out + v.first : s.x;
            decode_group_avx512(ai, ri, v.len, bits, anchor_bits, sc, zr, dst, &s);
            if (v.stride != 1)
                for (uint32_t i = 0; i < v.len; i++)
                    out[v.first + i * v.stride] = s.x[i];
            continue;
        }
#endif
        (void)fast;
        decode_group_generic(ai, ri, v.len, bits, anchor_bits, sc, zr, out + v.first, v.stride, &s);
    }
    scratch_put(sp, &own);
}

void kv_cpu_fast_pack(const kv_quant_layout *l, unsigned bits, const uint16_t *codes, uint8_t *packed, size_t g0,
                      size_t g1)
{
    scratch own, *sp = scratch_get(NULL, &own, l->group_size), s = *sp;
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        for (uint32_t i = 0; i < v.len; i++)
            s.a[i] = codes[v.first + i * v.stride];
        pack_stream(s.a, v.len, 0, bits, packed + kv_layout_group_offset(l, bits, g));
    }
    scratch_put(sp, &own);
}

void kv_cpu_fast_unpack(const kv_quant_layout *l, unsigned bits, const uint8_t *packed, uint16_t *codes,
                        size_t g0, size_t g1)
{
    scratch own, *sp = scratch_get(NULL, &own, l->group_size), s = *sp;
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        unpack_stream(packed + kv_layout_group_offset(l, bits, g), v.len, bits, s.a);
        for (uint32_t i = 0; i < v.len; i++)
            codes[v.first + i * v.stride] = s.a[i];
    }
    scratch_put(sp, &own);
}
