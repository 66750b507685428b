/* policy_sandbox_internal.h — shared by policy_sandbox.c (the environment, the allocator, arming) and
 * policy_sandbox_meter.c (the meters) only. */
#ifndef KV_POLICY_SANDBOX_INTERNAL_H
#define KV_POLICY_SANDBOX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "core/policy/policy_sandbox.h"

/* Ticks (kv_sandbox_tick/charge units) between two readings of the clock. */
#define KV_SB_CLOCK_EVERY 256

/* Monotonic time in ns (coarse where available). */
int64_t kv_sandbox_now_ns(void);
/* "file:line" of the innermost running Lua function into buf; safe from the allocator. */
void kv_sandbox_find_where(lua_State *L, char *buf, size_t size);
/* Records where the running call is (sb->where). */
void kv_sandbox_note_where(kv_sandbox *sb, lua_State *L);
/* Records that `what` stopped the call (the first limit wins); every further instruction fails. */
void kv_sandbox_hit(kv_sandbox *sb, lua_State *L, kv_sandbox_limit what);
/* Raises the error of the limit hit (sb->limit != KV_SB_OK). */
int kv_sandbox_raise_limit(lua_State *L);
/* Reads the clock; past the deadline, the call's time limit is hit. */
void kv_sandbox_check_clock(kv_sandbox *sb, lua_State *L);
/* Arms the count hook for the next stretch of instructions (`force`: set it again). */
void kv_sandbox_rearm(kv_sandbox *sb, lua_State *L, bool force);

#endif
