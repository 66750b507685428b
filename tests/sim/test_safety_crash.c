/* test_safety_crash.c — issue #17's crashes and non-determinism: Lynx planes arriving in either order,
 * kvsim eval's length arithmetic on small and large accuracy.* values, and a fixed pairs()/next() order. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "core/base/alloc.h"
#include "core/accuracy/eval.h"
#include "core/policy/policy_sandbox.h"
#include "core/study/study.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

/* ---- Lynx: every legal variant completes, token 1 only once both planes are in -------------------------- */

/* Four requests that overlap on one prefill and one decode node; the policy is policies/lynx.lua. */
static char *lynx_scenario(const char *dir)
{
    char *policy = kvt_source("policies/lynx.lua"), body[2048];
    snprintf(body, sizeof body,
             "name: lynx-variants\nseed: 7\nmodel: llama-3.1-8b\n"
             "cluster:\n  prefill: {nodes: 1, device: h100-sxm}\n  decode: {nodes: 1, device: h100-sxm, max_batch: 8}\n"
             "network: {model: ideal, nic_bandwidth_gbps: 25, nic_latency_us: 5}\n"
             "workload:\n  requests: 4\n  arrival: poisson\n  rate_per_s: 20\n"
             "  prompt: {dist: uniform, min: 2048, max: 6144}\n  output: {dist: fixed, value: 24}\n"
             "lynx: {from: scenario, acceptance: 0.7, ttkt_k: 4}\n"
             "policies: [lynx]\npolicy:\n  lynx: {file: %s}\n",
             policy);
    free(policy);
    return kvt_write(dir, "lynx-variants.yaml", body);
}

Test(safety_crash, lynx_variants_never_abort_and_commit_token_1_with_the_whole_kv, .timeout = 600)
{
    char *dir = kvt_tempdir(), *path = lynx_scenario(dir);
    static const char *const networks[] = {"ideal", "simgrid"}, *const orders[] = {"concurrent", "anchor_first"},
                             *const priorities[] = {"none", "strict"}, *const layerwise[] = {"false", "true"};
    static const int speculate[] = {0, 1, 8};
    int runs = 0, residual_first = 0;
    for (int n = 0; n < 2; n++)
        for (int s = 0; s < 3; s++)
            for (int a = 1; a <= 7; a++)
                for (int o = 0; o < 2; o++)
                    for (int p = 0; p < 2; p++)
                        for (int l = 0; l < 2; l++) {
                            char sets[6][64];
                            snprintf(sets[0], sizeof sets[0], "network.model=%s", networks[n]);
                            snprintf(sets[1], sizeof sets[1], "policy.lynx.speculate=%d", speculate[s]);
                            snprintf(sets[2], sizeof sets[2], "policy.lynx.anchor_bits=%d", a);
                            snprintf(sets[3], sizeof sets[3], "policy.lynx.order=%s", orders[o]);
                            snprintf(sets[4], sizeof sets[4], "policy.lynx.priority=%s", priorities[p]);
                            snprintf(sets[5], sizeof sets[5], "policy.lynx.layerwise=%s", layerwise[l]);
                            const char *set[6] = {sets[0], sets[1], sets[2], sets[3], sets[4], sets[5]};
                            char what[400];
                            snprintf(what, sizeof what, "%s, %s, %s, %s, %s, %s", set[0], set[1], set[2], set[3],
                                     set[4], set[5]);
                            kv_error err = {0};
                            kv_scenario *sc = NULL;
                            kv_study *st = NULL;
                            cr_assert_eq(kv_scenario_load(path, set, 6, &sc, &err), 0, "%s: %s", what, err.msg);
                            cr_assert_eq(kv_study_prepare(sc, &st, &err), 0, "%s: %s", what, err.msg);
                            cr_assert_eq(kv_study_run(st, &err), 0, "%s: %s", what, err.msg);
                            size_t n_out;
                            const kv_policy_outcome *out = kv_study_outcomes(st, &n_out);
                            cr_assert_eq(n_out, 1);
                            const kv_run_result *run = &out[0].run;
                            cr_assert_eq(run->n_requests, 4, "%s", what);
                            for (size_t i = 0; i < run->n_requests; i++) {
                                const kv_request_result *q = &run->requests[i];
                                cr_assert(q->done_s > 0, "%s: request %zu never finished", what, i);
                                /* Token 1 is committed when the whole KV is in, never before either plane. */
                                cr_assert(q->kv_arrived_s >= q->anchor_arrived_s, "%s: request %zu: kv %.9g < anchor %.9g",
                                          what, i, q->kv_arrived_s, q->anchor_arrived_s);
                                cr_assert_eq(q->first_token_s, q->kv_arrived_s, "%s: request %zu", what, i);
                                cr_assert(q->accepted_tokens <= q->spec_tokens, "%s", what);
                                if (speculate[s] == 0)
                                    cr_assert_eq(q->spec_tokens, 0, "%s", what);
                                residual_first += q->residual_bytes < q->anchor_bytes && o == 0 && p == 0;
                            }
                            kv_study_destroy(st);
                            kv_scenario_destroy(sc);
                            runs++;
                        }
    cr_assert_eq(runs, 2 * 3 * 7 * 2 * 2 * 2);
    cr_assert_gt(residual_first, 0, "no variant had a residual smaller than its anchor on concurrent flows");
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- kvsim eval: lengths that leave no room, or sum past int, are bad input before any work ------------ */

static char *eval_scenario(const char *dir, const char *model, const char *text, int needle_tokens)
{
    char body[2048];
    snprintf(body, sizeof body,
             "seed: 3\nmodel: smollm2-135m\npolicies: [bf16, lynx]\naccuracy:\n  model: %s\n  texts: [%s]\n  context_tokens: 48\n"
             "  score_tokens: 8\n  generate_tokens: 4\n  speculation_points: 2\n"
             "  needle: {count: 3, context_tokens: %d}\n",
             model, text, needle_tokens);
    return kvt_write(dir, "scenario.yaml", body);
}

static int eval_exit(const char *sc, char **out)
{
    char args[1200];
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    return kvt_kvsim(args, out);
}

Test(safety_crash, eval_needle_context_below_the_needle_exits_2_naming_the_key_and_its_minimum, .timeout = 120)
{
    char *dir = kvt_tempdir(), *model = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir), *out = NULL;
    /* 64 tokens (the loader's floor) hold no filler: the tiny vocabulary spells the question nearly byte by byte. */
    char *sc = eval_scenario(dir, model, text, 64);
    int rc = eval_exit(sc, &out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    char where[700];
    snprintf(where, sizeof where, "%s:11:", sc); /* the needle line */
    cr_assert(strstr(out, where), "no position '%s' in:\n%s", where, out);
    const char *key = strstr(out, "accuracy.needle.context_tokens: 64 leaves no room");
    cr_assert(key, "%s", out);
    const char *least = strstr(key, "it must be at least ");
    cr_assert(least, "%s", out);
    int min = atoi(least + strlen("it must be at least "));
    cr_assert_gt(min, 64, "%s", out);
    cr_assert_null(strstr(out, "AddressSanitizer"), "%s", out);
    free(out);
    free(sc);
    /* The minimum it names is exact: one less is refused the same way, the minimum itself runs. */
    sc = eval_scenario(dir, model, text, min - 1);
    cr_assert_eq(eval_exit(sc, &out), 2, "%s", out);
    cr_assert(strstr(out, "leaves no room"), "%s", out);
    free(out);
    free(sc);
    sc = eval_scenario(dir, model, text, min);
    rc = eval_exit(sc, &out);
    cr_assert_eq(rc, 0, "at the minimum %d, exit %d:\n%s", min, rc, out);
    cr_assert(strstr(out, "\nlynx "), "%s", out);
    free(out);
    free(sc);
    free(model);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* The C API: every accuracy.* length, small or near INT_MAX, is KV_EINPUT naming its key (no sum wraps). */
Test(safety_crash, eval_lengths_out_of_range_are_input_errors, .timeout = 120)
{
    char *dir = kvt_tempdir(), *model_path = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0};
    kv_encoding *e_bf = kvt_uniform_encodings(m, (kv_encoding){.key = bf, .value = bf});
    kv_eval_policy pols[] = {{"bf16", e_bf, 0}};
    const char *texts[] = {text};
    const kv_eval_config base = {texts, 1, 48, 12, 6, 1, 200, 0, 3, 7, NULL};
    struct {
        kv_eval_config cfg;
        const char *key;
    } cases[] = {
        {base, ""},
        {base, "accuracy.needle.context_tokens: 64 leaves no room"},
        {base, "accuracy.needle.context_tokens: 2147483647 + generate_tokens 6 must fit"},
        {base, "accuracy.needle.context_tokens: 2147483641 + generate_tokens 6 must fit"},
        {base, "accuracy.score_tokens: 2147483647"},
        {base, "accuracy.context_tokens: 2147483647 must be in 1..512"},
        {base, "accuracy.generate_tokens: 2147483647 must be in 0..512"},
        {base, "accuracy.generate_tokens: -1"},
        {base, "accuracy.needle.context_tokens: 0 + generate_tokens"},
        {base, "accuracy.speculative_positions: 257"},
    };
    cases[1].cfg.needle_context_tokens = 64;
    cases[2].cfg.needle_context_tokens = 2147483647;
    cases[3].cfg.needle_context_tokens = 2147483641;
    cases[4].cfg.score_tokens = 2147483647;
    cases[5].cfg.context_tokens = 2147483647;
    cases[6].cfg.generate_tokens = 2147483647;
    cases[7].cfg.generate_tokens = -1;
    cases[8].cfg.needle_context_tokens = 0;
    cases[9].cfg.speculative_positions = 257;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv_eval_result *r = NULL;
        int rc = kv_eval_run(m, &cases[i].cfg, pols, 1, &r, &err);
        if (!cases[i].key[0]) {
            cr_assert_eq(rc, KV_OK, "case %zu: %s", i, err.msg);
            cr_assert_eq(r->prompts_needle, 1);
            kv_eval_result_destroy(r);
            continue;
        }
        cr_assert_eq(rc, KV_EINPUT, "case %zu (%s) gave %d: %s", i, cases[i].key, rc, rc ? err.msg : "ok");
        cr_assert(strstr(err.msg, cases[i].key), "case %zu: '%s' not in: %s", i, cases[i].key, err.msg);
        cr_assert_null(r);
    }
    kv_free(e_bf);
    kv_model_destroy(m);
    free(model_path);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* A policy's own k (up to 4096) on a model whose context holds it: speculations split into batches of
   bounded logits, each measured; k past the context skips the speculation instead of reading past it. */
Test(safety_crash, eval_large_policy_speculation_is_bounded, .timeout = 300)
{
    char *dir = kvt_tempdir(), *model_path = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0}, ly = {KV_TENSOR_INT, 8, 4, 16, 0};
    kv_encoding *e_bf = kvt_uniform_encodings(m, (kv_encoding){.key = bf, .value = bf});
    kv_encoding *e_ly = kvt_uniform_encodings(m, (kv_encoding){.key = ly, .value = ly});
    /* 3 lynx rows x 3 prompt lengths at k = 400 (a 48-token prompt + 400 fits 512): 9 jobs, > 2048 rows. */
    kv_eval_policy pols[] = {{"bf16", e_bf, 0}, {"a", e_ly, 400}, {"b", e_ly, 400}, {"c", e_ly, 400},
                             {"far", e_ly, 4096}};
    const char *texts[] = {text};
    kv_eval_config cfg = {texts, 1, 48, 4, 2, 0, 64, 0, 3, 7, NULL};
    kv_eval_result *r = NULL;
    cr_assert_eq(kv_eval_run(m, &cfg, pols, 5, &r, &err), KV_OK, "%s", err.msg);
    for (int i = 0; i < r->n_rows; i++) {
        const kv_eval_row *row = &r->rows[i];
        if (row->anchor_view || row->reference)
            continue;
        if (strcmp(row->name, "far") == 0)
            cr_assert_eq(row->spec_samples, 0, "k = 4096 cannot fit a 512-token context");
        else
            cr_assert_eq(row->spec_samples, 3, "%s: %ld", row->name, row->spec_samples);
    }
    kv_eval_result_destroy(r);
    kv_free(e_bf);
    kv_free(e_ly);
    kv_model_destroy(m);
    free(model_path);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- pairs() and next(): one key order on every run ---------------------------------------------------- */

static const kv_sandbox_limits order_limits = {
    .mem_cap_bytes = 64u << 20,
    .string_cap_bytes = 1u << 20,
    .instructions_per_call = 100000000,
    .hook_ns = 60000000000,
    .run_ns = 600000000000,
    .print_cap_bytes = 1024,
};

/* Runs `chunk` (named order.lua; it returns one string) in a fresh sandbox with `lim`; returns that string,
   or "ERROR: <limit> | <message>" (free it). */
static char *order_run(const char *chunk, const kv_sandbox_limits *lim)
{
    kv_sandbox sb;
    char msg[512];
    cr_assert_eq(kv_sandbox_open(&sb, "t", lim, msg, sizeof msg), 0, "%s", msg);
    lua_State *L = sb.L;
    cr_assert_eq(luaL_loadbuffer(L, chunk, strlen(chunk), "=order.lua"), LUA_OK, "%s", lua_tostring(L, -1));
    kv_sandbox_arm(&sb, lim->instructions_per_call, lim->hook_ns);
    int st = lua_pcall(L, 0, 1, 0);
    kv_sandbox_disarm(&sb);
    char *out;
    if (st == LUA_OK && sb.limit == KV_SB_OK && lua_type(L, -1) == LUA_TSTRING) {
        out = strdup(lua_tostring(L, -1));
    } else {
        char what[400] = "";
        if (sb.limit != KV_SB_OK)
            kv_sandbox_describe_limit(&sb, what, sizeof what);
        const char *e = lua_tostring(L, -1);
        size_t len = strlen(what) + (e ? strlen(e) : 0) + 64;
        out = malloc(len);
        snprintf(out, len, "ERROR: %s%s | %s", what, st == LUA_ERRMEM ? "(memory)" : "", e ? e : "?");
    }
    kv_sandbox_close(&sb);
    return out;
}

/* Builds t from `insert` (a Lua statement list over t), then lists its keys through pairs and through
   next; returns "pairs-list / next-list". */
static char *order_of(const char *insert)
{
    char chunk[4096];
    snprintf(chunk, sizeof chunk,
             "local t = {}\n%s\n"
             "local function name(k)\n"
             "  if type(k) == 'string' then return 's:' .. (k:gsub('%%z', '0')) end\n"
             "  return tostring(k)\n"
             "end\n"
             "local a, b = {}, {}\n"
             "for k, v in pairs(t) do a[#a + 1] = name(k) end\n"
             "local k = next(t)\n"
             "while k ~= nil do b[#b + 1] = name(k); k = next(t, k) end\n"
             "return table.concat(a, ' ') .. ' / ' .. table.concat(b, ' ')\n",
             insert);
    return order_run(chunk, &order_limits);
}

Test(safety_crash, pairs_and_next_visit_keys_in_the_documented_order)
{
    static const char *const inserts[] = {
        "t[1] = 1; t[2] = 1; t[3] = 1; t[5] = 1; t[10] = 1; t[0] = 1; t[-2] = 1; t[2.5] = 1; t[-0.5] = 1\n"
        "t[2^70] = 1; t[math.mininteger] = 1; t.b = 1; t.a = 1; t.ab = 1; t.B = 1; t[''] = 1; t['a\\0'] = 1\n"
        "t[true] = 1; t[false] = 1",
        /* the same keys, inserted the other way round */
        "t[false] = 1; t[true] = 1; t['a\\0'] = 1; t[''] = 1; t.B = 1; t.ab = 1; t.a = 1; t.b = 1\n"
        "t[math.mininteger] = 1; t[2^70] = 1; t[-0.5] = 1; t[2.5] = 1; t[-2] = 1; t[0] = 1; t[10] = 1\n"
        "t[5] = 1; t[3] = 1; t[2] = 1; t[1] = 1",
    };
    const char *order = "1 2 3 -9223372036854775808 -2 -0.5 0 2.5 5 10 1.1805916207174e+21 s: s:B s:a s:a0 s:ab s:b "
                        "false true";
    char want[512];
    snprintf(want, sizeof want, "%s / %s", order, order);
    /* Every sandbox has its own string hash seed: several states, both insertion orders. */
    for (int run = 0; run < 5; run++)
        for (int i = 0; i < 2; i++) {
            char *got = order_of(inserts[i]);
            cr_assert_str_eq(got, want, "run %d, insertion %d", run, i);
            free(got);
        }
    /* Many string keys: sorted bytewise, both ways. */
    char *got = order_of("for i = 1, 300 do t[string.format('k%03d', 301 - i)] = i end");
    char expect[8192] = "", part[16];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i <= 300; i++) {
            snprintf(part, sizeof part, "%ss:k%03d", i > 1 ? " " : "", i);
            strcat(expect, part);
        }
        if (pass == 0)
            strcat(expect, " / ");
    }
    cr_assert_str_eq(got, expect);
    free(got);
}

Test(safety_crash, pairs_allows_assigning_existing_fields_while_traversing)
{
    /* Clearing the current key, clearing a later one, and overwriting values: as in Lua. */
    char *got = order_run("local t = {a = 1, b = 2, c = 3, d = 4}\n"
                          "local seen = {}\n"
                          "for k, v in pairs(t) do\n"
                          "  seen[#seen + 1] = k .. v\n"
                          "  t[k] = nil\n"
                          "  if k == 'a' then t.c = nil end\n"
                          "  if k == 'b' then t.d = 40 end\n"
                          "end\n"
                          "local u = {x = 1, y = 2, z = 3}\n"
                          "local k = next(u)\n"
                          "while k ~= nil do seen[#seen + 1] = k; u[k] = nil; k = next(u, k) end\n"
                          "return table.concat(seen, ',') .. ' left ' .. tostring(next(t)) .. tostring(next(u))\n",
                          &order_limits);
    cr_assert_str_eq(got, "a1,b2,d40,x,y,z left nilnil");
    free(got);
    /* __pairs is still honoured. */
    got = order_run("local t = setmetatable({}, {__pairs = function(t) return function(_, k) if not k then return 7, 8 end end, t, nil end})\n"
                    "local s = ''\nfor k, v in pairs(t) do s = s .. k .. v end\nreturn s\n",
                    &order_limits);
    cr_assert_str_eq(got, "78");
    free(got);
}

Test(safety_crash, pairs_refuses_keys_without_a_fixed_order_at_the_policy_line)
{
    static const struct {
        const char *chunk, *want;
    } cases[] = {
        {"local t = {[{}] = 1}\nfor k in pairs(t) do end\nreturn ''", "order.lua:2: pairs() over a table with a table as a key"},
        {"local t = {a = 1, [print] = 2}\n\nlocal k = next(t)\nreturn ''", "order.lua:3: next() over a table with a function as a key"},
        {"local t = {a = 1}\nreturn tostring(next(t, 'zz'))", "order.lua:2: invalid key to 'next'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = order_run(cases[i].chunk, &order_limits);
        cr_assert(strstr(got, cases[i].want), "case %zu: '%s' not in: %s", i, cases[i].want, got);
        free(got);
    }
}

Test(safety_crash, pairs_snapshots_count_against_the_budget_and_the_memory_cap)
{
    kv_sandbox_limits lim = order_limits;
    lim.instructions_per_call = 1000000;
    /* 20000 keys: each pairs() is charged n (1 + log2 n), so 4 traversals pass a million instructions. */
    char *got = order_run("local t = {}\nfor i = 1, 20000 do t['k' .. i] = i end\n"
                          "for r = 1, 4 do for k in pairs(t) do end end\nreturn 'done'",
                          &lim);
    cr_assert(strstr(got, "ERROR: ") && strstr(got, "instruction"), "%s", got);
    free(got);
    got = order_run("local t = {}\nfor i = 1, 20000 do t['k' .. i] = i end\nfor k in pairs(t) do end\nreturn 'done'",
                    &order_limits);
    cr_assert_str_eq(got, "done");
    free(got);
    /* The snapshot is Lua memory: a table that fits the cap but whose snapshot does not fails as memory. */
    lim = order_limits;
    lim.mem_cap_bytes = 8u << 20;
    got = order_run("local t = {}\nfor i = 1, 100000 do t[i * 2] = true end\n"
                    "local before = collectgarbage('count')\n"
                    "for k in pairs(t) do end\nreturn 'fit ' .. before",
                    &lim);
    cr_assert(strstr(got, "not enough memory") || strstr(got, "(memory)"), "%s", got);
    free(got);
}

/* A policy whose bits follow pairs() order over string keys (its own table and ctx.params): byte-identical
   results.json over five runs of kvsim. */
Test(safety_crash, pairs_order_gives_byte_identical_results, .timeout = 300)
{
    char *dir = kvt_tempdir();
    char *lua = kvt_write(dir, "order.lua",
                          "local choices = {alpha = 8, bravo = 4, charlie = 2, delta = 3, echo = 5, foxtrot = 6, golf = 7,\n"
                          "                 hotel = 8, india = 3, juliet = 4, kilo = 6, lima = 2}\n"
                          "local order = {}\n"
                          "for _, v in pairs(choices) do order[#order + 1] = v end\n"
                          "return {\n"
                          "  params = {zulu = 8, yankee = 4, xray = 2, whiskey = 6, victor = 3},\n"
                          "  encode = function(ctx)\n"
                          "    local first\n"
                          "    for k, v in pairs(ctx.params) do first = first or v end\n"
                          "    local b = order[(ctx.layer * 3 + ctx.head) % #order + 1]\n"
                          "    return { key = { bits = b }, value = { bits = (ctx.layer % 2 == 0) and first or b } }\n"
                          "  end,\n"
                          "}\n");
    char body[2048];
    snprintf(body, sizeof body,
             "name: order\nmodel: llama-3-8b\nseed: 1\nnetwork: {model: ideal}\n"
             "workload: {requests: 4, arrival: poisson, rate_per_s: 4, prompt: {dist: fixed, value: 512}, "
             "output: {dist: fixed, value: 8}}\n"
             "policies: [order]\npolicy:\n  order: {file: %s}\n",
             lua);
    char *sc = kvt_write(dir, "order.yaml", body);
    char *first = NULL;
    size_t first_len = 0;
    for (int run = 0; run < 5; run++) {
        char args[1200], *out = NULL, path[700];
        snprintf(args, sizeof args, "run %s --quiet --out %s/out%d", sc, dir, run);
        int rc = kvt_kvsim(args, &out);
        cr_assert_eq(rc, 0, "run %d exit %d:\n%s", run, rc, out);
        free(out);
        snprintf(path, sizeof path, "%s/out%d/results.json", dir, run);
        size_t len = 0;
        char *json = kvt_read(path, &len);
        cr_assert_not_null(json, "%s", path);
        if (!first) {
            first = json;
            first_len = len;
            continue;
        }
        cr_assert(len == first_len && memcmp(json, first, len) == 0, "run %d: results.json differs from run 0", run);
        free(json);
    }
    free(first);
    free(sc);
    free(lua);
    kvt_rmtree(dir);
    free(dir);
}
