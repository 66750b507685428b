/* cpu_attention_avx2.c — the fast CPU attention item for AVX2 CPUs (AVX2,
 * FMA, F16C, BMI2; no AVX-512): dequantization fused into the dot products
 * and into the weighted sum of V, four (query, head) rows at a time, in
 * 8-lane vectors.
 *
 * The structure is that of cpu_attention_avx512.c. Rows are the (query, GQA
 * head) pairs of a work item, padded to a multiple of 4 with rows that see
 * nothing. For each page:
 *  - K pass: every token's 8-value chunks are dequantized once (same
 *    numerics as the decode kernel: fma(code, s, z), or the anchor midpoint)
 *    and fed to four dot products; two tokens at a time, their eight sums
 *    formed by one transposing reduction and stored token-major,
 *    logits[rowgroup][token][4] (AVX2 has 16 vector registers: 8
 *    accumulators, the two tokens' values and the scales and zeros).
 *  - softmax: an 8-lane vector holds 2 tokens x 4 rows, so max, exp and sum
 *    run over the 4 rows at once; the sum is kept in double across blocks.
 *  - V pass: 16 elements (two vectors) at a time, each token's chunk is
 *    dequantized and added to four row accumulators with its probabilities;
 *    each page's partial sums go into a double accumulator.
 * With more than one row group (verification: k queries x GQA heads) the K
 * and V passes take two row groups (8 rows) per read of the page.
 * K pages of channel groups (KIVI keys) with G % 8 == 0 and 1, 2, 4 or 8
 * bits are read channel by channel (k_pass_ch): 8 tokens of one channel are
 * w bytes of one group's stream, shifted per lane, dequantized with the
 * channel's scale and zero and multiplied into 8 token logits of each row.
 * Other pages whose layout is not "token groups of a multiple of 8 that
 * tile head_dim" (channel-grouped V, other channel widths, odd group sizes)
 * are decoded to an f32 tile first with the fused decode and then read like
 * f32 pages.
 * The item needs head_dim % 16 == 0. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_attention.h"
#include "backends/numerics.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define KV_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))
#define KV_INLINE inline __attribute__((always_inline))

/* Page readers, each specialised: f32, bf16, 8-bit and 16-bit codes, 4-bit
   and 2-bit codes (8 codes are one 32- or 16-bit word, shifted per lane),
   and any width (pdep). 8 codes of w bits are always w bytes. */
enum { SRC_F32, SRC_BF16, SRC_Q8, SRC_Q16, SRC_Q4, SRC_Q2, SRC_QANY, SRC_CH };

/* SRC_CH: K pages of channel groups (KIVI keys) with G % 8 == 0 and 1, 2, 4
   or 8 bits, read channel by channel for 8 tokens at once (k_pass_ch): 8
   tokens of one channel are w bytes of one group's stream. */

typedef struct src {
    int kind;                 /* SRC_* */
    int anchor_only;          /* quantized: codes are a-bit anchors, midpoint reconstruction */
    const uint8_t *data;      /* f32 values, bf16 bits, or the packed plane */
    const float *s, *z;       /* quantized: scale and zero of each group, f32 */
    unsigned w;               /* quantized: bits of each stored code */
    unsigned r;               /* anchor-only: shift b − a */
    float mid;                /* anchor-only: (2^r − 1) / 2 */
    uint32_t gpt;             /* groups per token (0: f32 and bf16, channel groups) */
    uint32_t G;               /* SRC_CH: tokens per channel group */
    uint32_t ntok;            /* SRC_CH: tokens of the page */
    uint16_t chunk_group[256]; /* quantized: group within the token of elements [8c, 8c + 8) */
} src;

static int is_quant(int kind)
{
    return kind >= SRC_Q8 && kind != SRC_CH;
}

/* Codes → dequantized values: fma(code, s, z), or the anchor midpoint. */
KV_AVX2 static KV_INLINE __m256 dequant(__m256i q, int anchor, const src *p, __m256 S, __m256 Z)
{
    __m256 f = anchor ? _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_slli_epi32(q, (int)p->r)), _mm256_set1_ps(p->mid))
                      : _mm256_cvtepi32_ps(q);
    return _mm256_fmadd_ps(f, S, Z);
}

/* Bytes of one token's values in the page's row-major [ntokens][head_dim]. */
static size_t row_bytes_of(const src *p, int kind, uint32_t hd)
{
    return kind == SRC_F32 ? 4 * (size_t)hd : kind == SRC_BF16 ? 2 * (size_t)hd : (size_t)hd * p->w / 8;
}

/* The values of elements [e, e + 8) of the row-major [ntokens][head_dim]
   values from base (e % 8 == 0): the page's start, or a token's values that
   the passes step by pointer; S and Z: the group's scale and zero. */
KV_AVX2 static KV_INLINE __m256 load_values_at(const src *p, int kind, int anchor, const uint8_t *base, size_t e,
                                              __m256 S, __m256 Z)
{
    if (kind == SRC_F32)
        return _mm256_loadu_ps((const float *)base + e);
    if (kind == SRC_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(base + 2 * e))), 16));
    if (kind == SRC_Q8)
        return dequant(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(base + e))), anchor, p, S, Z);
    if (kind == SRC_Q16)
        return dequant(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(base + 2 * e))), anchor, p, S, Z);
    if (kind == SRC_Q4 || kind == SRC_Q2) { /* lane i: the word shifted right by w i, masked to w bits */
        uint32_t word = 0;
        memcpy(&word, base + e * (kind == SRC_Q4 ? 4 : 2) / 8, kind == SRC_Q4 ? 4 : 2);
        const __m256i sh4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        const __m256i sh2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32((int)word), kind == SRC_Q4 ? sh4 : sh2);
        q = _mm256_and_si256(q, _mm256_set1_epi32(kind == SRC_Q4 ? 15 : 3));
        return dequant(q, anchor, p, S, Z);
    }
    /* any width (w <= 16): 8 codes are w bytes, two runs of 4 codes in 4w bits, spread into 16-bit lanes */
    uint8_t bytes[16] = {0};
    memcpy(bytes, base + e * p->w / 8, p->w);
    uint64_t part[2], lanes[2], m = kv_code_max(p->w);
    memcpy(part, bytes, 16);
    m |= m << 16 | m << 32 | m << 48;
    unsigned __int128 v = (unsigned __int128)part[1] << 64 | part[0];
    uint64_t low = p->w * 4 == 64 ? ~0ull : (1ull << (4 * p->w)) - 1;
    lanes[0] = _pdep_u64((uint64_t)v & low, m);
    lanes[1] = _pdep_u64((uint64_t)(v >> (4 * p->w)) & low, m);
    return dequant(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)lanes)), anchor, p, S, Z);
}

KV_AVX2 static KV_INLINE __m256 load_values(const src *p, int kind, int anchor, size_t e, __m256 S, __m256 Z)
{
    return load_values_at(p, kind, anchor, p->data, e, S, Z);
}

/* Prepares the reader of a page's K or V: f32 scales and zeros for fused
   quantized pages (into sz), or an f32 tile for the rest. */
KV_AVX2 static void src_prepare(const attn *t, fast_ws *w, const kv_page_desc *pg, int value, src *o)
{
    const kv_store_format *f = value ? &pg->value : &pg->key;
    uint32_t hd = t->a->head_dim;
    o->data = t->kv + (value ? pg->value_data : pg->key_data);
    o->gpt = 0; /* no scales: the passes step their scale rows by 0 */
    o->anchor_only = 0;
    if (f->kind == KV_STORE_F32 || f->kind == KV_STORE_BF16) {
        o->kind = f->kind == KV_STORE_F32 ? SRC_F32 : SRC_BF16;
        return;
    }
    unsigned width = f->anchor_bits ? f->anchor_bits : f->bits;
    int channel = !value && f->grouping == KV_GROUP_CHANNEL && f->group_size % 8 == 0 &&
                  (width == 1 || width == 2 || width == 4 || width == 8);
    if (!channel &&
        (f->grouping != KV_GROUP_TOKEN || f->group_size % 8 != 0 || hd % f->group_size != 0 || hd / 8 > 256)) {
        kv_cpu_page_tile(t, pg, value, w->tile, NULL, &w->dec);
        o->kind = SRC_F32;
        o->data = (const uint8_t *)w->tile;
        return;
    }
    o->w = f->anchor_bits ? f->anchor_bits : f->bits;
    o->kind = o->w == 8 ? SRC_Q8 : o->w == 16 ? SRC_Q16 : o->w == 4 ? SRC_Q4 : o->w == 2 ? SRC_Q2 : SRC_QANY;
    o->anchor_only = f->anchor_bits > 0;
    o->r = f->anchor_bits ? (unsigned)(f->bits - f->anchor_bits) : 0;
    o->mid = o->anchor_only ? (float)kv_code_max(o->r) / 2.0f : 0.0f; /* as kv_dequant_anchor */
    o->gpt = channel ? 0 : hd / f->group_size;
    for (uint32_t c = 0; c < hd / 8 && !channel; c++)
        o->chunk_group[c] = (uint16_t)(c * 8 / f->group_size);
    size_t groups = (size_t)pg->ntokens * o->gpt;
    if (channel) {
        o->kind = SRC_CH;
        o->G = f->group_size;
        o->ntok = pg->ntokens;
        groups = (size_t)(pg->ntokens + f->group_size - 1) / f->group_size * hd;
    }
    const uint16_t *meta = (const uint16_t *)(t->kv + (value ? pg->value_meta : pg->key_meta));
    float *s = w->sz, *z = w->sz + groups;
    size_t i = 0;
    for (; i + 8 <= groups; i += 8) {
        _mm256_storeu_ps(s + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(meta + i))));
        _mm256_storeu_ps(z + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(meta + groups + i))));
    }
    for (; i < groups; i++) {
        s[i] = kv_f16_to_f32(meta[i]);
        z[i] = kv_f16_to_f32(meta[groups + i]);
    }
    o->s = s;
    o->z = z;
}

/* The scale and zero of group g of the token whose scales and zeros start at
   s_row and z_row (the passes step them by pointer from token to token). */
KV_AVX2 static KV_INLINE void tables_at(int kind, const float *s_row, const float *z_row, uint32_t g, __m256 *S,
                                        __m256 *Z)
{
    if (!is_quant(kind))
        return;
    *S = _mm256_broadcast_ss(s_row + g);
    *Z = _mm256_broadcast_ss(z_row + g);
}

/* tables_at() for the group holding element e of token t. */
KV_AVX2 static KV_INLINE void tables(const src *p, int kind, uint32_t t, uint32_t e, __m256 *S, __m256 *Z)
{
    if (!is_quant(kind))
        return;
    size_t row = (size_t)t * p->gpt;
    tables_at(kind, p->s + row, p->z + row, p->chunk_group[e / 8], S, Z);
}

/* The sums of a[0..8) in lanes 0..7 (a transposing hadd tree). */
KV_AVX2 static KV_INLINE __m256 reduce8(const __m256 *a)
{
    __m256 h0 = _mm256_hadd_ps(a[0], a[1]), h1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h2 = _mm256_hadd_ps(a[4], a[5]), h3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3); /* halves: inputs 0-3 | 4-7 of each half */
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

/* The sums of a0..a3 in lanes 0..3. */
KV_AVX2 static KV_INLINE __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 g = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

/* Lanes where pos <= qpos (unsigned) and valid is all ones. */
KV_AVX2 static KV_INLINE __m256i sees8(__m256i pos, __m256i qpos, __m256i valid)
{
    return _mm256_and_si256(valid, _mm256_cmpeq_epi32(_mm256_max_epu32(pos, qpos), qpos));
}

KV_AVX2 static KV_INLINE __m128i sees4(__m128i pos, __m128i qpos, __m128i valid)
{
    return _mm_and_si128(valid, _mm_cmpeq_epi32(_mm_max_epu32(pos, qpos), qpos));
}

/* Logits of the 4 rows of each of NG row groups (NG = 1 or 2; q: [4 NG][hd])
   for the page's tokens → L[g][token][4] (group g at L + g * lstride); -Inf
   where a row does not see the token (its position is above the row's query
   position, or the row is padding). valid: all-ones lanes for live rows. */
KV_AVX2 static KV_INLINE void k_pass(const src *p, int kind, int anchor, int NG, uint32_t ntok, uint32_t hd,
                                     const float *q, float scale, const uint32_t *pos, const uint32_t *qpos,
                                     const uint32_t *valid, float *L, size_t lstride, pf_cursor *pf)
{
    const __m256 ninf8 = _mm256_set1_ps(-INFINITY), vscale8 = _mm256_set1_ps(scale);
    uint32_t t = 0;
    if (NG == 1) { /* two tokens at a time: 8 sums, one reduction */
        const __m256i qpos8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qpos));
        const __m256i valid8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)valid));
        const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
        const uint8_t *row = p->data;             /* token t's values */
        const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
        for (; t + 2 <= ntok; t += 2, row += 2 * row_bytes, s_row += 2 * gpt, z_row += 2 * gpt) {
            __m256 acc[8], S0 = _mm256_setzero_ps(), Z0 = S0, S1 = S0, Z1 = S0;
            for (int i = 0; i < 8; i++)
                acc[i] = _mm256_setzero_ps();
            for (uint32_t e = 0; e < hd; e += 8) {
                if (e % 16 == 0)
                    kv_cpu_prefetch_step(pf);
                uint32_t g = is_quant(kind) ? p->chunk_group[e / 8] : 0;
                tables_at(kind, s_row, z_row, g, &S0, &Z0);
                tables_at(kind, s_row + gpt, z_row + gpt, g, &S1, &Z1);
                __m256 v0 = load_values_at(p, kind, anchor, row, e, S0, Z0);
                __m256 v1 = load_values_at(p, kind, anchor, row + row_bytes, e, S1, Z1);
                for (uint32_t r = 0; r < 4; r++) {
                    __m256 qv = _mm256_loadu_ps(q + (size_t)r * hd + e);
                    acc[r] = _mm256_fmadd_ps(qv, v0, acc[r]);
                    acc[4 + r] = _mm256_fmadd_ps(qv, v1, acc[4 + r]);
                }
            }
            __m256 l = _mm256_mul_ps(reduce8(acc), vscale8);
            __m256i pos8 = _mm256_setr_m128i(_mm_set1_epi32((int)pos[t]), _mm_set1_epi32((int)pos[t + 1]));
            __m256i see = sees8(pos8, qpos8, valid8);
            _mm256_storeu_ps(L + 4 * (size_t)t, _mm256_blendv_ps(ninf8, l, _mm256_castsi256_ps(see)));
        }
    }
    /* one token at a time, 4 NG rows */
    const __m128 ninf = _mm_set1_ps(-INFINITY), vscale = _mm_set1_ps(scale);
    for (; t < ntok; t++) {
        __m256 a[8], S = _mm256_setzero_ps(), Z = S;
        for (int r = 0; r < 4 * NG; r++)
            a[r] = _mm256_setzero_ps();
        for (uint32_t e = 0; e < hd; e += 8) {
            if (e % 16 == 0)
                kv_cpu_prefetch_step(pf);
            tables(p, kind, t, e, &S, &Z);
            __m256 v = load_values(p, kind, anchor, (size_t)t * hd + e, S, Z);
            for (int r = 0; r < 4 * NG; r++)
                a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)r * hd + e), v, a[r]);
        }
        __m128i pt = _mm_set1_epi32((int)pos[t]);
        if (NG == 2) { /* both groups' 8 sums from one reduction */
            __m256 l = _mm256_mul_ps(reduce8(a), vscale8);
            __m256i see = sees8(_mm256_set1_epi32((int)pos[t]), _mm256_loadu_si256((const __m256i *)qpos),
                                _mm256_loadu_si256((const __m256i *)valid));
            l = _mm256_blendv_ps(ninf8, l, _mm256_castsi256_ps(see));
            _mm_storeu_ps(L + 4 * (size_t)t, _mm256_castps256_ps128(l));
            _mm_storeu_ps(L + lstride + 4 * (size_t)t, _mm256_extractf128_ps(l, 1));
        } else {
            __m128 l = _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), vscale);
            __m128i see = sees4(pt, _mm_loadu_si128((const __m128i *)qpos), _mm_loadu_si128((const __m128i *)valid));
            _mm_storeu_ps(L + 4 * (size_t)t, _mm_blendv_ps(ninf, l, _mm_castsi128_ps(see)));
        }
    }
}

/* ---- Channel-grouped K pages (KIVI keys) ----------------------------------------- */

/* The values of 8 tokens of one channel whose W-bit codes start at `at`
   (nb bytes hold them: W, or fewer at the page's end, where the missing
   tokens get the value z), dequantized exactly as dequant() does. */
KV_AVX2 static KV_INLINE __m256 ch_values(const uint8_t *at, unsigned W, int anchor, const src *p, size_t nb,
                                          __m256 S, __m256 Z)
{
    uint64_t word = 0;
    if (nb == W)
        memcpy(&word, at, W);
    else
        memcpy(&word, at, nb);
    __m256i q;
    if (W == 8) {
        q = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)word));
    } else {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        q = _mm256_srlv_epi32(_mm256_set1_epi32((int)(uint32_t)word), _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)W)));
        q = _mm256_and_si256(q, _mm256_set1_epi32((int)kv_code_max(W)));
    }
    return dequant(q, anchor, p, S, Z);
}

/* k_pass() for SRC_CH pages: 8 tokens at a time, channel by channel, each
   channel's codes dequantized once for the 8 tokens and multiplied into the
   four rows' logits; sums in blocks of 16 channels (no float chain longer
   than 16 terms), then transposed into the token-major logits. */
KV_AVX2 static KV_INLINE void k_pass_ch(const src *p, unsigned W, int anchor, uint32_t hd, const float *q,
                                        float scale, const uint32_t *pos, const uint32_t *qpos,
                                        const uint32_t *valid, float *L, pf_cursor *pf)
{
    const __m256 ninf8 = _mm256_set1_ps(-INFINITY), vscale8 = _mm256_set1_ps(scale);
    const __m256i qpos8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qpos));
    const __m256i valid8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)valid));
    const size_t full = ((size_t)p->G * W + 7) / 8; /* bytes of a whole group's stream */
    for (uint32_t t = 0; t < p->ntok; t += 8) {
        uint32_t blk = t / p->G, off = t % p->G;
        uint32_t glen = p->ntok - blk * p->G < p->G ? p->ntok - blk * p->G : p->G;
        uint32_t n = glen - off < 8 ? glen - off : 8;
        size_t cstride = ((size_t)glen * W + 7) / 8, nb = ((size_t)n * W + 7) / 8;
        const uint8_t *at = p->data + (size_t)blk * hd * full + (size_t)off * W / 8;
        const float *s = p->s + (size_t)blk * hd, *z = p->z + (size_t)blk * hd;
        __m256 tot[4];
        for (int r = 0; r < 4; r++)
            tot[r] = _mm256_setzero_ps();
        for (uint32_t c0 = 0; c0 < hd; c0 += 16) {
            __m256 acc[4];
            for (int r = 0; r < 4; r++)
                acc[r] = _mm256_setzero_ps();
            for (uint32_t c = c0; c < c0 + 16; c++) {
                if (c % 4 == 0)
                    kv_cpu_prefetch_step(pf);
                __m256 k = ch_values(at + c * cstride, W, anchor, p, nb, _mm256_broadcast_ss(s + c),
                                     _mm256_broadcast_ss(z + c));
                for (uint32_t r = 0; r < 4; r++)
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + (size_t)r * hd + c), k, acc[r]);
            }
            for (int r = 0; r < 4; r++)
                tot[r] = _mm256_add_ps(tot[r], acc[r]);
        }
        for (int r = 0; r < 4; r++)
            tot[r] = _mm256_mul_ps(tot[r], vscale8);
        /* rows x 8 tokens → [token][4]: u_k holds tokens k and k + 4 */
        __m256 x0 = _mm256_unpacklo_ps(tot[0], tot[1]), x1 = _mm256_unpackhi_ps(tot[0], tot[1]);
        __m256 x2 = _mm256_unpacklo_ps(tot[2], tot[3]), x3 = _mm256_unpackhi_ps(tot[2], tot[3]);
        __m256 u0 = _mm256_shuffle_ps(x0, x2, 0x44), u1 = _mm256_shuffle_ps(x0, x2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(x1, x3, 0x44), u3 = _mm256_shuffle_ps(x1, x3, 0xEE);
        __m256 pair[4] = {_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u2, u3, 0x20),
                          _mm256_permute2f128_ps(u0, u1, 0x31), _mm256_permute2f128_ps(u2, u3, 0x31)};
        for (uint32_t k = 0; 2 * k < n; k++) { /* pair[k]: tokens t + 2k, t + 2k + 1 */
            uint32_t i = t + 2 * k;
            __m256i pos8 = _mm256_setr_m128i(_mm_set1_epi32((int)pos[i]),
                                             _mm_set1_epi32((int)pos[2 * k + 1 < n ? i + 1 : i]));
            __m256 l = _mm256_blendv_ps(ninf8, pair[k], _mm256_castsi256_ps(sees8(pos8, qpos8, valid8)));
            if (2 * k + 1 < n)
                _mm256_storeu_ps(L + 4 * (size_t)i, l);
            else
                _mm_storeu_ps(L + 4 * (size_t)i, _mm256_castps256_ps128(l));
        }
    }
}

KV_AVX2 static void k_pass_ch_any(const src *p, uint32_t hd, const float *q, float scale, const uint32_t *pos,
                                  const uint32_t *qpos, const uint32_t *valid, float *L, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define CH_CALL(w, anchor) k_pass_ch(p, w, anchor, hd, q, scale, pos, qpos, valid, L, pf)
    switch (p->w * 2 + (unsigned)p->anchor_only) {
    case 2: CH_CALL(1, 0); break;
    case 3: CH_CALL(1, 1); break;
    case 4: CH_CALL(2, 0); break;
    case 5: CH_CALL(2, 1); break;
    case 8: CH_CALL(4, 0); break;
    case 9: CH_CALL(4, 1); break;
    case 16: CH_CALL(8, 0); break;
    default: CH_CALL(8, 1); break;
    }
#undef CH_CALL
    *pf_io = c;
}

KV_AVX2 static KV_INLINE void acc_add(double *d, __m256 v)
{
    _mm256_storeu_pd(d, _mm256_add_pd(_mm256_loadu_pd(d), _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
    _mm256_storeu_pd(d + 4, _mm256_add_pd(_mm256_loadu_pd(d + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
}

/* acc[4 NG][hd] (double) += P[g][token][4] · V over the page's tokens (group
   g's probabilities at P + g * pstride); the page's sums are formed in
   float, then added. NG = 1: 16 elements (two vectors) per read of the
   tokens; NG = 2: 8 elements for the 8 rows. */
KV_AVX2 static KV_INLINE void v_pass(const src *p, int kind, int anchor, int NG, uint32_t ntok, uint32_t hd,
                                     const float *P, size_t pstride, double *acc, pf_cursor *pf)
{
    const uint32_t nv = NG == 1 ? 2 : 1;
    const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
    for (uint32_t e = 0; e < hd; e += 8 * nv) {
        __m256 o[8][2], S = _mm256_setzero_ps(), Z = S, v[2];
        for (int r = 0; r < 4 * NG; r++)
            o[r][0] = o[r][1] = _mm256_setzero_ps();
        uint32_t g[2] = {0, 0}; /* each load's group within the token */
        for (uint32_t j = 0; j < nv && is_quant(kind); j++)
            g[j] = p->chunk_group[(e + 8 * j) / 8];
        const uint8_t *row = p->data;             /* token t's values */
        const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
        for (uint32_t t = 0; t < ntok; t++, row += row_bytes, s_row += gpt, z_row += gpt) {
            kv_cpu_prefetch_step(pf);
            for (uint32_t j = 0; j < nv; j++) {
                tables_at(kind, s_row, z_row, g[j], &S, &Z);
                v[j] = load_values_at(p, kind, anchor, row, e + 8 * j, S, Z);
            }
            for (int r = 0; r < 4 * NG; r++) {
                __m256 pr = _mm256_broadcast_ss(P + (size_t)(r / 4) * pstride + 4 * (size_t)t + r % 4);
                for (uint32_t j = 0; j < nv; j++)
                    o[r][j] = _mm256_fmadd_ps(pr, v[j], o[r][j]);
            }
        }
        for (int r = 0; r < 4 * NG; r++)
            for (uint32_t j = 0; j < nv; j++)
                acc_add(acc + (size_t)r * hd + e + 8 * j, o[r][j]);
    }
}

/* One instance per (kind, anchor, row groups) so that the compiler hoists every test. */
#define KV_SRC_SWITCH(call_k, NG)                                                                             \
    switch (p->kind * 2 + p->anchor_only) {                                                                    \
    case SRC_F32 * 2: call_k(SRC_F32, 0, NG); break;                                                           \
    case SRC_BF16 * 2: call_k(SRC_BF16, 0, NG); break;                                                         \
    case SRC_Q8 * 2: call_k(SRC_Q8, 0, NG); break;                                                             \
    case SRC_Q8 * 2 + 1: call_k(SRC_Q8, 1, NG); break;                                                         \
    case SRC_Q16 * 2: call_k(SRC_Q16, 0, NG); break;                                                           \
    case SRC_Q16 * 2 + 1: call_k(SRC_Q16, 1, NG); break;                                                       \
    case SRC_Q4 * 2: call_k(SRC_Q4, 0, NG); break;                                                             \
    case SRC_Q4 * 2 + 1: call_k(SRC_Q4, 1, NG); break;                                                         \
    case SRC_Q2 * 2: call_k(SRC_Q2, 0, NG); break;                                                             \
    case SRC_Q2 * 2 + 1: call_k(SRC_Q2, 1, NG); break;                                                         \
    case SRC_QANY * 2: call_k(SRC_QANY, 0, NG); break;                                                         \
    default: call_k(SRC_QANY, 1, NG); break;                                                                   \
    }

/* The K pass of NG (1 or 2) row groups; see k_pass(). */
KV_AVX2 static void k_pass_any(const src *p, int NG, uint32_t ntok, uint32_t hd, const float *q, float scale,
                               const uint32_t *pos, const uint32_t *qpos, const uint32_t *valid, float *L,
                               size_t lstride, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define K_CALL(kind, anchor, ng) k_pass(p, kind, anchor, ng, ntok, hd, q, scale, pos, qpos, valid, L, lstride, pf)
    if (p->kind == SRC_CH) { /* one row group at a time */
        for (int g = 0; g < NG; g++)
            k_pass_ch_any(p, hd, q + (size_t)g * 4 * hd, scale, pos, qpos + 4 * g, valid + 4 * g, L + g * lstride, pf);
    } else if (NG == 2) {
        KV_SRC_SWITCH(K_CALL, 2)
    } else {
        KV_SRC_SWITCH(K_CALL, 1)
    }
#undef K_CALL
    *pf_io = c;
}

/* The V pass of NG (1 or 2) row groups; see v_pass(). */
KV_AVX2 static void v_pass_any(const src *p, int NG, uint32_t ntok, uint32_t hd, const float *P, size_t pstride,
                               double *acc, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define V_CALL(kind, anchor, ng) v_pass(p, kind, anchor, ng, ntok, hd, P, pstride, acc, pf)
    if (NG == 2) {
        KV_SRC_SWITCH(V_CALL, 2)
    } else {
        KV_SRC_SWITCH(V_CALL, 1)
    }
#undef V_CALL
    *pf_io = c;
}

/* e^x for x <= 0 (Cephes-style: x = n ln2 + r, degree-6 polynomial in r,
   about 2 ulp), the same steps as cpu_attention_avx512.c's exp512; 0 where x
   is -Inf or below -87.3. p 2^n is formed by one multiplication by the
   exact power (n >= -126: a normal float), as vscalefps would form it. */
KV_AVX2 static KV_INLINE __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256 pow2n = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, pow2n));
}

/* L[i .. i + 8) of n floats (n % 4 == 0), -Inf past the end. */
KV_AVX2 static KV_INLINE __m256 load_or_ninf(const float *L, size_t i, size_t n)
{
    if (n - i >= 8)
        return _mm256_loadu_ps(L + i);
    return _mm256_insertf128_ps(_mm256_set1_ps(-INFINITY), _mm_loadu_ps(L + i), 0);
}

KV_AVX2 static KV_INLINE void store_part(float *L, size_t i, size_t n, __m256 x)
{
    if (n - i >= 8)
        _mm256_storeu_ps(L + i, x);
    else
        _mm_storeu_ps(L + i, _mm256_castps256_ps128(x));
}

/* Row-wise softmax of L[T][4] in place: 8 lanes = 2 tokens x 4 rows. A row
   that sees nothing becomes all zeros. */
KV_AVX2 static void softmax4(float *L, size_t T)
{
    size_t n = T * 4;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (size_t i = 0; i < n; i += 8)
        vmax = _mm256_max_ps(vmax, load_or_ninf(L, i, n));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_andnot_ps(_mm_cmp_ps(m4, _mm_set1_ps(-INFINITY), _CMP_EQ_OQ), m4); /* a row without tokens: 0 */
    __m256 M = _mm256_set_m128(m4, m4);
    __m256d total_lo = _mm256_setzero_pd(), total_hi = _mm256_setzero_pd();
    for (size_t b = 0; b < n; b += 512) { /* blocks of 64 vectors summed in float, then in double */
        size_t e = b + 512 < n ? b + 512 : n;
        __m256 sum = _mm256_setzero_ps();
        for (size_t i = b; i < e; i += 8) {
            __m256 x = exp256(_mm256_sub_ps(load_or_ninf(L, i, e), M)); /* exp(-Inf) = 0 past the end */
            store_part(L, i, e, x);
            sum = _mm256_add_ps(sum, x);
        }
        total_lo = _mm256_add_pd(total_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sum)));
        total_hi = _mm256_add_pd(total_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sum, 1)));
    }
    /* lanes r and r + 4 of the 8 sums belong to row r */
    double lanes[8], row[4];
    _mm256_storeu_pd(lanes, total_lo);
    _mm256_storeu_pd(lanes + 4, total_hi);
    float inv[4];
    for (int r = 0; r < 4; r++) {
        row[r] = lanes[r] + lanes[r + 4];
        inv[r] = row[r] > 0 ? (float)(1.0 / row[r]) : 0.0f;
    }
    __m128 i4 = _mm_loadu_ps(inv);
    __m256 I = _mm256_set_m128(i4, i4);
    for (size_t i = 0; i < n; i += 8)
        store_part(L, i, n, _mm256_mul_ps(load_or_ninf(L, i, n), I));
}

KV_AVX2 void kv_cpu_attention_item_avx2(void *arg, size_t i0, size_t i1, int worker)
{
    const fast_job *j = arg;
    const attn *t = j->t;
    const kv_attention_args *a = t->a;
    fast_ws *w = &j->ws[worker];
    uint32_t hd = a->head_dim, G = t->group;
    src ks, vs;
    pf_cursor pf = {{NULL, NULL}, {0, 0}};
    memset(&ks, 0, sizeof ks);
    memset(&vs, 0, sizeof vs);
    for (size_t item = i0; item < i1; item++) {
        item_span s;
        kv_cpu_item_begin(j, w, item, &s);
        uint32_t kh = s.kh, pfirst = s.pfirst, pend = s.pend;
        size_t T = s.T;
        for (uint32_t b = s.b0; b < s.b1; b++) {
            uint32_t q0, nq = kv_cpu_block_rows(j, b, &q0), groups4 = (nq + 3) / 4; /* rows, and row groups of 4 */
            uint32_t qpos[1024 + 8], valid[1024 + 8];             /* per row; valid: all ones for live rows */
            size_t rows4 = (size_t)groups4 * 4;
            float *qr = w->qpad; /* [rows4][hd] */
            for (uint32_t r = 0; r < rows4; r++) {
                float *dst = qr + (size_t)r * hd;
                if (r < nq) {
                    memcpy(dst, t->q + ((size_t)(q0 + r / G) * a->n_heads + kh * G + r % G) * hd, hd * sizeof(float));
                    qpos[r] = t->q_pos[q0 + r / G];
                    valid[r] = ~0u;
                } else {
                    memset(dst, 0, hd * sizeof(float));
                    qpos[r] = 0;
                    valid[r] = 0;
                }
            }
            /* K pass: logits, token-major per row group */
            size_t base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = kv_cpu_pass_page(t, p, pend, 0, &pf);
                if (!pg)
                    continue;
                src_prepare(t, w, pg, 0, &ks);
                for (uint32_t g4 = 0; g4 < groups4;) {
                    int ng = g4 + 1 < groups4 ? 2 : 1; /* two row groups share each read of the page */
                    k_pass_any(&ks, ng, pg->ntokens, hd, qr + (size_t)g4 * 4 * hd, a->scale,
                               t->positions + pg->pos_index, qpos + g4 * 4, valid + g4 * 4,
                               w->logits + (size_t)g4 * 4 * T + 4 * base, 4 * T, &pf);
                    g4 += (uint32_t)ng;
                }
                base += pg->ntokens;
            }
            /* softmax, and the scores: probabilities summed over queries */
            for (uint32_t g4 = 0; g4 < groups4; g4++) {
                float *L = w->logits + (size_t)g4 * 4 * T;
                softmax4(L, T);
                kv_cpu_scores_add4(t, w, L, g4, nq, T);
            }
            /* V pass: [rows4][hd] doubles (w->acc has room: attention_fast) */
            double *acc = (double *)w->acc;
            memset(acc, 0, rows4 * hd * sizeof(double));
            base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = kv_cpu_pass_page(t, p, pend, 1, &pf);
                if (!pg)
                    continue;
                src_prepare(t, w, pg, 1, &vs);
                for (uint32_t g4 = 0; g4 < groups4;) {
                    int ng = g4 + 1 < groups4 ? 2 : 1;
                    v_pass_any(&vs, ng, pg->ntokens, hd, w->logits + (size_t)g4 * 4 * T + 4 * base, 4 * T,
                               acc + (size_t)g4 * 4 * hd, &pf);
                    g4 += (uint32_t)ng;
                }
                base += pg->ntokens;
            }
            kv_cpu_rows_store(t, acc, q0, nq, kh);
        }
        if (w->score_acc)
            kv_cpu_scores_store(t, w, kh, T);
    }
}

#else

void kv_cpu_attention_item_avx2(void *job, size_t i0, size_t i1, int worker)
{
    (void)job, (void)i0, (void)i1, (void)worker; /* never chosen: kv_cpu_fast_isa() is "generic" here */
}

#endif
