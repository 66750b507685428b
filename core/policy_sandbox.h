/* policy_sandbox.h — internal to the policy host: a capped, sandboxed Lua 5.4 state.
 *
 * One kv_sandbox per loaded policy. It owns a lua_State whose allocator counts
 * every byte against a cap (and refuses any one string past a string cap),
 * whose standard library is cut down to base, table, string, math and utf8
 * (no io, os, require, dofile, loadfile, binary chunks), and whose calls run
 * under an instruction budget and a wall-clock budget re-armed before every
 * call, plus a wall-clock budget for the policy's whole life (one run).
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

/* Ticks (kv_sandbox_tick units) one call of a wrapped library function costs. */
#define KV_SANDBOX_CALL_TICKS 16

/* Which limit stopped the call in progress (kv_sandbox.limit). */
typedef enum kv_sandbox_limit {
    KV_SB_OK,           /* none */
    KV_SB_INSTRUCTIONS, /* the instruction budget of the call ran out */
    KV_SB_HOOK_TIME,    /* the call ran past its wall-clock budget */
    KV_SB_RUN_TIME,     /* the policy ran past its wall-clock budget for the run */
    KV_SB_LOAD_SOURCE,  /* load() was fed more source than a string may hold */
} kv_sandbox_limit;

/* The limits a sandbox is opened with; all > 0. */
typedef struct kv_sandbox_limits {
    size_t mem_cap_bytes;      /* allocations past this are refused */
    size_t string_cap_bytes;   /* longest string the state may make, bytes */
    int instructions_per_call; /* VM instructions allowed per armed call (>= 1) */
    int64_t hook_ns;           /* wall-clock budget of one armed call, ns */
    int64_t run_ns;            /* wall-clock budget of all armed calls together, ns */
    size_t print_cap_bytes;    /* print() output per sandbox before it is suppressed, bytes */
} kv_sandbox_limits;

typedef struct kv_sandbox {
    lua_State *L;              /* owned; NULL before open / after close */
    const char *name;          /* policy name, for print() and messages; not owned */
    kv_sandbox_limits lim;     /* as opened */
    size_t mem_bytes;          /* bytes currently allocated by the state */
    size_t mem_peak_bytes;     /* high-water mark of mem_bytes */
    size_t print_bytes;        /* print() output written so far, bytes */
    int print_suppressed;      /* 1 once print_cap_bytes was reached */
    int64_t run_used_ns;       /* wall-clock spent in armed calls so far, ns */
    /* Per-call state, reset by kv_sandbox_arm: */
    int in_call;               /* 1 while a hook (or the file) runs */
    int mem_refused;           /* an allocation was refused for the memory cap */
    int str_refused;           /* an allocation was refused for the string cap */
    size_t str_refused_bytes;  /* size of the string refused last, bytes */
    int last_refusal;          /* 1: memory cap, 2: string cap (the latest refusal) */
    kv_sandbox_limit limit;    /* the limit that stopped the call; sticky until the next arm */
    int budget_exceeded;       /* limit == KV_SB_INSTRUCTIONS (kept for readers) */
    int impure;                /* math.random / math.randomseed was called */
    int call_instructions;     /* the budget this call was armed with */
    int64_t instr_left;        /* instructions (and charged C work) left in this call */
    int hook_count;            /* the count the hook is armed with now */
    int clock_tick;            /* C work units left before the clock is read again */
    int64_t call_start_ns;     /* monotonic clock at arm, ns */
    int64_t call_hook_ns;      /* wall-clock budget of this call, ns */
    int64_t deadline_ns;       /* monotonic clock past which the call is stopped, ns */
    int deadline_is_run;       /* the deadline comes from the run budget, not the hook's */
    char where[256];           /* "file:line" of the Lua code running when a limit hit */
} kv_sandbox;

/* Opens the state with the given limits. On failure returns -1 and writes a
   message to msg; the sandbox is then closed. */
int kv_sandbox_open(kv_sandbox *sb, const char *name, const kv_sandbox_limits *lim, char *msg, size_t msg_size);
/* Closes the state (runs pending __close handlers under a fresh budget); safe to call twice. */
void kv_sandbox_close(kv_sandbox *sb);
/* Resets the per-call state and arms the budgets for one call of at most
   `instructions` VM instructions and `hook_ns` of wall-clock time (both
   also bounded by what is left of the run budget). */
void kv_sandbox_arm(kv_sandbox *sb, int instructions, int64_t hook_ns);
/* Marks the end of an armed call: adds its time to the run, and flags a time
   limit the call passed without being caught inside (limit, where). */
void kv_sandbox_disarm(kv_sandbox *sb);
/* The sandbox a state belongs to (kept in the state's extra space). */
kv_sandbox *kv_sandbox_of(lua_State *L);
/* Charges `units` instructions of work done in C against the call's budget
   and reads the clock now and then; raises the limit's error when one is hit
   (deterministic: the same work is charged on every run). */
void kv_sandbox_charge(lua_State *L, int units);
/* Like charge, but only counts towards reading the clock (the budget is untouched). */
void kv_sandbox_tick(lua_State *L, int units);
/* Raises the error of a limit already hit (nothing when none is). */
void kv_sandbox_check(lua_State *L);
/* Writes what the hit limit is ("its time limit of 1000 ms per hook call
   (policy_limits.hook_ms)", ...) into buf. */
void kv_sandbox_describe_limit(const kv_sandbox *sb, char *buf, size_t size);
/* Message handler for lua_pcall: the error message followed by a traceback. */
int kv_sandbox_msgh(lua_State *L);
/* Writes a human size ("32 MiB", "512 KiB", "100 bytes") into buf. */
void kv_sandbox_format_bytes(size_t bytes, char *buf, size_t size);

#endif
