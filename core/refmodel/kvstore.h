/* kvstore.h — the reference model's KV cache of one sequence, stored the way a policy says.
 *
 * Life of a store (the disaggregated request, seen from the KV cache):
 *   1. prefill: the prompt's K and V are appended exactly (fp32) and attention
 *      is exact — the prefill node computes at full precision;
 *   2. kv_kvstore_seal: the prompt's KV is encoded per the policy's
 *      kv_encoding of each (layer, KV head) — this is what crosses the
 *      network. DiffKV assigns tiers here by core/kv/diffkv.h's rule from the
 *      significance every later prompt query gave each token; KIVI keeps the most recent tokens bf16;
 *      Lynx keeps both planes but shows only the anchor until
 *      kv_kvstore_set_residual(true);
 *   3. decode: each new token's K and V are encoded on write (the decode
 *      node's cache: bf16, b-bit groups, the KIVI window, DiffKV's high tier
 *      demoted or pruned as it leaves the recent window), and attention reads
 *      the stored (reconstructed) values.
 * Numerics are docs/kernels.md's ("Numerics"): group quantization with fp16 scale/zero, the
 * anchor midpoint reconstruction, bf16 round to nearest even.
 *
 * Attention: exact fp32 through OpenBLAS for the prefill. After the seal,
 * with a backend set (kv_kvstore_set_backend), the stored codes are laid out
 * as the backend's pages — one page per run of tokens stored alike (bf16,
 * b-bit groups per token or per channel, Lynx anchor-only planes, DiffKV's
 * two tiers) with packed planes and fp16 metadata — and kv_backend_attention
 * runs over them; without one, a plain loop runs over the reconstructed
 * values (the same numbers the backend's decode produces from the codes).
 *
 * Optionally (KV_KVSTORE_MEASURE) a store keeps the bf16 rounding of every
 * exact K/V beside it and, at each attention call after the seal, also
 * attends over those with the same queries: the relative error of the
 * attention output per layer, "what this policy's KV does to attention
 * given the same inputs".
 */
#ifndef KV_KVSTORE_H
#define KV_KVSTORE_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/base/error.h"
#include "core/kv/encoding.h"

typedef struct kv_kvstore kv_kvstore;

typedef struct kv_kvstore_shape {
    int n_layers;
    int n_heads;    /* query heads */
    int n_kv_heads; /* n_heads % n_kv_heads == 0 */
    int head_dim;
} kv_kvstore_shape;

enum {
    KV_KVSTORE_MEASURE = 1, /* keep bf16 reference values and measure attention error */
    KV_KVSTORE_SCORES = 2,  /* gather DiffKV significance in every lane (for clones) */
};

/* enc: one kv_encoding per (layer, KV head), index layer * n_kv_heads + head,
   copied; NULL keeps everything exact (fp32) forever. KV_EINPUT if an
   encoding is out of range (bits, groups, anchor). *out is the caller's. */
int kv_kvstore_create(const kv_kvstore_shape *shape, const kv_encoding *enc, unsigned flags, kv_kvstore **out,
                      kv_error *err);
void kv_kvstore_destroy(kv_kvstore *s); /* NULL is fine */

/* A copy of an unsealed store (its prefill) with other encodings and flags:
   one exact prefill serves every policy. KV_EINPUT if src is sealed or an
   encoding is out of range. *out is the caller's. */
int kv_kvstore_clone(const kv_kvstore *src, const kv_encoding *enc, unsigned flags, kv_kvstore **out,
                     kv_error *err);

/* Appends T tokens' K and V for one layer: k, v are f32 [T][n_kv_heads][head_dim]
   (after RoPE), pos [T] increasing and after every stored position. */
void kv_kvstore_append(kv_kvstore *s, int layer, const float *k, const float *v, const int32_t *pos, int T);

/* Causal attention of T queries q (f32 [T][n_heads][head_dim], positions pos)
   over the layer's stored KV (keys at positions <= the query's); out is f32
   [T][n_heads][head_dim]. Call after appending the queries' own K/V.
   Fails only when the backend does (its error, KV_EFAIL or KV_EINPUT). */
int kv_kvstore_attention(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                         kv_error *err);

/* Attention after the seal goes through this backend's kernel (borrowed: it
   must outlive the store; NULL: the built-in loop). The store keeps its
   backend buffers between calls and frees them here or at destroy. */
void kv_kvstore_set_backend(kv_kvstore *s, kv_backend *be);

/* Ends the prefill: encodes every stored token per the policy. */
void kv_kvstore_seal(kv_kvstore *s);
bool kv_kvstore_sealed(const kv_kvstore *s);

/* Lynx: false (after the seal) shows the prompt's anchor-only reconstruction;
   true shows anchor + residual merged. No effect without an anchor split. */
void kv_kvstore_set_residual(kv_kvstore *s, bool arrived);

/* Forgets every token at position >= pos (verification recomputes them). */
void kv_kvstore_truncate(kv_kvstore *s, int32_t pos);

/* Tokens stored for (layer 0, head 0) plus pruned ones: the sequence length. */
int kv_kvstore_length(const kv_kvstore *s);

typedef struct kv_kvstore_layer_stats {
    double stored_bytes;     /* K+V bytes as encoded (planes + fp16 metadata), all KV heads */
    double bf16_bytes;       /* the same tokens in bf16, pruned ones included */
    double tokens;           /* (token, KV head) pairs, pruned included */
    double tokens_high;      /* DiffKV high tier, or the policy's main encoding */
    double tokens_low;       /* DiffKV low tier */
    double tokens_pruned;    /* DiffKV pruned */
    double tokens_window;    /* kept bf16 by a full-precision window (KIVI) or not yet sealed */
    double att_err_sq;       /* sum over measured attention outputs of |o - o_ref|^2 */
    double att_ref_sq;       /* sum of |o_ref|^2 */
    double att_measured;     /* (query, head) outputs measured */
} kv_kvstore_layer_stats;

void kv_kvstore_get_layer_stats(const kv_kvstore *s, int layer, kv_kvstore_layer_stats *out);

/* DiffKV significance of the stored tokens of (layer, KV head), in position
   order: positions, the summed probability each received (max over the GQA
   group) and the number of queries summed. Pointers into the store, valid
   until it changes; gathered by DiffKV lanes and by KV_KVSTORE_SCORES stores.
   Returns the number of stored tokens. */
int kv_kvstore_scores(const kv_kvstore *s, int layer, int kv_head, const int32_t **pos, const float **sum,
                      const float **queries);
/* The kv_tier (core/kv/diffkv.h) of positions 0 .. n-1 of (layer, KV head):
   KV_TIER_PRUNED where nothing is stored, KV_TIER_LOW for DiffKV's low tier,
   KV_TIER_HIGH otherwise (any other stored token). Returns the tokens stored. */
int kv_kvstore_tiers(const kv_kvstore *s, int layer, int kv_head, uint8_t *tiers, int n);

#endif
