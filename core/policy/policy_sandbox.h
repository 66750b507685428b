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
    KV_SB_WORK,         /* C work bounded before it runs (pattern matching) would pass the instruction budget */
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
    uint64_t work_steps;       /* KV_SB_WORK: the bound of the refused work, steps (1 step = 1 instruction) */
    int64_t work_left;         /* KV_SB_WORK: instructions the call had left when it was refused */
    char work_what[200];       /* KV_SB_WORK: what was refused ("string.find('a*b') on a string of 9 bytes") */
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
/* Charges `steps` instructions, an upper bound of C work about to be done, before it is done.
   Returns 0 when charged; -1, charging nothing, when the call has fewer left (the caller then
   describes the work and calls kv_sandbox_refuse). Raises a limit already hit, or the time limit. */
int kv_sandbox_charge_ahead(lua_State *L, uint64_t steps);
/* Refuses work whose bound of `steps` the call cannot afford: hits KV_SB_WORK (the budget is then
   spent, sticky like a used-up budget), `what` naming the work, and raises its error. Never returns. */
int kv_sandbox_refuse(lua_State *L, uint64_t steps, const char *what);
/* Raises the error of a limit already hit (nothing when none is). */
void kv_sandbox_check(lua_State *L);
/* Writes what the hit limit is ("its time limit of 1000 ms per hook call
   (policy_limits.hook_ms)", ...) into buf. */
void kv_sandbox_describe_limit(const kv_sandbox *sb, char *buf, size_t size);
/* Message handler for lua_pcall: the error message followed by a traceback. */
int kv_sandbox_msgh(lua_State *L);
/* Writes a human size ("32 MiB", "512 KiB", "100 bytes") into buf. */
void kv_sandbox_format_bytes(size_t bytes, char *buf, size_t size);

/* policy_order.c: pairs and next that visit a table's keys in a fixed order (the sequence 1..n, other
   numbers ascending, strings bytewise, false then true; other key types are an error), replacing those in
   the table on top of the stack (the globals). */
void kv_sandbox_open_order(lua_State *L);
/* Pushes pairs' three results (iterator, the table, nil) for an ordered raw traversal of the table at idx. */
void kv_sandbox_push_pairs(lua_State *L, int idx);
/* next(t [, k]) in the fixed order, as a lua_CFunction (raw, like Lua's). */
int kv_sandbox_next(lua_State *L);

/* policy_pattern.c: string.find, match, gmatch and gsub, the stock ones behind an up-front bound of
   their work (kv_sandbox_charge_ahead), replacing those in the table on top of the stack. */
void kv_sandbox_open_patterns(lua_State *L);

/* What kv_pattern_bound finds out about a pattern. */
typedef struct kv_pattern_cost {
    uint64_t per_start; /* bound of the matcher's work from one start position, steps (saturating) */
    int always;         /* 1: the pattern matches wherever it is tried, so the first start succeeds */
    size_t captures;    /* value captures '(' in the pattern (what a match may copy out) */
    int linear;         /* 1: no item backtracks (every quantifier's rest always matches, no %b %f %1) */
    uint64_t fixed;     /* linear: bound of one try, steps, besides... */
    uint64_t per_byte;  /* ...this many steps per byte of the match it returns (0 unless linear) */
} kv_pattern_cost;

/* Bounds the work of Lua's matcher for pattern p (lp bytes, no leading '^' anchor) on a subject of
   n bytes, from one start position; see the design notes in policy_pattern.c. */
kv_pattern_cost kv_pattern_bound(const char *p, size_t lp, size_t n);

#endif
