/* policy_sandbox.h — internal to the policy host: a capped, sandboxed Lua 5.4 state.
 *
 * One kv_sandbox per loaded policy. It owns a lua_State whose allocator counts
 * every byte against a cap, whose standard library is cut down to base, table,
 * string, math and utf8 (no io, os, require, dofile, loadfile, binary chunks),
 * and whose VM runs under an instruction budget re-armed before every call.
 * Nothing here is global: the limits and the flags live in the struct, which is
 * the allocator's user data and sits in the state's extra space.
 *
 * Only core/policy*.c include this header.
 */
#ifndef KV_POLICY_SANDBOX_H
#define KV_POLICY_SANDBOX_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

typedef struct kv_sandbox {
    lua_State *L;              /* owned; NULL before open / after close */
    const char *name;          /* policy name, for print() and messages; not owned */
    size_t mem_bytes;          /* bytes currently allocated by the state */
    size_t mem_peak_bytes;     /* high-water mark of mem_bytes */
    size_t mem_cap_bytes;      /* allocations past this are refused */
    int instructions_per_call; /* VM instructions allowed per armed call (>= 1) */
    /* Per-call flags, cleared by kv_sandbox_arm: */
    int in_call;               /* 1 while a hook (or the file) runs */
    int mem_refused;           /* an allocation was refused for the cap */
    int budget_exceeded;       /* the instruction budget ran out */
    int impure;                /* math.random / math.randomseed was called */
    char where[256];           /* "file:line" of the Lua code running when a limit hit */
} kv_sandbox;

/* Opens the state with the given limits (both > 0). On failure returns -1 and
   writes a message to msg; the sandbox is then closed. */
int kv_sandbox_open(kv_sandbox *sb, const char *name, size_t mem_cap_bytes, int instructions_per_call,
                    char *msg, size_t msg_size);
/* Closes the state (runs finalizers under the budget); safe to call twice. */
void kv_sandbox_close(kv_sandbox *sb);
/* Clears the per-call flags and re-arms the instruction budget for one call of
   at most `instructions` VM instructions. */
void kv_sandbox_arm(kv_sandbox *sb, int instructions);
/* Marks the end of an armed call. */
void kv_sandbox_disarm(kv_sandbox *sb);
/* The sandbox a state belongs to (kept in the state's extra space). */
kv_sandbox *kv_sandbox_of(lua_State *L);
/* Message handler for lua_pcall: the error message followed by a traceback. */
int kv_sandbox_msgh(lua_State *L);
/* Writes a human size ("32 MiB", "512 KiB", "100 bytes") into buf. */
void kv_sandbox_format_bytes(size_t bytes, char *buf, size_t size);

#endif
