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
#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/kv/encoding.h"

typedef struct kv_policy kv_policy;

/* What a hook sees of the request. */
typedef struct kv_policy_request {
    uint64_t id;
    int prompt_tokens;
    int output_tokens;
    double arrival_s;
    /* Its history (the engine fills these; -1 until the phase has happened). The workload gives no SLO or
       deadline, so there is none here (docs/policies.md, "ctx.request"). */
    double prefill_start_s, prefill_end_s;
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
    double kv_free_bytes;  /* bytes of memory free for KV (pages not held by running requests) */
    double kv_used_bytes;  /* bytes of KV pages held by running requests */
    int incoming;          /* decode: requests placed here whose KV is still in flight (not yet queued); 0 for prefill */
    double kv_reserved_bytes; /* decode: bytes of KV pages those incoming requests will need on arrival */
} kv_policy_node;

/* What a hook sees of one link of a request's route (ctx.route). */
typedef struct kv_policy_link {
    double capacity_gbps;   /* the link's bandwidth, gigabits/s */
    double rate_gbps;       /* what its flows get now, gigabits/s */
    double utilisation;     /* rate / capacity, 0..1 */
    int flows;              /* transfers on it now */
    double bytes_in_flight; /* bytes of those transfers not yet delivered */
    double bytes_queued;    /* bytes waiting to start on it */
} kv_policy_link;

/* The running system, as the engine shows it to hooks (ctx.now, ctx.prefill_nodes, ctx.decode_nodes,
   ctx.route). The host calls these lazily, only when a hook reads the field, and never caches an answer
   that read one. Every function gets `user`. */
typedef struct kv_policy_view {
    void *user;
    double (*now)(void *user);                                   /* the simulated clock, s */
    /* pool 0: prefill nodes, 1: decode nodes. Points *nodes at an array the view owns (valid until the
       next call of this function); returns its length. */
    int (*nodes)(void *user, int pool, const kv_policy_node **nodes);
    /* The links of request `id`'s route, at most `max` of them into links; returns how many. */
    int (*route)(void *user, uint64_t id, kv_policy_link *links, int max);
} kv_policy_view;

/* What hook `complete` sees of a finished request (ctx.result). */
typedef struct kv_policy_finished {
    double ttft_s;          /* first committed token - arrival */
    double ttft_spec_s;     /* first token, speculative or committed - arrival */
    double ttkt_s;          /* K-th committed token (lynx.ttkt_k) - arrival; -1 when it made fewer */
    double tpot_s;          /* (last - first committed token) / (tokens - 1); 0 for one token */
    double done_s;          /* when its last token was committed */
    double anchor_bytes, residual_bytes; /* on the wire, per plane (no split: all in anchor) */
    double bits;            /* bits per KV value on the wire: 8 x bytes / (prompt tokens x values per token) */
    int preemptions;
} kv_policy_finished;

#define KV_POLICY_MAX_ROUTE 16 /* links ctx.route shows at most */

/* Parameters from the scenario: `policy.<name>.<key>: value` (numbers,
   booleans or strings), checked against the policy's declared `params`. */
typedef struct kv_policy_param {
    const char *key;
    const char *value; /* as written in YAML; the host converts to the declared type */
    const char *where; /* "file:line:col" for error messages */
} kv_policy_param;

/* The sandbox's limits (docs/policies.md, "The sandbox"); 0 in a field means its default.
   The scenario's policy_limits.* keys fill this (core/study/study.c). */
typedef struct kv_policy_limits {
    uint64_t instructions_per_call; /* Lua VM instructions per hook call (max INT_MAX); loading gets 10x */
    uint64_t memory_bytes;          /* cap on the policy's Lua heap, bytes */
    uint64_t string_bytes;          /* longest string the policy may make, bytes (at most memory_bytes) */
    double hook_ms;                 /* wall-clock per hook call, ms; loading the file gets 10x */
    double run_s;                   /* wall-clock in the policy over its whole life (one run), s */
    uint64_t print_bytes;           /* print() output per policy before it is suppressed, bytes */
} kv_policy_limits;

#define KV_POLICY_DEFAULT_INSTRUCTIONS 1000000u           /* per hook call; loading the file gets 10x */
#define KV_POLICY_DEFAULT_MEMORY_BYTES (32u * 1024u * 1024u) /* per policy state */
#define KV_POLICY_DEFAULT_STRING_BYTES (1024u * 1024u)   /* per string */
#define KV_POLICY_DEFAULT_HOOK_MS 1000.0                  /* per hook call; loading the file gets 10x */
#define KV_POLICY_DEFAULT_RUN_S 600.0                     /* per policy, all calls together */
#define KV_POLICY_DEFAULT_PRINT_BYTES (64u * 1024u)       /* per policy */
#define KV_POLICY_MAX_SPECULATE 4096                      /* largest answer `speculate` may give */

/* The limits a scenario's policy_limits.* keys give each policy (kv_policy_load's `limits`). */
struct kv_scenario_limits;
void kv_policy_limits_from_scenario(const struct kv_scenario_limits *l, kv_policy_limits *out);

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
/* Hooks `prefill_node(ctx)` / `decode_node(ctx)`; default: least loaded (queued + running + incoming:
   a decode node counts the requests whose KV is already travelling to it), lowest index on ties.
   Returns a node index within the pool. */
int kv_policy_prefill_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes,
                           int n_nodes, int *node, kv_error *err);
int kv_policy_decode_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes,
                          int n_nodes, int *node, kv_error *err);
/* Hook `admit(ctx)`; default: admit when the request's KV fits in free memory. */
int kv_policy_admit(kv_policy *p, const kv_policy_request *r, const kv_policy_node *node,
                    double kv_bytes_needed, bool *admit, kv_error *err);

/* Hook `complete(ctx)`: told a request finished, with its measured outcome (ctx.result). Its answer is
   ignored. Default: nothing. */
int kv_policy_complete(kv_policy *p, const kv_policy_request *r, const kv_policy_finished *o, kv_error *err);
/* Shows hooks the running system (copied; NULL: none, then ctx.now is 0 and the node and route lists
   are empty). The engine sets it for its run and clears it at the end. */
void kv_policy_set_view(kv_policy *p, const kv_policy_view *v);

/* --- Additions (policy owner) -------------------------------------------- */

/* Tells the policy which model it serves, so every hook sees `ctx.model`
   (kv_policy_encoding also sets it from its `m`). Call once after loading;
   calling again with a different card clears the encoding cache. The policy
   copies what it needs. */
void kv_policy_set_model(kv_policy *p, const kv_policy_model *m);

/* The file's `describe` string ("" when absent), for tables and reports. */
const char *kv_policy_describe(const kv_policy *p);

/* The declared parameters after scenario overrides, sorted by key. `value` is
   rendered the way Lua's tostring renders it ("4", "0.02", "true", "strict").
   Pointers stay valid until kv_policy_destroy. */
int kv_policy_param_count(const kv_policy *p);
const char *kv_policy_param_key(const kv_policy *p, int i);
const char *kv_policy_param_value(const kv_policy *p, int i);
/* Writes "key=value key=value ..." (sorted) into buf; returns buf. */
const char *kv_policy_params_string(const kv_policy *p, char *buf, size_t size);

/* Whether the file defines hook `hook` ("encode", "transfer", ...). */
bool kv_policy_has_hook(const kv_policy *p, const char *hook);

/* Answers are cached per (layer, KV head) for `encode`, and once for
   `transfer` and `speculate`, whenever the hook's call read nothing of the
   request (ctx.request, ctx.context_length), nothing live (ctx.now,
   ctx.prefill_nodes, ctx.decode_nodes, ctx.route, ctx.state) and called no math.random. A file
   can opt out with `cache = false`; this switch turns caching off (benchmarks,
   tests) or back on. Turning it off also empties the cache. */
void kv_policy_set_cache(kv_policy *p, bool on);
/* True when kv_policy_encoding(p, m, r, layer, kv_head) answers without running
   the hook, so the same for every request r: the hook is absent, or its answer
   for (layer, kv_head) under model m is cached. It stays so while
   kv_policy_cache_epoch(p) is unchanged. */
bool kv_policy_encoding_fixed(const kv_policy *p, const kv_policy_model *m, int layer, int kv_head);
/* Changes whenever the caches are emptied (kv_policy_set_cache, a new model). */
uint64_t kv_policy_cache_epoch(const kv_policy *p);

typedef struct kv_policy_stats {
    uint64_t lua_calls;       /* hook calls that ran Lua */
    uint64_t cache_hits;      /* answers served from the cache */
    uint64_t default_answers; /* answers given by an absent hook's default */
    uint64_t memory_bytes;    /* Lua heap now */
    uint64_t memory_peak_bytes;
} kv_policy_stats;
void kv_policy_get_stats(const kv_policy *p, kv_policy_stats *out);

#endif
