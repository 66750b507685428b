/* policy_order.c — pairs() and next() for policies: the same key order on every run.
 *
 * Design notes.
 *
 * Lua 5.4 seeds its string hash per state (luai_makeseed: addresses and the
 * time), and lua_next walks a table in hash-slot order, so the stock pairs and
 * next visit string keys in a different order from run to run; a policy whose
 * answer depends on that order makes a different results.json each time.
 * Here both visit a table's keys in one fixed order:
 *
 *   1. the sequence 1, 2, ..., n (n: the last of the integer keys 1..n that
 *      are all present, as ipairs would stop),
 *   2. the other numbers, ascending (integers and floats compared exactly),
 *   3. strings, bytewise (memcmp; a prefix comes first),
 *   4. false, then true.
 *
 * Keys whose order could only come from addresses (tables, functions,
 * userdata, threads) are refused with an error at the policy's file:line.
 *
 *  Invariant 1: the order depends only on the set of keys, never on the hash
 *  seed, the insertion history or the clock.
 *  Invariant 2: the work charged to the instruction budget depends only on
 *  the number of keys, so a traversal fails the same way on every run.
 *
 * pairs(t) takes a snapshot of the keys once (one sort, n log n), keeps it
 * in its iterator's upvalues and walks it; each step reads the current value
 * with a raw get and skips keys whose value has become nil, so assigning to
 * existing fields (nil included) during the traversal works as in Lua; keys
 * added during it are not visited (Lua leaves that undefined). __pairs is
 * honoured as in Lua.
 *
 * next(t, k) has no iterator to keep state in: the snapshot of t lives in a
 * weak-keyed table in the registry, with the position of the key it returned
 * last. next(t, nil) takes a fresh snapshot; next(t, k) continues from the
 * remembered position when k is the key returned there (a plain traversal:
 * O(1) a step), and otherwise finds k through a key -> position map made
 * once for the snapshot. A k that is not in t is "invalid key to 'next'", as
 * in Lua. The snapshot is dropped when a traversal reaches the end.
 *
 * Every scratch buffer is Lua memory (userdata, tables), so the policy's
 * memory cap counts it and a refusal is the usual memory error.
 */
#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "core/policy/policy_sandbox.h"

/* Registry field: weak-keyed table t -> {snapshot, position, key -> position map}. */
#define ORDER_CACHE "kvsim.next_order"

/* One key to sort. */
typedef struct okey {
    int cls;         /* 0: sequence, 1: other number, 2: string, 3: boolean */
    int is_int;      /* cls 1: an integer (else a float) */
    lua_Integer i;   /* cls 0, 1 (integer) */
    lua_Number f;    /* cls 1 (float) */
    const char *s;   /* cls 2: the bytes (alive: the snapshot holds the string) */
    size_t len;      /* cls 2 */
    int b;           /* cls 3 */
    lua_Integer at;  /* index of the key in the unsorted snapshot */
} okey;

/* Exact order of an integer and a float (the float is never integral: such keys are integers). */
static int cmp_int_float(lua_Integer i, lua_Number f)
{
    if (f >= 9223372036854775808.0) /* 2^63: above every integer */
        return -1;
    if (f < -9223372036854775808.0)
        return 1;
    lua_Number fl = floor(f);
    lua_Integer fi = (lua_Integer)fl;
    if (i <= fi)
        return -1; /* i <= floor(f) < f */
    return 1;      /* i > floor(f), and i is an integer, so i >= floor(f) + 1 > f */
}

static int cmp_numbers(const okey *a, const okey *b)
{
    if (a->is_int && b->is_int)
        return a->i < b->i ? -1 : a->i > b->i;
    if (!a->is_int && !b->is_int)
        return a->f < b->f ? -1 : a->f > b->f;
    return a->is_int ? cmp_int_float(a->i, b->f) : -cmp_int_float(b->i, a->f);
}

static int cmp_okey(const void *pa, const void *pb)
{
    const okey *a = pa, *b = pb;
    if (a->cls != b->cls)
        return a->cls < b->cls ? -1 : 1;
    switch (a->cls) {
    case 0:
        return a->i < b->i ? -1 : a->i > b->i;
    case 1:
        return cmp_numbers(a, b);
    case 2: {
        size_t n = a->len < b->len ? a->len : b->len;
        int c = memcmp(a->s, b->s, n);
        if (c)
            return c;
        return a->len < b->len ? -1 : a->len > b->len;
    }
    default:
        return a->b - b->b;
    }
}

/* "file:line" of the innermost Lua function running (the policy's code that called pairs or next). */
static void policy_where(lua_State *L, char *buf, size_t size)
{
    lua_Debug ar;
    for (int level = 1; level < 32 && lua_getstack(L, level, &ar); level++)
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
            snprintf(buf, size, "%s:%d: ", ar.short_src, ar.currentline);
            return;
        }
    buf[0] = '\0';
}

/* Charges n * (1 + ceil(log2 n)) instructions: the snapshot and its sort (invariant 2). */
static void charge_snapshot(lua_State *L, lua_Integer n)
{
    int log2n = 0;
    while (log2n < 62 && ((lua_Integer)1 << log2n) < n)
        log2n++;
    double units = (double)n * (1.0 + log2n);
    kv_sandbox_charge(L, units > INT_MAX ? INT_MAX : (int)units);
}

/* Pushes the snapshot of the table at idx: a sequence of its keys in the fixed order. Raises an error at
   the policy's line for a key that has no such order. */
static void push_snapshot(lua_State *L, int idx, const char *fn)
{
    idx = lua_absindex(L, idx);
    lua_newtable(L); /* the keys as lua_next gives them */
    int raw = lua_gettop(L);
    lua_Integer n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int t = lua_type(L, -1);
        if (t != LUA_TNUMBER && t != LUA_TSTRING && t != LUA_TBOOLEAN) {
            char where[300];
            policy_where(L, where, sizeof where);
            lua_pushfstring(L,
                            "%s%s() over a table with a %s as a key: kvsim visits keys in a fixed order (numbers, "
                            "strings, booleans) so that runs repeat, and a %s has none; key the table by a number or "
                            "a string, or keep the values in a list and use ipairs",
                            where, fn, luaL_typename(L, -1), luaL_typename(L, -1));
            lua_error(L);
        }
        lua_pushvalue(L, -1);
        lua_rawseti(L, raw, ++n);
        if ((n & 255) == 0)
            kv_sandbox_tick(L, 256);
    }
    charge_snapshot(L, n);
    /* The sequence part: 1..m all present. */
    lua_Integer m = 0;
    while (m < n && lua_rawgeti(L, idx, m + 1) != LUA_TNIL) {
        lua_pop(L, 1);
        m++;
    }
    if (m < n)
        lua_pop(L, 1);
    okey *keys = n ? lua_newuserdatauv(L, (size_t)n * sizeof *keys, 0) : NULL;
    if (!n)
        lua_pushnil(L); /* keeps the stack shape */
    for (lua_Integer j = 0; j < n; j++) {
        okey *k = &keys[j];
        memset(k, 0, sizeof *k);
        k->at = j + 1;
        lua_rawgeti(L, raw, j + 1);
        switch (lua_type(L, -1)) {
        case LUA_TNUMBER:
            if (lua_isinteger(L, -1)) {
                k->is_int = 1;
                k->i = lua_tointeger(L, -1);
                k->cls = k->i >= 1 && k->i <= m ? 0 : 1;
            } else {
                k->cls = 1;
                k->f = lua_tonumber(L, -1);
            }
            break;
        case LUA_TSTRING:
            k->cls = 2;
            k->s = lua_tolstring(L, -1, &k->len); /* raw holds the string */
            break;
        default:
            k->cls = 3;
            k->b = lua_toboolean(L, -1);
            break;
        }
        lua_pop(L, 1);
    }
    if (n > 1)
        qsort(keys, (size_t)n, sizeof *keys, cmp_okey);
    lua_createtable(L, n < INT_MAX ? (int)n : INT_MAX, 0);
    for (lua_Integer j = 0; j < n; j++) {
        lua_rawgeti(L, raw, keys[j].at);
        lua_rawseti(L, -2, j + 1);
    }
    lua_replace(L, raw); /* the sorted snapshot where the raw one was */
    lua_pop(L, 1);       /* the scratch array */
}

/* From position pos of snapshot (at index snap), the next key whose value in t (index 1) is not nil:
   pushes key and value and returns its position, or returns 0 and pushes nothing at the end. */
static lua_Integer advance(lua_State *L, int snap, lua_Integer pos)
{
    lua_Integer n = (lua_Integer)lua_rawlen(L, snap);
    while (++pos <= n) {
        kv_sandbox_tick(L, 1);
        lua_rawgeti(L, snap, pos); /* key */
        lua_pushvalue(L, -1);
        if (lua_rawget(L, 1) != LUA_TNIL)
            return pos;
        lua_pop(L, 2);
    }
    return 0;
}

/* The iterator pairs returns: upvalue 1 the snapshot, 2 the position reached. */
static int ordered_iter(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer pos = lua_tointeger(L, lua_upvalueindex(2));
    lua_Integer at = advance(L, lua_upvalueindex(1), pos);
    lua_pushinteger(L, at ? at : (lua_Integer)lua_rawlen(L, lua_upvalueindex(1)));
    lua_replace(L, lua_upvalueindex(2));
    if (!at) {
        lua_pushnil(L);
        return 1;
    }
    return 2;
}

void kv_sandbox_push_pairs(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    push_snapshot(L, idx, "pairs");
    lua_pushinteger(L, 0);
    lua_pushcclosure(L, ordered_iter, 2);
    lua_pushvalue(L, idx);
    lua_pushnil(L);
}

/* pairs(t): __pairs as in Lua, else the ordered traversal. */
static int ordered_pairs(lua_State *L)
{
    luaL_checkany(L, 1);
    kv_sandbox_tick(L, 1);
    if (luaL_getmetafield(L, 1, "__pairs") != LUA_TNIL) {
        lua_pushvalue(L, 1);
        lua_call(L, 1, 3);
        return 3;
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    kv_sandbox_push_pairs(L, 1);
    return 3;
}

/* Pushes the registry's cache table (made on first use). */
static void push_cache(lua_State *L)
{
    if (lua_getfield(L, LUA_REGISTRYINDEX, ORDER_CACHE) == LUA_TTABLE)
        return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, ORDER_CACHE);
}

/* Entry fields. */
enum { E_SNAP = 1, E_POS = 2, E_INDEX = 3 };

/* Makes a fresh entry for the table at index 1 in the cache (index 3) and leaves it at index 4. */
static void fresh_entry(lua_State *L)
{
    lua_settop(L, 3);
    lua_createtable(L, 3, 0);
    push_snapshot(L, 1, "next");
    lua_rawseti(L, 4, E_SNAP);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 4);
    lua_rawset(L, 3);
}

/* The position of key k (index 2) in the snapshot of entry 4, through its key -> position map (made once
   per snapshot); 0 when the snapshot does not have k. */
static lua_Integer find_key(lua_State *L)
{
    if (lua_rawgeti(L, 4, E_INDEX) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_rawgeti(L, 4, E_SNAP);
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        kv_sandbox_charge(L, n > INT_MAX ? INT_MAX : (int)n);
        lua_createtable(L, 0, n < INT_MAX ? (int)n : INT_MAX);
        for (lua_Integer j = 1; j <= n; j++) {
            lua_rawgeti(L, -2, j);
            lua_pushinteger(L, j);
            lua_rawset(L, -3);
        }
        lua_remove(L, -2);
        lua_pushvalue(L, -1);
        lua_rawseti(L, 4, E_INDEX);
    }
    lua_pushvalue(L, 2);
    lua_Integer pos = lua_rawget(L, -2) == LUA_TNUMBER ? lua_tointeger(L, -1) : 0;
    lua_pop(L, 2);
    return pos;
}

int kv_sandbox_next(lua_State *L)
{
    kv_sandbox_tick(L, 1);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 2);
    push_cache(L); /* 3 */
    lua_Integer pos = 0;
    if (lua_isnil(L, 2)) {
        lua_pushnil(L);
        if (!lua_next(L, 1)) { /* empty: nothing to remember */
            lua_pushvalue(L, 1);
            lua_pushnil(L);
            lua_rawset(L, 3);
            lua_pushnil(L);
            return 1;
        }
        fresh_entry(L); /* a new traversal sees the keys as they are now */
    } else {
        lua_pushvalue(L, 1);
        bool cached = lua_rawget(L, 3) == LUA_TTABLE; /* 4: the entry */
        if (!cached)
            fresh_entry(L);
        lua_rawgeti(L, 4, E_POS);
        lua_Integer last = lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (last > 0) { /* a plain traversal: k is the key returned last */
            lua_rawgeti(L, 4, E_SNAP);
            lua_rawgeti(L, -1, last);
            if (lua_rawequal(L, -1, 2))
                pos = last;
            lua_pop(L, 2);
        }
        if (!pos)
            pos = find_key(L);
        if (!pos && cached) {
            /* Not in the snapshot: a key added since; take the keys as they are now. */
            fresh_entry(L);
            pos = find_key(L);
        }
        if (!pos) {
            char where[300];
            policy_where(L, where, sizeof where);
            lua_pushfstring(L, "%sinvalid key to 'next'", where);
            return lua_error(L);
        }
    }
    lua_rawgeti(L, 4, E_SNAP); /* 5 */
    lua_Integer at = advance(L, 5, pos);
    if (!at) {
        lua_pushvalue(L, 1);
        lua_pushnil(L);
        lua_rawset(L, 3); /* the traversal is over: drop the snapshot */
        lua_pushnil(L);
        return 1;
    }
    lua_pushinteger(L, at);
    lua_rawseti(L, 4, E_POS);
    return 2;
}

void kv_sandbox_open_order(lua_State *L)
{
    lua_pushcfunction(L, kv_sandbox_next);
    lua_setfield(L, -2, "next");
    lua_pushcfunction(L, ordered_pairs);
    lua_setfield(L, -2, "pairs");
}
