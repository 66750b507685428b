/* test_policy_hangs.c — every known way a Lua policy could hang kvsim ends in exit 2, fast, naming file:line and the limit.
 *
 * Each case is a policy that ran forever (or for hours) before the sandbox's
 * time budgets, string cap and charged C work: it must now make `kvsim run`
 * exit 2 within seconds, with a message naming the policy file and line, the
 * hook and the limit, and leave no results behind. Every test has a timeout,
 * so a regression fails instead of hanging the suite.
 */
#define _GNU_SOURCE /* asprintf */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "core/policy/policy.h"
#include "tests/support.h"

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A small scenario (ideal network) comparing bf16 with the policy `hang` in file `policy`. */
static char *write_scenario(const char *dir, const char *policy, const char *extra)
{
    char text[4096];
    snprintf(text, sizeof text,
             "name: t\n"
             "model: llama-3-8b\n"
             "seed: 1\n"
             "network: {model: ideal}\n"
             "workload: {requests: 4, arrival: poisson, rate_per_s: 4, prompt: {dist: fixed, value: 512}, "
             "output: {dist: fixed, value: 8}}\n"
             "policies: [bf16, hang]\n"
             "policy:\n  hang: {file: %s}\n%s",
             policy, extra ? extra : "");
    return kvt_write(dir, "s.yaml", text);
}

/* `kvsim run scenario --out dir/out` under timeout(1), so that a regression
   (a hang) is killed before the test's own timeout and leaves no process
   behind; returns the exit code (124: killed), output in *out (free it). */
static int run_kvsim(const char *scenario, const char *dir, char **out)
{
    const char *bin = getenv("KVSIM");
    const char *limit = getenv("KVT_HANG_TIMEOUT"); /* seconds; shorter to check old binaries quickly */
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "timeout -k 5 %s %s run %s --out %s/out 2>&1", limit ? limit : "40",
                       bin ? bin : KV_BINARY_DIR "/kvsim", scenario, dir) > 0);
    FILE *p = popen(cmd, "r");
    free(cmd);
    cr_assert_not_null(p);
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = '\0';
    int status = pclose(p);
    *out = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

typedef struct run_result {
    int rc;         /* kvsim's exit code */
    char *out;      /* stdout + stderr (owned) */
    size_t out_len; /* bytes of out */
    double secs;    /* wall time of the run */
    int has_results; /* the output folder holds a results.json */
} run_result;

/* Writes `lua` as hang.lua, runs `kvsim run` on it (with `extra` YAML) and cleans up. */
static run_result run_policy(const char *lua, const char *extra)
{
    char *dir = kvt_tempdir();
    cr_assert_not_null(dir);
    char *policy = kvt_write(dir, "hang.lua", lua);
    char *s = write_scenario(dir, policy, extra);
    run_result r = {0};
    double t0 = wall_s();
    r.rc = run_kvsim(s, dir, &r.out);
    r.secs = wall_s() - t0;
    r.out_len = r.out ? strlen(r.out) : 0;
    char *results = NULL;
    cr_assert(asprintf(&results, "%s/out/results.json", dir) > 0);
    struct stat st;
    r.has_results = stat(results, &st) == 0;
    free(results);
    free(s);
    free(policy);
    kvt_rmtree(dir);
    free(dir);
    return r;
}

/* One case: `lua` as hang.lua, `extra` YAML appended to the scenario. The run must
   exit `rc` within `max_s` seconds (0: only the test's own timeout), print each of
   want[] (empty entries end the list), print fewer than `max_out` bytes where that
   is not 0, and leave a results.json only where it succeeded. The text lives in
   the row itself (no pointers), so the table can be handed to Criterion's test
   processes as it is. */
typedef struct hang_case {
    char name[48];
    char lua[512];
    char extra[64];
    int rc;
    double max_s;
    char want[3][384];
    size_t max_out;
} hang_case;

static void expect_case(const hang_case *c)
{
    cr_log_info("case %s", c->name);
    run_result r = run_policy(c->lua, c->extra[0] ? c->extra : NULL);
    cr_expect_eq(r.rc, c->rc, "[%s] exit %d (expected %d) after %.1f s:\n%.4000s", c->name, r.rc, c->rc, r.secs,
                 r.out ? r.out : "");
    if (c->max_s > 0)
        cr_expect_lt(r.secs, c->max_s, "[%s] took %.1f s (limit %.0f s)", c->name, r.secs, c->max_s);
    if (c->rc != 0)
        cr_expect_not(r.has_results, "[%s] a failed run must leave no results.json", c->name);
    else
        cr_expect(r.has_results, "[%s] a run that succeeds writes results.json", c->name);
    for (int i = 0; i < 3 && c->want[i][0]; i++)
        cr_expect(r.out && strstr(r.out, c->want[i]), "[%s] expected \"%s\" in:\n%.4000s", c->name, c->want[i],
                  r.out ? r.out : "");
    if (c->max_out)
        cr_expect_lt(r.out_len, c->max_out, "[%s] printed %zu bytes (limit %zu)", c->name, r.out_len, c->max_out);
    free(r.out);
}

#define BUDGET "used up its instruction budget (1000000 per call) in hook 'encode'"
#define HOOK_TIME "hit its time limit of 1000 ms per call (policy_limits.hook_ms) in hook 'encode'"
#define STRING_CAP "over its limit of 1 MiB per string (policy_limits.string_kib)"
/* A pattern function whose bound of work the budget cannot pay is refused before it runs. */
#define REFUSED(call) "hit its instruction budget (1000000 per call, policy_limits.instructions): " call
#define BEFORE "more than the 1000000 left (refused before running) in hook 'encode'"
/* A policy that stops the run: exit 2 within 20 s. */
#define STOPPED(name, lua, extra, ...) {name, lua, extra, 2, 20, {__VA_ARGS__}, 0}
/* An encode hook that runs `stmt` once (then answers bf16) or in an endless loop. */
#define ENCODE_ONCE(stmt) "return {\n  encode = function(ctx)\n    " stmt "\n    return 'bf16'\n  end,\n}\n"
#define ENCODE_LOOP(stmt) "return {\n  encode = function(ctx)\n    while true do " stmt " end\n  end,\n}\n"

/* Every known hang; the comments say what each one used to do. */
static hang_case hang_cases[] = {
    /* 1. A loop in an xpcall message handler: the budget's own error used to run the
          handler with hooks off, so nothing could stop it. */
    STOPPED("xpcall_handler_after_the_budget",
            "return {\n"
            "  encode = function(ctx)\n"
            "    xpcall(function() while true do end end,\n"
            "           function(e) while true do end end)\n"
            "    return 'bf16'\n"
            "  end,\n"
            "}\n",
            "", "hang.lua:3: policy 'hang' " BUDGET, "(defined at "),
    STOPPED("xpcall_handler_of_an_ordinary_error",
            "return {\n"
            "  encode = function(ctx)\n"
            "    xpcall(error, function(e)\n"
            "      local n = 0\n"
            "      while true do n = n + 1 end\n"
            "    end)\n"
            "    return 'bf16'\n"
            "  end,\n"
            "}\n",
            "", "hang.lua:5: policy 'hang' " BUDGET),
    /* 2. %b on a megabyte of '(': quadratic inside one C call (bound: a start per byte, a scan per start). */
    STOPPED("balanced_pattern", "local s = string.rep('(', 1000000)\n" ENCODE_ONCE("local i = s:find('%b()')"), "",
            "hang.lua:4: policy 'hang' " REFUSED("string.find('%b()') on a string of 1000000 bytes "
                                                 "could take up to 1.0e+12 steps, ") BEFORE),
    /* 3. A long literal needle, through the plain search and through the matcher. */
    STOPPED("long_literal_needle_plain",
            "local hay = string.rep('a', 1000000)\n"
            "local needle = string.rep('a', 500000) .. 'b'\n" ENCODE_ONCE("local i = hay:find(needle)"),
            "",
            "hang.lua:5: policy 'hang' " REFUSED("string.find of a plain needle of 500001 bytes in a "
                                                 "string of 1000000 bytes could take up to 1500002 "
                                                 "steps, ") BEFORE),
    STOPPED("long_literal_needle_pattern",
            "local hay = string.rep('a', 1000000)\n"
            "local needle = string.rep('a', 500000) .. 'b.'\n" ENCODE_ONCE("local i = hay:find(needle)"),
            "",
            "hang.lua:5: policy 'hang' " REFUSED("string.find('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..."
                                                 "', a pattern of 500002 bytes) on a string of 1000000 "
                                                 "bytes could take up to "),
            BEFORE),
    /* ... and the multi-megabyte needle itself cannot be made. */
    STOPPED("multi_megabyte_needle",
            "local hay = string.rep('a', 16 * 1024 * 1024)\n"
            "local needle = string.rep('a', 8 * 1024 * 1024) .. 'b'\n"
            "return { encode = function(ctx) hay:find(needle) return 'bf16' end }\n",
            "", "hang.lua:1: policy 'hang' tried to make a string of 16 MiB, " STRING_CAP ", while loading"),
    /* 4. plain = true with a needle of a megabyte. */
    STOPPED("plain_find_long_needle",
            "local hay = string.rep('a', 1000000)\n"
            "local needle = string.rep('a', 500000) .. '%b'\n" ENCODE_LOOP("hay:find(needle, 1, true)"),
            "",
            "hang.lua:5: policy 'hang' " REFUSED("string.find of a plain needle of 500002 bytes in a "
                                                 "string of 1000000 bytes could take up to 1500003 "
                                                 "steps, ") BEFORE),
    /* 5. A [set] of a megabyte: every character of the subject is tried against all of it. */
    STOPPED("huge_set_class",
            "local hay = string.rep('a', 1000000)\n"
            "local set = '[' .. string.rep('b', 999000) .. ']'\n" ENCODE_ONCE("local i = hay:find(set)"),
            "",
            "hang.lua:5: policy 'hang' " REFUSED("string.find('[bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb...', "
                                                 "a pattern of 999002 bytes) on a string of 1000000 bytes "
                                                 "could take up to "),
            BEFORE),
    /* 6. load() fed whitespace by a reader function that never ends. */
    STOPPED("load_reader_of_whitespace",
            "local piece = string.rep(' ', 1024 * 1024)\n" ENCODE_ONCE(
                "local f, msg = load(function() return piece end)"),
            "",
            "hang.lua:4: policy 'hang' hit the limit of 1 MiB of source for load() (policy_limits."
            "string_kib) in hook 'encode'"),
    /* 8 MB pieces are over the string cap already. */
    STOPPED("load_reader_of_8_mb_pieces",
            "local piece = string.rep(' ', 8 * 1024 * 1024)\n"
            "return { encode = function(ctx) load(function() return piece end) return 'bf16' end }\n",
            "", "hang.lua:1: policy 'hang' tried to make a string of 8 MiB, " STRING_CAP),
    /* 7. Comparing long strings in a loop: each `<` is one instruction of a megabyte. */
    STOPPED("long_string_comparisons",
            "local a = string.rep('x', 1024 * 1024)\n"
            "local b = string.rep('x', 1024 * 1024)\n"
            "return {\n"
            "  encode = function(ctx)\n"
            "    local n = 0\n"
            "    while true do\n"
            "      if a < b or a == b .. '' then n = n + 1 end\n"
            "    end\n"
            "  end,\n"
            "}\n",
            "", "policy 'hang' " HOOK_TIME, "hang.lua:"),
    STOPPED("long_string_of_10_mib",
            "local a = string.rep('x', 10 * 1024 * 1024)\n"
            "return { encode = function(ctx) return a < a and 'bf16' or 'bf16' end }\n",
            "", "hang.lua:1: policy 'hang' tried to make a string of 10 MiB, " STRING_CAP),
    /* 8. utf8.len of a long string in a loop. */
    STOPPED("utf8_len_loop", "local s = string.rep('x', 1024 * 1024)\n" ENCODE_LOOP("utf8.len(s)"), "",
            "hang.lua:4: policy 'hang' " HOOK_TIME),
    /* 9. table.sort of a million elements in a loop (each comparison is charged). */
    STOPPED("sort_a_million",
            "local t = {}\n"
            "for i = 1, 1000000 do t[i] = (i * 7919) % 1000003 end\n" ENCODE_LOOP("table.sort(t)"),
            "", "hang.lua:5: policy 'hang' " BUDGET),
    /* 10. print() of megabytes in a loop: the output is capped (under 16 KiB), the loop stopped by the budget. */
    {"print_flood",
     "local s = string.rep('p', 1024 * 1024)\n" ENCODE_LOOP("print(s, s)"),
     "",
     2,
     20,
     {"policy hang: further print() output suppressed (the print at ",
      "hang.lua:4 would pass the 64 KiB of output a policy may print in a run, "
      "policy_limits.print_kib)",
      "hang.lua:4: policy 'hang' " BUDGET},
     16u << 10},
    /* Small prints pass until the cap, then one line says the rest is suppressed; the run succeeds. */
    {"print_cap_small_prints",
     ENCODE_ONCE("for i = 1, 100000 do print('line', i) end"),
     "policy_limits: {print_kib: 1}\n",
     0,
     0,
     {"policy hang: line\t1\n", "further print() output suppressed"},
     8u << 10},
    /* 11. Other C functions that did unbounded work per instruction. */
    STOPPED("table_concat_loop",
            "local t = {}\n"
            "for i = 1, 1000000 do t[i] = '' end\n" ENCODE_LOOP("table.concat(t)"),
            "", "hang.lua:5: policy 'hang' " HOOK_TIME),
    STOPPED("refused_string_rep_loop", ENCODE_LOOP("pcall(string.rep, 'x', 30000000)"), "",
            "hang.lua:3: policy 'hang' " HOOK_TIME),
    STOPPED("next_over_empty_slots",
            "local t = {}\n"
            "for i = 1, 1000000 do t[i] = true end\n"
            "for i = 1, 999999 do t[i] = nil end\n" ENCODE_LOOP("next(t)"),
            "", "hang.lua:6: policy 'hang' " HOOK_TIME),
    /* An empty pattern matches a million times; each match reads the whole replacement. */
    STOPPED("gsub_long_replacement",
            "local s = string.rep('y', 1000000)\n"
            "local r = string.rep('%0', 400000)\n" ENCODE_ONCE("local out = s:gsub('', r)"),
            "", "hang.lua:5: policy 'hang' " REFUSED("string.gsub('') on a string of 1000000 bytes"), BEFORE),
    STOPPED("endless_loop_while_loading",
            "local a = string.rep('x', 1024 * 1024)\n"
            "while true do local _ = a < a end\n"
            "return {}\n",
            "policy_limits: {hook_ms: 100}\n",
            "hang.lua:2: policy 'hang' hit its time limit of 1000 ms per call (policy_limits.hook_ms; "
            "loading gets 10x) while loading"),
};

/* The scenario's policy_limits keys. */
static hang_case limit_cases[] = {
    /* The run budget: many calls, each under hook_ms, add up past run_s. */
    STOPPED("run_budget",
            "local s = string.rep('x', 1024 * 1024)\n"
            "return {\n"
            "  encode = function(ctx)\n"
            "    local n = ctx.request.prompt_tokens\n"
            "    for i = 1, 10 do n = n + utf8.len(s) end\n"
            "    return 'bf16'\n"
            "  end,\n"
            "}\n",
            "policy_limits: {run_s: 0.3}\n",
            "policy 'hang' hit its time limit of 0.3 s for the whole run (policy_limits.run_s) in hook "
            "'encode'"),
    /* hook_ms is a scenario key, checked like any other. */
    STOPPED("hook_ms_out_of_range", "return {}\n", "policy_limits: {hook_ms: 1}\n",
            "s.yaml:9:26: policy_limits.hook_ms: 1 is out of range [10, 1e+09]"),
    STOPPED("unknown_key", "return {}\n", "policy_limits: {hook_s: 1}\n",
            "unknown key 'policy_limits.hook_s' in policy_limits (did you mean 'hook_ms'?)"),
    /* The instruction budget and the memory cap are keys too. */
    STOPPED("instructions", "return { encode = function(ctx)\n  local n = 0\n  while true do n = n + 1 end\nend }\n",
            "policy_limits: {instructions: 5000}\n",
            "hang.lua:3: policy 'hang' used up its instruction budget (5000 per call)"),
    STOPPED("memory_mib", "local t = {}\nfor i = 1, 300000 do t[i] = i end\nreturn {}\n",
            "policy_limits: {memory_mib: 2}\n",
            "hang.lua:2: policy 'hang' exceeded its memory cap of 2 MiB while loading"),
};

ParameterizedTestParameters(hang, stops)
{
    return cr_make_param_array(hang_case, hang_cases, sizeof hang_cases / sizeof hang_cases[0]);
}

ParameterizedTest(hang_case *c, hang, stops, .timeout = 60)
{
    expect_case(c);
}

ParameterizedTestParameters(limits, keys)
{
    return cr_make_param_array(hang_case, limit_cases, sizeof limit_cases / sizeof limit_cases[0]);
}

ParameterizedTest(hang_case *c, limits, keys, .timeout = 60)
{
    expect_case(c);
}

/* Determinism: the wall-clock budgets never change a run that stays under them. */
Test(limits, time_budgets_do_not_change_results, .timeout = 120)
{
    const char *policy = "return {\n"
                         "  encode = function(ctx)\n"
                         "    local t = {}\n"
                         "    for i = 1, 200 do t[i] = (i * 37) % 101 end\n"
                         "    table.sort(t)\n"
                         "    local ok, e = xpcall(error, function(m) return 'handled' end, 'x')\n"
                         "    assert(not ok and e == 'handled')\n"
                         "    local name = ('int%d'):format(ctx.request.prompt_tokens > 100 and 8 or 4)\n"
                         "    local enc = { bits = tonumber(name:match('%d+')), group_size = 32 }\n"
                         "    return { key = enc, value = enc }\n"
                         "  end,\n"
                         "}\n";
    char *texts[2];
    const char *extras[2] = {"", "policy_limits: {hook_ms: 1e9, run_s: 1e9}\n"};
    for (int k = 0; k < 2; k++) {
        char *dir = kvt_tempdir();
        char *path = kvt_write(dir, "hang.lua", policy);
        char *s = write_scenario(dir, path, extras[k]);
        char *out = NULL, *csv = NULL;
        int rc = run_kvsim(s, dir, &out);
        cr_assert_eq(rc, 0, "%s", out);
        cr_assert(asprintf(&csv, "%s/out/requests.csv", dir) > 0);
        texts[k] = kvt_read(csv, NULL);
        cr_assert_not_null(texts[k]);
        free(csv);
        free(out);
        free(s);
        free(path);
        kvt_rmtree(dir);
        free(dir);
    }
    cr_expect_str_eq(texts[0], texts[1]);
    free(texts[0]);
    free(texts[1]);
}

/* xpcall keeps its meaning: results on success, the handler's value on error, the handler hooked. */
Test(limits, xpcall_semantics, .timeout = 60)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "x.lua",
                           "local ok, a, b = xpcall(function(x, y) return x + y, 'two' end, print, 1, 2)\n"
                           "assert(ok == true and a == 3 and b == 'two')\n"
                           "local ok2, e = xpcall(error, function(m) return 'got ' .. m end, 'boom', 0)\n"
                           "assert(ok2 == false and e == 'got boom', e)\n"
                           "local ok3, e3 = xpcall(error, function(m) error('again') end, 'x')\n"
                           "assert(ok3 == false and e3 == 'error in error handling', e3)\n"
                           "local ok4, e4 = pcall(xpcall, error)\n"
                           "assert(not ok4)\n"
                           "return { speculate = function(ctx) return 2 end }\n");
    kv_policy_destroy(kvt_policy_load(path, NULL, 0));
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
