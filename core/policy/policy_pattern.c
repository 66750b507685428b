/* policy_pattern.c — string.find/match/gmatch/gsub for policies: Lua's own functions, run only after their work is bounded and charged.
 *
 * Design notes.
 *
 * Lua's pattern functions run inside one C call, which no count hook can
 * interrupt, and the matcher backtracks: ("a"):rep(30000):find("a*b") takes
 * about a billion steps, and every added quantifier multiplies by the length.
 * kvsim keeps the stock functions (this file holds no matcher) and puts a
 * wrapper in front of each that computes, from the lengths and the pattern's
 * items alone, an upper bound of the work the call can do, charges it to the
 * call's instruction budget (1 step = 1 instruction) before the stock function
 * runs, and refuses the call (KV_SB_WORK: "...could take up to N steps, more
 * than the M left (refused before running)") when the budget cannot pay it.
 *
 *  Invariant 1: the bound is never below the work of the stock function, so
 *  a call that runs finishes within what it was charged (the clock is read as
 *  if that many instructions ran).
 *  Invariant 2: the bound depends only on the subject's length, the pattern,
 *  init, the replacement's length and max_n, never on the clock, so the same
 *  call is refused or run the same way on every run (determinism).
 *
 * Plain finds (find with plain = true, or a pattern without any of
 * ^$*+?.([%-) do not reach the stock function at all: they are glibc's memmem
 * (the two-way algorithm, linear in haystack + needle; Lua's own plain search
 * is memchr + memcmp, quadratic on "aaa...ab" needles), charged
 * len(s) - init + len(p) + 1. The results are those of the stock find:
 * init counts from the end when negative, past the end finds nothing, an
 * empty needle is found at init.
 *
 * The bound for one start. Read the pattern as items: a single-character
 * class (a character, '.', %a and the like, or a [set] of L bytes) with an
 * optional suffix * + - ?, a capture bracket '(' ')' '()', %bxy, %f[set],
 * a back-reference %1-%9, or '$' at the very end. T(j), the work of one try
 * of the items from j on at any position of a subject of n bytes, obeys
 *
 *   T(end)             = 1
 *   class, no suffix   = v + T(j+1)                  v = 2 + 2L: find the class's end, test 1 char
 *   class?             = v + 2 T(j+1)                tried with, then without the character
 *   class* / class+    = v + (n+1) c + (n+1) T(j+1)  c = 1 + L per character tested; the longest run
 *                                                    is scanned, then the rest tried at each length
 *   class-             = v + (n+1) c + (n+1) T(j+1)  the rest tried before each added character
 *   ( ) ()             = 1 + T(j+1)                  a capture never retries
 *   %bxy               = 2 + n + T(j+1)              one scan for the closing y, no retry
 *   %f[set]            = 3 + 3L + T(j+1)             the set's end, then two characters tested
 *   %1-%9              = 2 + n + T(j+1)              one comparison of at most n bytes
 *   $ (last)           = 1
 *
 * Each line is a + b T(j+1), so the whole pattern folds left to right into one
 * a + b x (saturating at 2^64 - 1, which only ever overestimates): k
 * backtracking quantifiers give O(n^k) per start. A suffix of items that
 * always matches (captures, class*, class-, class?) makes the item before it
 * try the rest once: its first try succeeds. So "%d+" costs a scan, not a
 * scan times the length, and a pattern that always matches needs one start.
 * A malformed item costs the bytes up to the end of the pattern and ends the
 * fold (the matcher raises the error when it first reaches it).
 *
 * Patterns that never backtrack get a linear bound as well (the smaller one is
 * charged). If every quantified item's rest always matches and there is no %b,
 * %f or back-reference ("%a+", "[^,]+", "(%d+)%s*"), a try can only fail at an
 * unquantified item before the first quantifier, without scanning, and a
 * successful try scans only bytes of the match it returns, each of them once.
 * So a try costs at most F = 1 + sum over items of (5 + 3L) (captures, '$': 2),
 * plus P = max(1 + L) of the * and + items per byte of its match; and the
 * matches a gmatch or gsub loop returns never overlap, so all of them together
 * scan at most n bytes.
 *
 * The calls. With m the pattern's length, C its value captures ('(' that is
 * not '()', each copying at most n bytes out), and B(t) the bound of t tries,
 * B(t) = t T, or for a linear pattern min(t T, t F + P n):
 *   find, match   1 + m + B(S) + (C + 1) n     S = n - init + 1 starts (1 if anchored with ^
 *                                              or the pattern always matches)
 *   gmatch        each call of the iterator: 1 + B(V) + (C + 1) n, V = n - init + 1. The whole
 *                 loop tries each position at most twice (twice only after an empty match), so
 *                 once B(2V) + (C + 1) n has been charged in all, later calls are charged 1;
 *                 after a call that raised an error every call pays in full, and a loop that
 *                 has ended returns at once (the stock iterator would search again in vain)
 *   gsub          1 + m + n + B(2 (n + 1)) + (n + 1) (2 + 2 r) + (C + 1 + r) n, with r the
 *                 replacement string's length (64 for a number, 0 for a table or function,
 *                 whose calls the budget counts anyway); one try if anchored, none if max_n <= 0
 *
 * Worked example: ("a"):rep(30000):find("a*b"). n = 30000. Items: a* (L = 1,
 * v = 4, c = 2; its rest "b" can fail): 4 + 30001 * 2 + 30001 T(b); b: 4 + T(end);
 * T(end) = 1. T = 60006 + 30001 * (4 + 1) = 210011. Not linear (a* backtracks).
 * S = 30001 starts: 1 + 3 + 30001 * 210011 + 30000 = 6.3e9 steps, over the default
 * budget of 1e6, so it is refused before running. The real work is about n^2 = 9e8
 * character tests, 7x below the bound. Everyday use: ("key=value"):match("(%w+)=(%w+)"):
 * n = 9, T = 477 (the first %w+ retries "=(%w+)" at each of its 10 lengths), 10 starts,
 * 2 captures: 1 + 11 + 4770 + 27 = 4809 steps.
 *
 * The price of a bound that knows only lengths: under the default budget of 1e6,
 * a pattern with one backtracking quantifier ("a*b", about 7 n^2 steps for find)
 * takes subjects up to about 370 bytes, two ("(%w+)=(%w+)", about 3 n^3) about
 * 65 bytes, the trim idiom "^%s*(.-)%s*$" about 60 bytes; patterns that never
 * backtrack cost about 15 to 35 steps per byte (find, gmatch loop, gsub) and take
 * tens of KiB. Longer subjects need a larger policy_limits.instructions, a plain
 * find, or string.sub first.
 */
#define _GNU_SOURCE /* memmem */
#include "core/policy/policy_sandbox.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return a != 0 && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* What kind of item starts at a position of the pattern (see the design notes). */
typedef enum item_kind {
    ITEM_CLASS,     /* one character class with an optional suffix */
    ITEM_CAPTURE,   /* '(', ')' or '()' */
    ITEM_BALANCE,   /* %bxy */
    ITEM_FRONTIER,  /* %f[set] */
    ITEM_BACKREF,   /* %0-%9 */
    ITEM_END,       /* '$' as the last byte */
    ITEM_MALFORMED, /* the matcher raises an error when it gets here */
} item_kind;

typedef struct pattern_item {
    item_kind kind;
    size_t len;       /* bytes of the item, suffix included */
    size_t class_len; /* ITEM_CLASS, ITEM_FRONTIER: bytes of the class ("[a-z]": 5), suffix excluded */
    char suffix;      /* ITEM_CLASS: '*', '+', '-', '?' or 0 */
    bool value_capture; /* ITEM_CAPTURE: '(' that captures a string (not ')' or '()') */
} pattern_item;

/* End (index just past ']') of the [set] whose '[' is at p[i], or 0 when the
   set is not closed. The first byte after '[' or "[^" is always part of the set,
   '%' escapes the byte after it. */
static size_t set_end(const char *p, size_t lp, size_t i)
{
    size_t q = i + 1;
    if (q < lp && p[q] == '^')
        q++;
    for (;;) {
        if (q >= lp)
            return 0;
        char ch = p[q++];
        if (ch == '%' && q < lp)
            q++;
        if (q < lp && p[q] == ']')
            return q + 1;
    }
}

/* Reads the item starting at p[i] (i < lp). */
static pattern_item read_item(const char *p, size_t lp, size_t i)
{
    pattern_item it = {ITEM_CLASS, 1, 1, 0, false};
    switch (p[i]) {
    case '(':
        it.kind = ITEM_CAPTURE;
        it.len = i + 1 < lp && p[i + 1] == ')' ? 2 : 1;
        it.value_capture = it.len == 1;
        return it;
    case ')':
        it.kind = ITEM_CAPTURE;
        return it;
    case '$':
        if (i + 1 == lp) {
            it.kind = ITEM_END;
            return it;
        }
        break; /* a '$' elsewhere is an ordinary character */
    case '%':
        if (i + 1 >= lp) {
            it.kind = ITEM_MALFORMED;
            return it;
        }
        if (p[i + 1] == 'b') {
            it.kind = i + 4 <= lp ? ITEM_BALANCE : ITEM_MALFORMED;
            it.len = 4;
            return it;
        }
        if (p[i + 1] == 'f') {
            size_t e = i + 2 < lp && p[i + 2] == '[' ? set_end(p, lp, i + 2) : 0;
            it.kind = e ? ITEM_FRONTIER : ITEM_MALFORMED;
            it.len = e ? e - i : 2;
            it.class_len = e ? e - (i + 2) : 0;
            return it;
        }
        if (p[i + 1] >= '0' && p[i + 1] <= '9') {
            it.kind = ITEM_BACKREF;
            it.len = 2;
            return it;
        }
        it.class_len = 2; /* %a, %%, %. ... */
        break;
    case '[': {
        size_t e = set_end(p, lp, i);
        if (!e) {
            it.kind = ITEM_MALFORMED;
            return it;
        }
        it.class_len = e - i;
        break;
    }
    default:
        break;
    }
    it.len = it.class_len;
    size_t j = i + it.len;
    if (j < lp && (p[j] == '*' || p[j] == '+' || p[j] == '-' || p[j] == '?')) {
        it.suffix = p[j];
        it.len++;
    }
    return it;
}

/* An item that matches wherever the rest of the pattern matches. */
static bool item_always(const pattern_item *it)
{
    return it->kind == ITEM_CAPTURE ||
           (it->kind == ITEM_CLASS && (it->suffix == '*' || it->suffix == '-' || it->suffix == '?'));
}

kv_pattern_cost kv_pattern_bound(const char *p, size_t lp, size_t n)
{
    kv_pattern_cost cost = {0};
    /* Pass 1: where the longest suffix of always-matching items starts (SIZE_MAX: none, not even the empty one). */
    size_t sure_from = 0;
    for (size_t i = 0; i < lp;) {
        pattern_item it = read_item(p, lp, i);
        if (it.kind == ITEM_MALFORMED) {
            sure_from = SIZE_MAX;
            break;
        }
        if (it.value_capture)
            cost.captures++;
        i += it.len;
        if (!item_always(&it))
            sure_from = i;
    }
    /* Pass 2: fold a + b * T(rest) from the left: T = A + B * T(rest). Also sum the linear bound. */
    const uint64_t n1 = sat_add(n, 1);
    uint64_t A = 0, B = 1;
    cost.linear = 1;
    cost.fixed = 1;
    for (size_t i = 0; i < lp && B != 0;) {
        pattern_item it = read_item(p, lp, i);
        bool rest_sure = sure_from != SIZE_MAX && i + it.len >= sure_from;
        uint64_t a = 1, b = 1;
        if (it.kind == ITEM_CLASS) {
            uint64_t L = it.class_len;
            cost.fixed = sat_add(cost.fixed, 5 + 3 * L); /* v + c + 2 */
            if (it.suffix && !rest_sure)
                cost.linear = 0;
            if ((it.suffix == '*' || it.suffix == '+') && 1 + L > cost.per_byte)
                cost.per_byte = 1 + L;
        } else if (it.kind == ITEM_CAPTURE || it.kind == ITEM_END) {
            cost.fixed = sat_add(cost.fixed, 2);
        } else {
            cost.linear = 0;
        }
        switch (it.kind) {
        case ITEM_CLASS: {
            uint64_t L = it.class_len, v = 2 + 2 * L, c = 1 + L;
            a = v;
            if (it.suffix == '?') {
                b = rest_sure ? 1 : 2;
            } else if (it.suffix == '*' || it.suffix == '+') {
                a = sat_add(v, sat_mul(n1, c));
                b = rest_sure ? 1 : n1;
            } else if (it.suffix == '-' && !rest_sure) {
                a = sat_add(v, sat_mul(n1, c));
                b = n1;
            }
            break;
        }
        case ITEM_CAPTURE:
            break;
        case ITEM_BALANCE:
        case ITEM_BACKREF:
            a = sat_add(2, n);
            break;
        case ITEM_FRONTIER:
            a = 3 + 3 * (uint64_t)it.class_len;
            break;
        case ITEM_END:
            b = 0;
            break;
        case ITEM_MALFORMED:
            a = 1 + (uint64_t)(lp - i);
            b = 0;
            break;
        }
        A = sat_add(A, sat_mul(B, a));
        B = sat_mul(B, b);
        i += it.len;
    }
    cost.per_start = sat_add(A, B); /* T(end of pattern) = 1 */
    cost.always = sure_from == 0;
    if (!cost.linear) {
        cost.fixed = cost.per_start;
        cost.per_byte = 0;
    }
    return cost;
}

/* --- the wrappers ------------------------------------------------------------ */

/* Runs the stock C function in upvalue 1 in this frame (see call_stock in policy_sandbox.c). */
static int call_stock(lua_State *L)
{
    lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(1));
    return f(L);
}

/* 0-based start of a search from Lua's 1-based, possibly negative init (may be > len: nothing to find). */
static size_t start_index(lua_Integer init, size_t len)
{
    if (init > 0)
        return (size_t)init - 1;
    if (init == 0 || init < -(lua_Integer)len)
        return 0;
    return len - (size_t)(-init);
}

/* "string.find('a*b') on a string of 30000 bytes": the first 40 bytes of the pattern, escaped. */
static void describe(char *buf, size_t size, const char *fn, const char *p, size_t lp, size_t n)
{
    char shown[200];
    size_t k = 0;
    for (size_t i = 0; i < lp && i < 40 && k + 5 < sizeof shown; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 32 && ch < 127 && ch != '\'' && ch != '\\')
            shown[k++] = (char)ch;
        else
            k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02x", ch);
    }
    shown[k] = '\0';
    if (lp > 40)
        snprintf(buf, size, "string.%s('%s...', a pattern of %zu bytes) on a string of %zu bytes", fn, shown, lp, n);
    else
        snprintf(buf, size, "string.%s('%s') on a string of %zu bytes", fn, shown, n);
}

/* Charges `steps`, or refuses the call described by fn/p/n. */
static void charge(lua_State *L, uint64_t steps, const char *fn, const char *p, size_t lp, size_t n)
{
    if (kv_sandbox_charge_ahead(L, steps) == 0)
        return;
    char what[300];
    describe(what, sizeof what, fn, p, lp, n);
    kv_sandbox_refuse(L, steps, what);
}

/* A pattern with none of ^$*+?.([%- anywhere (embedded zeros included): find searches it plainly. */
static bool no_specials(const char *p, size_t lp)
{
    static const char specials[] = "^$*+?.([%-";
    for (const char *c = specials; *c; c++)
        if (memchr(p, *c, lp))
            return false;
    return true;
}

/* Bound of `tries` tries of the matcher on a subject of n bytes whose successful tries return
   disjoint matches (gmatch, gsub; find and match stop at the first). */
static uint64_t tries_bound(const kv_pattern_cost *c, uint64_t tries, size_t n)
{
    uint64_t general = sat_mul(tries, c->per_start);
    if (!c->linear)
        return general;
    uint64_t linear = sat_add(sat_mul(tries, c->fixed), sat_mul(c->per_byte, n));
    return linear < general ? linear : general;
}

static int find_or_match(lua_State *L, bool find)
{
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls);
    if (init > ls) { /* starts past the end: the stock function finds nothing either */
        kv_sandbox_tick(L, 1);
        lua_pushnil(L);
        return 1;
    }
    if (find && (lua_toboolean(L, 4) || no_specials(p, lp))) {
        size_t hay = ls - init;
        uint64_t steps = sat_add(sat_add(hay, lp), 1);
        if (kv_sandbox_charge_ahead(L, steps) != 0) {
            char what[200];
            snprintf(what, sizeof what, "string.find of a plain needle of %zu bytes in a string of %zu bytes", lp,
                     hay);
            kv_sandbox_refuse(L, steps, what);
        }
        const char *at = lp == 0 ? s + init : memmem(s + init, hay, p, lp);
        if (!at) {
            lua_pushnil(L);
            return 1;
        }
        lua_pushinteger(L, (lua_Integer)(at - s) + 1);
        lua_pushinteger(L, (lua_Integer)(at - s) + (lua_Integer)lp);
        return 2;
    }
    bool anchor = lp > 0 && p[0] == '^';
    kv_pattern_cost c = kv_pattern_bound(p + anchor, lp - anchor, ls);
    uint64_t starts = anchor || c.always ? 1 : (uint64_t)(ls - init) + 1;
    uint64_t steps = sat_add(sat_add(1 + (uint64_t)lp, tries_bound(&c, starts, ls)),
                             sat_mul((uint64_t)c.captures + 1, ls));
    charge(L, steps, find ? "find" : "match", p, lp, ls);
    return call_stock(L);
}

static int pattern_find(lua_State *L)
{
    return find_or_match(L, true);
}

static int pattern_match(lua_State *L)
{
    return find_or_match(L, false);
}

/* The gmatch iterator's state (upvalue 4 of pattern_gmatch_step). */
enum { GM_OK, GM_UNSAFE, GM_DONE };

/* One call of a gmatch iterator. Upvalues: 1 the stock iterator, 2 the bound of one call,
   3 what is left to charge of the whole loop's bound, 4 the state, 5 the pattern, 6 the subject's length. */
static int pattern_gmatch_step(lua_State *L)
{
    lua_Integer state = lua_tointeger(L, lua_upvalueindex(4));
    if (state == GM_DONE) { /* the stock iterator would scan again and find nothing again */
        kv_sandbox_tick(L, 1);
        return 0;
    }
    uint64_t per_call = (uint64_t)lua_tointeger(L, lua_upvalueindex(2));
    uint64_t loop_left = (uint64_t)lua_tointeger(L, lua_upvalueindex(3));
    uint64_t steps = state == GM_OK ? (per_call < loop_left ? per_call : loop_left) : per_call;
    steps = sat_add(steps, 1);
    if (kv_sandbox_charge_ahead(L, steps) != 0) {
        size_t lp;
        const char *p = lua_tolstring(L, lua_upvalueindex(5), &lp);
        char what[300];
        describe(what, sizeof what, "gmatch", p, lp, (size_t)lua_tointeger(L, lua_upvalueindex(6)));
        kv_sandbox_refuse(L, steps, what);
    }
    if (state == GM_OK) {
        lua_pushinteger(L, (lua_Integer)(loop_left - (steps - 1 < loop_left ? steps - 1 : loop_left)));
        lua_replace(L, lua_upvalueindex(3));
        /* Unsafe while the stock iterator runs: if it raises, every later call pays in full. */
        lua_pushinteger(L, GM_UNSAFE);
        lua_replace(L, lua_upvalueindex(4));
    }
    lua_settop(L, 0);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_call(L, 0, LUA_MULTRET);
    int results = lua_gettop(L);
    if (results == 0 || state == GM_OK) {
        lua_pushinteger(L, results == 0 ? GM_DONE : GM_OK);
        lua_replace(L, lua_upvalueindex(4));
    }
    return results;
}

static lua_Integer clamp_integer(uint64_t v)
{
    return v > (uint64_t)LUA_MAXINTEGER ? LUA_MAXINTEGER : (lua_Integer)v;
}

static int pattern_gmatch(lua_State *L)
{
    size_t ls, lp;
    luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls);
    kv_sandbox_tick(L, KV_SANDBOX_CALL_TICKS);
    kv_pattern_cost c = kv_pattern_bound(p, lp, ls); /* gmatch takes no anchor: '^' is a character */
    uint64_t visits = init > ls ? 0 : (uint64_t)(ls - init) + 1;
    uint64_t copies = sat_mul((uint64_t)c.captures + 1, ls);
    uint64_t per_call = sat_add(tries_bound(&c, visits, ls), copies);
    uint64_t loop = sat_add(tries_bound(&c, sat_mul(2, visits), ls), copies);
    /* The stock gmatch pops its arguments: call it with copies, keeping the pattern at index 2. */
    int nargs = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    for (int i = 1; i <= nargs; i++)
        lua_pushvalue(L, i);
    lua_call(L, nargs, 1);
    lua_pushinteger(L, clamp_integer(per_call));
    lua_pushinteger(L, clamp_integer(loop));
    lua_pushinteger(L, GM_OK);
    lua_pushvalue(L, 2);
    lua_pushinteger(L, (lua_Integer)ls);
    lua_pushcclosure(L, pattern_gmatch_step, 6);
    return 1;
}

static int pattern_gsub(lua_State *L)
{
    size_t ls, lp;
    luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int repl_type = lua_type(L, 3);
    lua_Integer max_n = (lua_Integer)ls + 1;
    if (!lua_isnoneornil(L, 4)) {
        int isnum = 0;
        lua_Integer v = lua_tointegerx(L, 4, &isnum);
        if (isnum) /* otherwise the stock function raises the error */
            max_n = v;
    }
    uint64_t repl = repl_type == LUA_TSTRING ? lua_rawlen(L, 3) : repl_type == LUA_TNUMBER ? 64 : 0;
    bool anchor = lp > 0 && p[0] == '^';
    kv_pattern_cost c = kv_pattern_bound(p + anchor, lp - anchor, ls);
    uint64_t n1 = (uint64_t)ls + 1;
    uint64_t tries = max_n <= 0 ? 0 : anchor ? 1 : 2 * n1;
    uint64_t matches = max_n <= 0 ? 0 : anchor ? 1 : n1;
    uint64_t steps = 1 + (uint64_t)lp + ls;
    steps = sat_add(steps, tries_bound(&c, tries, ls));
    steps = sat_add(steps, sat_mul(matches, sat_add(2, sat_mul(2, repl))));
    steps = sat_add(steps, sat_mul(sat_add((uint64_t)c.captures + 1, repl), ls));
    charge(L, steps, "gsub", p, lp, ls);
    return call_stock(L);
}

/* Replaces table[field] (table on top of the stack) by f with the stock function as upvalue 1. */
static void wrap(lua_State *L, const char *field, lua_CFunction f)
{
    lua_getfield(L, -1, field);
    lua_pushcclosure(L, f, 1);
    lua_setfield(L, -2, field);
}

void kv_sandbox_open_patterns(lua_State *L)
{
    wrap(L, "find", pattern_find);
    wrap(L, "match", pattern_match);
    wrap(L, "gmatch", pattern_gmatch);
    wrap(L, "gsub", pattern_gsub);
}
