/* encoding.h — how a KV cache is stored and sent: the encoding of each (layer, KV head) and the
 * transfer plan of a request. Policies choose them (core/policy/policy.h); the byte counts
 * (core/kv/kvbytes.h), the engine, the reference model's KV store and the kernels read them.
 */
#ifndef KV_ENCODING_H
#define KV_ENCODING_H

#include <stdbool.h>

/* How one of K or V is stored and sent. */
typedef enum kv_tensor_kind {
    KV_TENSOR_BF16 = 0, /* bf16, 2 bytes a value */
    KV_TENSOR_INT = 1,  /* b-bit group quantization + fp16 scale/zero per group */
} kv_tensor_kind;

typedef struct kv_tensor_enc {
    kv_tensor_kind kind;
    int bits;        /* b, 1..16 (INT) */
    int anchor_bits; /* a: 0 = no split; 1..b-1 = Lynx anchor/residual planes */
    int group_size;  /* G (INT) */
    int per_channel; /* 1: groups run across tokens per channel (KIVI keys) */
} kv_tensor_enc;

/* The encoding of one (layer, KV head). */
typedef struct kv_encoding {
    kv_tensor_enc key, value;
    int full_precision_window; /* KIVI: the most recent R tokens stay bf16 (0 = none) */
    /* DiffKV: when diffkv is true, key/value above are the high tier. */
    bool diffkv;
    kv_tensor_enc key_low, value_low; /* low tier (default K4V2) */
    double alpha_high, alpha_low;     /* thresholds are alpha / context length */
    int window;                       /* the most recent W tokens stay high */
} kv_encoding;

/* How the KV of one request travels. */
typedef enum kv_stream_order {
    KV_ORDER_CONCURRENT = 0,   /* anchor and residual flows start together */
    KV_ORDER_ANCHOR_FIRST = 1, /* residual flow starts when the anchor has arrived */
} kv_stream_order;

/* What a decode node does with a request's KV when its memory runs out
   (the request is evicted from the batch and waits again). */
typedef enum kv_preempt_mode {
    KV_PREEMPT_RECOMPUTE = 0, /* drop the KV; rebuild it with a prefill of prompt + generated tokens (vLLM's default) */
    KV_PREEMPT_SWAP = 1,      /* copy the KV pages to host memory and back (memory.swap_bandwidth_gbs) */
} kv_preempt_mode;

#define KV_MAX_FLOW_LEVEL (1 << 30) /* largest priority level a transfer answer may give (net.h's KV_NET_MAX_LEVEL) */
#define KV_MAX_WEIGHT_RATIO 1e5      /* largest anchor : residual weight ratio with levels */

typedef struct kv_transfer_plan {
    kv_stream_order order;
    int priority_mode;        /* kv_priority_mode of net.h: none, strict, weighted */
    double anchor_weight;     /* weighted mode: share of the anchor class */
    double residual_weight;   /* weighted mode: share of the residual class */
    bool layerwise;           /* send each layer's KV as prefill produces it */
    bool levels;              /* `levels = {anchor = A, residual = R}` given: this request's flows carry their own
                                 priority level (0 highest, strict between levels) and, within a level, weight
                                 anchor_weight / residual_weight, whatever network.priority says */
    int anchor_level, residual_level; /* 0..KV_MAX_FLOW_LEVEL, when `levels` */
    kv_preempt_mode preempt;  /* `preempt = "recompute" | "swap"` in the transfer answer; default recompute */
} kv_transfer_plan;

#endif
