/* kvstore.c — one sequence's KV cache in the policy's encoding (attention over it: kvstore_attention.c).
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
#include "core/refmodel/kvstore.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/kv/diffkv.h"
#include "core/refmodel/kvquant.h"
#include "core/refmodel/kvstore_internal.h"

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
void kv_kvstore_lane_sync_kt(lane *L, int hd)
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
   DiffKV's rule (core/kv/diffkv.h: its mean significance against alpha / context);
   returns false if it was pruned (removed from the lane). */
bool kv_kvstore_apply_tier(const kv_encoding *e, lane *L, int i, int64_t context, int hd)
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
            if (kv_kvstore_apply_tier(e, L, i, context, hd))
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
