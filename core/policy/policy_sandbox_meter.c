/* policy_sandbox_meter.c — the sandbox's meters: the instruction count hook, ticks and charges of
 * wrapped library calls, the clock, and raising the limit that was hit (policy_sandbox.c's invariants). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <lauxlib.h>

#include "core/policy/policy_sandbox.h"
#include "core/policy/policy_sandbox_internal.h"

/* The count hook fires at least this often (VM instructions). */
#define KV_SB_HOOK_EVERY 256

kv_sandbox *kv_sandbox_of(lua_State *L)
{
    return *(kv_sandbox **)lua_getextraspace(L);
}

void kv_sandbox_format_bytes(size_t bytes, char *buf, size_t size)
{
    if (bytes >= ((size_t)1 << 20) && bytes % ((size_t)1 << 20) == 0)
        snprintf(buf, size, "%zu MiB", bytes >> 20);
    else if (bytes >= ((size_t)1 << 20))
        snprintf(buf, size, "%.1f MiB", (double)bytes / (double)(1u << 20));
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, size, "%zu KiB", bytes >> 10);
    else
        snprintf(buf, size, "%zu bytes", bytes);
}

int64_t kv_sandbox_now_ns(void)
{
    struct timespec t;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
#else
    clock_gettime(CLOCK_MONOTONIC, &t);
#endif
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Writes "file:line" of the innermost Lua function that is running into buf.
   Safe to call from the allocator: "Sl" reads debug info without allocating. */
void kv_sandbox_find_where(lua_State *L, char *buf, size_t size)
{
    lua_Debug ar;
    for (int level = 0; level < 32 && lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar))
            break;
        if (ar.currentline > 0) {
            snprintf(buf, size, "%s:%d", ar.short_src, ar.currentline);
            return;
        }
    }
    snprintf(buf, size, "?");
}

void kv_sandbox_note_where(kv_sandbox *sb, lua_State *L)
{
    kv_sandbox_find_where(L, sb->where, sizeof sb->where);
}

static void count_hook(lua_State *L, lua_Debug *ar);

/* Records that `what` stopped the call (the first limit wins) and makes every
   further instruction fail (invariant 2). Safe from the allocator. */
void kv_sandbox_hit(kv_sandbox *sb, lua_State *L, kv_sandbox_limit what)
{
    if (sb->limit == KV_SB_OK) {
        sb->limit = what;
        sb->budget_exceeded = what == KV_SB_INSTRUCTIONS;
        kv_sandbox_note_where(sb, L);
    }
    sb->hook_count = 1;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
}

void kv_sandbox_describe_limit(const kv_sandbox *sb, char *buf, size_t size)
{
    char b[32];
    switch (sb->limit) {
    case KV_SB_OK:
        snprintf(buf, size, "no limit");
        break;
    case KV_SB_INSTRUCTIONS:
        snprintf(buf, size, "its instruction budget (%d per call, policy_limits.instructions)",
                 sb->call_instructions);
        break;
    case KV_SB_HOOK_TIME:
        snprintf(buf, size, "its time limit of %.0f ms per call (policy_limits.hook_ms%s)",
                 (double)sb->call_hook_ns / 1e6, sb->call_hook_ns != sb->lim.hook_ns ? "; loading gets 10x" : "");
        break;
    case KV_SB_RUN_TIME:
        snprintf(buf, size, "its time limit of %g s for the whole run (policy_limits.run_s)",
                 (double)sb->lim.run_ns / 1e9);
        break;
    case KV_SB_LOAD_SOURCE:
        kv_sandbox_format_bytes(sb->lim.string_cap_bytes, b, sizeof b);
        snprintf(buf, size, "the limit of %s of source for load() (policy_limits.string_kib)", b);
        break;
    case KV_SB_WORK:
        if (sb->work_steps == UINT64_MAX)
            snprintf(b, sizeof b, "more than 1.8e+19");
        else if (sb->work_steps >= 10000000)
            snprintf(b, sizeof b, "%.1e", (double)sb->work_steps);
        else
            snprintf(b, sizeof b, "%llu", (unsigned long long)sb->work_steps);
        snprintf(buf, size, "its instruction budget (%d per call, policy_limits.instructions%s): %s could take up "
                 "to %s steps, more than the %lld left (refused before running)", sb->call_instructions,
                 sb->call_instructions != sb->lim.instructions_per_call ? "; loading gets 10x" : "", sb->work_what,
                 b, (long long)(sb->work_left > 0 ? sb->work_left : 0));
        break;
    }
}

/* Raises the error of the limit hit (sb->limit != KV_SB_OK). */
int kv_sandbox_raise_limit(lua_State *L)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    char d[300];
    kv_sandbox_describe_limit(sb, d, sizeof d);
    lua_pushfstring(L, "%s: policy '%s' was stopped: it used up %s", sb->where, sb->name ? sb->name : "?", d);
    return lua_error(L);
}

/* Reads the clock; past the deadline, the call's time limit is hit. */
void kv_sandbox_check_clock(kv_sandbox *sb, lua_State *L)
{
    sb->clock_tick = KV_SB_CLOCK_EVERY;
    if (sb->limit == KV_SB_OK && sb->in_call && kv_sandbox_now_ns() > sb->deadline_ns)
        kv_sandbox_hit(sb, L, sb->deadline_is_run ? KV_SB_RUN_TIME : KV_SB_HOOK_TIME);
}

/* Arms the count hook for the next stretch of instructions. Lua restarts the
   count by itself after each firing, so the hook is only set again when the
   count changes (lua_sethook walks the whole call stack), or when `force`. */
void kv_sandbox_rearm(kv_sandbox *sb, lua_State *L, bool force)
{
    int64_t n = sb->instr_left < KV_SB_HOOK_EVERY ? sb->instr_left : KV_SB_HOOK_EVERY;
    int count = n > 0 ? (int)n : 1;
    if (force || count != sb->hook_count) {
        sb->hook_count = count;
        lua_sethook(L, count_hook, LUA_MASKCOUNT, count);
    }
}

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    kv_sandbox *sb = kv_sandbox_of(L);
    if (sb->limit == KV_SB_OK) {
        sb->instr_left -= sb->hook_count;
        if (sb->instr_left <= 0)
            kv_sandbox_hit(sb, L, KV_SB_INSTRUCTIONS);
        else
            kv_sandbox_check_clock(sb, L);
        if (sb->limit == KV_SB_OK) {
            kv_sandbox_rearm(sb, L, false);
            return;
        }
    }
    kv_sandbox_raise_limit(L);
}

void kv_sandbox_charge(lua_State *L, int units)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    sb->instr_left -= units;
    if (sb->limit == KV_SB_OK && sb->instr_left <= 0)
        kv_sandbox_hit(sb, L, KV_SB_INSTRUCTIONS);
    else if ((sb->clock_tick -= units) <= 0)
        kv_sandbox_check_clock(sb, L);
    if (sb->limit != KV_SB_OK)
        kv_sandbox_raise_limit(L);
}

void kv_sandbox_tick(lua_State *L, int units)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    if ((sb->clock_tick -= units) <= 0)
        kv_sandbox_check_clock(sb, L);
    if (sb->limit != KV_SB_OK)
        kv_sandbox_raise_limit(L);
}

int kv_sandbox_charge_ahead(lua_State *L, uint64_t steps)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    if (sb->limit != KV_SB_OK)
        kv_sandbox_raise_limit(L);
    if (sb->instr_left <= 0 || steps > (uint64_t)sb->instr_left)
        return -1;
    sb->instr_left -= (int64_t)steps;
    /* Work of about `steps` instructions is about to run: read the clock as often as that many would. */
    if (sb->clock_tick <= 0 || steps >= (uint64_t)sb->clock_tick)
        kv_sandbox_check_clock(sb, L);
    else
        sb->clock_tick -= (int)steps;
    if (sb->limit != KV_SB_OK)
        kv_sandbox_raise_limit(L);
    return 0;
}

int kv_sandbox_refuse(lua_State *L, uint64_t steps, const char *what)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    if (sb->limit == KV_SB_OK) {
        sb->work_steps = steps;
        sb->work_left = sb->instr_left;
        snprintf(sb->work_what, sizeof sb->work_what, "%s", what);
        sb->instr_left = 0; /* the budget is spent: nothing more runs in this call (invariant 2) */
    }
    kv_sandbox_hit(sb, L, KV_SB_WORK);
    return kv_sandbox_raise_limit(L);
}

void kv_sandbox_check(lua_State *L)
{
    if (kv_sandbox_of(L)->limit != KV_SB_OK)
        kv_sandbox_raise_limit(L);
}
