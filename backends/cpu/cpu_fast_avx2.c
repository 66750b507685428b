/* cpu_fast_avx2.c — the AVX2 codecs of the fast CPU device: encode, decode,
 * quantize, dequantize, pack and unpack of token groups that tile the rows
 * with G a multiple of 8, 8 groups at a time, and encode / decode of channel
 * groups (KIVI keys), 8 columns at a time (cpu_fast_avx2.h).
 *
 * Why they are bit-exact (docs/kernels.md "Numerics"): the minima and maxima
 * are exact whatever the order, and N3's `+ 0` makes the signed zero they end
 * on irrelevant; vcvtps2ph rounds to nearest even with subnormals and gives
 * ±Inf past 65504 exactly as kv_f16_from_f32 (N1), which is then saturated
 * (N2); the code is rint(clamp((x − z) / s)) with the correctly rounded
 * quotient (see quotient()), maxps returning its second operand (0) for NaN
 * and vcvtps2dq rounding half to even (N4); a scale of 0 takes N4's rule
 * directly (+Inf → 2^b − 1, else 0); dequantization is one fma. Packing
 * stores code & (2^w − 1) (N5). 8 codes of w bits are always w bytes, so
 * every chunk of 8 starts on a byte. No store reaches past a group's stream,
 * no load past it: chunks within 16 bytes of a stream's end move exactly w
 * bytes. */
#include "backends/cpu/cpu_fast_avx2.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/numerics.h"

#define KV_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))
#define KV_INLINE inline __attribute__((always_inline))

enum { ENCODE_PREFETCH = 4096 }; /* bytes ahead the min/max pass prefetches its input */

static inline uint64_t lane_mask(unsigned w) /* low w bits of each of four 16-bit lanes */
{
    uint64_t m = kv_code_max(w);
    return m | m << 16 | m << 32 | m << 48;
}

/* 8 codes (one per dword, below 2^w) → w bytes at out. wide: 16 bytes from
   out may be written (later chunks overwrite the excess). 4, 8 and 16 bits
   by packs and a shuffle, other widths by pext on four 16-bit lanes at a
   time (4w bits each). */
KV_AVX2 static KV_INLINE void emit8(__m256i q, unsigned w, uint8_t *out, int wide)
{
    __m128i u = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)); /* 8 x u16 */
    if (w == 16) {
        _mm_storeu_si128((__m128i *)out, u);
        return;
    }
    if (w == 8) {
        _mm_storel_epi64((__m128i *)out, _mm_packus_epi16(u, u));
        return;
    }
    if (w == 4) { /* dword k holds codes 2k, 2k + 1 in its 16-bit halves: bring them into byte 4k */
        __m128i v = _mm_or_si128(u, _mm_srli_epi32(u, 12));
        v = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
        uint32_t b = (uint32_t)_mm_cvtsi128_si32(v);
        memcpy(out, &b, 4);
        return;
    }
    uint64_t m = lane_mask(w);
    uint64_t p0 = _pext_u64((uint64_t)_mm_cvtsi128_si64(u), m), p1 = _pext_u64((uint64_t)_mm_extract_epi64(u, 1), m);
    unsigned h = 4 * w; /* bits of p0 and of p1: at most 60 here */
    uint64_t v[2] = {p0 | p1 << h, w > 8 ? p1 >> (64 - h) : 0}; /* 8w bits */
    if (wide) /* from registers: a 16-byte load of v would wait on its two 8-byte stores */
        _mm_storeu_si128((__m128i *)out, _mm_set_epi64x((long long)v[1], (long long)v[0]));
    else
        memcpy(out, v, w);
}

/* w bytes at in → 8 codes of width w, one per dword. wide: 16 bytes from in
   may be read. */
KV_AVX2 static KV_INLINE __m256i load8(const uint8_t *in, unsigned w, int wide)
{
    if (w == 16)
        return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)in));
    if (w == 8)
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)in));
    if (w == 4) {
        uint32_t b;
        memcpy(&b, in, 4);
        __m128i v = _mm_cvtsi32_si128((int)b), nib = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(v, nib), hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
        return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    }
    uint64_t v[2] = {0, 0};
    memcpy(v, in, wide ? 16 : w);
    uint64_t m = lane_mask(w);
    unsigned h = 4 * w; /* pdep takes the low 4w bits of its source: bits above are ignored */
    uint64_t c0 = _pdep_u64(v[0], m), c1 = _pdep_u64(v[0] >> h | v[1] << (64 - h), m);
    return _mm256_cvtepu16_epi32(_mm_set_epi64x((long long)c1, (long long)c0));
}

/* fp16 bits with ±Inf replaced by ±65504 (N2): 0x7c00 − 1 = 0x7bff, sign kept. */
KV_AVX2 static inline __m128i saturate_f16(__m128i h)
{
    __m128i inf = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    return _mm_add_epi16(h, inf);
}

/* Metadata of 8 groups from their finite minima and maxima (+Inf / −Inf where
   a group has none), as kv_quant_params; stores the first `count`, returns
   the fp32 scales and zeros. */
KV_AVX2 static void params8(__m256 vmn, __m256 vmx, unsigned bits, uint32_t count, uint16_t *scale, uint16_t *zero,
                            __m256 *S, __m256 *Z)
{
    const __m256 zero_v = _mm256_setzero_ps();
    __m256i have = _mm256_castps_si256(_mm256_cmp_ps(vmn, vmx, _CMP_LE_OQ));
    __m128i keep = _mm_packs_epi32(_mm256_castsi256_si128(have), _mm256_extracti128_si256(have, 1));
    vmn = _mm256_add_ps(vmn, zero_v); /* N3 */
    vmx = _mm256_add_ps(vmx, zero_v);
    __m256 range = _mm256_div_ps(_mm256_sub_ps(vmx, vmn), _mm256_set1_ps((float)kv_code_max(bits)));
    __m128i sh = _mm_and_si128(keep, saturate_f16(_mm256_cvtps_ph(range, _MM_FROUND_TO_NEAREST_INT)));
    __m128i zh = _mm_and_si128(keep, saturate_f16(_mm256_cvtps_ph(vmn, _MM_FROUND_TO_NEAREST_INT)));
    if (count >= 8) {
        _mm_storeu_si128((__m128i *)scale, sh);
        _mm_storeu_si128((__m128i *)zero, zh);
    } else {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, sh);
        memcpy(scale, t, count * sizeof *t);
        _mm_storeu_si128((__m128i *)t, zh);
        memcpy(zero, t, count * sizeof *t);
    }
    *S = _mm256_cvtph_ps(sh);
    *Z = _mm256_cvtph_ps(zh);
}

/* The minima (max = 0) or maxima (max = 1) of x[0..8) in lanes 0..7, by a
   transposing tree: 128-bit halves, then pairs, then single lanes (14
   shuffles and 7 min/max, where 8 full reductions take about 50). min and
   max are exact, so the order does not matter (N3 makes signed zeros +0). */
KV_AVX2 static KV_INLINE __m256 minmax8(const __m256 *x, int max)
{
#define KV_MM(a, b) (max ? _mm256_max_ps((a), (b)) : _mm256_min_ps((a), (b)))
    __m256 z[4], w[2];
    for (int k = 0; k < 4; k++) /* half 0: group k, half 1: group k + 4 */
        z[k] = KV_MM(_mm256_permute2f128_ps(x[k], x[k + 4], 0x20), _mm256_permute2f128_ps(x[k], x[k + 4], 0x31));
    for (int k = 0; k < 2; k++) /* half 0: groups 2k, 2k, 2k+1, 2k+1; half 1 the same + 4 */
        w[k] = KV_MM(_mm256_shuffle_ps(z[2 * k], z[2 * k + 1], 0x44), _mm256_shuffle_ps(z[2 * k], z[2 * k + 1], 0xEE));
    return KV_MM(_mm256_shuffle_ps(w[0], w[1], 0x88), _mm256_shuffle_ps(w[0], w[1], 0xDD));
#undef KV_MM
}

/* The codes rint(clamp((x − z) / s, 0, 2^b − 1)) of 8 lanes from d = x − z,
   with the correctly rounded quotient but without a division in the common
   case (b <= 12). t = d * fl(1/s) is within |d/s|·2^-22.4 of the exact
   quotient, and so is fl(d/s). Clamping is monotone and 1-Lipschitz, and a
   lane whose quotient is far outside [0, 2^b − 1] clamps to the same integer
   either way, so the two codes can differ only where the clamped c is within
   (2^b)·2^-22 of a half-integer, that is |c − rint(c)| >= 0.5 − (2^b)·2^-20
   (a margin of 4). A vector holding such a lane (about 2^b·2^-19 of lanes)
   is divided exactly. NaN lanes clamp to 0 (maxps returns its second
   operand), +Inf to 2^b − 1, −Inf to 0, like the division's. */
KV_AVX2 static KV_INLINE __m256i codes8(__m256 d, __m256 s, __m256 inv, unsigned bits)
{
    const __m256 zero_v = _mm256_setzero_ps(), vmax = _mm256_set1_ps((float)kv_code_max(bits));
    if (bits > 12) /* most vectors would hold a risky lane: divide outright */
        return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(d, s), zero_v), vmax));
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 risky = _mm256_set1_ps(0.5f - (float)(1u << bits) * 0x1p-20f);
    __m256 c = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(d, inv), zero_v), vmax);
    __m256i q = _mm256_cvtps_epi32(c); /* round half to even */
    __m256 off = _mm256_and_ps(_mm256_sub_ps(c, _mm256_cvtepi32_ps(q)), abs_mask);
    if (_mm256_movemask_ps(_mm256_cmp_ps(off, risky, _CMP_GE_OQ)))
        q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(d, s), zero_v), vmax));
    return q;
}

/* The finite minima and maxima of a group's 8 lanes (NaN and ±Inf left out). */
KV_AVX2 static void minmax_finite(const float *xj, uint32_t G, __m256 *mn, __m256 *mx)
{
    const __m256 zero_v = _mm256_setzero_ps();
    __m256 a = _mm256_set1_ps(__builtin_inff()), b = _mm256_set1_ps(-__builtin_inff());
    for (uint32_t i = 0; i < G; i += 8) {
        __m256 v = _mm256_loadu_ps(xj + i);
        __m256 fin = _mm256_cmp_ps(_mm256_sub_ps(v, v), zero_v, _CMP_EQ_OQ); /* not NaN, not ±Inf */
        a = _mm256_blendv_ps(a, _mm256_min_ps(a, v), fin);
        b = _mm256_blendv_ps(b, _mm256_max_ps(b, v), fin);
    }
    *mn = a;
    *mx = b;
}

/* Codes one group of G values (xj) with scale sj, zero zj and 1/sj = invj:
   the anchor (or the code) of width aw to ao, the residual to ro (abits > 0).
   Inlined with constant widths by its caller. */
KV_AVX2 static KV_INLINE void code_group(const float *xj, uint32_t G, unsigned bits, unsigned abits, unsigned aw,
                                         float sj, float zj, float invj, uint8_t *ao, uint8_t *ro)
{
    const __m256 pinf = _mm256_set1_ps(__builtin_inff());
    const __m256i qmax = _mm256_set1_epi32((int)kv_code_max(bits));
    unsigned r = abits ? bits - abits : 0;
    const __m128i rshift = _mm_cvtsi32_si128((int)r);
    const __m256i rmask = _mm256_set1_epi32((int)kv_code_max(r ? r : 1));
    const __m256 vz = _mm256_set1_ps(zj), vs = _mm256_set1_ps(sj), vinv = _mm256_set1_ps(invj);
    int constant = sj == 0.0f;
    for (uint32_t i = 0; i < G; i += 8) {
        /* the same line of the next batch streams in while this one is coded
           (smaller batches are already prefetched by the min/max pass) */
        if (8 * (size_t)G * sizeof *xj > ENCODE_PREFETCH && i % 16 == 0)
            _mm_prefetch((const char *)(xj + 8 * (size_t)G + i), _MM_HINT_T0);
        __m256 x = _mm256_loadu_ps(xj + i);
        __m256i q;
        if (constant) { /* N4 for s == 0: +Inf → 2^b − 1, everything else 0 */
            q = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(x, pinf, _CMP_EQ_OQ)), qmax);
        } else {
            q = codes8(_mm256_sub_ps(x, vz), vs, vinv, bits);
        }
        size_t left = G - i; /* codes from this chunk to the group's end */
        emit8(abits ? _mm256_srl_epi32(q, rshift) : q, aw, ao + (size_t)i * aw / 8, left * aw / 8 >= 16);
        if (abits)
            emit8(_mm256_and_si256(q, rmask), r, ro + (size_t)i * r / 8, left * r / 8 >= 16);
    }
}

/* Encodes `count` (1..8) consecutive groups of G values (G % 8 == 0). */
KV_AVX2 static void encode_batch(const float *x, uint32_t count, uint32_t G, unsigned bits, unsigned abits,
                                 int codes16, uint8_t *aout, uint8_t *rout, uint16_t *scale, uint16_t *zero)
{
    const __m256 pinf = _mm256_set1_ps(__builtin_inff()), ninf = _mm256_set1_ps(-__builtin_inff());
    __m256 vmn[8], vmx[8]; /* per group: 8 lanes of finite minima and maxima (±Inf where none) */
    for (uint32_t j = 0; j < 8; j++) {
        const float *xj = x + (size_t)j * G;
        __m256 mn = pinf, mx = ninf;
        for (uint32_t i = 0; i < G && j < count; i += 8) {
            /* one core alone does not keep enough reads in flight to stream at
               memory speed (prefetches do not fault) */
            if (i % 16 == 0)
                _mm_prefetch((const char *)((uintptr_t)(xj + i) + ENCODE_PREFETCH), _MM_HINT_T0);
            __m256 v = _mm256_loadu_ps(xj + i);
            mn = _mm256_min_ps(v, mn); /* a NaN v gives the second operand: NaN is skipped */
            mx = _mm256_max_ps(v, mx);
        }
        /* −Inf reached the minima or +Inf the maxima (rare): again without the infinities */
        if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ), _mm256_cmp_ps(mx, pinf, _CMP_EQ_OQ))))
            minmax_finite(xj, G, &mn, &mx);
        vmn[j] = mn;
        vmx[j] = mx;
    }
    __m256 S, Z;
    params8(minmax8(vmn, 0), minmax8(vmx, 1), bits, count, scale, zero, &S, &Z);
    float sv[8], zv[8], inv[8];
    _mm256_storeu_ps(sv, S);
    _mm256_storeu_ps(zv, Z);
    _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), S)); /* Inf where s == 0: unused there */

    unsigned r = abits ? bits - abits : 0, aw = codes16 ? 16 : abits ? abits : bits;
    size_t abytes = (size_t)G * aw / 8, rbytes = (size_t)G * r / 8;
    for (uint32_t j = 0; j < count; j++) {
        const float *xj = x + (size_t)j * G;
        uint8_t *ao = aout + j * abytes, *ro = abits ? rout + j * rbytes : NULL;
        /* the benchmarks' formats with their widths as constants (emit8 then has no branches) */
        if (bits == 16 && abits == 4 && !codes16)
            code_group(xj, G, 16, 4, 4, sv[j], zv[j], inv[j], ao, ro);
        else if (bits == 8 && abits == 4 && !codes16)
            code_group(xj, G, 8, 4, 4, sv[j], zv[j], inv[j], ao, ro);
        else if (bits == 8 && !abits && !codes16)
            code_group(xj, G, 8, 0, 8, sv[j], zv[j], inv[j], ao, ro);
        else if (bits == 4 && !abits && !codes16)
            code_group(xj, G, 4, 0, 4, sv[j], zv[j], inv[j], ao, ro);
        else if (bits == 8 && codes16)
            code_group(xj, G, 8, 0, 16, sv[j], zv[j], inv[j], ao, ro);
        else
            code_group(xj, G, bits, abits, aw, sv[j], zv[j], inv[j], ao, ro);
    }
}

void kv_cpu_avx2_encode(const float *x, uint32_t G, unsigned bits, unsigned abits, int codes16, uint8_t *anchor,
                        uint8_t *residual, uint16_t *scale, uint16_t *zero, size_t g0, size_t g1)
{
    unsigned aw = codes16 ? 16 : abits ? abits : bits, r = abits ? bits - abits : 0;
    for (size_t g = g0; g < g1; g += 8) {
        uint32_t count = g1 - g < 8 ? (uint32_t)(g1 - g) : 8;
        encode_batch(x + g * G, count, G, bits, abits, codes16, anchor + g * G * aw / 8,
                     abits ? residual + g * G * r / 8 : NULL, scale + g, zero + g);
    }
}

/* Decodes one group of G values from its anchor (or full, or u16 with codes16)
   stream ai and residual stream ri (NULL: midpoints when abits > 0). Inlined
   with constant widths by its caller. */
KV_AVX2 static KV_INLINE void decode_group(const uint8_t *ai, const uint8_t *ri, uint32_t G, unsigned bits,
                                           unsigned abits, int codes16, float sj, float zj, float *o)
{
    unsigned r = abits ? bits - abits : 0, aw = codes16 ? 16 : abits ? abits : bits;
    const __m256i width_mask = _mm256_set1_epi32((int)kv_code_max(abits ? abits : bits));
    const __m128i shift = _mm_cvtsi32_si128((int)r);
    const __m256 mid = _mm256_set1_ps(abits && !ri ? (float)kv_code_max(r) / 2.0f : 0.0f);
    const __m256 vs = _mm256_set1_ps(sj), vz = _mm256_set1_ps(zj);
    for (uint32_t i = 0; i < G; i += 8) {
        size_t left = G - i;
        __m256i q = load8(ai + (size_t)i * aw / 8, aw, left * aw / 8 >= 16);
        if (codes16)
            q = _mm256_and_si256(q, width_mask);
        __m256 f;
        if (!abits)
            f = _mm256_cvtepi32_ps(q);
        else if (!ri) /* exact: an integer below 2^16 plus (2^r − 1) / 2 */
            f = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sll_epi32(q, shift)), mid);
        else
            f = _mm256_cvtepi32_ps(
                _mm256_or_si256(_mm256_sll_epi32(q, shift), load8(ri + (size_t)i * r / 8, r, left * r / 8 >= 16)));
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(f, vs, vz));
    }
}

/* Decodes `count` (1..8) consecutive groups of G values (G % 8 == 0). */
KV_AVX2 static void decode_batch(const uint8_t *ain, const uint8_t *rin, uint32_t count, uint32_t G, unsigned bits,
                                 unsigned abits, int codes16, const uint16_t *scale, const uint16_t *zero,
                                 float *out)
{
    uint16_t sh[8] = {0}, zh[8] = {0};
    memcpy(sh, scale, count * sizeof *sh);
    memcpy(zh, zero, count * sizeof *zh);
    float sv[8], zv[8];
    _mm256_storeu_ps(sv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sh)));
    _mm256_storeu_ps(zv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)zh)));
    unsigned r = abits ? bits - abits : 0, aw = codes16 ? 16 : abits ? abits : bits;
    size_t abytes = (size_t)G * aw / 8, rbytes = (size_t)G * r / 8;
    for (uint32_t j = 0; j < count; j++) {
        const uint8_t *ai = ain + j * abytes, *ri = rin ? rin + j * rbytes : NULL;
        float *o = out + (size_t)j * G;
        if (codes16 && bits == 8 && !abits)
            decode_group(ai, NULL, G, 8, 0, 1, sv[j], zv[j], o);
        else if (codes16)
            decode_group(ai, NULL, G, bits, abits, 1, sv[j], zv[j], o);
        else if (bits == 8 && !abits)
            decode_group(ai, NULL, G, 8, 0, 0, sv[j], zv[j], o);
        else if (bits == 4 && !abits)
            decode_group(ai, NULL, G, 4, 0, 0, sv[j], zv[j], o);
        else if (bits == 8 && abits == 4 && ri)
            decode_group(ai, ri, G, 8, 4, 0, sv[j], zv[j], o);
        else if (bits == 8 && abits == 4)
            decode_group(ai, NULL, G, 8, 4, 0, sv[j], zv[j], o);
        else
            decode_group(ai, ri, G, bits, abits, 0, sv[j], zv[j], o);
    }
}

void kv_cpu_avx2_decode(const uint8_t *anchor, const uint8_t *residual, uint32_t G, unsigned bits, unsigned abits,
                        int codes16, const uint16_t *scale, const uint16_t *zero, float *out, size_t g0, size_t g1)
{
    unsigned aw = codes16 ? 16 : abits ? abits : bits, r = abits ? bits - abits : 0;
    for (size_t g = g0; g < g1; g += 8) {
        uint32_t count = g1 - g < 8 ? (uint32_t)(g1 - g) : 8;
        decode_batch(anchor + g * G * aw / 8, abits && residual ? residual + g * G * r / 8 : NULL, count, G, bits,
                     abits, codes16, scale + g, zero + g, out + g * G);
    }
}

KV_AVX2 static KV_INLINE void pack_range(const uint16_t *codes, uint8_t *packed, size_t e0, size_t e1, unsigned w)
{
    const __m256i mask = _mm256_set1_epi32((int)kv_code_max(w));
    for (size_t e = e0; e < e1; e += 8) {
        __m256i q = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(codes + e)));
        emit8(_mm256_and_si256(q, mask), w, packed + e * w / 8, (e1 - e) * w / 8 >= 16);
    }
}

KV_AVX2 static KV_INLINE void unpack_range(const uint8_t *packed, uint16_t *codes, size_t e0, size_t e1, unsigned w)
{
    for (size_t e = e0; e < e1; e += 8) {
        __m256i q = load8(packed + e * w / 8, w, (e1 - e) * w / 8 >= 16);
        _mm_storeu_si128((__m128i *)(codes + e),
                         _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
}

KV_AVX2 void kv_cpu_avx2_pack(const uint16_t *codes, uint8_t *packed, size_t e0, size_t e1, unsigned w)
{
    if (w == 4) /* the benchmark's width as a constant */
        pack_range(codes, packed, e0, e1, 4);
    else
        pack_range(codes, packed, e0, e1, w);
}

KV_AVX2 void kv_cpu_avx2_unpack(const uint8_t *packed, uint16_t *codes, size_t e0, size_t e1, unsigned w)
{
    if (w == 4)
        unpack_range(packed, codes, e0, e1, 4);
    else
        unpack_range(packed, codes, e0, e1, w);
}

/* ---- Channel groups (KIVI keys): 8 columns at a time ------------------------
 * A block of G rows by 8 columns is 8 groups whose values arrive row by row
 * as one vector: min/max and codes are vertical, the metadata is params8
 * directly. Each column's stream is built in a 64-bit word per lane (columns
 * 0-3 and 4-7 in two vectors) and written when the word fills, the last,
 * partial word bytewise. Readers load the same words and never read a byte
 * past a stream's end. All columns of a block have the same group length, so
 * one bit position serves every lane. */

typedef struct lanes8 {
    __m256i lo, hi; /* the current word of columns 0-3 and 4-7 */
    unsigned pos;   /* bits of the current word already used */
    size_t word;    /* index of the current word */
    unsigned w;     /* bits per code */
    uint8_t *base;  /* stream of the first column (writer); const for readers */
    size_t stride;  /* bytes from one column's stream to the next */
    size_t bytes;   /* bytes of each stream */
    uint32_t live;  /* columns that exist, 1..8 */
    int need_load;  /* reader: the current word is not loaded yet */
} lanes8;

KV_AVX2 static inline lanes8 lanes8_at(uint8_t *base, size_t bytes, unsigned w, uint32_t live, int reader)
{
    lanes8 io = {_mm256_setzero_si256(), _mm256_setzero_si256(), 0, 0, w, base, bytes, bytes, live, reader};
    return io;
}

/* Writes the first nbytes of the current word of every live column. */
KV_AVX2 static void lanes8_store(const lanes8 *io, size_t nbytes)
{
    uint64_t t[8];
    _mm256_storeu_si256((__m256i *)t, io->lo);
    _mm256_storeu_si256((__m256i *)(t + 4), io->hi);
    for (uint32_t k = 0; k < io->live; k++)
        memcpy(io->base + k * io->stride + io->word * 8, &t[k], nbytes);
}

/* Appends 8 codes (one per dword, below 2^w). */
KV_AVX2 static KV_INLINE void lanes8_put(lanes8 *io, __m256i q)
{
    __m256i lo = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(q));
    __m256i hi = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(q, 1));
    __m128i sh = _mm_cvtsi32_si128((int)io->pos);
    io->lo = _mm256_or_si256(io->lo, _mm256_sll_epi64(lo, sh));
    io->hi = _mm256_or_si256(io->hi, _mm256_sll_epi64(hi, sh));
    if (io->pos + io->w < 64) {
        io->pos += io->w;
        return;
    }
    lanes8_store(io, 8);
    io->word++;
    __m128i used = _mm_cvtsi32_si128((int)(64 - io->pos)); /* bits of q that went into the stored word */
    io->lo = _mm256_srl_epi64(lo, used);                     /* shifts of 64 give 0 */
    io->hi = _mm256_srl_epi64(hi, used);
    io->pos = io->pos + io->w - 64;
}

KV_AVX2 static void lanes8_finish(lanes8 *io)
{
    if (io->pos)
        lanes8_store(io, (io->pos + 7) / 8);
}

/* Word `word` of every live column's stream (bytes past its end read as 0). */
KV_AVX2 static void lanes8_load(const lanes8 *io, size_t word, __m256i *lo, __m256i *hi)
{
    uint64_t t[8] = {0};
    size_t n = io->bytes > word * 8 ? io->bytes - word * 8 : 0;
    n = n < 8 ? n : 8;
    for (uint32_t k = 0; k < io->live; k++)
        memcpy(&t[k], io->base + k * io->stride + word * 8, n);
    *lo = _mm256_set_epi64x((long long)t[3], (long long)t[2], (long long)t[1], (long long)t[0]);
    *hi = _mm256_set_epi64x((long long)t[7], (long long)t[6], (long long)t[5], (long long)t[4]);
}

/* The next 8 codes, one per dword. */
KV_AVX2 static KV_INLINE __m256i lanes8_get(lanes8 *io)
{
    if (io->need_load) {
        lanes8_load(io, io->word, &io->lo, &io->hi);
        io->need_load = 0;
    }
    __m128i sh = _mm_cvtsi32_si128((int)io->pos);
    __m256i lo = _mm256_srl_epi64(io->lo, sh), hi = _mm256_srl_epi64(io->hi, sh);
    int spill = io->pos + io->w > 64;
    __m256i nlo = lo, nhi = hi;
    if (spill) {
        lanes8_load(io, io->word + 1, &nlo, &nhi);
        __m128i back = _mm_cvtsi32_si128((int)(64 - io->pos));
        lo = _mm256_or_si256(lo, _mm256_sll_epi64(nlo, back));
        hi = _mm256_or_si256(hi, _mm256_sll_epi64(nhi, back));
    }
    __m256i m = _mm256_set1_epi64x((long long)kv_code_max(io->w));
    lo = _mm256_and_si256(lo, m);
    hi = _mm256_and_si256(hi, m);
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
    /* the low dwords of the 8 qwords: (0, 1, 4, 5 | 2, 3, 6, 7), then in order */
    __m256 d = _mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), 0x88);
    return _mm256_permute4x64_epi64(_mm256_castps_si256(d), 0xD8);
}

/* Lanes below live: all ones. */
KV_AVX2 static inline __m256i live_lanes(uint32_t live)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Encodes the groups of block b, columns [c0, c0 + live). */
KV_AVX2 static void encode_channel(const kv_quant_layout *l, uint32_t b, uint32_t c0, uint32_t live, unsigned bits,
                                   unsigned abits, const float *x, uint8_t *aplane, uint8_t *rplane, uint16_t *scale,
                                   uint16_t *zero)
{
    const __m256 zero_v = _mm256_setzero_ps(), pinf = _mm256_set1_ps(__builtin_inff());
    uint32_t C = l->cols, G = l->group_size;
    size_t g = (size_t)b * C + c0;
    uint32_t n = kv_layout_group_len(l, g);
    const float *x0 = x + (size_t)b * G * C + c0;
    const __m256i lm = live_lanes(live);
    __m256 vmn = pinf, vmx = _mm256_set1_ps(-__builtin_inff());
    for (uint32_t i = 0; i < n; i++) {
        __m256 v = _mm256_maskload_ps(x0 + (size_t)i * C, lm);
        __m256 fin = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(v, v), zero_v, _CMP_EQ_OQ), _mm256_castsi256_ps(lm));
        vmn = _mm256_blendv_ps(vmn, _mm256_min_ps(vmn, v), fin);
        vmx = _mm256_blendv_ps(vmx, _mm256_max_ps(vmx, v), fin);
    }
    __m256 S, Z;
    params8(vmn, vmx, bits, live, scale + g, zero + g, &S, &Z);
    unsigned r = abits ? bits - abits : 0, aw = abits ? abits : bits;
    size_t abytes = ((size_t)n * aw + 7) / 8, rbytes = ((size_t)n * r + 7) / 8;
    lanes8 wa = lanes8_at(aplane + kv_layout_group_offset(l, aw, g), abytes, aw, live, 0);
    lanes8 wr = abits ? lanes8_at(rplane + kv_layout_group_offset(l, r, g), rbytes, r, live, 0) : wa;
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), S); /* Inf where s == 0: replaced */
    const __m256i qmax = _mm256_set1_epi32((int)kv_code_max(bits)), rmask = _mm256_set1_epi32((int)kv_code_max(r ? r : 1));
    const __m128i rshift = _mm_cvtsi32_si128((int)r);
    const __m256 s0 = _mm256_cmp_ps(S, zero_v, _CMP_EQ_OQ); /* N4's rule for s == 0 (dead lanes too) */
    for (uint32_t i = 0; i < n; i++) {
        __m256 v = _mm256_maskload_ps(x0 + (size_t)i * C, lm);
        __m256 d = _mm256_sub_ps(v, Z);
        __m256i q = codes8(d, S, inv, bits); /* s == 0 lanes are replaced below */
        __m256i q0 = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, pinf, _CMP_EQ_OQ)), qmax);
        q = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(q), _mm256_castsi256_ps(q0), s0));
        lanes8_put(&wa, abits ? _mm256_srl_epi32(q, rshift) : q);
        if (abits)
            lanes8_put(&wr, _mm256_and_si256(q, rmask));
    }
    lanes8_finish(&wa);
    if (abits)
        lanes8_finish(&wr);
}

KV_AVX2 static void decode_channel(const kv_quant_layout *l, uint32_t b, uint32_t c0, uint32_t live, unsigned bits,
                                   unsigned abits, const uint8_t *aplane, const uint8_t *rplane,
                                   const uint16_t *scale, const uint16_t *zero, float *out)
{
    uint32_t C = l->cols, G = l->group_size;
    size_t g = (size_t)b * C + c0;
    uint32_t n = kv_layout_group_len(l, g);
    uint16_t sh[8] = {0}, zh[8] = {0};
    memcpy(sh, scale + g, live * sizeof *sh);
    memcpy(zh, zero + g, live * sizeof *zh);
    const __m256 S = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sh));
    const __m256 Z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)zh));
    unsigned r = abits ? bits - abits : 0, aw = abits ? abits : bits;
    size_t abytes = ((size_t)n * aw + 7) / 8, rbytes = ((size_t)n * r + 7) / 8;
    lanes8 ra = lanes8_at((uint8_t *)(uintptr_t)(aplane + kv_layout_group_offset(l, aw, g)), abytes, aw, live, 1);
    lanes8 rr = abits && rplane
                    ? lanes8_at((uint8_t *)(uintptr_t)(rplane + kv_layout_group_offset(l, r, g)), rbytes, r, live, 1)
                    : ra;
    const __m128i shift = _mm_cvtsi32_si128((int)r);
    const __m256 mid = _mm256_set1_ps(abits && !rplane ? (float)kv_code_max(r) / 2.0f : 0.0f);
    const __m256i lm = live_lanes(live);
    float *o0 = out + (size_t)b * G * C + c0;
    for (uint32_t i = 0; i < n; i++) {
        __m256i q = lanes8_get(&ra);
        __m256 f;
        if (!abits)
            f = _mm256_cvtepi32_ps(q);
        else if (!rplane) /* exact */
            f = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sll_epi32(q, shift)), mid);
        else
            f = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_sll_epi32(q, shift), lanes8_get(&rr)));
        _mm256_maskstore_ps(o0 + (size_t)i * C, lm, _mm256_fmadd_ps(f, S, Z));
    }
}

/* Runs BODY over groups [g0, g1) of a channel layout as (block b_, columns
   [c_, c_ + k_)) pieces of at most 8 columns. */
#define KV_FOR_CHANNEL_PIECES8(l, g0, g1, BODY)                                                              \
    for (size_t g_ = (g0); g_ < (g1);) {                                                                      \
        uint32_t b_ = (uint32_t)(g_ / (l)->cols), c_ = (uint32_t)(g_ % (l)->cols);                            \
        size_t left_ = (g1) - g_, row_left_ = (l)->cols - c_;                                                 \
        uint32_t k_ = (uint32_t)(left_ < row_left_ ? left_ : row_left_);                                      \
        k_ = k_ < 8 ? k_ : 8;                                                                                 \
        BODY;                                                                                                  \
        g_ += k_;                                                                                              \
    }

void kv_cpu_avx2_encode_channel(const kv_quant_layout *l, unsigned bits, unsigned abits, const float *x,
                                uint8_t *anchor, uint8_t *residual, uint16_t *scale, uint16_t *zero, size_t g0,
                                size_t g1)
{
    KV_FOR_CHANNEL_PIECES8(l, g0, g1, encode_channel(l, b_, c_, k_, bits, abits, x, anchor, residual, scale, zero));
}

void kv_cpu_avx2_decode_channel(const kv_quant_layout *l, unsigned bits, unsigned abits, const uint8_t *anchor,
                                const uint8_t *residual, const uint16_t *scale, const uint16_t *zero, float *out,
                                size_t g0, size_t g1)
{
    KV_FOR_CHANNEL_PIECES8(l, g0, g1,
                           decode_channel(l, b_, c_, k_, bits, abits, anchor, abits ? residual : NULL, scale, zero,
                                          out));
}

#else
typedef int kv_cpu_fast_avx2_unused; /* not x86-64: nothing here (cpu_fast.c never calls in) */
#endif
