/* policy_internal.h — shared by core/policy*.c only: the call record and the answer checkers. */
#ifndef KV_POLICY_INTERNAL_H
#define KV_POLICY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <lua.h>

#include "core/policy.h"

enum kv_policy_hook { H_ENCODE, H_TRANSFER, H_SPECULATE, H_PREFILL_NODE, H_DECODE_NODE, H_ADMIT, H_COUNT };

/* The call in progress; filled by the public functions, read by the Lua side. */
typedef struct kv_policy_call {
    int hook;                   /* enum kv_policy_hook */
    const kv_policy_request *r; /* may be NULL */
    int layer, head;            /* encode */
    const kv_policy_node *nodes; /* placement: the pool, n_nodes of them */
    int n_nodes;
    const kv_policy_node *node; /* admit */
    double kv_bytes_needed;     /* admit */
    bool read_request;          /* the hook read ctx.request or ctx.context_length */
    bool bad;                   /* the answer failed validation; detail says why */
    char detail[512];           /* "key.bits = 17; expected ..." */
    void *out;                  /* where the parsed answer goes (type depends on hook) */
} kv_policy_call;

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
