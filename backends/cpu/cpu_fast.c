/* cpu_fast.c — the CPU backend's fast quantization paths: fused encode
 * (quantize + split + pack) and decode (unpack + merge + dequantize), plus
 * pack and unpack, in a portable version, an AVX-512 version and (for
 * token groups that tile the rows) an AVX2 one (cpu_fast_avx2.c), chosen at
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

#include "backends/cpu/cpu_fast_avx2.h"
#include "backends/cpu/cpu_internal.h"
#include "backends/numerics.h"
#include "core/base/alloc.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_HAVE_X86 1
#include <cpuid.h>
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
#define KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,fma,f16c")))

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

/* ---- AVX-512 batches: 16 full groups at a time --------------------------------
 * For the common layout — token groups, cols a multiple of G, G a multiple of
 * 16 — the groups are contiguous runs of G values and their streams are
 * contiguous runs of G*w/8 bytes. The metadata of 16 groups is computed in
 * one vector (vcvtps2ph rounds to nearest even like kv_f16_from_f32, with
 * subnormals and overflow to Inf, which is then saturated as N2 says), and
 * codes are written straight from registers: 16 codes of w bits are always
 * exactly 2w bytes. */

/* Any width: 16 codes fill exactly 2w bytes, as two runs of 8 codes of w
   bytes each; pext gathers the low w bits of four 16-bit lanes at a time.
   Masked byte stores and loads never touch a byte past the 2w. */
KV_AVX512 static inline void emit16_any(__m512i q, unsigned w, uint8_t *out)
{
    uint64_t lanes[4], m = lane_mask(w);
    _mm256_storeu_si256((__m256i *)lanes, _mm512_cvtepi32_epi16(q));
    __mmask16 keep = (__mmask16)((1u << w) - 1u);
    for (int h = 0; h < 2; h++) {
        unsigned __int128 v = (unsigned __int128)_pext_u64(lanes[2 * h], m) |
                              (unsigned __int128)_pext_u64(lanes[2 * h + 1], m) << (4 * w);
        __m128i x = _mm_set_epi64x((long long)(uint64_t)(v >> 64), (long long)(uint64_t)v);
        _mm_mask_storeu_epi8(out + h * w, keep, x);
    }
}

KV_AVX512 static inline __m512i load16_any(const uint8_t *in, unsigned w)
{
    uint64_t lanes[4], m = lane_mask(w);
    uint64_t low = w * 4 == 64 ? ~0ull : (1ull << (4 * w)) - 1;
    __mmask16 keep = (__mmask16)((1u << w) - 1u);
    for (int h = 0; h < 2; h++) {
        uint64_t part[2];
        _mm_storeu_si128((__m128i *)part, _mm_maskz_loadu_epi8(keep, in + h * w));
        unsigned __int128 v = (unsigned __int128)part[1] << 64 | part[0];
        lanes[2 * h] = _pdep_u64((uint64_t)v & low, m);
        lanes[2 * h + 1] = _pdep_u64((uint64_t)(v >> (4 * w)) & low, m);
    }
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)lanes));
}

/* Even widths 2..14, from registers (no pext, no scratch): pairs of codes
   are merged twice by shifts inside qwords — dword 2k+1 shifted down next to
   dword 2k gives 2w bits per qword, and after narrowing to dwords, dword 2m+1
   moved up to bit 2w gives 4w bits, w/2 whole bytes, per qword — then a byte
   shuffle inside each 128-bit lane leaves codes 0-7 and 8-15 as w bytes at
   the start of each lane, written with two masked byte stores that end at the
   2w-th byte. (emit16 keeps its own shuffles for 4, 8 and 16.) */
KV_AVX512 static inline void emit16_even(__m512i q, unsigned w, uint8_t *out)
{
    __m256i d = _mm512_cvtepi64_epi32(_mm512_or_si512(q, _mm512_srl_epi64(q, _mm_cvtsi32_si128((int)(32 - w)))));
    /* the low dword's 2w bits may reach past bit 32 - 2w: shift only the high dword */
    d = _mm256_or_si256(_mm256_maskz_mov_epi32(0x55, d),
                        _mm256_sll_epi64(_mm256_srli_epi64(d, 32), _mm_cvtsi32_si128((int)(2 * w))));
    /* bytes 0 .. w/2 - 1 of the lane's qwords 0 and 1, then don't-cares (-1 writes 0) */
    static const int8_t pick[7][16] = {
        {0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},            /* w 2 */
        {0, 1, 8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},             /* w 4 */
        {0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},              /* w 6 */
        {0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1},               /* w 8 */
        {0, 1, 2, 3, 4, 8, 9, 10, 11, 12, -1, -1, -1, -1, -1, -1},                /* w 10 */
        {0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, -1, -1, -1, -1},                 /* w 12 */
        {0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, -1, -1},                  /* w 14 */
    };
    __m128i idx = _mm_loadu_si128((const __m128i *)pick[w / 2 - 1]);
    __m256i b = _mm256_shuffle_epi8(d, _mm256_broadcastsi128_si256(idx));
    __mmask16 keep = (__mmask16)((1u << w) - 1u);
    _mm_mask_storeu_epi8(out, keep, _mm256_castsi256_si128(b));
    _mm_mask_storeu_epi8(out + w, keep, _mm256_extracti128_si256(b, 1));
}

/* 16 codes (one per dword) of width w → 2w bytes at out. */
KV_AVX512 static inline void emit16(__m512i q, unsigned w, uint8_t *out)
{
    if (w == 8) {
        _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(q));
    } else if (w == 16) {
        _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(q));
    } else if (w == 4) { /* qword k holds code 2k in its low dword and 2k+1 in its high dword */
        __m512i v = _mm512_or_si512(q, _mm512_srli_epi64(q, 28));
        _mm_storel_epi64((__m128i *)out, _mm512_cvtepi64_epi8(v));
    } else if (w % 2 == 0) {
        emit16_even(q, w, out);
    } else {
        emit16_any(q, w, out);
    }
}

/* 2w bytes at in → 16 codes of width w, one per dword. */
KV_AVX512 static inline __m512i load16(const uint8_t *in, unsigned w)
{
    if (w == 8)
        return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)in));
    if (w == 16)
        return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)in));
    if (w != 4)
        return load16_any(in, w);
    __m128i b = _mm_loadl_epi64((const __m128i *)in);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

/* fp16 bits with ±Inf replaced by ±65504 (N2). */
KV_AVX512 static inline __m256i saturate_f16(__m256i h)
{
    __mmask16 inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7c00));
    return _mm256_mask_sub_epi16(h, inf, h, _mm256_set1_epi16(1)); /* 0x7c00 − 1 = 0x7bff, sign kept */
}

KV_AVX512 static void params16(__m512 vmn, __m512 vmx, unsigned bits, __mmask16 live, uint16_t *scale,
                               uint16_t *zero, __m512 *S, __m512 *Z);

/* A value that rounds (rint, after clamping to [0, 2^b − 1]) exactly like
   the correctly rounded d / s, without a division in the common case.
   t = d * fl(1/s) is within |d/s|·2^-22.4 of the exact quotient, and so is
   fl(d/s); their roundings can differ only if a half-integer lies within
   that distance of t. Such lanes are rare (about |t|·2^-19 of them), and a
   vector holding one is divided exactly. NaN and ±Inf lanes (non-finite x)
   never look risky and give NaN/±Inf like the division would. */
KV_AVX512 static inline __m512 quotient(__m512 d, __m512 s, __m512 inv)
{
    __m512 t = _mm512_mul_ps(d, inv);
    __m512 frac = _mm512_sub_ps(t, _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    __m512 dist = _mm512_abs_ps(_mm512_sub_ps(frac, _mm512_set1_ps(0.5f)));
    __m512 thr = _mm512_mul_ps(_mm512_max_ps(_mm512_abs_ps(t), _mm512_set1_ps(1.0f)), _mm512_set1_ps(0x1p-20f));
    if (_mm512_cmp_ps_mask(dist, thr, _CMP_LE_OQ))
        return _mm512_div_ps(d, s);
    return t;
}

/* The minima (max = 0) or maxima (max = 1) of x[0..16) in lanes 0..15, by a
   transposing tree across then within 128-bit blocks: 30 shuffles and 15
   min/max where 16 full reductions take about 128. min and max are exact,
   so the result does not depend on the order (signed zeros are made +0 by
   params16, N3). */
KV_AVX512 static inline __m512 minmax16(const __m512 *x, int max)
{
#define KV_MM(a, b) (max ? _mm512_max_ps((a), (b)) : _mm512_min_ps((a), (b)))
    /* levels 1-2 leave block order (k, k + 8, k + 4, k + 12) of input k: inputs 4..7 and 8..11 go in swapped */
    static const int in[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    __m512 z[8], w[4];
    for (int k = 0; k < 8; k++)
        z[k] = KV_MM(_mm512_shuffle_f32x4(x[in[k]], x[in[k + 8]], 0x44), _mm512_shuffle_f32x4(x[in[k]], x[in[k + 8]], 0xEE));
    for (int k = 0; k < 4; k++)
        w[k] = KV_MM(_mm512_shuffle_f32x4(z[k], z[k + 4], 0x88), _mm512_shuffle_f32x4(z[k], z[k + 4], 0xDD));
    __m512 v0 = KV_MM(_mm512_shuffle_ps(w[0], w[1], 0x44), _mm512_shuffle_ps(w[0], w[1], 0xEE));
    __m512 v1 = KV_MM(_mm512_shuffle_ps(w[2], w[3], 0x44), _mm512_shuffle_ps(w[2], w[3], 0xEE));
    return KV_MM(_mm512_shuffle_ps(v0, v1, 0x88), _mm512_shuffle_ps(v0, v1, 0xDD));
#undef KV_MM
}

enum { ENCODE_PREFETCH = 4096 }; /* bytes */

/* Codes one group of G values (xj) with scale sj, zero zj and 1/sj = invj:
   the anchor (or the code) of width aw to ao, the residual to ro (abits > 0).
   divide: every vector by vdivps, else quotient() (bits <= 12). Inlined with constant widths by its caller. */
KV_AVX512 static inline __attribute__((always_inline)) void code_group(const float *xj, uint32_t G, unsigned bits,
                                                                        unsigned abits, unsigned aw, float sj,
                                                                        float zj, float invj, int divide,
                                                                        uint8_t *ao, uint8_t *ro, scratch *s)
{
    const __m512 zero_v = _mm512_setzero_ps();
    unsigned r = abits ? bits - abits : 0;
    const __m512 vmax = _mm512_set1_ps((float)kv_code_max(bits));
    const __m128i rshift = _mm_cvtsi32_si128((int)r);
    const __m512i rmask = _mm512_set1_epi32((int)kv_code_max(r ? r : 1));
    int constant = sj == 0.0f;
    if (constant) /* scale 0: the scalar rule (N4), codes to scratch */
        for (uint32_t i = 0; i < G; i++)
            s->a[i] = kv_quant_code(xj[i], sj, zj, bits);
    const __m512 vz = _mm512_set1_ps(zj), vs = _mm512_set1_ps(sj), vinv = _mm512_set1_ps(invj);
    for (uint32_t i = 0; i < G; i += 16) {
        /* the same line of the next batch: it streams in while this one is coded
           (smaller batches are already prefetched by the min/max pass) */
        if (16 * (size_t)G * sizeof *xj > ENCODE_PREFETCH)
            _mm_prefetch((const char *)(xj + 16 * (size_t)G + i), _MM_HINT_T0);
        __m512i q;
        if (constant) {
            q = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s->a + i)));
        } else {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(xj + i), vz);
            /* above 12 bits most vectors would hold a risky lane: divide outright; so does a CPU whose
               division is cheaper than quotient()'s test (divide) */
            __m512 v = bits <= 12 && !divide ? quotient(d, vs, vinv) : _mm512_div_ps(d, vs);
            v = _mm512_min_ps(_mm512_max_ps(v, zero_v), vmax); /* NaN → 0 */
            q = _mm512_cvtps_epi32(v);
        }
        emit16(abits ? _mm512_srl_epi32(q, rshift) : q, aw, ao + (size_t)i * aw / 8);
        if (abits)
            emit16(_mm512_and_si512(q, rmask), r, ro + (size_t)i * r / 8);
    }
}

/* Encodes `count` (1..16) consecutive full groups of G values (G % 16 == 0).
   codes16 (with abits 0): write the codes unpacked, as u16, to aout (the
   quantize kernel: a 16-bit stream is the u16 array). */
KV_AVX512 static void encode_batch_avx512(const float *x, uint32_t count, uint32_t G, unsigned bits, unsigned abits,
                                          int codes16, int divide, uint8_t *aout, uint8_t *rout, uint16_t *scale,
                                          uint16_t *zero, scratch *s)
{
    const __m512 zero_v = _mm512_setzero_ps();
    float sv[16], zv[16];
    __m512 vmn[16], vmx[16]; /* per group: 16 lanes of finite minima and maxima (±Inf where none) */
    for (uint32_t j = 0; j < 16; j++) {
        vmn[j] = _mm512_set1_ps(__builtin_inff());
        vmx[j] = _mm512_set1_ps(-__builtin_inff());
        if (j >= count)
            continue;
        for (uint32_t i = 0; i < G; i += 16) {
            /* a line of the input ENCODE_PREFETCH bytes ahead: one core alone does not keep
               enough reads in flight to stream at memory speed (prefetches do not fault) */
            _mm_prefetch((const char *)((uintptr_t)(x + (size_t)j * G + i) + ENCODE_PREFETCH), _MM_HINT_T0);
            __m512 v = _mm512_loadu_ps(x + (size_t)j * G + i);
            __mmask16 fin = _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero_v, _CMP_EQ_OQ);
            vmn[j] = _mm512_mask_min_ps(vmn[j], fin, vmn[j], v);
            vmx[j] = _mm512_mask_max_ps(vmx[j], fin, vmx[j], v);
        }
    }
    /* the metadata of all 16 groups at once */
    __m512 S, Z;
    params16(minmax16(vmn, 0), minmax16(vmx, 1), bits, (__mmask16)(count >= 16 ? 0xffffu : (1u << count) - 1u),
             scale, zero, &S, &Z);
    _mm512_storeu_ps(sv, S);
    _mm512_storeu_ps(zv, Z);
    float inv[16];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), S)); /* Inf where s == 0: those use the scalar rule */

    unsigned r = abits ? bits - abits : 0, aw = codes16 ? 16 : abits ? abits : bits;
    size_t abytes = (size_t)G * aw / 8, rbytes = (size_t)G * r / 8;
    for (uint32_t j = 0; j < count; j++) {
        const float *xj = x + (size_t)j * G;
        uint8_t *ao = aout + j * abytes, *ro = abits ? rout + j * rbytes : NULL;
        /* the formats of the benchmarks with their widths as constants (emit16 then has no branches) */
        if (bits == 16 && abits == 4 && !codes16)
            code_group(xj, G, 16, 4, 4, sv[j], zv[j], inv[j], divide, ao, ro, s);
        else if (bits == 8 && abits == 4 && !codes16)
            code_group(xj, G, 8, 4, 4, sv[j], zv[j], inv[j], divide, ao, ro, s);
        else if (bits == 8 && !abits && !codes16)
            code_group(xj, G, 8, 0, 8, sv[j], zv[j], inv[j], divide, ao, ro, s);
        else if (bits == 4 && !abits && !codes16)
            code_group(xj, G, 4, 0, 4, sv[j], zv[j], inv[j], divide, ao, ro, s);
        else
            code_group(xj, G, bits, abits, aw, sv[j], zv[j], inv[j], divide, ao, ro, s);
    }
}

/* Decodes `count` (1..16) consecutive full groups of G values (G % 16 == 0).
   codes16 (rin NULL): ain holds u16 codes, masked to their width (the
   dequantize kernel). */
KV_AVX512 static void decode_batch_avx512(const uint8_t *ain, const uint8_t *rin, uint32_t count, uint32_t G,
                                          unsigned bits, unsigned abits, int codes16, const uint16_t *scale,
                                          const uint16_t *zero, float *out)
{
    float sv[16], zv[16];
    __mmask16 live = (__mmask16)(count >= 16 ? 0xffffu : (1u << count) - 1u);
    _mm512_storeu_ps(sv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, scale)));
    _mm512_storeu_ps(zv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, zero)));
    unsigned r = abits ? bits - abits : 0, aw = codes16 ? 16 : abits ? abits : bits;
    size_t abytes = (size_t)G * aw / 8, rbytes = (size_t)G * r / 8;
    const __m512i width_mask = _mm512_set1_epi32((int)kv_code_max(abits ? abits : bits));
    const __m128i shift = _mm_cvtsi32_si128((int)r);
    const __m512 mid = _mm512_set1_ps(abits && !rin ? (float)kv_code_max(r) / 2.0f : 0.0f);
    for (uint32_t j = 0; j < count; j++) {
        const __m512 vs = _mm512_set1_ps(sv[j]), vz = _mm512_set1_ps(zv[j]);
        const uint8_t *ai = ain + j * abytes, *ri = rin ? rin + j * rbytes : NULL;
        float *o = out + (size_t)j * G;
        for (uint32_t i = 0; i < G; i += 16) {
            __m512i q = load16(ai + (size_t)i * aw / 8, aw);
            if (codes16)
                q = _mm512_and_si512(q, width_mask);
            __m512 f;
            if (!abits)
                f = _mm512_cvtepi32_ps(q);
            else if (!ri)
                f = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sll_epi32(q, shift)), mid); /* exact */
            else
                f = _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_sll_epi32(q, shift), load16(ri + (size_t)i * r / 8, r)));
            _mm512_storeu_ps(o + i, _mm512_fmadd_ps(f, vs, vz));
        }
    }
}

/* ---- AVX-512 channel groups (KIVI keys): 16 columns at a time -----------------
 * A block of G rows by 16 columns is 16 groups whose values arrive row by row
 * as one vector: min/max and codes need no horizontal work. The writer builds
 * each column's stream in a 32-bit half word per lane (one shift and one or
 * per row) and scatters two halves as one 64-bit word when both fill; the
 * last, partial word is written bytewise. Readers gather 64-bit words and
 * never touch a byte past a stream's end. */

/* A reader's place in 16 streams. */
typedef struct lanes_io {
    __m512i lo, hi;     /* columns 0-7 and 8-15: the current word of each stream */
    unsigned pos;       /* bits of the current word already used */
    size_t word;        /* index of the current word */
    unsigned w;         /* bits per code */
    uint8_t *base;      /* stream of the first column (read only) */
    size_t stride;      /* bytes from one column's stream to the next */
    size_t bytes;       /* bytes of each stream */
    __mmask16 live;     /* columns that exist */
    int need_load;      /* the current word is not loaded yet */
} lanes_io;

/* A writer's place in 16 streams. */
typedef struct lanes_out {
    __m512i acc;        /* column k's current 32-bit half word in dword k */
    __m512i first;      /* the word's first half, once full (second == 1) */
    __m512i at_lo, at_hi; /* byte offsets of the streams of columns 0,1,4,5,8,9,12,13 and 2,3,6,7,...,15 */
    unsigned pos;       /* bits of acc already used */
    int second;         /* acc is the second half of the 64-bit word */
    size_t word;        /* index of the current 64-bit word */
    unsigned w;         /* bits per code */
    uint8_t *base;      /* stream of the first column */
    size_t stride;      /* bytes from one column's stream to the next */
    __mmask16 live;     /* columns that exist */
} lanes_out;

KV_AVX512 static lanes_out lanes_out_init(uint8_t *base, unsigned w, size_t stride, __mmask16 live)
{
    const __m512i s = _mm512_set1_epi64((long long)stride);
    lanes_out o = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                   _mm512_mullo_epi64(_mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0), s),
                   _mm512_mullo_epi64(_mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2), s), 0, 0, 0, w, base, stride, live};
    return o;
}

/* A 32-bit half is full: keep it as the first, or write the 64-bit words (unpacking
   the halves pairs columns 0,1,4,5,... in the low qwords, 2,3,6,7,... in the high). */
KV_AVX512 static void lanes_half_full(lanes_out *o)
{
    if (!o->second) {
        o->first = o->acc;
        o->second = 1;
        return;
    }
    const __m512i word = _mm512_set1_epi64((long long)(o->word * 8));
    _mm512_mask_i64scatter_epi64(o->base, (__mmask8)_pext_u32(o->live, 0x3333), _mm512_add_epi64(o->at_lo, word),
                                 _mm512_unpacklo_epi32(o->first, o->acc), 1);
    _mm512_mask_i64scatter_epi64(o->base, (__mmask8)_pext_u32(o->live, 0xCCCC), _mm512_add_epi64(o->at_hi, word),
                                 _mm512_unpackhi_epi32(o->first, o->acc), 1);
    o->second = 0;
    o->word++;
}

/* Appends 16 codes (one per dword, below 2^w). */
KV_AVX512 static inline void lanes_put(lanes_out *o, __m512i q)
{
    o->acc = _mm512_or_si512(o->acc, _mm512_sll_epi32(q, _mm_cvtsi32_si128((int)o->pos)));
    if (o->pos + o->w < 32) {
        o->pos += o->w;
        return;
    }
    lanes_half_full(o);
    o->acc = _mm512_srl_epi32(q, _mm_cvtsi32_si128((int)(32 - o->pos))); /* the bits that did not fit; 0 if none */
    o->pos = o->pos + o->w - 32;
}

/* Appends a whole 32-bit half word per column, built by the caller (at a half's start: pos == 0). */
KV_AVX512 static inline void lanes_put_half(lanes_out *o, __m512i half)
{
    o->acc = half;
    lanes_half_full(o);
    o->acc = _mm512_setzero_si512();
}

KV_AVX512 static void lanes_finish(lanes_out *o)
{
    if (!o->second && o->pos == 0)
        return;
    uint32_t first[16], acc[16];
    _mm512_storeu_si512(first, o->first);
    _mm512_storeu_si512(acc, o->acc);
    size_t n = (32 * (size_t)o->second + o->pos + 7) / 8;
    for (int k = 0; k < 16; k++) {
        if (!(o->live >> k & 1))
            continue;
        uint64_t v = o->second ? first[k] | (uint64_t)acc[k] << 32 : acc[k];
        memcpy(o->base + k * o->stride + o->word * 8, &v, n);
    }
}

KV_AVX512 static inline __m512i lane_index(const lanes_io *io, int half)
{
    __m512i k = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    k = _mm512_add_epi64(k, _mm512_set1_epi64(half * 8));
    return _mm512_add_epi64(_mm512_mullo_epi64(k, _mm512_set1_epi64((long long)io->stride)),
                            _mm512_set1_epi64((long long)(io->word * 8)));
}

/* The stream words `word` of every live column (bytes past a stream's end read as 0). */
KV_AVX512 static void lanes_load(const lanes_io *io, size_t word, __m512i *lo, __m512i *hi)
{
    if (word * 8 + 8 <= io->bytes) {
        lanes_io at = *io;
        at.word = word;
        *lo = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(), (__mmask8)io->live, lane_index(&at, 0), io->base, 1);
        *hi = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(), (__mmask8)(io->live >> 8), lane_index(&at, 1),
                                          io->base, 1);
        return;
    }
    uint64_t tmp[16] = {0};
    size_t n = io->bytes > word * 8 ? io->bytes - word * 8 : 0;
    for (int k = 0; k < 16; k++)
        if (io->live >> k & 1)
            memcpy(&tmp[k], io->base + k * io->stride + word * 8, n);
    *lo = _mm512_loadu_si512(tmp);
    *hi = _mm512_loadu_si512(tmp + 8);
}

/* The next 16 codes, one per dword. */
KV_AVX512 static inline __m512i lanes_get(lanes_io *io)
{
    if (io->need_load) {
        lanes_load(io, io->word, &io->lo, &io->hi);
        io->need_load = 0;
    }
    __m128i sh = _mm_cvtsi32_si128((int)io->pos);
    __m512i lo = _mm512_srl_epi64(io->lo, sh), hi = _mm512_srl_epi64(io->hi, sh);
    int spill = io->pos + io->w > 64;
    __m512i nlo = lo, nhi = hi;
    if (spill) {
        lanes_load(io, io->word + 1, &nlo, &nhi);
        __m128i back = _mm_cvtsi32_si128((int)(64 - io->pos));
        lo = _mm512_or_si512(lo, _mm512_sll_epi64(nlo, back));
        hi = _mm512_or_si512(hi, _mm512_sll_epi64(nhi, back));
    }
    __m512i m = _mm512_set1_epi64((long long)kv_code_max(io->w));
    lo = _mm512_and_si512(lo, m);
    hi = _mm512_and_si512(hi, m);
    io->pos += io->w;
    if (io->pos >= 64) {
        io->pos -= 64;
        io->word++;
        if (spill) {
            io->lo = nlo;
            io->hi = nhi;
        } else {
            io->need_load = 1;
        }
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
}

/* Metadata of 16 groups from their finite min and max vectors (as
   kv_quant_params); stores the live ones, returns s and z. */
KV_AVX512 static void params16(__m512 vmn, __m512 vmx, unsigned bits, __mmask16 live, uint16_t *scale,
                               uint16_t *zero, __m512 *S, __m512 *Z)
{
    const __m512 zero_v = _mm512_setzero_ps();
    __mmask16 have = _mm512_cmp_ps_mask(vmn, vmx, _CMP_LE_OQ);
    vmn = _mm512_add_ps(vmn, zero_v); /* N3 */
    vmx = _mm512_add_ps(vmx, zero_v);
    __m512 range = _mm512_div_ps(_mm512_sub_ps(vmx, vmn), _mm512_set1_ps((float)kv_code_max(bits)));
    __m256i sh = saturate_f16(_mm512_cvtps_ph(range, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i zh = saturate_f16(_mm512_cvtps_ph(vmn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sh = _mm256_maskz_mov_epi16(have, sh);
    zh = _mm256_maskz_mov_epi16(have, zh);
    _mm256_mask_storeu_epi16(scale, live, sh);
    _mm256_mask_storeu_epi16(zero, live, zh);
    *S = _mm512_cvtph_ps(sh);
    *Z = _mm512_cvtph_ps(zh);
}

/* The codes of one row of 16 columns: rint(clamp((v − z) / s, 0, 2^b − 1)), NaN → 0; lanes with
   s == 0 are the caller's (N4). */
KV_AVX512 static inline __m512i channel_codes(__m512 v, __m512 Z, __m512 S, __m512 vmax)
{
    __m512 t = _mm512_div_ps(_mm512_sub_ps(v, Z), S);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), vmax));
}

/* Encodes the groups of block b, columns [c0, c0 + 16) ∩ live. */
KV_AVX512 static void encode_channel_avx512(const kv_quant_layout *l, uint32_t b, uint32_t c0, __mmask16 live,
                                            unsigned bits, unsigned abits, const float *x, uint8_t *aplane,
                                            uint8_t *rplane, uint16_t *scale, uint16_t *zero)
{
    const __m512 zero_v = _mm512_setzero_ps(), pinf = _mm512_set1_ps(__builtin_inff());
    uint32_t C = l->cols, G = l->group_size;
    size_t g = (size_t)b * C + c0;
    uint32_t n = kv_layout_group_len(l, g);
    const float *x0 = x + (size_t)b * G * C + c0;
    /* four rows at a time into their own minima and maxima: four chains in flight (min and max are exact,
       so the order does not matter) */
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    __m512 mn0 = pinf, mn1 = pinf, mn2 = pinf, mn3 = pinf, mx0 = ninf, mx1 = ninf, mx2 = ninf, mx3 = ninf;
    /* Rows C floats apart may all fall in one L1 set (C = 1024: 4 KiB apart), so the coding pass would read
       them from L2 again: up to kChannelTile rows are copied to a tile on the stack as the first pass reads
       them. */
    enum { kChannelTile = 64 };
    float tile[kChannelTile * 16] __attribute__((aligned(64)));
    int tiled = n <= kChannelTile;
    /* the next block of G rows, line by line in order (its piece c0 / 16 of C / 16), into L2: read
       row-major it streams, where the 16-column pieces of this one take 64 bytes of each of G rows */
    const float *next = x + ((size_t)b + 1) * G * C + (size_t)(c0 / 16) * G * 16;
#define KV_MINMAX_ROW(i, mn, mx, store)                                                                     \
    do {                                                                                                    \
        _mm_prefetch((const char *)(next + (size_t)(i) * 16), _MM_HINT_T1);                                \
        __m512 v_ = _mm512_maskz_loadu_ps(live, x0 + (size_t)(i) * C);                                      \
        if (store)                                                                                          \
            _mm512_store_ps(tile + (size_t)(i) * 16, v_);                                                  \
        __mmask16 fin_ = _mm512_mask_cmp_ps_mask(live, _mm512_sub_ps(v_, v_), zero_v, _CMP_EQ_OQ);          \
        mn = _mm512_mask_min_ps(mn, fin_, mn, v_);                                                           \
        mx = _mm512_mask_max_ps(mx, fin_, mx, v_);                                                           \
    } while (0)
#define KV_MINMAX_ROWS(store)                                                                               \
    do {                                                                                                    \
        uint32_t row = 0;                                                                                   \
        for (; row + 4 <= n; row += 4) {                                                                    \
            KV_MINMAX_ROW(row, mn0, mx0, store);                                                            \
            KV_MINMAX_ROW(row + 1, mn1, mx1, store);                                                        \
            KV_MINMAX_ROW(row + 2, mn2, mx2, store);                                                        \
            KV_MINMAX_ROW(row + 3, mn3, mx3, store);                                                        \
        }                                                                                                   \
        for (; row < n; row++)                                                                              \
            KV_MINMAX_ROW(row, mn0, mx0, store);                                                            \
    } while (0)
    if (tiled)
        KV_MINMAX_ROWS(1);
    else
        KV_MINMAX_ROWS(0);
#undef KV_MINMAX_ROWS
#undef KV_MINMAX_ROW
    __m512 vmn = _mm512_min_ps(_mm512_min_ps(mn0, mn1), _mm512_min_ps(mn2, mn3));
    __m512 vmx = _mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3));
    __m512 S, Z;
    params16(vmn, vmx, bits, live, scale + g, zero + g, &S, &Z);
    unsigned r = abits ? bits - abits : 0, aw = abits ? abits : bits;
    size_t astride = ((size_t)n * aw + 7) / 8, rstride = ((size_t)n * r + 7) / 8;
    lanes_out wa = lanes_out_init(aplane + kv_layout_group_offset(l, aw, g), aw, astride, live);
    lanes_out wr = abits ? lanes_out_init(rplane + kv_layout_group_offset(l, r, g), r, rstride, live) : wa;
    const __m512 vmax = _mm512_set1_ps((float)kv_code_max(bits));
    const __m512i qmax = _mm512_set1_epi32((int)kv_code_max(bits)), rmask = _mm512_set1_epi32((int)kv_code_max(r ? r : 1));
    const __m128i rshift = _mm_cvtsi32_si128((int)r);
    __mmask16 s0 = _mm512_cmp_ps_mask(S, zero_v, _CMP_EQ_OQ);
    const float *src = tiled ? tile : x0;
    size_t src_stride = tiled ? 16 : C;
    uint32_t i = 0;
    if (!abits && 32 % aw == 0 && !(s0 & live)) {
        /* no scale is 0 and 32 / aw rows fill a half word exactly: each half is built in a register */
        uint32_t per = 32 / aw;
        for (; i + per <= n; i += per) {
            __m512i acc = _mm512_setzero_si512();
            for (uint32_t k = 0; k < per; k++) {
                __m512i q = channel_codes(_mm512_maskz_loadu_ps(live, src + (size_t)(i + k) * src_stride), Z, S, vmax);
                acc = _mm512_or_si512(acc, _mm512_sll_epi32(q, _mm_cvtsi32_si128((int)(k * aw))));
            }
            lanes_put_half(&wa, acc);
        }
    }
    for (; i < n; i++) {
        __m512 v = _mm512_maskz_loadu_ps(live, src + (size_t)i * src_stride);
        __m512i q = channel_codes(v, Z, S, vmax); /* lanes with s == 0 are replaced below */
        /* N4 for s == 0: 0, except +Inf → 2^b − 1 */
        __mmask16 is_pinf = _mm512_cmp_ps_mask(v, pinf, _CMP_EQ_OQ);
        q = _mm512_mask_mov_epi32(q, s0, _mm512_maskz_mov_epi32(is_pinf, qmax));
        lanes_put(&wa, abits ? _mm512_srl_epi32(q, rshift) : q);
        if (abits)
            lanes_put(&wr, _mm512_and_si512(q, rmask));
    }
    lanes_finish(&wa);
    if (abits)
        lanes_finish(&wr);
}

KV_AVX512 static void decode_channel_avx512(const kv_quant_layout *l, uint32_t b, uint32_t c0, __mmask16 live,
                                            unsigned bits, unsigned abits, const uint8_t *aplane,
                                            const uint8_t *rplane, const uint16_t *scale, const uint16_t *zero,
                                            float *out)
{
    uint32_t C = l->cols, G = l->group_size;
    size_t g = (size_t)b * C + c0;
    uint32_t n = kv_layout_group_len(l, g);
    __m512 S = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, scale + g));
    __m512 Z = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, zero + g));
    unsigned r = abits ? bits - abits : 0, aw = abits ? abits : bits;
    lanes_io ra = {_mm512_setzero_si512(), _mm512_setzero_si512(), 0, 0, aw,
                   (uint8_t *)(uintptr_t)(aplane + kv_layout_group_offset(l, aw, g)), ((size_t)n * aw + 7) / 8,
                   ((size_t)n * aw + 7) / 8, live, 1};
    lanes_io rr = ra;
    if (abits && rplane) {
        rr.w = r;
        rr.base = (uint8_t *)(uintptr_t)(rplane + kv_layout_group_offset(l, r, g));
        rr.stride = rr.bytes = ((size_t)n * r + 7) / 8;
    }
    const __m128i shift = _mm_cvtsi32_si128((int)r);
    const __m512 mid = _mm512_set1_ps(abits && !rplane ? (float)kv_code_max(r) / 2.0f : 0.0f);
    float *o0 = out + (size_t)b * G * C + c0;
    for (uint32_t i = 0; i < n; i++) {
        __m512i q = lanes_get(&ra);
        __m512 f;
        if (!abits)
            f = _mm512_cvtepi32_ps(q);
        else if (!rplane)
            f = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sll_epi32(q, shift)), mid); /* exact */
        else
            f = _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_sll_epi32(q, shift), lanes_get(&rr)));
        _mm512_mask_storeu_ps(o0 + (size_t)i * C, live, _mm512_fmadd_ps(f, S, Z));
    }
}

/* Runs fn over groups [g0, g1) of a channel layout as (block, 16 columns) pieces. */
#define KV_FOR_CHANNEL_PIECES(l, g0, g1, BODY)                                                               \
    for (size_t g_ = (g0); g_ < (g1);) {                                                                      \
        uint32_t b_ = (uint32_t)(g_ / (l)->cols), c_ = (uint32_t)(g_ % (l)->cols);                            \
        size_t left_ = (g1) - g_, row_left_ = (l)->cols - c_;                                                 \
        uint32_t k_ = (uint32_t)(left_ < row_left_ ? left_ : row_left_);                                      \
        k_ = k_ < 16 ? k_ : 16;                                                                               \
        __mmask16 live_ = (__mmask16)((1u << k_) - 1u);                                                      \
        BODY;                                                                                                  \
        g_ += k_;                                                                                              \
    }
#endif

/* ---- Dispatch --------------------------------------------------------------- */

#ifdef KV_HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
   not know "f16c". The AVX checks below cover the OS's save of ymm/zmm state. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const char *kv_cpu_fast_isa(void)
{
#ifdef KV_HAVE_X86
    __builtin_cpu_init();
    int common = __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma") && has_f16c();
    if (common && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "avx512";
    if (common && __builtin_cpu_supports("avx2"))
        return "avx2";
#endif
    return "generic";
}

int kv_cpu_fast_divides(void)
{
#ifdef KV_HAVE_X86
    unsigned a, b, c, d;
    /* the vendor string "AuthenticAMD" in EBX, EDX, ECX */
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#else
    return 0;
#endif
}

/* Token groups that tile the rows exactly, 16 values at a time: group g is
   x[g*G, (g+1)*G) and its stream starts at g*G*w/8. */
static int regular(const kv_quant_layout *l)
{
    return l->grouping == KV_GROUP_TOKEN && l->group_size % 16 == 0 && l->cols % l->group_size == 0;
}

static int use_avx512(const char *isa)
{
#ifdef KV_HAVE_X86
    return strcmp(isa, "avx512") == 0;
#else
    (void)isa;
    return 0;
#endif
}

#ifdef KV_HAVE_X86
/* The AVX2 codecs (cpu_fast_avx2.c) take token groups that tile the rows
   with G a multiple of 8 (regular8) and, for encode and decode, channel
   groups; other layouts on an "avx2" device take the portable code. */
static int use_avx2(const char *isa)
{
    return strcmp(isa, "avx2") == 0;
}

static int regular8(const kv_quant_layout *l)
{
    return l->grouping == KV_GROUP_TOKEN && l->group_size % 8 == 0 && l->cols % l->group_size == 0;
}
#endif

void kv_cpu_fast_encode(const char *isa, int divide, const kv_quant_layout *l, unsigned bits,
                        unsigned anchor_bits, const float *x, uint8_t *anchor, uint8_t *residual, uint16_t *scale,
                        uint16_t *zero, size_t g0, size_t g1, kv_cpu_scratch *given)
{
    (void)divide;
#ifdef KV_HAVE_X86
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_encode(x, l->group_size, bits, anchor_bits, 0, anchor, residual, scale, zero, g0, g1);
        return;
    }
    if (use_avx2(isa) && l->grouping == KV_GROUP_CHANNEL) {
        kv_cpu_avx2_encode_channel(l, bits, anchor_bits, x, anchor, residual, scale, zero, g0, g1);
        return;
    }
#endif
    scratch own, *sp = scratch_get(given, &own, l->group_size), s = *sp;
    unsigned aw = anchor_bits ? anchor_bits : bits, rw = bits - anchor_bits;
    int fast = use_avx512(isa);
#ifdef KV_HAVE_X86
    if (fast && regular(l)) {
        uint32_t G = l->group_size;
        for (size_t g = g0; g < g1; g += 16) {
            uint32_t count = g1 - g < 16 ? (uint32_t)(g1 - g) : 16;
            encode_batch_avx512(x + g * G, count, G, bits, anchor_bits, 0, divide, anchor + g * G * aw / 8,
                                anchor_bits ? residual + g * G * rw / 8 : NULL, scale + g, zero + g, &s);
        }
        scratch_put(sp, &own);
        return;
    }
    if (fast && l->grouping == KV_GROUP_CHANNEL) {
        KV_FOR_CHANNEL_PIECES(l, g0, g1,
                              encode_channel_avx512(l, b_, c_, live_, bits, anchor_bits, x, anchor, residual, scale,
                                                    zero));
        scratch_put(sp, &own);
        return;
    }
#endif
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
#ifdef KV_HAVE_X86
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_decode(anchor, anchor_bits ? residual : NULL, l->group_size, bits, anchor_bits, 0, scale, zero,
                           out, g0, g1);
        return;
    }
    if (use_avx2(isa) && l->grouping == KV_GROUP_CHANNEL) {
        kv_cpu_avx2_decode_channel(l, bits, anchor_bits, anchor, residual, scale, zero, out, g0, g1);
        return;
    }
#endif
    unsigned aw = anchor_bits ? anchor_bits : bits, rw = bits - anchor_bits;
    int fast = use_avx512(isa);
#ifdef KV_HAVE_X86
    if (fast && regular(l)) {
        uint32_t G = l->group_size;
        for (size_t g = g0; g < g1; g += 16) {
            uint32_t count = g1 - g < 16 ? (uint32_t)(g1 - g) : 16;
            decode_batch_avx512(anchor + g * G * aw / 8, anchor_bits && residual ? residual + g * G * rw / 8 : NULL,
                                count, G, bits, anchor_bits, 0, scale + g, zero + g, out + g * G);
        }
        return;
    }
    if (fast && l->grouping == KV_GROUP_CHANNEL) {
        KV_FOR_CHANNEL_PIECES(l, g0, g1,
                              decode_channel_avx512(l, b_, c_, live_, bits, anchor_bits, anchor,
                                                    anchor_bits ? residual : NULL, scale, zero, out));
        return;
    }
#endif
    scratch own, *sp = scratch_get(given, &own, l->group_size), s = *sp;
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

#ifdef KV_HAVE_X86
/* Regular layouts: the codes of groups [g0, g1) are codes[g0*G, g1*G) and
   their streams packed[g0*G*w/8, ...): 16 codes at a time. */
KV_AVX512 static void pack_regular_avx512(const uint16_t *codes, uint8_t *packed, size_t e0, size_t e1, unsigned w)
{
    const __m512i mask = _mm512_set1_epi32((int)kv_code_max(w));
    for (size_t e = e0; e < e1; e += 16)
        emit16(_mm512_and_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(codes + e))), mask), w,
               packed + e * w / 8);
}

KV_AVX512 static void unpack_regular_avx512(const uint8_t *packed, uint16_t *codes, size_t e0, size_t e1, unsigned w)
{
    for (size_t e = e0; e < e1; e += 16)
        _mm256_storeu_si256((__m256i *)(codes + e), _mm512_cvtepi32_epi16(load16(packed + e * w / 8, w)));
}
#endif

void kv_cpu_fast_quantize(const char *isa, int divide, const kv_quant_layout *l, unsigned bits, const float *x,
                          uint16_t *codes, uint16_t *scale, uint16_t *zero, size_t g0, size_t g1)
{
    (void)divide;
#ifdef KV_HAVE_X86
    if (use_avx512(isa) && regular(l)) {
        scratch own, *sp = scratch_get(NULL, &own, l->group_size);
        uint32_t G = l->group_size;
        for (size_t g = g0; g < g1; g += 16) {
            uint32_t count = g1 - g < 16 ? (uint32_t)(g1 - g) : 16;
            encode_batch_avx512(x + g * G, count, G, bits, 0, 1, divide, (uint8_t *)(codes + g * G), NULL, scale + g,
                                zero + g, sp);
        }
        scratch_put(sp, &own);
        return;
    }
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_encode(x, l->group_size, bits, 0, 1, (uint8_t *)codes, NULL, scale, zero, g0, g1);
        return;
    }
#endif
    (void)isa;
    kv_cpu_ref_quantize(l, bits, x, codes, scale, zero, g0, g1);
}

void kv_cpu_fast_dequantize(const char *isa, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                            const uint16_t *codes, const uint16_t *scale, const uint16_t *zero, float *out, size_t g0,
                            size_t g1)
{
#ifdef KV_HAVE_X86
    if (use_avx512(isa) && regular(l)) {
        uint32_t G = l->group_size;
        for (size_t g = g0; g < g1; g += 16) {
            uint32_t count = g1 - g < 16 ? (uint32_t)(g1 - g) : 16;
            decode_batch_avx512((const uint8_t *)(codes + g * G), NULL, count, G, bits, anchor_bits, 1, scale + g,
                                zero + g, out + g * G);
        }
        return;
    }
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_decode((const uint8_t *)codes, NULL, l->group_size, bits, anchor_bits, 1, scale, zero, out, g0,
                           g1);
        return;
    }
#endif
    (void)isa;
    kv_cpu_ref_dequantize(l, bits, anchor_bits, codes, scale, zero, out, g0, g1);
}

void kv_cpu_fast_pack(const char *isa, const kv_quant_layout *l, unsigned bits, const uint16_t *codes,
                      uint8_t *packed, size_t g0, size_t g1)
{
#ifdef KV_HAVE_X86
    if (use_avx512(isa) && regular(l)) {
        pack_regular_avx512(codes, packed, g0 * l->group_size, g1 * l->group_size, bits);
        return;
    }
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_pack(codes, packed, g0 * l->group_size, g1 * l->group_size, bits);
        return;
    }
#endif
    (void)isa;
    scratch own, *sp = scratch_get(NULL, &own, l->group_size), s = *sp;
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        for (uint32_t i = 0; i < v.len; i++)
            s.a[i] = codes[v.first + i * v.stride];
        pack_stream(s.a, v.len, 0, bits, packed + kv_layout_group_offset(l, bits, g));
    }
    scratch_put(sp, &own);
}

void kv_cpu_fast_unpack(const char *isa, const kv_quant_layout *l, unsigned bits, const uint8_t *packed,
                        uint16_t *codes, size_t g0, size_t g1)
{
#ifdef KV_HAVE_X86
    if (use_avx512(isa) && regular(l)) {
        unpack_regular_avx512(packed, codes, g0 * l->group_size, g1 * l->group_size, bits);
        return;
    }
    if (use_avx2(isa) && regular8(l)) {
        kv_cpu_avx2_unpack(packed, codes, g0 * l->group_size, g1 * l->group_size, bits);
        return;
    }
#endif
    (void)isa;
    scratch own, *sp = scratch_get(NULL, &own, l->group_size), s = *sp;
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        unpack_stream(packed + kv_layout_group_offset(l, bits, g), v.len, bits, s.a);
        for (uint32_t i = 0; i < v.len; i++)
            codes[v.first + i * v.stride] = s.a[i];
    }
    scratch_put(sp, &own);
}
