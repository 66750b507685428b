/* kvstore.c — one sequence's KV cache in the policy's encoding, and attention over it.
 *
 * Layout: one lane per (layer, KV head) — positions, per-token tier, and the
 * values attention reads now (k, v: f32 [n][head_dim], the reconstruction of
 * the stored codes). Tokens are kept in position order; pruning removes them.
 *
 * Invariants (checked by kv_assert where cheap):
 *  1. lane positions strictly increase;
 *  2. before the seal every token is TIER_EXACT; after it none is;
 *  3. in a lane without DiffKV, tokens [0, n_quant) hold the main encoding and
 *     tokens [n_quant, n) the bf16 window, n_quant a multiple of the block;
 *  4. tokens [0, n_split) of a Lynx lane keep their anchor-only and merged
 *     reconstructions in ka/va and kf/vf; k/v hold a copy of the one shown
 *     (anchor until the residual arrives).
 *  5. every change to k or rk at token i lowers kt_valid to at most i, so the
 *     transposed copies that decode attention reads are refreshed from there.
 */
#include "core/model/kvstore.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/diffkv.h"
#include "core/model/kvquant.h"

#define kv_assert(cond)                                                                                          \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            fprintf(stderr, "kvsim: internal error: %s:%d: %s\n", __FILE__, __LINE__, #cond);                    \
            abort();                                                                                             \
        }                                                                                                        \
    } while (0)

enum { TIER_EXACT = 0, TIER_WINDOW = 1, TIER_HIGH = 2, TIER_LOW = 3 };

typedef struct lane {
    int n, cap;       /* tokens stored, capacity */
    int32_t *pos;     /* [cap] positions */
    uint8_t *tier;    /* [cap] TIER_* */
    uint8_t *fixed;   /* [cap] DiffKV: tier decided for good */
    float *k, *v;     /* [cap][head_dim] what attention reads */
    float *ka, *va;   /* [cap][head_dim] Lynx: anchor-only reconstruction of tokens [0, n_split) */
    float *kf, *vf;   /* [cap][head_dim] Lynx: merged reconstruction of tokens [0, n_split) */
    float *rk, *rv;   /* [cap][head_dim] bf16 of the exact values (KV_KVSTORE_MEASURE) */
    float *sig;       /* [cap] DiffKV: summed probability (max over the GQA group) */
    float *sig_n;     /* [cap] queries summed into sig */
    int n_quant;      /* invariant 3 */
    int n_split;      /* invariant 4 */
    int pruned;       /* tokens pruned so far */
    uint16_t *kc, *vc; /* [cap][head_dim] codes of quantized tokens (b bits, before any split) */
    uint16_t *ks, *kz, *vs, *vz; /* [cap][head_dim] fp16 scale/zero: entry g of a token's row is its
                                   g-th group (per-token groups) or channel g's group (per-channel) */
    float *kt, *rkt;  /* [head_dim][kt_cap]: k and rk transposed, for decode attention */
    int kt_cap;       /* columns of kt */
    int kt_valid;     /* columns [0, kt_valid) of kt/rkt match k/rk (invariant 5) */
} lane;

struct kv_kvstore {
    kv_kvstore_shape shape;
    kv_encoding *enc;   /* [n_layers * n_kv_heads], NULL = exact forever */
    kv_backend *backend;/* attention after the seal runs here when set (borrowed) */
    kv_buffer *dev[8];  /* the backend buffers of attention calls, reused: q, q_pos, pages, head_pages,
                           positions, kv_data, out, scores */
    size_t dev_bytes[8];
    uint8_t *host;      /* kv_data staging, reused */
    size_t host_cap;
    unsigned flags;
    bool sealed, residual;
    int length;         /* positions seen (max position + 1) */
    lane *lanes;        /* [n_layers * n_kv_heads] */
    double *err_sq, *ref_sq, *measured; /* [n_layers] attention error sums */
};

/* ---- Encodings -------------------------------------------------------------------------- */

static int check_tensor(const kv_tensor_enc *t, const char *what, int layer, int head, kv_error *err)
{
    if (t->kind == KV_TENSOR_BF16)
        return KV_OK;
    if (t->kind != KV_TENSOR_INT)
        return kv_error_set(err, KV_EINPUT, "layer %d head %d: %s: unknown kind %d", layer, head, what, t->kind);
    if (t->bits < 1 || t->bits > 16)
        return kv_error_set(err, KV_EINPUT, "layer %d head %d: %s: bits %d (must be 1..16)", layer, head, what,
                            t->bits);
    if (t->anchor_bits < 0 || (t->anchor_bits > 0 && t->anchor_bits >= t->bits))
        return kv_error_set(err, KV_EINPUT, "layer %d head %d: %s: anchor bits %d (must be 0 or 1..bits-1)", layer,
                            head, what, t->anchor_bits);
    if (t->group_size < 1 || t->group_size > 65536)
        return kv_error_set(err, KV_EINPUT, "layer %d head %d: %s: group size %d (must be 1..65536)", layer, head,
                            what, t->group_size);
    return KV_OK;
}

static int check_encoding(const kv_encoding *e, int layer, int head, kv_error *err)
{
    int rc = check_tensor(&e->key, "key", layer, head, err);
    if (!rc)
        rc = check_tensor(&e->value, "value", layer, head, err);
    if (rc)
        return rc;
    if (e->full_precision_window < 0)
        return kv_error_set(err, KV_EINPUT, "layer %d head %d: negative full-precision window", layer, head);
    bool kc = e->key.kind == KV_TENSOR_INT && e->key.per_channel;
    bool vc = e->value.kind == KV_TENSOR_INT && e->value.per_channel;
    if (kc && vc && e->key.group_size != e->value.group_size)
        return kv_error_set(err, KV_EINPUT,
                            "layer %d head %d: per-channel keys and values need one group size (%d vs %d)", layer,
                            head, e->key.group_size, e->value.group_size);
    if (e->diffkv) {
        rc = check_tensor(&e->key_low, "low-tier key", layer, head, err);
        if (!rc)
            rc = check_tensor(&e->value_low, "low-tier value", layer, head, err);
        if (rc)
            return rc;
        if (kc || vc || e->key_low.per_channel || e->value_low.per_channel)
            return kv_error_set(err, KV_EINPUT, "layer %d head %d: DiffKV tiers need per-token groups", layer, head);
        if (!(e->alpha_low >= 0.0) || !(e->alpha_high >= e->alpha_low) || e->window < 0)
            return kv_error_set(err, KV_EINPUT,
                                "layer %d head %d: DiffKV needs 0 <= alpha_low <= alpha_high and window >= 0", layer,
                                head);
    }
    return KV_OK;
}

/* Tokens per quantization block of a non-DiffKV lane: the per-channel group. */
static int block_tokens(const kv_encoding *e)
{
    if (e->key.kind == KV_TENSOR_INT && e->key.per_channel)
        return e->key.group_size;
    if (e->value.kind == KV_TENSOR_INT && e->value.per_channel)
        return e->value.group_size;
    return 1;
}

/* Where an encoding's codes and metadata go: row-major [tokens][head_dim]
   arrays (see lane.kc); codes NULL discards them. */
typedef struct code_sink {
    uint16_t *codes, *scale, *zero;
} code_sink;

/* Encodes one token's row x[0..hd) in place (x then holds the merged
   reconstruction); anchor, if not NULL, receives the anchor-only one (equal to
   the merged one for a tensor without an anchor split). */
static void encode_row(const kv_tensor_enc *t, float *x, int hd, float *anchor, code_sink cs)
{
    if (t->kind == KV_TENSOR_BF16) {
        for (int i = 0; i < hd; i++) {
            x[i] = kv_bf16_round(x[i]);
            if (anchor)
                anchor[i] = x[i];
        }
        return;
    }
    uint16_t small[256], s, z;
    uint16_t *codes = t->group_size <= 256 ? small : kv_malloc((size_t)t->group_size * sizeof *codes);
    for (int g0 = 0, gi = 0; g0 < hd; g0 += t->group_size, gi++) {
        int n = hd - g0 < t->group_size ? hd - g0 : t->group_size;
        kv_group_quantize(x + g0, (size_t)n, 1, (unsigned)t->bits, codes, &s, &z);
        if (cs.codes) {
            memcpy(cs.codes + g0, codes, (size_t)n * sizeof *codes);
            cs.scale[gi] = s;
            cs.zero[gi] = z;
        }
        for (int i = 0; i < n; i++) {
            x[g0 + i] = kv_group_dequantize(codes[i], s, z);
            if (anchor)
                anchor[g0 + i] = t->anchor_bits > 0 ? kv_group_dequantize_anchor(codes[i], (unsigned)t->bits,
                                                                                 (unsigned)t->anchor_bits, s, z)
                                                    : x[g0 + i];
        }
    }
    if (codes != small)
        kv_free(codes);
}

/* Encodes B tokens x[B][hd] in place with per-channel groups (the B values
   of one channel form a group); anchor and sink as in encode_row. */
static void encode_block_channel(const kv_tensor_enc *t, float *x, int B, int hd, float *anchor, code_sink cs)
{
    uint16_t *codes = kv_malloc((size_t)B * sizeof *codes), s, z;
    for (int c = 0; c < hd; c++) {
        kv_group_quantize(x + c, (size_t)B, (size_t)hd, (unsigned)t->bits, codes, &s, &z);
        for (int i = 0; i < B; i++) {
            size_t at = (size_t)i * hd + (size_t)c;
            if (cs.codes) {
                cs.codes[at] = codes[i];
                cs.scale[at] = s;
                cs.zero[at] = z;
            }
            x[at] = kv_group_dequantize(codes[i], s, z);
            if (anchor)
                anchor[at] = t->anchor_bits > 0 ? kv_group_dequantize_anchor(codes[i], (unsigned)t->bits,
                                                                             (unsigned)t->anchor_bits, s, z)
                                                : x[at];
        }
    }
    kv_free(codes);
}

/* Encodes B consecutive tokens of one tensor (rows x[B][hd]) with t. */
static void encode_tokens(const kv_tensor_enc *t, float *x, int B, int hd, float *anchor, code_sink cs)
{
    if (t->kind == KV_TENSOR_INT && t->per_channel) {
        encode_block_channel(t, x, B, hd, anchor, cs);
        return;
    }
    for (int i = 0; i < B; i++) {
        size_t at = (size_t)i * hd;
        code_sink row = cs.codes ? (code_sink){cs.codes + at, cs.scale + at, cs.zero + at} : cs;
        encode_row(t, x + at, hd, anchor ? anchor + at : NULL, row);
    }
}

/* Bytes one token of a tensor costs (per-channel: its share of a block). */
static double token_bytes(const kv_tensor_enc *t, int hd, bool split)
{
    if (t->kind == KV_TENSOR_BF16)
        return 2.0 * hd;
    unsigned a = split ? (unsigned)t->anchor_bits : 0;
    if (t->per_channel)
        return (double)hd * (double)kv_group_bytes((size_t)t->group_size, (unsigned)t->bits, a) / t->group_size;
    double b = 0;
    for (int g0 = 0; g0 < hd; g0 += t->group_size) {
        int n = hd - g0 < t->group_size ? hd - g0 : t->group_size;
        b += (double)kv_group_bytes((size_t)n, (unsigned)t->bits, a);
    }
    return b;
}

static bool enc_has_split(const kv_encoding *e)
{
    return (e->key.kind == KV_TENSOR_INT && e->key.anchor_bits > 0) ||
           (e->value.kind == KV_TENSOR_INT && e->value.anchor_bits > 0);
}

/* ---- Lanes ------------------------------------------------------------------------------- */

static void lane_reserve(lane *L, int need, int hd, unsigned flags, bool split)
{
    if (need <= L->cap && (!split || L->ka))
        return;
    int cap = L->cap ? L->cap : 64;
    while (cap < need)
        cap *= 2;
    size_t row = (size_t)hd * sizeof(float);
    L->pos = kv_realloc(L->pos, (size_t)cap * sizeof *L->pos);
    L->tier = kv_realloc(L->tier, (size_t)cap);
    L->fixed = kv_realloc(L->fixed, (size_t)cap);
    L->k = kv_realloc(L->k, (size_t)cap * row);
    L->v = kv_realloc(L->v, (size_t)cap * row);
    L->sig = kv_realloc(L->sig, (size_t)cap * sizeof *L->sig);
    L->sig_n = kv_realloc(L->sig_n, (size_t)cap * sizeof *L->sig_n);
    uint16_t **codes[] = {&L->kc, &L->vc, &L->ks, &L->kz, &L->vs, &L->vz};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        *codes[i] = kv_realloc(*codes[i], (size_t)cap * (size_t)hd * sizeof(uint16_t));
    if (split || L->ka) {
        L->ka = kv_realloc(L->ka, (size_t)cap * row);
        L->va = kv_realloc(L->va, (size_t)cap * row);
        L->kf = kv_realloc(L->kf, (size_t)cap * row);
        L->vf = kv_realloc(L->vf, (size_t)cap * row);
    }
    if (flags & KV_KVSTORE_MEASURE) {
        L->rk = kv_realloc(L->rk, (size_t)cap * row);
        L->rv = kv_realloc(L->rv, (size_t)cap * row);
    }
    L->cap = cap;
}

static void lane_free(lane *L)
{
    float *arrays[] = {L->k, L->v, L->ka, L->va, L->kf, L->vf, L->rk, L->rv, L->sig, L->sig_n, L->kt, L->rkt};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        kv_free(arrays[i]);
    uint16_t *codes[] = {L->kc, L->vc, L->ks, L->kz, L->vs, L->vz};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        kv_free(codes[i]);
    kv_free(L->pos);
    kv_free(L->tier);
    kv_free(L->fixed);
}

static code_sink key_sink(const lane *L, int i, int hd)
{
    size_t at = (size_t)i * hd;
    return (code_sink){L->kc + at, L->ks + at, L->kz + at};
}

static code_sink value_sink(const lane *L, int i, int hd)
{
    size_t at = (size_t)i * hd;
    return (code_sink){L->vc + at, L->vs + at, L->vz + at};
}

/* Token i's keys changed (invariant 5). */
static void lane_touch(lane *L, int i)
{
    if (i < L->kt_valid)
        L->kt_valid = i;
}

/* Brings kt/rkt up to date with k/rk for the lane's n tokens. */
static void lane_sync_kt(lane *L, int hd)
{
    if (L->kt_cap < L->n) {
        L->kt_cap = L->cap;
        L->kt = kv_realloc(L->kt, (size_t)hd * L->kt_cap * sizeof(float));
        if (L->rk)
            L->rkt = kv_realloc(L->rkt, (size_t)hd * L->kt_cap * sizeof(float));
        L->kt_valid = 0;
    }
    size_t cap = (size_t)L->kt_cap;
    for (int j = L->kt_valid; j < L->n; j++)
        for (int c = 0; c < hd; c++) {
            L->kt[(size_t)c * cap + j] = L->k[(size_t)j * hd + c];
            if (L->rk)
                L->rkt[(size_t)c * cap + j] = L->rk[(size_t)j * hd + c];
        }
    L->kt_valid = L->n;
}

/* Removes token i (DiffKV pruning; DiffKV lanes have no split planes). */
static void lane_remove(lane *L, int i, int hd)
{
    size_t tail = (size_t)(L->n - i - 1), row = (size_t)hd, at = (size_t)i;
    memmove(L->pos + at, L->pos + at + 1, tail * sizeof *L->pos);
    memmove(L->tier + at, L->tier + at + 1, tail);
    memmove(L->fixed + at, L->fixed + at + 1, tail);
    memmove(L->k + at * row, L->k + (at + 1) * row, tail * row * sizeof(float));
    memmove(L->v + at * row, L->v + (at + 1) * row, tail * row * sizeof(float));
    if (L->rk) {
        memmove(L->rk + at * row, L->rk + (at + 1) * row, tail * row * sizeof(float));
        memmove(L->rv + at * row, L->rv + (at + 1) * row, tail * row * sizeof(float));
    }
    memmove(L->sig + at, L->sig + at + 1, tail * sizeof *L->sig);
    memmove(L->sig_n + at, L->sig_n + at + 1, tail * sizeof *L->sig_n);
    uint16_t *codes[] = {L->kc, L->vc, L->ks, L->kz, L->vs, L->vz};
    for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++)
        memmove(codes[c] + at * row, codes[c] + (at + 1) * row, tail * row * sizeof(uint16_t));
    L->n--;
    L->pruned++;
    lane_touch(L, i);
}

/* ---- Creation -------------------------------------------------------------------------------- */

int kv_kvstore_create(const kv_kvstore_shape *shape, const kv_encoding *enc, unsigned flags, kv_kvstore **out,
                      kv_error *err)
{
    *out = NULL;
    if (shape->n_layers < 1 || shape->n_heads < 1 || shape->n_kv_heads < 1 || shape->head_dim < 1 ||
        shape->n_heads % shape->n_kv_heads)
        return kv_error_set(err, KV_EINPUT, "KV store: bad shape (%d layers, %d heads, %d KV heads, head_dim %d)",
                            shape->n_layers, shape->n_heads, shape->n_kv_heads, shape->head_dim);
    size_t n_lanes = (size_t)shape->n_layers * (size_t)shape->n_kv_heads;
    if (enc)
        for (size_t i = 0; i < n_lanes; i++) {
            int rc = check_encoding(&enc[i], (int)(i / (size_t)shape->n_kv_heads),
                                    (int)(i % (size_t)shape->n_kv_heads), err);
            if (rc)
                return rc;
        }
    kv_kvstore *s = kv_calloc(1, sizeof *s);
    s->shape = *shape;
    s->flags = flags;
    if (enc) {
        s->enc = kv_malloc(n_lanes * sizeof *s->enc);
        memcpy(s->enc, enc, n_lanes * sizeof *s->enc);
    }
    s->lanes = kv_calloc(n_lanes, sizeof *s->lanes);
    s->err_sq = kv_calloc((size_t)shape->n_layers, sizeof *s->err_sq);
    s->ref_sq = kv_calloc((size_t)shape->n_layers, sizeof *s->ref_sq);
    s->measured = kv_calloc((size_t)shape->n_layers, sizeof *s->measured);
    *out = s;
    return KV_OK;
}

void kv_kvstore_destroy(kv_kvstore *s)
{
    if (!s)
        return;
    size_t n_lanes = (size_t)s->shape.n_layers * (size_t)s->shape.n_kv_heads;
    for (size_t i = 0; i < n_lanes; i++)
        lane_free(&s->lanes[i]);
    kv_free(s->lanes);
    for (int i = 0; i < 8; i++)
        if (s->dev[i])
            kv_buffer_free(s->backend, s->dev[i]);
    kv_free(s->host);
    kv_free(s->enc);
    kv_free(s->err_sq);
    kv_free(s->ref_sq);
    kv_free(s->measured);
    kv_free(s);
}

int kv_kvstore_clone(const kv_kvstore *src, const kv_encoding *enc, unsigned flags, kv_kvstore **out,
                     kv_error *err)
{
    *out = NULL;
    if (src->sealed)
        return kv_error_set(err, KV_EINPUT, "KV store: only an unsealed (prefill) store can be cloned");
    kv_kvstore *s;
    int rc = kv_kvstore_create(&src->shape, enc, flags, &s, err);
    if (rc)
        return rc;
    int hd = src->shape.head_dim;
    size_t n_lanes = (size_t)src->shape.n_layers * (size_t)src->shape.n_kv_heads;
    for (size_t li = 0; li < n_lanes; li++) {
        const lane *a = &src->lanes[li];
        lane *b = &s->lanes[li];
        lane_reserve(b, a->n, hd, flags, false);
        size_t n = (size_t)a->n, rows = n * (size_t)hd;
        b->n = a->n;
        memcpy(b->pos, a->pos, n * sizeof *b->pos);
        memcpy(b->tier, a->tier, n);
        memcpy(b->fixed, a->fixed, n);
        memcpy(b->k, a->k, rows * sizeof(float));
        memcpy(b->v, a->v, rows * sizeof(float));
        memcpy(b->sig, a->sig, n * sizeof *b->sig);
        memcpy(b->sig_n, a->sig_n, n * sizeof *b->sig_n);
        if (b->rk)
            for (size_t i = 0; i < rows; i++) {
                b->rk[i] = kv_bf16_round(a->k[i]);
                b->rv[i] = kv_bf16_round(a->v[i]);
            }
    }
    s->length = src->length;
    *out = s;
    return KV_OK;
}

bool kv_kvstore_sealed(const kv_kvstore *s) { return s->sealed; }
int kv_kvstore_length(const kv_kvstore *s) { return s->length; }

/* ---- Tiers and windows ------------------------------------------------------------------------ */

/* Gives token i (holding its high-tier reconstruction) its final tier by
   DiffKV's rule (core/diffkv.h: its mean significance against alpha / context);
   returns false if it was pruned (removed from the lane). */
static bool apply_tier(const kv_encoding *e, lane *L, int i, int64_t context, int hd)
{
    kv_tier t = kv_diffkv_classify(L->sig[i], L->sig_n[i], context, (float)e->alpha_high, (float)e->alpha_low);
    L->fixed[i] = 1;
    if (t == KV_TIER_PRUNED) {
        lane_remove(L, i, hd);
        return false;
    }
    int tier = t == KV_TIER_HIGH ? TIER_HIGH : TIER_LOW;
    L->tier[i] = (uint8_t)tier;
    lane_touch(L, i);
    if (tier == TIER_LOW) { /* demotion re-quantizes what the cache holds */
        encode_row(&e->key_low, L->k + (size_t)i * hd, hd, NULL, key_sink(L, i, hd));
        encode_row(&e->value_low, L->v + (size_t)i * hd, hd, NULL, value_sink(L, i, hd));
    }
    return true;
}

/* Non-DiffKV lanes: encodes whole blocks that have left the bf16 window
   (they hold bf16 values, as KIVI's full-precision residual does). */
static void flush_window(const kv_encoding *e, lane *L, int hd)
{
    int B = block_tokens(e), W = e->full_precision_window;
    while (L->n - L->n_quant - W >= B) {
        size_t at = (size_t)L->n_quant * hd;
        lane_touch(L, L->n_quant);
        encode_tokens(&e->key, L->k + at, B, hd, NULL, key_sink(L, L->n_quant, hd));
        encode_tokens(&e->value, L->v + at, B, hd, NULL, value_sink(L, L->n_quant, hd));
        for (int t = 0; t < B; t++)
            L->tier[L->n_quant + t] = TIER_HIGH;
        L->n_quant += B;
    }
}

static void seal_lane(kv_kvstore *s, const kv_encoding *e, lane *L)
{
    int hd = s->shape.head_dim, n = L->n;
    lane_touch(L, 0);
    if (e->diffkv) {
        int context = s->length;
        /* Every token takes the high tier first; those outside the recent
           window are then decided for good from their prefill significance. */
        for (int i = 0; i < n; i++) {
            encode_row(&e->key, L->k + (size_t)i * hd, hd, NULL, key_sink(L, i, hd));
            encode_row(&e->value, L->v + (size_t)i * hd, hd, NULL, value_sink(L, i, hd));
            L->tier[i] = TIER_HIGH;
            L->fixed[i] = 0;
        }
        int decide = n - e->window, i = 0;
        for (int seen = 0; seen < decide; seen++)
            if (apply_tier(e, L, i, context, hd))
                i++;
        return;
    }
    int B = block_tokens(e), Q = n - e->full_precision_window;
    Q = Q < 0 ? 0 : Q - Q % B;
    bool split = enc_has_split(e);
    if (split)
        lane_reserve(L, n, hd, s->flags, true);
    for (int i0 = 0; i0 < Q; i0 += B) {
        size_t at = (size_t)i0 * hd;
        encode_tokens(&e->key, L->k + at, B, hd, split ? L->ka + at : NULL, key_sink(L, i0, hd));
        encode_tokens(&e->value, L->v + at, B, hd, split ? L->va + at : NULL, value_sink(L, i0, hd));
    }
    for (int i = 0; i < n; i++) {
        L->tier[i] = i < Q ? TIER_HIGH : TIER_WINDOW;
        if (i >= Q)
            for (int c = 0; c < hd; c++) {
                L->k[(size_t)i * hd + c] = kv_bf16_round(L->k[(size_t)i * hd + c]);
                L->v[(size_t)i * hd + c] = kv_bf16_round(L->v[(size_t)i * hd + c]);
            }
    }
    L->n_quant = Q;
    if (split) {
        size_t bytes = (size_t)Q * hd * sizeof(float);
        memcpy(L->kf, L->k, bytes);
        memcpy(L->vf, L->v, bytes);
        memcpy(L->k, L->ka, bytes); /* the anchor is what has arrived */
        memcpy(L->v, L->va, bytes);
        L->n_split = Q;
    }
}

void kv_kvstore_seal(kv_kvstore *s)
{
    if (s->sealed)
        return;
    s->sealed = true;
    s->residual = false;
    if (!s->enc)
        return;
    size_t n_lanes = (size_t)s->shape.n_layers * (size_t)s->shape.n_kv_heads;
    for (size_t i = 0; i < n_lanes; i++)
        seal_lane(s, &s->enc[i], &s->lanes[i]);
}

void kv_kvstore_set_residual(kv_kvstore *s, bool arrived)
{
    s->residual = arrived;
    size_t n_lanes = (size_t)s->shape.n_layers * (size_t)s->shape.n_kv_heads;
    for (size_t i = 0; i < n_lanes; i++) {
        lane *L = &s->lanes[i];
        if (!L->n_split)
            continue;
        size_t bytes = (size_t)L->n_split * s->shape.head_dim * sizeof(float);
        lane_touch(L, 0);
        memcpy(L->k, arrived ? L->kf : L->ka, bytes);
        memcpy(L->v, arrived ? L->vf : L->va, bytes);
    }
}

void kv_kvstore_truncate(kv_kvstore *s, int32_t pos)
{
    size_t n_lanes = (size_t)s->shape.n_layers * (size_t)s->shape.n_kv_heads;
    for (size_t i = 0; i < n_lanes; i++) {
        lane *L = &s->lanes[i];
        while (L->n > 0 && L->pos[L->n - 1] >= pos)
            L->n--;
        lane_touch(L, L->n);
        if (L->n_quant > L->n)
            L->n_quant = L->n;
        if (L->n_split > L->n)
            L->n_split = L->n;
    }
    if (s->length > pos)
        s->length = pos;
}

/* ---- Appending ------------------------------------------------------------------------------------- */

void kv_kvstore_append(kv_kvstore *s, int layer, const float *k, const float *v, const int32_t *pos, int T)
{
    int H = s->shape.n_kv_heads, hd = s->shape.head_dim;
    for (int h = 0; h < H; h++) {
        size_t li = (size_t)layer * H + (size_t)h;
        lane *L = &s->lanes[li];
        const kv_encoding *e = s->enc ? &s->enc[li] : NULL;
        lane_reserve(L, L->n + T, hd, s->flags, false);
        for (int t = 0; t < T; t++) {
            kv_assert(L->n == 0 || pos[t] > L->pos[L->n - 1]); /* invariant 1 */
            int i = L->n++;
            size_t at = (size_t)i * hd;
            lane_touch(L, i);
            const float *kr = k + ((size_t)t * H + (size_t)h) * hd, *vr = v + ((size_t)t * H + (size_t)h) * hd;
            memcpy(L->k + at, kr, (size_t)hd * sizeof(float));
            memcpy(L->v + at, vr, (size_t)hd * sizeof(float));
            if (L->rk)
                for (int c = 0; c < hd; c++) {
                    L->rk[at + c] = kv_bf16_round(kr[c]);
                    L->rv[at + c] = kv_bf16_round(vr[c]);
                }
            L->pos[i] = pos[t];
            L->sig[i] = 0.0f;
            L->sig_n[i] = 0.0f;
            L->fixed[i] = 0;
            L->tier[i] = TIER_EXACT;
            if (!s->sealed || !e)
                continue;
            if (e->diffkv) {
                /* New tokens enter the high tier; the one leaving the recent
                   window is decided after this step's attention has added its
                   probabilities (decide_leaving). */
                encode_row(&e->key, L->k + at, hd, NULL, key_sink(L, i, hd));
                encode_row(&e->value, L->v + at, hd, NULL, value_sink(L, i, hd));
                L->tier[i] = TIER_HIGH;
            } else if (e->full_precision_window > 0 || block_tokens(e) > 1) {
                for (int c = 0; c < hd; c++) {
                    L->k[at + c] = kv_bf16_round(L->k[at + c]);
                    L->v[at + c] = kv_bf16_round(L->v[at + c]);
                }
                L->tier[i] = TIER_WINDOW;
                flush_window(e, L, hd);
            } else {
                encode_row(&e->key, L->k + at, hd, NULL, key_sink(L, i, hd));
                encode_row(&e->value, L->v + at, hd, NULL, value_sink(L, i, hd));
                L->tier[i] = TIER_HIGH;
                L->n_quant = L->n;
            }
        }
    }
    if (layer == 0 && T > 0 && pos[T - 1] + 1 > s->length)
        s->length = pos[T - 1] + 1;
}

/* ---- Attention ---------------------------------------------------------------------------------------- */

/* Softmax of x[0..n) in place (max subtracted; sum in double). */
static void softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* Tokens of lane L at positions <= p (positions increase). */
static int visible(const lane *L, int32_t p)
{
    int lo = 0, hi = L->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (L->pos[mid] <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Exact prefill attention through OpenBLAS. For each KV head and block of QB
   query rows, the rows of the G query heads that share the KV head are
   gathered into one matrix, so each block is two sgemm calls:
   S = Q K^T (scaled), row softmax over the visible keys, O = S V.
   DiffKV lanes (or KV_KVSTORE_SCORES) gather the probabilities every query
   gives each token (DiffKV's significance, core/diffkv.h): summed over
   queries per head, then the maximum over the heads of the group. */
static void attention_exact(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out)
{
    enum { QB = 128 };
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim, G = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    size_t ld = (size_t)H * hd, GR = (size_t)G * QB;
    float *Qg = kv_malloc(GR * hd * sizeof *Qg), *Og = kv_malloc(GR * hd * sizeof *Og);
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        lane *L = &s->lanes[li];
        bool scores = (s->flags & KV_KVSTORE_SCORES) || (s->enc && s->enc[li].diffkv);
        int nk_all = visible(L, pos[T - 1]);
        size_t nka = (size_t)(nk_all ? nk_all : 1);
        float *S = kv_malloc(GR * nka * sizeof *S);
        float *acc = scores ? kv_calloc((size_t)G * nka, sizeof *acc) : NULL;
        for (int r0 = 0; r0 < T; r0 += QB) {
            int rows = T - r0 < QB ? T - r0 : QB;
            int nk = visible(L, pos[r0 + rows - 1]);
            if (nk == 0) {
                for (int r = 0; r < rows; r++)
                    memset(out + (size_t)(r0 + r) * ld + (size_t)g * G * hd, 0, (size_t)G * hd * sizeof(float));
                continue;
            }
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++)
                    memcpy(Qg + ((size_t)hh * rows + r) * hd, q + (size_t)(r0 + r) * ld + (size_t)(g * G + hh) * hd,
                           (size_t)hd * sizeof(float));
            int M = G * rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, hd, scale, Qg, hd, L->k, hd, 0.0f, S, nk);
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++) {
                    float *row = S + ((size_t)hh * rows + r) * nk;
                    int m = visible(L, pos[r0 + r]);
                    softmax(row, m);
                    memset(row + m, 0, (size_t)(nk - m) * sizeof *row);
                    if (scores)
                        for (int j = 0; j < m; j++)
                            acc[(size_t)hh * nka + j] += row[j];
                }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, nk, 1.0f, S, nk, L->v, hd, 0.0f, Og, hd);
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++)
                    memcpy(out + (size_t)(r0 + r) * ld + (size_t)(g * G + hh) * hd, Og + ((size_t)hh * rows + r) * hd,
                           (size_t)hd * sizeof(float));
        }
        if (scores)
            for (int j = 0; j < nk_all; j++) {
                float best = 0.0f;
                for (int hh = 0; hh < G; hh++)
                    best = acc[(size_t)hh * nka + j] > best ? acc[(size_t)hh * nka + j] : best;
                L->sig[j] += best;
                for (int r = 0; r < T; r++)
                    L->sig_n[j] += pos[r] >= L->pos[j] ? 1.0f : 0.0f;
            }
        kv_free(S);
        kv_free(acc);
    }
    kv_free(Qg);
    kv_free(Og);
}

/* Attention of one query row over the first m tokens of a lane: keys from
   the transposed copy Kt (stride ld), values V [m][hd]. Plain loops that
   vectorize across tokens and channels while every sum keeps its order;
   p [m] receives the probabilities. */
static void attend_row(const float *qr, const float *Kt, size_t ld, const float *V, int m, int hd, float scale,
                       float *p, float *o)
{
    memset(o, 0, (size_t)hd * sizeof *o);
    if (m == 0)
        return;
    memset(p, 0, (size_t)m * sizeof *p);
    for (int c = 0; c < hd; c++) {
        float qc = qr[c];
        const float *kc = Kt + (size_t)c * ld;
        for (int j = 0; j < m; j++)
            p[j] += qc * kc[j];
    }
    for (int j = 0; j < m; j++)
        p[j] *= scale;
    softmax(p, m);
    for (int j = 0; j < m; j++) {
        float pj = p[j];
        const float *vj = V + (size_t)j * hd;
        for (int c = 0; c < hd; c++)
            o[c] += pj * vj[c];
    }
}

/* ---- Attention through a backend ------------------------------------------------------------ */

/* How token i of a lane stores K (value false) or V, as a backend page format. */
static kv_store_format token_format(const kv_kvstore *s, const kv_encoding *e, const lane *L, int i, bool value)
{
    kv_store_format f = {0};
    const kv_tensor_enc *t = NULL;
    switch (L->tier[i]) {
    case TIER_EXACT:
        f.kind = KV_STORE_F32;
        return f;
    case TIER_WINDOW:
        f.kind = KV_STORE_BF16;
        return f;
    case TIER_HIGH:
        t = value ? &e->value : &e->key;
        break;
    default:
        t = value ? &e->value_low : &e->key_low;
        break;
    }
    if (t->kind == KV_TENSOR_BF16) {
        f.kind = KV_STORE_BF16;
        return f;
    }
    f.kind = KV_STORE_QUANT;
    f.bits = (uint8_t)t->bits;
    f.anchor_bits = (uint8_t)(i < L->n_split && !s->residual ? t->anchor_bits : 0);
    f.grouping = (uint8_t)(t->per_channel ? KV_GROUP_CHANNEL : KV_GROUP_TOKEN);
    f.group_size = (uint32_t)t->group_size;
    return f;
}

static bool same_format(const kv_store_format *a, const kv_store_format *b)
{
    return a->kind == b->kind && a->bits == b->bits && a->anchor_bits == b->anchor_bits &&
           a->grouping == b->grouping && a->group_size == b->group_size;
}

typedef struct bytes_vec {
    uint8_t *p;
    size_t n, cap;
} bytes_vec;

/* Reserves n zeroed bytes at a 16-byte aligned offset; returns the offset. */
static size_t bv_take(bytes_vec *b, size_t n)
{
    size_t at = (b->n + 15) & ~(size_t)15;
    if (at + n > b->cap)
        kv_grow((void **)&b->p, 1, &b->cap, at + n);
    memset(b->p + b->n, 0, at + n - b->n);
    b->n = at + n;
    return at;
}

/* Writes one group's codes (element i at codes[i * stride], shifted right by
   shift) as a little-endian bit stream of width w into zeroed dst. */
static void pack_group(uint8_t *dst, const uint16_t *codes, size_t n, size_t stride, unsigned shift, unsigned w)
{
    uint64_t acc = 0;
    unsigned have = 0;
    uint32_t mask = (1u << w) - 1u;
    for (size_t i = 0; i < n; i++) {
        acc |= (uint64_t)(((uint32_t)codes[i * stride] >> shift) & mask) << have;
        for (have += w; have >= 8; have -= 8, acc >>= 8)
            *dst++ = (uint8_t)acc;
    }
    if (have)
        *dst = (uint8_t)acc;
}

/* Writes tokens [i0, i0 + n) of one tensor of lane L in format f into kv;
   returns the data offset and sets *meta_off (scale[groups] then zero[groups]). */
static size_t put_tensor(bytes_vec *kv, const kv_store_format *f, const lane *L, bool value, int i0, int n, int hd,
                         uint64_t *meta_off)
{
    const float *x = (value ? L->v : L->k) + (size_t)i0 * hd;
    size_t count = (size_t)n * hd;
    *meta_off = 0;
    if (f->kind == KV_STORE_F32) {
        size_t at = bv_take(kv, count * 4);
        memcpy(kv->p + at, x, count * 4);
        return at;
    }
    if (f->kind == KV_STORE_BF16) { /* the stored values are bf16 numbers: their top 16 bits */
        size_t at = bv_take(kv, count * 2);
        for (size_t i = 0; i < count; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            uint16_t h = (uint16_t)(bits >> 16);
            memcpy(kv->p + at + 2 * i, &h, 2);
        }
        return at;
    }
    const uint16_t *codes = (value ? L->vc : L->kc) + (size_t)i0 * hd;
    const uint16_t *sc = (value ? L->vs : L->ks) + (size_t)i0 * hd, *zr = (value ? L->vz : L->kz) + (size_t)i0 * hd;
    kv_quant_layout lay = {(uint32_t)n, (uint32_t)hd, f->group_size, (kv_grouping)f->grouping};
    unsigned w = f->anchor_bits ? f->anchor_bits : f->bits;
    unsigned shift = f->anchor_bits ? (unsigned)(f->bits - f->anchor_bits) : 0;
    size_t groups = kv_layout_groups(&lay);
    size_t at = bv_take(kv, kv_layout_packed_bytes(&lay, w));
    size_t meta = bv_take(kv, kv_layout_meta_bytes(&lay));
    size_t off = at;
    for (size_t g = 0; g < groups; g++) {
        size_t len = kv_layout_group_len(&lay, g), first, stride;
        uint16_t s, z;
        if (f->grouping == KV_GROUP_TOKEN) {
            size_t gpr = ((size_t)hd + f->group_size - 1) / f->group_size, row = g / gpr, gi = g % gpr;
            first = row * (size_t)hd + gi * f->group_size;
            stride = 1;
            s = sc[row * (size_t)hd + gi];
            z = zr[row * (size_t)hd + gi];
        } else { /* channel c of a block of group_size tokens */
            size_t block = g / (size_t)hd, c = g % (size_t)hd;
            first = block * f->group_size * (size_t)hd + c;
            stride = (size_t)hd;
            s = sc[first];
            z = zr[first];
        }
        pack_group(kv->p + off, codes + first, len, stride, shift, w);
        off += (len * w + 7) / 8;
        memcpy(kv->p + meta + 2 * g, &s, 2);
        memcpy(kv->p + meta + 2 * (groups + g), &z, 2);
    }
    *meta_off = meta;
    return at;
}

/* Backend buffer `slot` of the store with room for bytes (kept between calls;
   grown by half again when too small). */
static int dev_reserve(kv_kvstore *s, int slot, size_t bytes, kv_buffer **out, kv_error *err)
{
    bytes = bytes ? bytes : 4;
    if (s->dev_bytes[slot] < bytes) {
        if (s->dev[slot])
            kv_buffer_free(s->backend, s->dev[slot]);
        s->dev[slot] = NULL;
        s->dev_bytes[slot] = 0;
        size_t want = bytes + bytes / 2;
        int rc = kv_buffer_alloc(s->backend, want, &s->dev[slot], err);
        if (rc)
            return rc;
        s->dev_bytes[slot] = want;
    }
    *out = s->dev[slot];
    return KV_OK;
}

/* Writes host bytes into backend buffer `slot`. */
static int upload(kv_kvstore *s, int slot, const void *src, size_t bytes, kv_buffer **out, kv_error *err)
{
    int rc = dev_reserve(s, slot, bytes, out, err);
    if (!rc && bytes)
        rc = kv_buffer_write(s->backend, *out, 0, src, bytes, err);
    return rc;
}

/* The layer's lanes as backend pages (one per run of tokens stored alike;
   per-channel groups also end a page at their block edge), then
   kv_backend_attention over them. DiffKV lanes take the per-token
   probabilities back for their significance. */
static int attention_backend(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                             kv_error *err)
{
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim;
    kv_page_desc *pages = NULL;
    size_t n_pages = 0, cap_pages = 0, n_pos = 0;
    uint32_t *head_pages = kv_malloc((size_t)KVH * 2 * sizeof *head_pages), *positions = NULL;
    bytes_vec kv = {s->host, 0, s->host_cap};
    bool scores = false;
    uint32_t stride = 1;
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        const lane *L = &s->lanes[li];
        const kv_encoding *e = s->enc ? &s->enc[li] : NULL;
        scores |= e && e->diffkv;
        stride = (uint32_t)L->n > stride ? (uint32_t)L->n : stride;
        head_pages[2 * g] = (uint32_t)n_pages;
        positions = kv_realloc(positions, (n_pos + (size_t)L->n + 1) * sizeof *positions);
        for (int i0 = 0; i0 < L->n;) {
            kv_store_format kf = token_format(s, e, L, i0, false), vf = token_format(s, e, L, i0, true);
            int B = 0;
            if (kf.kind == KV_STORE_QUANT && kf.grouping == KV_GROUP_CHANNEL)
                B = (int)kf.group_size;
            else if (vf.kind == KV_STORE_QUANT && vf.grouping == KV_GROUP_CHANNEL)
                B = (int)vf.group_size;
            int i1 = i0 + 1;
            while (i1 < L->n && (B == 0 || i1 % B != 0)) {
                kv_store_format k2 = token_format(s, e, L, i1, false), v2 = token_format(s, e, L, i1, true);
                if (!same_format(&kf, &k2) || !same_format(&vf, &v2))
                    break;
                i1++;
            }
            if (n_pages == cap_pages)
                kv_grow((void **)&pages, sizeof *pages, &cap_pages, n_pages + 1);
            kv_page_desc *pg = &pages[n_pages++];
            memset(pg, 0, sizeof *pg);
            pg->ntokens = (uint32_t)(i1 - i0);
            pg->pos_index = (uint32_t)n_pos;
            pg->key = kf;
            pg->value = vf;
            pg->key_data = put_tensor(&kv, &kf, L, false, i0, i1 - i0, hd, &pg->key_meta);
            pg->value_data = put_tensor(&kv, &vf, L, true, i0, i1 - i0, hd, &pg->value_meta);
            for (int i = i0; i < i1; i++)
                positions[n_pos++] = (uint32_t)L->pos[i];
            i0 = i1;
        }
        head_pages[2 * g + 1] = (uint32_t)n_pages - head_pages[2 * g];
    }
    uint32_t *qpos = kv_malloc((size_t)T * sizeof *qpos);
    for (int t = 0; t < T; t++)
        qpos[t] = (uint32_t)pos[t];
    size_t qbytes = (size_t)T * H * hd * sizeof(float), sbytes = (size_t)KVH * stride * sizeof(float);
    kv_backend *be = s->backend;
    kv_buffer *bq = NULL, *bqp = NULL, *bpg = NULL, *bhp = NULL, *bpos = NULL, *bkv = NULL, *bout = NULL,
              *bsc = NULL;
    s->host = kv.p; /* kept for the next call */
    s->host_cap = kv.cap;
    int rc = upload(s, 0, q, qbytes, &bq, err);
    if (!rc)
        rc = upload(s, 1, qpos, (size_t)T * 4, &bqp, err);
    if (!rc)
        rc = upload(s, 2, pages, n_pages * sizeof *pages, &bpg, err);
    if (!rc)
        rc = upload(s, 3, head_pages, (size_t)KVH * 8, &bhp, err);
    if (!rc)
        rc = upload(s, 4, positions, n_pos * 4, &bpos, err);
    if (!rc)
        rc = upload(s, 5, kv.p, kv.n, &bkv, err);
    if (!rc)
        rc = dev_reserve(s, 6, qbytes, &bout, err);
    if (!rc && scores)
        rc = dev_reserve(s, 7, sbytes, &bsc, err);
    float *sc = scores ? kv_malloc(sbytes) : NULL;
    if (!rc) {
        kv_attention_args a = {
            .n_queries = (uint32_t)T,
            .n_heads = (uint32_t)H,
            .n_kv_heads = (uint32_t)KVH,
            .head_dim = (uint32_t)hd,
            .n_pages = (uint32_t)n_pages,
            .score_stride = stride,
            .scale = 1.0f / sqrtf((float)hd),
            .q = {bq, 0},
            .q_pos = {bqp, 0},
            .pages = {n_pages ? bpg : NULL, 0},
            .head_pages = {bhp, 0},
            .positions = {n_pages ? bpos : NULL, 0},
            .kv_data = {n_pages ? bkv : NULL, 0},
            .out = {bout, 0},
            .scores = {bsc, 0},
        };
        rc = kv_backend_attention(be, &a, err);
    }
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    if (!rc)
        rc = kv_buffer_read(be, bout, 0, out, qbytes, err);
    if (!rc && scores)
        rc = kv_buffer_read(be, bsc, 0, sc, sbytes, err);
    if (!rc && scores)
        for (int g = 0; g < KVH; g++) {
            size_t li = (size_t)layer * KVH + (size_t)g;
            lane *L = &s->lanes[li];
            if (!s->enc[li].diffkv)
                continue;
            for (int j = 0; j < L->n; j++) {
                L->sig[j] += sc[(size_t)g * stride + (size_t)j];
                for (int t = 0; t < T; t++)
                    L->sig_n[j] += pos[t] >= L->pos[j] ? 1.0f : 0.0f;
            }
        }
    kv_free(sc);
    kv_free(qpos);
    kv_free(pages);
    kv_free(head_pages);
    kv_free(positions);
    if (rc)
        kv_error_prefix(err, "layer %d: ", layer);
    return rc;
}

/* Attention over the stored (encoded) KV after the seal: the backend's kernel
   when one is set, else the loop over the reconstructed values. With
   KV_KVSTORE_MEASURE, the same queries also run over the bf16 reference. */
static int attention_stored_run(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                            kv_error *err)
{
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim, G = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    bool measure = (s->flags & KV_KVSTORE_MEASURE) != 0, own = s->backend == NULL;
    if (!own) {
        int rc = attention_backend(s, layer, q, pos, T, out, err);
        if (rc || !measure)
            return rc;
    }
    float *ref = measure ? kv_malloc((size_t)hd * sizeof *ref) : NULL;
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        lane *L = &s->lanes[li];
        bool scores = own && s->enc && s->enc[li].diffkv;
        int nk_all = L->n ? L->n : 1;
        lane_sync_kt(L, hd);
        size_t ldk = (size_t)L->kt_cap;
        float *p = kv_malloc((size_t)nk_all * sizeof *p);
        float *acc = scores ? kv_calloc((size_t)G * (size_t)nk_all, sizeof *acc) : NULL;
        for (int t = 0; t < T; t++) {
            int m = visible(L, pos[t]);
            for (int hh = 0; hh < G; hh++) {
                int h = g * G + hh;
                const float *qr = q + ((size_t)t * H + (size_t)h) * hd;
                float *o = out + ((size_t)t * H + (size_t)h) * hd;
                if (own)
                    attend_row(qr, L->kt, ldk, L->v, m, hd, scale, p, o);
                if (scores)
                    for (int j = 0; j < m; j++)
                        acc[(size_t)hh * nk_all + j] += p[j];
                if (measure) {
                    /* The same query over bf16 K/V of the same tokens, pruned ones included. */
                    attend_row(qr, L->rkt, ldk, L->rv, m, hd, scale, p, ref);
                    double e2 = 0, r2 = 0;
                    for (int c = 0; c < hd; c++) {
                        double d = (double)o[c] - ref[c];
                        e2 += d * d;
                        r2 += (double)ref[c] * ref[c];
                    }
                    s->err_sq[layer] += e2;
                    s->ref_sq[layer] += r2;
                    s->measured[layer] += 1;
                }
            }
            if (scores)
                for (int j = 0; j < m; j++)
                    L->sig_n[j] += 1.0f;
        }
        if (scores)
            for (int j = 0; j < L->n; j++) {
                float best = 0.0f;
                for (int hh = 0; hh < G; hh++)
                    best = acc[(size_t)hh * nk_all + j] > best ? acc[(size_t)hh * nk_all + j] : best;
                L->sig[j] += best;
            }
        kv_free(p);
        kv_free(acc);
    }
    kv_free(ref);
    return KV_OK;
}

/* DiffKV decode: the tokens that have left the recent window since the last
   decision get their final tier, with the probabilities this step's queries
   just added and the context `context` (core/diffkv.h). Tokens are decided
   in position order, so the undecided ones are the lane's last. */
static void decide_leaving(const kv_encoding *e, lane *L, int64_t context, int hd)
{
    int i = L->n;
    while (i > 0 && !L->fixed[i - 1])
        i--;
    while (i < L->n - e->window)
        if (apply_tier(e, L, i, context, hd))
            i++;
}

static int attention_stored(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                            kv_error *err)
{
    int rc = attention_stored_run(s, layer, q, pos, T, out, err);
    if (rc || !s->enc)
        return rc;
    int32_t last = pos[0];
    for (int t = 1; t < T; t++)
        last = pos[t] > last ? pos[t] : last;
    for (int g = 0; g < s->shape.n_kv_heads; g++) {
        size_t li = (size_t)layer * s->shape.n_kv_heads + (size_t)g;
        if (s->enc[li].diffkv)
            decide_leaving(&s->enc[li], &s->lanes[li], (int64_t)last + 1, s->shape.head_dim);
    }
    return KV_OK;
}

void kv_kvstore_set_backend(kv_kvstore *s, kv_backend *be)
{
    for (int i = 0; i < 8; i++) {
        if (s->dev[i])
            kv_buffer_free(s->backend, s->dev[i]);
        s->dev[i] = NULL;
        s->dev_bytes[i] = 0;
    }
    s->backend = be;
}

int kv_kvstore_attention(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                         kv_error *err)
{
    if (T <= 0)
        return KV_OK;
    if (!s->sealed) {
        attention_exact(s, layer, q, pos, T, out);
        return KV_OK;
    }
    return attention_stored(s, layer, q, pos, T, out, err);
}

/* ---- Statistics ------------------------------------------------------------------------------------------ */

int kv_kvstore_scores(const kv_kvstore *s, int layer, int kv_head, const int32_t **pos, const float **sum,
                      const float **queries)
{
    const lane *L = &s->lanes[(size_t)layer * s->shape.n_kv_heads + (size_t)kv_head];
    if (pos)
        *pos = L->pos;
    if (sum)
        *sum = L->sig;
    if (queries)
        *queries = L->sig_n;
    return L->n;
}

int kv_kvstore_tiers(const kv_kvstore *s, int layer, int kv_head, uint8_t *tiers, int n)
{
    const lane *L = &s->lanes[(size_t)layer * s->shape.n_kv_heads + (size_t)kv_head];
    for (int p = 0; p < n; p++)
        tiers[p] = KV_TIER_PRUNED;
    for (int i = 0; i < L->n; i++)
        if (L->pos[i] >= 0 && L->pos[i] < n)
            tiers[L->pos[i]] = L->tier[i] == TIER_LOW ? KV_TIER_LOW : KV_TIER_HIGH;
    return L->n;
}

void kv_kvstore_get_layer_stats(const kv_kvstore *s, int layer, kv_kvstore_layer_stats *st)
{
    memset(st, 0, sizeof *st);
    int KVH = s->shape.n_kv_heads, hd = s->shape.head_dim;
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        const lane *L = &s->lanes[li];
        const kv_encoding *e = s->enc ? &s->enc[li] : NULL;
        st->tokens += L->n + L->pruned;
        st->tokens_pruned += L->pruned;
        st->bf16_bytes += 4.0 * hd * (L->n + L->pruned);
        for (int i = 0; i < L->n; i++) {
            switch (L->tier[i]) {
            case TIER_EXACT:
                st->tokens_window++;
                st->stored_bytes += 8.0 * hd;
                break;
            case TIER_WINDOW:
                st->tokens_window++;
                st->stored_bytes += 4.0 * hd;
                break;
            case TIER_HIGH: {
                bool split = i < L->n_split;
                st->tokens_high++;
                st->stored_bytes += token_bytes(&e->key, hd, split) + token_bytes(&e->value, hd, split);
                break;
            }
            default:
                st->tokens_low++;
                st->stored_bytes += token_bytes(&e->key_low, hd, false) + token_bytes(&e->value_low, hd, false);
                break;
            }
        }
    }
    st->att_err_sq = s->err_sq[layer];
    st->att_ref_sq = s->ref_sq[layer];
    st->att_measured = s->measured[layer];
}
