/* policy.h — policies: Lua scripts that decide encodings, streams, speculation, placement.
 *
 * A policy file returns a table of optional hooks (see docs/policies.md). The
 * engine asks through the functions below; each returns KV_OK or an error
 * whose message names the policy file, line, hook and request. Absent hooks
 * give the defaults documented next to each function. Policies run sandboxed
 * (policy.c): no io/os/require/binary chunks, an instruction budget per call
 * and a memory cap per state.
 */
#ifndef KV_POLICY_H
#define KV_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef struct kv_policy kv_policy;

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

typedef struct kv_transfer_plan {
    kv_stream_order order;
    int priority_mode;        /* kv_priority_mode of net.h: none, strict, weighted */
    double anchor_weight;     /* weighted mode: share of the anchor class */
    double residual_weight;   /* weighted mode: share of the residual class */
    bool layerwise;           /* send each layer's KV as prefill produces it */
} kv_transfer_plan;

/* What a hook sees of the request. */
typedef struct kv_policy_request {
    uint64_t id;
    int prompt_tokens;
    int output_tokens;
    double arrival_s;
} kv_policy_request;

/* What a hook sees of the model. */
typedef struct kv_policy_model {
    const char *name;
    int layers, heads, kv_heads, head_dim;
} kv_policy_model;

/* What a placement hook sees of one node. */
typedef struct kv_policy_node {
    int index;             /* within its pool */
    int queued;            /* requests waiting */
    int running;           /* requests in the batch */
    double kv_free_bytes;  /* memory free for KV */
    double kv_used_bytes;
} kv_policy_node;

/* Parameters from the scenario: `policy.<name>.<key>: value` (numbers,
   booleans or strings), checked against the policy's declared `params`. */
typedef struct kv_policy_param {
    const char *key;
    const char *value; /* as written in YAML; the host converts to the declared type */
    const char *where; /* "file:line:col" for error messages */
} kv_policy_param;

typedef struct kv_policy_limits {
    uint64_t instructions_per_call; /* 0: default */
    uint64_t memory_bytes;          /* 0: default */
} kv_policy_limits;

/* Loads a policy file. KV_EINPUT on syntax errors, bad params, a bad return. */
int kv_policy_load(const char *name, const char *path, const kv_policy_param *params, int n_params,
                   const kv_policy_limits *limits, kv_policy **out, kv_error *err);
void kv_policy_destroy(kv_policy *p); /* NULL is fine */
const char *kv_policy_name(const kv_policy *p);
const char *kv_policy_path(const kv_policy *p);

/* Hook `encode(ctx)`; default: bf16 keys and values. */
int kv_policy_encoding(kv_policy *p, const kv_policy_model *m, const kv_policy_request *r,
                       int layer, int kv_head, kv_encoding *out, kv_error *err);
/* Hook `transfer(ctx)`; default: concurrent, no priority, not layer-wise. */
int kv_policy_transfer(kv_policy *p, const kv_policy_request *r, kv_transfer_plan *out, kv_error *err);
/* Hook `speculate(ctx)`; default 0 (no speculation). Returns max speculative tokens in *k. */
int kv_policy_speculation(kv_policy *p, const kv_policy_request *r, int *k, kv_error *err);
/* Hooks `prefill_node(ctx)` / `decode_node(ctx)`; default: least loaded, lowest index.
   Returns a node index within the pool. */
int kv_policy_prefill_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes,
                           int n_nodes, int *node, kv_error *err);
int kv_policy_decode_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes,
                          int n_nodes, int *node, kv_error *err);
/* Hook `admit(ctx)`; default: admit when the request's KV fits in free memory. */
int kv_policy_admit(kv_policy *p, const kv_policy_request *r, const kv_policy_node *node,
                    double kv_bytes_needed, bool *admit, kv_error *err);

#endif
