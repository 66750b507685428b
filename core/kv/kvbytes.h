/* kvbytes.h — how many bytes a policy's encoding of a KV cache takes, plane by plane.
 *
 * The arithmetic is the packed layout of backends/backend.h (byte-aligned
 * groups, fp16 scale and zero per group), so the bytes the simulator sends are
 * the bytes the kernels produce (tests/kv/test_kvbytes.c checks this against the
 * CPU reference's pack kernel).
 */
#ifndef KV_KVBYTES_H
#define KV_KVBYTES_H

#include "core/kv/encoding.h"

/* DiffKV: what happens to the tokens outside the recent window. */
typedef struct kv_tier_split {
    double high; /* fraction kept in the high tier */
    double low;  /* fraction kept in the low tier; the rest is pruned */
} kv_tier_split;

/* Bytes of one (layer, KV head) at a given context length, K and V together. */
typedef struct kv_head_bytes {
    double anchor;   /* first plane + all metadata (the whole tensor when not split) */
    double residual; /* second plane (0 when not split) */
    double kept_tokens; /* tokens stored (DiffKV prunes some) */
} kv_head_bytes;

/* Bytes of `tokens` tokens stored as `e`. tiers is used when e->diffkv. */
void kv_encoding_bytes(const kv_encoding *e, int tokens, int head_dim, const kv_tier_split *tiers,
                       kv_head_bytes *out);
/* Bytes one tensor (K or V) of `tokens` tokens takes in each plane. */
void kv_tensor_bytes(const kv_tensor_enc *t, int tokens, int head_dim, double *anchor, double *residual);

#endif
