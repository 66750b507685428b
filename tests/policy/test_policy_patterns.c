/* test_policy_patterns.c — the policy sandbox's pattern functions: the up-front bound of their work, the memmem plain find, and that results equal stock Lua's. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

#include "core/kv/encoding.h"
#include "core/policy/policy_sandbox.h"
#include "tests/support.h"

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t bound(const char *p, size_t n)
{
    return kv_pattern_bound(p, strlen(p), n).per_start;
}

/* The worked examples of the design notes in core/policy/policy_pattern.c, to the step. */
Test(bound, worked_examples)
{
    cr_expect_eq(bound("a*b", 30000), 210011u);
    cr_expect_eq(bound("(%w+)=(%w+)", 9), 477u);
    kv_pattern_cost c = kv_pattern_bound("(%w+)=(%w+)", 11, 9);
    cr_expect_eq(c.captures, 2u);
    cr_expect_not(c.always);
}

/* Each backtracking quantifier multiplies by the length: k of them give at least n^k per start. */
Test(bound, nested_quantifiers_multiply)
{
    const size_t n = 1000;
    uint64_t one = bound("a*b", n), two = bound("a*a*b", n), three = bound("a*a*a*b", n);
    cr_expect_geq(one, (uint64_t)n);
    cr_expect_geq(two, (uint64_t)n * n);
    cr_expect_geq(three, (uint64_t)n * n * n);
    cr_expect_gt(two, one * (n / 2));
    cr_expect_gt(three, two * (n / 2));
    /* '-' and '?' backtrack too; '+' like '*'. */
    cr_expect_geq(bound(".-.-x", n), (uint64_t)n * n);
    cr_expect_geq(bound("a+a+b", n), (uint64_t)n * n);
    cr_expect_geq(bound("a?a?a?b", n), 8 * bound("b", n)); /* 2^3 ways to try the rest */
    /* A set costs its length per character tested. */
    cr_expect_gt(bound("[abcdefghij]*", n), bound("a*", n) * 5);
}

/* Saturating arithmetic: 40 nested quantifiers on a megabyte do not wrap around to a small number. */
Test(bound, saturates_instead_of_wrapping)
{
    char p[128] = "";
    for (int i = 0; i < 40; i++)
        strcat(p, ".-");
    strcat(p, "x");
    cr_expect_eq(bound(p, 1000000), UINT64_MAX);
    cr_expect_eq(bound("%b()%b()%1", SIZE_MAX), UINT64_MAX);
}

/* Items that always match make the item before them try the rest once; an always-matching pattern needs one start. */
Test(bound, always_matching_suffix)
{
    const size_t n = 1000;
    cr_expect_lt(bound("%d+", n), 4 * (uint64_t)n); /* one scan, the (empty) rest tried once */
    cr_expect_lt(bound("(%a+)%s*", n), 8 * (uint64_t)n);
    cr_expect(kv_pattern_bound("%d*", 3, n).always);
    cr_expect(kv_pattern_bound("(.-)", 4, n).always);
    cr_expect_not(kv_pattern_bound("%d+", 3, n).always);
    cr_expect_not(kv_pattern_bound("a*$", 3, n).always);
    cr_expect_geq(bound("a*$", n), (uint64_t)n); /* '$' can fail: a* retries */
}

/* Malformed patterns get a finite bound (the matcher raises when it reaches the bad item). */
Test(bound, malformed_patterns)
{
    const char *bad[] = {"[a", "%", "%b(", "%fx", "%f[a", "a*[", "[^", "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = bound(bad[i], 100);
        cr_expect(b > 0 && b < 100000, "'%s': %llu", bad[i], (unsigned long long)b);
    }
    /* A set with a leading ']', or an escaped ']', is one item. */
    cr_expect_eq(bound("[]]", 5), bound("[x]", 5));
    cr_expect_eq(bound("[%]]", 5), bound("[%x]", 5));
    cr_expect(kv_pattern_bound("[]]", 3, 5).linear);
}

/* --- the sandbox against stock Lua -------------------------------------------- */

/* Runs `chunk` (which returns one string) in a stock Lua state; returns that string (free it). */
static char *run_stock(const char *chunk)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    cr_assert_eq(luaL_dostring(L, chunk), LUA_OK, "stock: %s", lua_tostring(L, -1));
    char *out = strdup(lua_tostring(L, -1));
    lua_close(L);
    return out;
}

static const kv_sandbox_limits test_limits = {
    .mem_cap_bytes = 64u << 20,
    .string_cap_bytes = 1u << 20,
    .instructions_per_call = 100000000,
    .hook_ns = 60000000000,
    .run_ns = 600000000000,
    .print_cap_bytes = 1024,
};

/* Runs `chunk` in a sandbox opened with `lim` as one armed call; returns the string it returns, or
   "ERROR: <message>" (free it). */
static char *run_sandbox(const char *chunk, const kv_sandbox_limits *lim, double *secs)
{
    kv_sandbox sb;
    char msg[512];
    cr_assert_eq(kv_sandbox_open(&sb, "t", lim, msg, sizeof msg), 0, "%s", msg);
    lua_State *L = sb.L;
    cr_assert_eq(luaL_loadstring(L, chunk), LUA_OK, "%s", lua_tostring(L, -1));
    double t0 = wall_s();
    kv_sandbox_arm(&sb, lim->instructions_per_call, lim->hook_ns);
    int st = lua_pcall(L, 0, 1, 0);
    kv_sandbox_disarm(&sb);
    if (secs)
        *secs = wall_s() - t0;
    char *out = NULL;
    if (st == LUA_OK && sb.limit == KV_SB_OK) {
        out = strdup(lua_tostring(L, -1));
    } else {
        char what[400];
        kv_sandbox_describe_limit(&sb, what, sizeof what);
        const char *e = lua_tostring(L, -1);
        size_t len = strlen(what) + (e ? strlen(e) : 0) + 32;
        out = malloc(len);
        snprintf(out, len, "ERROR: %s | %s", what, e ? e : "?");
    }
    kv_sandbox_close(&sb);
    return out;
}

/* A chunk returning every result of plain and pattern finds over a grid of subjects, needles and inits. */
static const char grid_chunk[] =
    "local subjects = { '', 'a', 'abc', 'abcabc', 'aaab', 'a.b%c', 'x\\0y\\0z', ('ab'):rep(20) }\n"
    "local needles = { '', 'a', 'b', 'c', 'abc', 'ca', 'aab', 'zz', '.', '%', 'a.b', '\\0y', 'y\\0z', 'ba', 'abcabcx' }\n"
    "local out = {}\n"
    "local function put(...) local t = table.pack(...) for i = 1, t.n do out[#out + 1] = tostring(t[i]) end\n"
    "  out[#out + 1] = ';' end\n"
    "for _, s in ipairs(subjects) do\n"
    "  for _, p in ipairs(needles) do\n"
    "    for init = -9, #s + 3 do\n"
    "      put(s:find(p, init, true))\n"
    "      if not p:find('[%%%[%]]') then put(pcall(string.find, s, p, init)) end\n"
    "    end\n"
    "    put(pcall(string.find, s, p))\n"
    "    put(string.find(s, p, nil, true))\n"
    "  end\n"
    "end\n"
    "return table.concat(out, ' ')\n";

/* The memmem path and the stock path give stock Lua's answers, init and empty-needle edge cases included. */
Test(sandbox, plain_find_equals_stock_lua)
{
    char *want = run_stock(grid_chunk);
    char *got = run_sandbox(grid_chunk, &test_limits, NULL);
    cr_expect_str_eq(got, want);
    cr_expect_gt(strlen(want), 1000u); /* the grid ran */
    free(want);
    free(got);
}

/* Everyday pattern use in the sandbox returns what stock Lua returns. */
static const char everyday_chunk[] =
    "local k, v = ('key=value'):match('(%w+)=(%w+)')\n"
    "assert(k == 'key' and v == 'value')\n"
    "local out = { k, v }\n"
    "local function put(...) local t = table.pack(...) for i = 1, t.n do out[#out + 1] = tostring(t[i]) end end\n"
    "put(('Llama-3-8B'):match('^(%a+)%-'))\n"
    "put(('a-b-c'):gsub('%-', '+'))\n"
    "put(('int8'):match('%d+'))\n"
    "put(('bits=4, group=32'):find('group=(%d+)'))\n"
    "put(('  trim me  '):gsub('^%s*(.-)%s*$', '%1'))\n"
    "for w in ('the quick brown fox jumps over the lazy dog'):gmatch('%a+') do put(w) end\n"
    "for a, b in ('x=1, y=22, z=333'):gmatch('(%w+)=(%w+)') do put(a, b) end\n"
    "put(('hello world'):gsub('o', { o = '0' }))\n"
    "put(('hello world'):gsub('%w+', function(w) return w:upper() end, 1))\n"
    "put(('THE (quick) fox'):find('%f[%a]%a+%f[%A]'))\n"
    "put(('f(a(b)c)d'):match('%b()'))\n"
    "put(('abcabc'):find('(abc)%1'))\n"
    "put(('a,b,,c'):gsub(',', ';', 2))\n"
    "put(('abc'):gsub('', '-'))\n"
    "put(pcall(string.find, 'abc', '[a'))\n"
    "put(pcall(string.gsub, 'abc', '(', 'x'))\n"
    "put(pcall(string.rep))\n"
    "local it = ('a1b2'):gmatch('%d')\n"
    "put(it(), it(), it(), it())\n"
    "return table.concat(out, ' ')\n";

Test(sandbox, everyday_patterns_work)
{
    kv_sandbox_limits lim = test_limits;
    lim.instructions_per_call = 1000000; /* the default budget */
    char *want = run_stock(everyday_chunk);
    char *got = run_sandbox(everyday_chunk, &lim, NULL);
    cr_expect_str_eq(got, want);
    cr_expect(strstr(got, "key value Llama a+b+c 2 8"), "%s", got);
    free(want);
    free(got);
}

/* ("a"):rep(30000):find("a*b") is refused at once, before it runs (stock Lua takes about n^2 steps). */
Test(sandbox, backtracking_is_refused_before_running)
{
    kv_sandbox_limits lim = test_limits;
    lim.instructions_per_call = 1000000;
    double secs = 0;
    char *got = run_sandbox("local s = ('a'):rep(30000)\n"
                            "local ok = pcall(string.find, s, 'a*b')\n"
                            "return 'not stopped'\n",
                            &lim, &secs);
    cr_expect(strstr(got, "ERROR: its instruction budget (1000000 per call, policy_limits.instructions): "
                          "string.find('a*b') on a string of 30000 bytes could take up to 6.3e+09 steps, more than "
                          "the "),
              "%s", got);
    cr_expect(strstr(got, "(refused before running)"), "%s", got);
    cr_expect_lt(secs, 0.05, "took %.3f s", secs);
    free(got);
    /* The stock matcher itself takes far longer, even on a third of the length. */
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    double t0 = wall_s();
    cr_assert_eq(luaL_dostring(L, "return (('a'):rep(10000)):find('a*b')"), LUA_OK);
    double stock = wall_s() - t0;
    lua_close(L);
    cr_expect_gt(stock, 10 * secs, "stock %.3f s vs refusal %.3f s", stock, secs);
}

/* The budget decides: the same backtracking pattern on 3000 bytes runs under a budget that pays its bound. */
Test(sandbox, a_budget_that_pays_the_bound_runs_it)
{
    const char *chunk = "local s = ('a'):rep(3000) .. 'b'\nreturn tostring(s:find('a*b'))\n";
    kv_sandbox_limits lim = test_limits;
    lim.instructions_per_call = 1000000;
    char *got = run_sandbox(chunk, &lim, NULL);
    cr_expect(strncmp(got, "ERROR: ", 7) == 0, "%s", got);
    free(got);
    lim.instructions_per_call = 100000000;
    got = run_sandbox(chunk, &lim, NULL);
    cr_expect_str_eq(got, "1");
    free(got);
}

/* A refusal is sticky like a used-up budget: pcall cannot catch it and go on. */
Test(sandbox, refusal_is_sticky)
{
    kv_sandbox_limits lim = test_limits;
    lim.instructions_per_call = 1000000;
    char *got = run_sandbox("local s = ('(' ):rep(100000)\n"
                            "for i = 1, 3 do pcall(string.find, s, '%b()') end\n"
                            "return 'went on'\n",
                            &lim, NULL);
    cr_expect(strstr(got, "ERROR: ") && strstr(got, "string.find('%b()') on a string of 100000 bytes"), "%s", got);
    free(got);
}

/* A gmatch loop is charged its whole bound (each start tried at most twice) once, not once per match. */
Test(sandbox, gmatch_loop_charged_once)
{
    kv_sandbox_limits lim = test_limits;
    lim.instructions_per_call = 1000000;
    /* 600 bytes, 100 words: per call ~ 600 * 600 steps; 100 calls at that price would pass the budget. */
    char *got = run_sandbox("local s = ('word, '):rep(100)\n"
                            "local n = 0\n"
                            "for w in s:gmatch('%a+') do n = n + 1 end\n"
                            "local it = s:gmatch('%a+')\n"
                            "for i = 1, 200 do it() end\n"
                            "return tostring(n)\n",
                            &lim, NULL);
    cr_expect_str_eq(got, "100");
    free(got);
    /* An iterator whose calls raise pays every call in full. */
    got = run_sandbox("local s = ('word, '):rep(100)\n"
                      "local it = s:gmatch('(%a+)%2')\n"
                      "for i = 1, 200 do pcall(it) end\n"
                      "return 'went on'\n",
                      &lim, NULL);
    cr_expect(strstr(got, "ERROR: ") && strstr(got, "string.gmatch('(%a+)%2') on a string of 600 bytes"), "%s", got);
    free(got);
}
