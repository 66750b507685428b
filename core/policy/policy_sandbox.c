/* policy_sandbox.c — a capped, sandboxed Lua 5.4 state for one policy (see policy_sandbox.h).
 *
 * Design notes: what stops a policy, and why each piece is here.
 *
 *  Invariant 1: between two readings of the clock the state can do only a
 *  bounded amount of work, so a policy cannot run past its time budgets by
 *  more than a fraction of a second, whatever it does.
 *  Invariant 2: a limit, once hit, is sticky until the next call: every
 *  further VM instruction and every wrapped C function raises it again, so
 *  pcall, xpcall or a load() that swallows the error cannot keep running.
 *  Invariant 3: the clock is only read, never used to decide anything but
 *  "stop": a run that hits no time limit computes exactly what it would with
 *  no clock at all (determinism).
 *
 *  - The allocator counts bytes against a cap and returns NULL past it; Lua then
 *    runs an emergency collection, retries, and finally raises LUA_ERRMEM, which
 *    the host turns into "exceeded its memory cap". It also refuses any one
 *    string longer than the string cap (default 1 MiB): VM operations on
 *    strings (comparison, equality, concatenation, string-to-number
 *    coercion) cost time proportional to the length inside one instruction,
 *    and the string cap is what bounds them. It uses plain realloc/free, not
 *    kv_realloc, because Lua must be able to see a failure instead of an abort.
 *    Refusals and allocations of 64 KiB or more also read the clock.
 *  - A count hook fires every KV_SB_HOOK_EVERY instructions (at most):
 *    it counts the instruction budget down and reads the clock. Once a limit
 *    is hit it re-arms itself to fire on every instruction (invariant 2).
 *    The clock is CLOCK_MONOTONIC_COARSE (a few ns to read, ~4 ms steps).
 *  - The time budgets: a call may run hook_ns (loading the file: 10x), and all
 *    calls together run_ns. kv_sandbox_disarm also compares the call's time
 *    with both, so a call that passed a budget between two readings fails too.
 *  - C functions that can do much work per call are wrapped: the wrapper
 *    counts "ticks" and reads the clock every KV_SB_CLOCK_EVERY of them
 *    (string.format/rep/pack, table.*, utf8.*, next, pairs, print, load).
 *  - pairs and next visit keys in a fixed order (policy_order.c): Lua's
 *    string hash is seeded per state, so the stock order changes from run
 *    to run. A traversal's snapshot and sort are charged to the budget.
 *    Work that is superlinear in its input is charged against the instruction
 *    budget, so it fails the same way on every run: string.find/match/gmatch/
 *    gsub are the stock functions behind policy_pattern.c, which charges an
 *    upper bound of their work (from the lengths and the pattern's items)
 *    before they run and refuses the call when the budget cannot pay it;
 *    table.sort is charged as it runs (1 instruction per comparison; the
 *    comparison goes through a C function that charges it). load() with a
 *    reader function stops once the pieces add up to more than a string may
 *    hold. print() writes to stderr, at most print_cap_bytes per sandbox,
 *    then one "further print() output suppressed" line.
 *  - xpcall is replaced: Lua runs a message handler with hooks off when the
 *    error comes from a hook (the instruction budget's own error), so a
 *    handler could loop forever unseen. The replacement runs the function
 *    under pcall and then the handler as an ordinary, hooked call with the
 *    error object (after the stack has unwound; a handler that fails gives
 *    "error in error handling"); limits are re-raised, never handled.
 *  - Library surface: base, table, string, math, utf8 only. From base we remove
 *    dofile and loadfile; `load` only accepts text ("t" mode is forced);
 *    collectgarbage answers "count" only. string.dump is removed (no binary
 *    chunks can be made or loaded). string.rep with an empty result is
 *    answered at once (the stock one loops `n` times on empty strings).
 *    math.random and math.randomseed mark the call impure (so its answer is
 *    never cached), and the generator is seeded with 0 at open so runs are
 *    reproducible. setmetatable refuses a metatable with __gc: Lua runs
 *    finalizers with hooks off, so an endless finalizer could not be stopped.
 *  - table.move, table.insert and table.remove refuse to move or shift 2^20
 *    elements or more (a __len metamethod can claim any length).
 *  - What remains unwrapped (math, string.byte/sub/lower/..., tostring,
 *    tonumber, rawequal) costs at most O(string cap) per call, which the count
 *    hook's period bounds.
 */
#include "core/policy/policy_sandbox.h"
#include "core/policy/policy_sandbox_internal.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

/* Allocations this large read the clock. */
#define KV_SB_BIG_ALLOC ((size_t)64 << 10)
/* A string's header and terminating NUL in the allocator's size (Lua 5.4, 64-bit):
   the cap is on the contents. */
#define KV_SB_STRING_HEADER 25

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    kv_sandbox *sb = ud;
    int string_tag = ptr == NULL && osize == LUA_TSTRING;
    if (ptr == NULL)
        osize = 0; /* then osize encodes the object type, not a size */
    if (nsize == 0) {
        free(ptr);
        sb->mem_bytes -= osize;
        return NULL;
    }
    bool live = sb->in_call && sb->L; /* a call is running: where and the clock can be read */
    if (string_tag && nsize > sb->lim.string_cap_bytes + KV_SB_STRING_HEADER) {
        if (live && sb->limit == KV_SB_OK)
            kv_sandbox_note_where(sb, sb->L);
        sb->str_refused = 1;
        sb->str_refused_bytes = nsize - KV_SB_STRING_HEADER;
        sb->last_refusal = 2;
        if (live)
            kv_sandbox_check_clock(sb, sb->L);
        return NULL;
    }
    if (nsize > osize && nsize - osize > sb->lim.mem_cap_bytes - sb->mem_bytes) {
        if (!sb->mem_refused && live && sb->limit == KV_SB_OK)
            kv_sandbox_note_where(sb, sb->L);
        sb->mem_refused = 1;
        sb->last_refusal = 1;
        if (live)
            kv_sandbox_check_clock(sb, sb->L); /* a loop of refused allocations runs a full GC each time */
        return NULL;
    }
    if (live && nsize >= KV_SB_BIG_ALLOC)
        kv_sandbox_check_clock(sb, sb->L);
    void *q = realloc(ptr, nsize);
    if (!q)
        return NULL; /* host out of memory: Lua raises LUA_ERRMEM */
    sb->mem_bytes = sb->mem_bytes - osize + nsize;
    if (sb->mem_bytes > sb->mem_peak_bytes)
        sb->mem_peak_bytes = sb->mem_bytes;
    return q;
}

void kv_sandbox_arm(kv_sandbox *sb, int instructions, int64_t hook_ns)
{
    sb->in_call = 1;
    sb->mem_refused = 0;
    sb->str_refused = 0;
    sb->str_refused_bytes = 0;
    sb->last_refusal = 0;
    sb->limit = KV_SB_OK;
    sb->budget_exceeded = 0;
    sb->impure = 0;
    sb->where[0] = '\0';
    sb->work_steps = 0;
    sb->work_left = 0;
    sb->work_what[0] = '\0';
    sb->call_instructions = instructions > 0 ? instructions : 1;
    sb->instr_left = sb->call_instructions;
    sb->clock_tick = KV_SB_CLOCK_EVERY;
    sb->call_hook_ns = hook_ns > 0 ? hook_ns : 1;
    sb->call_start_ns = kv_sandbox_now_ns();
    int64_t run_left = sb->lim.run_ns - sb->run_used_ns;
    sb->deadline_is_run = run_left < sb->call_hook_ns;
    sb->deadline_ns = sb->call_start_ns + (sb->deadline_is_run ? run_left : sb->call_hook_ns);
    if (run_left <= 0)
        sb->deadline_ns = sb->call_start_ns - 1; /* the run's time is used up: the call fails at once */
    kv_sandbox_rearm(sb, sb->L, true);
}

void kv_sandbox_disarm(kv_sandbox *sb)
{
    if (!sb->in_call)
        return;
    int64_t spent = kv_sandbox_now_ns() - sb->call_start_ns;
    sb->run_used_ns += spent;
    sb->in_call = 0;
    if (sb->limit == KV_SB_OK && sb->call_start_ns + spent > sb->deadline_ns) {
        /* Passed between two readings of the clock: the call fails all the same. */
        sb->limit = sb->deadline_is_run ? KV_SB_RUN_TIME : KV_SB_HOOK_TIME;
        snprintf(sb->where, sizeof sb->where, "?");
    }
}

int kv_sandbox_msgh(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* --- the replaced library functions --------------------------------------- */

/* Calls the function in upvalue 1 with this call's arguments; returns all results. */
static int call_upvalue(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Runs the stock C function in upvalue 1 in this very frame (it must use no
   upvalues of its own): its argument errors then name the function as the
   policy called it ("bad argument #1 to 'format'"), and no extra call is made. */
static int call_stock(lua_State *L)
{
    lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(1));
    return f(L);
}

/* A library function that can do much work per call: counts ticks first. */
static int sb_timed(lua_State *L)
{
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    return call_stock(L);
}

/* print: to stderr as "policy <name>: ...", at most print_cap_bytes in all. */
static int sb_print(lua_State *L)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    if (sb->print_suppressed)
        return 0;
    int n = lua_gettop(L);
    luaL_checkstack(L, n, "too many arguments to print");
    const char *name = sb->name ? sb->name : "?";
    size_t line = strlen("policy : \n") + strlen(name);
    for (int i = 1; i <= n; i++) {
        size_t len;
        luaL_tolstring(L, i, &len); /* stays on the stack, at n + i */
        line += len + (i > 1);
    }
    if (line > sb->lim.print_cap_bytes - sb->print_bytes) {
        char where[256], cap[32];
        kv_sandbox_find_where(L, where, sizeof where);
        kv_sandbox_format_bytes(sb->lim.print_cap_bytes, cap, sizeof cap);
        fprintf(stderr, "policy %s: further print() output suppressed (the print at %s would pass the %s of "
                "output a policy may print in a run, policy_limits.print_kib)\n", name, where, cap);
        sb->print_suppressed = 1;
        return 0;
    }
    sb->print_bytes += line;
    fprintf(stderr, "policy %s: ", name);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = lua_tolstring(L, n + i, &len);
        if (i > 1)
            fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
    }
    fputc('\n', stderr);
    return 0;
}

/* A reader function given to load(), wrapped: upvalue 1 is the policy's
   reader, upvalue 2 the bytes it has given so far. */
static int sb_load_reader(lua_State *L)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    lua_settop(L, 0);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_call(L, 0, 1);
    if (lua_type(L, 1) == LUA_TSTRING || lua_type(L, 1) == LUA_TNUMBER) {
        size_t len;
        lua_tolstring(L, 1, &len);
        lua_Integer total = lua_tointeger(L, lua_upvalueindex(2));
        total = (size_t)total + len > sb->lim.string_cap_bytes ? (lua_Integer)sb->lim.string_cap_bytes + 1
                                                                  : total + (lua_Integer)len;
        lua_pushinteger(L, total);
        lua_replace(L, lua_upvalueindex(2));
        if ((size_t)total > sb->lim.string_cap_bytes) {
            kv_sandbox_hit(sb, L, KV_SB_LOAD_SOURCE);
            return kv_sandbox_raise_limit(L);
        }
        kv_sandbox_tick(L, (int)(len >> 12));
    }
    return 1;
}

/* load(chunk [, chunkname [, mode [, env]]]) with mode forced to "t" and a
   reader function wrapped by sb_load_reader. */
static int sb_load(lua_State *L)
{
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    int n = lua_gettop(L);
    if (n < 3)
        lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    if (lua_type(L, 1) == LUA_TFUNCTION) {
        lua_pushvalue(L, 1);
        lua_pushinteger(L, 0);
        lua_pushcclosure(L, sb_load_reader, 2);
        lua_replace(L, 1);
    }
    return call_stock(L);
}

/* xpcall(f, msgh, ...): f under pcall, then msgh as an ordinary (hooked)
   call; limits are re-raised, never handled (see the file comment). */
static int sb_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    kv_sandbox_tick(L, 1);
    lua_pushboolean(L, 1);
    lua_pushvalue(L, 1);
    for (int i = 3; i <= n; i++)
        lua_pushvalue(L, i);
    int st = lua_pcall(L, n - 2, LUA_MULTRET, 0);
    if (st == LUA_OK)
        return lua_gettop(L) - n;
    kv_sandbox_check(L);
    if (st != LUA_ERRMEM) { /* Lua calls no handler for memory errors */
        lua_pushvalue(L, 2);
        lua_insert(L, -2);
        st = lua_pcall(L, 1, 1, 0);
        kv_sandbox_check(L);
        if (st != LUA_OK) {
            lua_pop(L, 1);
            lua_pushliteral(L, "error in error handling");
        }
    }
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
}

/* The comparison table.sort uses: charges one instruction, then compares
   with `<` or calls the policy's function (upvalue 1, nil for none). */
static int sb_sort_less(lua_State *L)
{
    kv_sandbox_charge(L, 1);
    if (lua_isnil(L, lua_upvalueindex(1))) {
        lua_pushboolean(L, lua_compare(L, 1, 2, LUA_OPLT));
        return 1;
    }
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

/* table.sort(t [, comp]): the stock sort, comparing through sb_sort_less. */
static int sb_sort(lua_State *L)
{
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    if (!lua_isnoneornil(L, 2))
        luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    lua_pushcclosure(L, sb_sort_less, 1); /* takes the comparison (or nil) as its upvalue */
    return call_stock(L);
}

static int sb_collectgarbage(lua_State *L)
{
    const char *opt = luaL_optstring(L, 1, "collect");
    if (strcmp(opt, "count") != 0)
        return luaL_error(L, "collectgarbage('%s') is not available in kvsim policies (only 'count')", opt);
    int kb = lua_gc(L, LUA_GCCOUNT);
    int rest = lua_gc(L, LUA_GCCOUNTB);
    lua_pushnumber(L, (lua_Number)kb + (lua_Number)rest / 1024.0);
    return 1;
}

/* string.rep whose result is empty returns at once (see the file comment). */
static int sb_rep(lua_State *L)
{
    size_t l, lsep = 0;
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || (l == 0 && (lsep == 0 || n == 1))) {
        lua_pushliteral(L, "");
        return 1;
    }
    return call_stock(L);
}

static int sb_impure_call(lua_State *L)
{
    kv_sandbox_of(L)->impure = 1;
    return call_upvalue(L);
}

static int sb_randomseed(lua_State *L)
{
    if (lua_isnoneornil(L, 1))
        return luaL_error(L, "math.randomseed needs an explicit seed in kvsim policies (runs must be reproducible)");
    return sb_impure_call(L);
}

/* table.move of more than KV_SANDBOX_MOVE_ITEMS elements: one C loop the budget cannot stop. */
#define KV_SANDBOX_MOVE_ITEMS 1048576

static int sb_move(lua_State *L)
{
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
    if (e >= f && (e - f >= KV_SANDBOX_MOVE_ITEMS || e - f < 0))
        return luaL_error(L, "table.move of more than %d elements is not available in kvsim policies (it could not "
                             "be interrupted)", KV_SANDBOX_MOVE_ITEMS);
    return call_stock(L);
}

/* table.insert / table.remove shift every element after `pos` in one C loop,
   and a __len metamethod can claim any length: bound the shift the same way. */
static int sb_shift_guard(lua_State *L)
{
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 1);
    int nargs = lua_gettop(L);
    bool is_insert = lua_toboolean(L, lua_upvalueindex(2));
    lua_Integer pos = n; /* append / remove the last: no shift */
    if ((is_insert && nargs >= 3) || (!is_insert && nargs >= 2))
        pos = luaL_checkinteger(L, 2);
    if (n - pos >= KV_SANDBOX_MOVE_ITEMS || n < 0)
        return luaL_error(L, "table.%s shifting %I elements is not available in kvsim policies (it could not be "
                             "interrupted)", is_insert ? "insert" : "remove", (LUAI_UACINT)(n - pos));
    return call_stock(L);
}

static void shift_field(lua_State *L, const char *field, int is_insert)
{
    lua_getfield(L, -1, field);
    lua_pushboolean(L, is_insert);
    lua_pushcclosure(L, sb_shift_guard, 2);
    lua_setfield(L, -2, field);
}

/* setmetatable refusing metatables with __gc: Lua runs finalizers with debug
   hooks switched off, so an endless __gc could never be stopped. (Adding __gc
   after setmetatable does not make a finalizer, so checking here suffices.) */
static int sb_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        int has_gc = lua_rawget(L, 2) != LUA_TNIL;
        lua_pop(L, 1);
        if (has_gc)
            return luaL_error(L, "__gc metamethods are not allowed in kvsim policies (finalizers cannot be "
                                 "stopped by the instruction budget)");
    }
    return call_stock(L);
}

/* Replaces table[field] (table on top of the stack) by f with the old value as upvalue. */
static void wrap_field(lua_State *L, const char *field, lua_CFunction f)
{
    lua_getfield(L, -1, field);
    lua_pushcclosure(L, f, 1);
    lua_setfield(L, -2, field);
}

static int sandbox_setup(lua_State *L)
{
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},         {LUA_TABLIBNAME, luaopen_table}, {LUA_STRLIBNAME, luaopen_string},
        {LUA_MATHLIBNAME, luaopen_math},   {LUA_UTF8LIBNAME, luaopen_utf8}, {NULL, NULL},
    };
    for (const luaL_Reg *lib = libs; lib->func; lib++) {
        luaL_requiref(L, lib->name, lib->func, 1);
        lua_pop(L, 1);
    }
    /* Nothing can be required: the package library is not opened, and the
       loaded-modules table is emptied of everything but the opened libraries. */
    lua_pushglobaltable(L);
    lua_pushnil(L);
    lua_setfield(L, -2, "dofile");
    lua_pushnil(L);
    lua_setfield(L, -2, "loadfile");
    lua_pushnil(L);
    lua_setfield(L, -2, "require");
    wrap_field(L, "load", sb_load);
    wrap_field(L, "setmetatable", sb_setmetatable);
    lua_pushcfunction(L, sb_collectgarbage);
    lua_setfield(L, -2, "collectgarbage");
    lua_pushcfunction(L, sb_print);
    lua_setfield(L, -2, "print");
    lua_pushcfunction(L, sb_xpcall);
    lua_setfield(L, -2, "xpcall");
    kv_sandbox_open_order(L); /* pairs and next in a fixed key order (policy_order.c) */

    lua_getfield(L, -1, LUA_STRLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    wrap_field(L, "rep", sb_rep);
    wrap_field(L, "format", sb_timed);
    wrap_field(L, "pack", sb_timed);
    kv_sandbox_open_patterns(L);
    lua_pop(L, 1);

    lua_getfield(L, -1, LUA_TABLIBNAME);
    wrap_field(L, "move", sb_move);
    shift_field(L, "insert", 1);
    shift_field(L, "remove", 0);
    wrap_field(L, "sort", sb_sort);
    wrap_field(L, "concat", sb_timed);
    wrap_field(L, "unpack", sb_timed);
    lua_pop(L, 1);

    lua_getfield(L, -1, LUA_UTF8LIBNAME);
    wrap_field(L, "len", sb_timed);
    wrap_field(L, "codepoint", sb_timed);
    wrap_field(L, "offset", sb_timed);
    wrap_field(L, "char", sb_timed);
    lua_pop(L, 1);

    lua_getfield(L, -1, LUA_MATHLIBNAME);
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 0);
    lua_call(L, 1, 0); /* the stock generator starts from a time-based seed */
    wrap_field(L, "random", sb_impure_call);
    wrap_field(L, "randomseed", sb_randomseed);
    lua_pop(L, 2);
    return 0;
}

int kv_sandbox_open(kv_sandbox *sb, const char *name, const kv_sandbox_limits *lim, char *msg, size_t msg_size)
{
    memset(sb, 0, sizeof *sb);
    sb->name = name;
    sb->lim = *lim;
    if (sb->lim.instructions_per_call < 1)
        sb->lim.instructions_per_call = 1;
    if (sb->lim.hook_ns < 1)
        sb->lim.hook_ns = 1;
    if (sb->lim.run_ns < 1)
        sb->lim.run_ns = 1;
    lua_State *L = lua_newstate(sandbox_alloc, sb);
    if (!L) {
        char cap[32];
        kv_sandbox_format_bytes(sb->lim.mem_cap_bytes, cap, sizeof cap);
        snprintf(msg, msg_size, "cannot create a Lua state within the memory cap of %s", cap);
        return -1;
    }
    *(kv_sandbox **)lua_getextraspace(L) = sb;
    sb->L = L;
    lua_setwarnf(L, NULL, NULL); /* warnings (and errors in __gc) are dropped */
    lua_gc(L, LUA_GCGEN, 0, 0);  /* hooks make many short-lived tables */
    kv_sandbox_arm(sb, sb->lim.instructions_per_call, sb->lim.hook_ns);
    lua_pushcfunction(L, sandbox_setup);
    int st = lua_pcall(L, 0, 0, 0);
    kv_sandbox_disarm(sb);
    sb->run_used_ns = 0; /* opening is kvsim's time, not the policy's */
    if (st != LUA_OK) {
        char cap[32];
        kv_sandbox_format_bytes(sb->lim.mem_cap_bytes, cap, sizeof cap);
        if (st == LUA_ERRMEM)
            snprintf(msg, msg_size, "cannot open the Lua libraries within the memory cap of %s", cap);
        else
            snprintf(msg, msg_size, "cannot open the Lua libraries: %s", lua_tostring(L, -1));
        kv_sandbox_close(sb);
        return -1;
    }
    return 0;
}

void kv_sandbox_close(kv_sandbox *sb)
{
    if (!sb || !sb->L)
        return;
    /* No policy can own a finalizer (see sb_setmetatable); __close handlers
       still pending run under a fresh instruction budget. */
    kv_sandbox_arm(sb, sb->lim.instructions_per_call, sb->lim.hook_ns);
    sb->in_call = 0; /* the allocator must not walk a stack that is being torn down */
    lua_close(sb->L);
    sb->L = NULL;
    sb->in_call = 0;
}
