/* policy_sandbox.c — a capped, sandboxed Lua 5.4 state for one policy (see policy_sandbox.h).
 *
 * Why each piece is here:
 *  - The allocator counts bytes against a cap and returns NULL past it; Lua then
 *    runs an emergency collection, retries, and finally raises LUA_ERRMEM, which
 *    the host turns into "exceeded its memory cap". It uses plain realloc/free,
 *    not kv_realloc, because Lua must be able to see a failure instead of an abort.
 *  - A count hook enforces the instruction budget. Once the budget is spent the
 *    hook re-arms itself to fire on every instruction, so a policy that catches
 *    the error with pcall cannot keep running.
 *  - Library surface: base, table, string, math, utf8 only. From base we remove
 *    dofile and loadfile; `load` only accepts text ("t" mode is forced);
 *    collectgarbage answers "count" only; print writes to stderr. string.dump is
 *    removed (no binary chunks can be made or loaded). string.rep with an empty
 *    result is answered at once (the stock one loops `n` times on empty
 *    strings, which no instruction budget can interrupt). math.random and
 *    math.randomseed mark the call impure (so its answer is never cached), and
 *    the generator is seeded with 0 at open so runs are reproducible.
 *    setmetatable refuses a metatable with __gc: Lua runs finalizers with
 *    hooks off, so an endless finalizer could not be stopped.
 *  - The budget only counts VM instructions, so library functions that can
 *    loop long inside one C call without allocating are bounded up front:
 *    string.find/match/gmatch/gsub refuse work whose backtracking bound
 *    (length^(quantifiers+1)) passes 1e9 steps; table.move, table.insert and
 *    table.remove refuse to move or shift 2^20 elements or more (a __len
 *    metamethod can claim any length). Everything else in the five libraries
 *    is bounded by the memory cap or calls back into Lua.
 */
#include "core/policy_sandbox.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

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

/* Records "file:line" of the innermost Lua function that is running. Safe to
   call from the allocator: "Sl" reads debug info without allocating. */
static void note_where(kv_sandbox *sb, lua_State *L)
{
    lua_Debug ar;
    for (int level = 0; level < 32 && lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar))
            break;
        if (ar.currentline > 0) {
            snprintf(sb->where, sizeof sb->where, "%s:%d", ar.short_src, ar.currentline);
            return;
        }
    }
    snprintf(sb->where, sizeof sb->where, "?");
}

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    kv_sandbox *sb = ud;
    if (ptr == NULL)
        osize = 0; /* then osize encodes the object type, not a size */
    if (nsize == 0) {
        free(ptr);
        sb->mem_bytes -= osize;
        return NULL;
    }
    if (nsize > osize && nsize - osize > sb->mem_cap_bytes - sb->mem_bytes) {
        if (!sb->mem_refused && sb->in_call && sb->L)
            note_where(sb, sb->L);
        sb->mem_refused = 1;
        return NULL;
    }
    void *q = realloc(ptr, nsize);
    if (!q)
        return NULL; /* host out of memory: Lua raises LUA_ERRMEM */
    sb->mem_bytes = sb->mem_bytes - osize + nsize;
    if (sb->mem_bytes > sb->mem_peak_bytes)
        sb->mem_peak_bytes = sb->mem_bytes;
    return q;
}

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    kv_sandbox *sb = kv_sandbox_of(L);
    if (!sb->budget_exceeded) {
        sb->budget_exceeded = 1;
        note_where(sb, L);
    }
    /* Keep failing on every instruction from now on: pcall cannot swallow it. */
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    lua_pushfstring(L, "%s: instruction budget of %d exhausted", sb->where, sb->instructions_per_call);
    lua_error(L);
}

void kv_sandbox_arm(kv_sandbox *sb, int instructions)
{
    sb->in_call = 1;
    sb->mem_refused = 0;
    sb->budget_exceeded = 0;
    sb->impure = 0;
    sb->where[0] = '\0';
    lua_sethook(sb->L, count_hook, LUA_MASKCOUNT, instructions > 0 ? instructions : 1);
}

void kv_sandbox_disarm(kv_sandbox *sb)
{
    sb->in_call = 0;
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

static int sb_print(lua_State *L)
{
    kv_sandbox *sb = kv_sandbox_of(L);
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1)
            luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    fprintf(stderr, "policy %s: %s\n", sb->name ? sb->name : "?", lua_tostring(L, -1));
    return 0;
}

/* load(chunk [, chunkname [, mode [, env]]]) with mode forced to "t". */
static int sb_load(lua_State *L)
{
    int n = lua_gettop(L);
    if (n < 3)
        lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
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
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || (l == 0 && (lsep == 0 || n == 1))) {
        lua_pushliteral(L, "");
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

static int sb_impure_call(lua_State *L)
{
    kv_sandbox_of(L)->impure = 1;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

static int sb_randomseed(lua_State *L)
{
    if (lua_isnoneornil(L, 1))
        return luaL_error(L, "math.randomseed needs an explicit seed in kvsim policies (runs must be reproducible)");
    return sb_impure_call(L);
}

/* Pattern functions (find, match, gmatch, gsub) run inside one C call that
   no instruction budget can interrupt, and Lua's matcher backtracks: with q
   quantifiers a subject of n bytes can take about n^(q+1) steps. So they
   refuse work whose bound passes KV_SANDBOX_MATCH_STEPS; plain finds and
   everyday patterns on short strings are far below it. */
#define KV_SANDBOX_MATCH_STEPS 1e9

static int pattern_quantifiers(const char *p, size_t len)
{
    int q = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '%') {
            i++; /* escaped character or class */
        } else if (p[i] == '[') {
            i++;
            if (i < len && p[i] == '^')
                i++;
            if (i < len && p[i] == ']')
                i++; /* a leading ] is part of the set */
            while (i < len && p[i] != ']')
                i += p[i] == '%' ? 2 : 1;
        } else if (p[i] == '*' || p[i] == '+' || p[i] == '-' || p[i] == '?') {
            q++;
        }
    }
    return q;
}

static int sb_match_guard(lua_State *L)
{
    size_t n = 0, plen = 0;
    luaL_checklstring(L, 1, &n);
    const char *pat = luaL_checklstring(L, 2, &plen);
    bool plain = lua_gettop(L) >= 4 && lua_toboolean(L, 4) && lua_toboolean(L, lua_upvalueindex(2));
    if (!plain && n > 1) {
        int q = pattern_quantifiers(pat, plen);
        double steps = pow((double)n, (double)(q + 1));
        if (steps > KV_SANDBOX_MATCH_STEPS) {
            char msg[300]; /* lua_pushfstring knows no %e */
            snprintf(msg, sizeof msg, "pattern '%.40s' on a string of %zu bytes could take about %.0e steps, over "
                     "kvsim's limit of %.0e for policies (it could not be interrupted); shorten the string or the "
                     "pattern", pat, n, steps, KV_SANDBOX_MATCH_STEPS);
            return luaL_error(L, "%s", msg);
        }
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* string.find etc. wrapped by sb_match_guard; `plain_arg`: the 4th argument can ask for a plain find. */
static void guard_field(lua_State *L, const char *field, int plain_arg)
{
    lua_getfield(L, -1, field);
    lua_pushboolean(L, plain_arg);
    lua_pushcclosure(L, sb_match_guard, 2);
    lua_setfield(L, -2, field);
}

/* table.move of more than KV_SANDBOX_MOVE_ITEMS elements: one C loop the budget cannot stop. */
#define KV_SANDBOX_MOVE_ITEMS 1048576

static int sb_move(lua_State *L)
{
    lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
    if (e >= f && (e - f >= KV_SANDBOX_MOVE_ITEMS || e - f < 0))
        return luaL_error(L, "table.move of more than %d elements is not available in kvsim policies (it could not "
                             "be interrupted)", KV_SANDBOX_MOVE_ITEMS);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* table.insert / table.remove shift every element after `pos` in one C loop,
   and a __len metamethod can claim any length: bound the shift the same way. */
static int sb_shift_guard(lua_State *L)
{
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
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, nargs, LUA_MULTRET);
    return lua_gettop(L);
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
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
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

    lua_getfield(L, -1, LUA_STRLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    wrap_field(L, "rep", sb_rep);
    guard_field(L, "find", 1);
    guard_field(L, "match", 0);
    guard_field(L, "gmatch", 0);
    guard_field(L, "gsub", 0);
    lua_pop(L, 1);

    lua_getfield(L, -1, LUA_TABLIBNAME);
    wrap_field(L, "move", sb_move);
    shift_field(L, "insert", 1);
    shift_field(L, "remove", 0);
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

int kv_sandbox_open(kv_sandbox *sb, const char *name, size_t mem_cap_bytes, int instructions_per_call,
                    char *msg, size_t msg_size)
{
    memset(sb, 0, sizeof *sb);
    sb->name = name;
    sb->mem_cap_bytes = mem_cap_bytes;
    sb->instructions_per_call = instructions_per_call > 0 ? instructions_per_call : 1;
    lua_State *L = lua_newstate(sandbox_alloc, sb);
    if (!L) {
        char cap[32];
        kv_sandbox_format_bytes(mem_cap_bytes, cap, sizeof cap);
        snprintf(msg, msg_size, "cannot create a Lua state within the memory cap of %s", cap);
        return -1;
    }
    *(kv_sandbox **)lua_getextraspace(L) = sb;
    sb->L = L;
    lua_setwarnf(L, NULL, NULL); /* warnings (and errors in __gc) are dropped */
    lua_gc(L, LUA_GCGEN, 0, 0);  /* hooks make many short-lived tables */
    kv_sandbox_arm(sb, sb->instructions_per_call);
    lua_pushcfunction(L, sandbox_setup);
    int st = lua_pcall(L, 0, 0, 0);
    kv_sandbox_disarm(sb);
    if (st != LUA_OK) {
        char cap[32];
        kv_sandbox_format_bytes(mem_cap_bytes, cap, sizeof cap);
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
       still pending run under a fresh budget. */
    kv_sandbox_arm(sb, sb->instructions_per_call);
    sb->in_call = 0; /* the allocator must not walk a stack that is being torn down */
    lua_close(sb->L);
    sb->L = NULL;
    sb->in_call = 0;
}
