/* policy_internal.h — shared by core/policy*.c only: the call record and the answer checkers. */
#ifndef KV_POLICY_INTERNAL_H
#define KV_POLICY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <lua.h>

#include "core/policy/policy.h"
#include "core/policy/policy_sandbox.h"

enum kv_policy_hook { H_ENCODE, H_TRANSFER, H_SPECULATE, H_PREFILL_NODE, H_DECODE_NODE, H_ADMIT, H_COMPLETE, H_COUNT };

/* The call in progress; filled by the public functions, read by the Lua side. */
typedef struct kv_policy_call {
    int hook;                   /* enum kv_policy_hook */
    const kv_policy_request *r; /* may be NULL */
    int layer, head;            /* encode */
    const kv_policy_node *nodes; /* placement: the pool, n_nodes of them */
    int n_nodes;
    const kv_policy_node *node; /* admit */
    double kv_bytes_needed;     /* admit */
    const kv_policy_finished *outcome; /* complete */
    bool read_request;          /* the hook read ctx.request or ctx.context_length */
    bool read_live;             /* the hook read ctx.now, the node lists, ctx.route or ctx.state */
    bool bad;                   /* the answer failed validation; detail says why */
    char detail[512];           /* "key.bits = 17; expected ..." */
    void *out;                  /* where the parsed answer goes (type depends on hook) */
} kv_policy_call;

/* --- policy.c: the host ---------------------------------------------------- */

/* The hooks' names, by enum kv_policy_hook. */
extern const char *const kv_policy_hook_names[H_COUNT];

typedef enum param_type { PT_INT, PT_NUM, PT_BOOL, PT_STR } param_type;

typedef struct policy_param {
    char *key;       /* owned */
    param_type type; /* from the declared default */
    char *value;     /* owned; rendered like Lua's tostring, after overrides */
    char *set_where; /* owned; "file:line:col" of the scenario override, or NULL */
} policy_param;

struct kv_policy {
    kv_sandbox sb;              /* first member: kv_sandbox_of(L) is also the policy */
    char *name, *path;          /* owned */
    char *describe;             /* owned, "" when absent */
    int hook_ref[H_COUNT];      /* registry refs; LUA_NOREF when the hook is absent */
    int hook_line[H_COUNT];     /* line where the hook's function starts */
    int ctx_mt_ref;             /* metatable of ctx tables */
    int request_mt_ref;         /* strict metatable of ctx.request */
    int node_mt_ref;            /* strict metatable of node tables */
    int link_mt_ref;            /* strict metatable of ctx.route's link tables */
    int result_mt_ref;          /* strict metatable of ctx.result */
    int state_ref;              /* ctx.state: the policy's own table, kept for the whole run */
    kv_policy_view view;        /* the running system (kv_policy_set_view); all NULL: none */
    int params_ref;             /* read-only view of the params table */
    int model_ref;              /* read-only view of the model table; LUA_NOREF when unknown */
    bool model_known, model_dirty;
    kv_policy_model model;      /* copy; name owned */
    policy_param *params;       /* sorted by key */
    int n_params;
    bool cache_file;            /* the file's `cache` field (default true) */
    bool cache_on;              /* kv_policy_set_cache */
    int cache_layers, cache_heads; /* shape of the encode cache */
    bool *enc_valid;            /* (layer, head) → true when enc[] holds the answer */
    kv_encoding *enc;           /* (layer, head) */
    uint64_t cache_epoch;       /* times the caches were emptied (kv_policy_cache_epoch) */
    bool transfer_valid, spec_valid;
    kv_transfer_plan transfer;
    int spec;
    kv_policy_call cur;
    kv_policy_stats stats;
};

/* --- policy_params.c: the declared parameters ------------------------------- */

/* Runs inside lua_pcall with the policy file's table at index t: reads its `params` defaults (the
   type of each default is the declared type) into p->params, applies the scenario's overrides
   (params, n_params) converted to that type, and keeps a read-only view of the table in
   p->params_ref. KV_OK, or KV_EINPUT with err set. */
int kv_policy_params_setup(lua_State *L, kv_policy *p, int t, const kv_policy_param *params, int n_params,
                           kv_error *err);
/* Frees p->params (the keys, values and where each was set). */
void kv_policy_params_free(kv_policy *p);

/* --- policy_ctx.c: the tables a hook sees ---------------------------------- */

/* The policy whose sandbox runs L. */
kv_policy *kv_policy_of(lua_State *L);
/* Replaces the table at idx by a read-only view of it (errors name `what`). */
void kv_policy_push_readonly(lua_State *L, int idx, const char *what);
/* A registry ref to a metatable that refuses unknown fields (errors name `what`). */
int kv_policy_make_strict_mt(lua_State *L, const char *what);
/* ctx's __index: the fields of the call in progress (lazy request, context_length). */
int kv_policy_ctx_index(lua_State *L);
/* The body of one hook call, run under lua_pcall: builds ctx, calls the hook, checks its answer. */
int kv_policy_call_body(lua_State *L);

/* --- policy_report.c: failure reports --------------------------------------- */

/* "file:line" where the sandbox stopped, or fallback. */
const char *kv_policy_limit_where(const kv_policy *p, const char *fallback);
/* Turns a failed hook call (lua status, a limit hit, a bad answer) into err (KV_EINPUT or KV_EFAIL). */
int kv_policy_hook_failure(kv_policy *p, int status, kv_error *err);

/* --- policy_answer.c: checking what hooks return ----------------------- */

/* Each reads the answer at stack index idx, fills *out and returns 0, or marks
   the call bad (c->bad, c->detail) and returns -1. They run inside lua_pcall
   and may leave values on the stack. */
int kv_policy_answer_encoding(lua_State *L, kv_policy_call *c, int idx, kv_encoding *out);
int kv_policy_answer_transfer(lua_State *L, kv_policy_call *c, int idx, kv_transfer_plan *out);
int kv_policy_answer_speculate(lua_State *L, kv_policy_call *c, int idx, int *out);
/* nodes_idx: the ctx.nodes table the hook saw (a node table may be returned). */
int kv_policy_answer_node(lua_State *L, kv_policy_call *c, int idx, int nodes_idx, int *out);
int kv_policy_answer_admit(lua_State *L, kv_policy_call *c, int idx, bool *out);
/* Marks the call bad with a printf-style detail; returns -1. */
int kv_policy_answer_bad(kv_policy_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* bf16 for one of K or V. */
void kv_policy_set_bf16(kv_tensor_enc *e);

/* Writes "; did you mean 'x'?" when a candidate is close, then " (label: a, b, c)". */
void kv_policy_suggest(const char *word, const char *const *cands, int n, const char *label, char *buf,
                       size_t size);
/* The string keys of the table at idx (at most 64), valid while the table holds them. */
int kv_policy_table_keys(lua_State *L, int idx, const char **keys);
/* A short rendering of a value for messages: 17, 2.5, "abc", a table. Never allocates in Lua. */
void kv_policy_describe_value(lua_State *L, int idx, char *buf, size_t size);

#endif
