/* cpu_attention_avx512.c — the fast CPU attention item for AVX-512 CPUs:
 * dequantization fused into the dot products and into the weighted sum of V,
 * four (query, head) rows at a time.
 *
 * Rows are the (query, GQA head) pairs of a work item, padded to a multiple
 * of 4 with rows that see nothing. For each page:
 *  - K pass: every token's 16-value chunks are dequantized once (same
 *    numerics as the decode kernel: fma(code, s, z), or the anchor midpoint)
 *    and fed to four dot products; the four sums are reduced together and
 *    stored token-major, logits[rowgroup][token][4].
 *  - softmax: on that token-major layout a 16-lane vector holds 4 tokens x 4
 *    rows, so max, exp and sum run over all 4 rows at once; the sum is kept
 *    in double across blocks so that 32K-token rows stay accurate.
 *  - V pass: chunk by chunk, each token's V chunk is dequantized and added to
 *    four row accumulators with its probabilities; each page's partial sums
 *    go into a double accumulator.
 * K pages of channel groups (KIVI keys) with G % 16 == 0 are read channel by
 * channel instead (k_pass_ch): 16 tokens of one channel are 2w bytes of one
 * group's stream, expanded in registers, dequantized with the channel's
 * scale and zero and multiplied into 16 token logits of each row.
 * With more than one row group (verification: k queries x GQA heads) the K
 * and V passes take two row groups (8 rows) per read of the page.
 * Other quantized pages whose layout is not "token groups of a multiple of 16
 * that tile head_dim" (odd group sizes; channel-grouped V; channel groups of
 * G % 16 != 0) are decoded to an f32 tile first with the fused decode and then
 * read like f32 pages.
 * The item needs head_dim % 32 == 0 (the even/odd order works in 32s). */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_attention.h"
#include "backends/numerics.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,fma,f16c")))
#define KV_INLINE inline __attribute__((always_inline))

/* Page readers, each specialised: f32, bf16, 8-bit and 16-bit codes, any
   width (pdep), and two that read many small codes per load and dequantize
   them by table lookup (vpermps on the group's 2^w possible values, formed
   exactly as dequant() forms them):
   - SRC_Q4P: 4-bit codes, 32 at a time: one 16-byte load gives the even
     elements in the low nibbles and the odd ones in the high nibbles, so q
     and the V accumulators use an even/odd order within each 32 (order 1);
   - SRC_Q2Q: 2-bit codes, 64 at a time: vector j holds elements 4k + j
     (order 2); the two halves of 64 may belong to two groups of 32, so the
     lookup is a two-table vpermt2ps. */
enum { SRC_F32, SRC_BF16, SRC_Q8, SRC_Q16, SRC_Q4P, SRC_Q2Q, SRC_QANY, SRC_CH };

/* SRC_CH: K pages of channel groups (KIVI) with G % 16 == 0, read channel by
   channel for 16 tokens at once (k_pass_ch); how 16 codes of one channel are
   turned into values: by table lookup on a periodic table (1, 2, 4 bits), by
   widening bytes or halves (8, 16 bits), or by pdep (any width). */
enum { CH_T1, CH_T2, CH_T4, CH_8, CH_16, CH_ANY };

static int step_of(int kind) /* elements per load */
{
    return kind == SRC_Q4P ? 32 : kind == SRC_Q2Q ? 64 : 16;
}

static int order_of(int kind) /* 0 natural, 1 even/odd in 32s, 2 j-major in 64s */
{
    return kind == SRC_Q4P ? 1 : kind == SRC_Q2Q ? 2 : 0;
}

/* Where element d of a head_dim vector goes in order `o`. */
static uint32_t order_index(int o, uint32_t d)
{
    if (o == 1)
        return d / 32 * 32 + (d % 2) * 16 + d % 32 / 2;
    if (o == 2)
        return d / 64 * 64 + (d % 4) * 16 + d % 64 / 4;
    return d;
}

typedef struct src {
    int kind;                /* SRC_* */
    int anchor_only;         /* quantized: codes are a-bit anchors, midpoint reconstruction */
    const uint8_t *data;     /* f32 values, bf16 bits, or the packed plane */
    const float *s, *z;      /* quantized: scale and zero of each group, f32 */
    unsigned w;              /* quantized: bits of each stored code */
    unsigned r;              /* anchor-only: shift b − a */
    float mid;               /* anchor-only: (2^r − 1) / 2 */
    uint32_t G;              /* elements per group (head_dim for f32/bf16) */
    uint32_t gpt;            /* groups per token (0: f32 and bf16, channel groups) */
    float lut_base[16];      /* table lookups: the reconstruction point of each code before
                                scaling: i, or (i << r) + mid for anchors */
    uint16_t chunk_group[256]; /* quantized: group within the token of elements [16c, 16c + 16) */
    int ch;                  /* SRC_CH: CH_* */
    uint32_t ntok;           /* SRC_CH: tokens of the page */
    float lut_rep[16];       /* SRC_CH tables: lut_base[k % 2^w], so that vpermps may read the
                                bits of the following codes above a code's own w bits */
} src;

static int is_quant(int kind)
{
    return kind >= SRC_Q8;
}

/* SRC_Q4P: the values of half h (0: even elements, 1: odd) of the 32
   elements from e, by lookup in the group's table tab (vpermps reads index
   bits 0-3). */
KV_AVX512 static KV_INLINE __m512 q4p_half_at(const uint8_t *base, size_t e, int h, __m512 tab)
{
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(base + e / 2)));
    return _mm512_permutexvar_ps(h ? _mm512_srli_epi32(d, 4) : d, tab);
}

/* Codes → dequantized values: fma(code, s, z), or the anchor midpoint. */
KV_AVX512 static KV_INLINE __m512 dequant(__m512i q, int anchor, const src *p, __m512 S, __m512 Z)
{
    __m512 f = anchor ? _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_slli_epi32(q, p->r)), _mm512_set1_ps(p->mid))
                      : _mm512_cvtepi32_ps(q);
    return _mm512_fmadd_ps(f, S, Z);
}

/* Bytes of one token's values in the page's row-major [ntokens][head_dim]. */
static size_t row_bytes_of(const src *p, int kind, uint32_t hd)
{
    return kind == SRC_F32 ? 4 * (size_t)hd : kind == SRC_BF16 ? 2 * (size_t)hd : (size_t)hd * p->w / 8;
}

/* The values of elements [e, e + step) of the page's row-major
   [ntokens][head_dim], in the reader's order, 16 per vector. S and Z are the
   group's scale and zero, or for the table kinds its table(s) (tables()). */
KV_AVX512 static KV_INLINE void load_values_at(const src *p, int kind, int anchor, const uint8_t *base, size_t e,
                                               __m512 S, __m512 Z, __m512 *v)
{
    __m512 *v0 = &v[0], *v1 = &v[1];
    if (kind == SRC_F32) {
        *v0 = _mm512_loadu_ps((const float *)base + e);
    } else if (kind == SRC_BF16) {
        *v0 = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(base + 2 * e))), 16));
    } else if (kind == SRC_Q8) {
        *v0 = dequant(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(base + e))), anchor, p, S, Z);
    } else if (kind == SRC_Q16) {
        *v0 = dequant(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(base + 2 * e))), anchor, p, S, Z);
    } else if (kind == SRC_Q4P) { /* S holds the group's 16 dequantized values */
        (void)Z;
        *v0 = q4p_half_at(base, e, 0, S);
        *v1 = q4p_half_at(base, e, 1, S);
    } else if (kind == SRC_Q2Q) { /* S, Z: tables of the groups of elements [e, e+32) and [e+32, e+64) */
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(base + e / 4)));
        const __m512i upper = _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
        const __m512i three = _mm512_set1_epi32(3);
        for (int j = 0; j < 4; j++) { /* index = ((d >> 2j) & 3) | (16 for lanes 8-15) */
            __m512i idx = _mm512_ternarylogic_epi32(_mm512_srli_epi32(d, 2 * j), three, upper, 0xEA);
            v[j] = _mm512_permutex2var_ps(S, idx, Z);
        }
    } else { /* any width: 16 codes are 2w bytes, two runs of 8 codes in w bytes */
        const uint8_t *at = base + e * p->w / 8;
        uint64_t lanes[4], m = kv_code_max(p->w);
        m |= m << 16 | m << 32 | m << 48;
        uint64_t low = p->w * 4 == 64 ? ~0ull : (1ull << (4 * p->w)) - 1;
        __mmask16 keep = (__mmask16)((1u << p->w) - 1u);
        for (int h = 0; h < 2; h++) {
            uint64_t part[2];
            _mm_storeu_si128((__m128i *)part, _mm_maskz_loadu_epi8(keep, at + h * p->w));
            unsigned __int128 v = (unsigned __int128)part[1] << 64 | part[0];
            lanes[2 * h] = _pdep_u64((uint64_t)v & low, m);
            lanes[2 * h + 1] = _pdep_u64((uint64_t)(v >> (4 * p->w)) & low, m);
        }
        *v0 = dequant(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)lanes)), anchor, p, S, Z);
    }
}

/* load_values_at() on the page's row-major [ntokens][head_dim] from its start. */
KV_AVX512 static KV_INLINE void load_values(const src *p, int kind, int anchor, size_t e, __m512 S, __m512 Z,
                                            __m512 *v)
{
    load_values_at(p, kind, anchor, p->data, e, S, Z, v);
}

/* Prepares the reader of a page's K or V: f32 scales and zeros for fused
   quantized pages (into sz), or an f32 tile for the rest. */
KV_AVX512 static void src_prepare(const attn *t, fast_ws *w, const kv_page_desc *pg, int value, src *o)
{
    const kv_store_format *f = value ? &pg->value : &pg->key;
    uint32_t hd = t->a->head_dim;
    o->data = t->kv + (value ? pg->value_data : pg->key_data);
    o->G = hd;
    o->gpt = 0; /* no scales: the passes step their scale rows by 0 */
    o->anchor_only = 0;
    if (f->kind == KV_STORE_F32 || f->kind == KV_STORE_BF16) {
        o->kind = f->kind == KV_STORE_F32 ? SRC_F32 : SRC_BF16;
        return;
    }
    int channel = !value && f->grouping == KV_GROUP_CHANNEL && f->group_size % 16 == 0;
    if (!channel &&
        (f->grouping != KV_GROUP_TOKEN || f->group_size % 16 != 0 || hd % f->group_size != 0 || hd / 16 > 256)) {
        kv_cpu_page_tile(t, pg, value, w->tile, NULL, &w->dec);
        o->kind = SRC_F32;
        o->data = (const uint8_t *)w->tile;
        return;
    }
    o->w = f->anchor_bits ? f->anchor_bits : f->bits;
    o->kind = o->w == 8                                              ? SRC_Q8
              : o->w == 16                                           ? SRC_Q16
              : o->w == 4 && f->group_size % 32 == 0                 ? SRC_Q4P
              : o->w == 2 && f->group_size % 32 == 0 && hd % 64 == 0 ? SRC_Q2Q
                                                                     : SRC_QANY;
    o->anchor_only = f->anchor_bits > 0;
    o->r = f->anchor_bits ? (unsigned)(f->bits - f->anchor_bits) : 0;
    o->mid = o->anchor_only ? (float)kv_code_max(o->r) / 2.0f : 0.0f;
    o->G = f->group_size;
    o->gpt = channel ? 0 : hd / f->group_size;
    for (uint32_t c = 0; c < hd / 16 && !channel; c++)
        o->chunk_group[c] = (uint16_t)(c * 16 / f->group_size);
    for (uint32_t i = 0; i < 16; i++) /* (float)(i << r) + mid is exact, as in dequant() */
        o->lut_base[i] = o->anchor_only ? (float)(i << o->r) + o->mid : (float)i;
    size_t groups = (size_t)pg->ntokens * o->gpt;
    if (channel) {
        o->kind = SRC_CH;
        o->ch = o->w == 1 ? CH_T1 : o->w == 2 ? CH_T2 : o->w == 4 ? CH_T4 : o->w == 8 ? CH_8 : o->w == 16 ? CH_16 : CH_ANY;
        o->ntok = pg->ntokens;
        for (uint32_t k = 0; k < 16; k++)
            o->lut_rep[k] = o->lut_base[k % (o->w < 4 ? 1u << o->w : 16u)];
        groups = (size_t)(pg->ntokens + f->group_size - 1) / f->group_size * hd;
    }
    const uint16_t *meta = (const uint16_t *)(t->kv + (value ? pg->value_meta : pg->key_meta));
    float *s = w->sz, *z = w->sz + groups;
    for (size_t i = 0; i < groups; i += 16) {
        __mmask16 m = groups - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (groups - i)) - 1u);
        _mm512_mask_storeu_ps(s + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, meta + i)));
        _mm512_mask_storeu_ps(z + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, meta + groups + i)));
    }
    o->s = s;
    o->z = z;
}

/* The four sums of a0..a3, in lanes 0..3. */
KV_AVX512 static KV_INLINE __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
    __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
    __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
    __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
    __m256 d = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

/* The sums of x[0..16) in lanes 0..15: a transposing tree (512 → 256 → 128
   bits across 128-bit blocks, then within blocks), 30 shuffles and 15 adds
   for 16 sums where four reduce4() calls take 76 instructions. */
KV_AVX512 static KV_INLINE __m512 reduce16(const __m512 *x)
{
    /* Levels 1-2 leave block order (k, k + 8, k + 4, k + 12) of input k, so
       inputs 4..7 and 8..11 are fed swapped to come out in natural order. */
    static const int in[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    __m512 z[8], w[4];
    for (int k = 0; k < 8; k++) /* blocks 0-1: 8 partial sums of input k; 2-3: of input k + 8 */
        z[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[in[k]], x[in[k + 8]], 0x44),
                             _mm512_shuffle_f32x4(x[in[k]], x[in[k + 8]], 0xEE));
    for (int k = 0; k < 4; k++) /* block b: 4 partial sums of input k, k + 8, k + 4, k + 12 */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(z[k], z[k + 4], 0x88), _mm512_shuffle_f32x4(z[k], z[k + 4], 0xDD));
    __m512 v0 = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x44), _mm512_shuffle_ps(w[0], w[1], 0xEE));
    __m512 v1 = _mm512_add_ps(_mm512_shuffle_ps(w[2], w[3], 0x44), _mm512_shuffle_ps(w[2], w[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x88), _mm512_shuffle_ps(v0, v1, 0xDD));
}

/* The scale and zero of group g of the token whose scales and zeros start at
   s_row and z_row, or for the table kinds the group's table(s) of dequantized
   values (SRC_Q2Q: groups g and g2). The passes step s_row, z_row and the
   token's values (load_values_at) by pointer from token to token. */
KV_AVX512 static KV_INLINE void tables_at(const src *p, int kind, const float *s_row, const float *z_row, uint32_t g,
                                          uint32_t g2, __m512 *S, __m512 *Z)
{
    if (!is_quant(kind))
        return;
    __m512 s = _mm512_set1_ps(s_row[g]), z = _mm512_set1_ps(z_row[g]);
    if (kind == SRC_Q4P) {
        *S = _mm512_fmadd_ps(_mm512_loadu_ps(p->lut_base), s, z);
    } else if (kind == SRC_Q2Q) {
        *S = _mm512_fmadd_ps(_mm512_loadu_ps(p->lut_base), s, z);
        *Z = _mm512_fmadd_ps(_mm512_loadu_ps(p->lut_base), _mm512_set1_ps(s_row[g2]), _mm512_set1_ps(z_row[g2]));
    } else {
        *S = s;
        *Z = z;
    }
}

/* tables_at() for the group holding element e of token t. */
KV_AVX512 static KV_INLINE void tables(const src *p, int kind, uint32_t t, uint32_t e, __m512 *S, __m512 *Z)
{
    if (!is_quant(kind))
        return;
    size_t row = (size_t)t * p->gpt;
    tables_at(p, kind, p->s + row, p->z + row, p->chunk_group[e / 16],
              kind == SRC_Q2Q ? p->chunk_group[e / 16 + 2] : 0, S, Z);
}

/* Logits of 4 rows (q4: [4][hd], in the reader's element order) for the
   page's tokens → L[token][4]; -Inf where a row does not see the token (its
   position is above the row's query position, or the row is padding). */
KV_AVX512 static KV_INLINE void k_pass(const src *p, int kind, int anchor, uint32_t ntok, uint32_t hd,
                                       const float *q4, float scale, const uint32_t *pos, __m128i qpos,
                                       __mmask8 valid, float *L, pf_cursor *pf)
{
    const __m128 ninf = _mm_set1_ps(-INFINITY), vscale = _mm_set1_ps(scale);
    const uint32_t step = (uint32_t)step_of(kind), nv = step / 16;
    uint32_t t = 0;
    if (nv <= 2) { /* four tokens at a time: 16 sums, one reduction, each q chunk loaded once */
        const __m512 ninf16 = _mm512_set1_ps(-INFINITY), vscale16 = _mm512_set1_ps(scale);
        const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        const __m512i qpos16 = _mm512_broadcast_i32x4(qpos);
        const __mmask16 valid16 = (__mmask16)(valid * 0x1111u);
        const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
        const uint8_t *row = p->data;             /* token t's values */
        const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
        for (; t + 4 <= ntok; t += 4, row += 4 * row_bytes, s_row += 4 * gpt, z_row += 4 * gpt) {
            __m512 acc[16], S = _mm512_setzero_ps(), Z = S, v[4][4];
            for (int i = 0; i < 16; i++)
                acc[i] = _mm512_setzero_ps();
            for (uint32_t e = 0; e < hd; e += step) {
                kv_cpu_prefetch_step(pf);
                uint32_t g = is_quant(kind) ? p->chunk_group[e / 16] : 0;
                uint32_t g2 = kind == SRC_Q2Q ? p->chunk_group[e / 16 + 2] : 0;
                if (kind == SRC_Q4P) { /* half by half: 4 tables, 4 values and 16 sums fit the 32 registers */
                    __m512 tab[4];
                    for (uint32_t k = 0; k < 4; k++)
                        tables_at(p, kind, s_row + k * gpt, z_row + k * gpt, g, g2, &tab[k], &Z);
                    for (uint32_t j = 0; j < 2; j++) {
                        for (uint32_t k = 0; k < 4; k++)
                            v[k][0] = q4p_half_at(row + k * row_bytes, e, (int)j, tab[k]);
                        for (uint32_t r = 0; r < 4; r++) {
                            __m512 qv = _mm512_loadu_ps(q4 + (size_t)r * hd + e + 16 * j);
                            for (uint32_t k = 0; k < 4; k++)
                                acc[4 * k + r] = _mm512_fmadd_ps(qv, v[k][0], acc[4 * k + r]);
                        }
                    }
                    continue;
                }
                for (uint32_t k = 0; k < 4; k++) {
                    tables_at(p, kind, s_row + k * gpt, z_row + k * gpt, g, g2, &S, &Z);
                    load_values_at(p, kind, anchor, row + k * row_bytes, e, S, Z, v[k]);
                }
                for (uint32_t j = 0; j < nv; j++)
                    for (uint32_t r = 0; r < 4; r++) {
                        __m512 qv = _mm512_loadu_ps(q4 + (size_t)r * hd + e + 16 * j);
                        for (uint32_t k = 0; k < 4; k++)
                            acc[4 * k + r] = _mm512_fmadd_ps(qv, v[k][j], acc[4 * k + r]);
                    }
            }
            __m512 l = _mm512_mul_ps(reduce16(acc), vscale16);
            __m512i pos16 =
                _mm512_permutexvar_epi32(spread, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(pos + t))));
            __mmask16 see = _mm512_mask_cmple_epu32_mask(valid16, pos16, qpos16);
            _mm512_storeu_ps(L + 4 * (size_t)t, _mm512_mask_blend_ps(see, ninf16, l));
        }
    }
    for (; t < ntok; t++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, S = a0, Z = a0, v[4];
        for (uint32_t e = 0; e < hd; e += step) {
            kv_cpu_prefetch_step(pf);
            tables(p, kind, t, e, &S, &Z);
            load_values(p, kind, anchor, (size_t)t * hd + e, S, Z, v);
            for (uint32_t j = 0; j < nv; j++) {
                const float *q = q4 + e + 16 * j;
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q), v[j], a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + hd), v[j], a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * hd), v[j], a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * hd), v[j], a3);
            }
        }
        __m128 l = _mm_mul_ps(reduce4(a0, a1, a2, a3), vscale);
        __mmask8 see = _mm_mask_cmple_epu32_mask(valid, _mm_set1_epi32((int)pos[t]), qpos);
        _mm_storeu_ps(L + 4 * (size_t)t, _mm_mask_blend_ps(see, ninf, l));
    }
}

/* ---- Channel-grouped K pages (KIVI keys) ----------------------------------------- */

/* 16 tokens of a channel-grouped page, t .. t + n: a group holds G tokens of
   one channel (G % 16 == 0), so the 16 lie in one group of every channel,
   and their codes are 2w consecutive bytes of its stream. */
typedef struct ch_vec {
    const uint8_t *at;  /* channel 0's codes of these tokens */
    size_t cstride;     /* bytes between the streams of consecutive channels */
    const float *s, *z; /* scale and zero of channel 0's group; channel c at [c] */
    __mmask32 bytes;    /* the bytes to read: ceil(n w / 8) */
    uint32_t t, n;      /* first token (page-relative), tokens (1..16) */
} ch_vec;

static KV_INLINE void ch_setup(const src *p, uint32_t hd, uint32_t t, ch_vec *v)
{
    uint32_t G = p->G, blk = t / G, off = t % G, glen = p->ntok - blk * G < G ? p->ntok - blk * G : G;
    size_t full = ((size_t)G * p->w + 7) / 8;
    v->t = t;
    v->n = p->ntok - t < 16 ? p->ntok - t : 16;
    v->at = p->data + (size_t)blk * hd * full + (size_t)off / 16 * 2 * p->w;
    v->cstride = ((size_t)glen * p->w + 7) / 8;
    v->s = p->s + (size_t)blk * hd;
    v->z = p->z + (size_t)blk * hd;
    uint32_t nb = (v->n * p->w + 7) / 8;
    v->bytes = nb >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << nb) - 1u);
}

/* A channel group's table (1, 2, 4 bits: its reconstruction values,
   repeated with period 2^w), or its scale in *S and zero in *Z. */
KV_AVX512 static KV_INLINE __m512 ch_table(const src *p, int cls, float s, float z, __m512 *S, __m512 *Z)
{
    *S = _mm512_set1_ps(s);
    *Z = _mm512_set1_ps(z);
    return cls <= CH_T4 ? _mm512_fmadd_ps(_mm512_loadu_ps(p->lut_rep), *S, *Z) : *S;
}

/* The values of 16 tokens of one channel whose codes start at `at`
   (masked: only the bytes in `bytes` are read; tokens past them get any
   finite value), dequantized exactly as dequant() does. */
KV_AVX512 static KV_INLINE __m512 ch_values(const src *p, int cls, int anchor, int masked, const uint8_t *at,
                                            __mmask32 bytes, __m512 tab, __m512 S, __m512 Z)
{
    if (cls <= CH_T4) {
        /* lane i gets the stream shifted right by w i: its code in bits 0..w-1, the
           next codes above, which the periodic table ignores */
        __m512i x, sh;
        if (cls == CH_T4) {
            __m128i raw = masked ? _mm_maskz_loadu_epi8((__mmask16)bytes, at) : _mm_loadl_epi64((const __m128i *)at);
            x = _mm512_permutexvar_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                         _mm512_castsi128_si512(raw));
            sh = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
        } else {
            uint32_t u = 0;
            if (masked)
                x = _mm512_broadcastd_epi32(_mm_maskz_loadu_epi8((__mmask16)bytes, at));
            else if (cls == CH_T2)
                memcpy(&u, at, 4), x = _mm512_set1_epi32((int)u);
            else {
                uint16_t h;
                memcpy(&h, at, 2);
                x = _mm512_set1_epi32((int)h);
            }
            sh = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            if (cls == CH_T2)
                sh = _mm512_add_epi32(sh, sh);
        }
        return _mm512_permutexvar_ps(_mm512_srlv_epi32(x, sh), tab);
    }
    __m512i q;
    if (cls == CH_8) {
        q = _mm512_cvtepu8_epi32(masked ? _mm_maskz_loadu_epi8((__mmask16)bytes, at)
                                        : _mm_loadu_si128((const __m128i *)at));
    } else if (cls == CH_16) {
        q = _mm512_cvtepu16_epi32(masked ? _mm256_maskz_loadu_epi8(bytes, at)
                                         : _mm256_loadu_si256((const __m256i *)at));
    } else { /* any width: two runs of 8 codes in w bytes each, spread by pdep */
        uint64_t lanes[4], m = kv_code_max(p->w);
        m |= m << 16 | m << 32 | m << 48;
        uint64_t low = (1ull << (4 * p->w)) - 1; /* w < 16 here */
        for (int h = 0; h < 2; h++) {
            uint64_t part[2];
            __mmask16 keep = (__mmask16)(((1u << p->w) - 1u) & (bytes >> (h * p->w)));
            _mm_storeu_si128((__m128i *)part, _mm_maskz_loadu_epi8(keep, at + h * p->w));
            unsigned __int128 b = (unsigned __int128)part[1] << 64 | part[0];
            lanes[2 * h] = _pdep_u64((uint64_t)b & low, m);
            lanes[2 * h + 1] = _pdep_u64((uint64_t)(b >> (4 * p->w)) & low, m);
        }
        q = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)lanes));
    }
    return dequant(q, anchor, p, S, Z);
}

/* tot[j][r]: row r's dot products with the vectors of 16 tokens in v.
   PAIR: v[0] and v[1] are the two full halves of 32 tokens of one group, so
   they share each channel's table and need no masked loads; otherwise nv
   (1 or 2) vectors, each with its own group and masked loads. Blocked: 16
   channels at a time into one chain per row and vector (8 independent FMAs
   per channel), each block's sum then added to the total, so that no float
   chain is longer than 16 terms (the token-major reader's lanes sum 8). */
KV_AVX512 static KV_INLINE void ch_dots(const src *p, int cls, int anchor, int PAIR, uint32_t hd, const float *q4,
                                        const ch_vec *v, int nv, __m512 tot[2][4], pf_cursor *pf)
{
    const int NV = PAIR ? 2 : nv;
    const uint8_t *at[2] = {v[0].at, v[PAIR ? 0 : nv - 1].at + (PAIR ? 2 * p->w : 0)};
    const float *s[2] = {v[0].s, v[nv - 1].s}, *z[2] = {v[0].z, v[nv - 1].z};
    const size_t cs[2] = {v[0].cstride, v[nv - 1].cstride};
    const __mmask32 bytes[2] = {v[0].bytes, v[nv - 1].bytes};
    for (int j = 0; j < 2; j++)
        for (int r = 0; r < 4; r++)
            tot[j][r] = _mm512_setzero_ps();
    for (uint32_t c0 = 0; c0 < hd; c0 += 16) {
        __m512 acc[2][4];
        for (int j = 0; j < 2; j++)
            for (int r = 0; r < 4; r++)
                acc[j][r] = _mm512_setzero_ps();
        for (uint32_t c = c0; c < c0 + 16; c++) {
            if (c % 2 == 0)
                kv_cpu_prefetch_step(pf);
            __m512 k[2], S, Z, tab = ch_table(p, cls, s[0][c], z[0][c], &S, &Z);
            if (PAIR) {
                k[0] = ch_values(p, cls, anchor, 0, at[0], bytes[0], tab, S, Z);
                k[1] = ch_values(p, cls, anchor, 0, at[1], bytes[1], tab, S, Z);
                at[0] += cs[0];
                at[1] += cs[0];
            } else {
                k[0] = ch_values(p, cls, anchor, 1, at[0], bytes[0], tab, S, Z);
                at[0] += cs[0];
                if (NV == 2) {
                    tab = ch_table(p, cls, s[1][c], z[1][c], &S, &Z);
                    k[1] = ch_values(p, cls, anchor, 1, at[1], bytes[1], tab, S, Z);
                    at[1] += cs[1];
                }
            }
            for (uint32_t r = 0; r < 4; r++) {
                __m512 qb = _mm512_set1_ps(q4[(size_t)r * hd + c]);
                acc[0][r] = _mm512_fmadd_ps(qb, k[0], acc[0][r]);
                if (NV == 2)
                    acc[1][r] = _mm512_fmadd_ps(qb, k[1], acc[1][r]);
            }
        }
        for (int j = 0; j < NV; j++)
            for (int r = 0; r < 4; r++)
                tot[j][r] = _mm512_add_ps(tot[j][r], acc[j][r]);
    }
}

/* Row-major a[r][token] (4 rows x 16 tokens, scaled) → L[token][4] for the
   n tokens of *v, -Inf where a row does not see the token. */
KV_AVX512 static KV_INLINE void ch_store(const ch_vec *v, const __m512 *a, const uint32_t *pos, __m128i qpos,
                                         __mmask8 valid, float *L)
{
    /* 4 x 4 transposes within each 128-bit block, then of the blocks */
    __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
    __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
    __m512 u0 = _mm512_shuffle_ps(t0, t2, 0x44), u1 = _mm512_shuffle_ps(t0, t2, 0xEE);
    __m512 u2 = _mm512_shuffle_ps(t1, t3, 0x44), u3 = _mm512_shuffle_ps(t1, t3, 0xEE);
    __m512 v0 = _mm512_shuffle_f32x4(u0, u1, 0x44), v1 = _mm512_shuffle_f32x4(u0, u1, 0xEE);
    __m512 v2 = _mm512_shuffle_f32x4(u2, u3, 0x44), v3 = _mm512_shuffle_f32x4(u2, u3, 0xEE);
    __m512 out[4] = {_mm512_shuffle_f32x4(v0, v2, 0x88), _mm512_shuffle_f32x4(v0, v2, 0xDD),
                     _mm512_shuffle_f32x4(v1, v3, 0x88), _mm512_shuffle_f32x4(v1, v3, 0xDD)};
    const __m512 ninf16 = _mm512_set1_ps(-INFINITY);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i qpos16 = _mm512_broadcast_i32x4(qpos);
    const __mmask16 valid16 = (__mmask16)(valid * 0x1111u);
    for (uint32_t k = 0; k < 4 && 4 * k < v->n; k++) { /* out[k]: tokens 4k .. 4k + 3, 4 rows each */
        uint32_t left = v->n - 4 * k < 4 ? v->n - 4 * k : 4;
        __m128i p4 = _mm_maskz_loadu_epi32((__mmask8)((1u << left) - 1u), pos + v->t + 4 * k);
        __m512i pos16 = _mm512_permutexvar_epi32(spread, _mm512_castsi128_si512(p4));
        __mmask16 see = _mm512_mask_cmple_epu32_mask(valid16, pos16, qpos16);
        _mm512_mask_storeu_ps(L + 4 * ((size_t)v->t + 4 * k), (__mmask16)((1u << (4 * left)) - 1u),
                              _mm512_mask_blend_ps(see, ninf16, out[k]));
    }
}

/* k_pass() for SRC_CH pages: 32 tokens at a time (16 when fewer are left),
   channel by channel, each channel's codes dequantized once for 16 tokens
   and fed to the four rows' dot products; no f32 tile. */
KV_AVX512 static KV_INLINE void k_pass_ch(const src *p, int cls, int anchor, uint32_t hd, const float *q4,
                                          float scale, const uint32_t *pos, __m128i qpos, __mmask8 valid, float *L,
                                          pf_cursor *pf)
{
    const __m512 vscale = _mm512_set1_ps(scale);
    for (uint32_t t = 0; t < p->ntok; t += 32) {
        ch_vec v[2];
        int nv = p->ntok - t > 16 ? 2 : 1;
        __m512 tot[2][4];
        for (int j = 0; j < nv; j++)
            ch_setup(p, hd, t + 16 * (uint32_t)j, &v[j]);
        if (nv == 2 && v[1].n == 16 && v[0].s == v[1].s) /* 32 tokens of one group */
            ch_dots(p, cls, anchor, 1, hd, q4, v, 2, tot, pf);
        else
            ch_dots(p, cls, anchor, 0, hd, q4, v, nv, tot, pf);
        for (int j = 0; j < nv; j++) {
            __m512 a[4];
            for (int r = 0; r < 4; r++)
                a[r] = _mm512_mul_ps(tot[j][r], vscale);
            ch_store(&v[j], a, pos, qpos, valid, L);
        }
    }
}

KV_AVX512 static void k_pass_ch_any(const src *p, uint32_t hd, const float *q4, float scale, const uint32_t *pos,
                                    __m128i qpos, __mmask8 valid, float *L, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define CH_CALL(cls, anchor) k_pass_ch(p, cls, anchor, hd, q4, scale, pos, qpos, valid, L, pf)
    switch (p->ch * 2 + p->anchor_only) { /* the tables hold the anchor midpoints already */
    case CH_T1 * 2: case CH_T1 * 2 + 1: CH_CALL(CH_T1, 0); break;
    case CH_T2 * 2: case CH_T2 * 2 + 1: CH_CALL(CH_T2, 0); break;
    case CH_T4 * 2: case CH_T4 * 2 + 1: CH_CALL(CH_T4, 0); break;
    case CH_8 * 2: CH_CALL(CH_8, 0); break;
    case CH_8 * 2 + 1: CH_CALL(CH_8, 1); break;
    case CH_16 * 2: CH_CALL(CH_16, 0); break;
    case CH_16 * 2 + 1: CH_CALL(CH_16, 1); break;
    case CH_ANY * 2: CH_CALL(CH_ANY, 0); break;
    default: CH_CALL(CH_ANY, 1); break;
    }
#undef CH_CALL
    *pf_io = c;
}

KV_AVX512 static KV_INLINE void acc_add(double *d, __m512 v)
{
    _mm512_storeu_pd(d, _mm512_add_pd(_mm512_loadu_pd(d), _mm512_cvtps_pd(_mm512_castps512_ps256(v))));
    _mm512_storeu_pd(d + 8, _mm512_add_pd(_mm512_loadu_pd(d + 8), _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))));
}

/* acc[4][hd] (double, the reader's element order) += P[token][4] · V over
   the page's tokens; the page's sums are formed in float, then added. The
   row is taken in slabs of SLAB elements (64, or 32 when hd % 64 != 0; a
   multiple of the reader's step), token by token within a slab: 4 rows x
   SLAB / 16 accumulators, so that 16 FMA chains (not 4) are in flight and
   each token's probabilities are broadcast once per slab, not per chunk. */
KV_AVX512 static KV_INLINE void v_pass(const src *p, int kind, int anchor, uint32_t SLAB, uint32_t ntok, uint32_t hd,
                                       const float *P, double *acc, pf_cursor *pf)
{
    const uint32_t step = (uint32_t)step_of(kind), nvs = SLAB / 16;
    const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
    for (uint32_t e0 = 0; e0 < hd; e0 += SLAB) {
        __m512 o[4][4], S = _mm512_setzero_ps(), Z = S, v[4] = {S, S, S, S};
        for (uint32_t r = 0; r < 4; r++)
            for (uint32_t j = 0; j < nvs; j++)
                o[r][j] = _mm512_setzero_ps();
        uint32_t g[4] = {0, 0, 0, 0}, g2[4] = {0, 0, 0, 0}; /* each load's group(s) within the token */
        for (uint32_t e = e0; e < e0 + SLAB && is_quant(kind); e += step) {
            g[(e - e0) / step] = p->chunk_group[e / 16];
            g2[(e - e0) / step] = kind == SRC_Q2Q ? p->chunk_group[e / 16 + 2] : 0;
        }
        const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
        const uint8_t *row = p->data;             /* token t's values */
        for (uint32_t t = 0; t < ntok; t++, row += row_bytes, s_row += gpt, z_row += gpt) {
            kv_cpu_prefetch_step(pf);
            kv_cpu_prefetch_step(pf);
            for (uint32_t e = e0; e < e0 + SLAB; e += step) {
                tables_at(p, kind, s_row, z_row, g[(e - e0) / step], g2[(e - e0) / step], &S, &Z);
                load_values_at(p, kind, anchor, row, e, S, Z, v + (e - e0) / 16);
            }
            const float *pt = P + 4 * (size_t)t;
            for (uint32_t r = 0; r < 4; r++) {
                __m512 pr = _mm512_set1_ps(pt[r]);
                for (uint32_t j = 0; j < nvs; j++)
                    o[r][j] = _mm512_fmadd_ps(pr, v[j], o[r][j]);
            }
        }
        for (uint32_t r = 0; r < 4; r++)
            for (uint32_t j = 0; j < nvs; j++)
                acc_add(acc + (size_t)r * hd + e0 + 16 * j, o[r][j]);
    }
}

/* One instance per (kind, anchor) so that the compiler hoists every test. */
#define KV_SRC_SWITCH(call_k)                                                                                 \
    switch (p->kind * 2 + p->anchor_only) {                                                                    \
    case SRC_F32 * 2: call_k(SRC_F32, 0); break;                                                               \
    case SRC_BF16 * 2: call_k(SRC_BF16, 0); break;                                                             \
    case SRC_Q8 * 2: call_k(SRC_Q8, 0); break;                                                                 \
    case SRC_Q8 * 2 + 1: call_k(SRC_Q8, 1); break;                                                             \
    case SRC_Q16 * 2: call_k(SRC_Q16, 0); break;                                                               \
    case SRC_Q16 * 2 + 1: call_k(SRC_Q16, 1); break;                                                           \
    case SRC_Q4P * 2: call_k(SRC_Q4P, 0); break;                                                               \
    case SRC_Q4P * 2 + 1: call_k(SRC_Q4P, 1); break;                                                           \
    case SRC_Q2Q * 2: call_k(SRC_Q2Q, 0); break;                                                               \
    case SRC_Q2Q * 2 + 1: call_k(SRC_Q2Q, 1); break;                                                           \
    case SRC_QANY * 2: call_k(SRC_QANY, 0); break;                                                             \
    default: call_k(SRC_QANY, 1); break;                                                                       \
    }

KV_AVX512 static void k_pass_any(const src *p, uint32_t ntok, uint32_t hd, const float *q4, float scale,
                                 const uint32_t *pos, __m128i qpos, __mmask8 valid, float *L, pf_cursor *pf_io)
{
    if (p->kind == SRC_CH) { /* it takes its own copy of the cursor */
        k_pass_ch_any(p, hd, q4, scale, pos, qpos, valid, L, pf_io);
        return;
    }
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define K_CALL(kind, anchor) k_pass(p, kind, anchor, ntok, hd, q4, scale, pos, qpos, valid, L, pf)
    KV_SRC_SWITCH(K_CALL)
#undef K_CALL
    *pf_io = c;
}

KV_AVX512 static void v_pass_any(const src *p, uint32_t ntok, uint32_t hd, const float *P, double *acc,
                                 pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define V_CALL(kind, anchor)                                                                                   \
    if (hd % 64 == 0)                                                                                          \
        v_pass(p, kind, anchor, 64, ntok, hd, P, acc, pf);                                                     \
    else if (kind != SRC_Q2Q)                                                                                  \
        v_pass(p, kind, anchor, 32, ntok, hd, P, acc, pf);
    KV_SRC_SWITCH(V_CALL)
#undef V_CALL
    *pf_io = c;
}

/* ---- Two row groups at once (verification: k queries x GQA heads) ---------------- */

/* k_pass() for the 8 rows of two row groups (q8: [8][hd], L: [2][T][4]
   through Lb = La + 4 T): each token's chunk is read and dequantized once
   for the 8 rows instead of once per row group. Two tokens at a time (16
   dot products, one reduce16), the odd last token alone. */
KV_AVX512 static KV_INLINE void k_pass8(const src *p, int kind, int anchor, uint32_t ntok, uint32_t hd,
                                        const float *q8, float scale, const uint32_t *pos, __m128i qpa,
                                        __m128i qpb, __mmask8 va, __mmask8 vb, float *La, float *Lb, pf_cursor *pf)
{
    const uint32_t step = (uint32_t)step_of(kind), nv = step / 16;
    const __m512 ninf16 = _mm512_set1_ps(-INFINITY), vscale16 = _mm512_set1_ps(scale);
    /* lane i: row group i / 8, token (i / 4) % 2, row i % 4 */
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i qpos16 = _mm512_inserti32x8(_mm512_castsi256_si512(_mm256_broadcast_i32x4(qpa)),
                                              _mm256_broadcast_i32x4(qpb), 1);
    const __mmask16 valid16 = (__mmask16)((va & 15u) * 0x11u | (vb & 15u) * 0x1100u);
    uint32_t t = 0;
    for (; t + 2 <= ntok; t += 2) {
        __m512 acc[16], S = _mm512_setzero_ps(), Z = S, v[2][4];
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_ps();
        for (uint32_t e = 0; e < hd; e += step) {
            kv_cpu_prefetch_step(pf);
            for (uint32_t k = 0; k < 2; k++) {
                tables(p, kind, t + k, e, &S, &Z);
                load_values(p, kind, anchor, (size_t)(t + k) * hd + e, S, Z, v[k]);
            }
            for (uint32_t j = 0; j < nv; j++)
                for (uint32_t r = 0; r < 8; r++) {
                    __m512 qv = _mm512_loadu_ps(q8 + (size_t)r * hd + e + 16 * j);
                    for (uint32_t k = 0; k < 2; k++)
                        acc[(r / 4) * 8 + k * 4 + r % 4] = _mm512_fmadd_ps(qv, v[k][j], acc[(r / 4) * 8 + k * 4 + r % 4]);
                }
        }
        __m512 l = _mm512_mul_ps(reduce16(acc), vscale16);
        __m512i pos16 = _mm512_permutexvar_epi32(spread, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(pos + t))));
        __mmask16 see = _mm512_mask_cmple_epu32_mask(valid16, pos16, qpos16);
        l = _mm512_mask_blend_ps(see, ninf16, l);
        _mm256_storeu_ps(La + 4 * (size_t)t, _mm512_castps512_ps256(l));
        _mm256_storeu_ps(Lb + 4 * (size_t)t, _mm512_extractf32x8_ps(l, 1));
    }
    if (t < ntok) {
        __m512 a[8], S = _mm512_setzero_ps(), Z = S, v[4];
        for (int r = 0; r < 8; r++)
            a[r] = _mm512_setzero_ps();
        for (uint32_t e = 0; e < hd; e += step) {
            kv_cpu_prefetch_step(pf);
            tables(p, kind, t, e, &S, &Z);
            load_values(p, kind, anchor, (size_t)t * hd + e, S, Z, v);
            for (uint32_t j = 0; j < nv; j++)
                for (uint32_t r = 0; r < 8; r++)
                    a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q8 + (size_t)r * hd + e + 16 * j), v[j], a[r]);
        }
        const __m128 ninf = _mm_set1_ps(-INFINITY), vscale = _mm_set1_ps(scale);
        __m128i pt = _mm_set1_epi32((int)pos[t]);
        __m128 la = _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), vscale);
        __m128 lb = _mm_mul_ps(reduce4(a[4], a[5], a[6], a[7]), vscale);
        _mm_storeu_ps(La + 4 * (size_t)t, _mm_mask_blend_ps(_mm_mask_cmple_epu32_mask(va, pt, qpa), ninf, la));
        _mm_storeu_ps(Lb + 4 * (size_t)t, _mm_mask_blend_ps(_mm_mask_cmple_epu32_mask(vb, pt, qpb), ninf, lb));
    }
}

/* v_pass() for two row groups (Pb = Pa + 4 T, accb = acca + 4 hd): each
   token's chunk dequantized once for the 8 rows. Readers of up to 32
   elements per load only (8 rows x 2 vectors of accumulators). */
KV_AVX512 static KV_INLINE void v_pass8(const src *p, int kind, int anchor, uint32_t ntok, uint32_t hd,
                                        const float *Pa, const float *Pb, double *acca, double *accb, pf_cursor *pf)
{
    const uint32_t step = (uint32_t)step_of(kind), nv = step / 16;
    for (uint32_t e = 0; e < hd; e += step) {
        __m512 o[8][2], S = _mm512_setzero_ps(), Z = S, v[4];
        for (uint32_t r = 0; r < 8; r++)
            o[r][0] = o[r][1] = _mm512_setzero_ps();
        for (uint32_t t = 0; t < ntok; t++) {
            kv_cpu_prefetch_step(pf);
            tables(p, kind, t, e, &S, &Z);
            load_values(p, kind, anchor, (size_t)t * hd + e, S, Z, v);
            for (uint32_t r = 0; r < 8; r++) {
                __m512 pr = _mm512_set1_ps((r < 4 ? Pa : Pb)[4 * (size_t)t + r % 4]);
                for (uint32_t j = 0; j < nv && j < 2; j++)
                    o[r][j] = _mm512_fmadd_ps(pr, v[j], o[r][j]);
            }
        }
        for (uint32_t r = 0; r < 8; r++)
            for (uint32_t j = 0; j < nv && j < 2; j++)
                acc_add((r < 4 ? acca : accb) + (size_t)(r % 4) * hd + e + 16 * j, o[r][j]);
    }
}

KV_AVX512 static void k_pass8_any(const src *p, uint32_t ntok, uint32_t hd, const float *q8, float scale,
                                  const uint32_t *pos, __m128i qpa, __m128i qpb, __mmask8 va, __mmask8 vb, float *La,
                                  float *Lb, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define K8_CALL(kind, anchor) k_pass8(p, kind, anchor, ntok, hd, q8, scale, pos, qpa, qpb, va, vb, La, Lb, pf)
    KV_SRC_SWITCH(K8_CALL)
#undef K8_CALL
    *pf_io = c;
}

/* Not for SRC_Q2Q (64 elements per load) nor SRC_CH. */
KV_AVX512 static void v_pass8_any(const src *p, uint32_t ntok, uint32_t hd, const float *Pa, const float *Pb,
                                  double *acca, double *accb, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define V8_CALL(kind, anchor)                                                                                   \
    if (kind != SRC_Q2Q)                                                                                       \
        v_pass8(p, kind, anchor, ntok, hd, Pa, Pb, acca, accb, pf);
    KV_SRC_SWITCH(V8_CALL)
#undef V8_CALL
    *pf_io = c;
}

/* ---- Four row groups at once (verification: 16 rows and more) -------------------- */

/* Readers of 16 elements per load: the 16-row passes keep one accumulator
   per row, 16 in all. */
static int is_step16(int kind)
{
    return kind != SRC_Q4P && kind != SRC_Q2Q && kind != SRC_CH;
}

/* k_pass() for the 16 rows of four row groups (q16: [16][hd], natural
   order; row group g's logits at L + g * lstride): each token's chunk is
   read and dequantized once for the 16 rows, one token at a time, its 16
   logits formed by one reduce16. valid16: bit 4g + r for row r of group g. */
KV_AVX512 static KV_INLINE void k_pass16(const src *p, int kind, int anchor, uint32_t ntok, uint32_t hd,
                                         const float *q16, float scale, const uint32_t *pos, __m512i qpos16,
                                         __mmask16 valid16, float *L, size_t lstride, pf_cursor *pf)
{
    const __m512 ninf16 = _mm512_set1_ps(-INFINITY), vscale16 = _mm512_set1_ps(scale);
    const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
    const uint8_t *row = p->data;             /* token t's values */
    const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
    for (uint32_t t = 0; t < ntok; t++, row += row_bytes, s_row += gpt, z_row += gpt) {
        __m512 a[16], S = _mm512_setzero_ps(), Z = S, v[4];
        for (int r = 0; r < 16; r++)
            a[r] = _mm512_setzero_ps();
        for (uint32_t e = 0; e < hd; e += 16) {
            if (e % 32 == 0)
                kv_cpu_prefetch_step(pf);
            tables_at(p, kind, s_row, z_row, is_quant(kind) ? p->chunk_group[e / 16] : 0, 0, &S, &Z);
            load_values_at(p, kind, anchor, row, e, S, Z, v);
            for (uint32_t r = 0; r < 16; r++)
                a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q16 + (size_t)r * hd + e), v[0], a[r]);
        }
        __m512 l = _mm512_mul_ps(reduce16(a), vscale16);
        __mmask16 see = _mm512_mask_cmple_epu32_mask(valid16, _mm512_set1_epi32((int)pos[t]), qpos16);
        l = _mm512_mask_blend_ps(see, ninf16, l);
        _mm_storeu_ps(L + 4 * (size_t)t, _mm512_castps512_ps128(l));
        _mm_storeu_ps(L + lstride + 4 * (size_t)t, _mm512_extractf32x4_ps(l, 1));
        _mm_storeu_ps(L + 2 * lstride + 4 * (size_t)t, _mm512_extractf32x4_ps(l, 2));
        _mm_storeu_ps(L + 3 * lstride + 4 * (size_t)t, _mm512_extractf32x4_ps(l, 3));
    }
}

/* v_pass() for four row groups (group g's probabilities at P + g * pstride;
   acc: [16][hd], natural order): each token's chunk dequantized once for
   the 16 rows. */
KV_AVX512 static KV_INLINE void v_pass16(const src *p, int kind, int anchor, uint32_t ntok, uint32_t hd,
                                         const float *P, size_t pstride, double *acc, pf_cursor *pf)
{
    const size_t row_bytes = row_bytes_of(p, kind, hd), gpt = p->gpt;
    for (uint32_t e = 0; e < hd; e += 16) {
        __m512 o[16], S = _mm512_setzero_ps(), Z = S, v[4];
        for (uint32_t r = 0; r < 16; r++)
            o[r] = _mm512_setzero_ps();
        const uint32_t g = is_quant(kind) ? p->chunk_group[e / 16] : 0; /* the chunk's group within a token */
        const uint8_t *row = p->data;             /* token t's values */
        const float *s_row = p->s, *z_row = p->z; /* token t's scales and zeros */
        for (uint32_t t = 0; t < ntok; t++, row += row_bytes, s_row += gpt, z_row += gpt) {
            kv_cpu_prefetch_step(pf);
            tables_at(p, kind, s_row, z_row, g, 0, &S, &Z);
            load_values_at(p, kind, anchor, row, e, S, Z, v);
            for (uint32_t r = 0; r < 16; r++)
                o[r] = _mm512_fmadd_ps(_mm512_set1_ps(P[r / 4 * pstride + 4 * (size_t)t + r % 4]), v[0], o[r]);
        }
        for (uint32_t r = 0; r < 16; r++)
            acc_add(acc + (size_t)r * hd + e, o[r]);
    }
}

/* Only for is_step16() kinds. */
KV_AVX512 static void k_pass16_any(const src *p, uint32_t ntok, uint32_t hd, const float *q16, float scale,
                                   const uint32_t *pos, __m512i qpos16, __mmask16 valid16, float *L, size_t lstride,
                                   pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define K16_CALL(kind, anchor)                                                                                  \
    if (is_step16(kind))                                                                                       \
        k_pass16(p, kind, anchor, ntok, hd, q16, scale, pos, qpos16, valid16, L, lstride, pf);
    KV_SRC_SWITCH(K16_CALL)
#undef K16_CALL
    *pf_io = c;
}

/* Only for is_step16() kinds. */
KV_AVX512 static void v_pass16_any(const src *p, uint32_t ntok, uint32_t hd, const float *P, size_t pstride,
                                   double *acc, pf_cursor *pf_io)
{
    pf_cursor c = *pf_io, *pf = &c; /* in registers while the pass runs */
#define V16_CALL(kind, anchor)                                                                                  \
    if (is_step16(kind))                                                                                       \
        v_pass16(p, kind, anchor, ntok, hd, P, pstride, acc, pf);
    KV_SRC_SWITCH(V16_CALL)
#undef V16_CALL
    *pf_io = c;
}

/* Valid rows of row groups g4 .. g4 + 3 of nq rows: bit 4g + r. */
static __mmask16 valid_of4(uint32_t nq, uint32_t g4)
{
    uint32_t m = 0;
    for (uint32_t g = 0; g < 4; g++) {
        uint32_t live = nq - (g4 + g) * 4 >= 4 ? 4 : nq - (g4 + g) * 4;
        m |= ((1u << live) - 1u) << (4 * g);
    }
    return (__mmask16)m;
}

/* e^x for x <= 0 (Cephes-style: x = n ln2 + r, degree-6 polynomial in r,
   about 2 ulp); 0 where x is -Inf or below -87.3. */
KV_AVX512 static KV_INLINE __m512 exp512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.3f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

/* Row-wise softmax of L[T][4] in place: 16 lanes = 4 tokens x 4 rows. A row
   that sees nothing becomes all zeros. */
KV_AVX512 static void softmax4(float *L, size_t T)
{
    size_t n = T * 4;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, L + i));
    }
    __m256 h = _mm256_max_ps(_mm512_castps512_ps256(vmax), _mm512_extractf32x8_ps(vmax, 1));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    m4 = _mm_mask_blend_ps(_mm_cmp_ps_mask(m4, _mm_set1_ps(-INFINITY), _CMP_EQ_OQ), m4, _mm_setzero_ps());
    __m512 M = _mm512_broadcast_f32x4(m4);
    __m512d total_lo = _mm512_setzero_pd(), total_hi = _mm512_setzero_pd();
    for (size_t b = 0; b < n; b += 1024) { /* blocks of 64 vectors summed in float, then in double */
        size_t e = b + 1024 < n ? b + 1024 : n;
        __m512 sum = _mm512_setzero_ps();
        for (size_t i = b; i < e; i += 16) {
            __mmask16 m = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1u);
            __m512 x = exp512(_mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, L + i), M));
            _mm512_mask_storeu_ps(L + i, m, x);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, x));
        }
        total_lo = _mm512_add_pd(total_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(sum)));
        total_hi = _mm512_add_pd(total_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sum, 1)));
    }
    /* lanes r, r+4, r+8, r+12 of the 16 sums belong to row r */
    double lanes[16], row[4] = {0, 0, 0, 0};
    _mm512_storeu_pd(lanes, total_lo);
    _mm512_storeu_pd(lanes + 8, total_hi);
    for (int i = 0; i < 16; i++)
        row[i % 4] += lanes[i];
    float inv[4];
    for (int r = 0; r < 4; r++)
        inv[r] = row[r] > 0 ? (float)(1.0 / row[r]) : 0.0f;
    __m512 I = _mm512_broadcast_f32x4(_mm_loadu_ps(inv));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(L + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, L + i), I));
    }
}

KV_AVX512 void kv_cpu_attention_item_avx512(void *arg, size_t i0, size_t i1, int worker)
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
            uint32_t qpos[1024 + 4];
            size_t rows4 = (size_t)groups4 * 4;
            float *qord[3] = {w->qpad, w->qpad + rows4 * hd, w->qpad + 2 * rows4 * hd}; /* the 3 orders */
            for (uint32_t r = 0; r < rows4; r++) {
                float *dst = qord[0] + (size_t)r * hd, *eo = qord[1] + (size_t)r * hd, *jm = qord[2] + (size_t)r * hd;
                if (r < nq) {
                    memcpy(dst, t->q + ((size_t)(q0 + r / G) * a->n_heads + kh * G + r % G) * hd, hd * sizeof(float));
                    qpos[r] = t->q_pos[q0 + r / G];
                } else {
                    memset(dst, 0, hd * sizeof(float));
                    qpos[r] = 0;
                }
                for (uint32_t d = 0; d < hd; d++) {
                    eo[order_index(1, d)] = dst[d];
                    if (hd % 64 == 0)
                        jm[order_index(2, d)] = dst[d];
                }
            }
            /* K pass: logits, token-major per row group */
            size_t base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = kv_cpu_pass_page(t, p, pend, 0, &pf);
                if (!pg)
                    continue;
                src_prepare(t, w, pg, 0, &ks);
                for (uint32_t g4 = 0; g4 < groups4; g4++) {
                    uint32_t live = nq - g4 * 4 >= 4 ? 4 : nq - g4 * 4;
                    if (g4 + 4 <= groups4 && is_step16(ks.kind)) { /* four row groups share each chunk */
                        k_pass16_any(&ks, pg->ntokens, hd, qord[0] + (size_t)g4 * 4 * hd, a->scale,
                                     t->positions + pg->pos_index, _mm512_loadu_si512(qpos + g4 * 4),
                                     valid_of4(nq, g4), w->logits + (size_t)g4 * 4 * T + 4 * base, 4 * T, &pf);
                        g4 += 3;
                        continue;
                    }
                    if (g4 + 1 < groups4 && ks.kind != SRC_CH) { /* two row groups share each chunk */
                        uint32_t live2 = nq - (g4 + 1) * 4 >= 4 ? 4 : nq - (g4 + 1) * 4;
                        float *La = w->logits + (size_t)g4 * 4 * T + 4 * base;
                        k_pass8_any(&ks, pg->ntokens, hd, qord[order_of(ks.kind)] + (size_t)g4 * 4 * hd, a->scale,
                                    t->positions + pg->pos_index, _mm_loadu_si128((const __m128i *)(qpos + g4 * 4)),
                                    _mm_loadu_si128((const __m128i *)(qpos + g4 * 4 + 4)),
                                    (__mmask8)((1u << live) - 1u), (__mmask8)((1u << live2) - 1u), La, La + 4 * T,
                                    &pf);
                        g4++;
                        continue;
                    }
                    k_pass_any(&ks, pg->ntokens, hd, qord[order_of(ks.kind)] + (size_t)g4 * 4 * hd, a->scale,
                               t->positions + pg->pos_index, _mm_loadu_si128((const __m128i *)(qpos + g4 * 4)),
                               (__mmask8)((1u << live) - 1u), w->logits + (size_t)g4 * 4 * T + 4 * base, &pf);
                }
                base += pg->ntokens;
            }
            /* softmax, and the scores: probabilities summed over queries */
            for (uint32_t g4 = 0; g4 < groups4; g4++) {
                float *L = w->logits + (size_t)g4 * 4 * T;
                softmax4(L, T);
                kv_cpu_scores_add4(t, w, L, g4, nq, T);
            }
            /* V pass */
            /* [rows4][hd] doubles in each of the 3 orders: w->acc has room (attention_fast) */
            double *acc[3] = {(double *)w->acc, (double *)w->acc + rows4 * hd, (double *)w->acc + 2 * rows4 * hd};
            memset(acc[0], 0, 3 * rows4 * hd * sizeof(double));
            base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = kv_cpu_pass_page(t, p, pend, 1, &pf);
                if (!pg)
                    continue;
                src_prepare(t, w, pg, 1, &vs);
                for (uint32_t g4 = 0; g4 < groups4; g4++) {
                    const float *Pa = w->logits + (size_t)g4 * 4 * T + 4 * base;
                    double *acca = acc[order_of(vs.kind)] + (size_t)g4 * 4 * hd;
                    if (g4 + 4 <= groups4 && is_step16(vs.kind)) { /* four row groups share each chunk */
                        v_pass16_any(&vs, pg->ntokens, hd, Pa, 4 * T, acca, &pf);
                        g4 += 3;
                        continue;
                    }
                    if (g4 + 1 < groups4 && vs.kind != SRC_Q2Q) { /* two row groups share each chunk */
                        v_pass8_any(&vs, pg->ntokens, hd, Pa, Pa + 4 * T, acca, acca + 4 * hd, &pf);
                        g4++;
                        continue;
                    }
                    v_pass_any(&vs, pg->ntokens, hd, Pa, acca, &pf);
                }
                base += pg->ntokens;
            }
            for (uint32_t r = 0; r < nq; r++) {
                float *out = t->out + ((size_t)(q0 + r / G) * a->n_heads + kh * G + r % G) * hd;
                const double *nat = acc[0] + (size_t)r * hd, *eo = acc[1] + (size_t)r * hd, *jm = acc[2] + (size_t)r * hd;
                for (uint32_t d = 0; d < hd; d++)
                    out[d] = (float)(nat[d] + eo[order_index(1, d)] + (hd % 64 == 0 ? jm[order_index(2, d)] : 0.0));
            }
        }
        if (w->score_acc)
            kv_cpu_scores_store(t, w, kh, T);
    }
}

#else

void kv_cpu_attention_item_avx512(void *job, size_t i0, size_t i1, int worker)
{
    (void)job, (void)i0, (void)i1, (void)worker; /* never chosen: kv_cpu_fast_isa() is "generic" here */
}

#endif
