/* kvstore_internal.h — the KV store's lanes and struct, shared by kvstore.c (the store) and
 * kvstore_attention.c (attention over it); not for other files. The invariants are kvstore.c's. */
#ifndef KV_KVSTORE_INTERNAL_H
#define KV_KVSTORE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/refmodel/kvstore.h"

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

/* Brings kt/rkt up to date with k/rk for the lane's n tokens (invariant 5). */
void kv_kvstore_lane_sync_kt(lane *L, int hd);
/* Gives token i its final DiffKV tier; false if it was pruned (removed from the lane). */
bool kv_kvstore_apply_tier(const kv_encoding *e, lane *L, int i, int64_t context, int hd);

#endif
