/* test_safety_crash.c — issue #17's crashes and non-determinism: Lynx planes arriving in either order,
 * kvsim eval's length arithmetic on small and large accuracy.* values, and a fixed pairs()/next() order. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/model/eval.h"
#include "core/study.h"
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

static char *eval_text(const char *dir)
{
    char *text = calloc(1, 40000);
    for (int i = 0; i < 300; i++)
        strcat(text, i % 3 ? "the cat sat on the mat and then it ran to the tower. " : "in the evening, winds rose.\n");
    char *path = kvt_write(dir, "text.txt", text);
    free(text);
    return path;
}

static char *eval_scenario(const char *dir, const char *model, const char *text, int needle_tokens)
{
    char body[2048];
    snprintf(body, sizeof body,
             "seed: 3\npolicies: [bf16, lynx]\naccuracy:\n  model: %s\n  texts: [%s]\n  context_tokens: 48\n"
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
    char *dir = kvt_tempdir(), *model = kvt_tiny_model_file(dir, 5), *text = eval_text(dir), *out = NULL;
    /* 64 tokens (the loader's floor) hold no filler: the tiny vocabulary spells the question nearly byte by byte. */
    char *sc = eval_scenario(dir, model, text, 64);
    int rc = eval_exit(sc, &out);
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    char where[700];
    snprintf(where, sizeof where, "%s:10:", sc); /* the needle line */
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

static kv_encoding *eval_uniform(const kv_model *m, kv_encoding e)
{
    const kv_model_config *c = kv_model_get_config(m);
    size_t n = (size_t)c->n_layers * c->n_kv_heads;
    kv_encoding *out = kv_calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++)
        out[i] = e;
    return out;
}

/* The C API: every accuracy.* length, small or near INT_MAX, is KV_EINPUT naming its key (no sum wraps). */
Test(safety_crash, eval_lengths_out_of_range_are_input_errors, .timeout = 120)
{
    char *dir = kvt_tempdir(), *model_path = kvt_tiny_model_file(dir, 5), *text = eval_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0};
    kv_encoding *e_bf = eval_uniform(m, (kv_encoding){.key = bf, .value = bf});
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
    char *dir = kvt_tempdir(), *model_path = kvt_tiny_model_file(dir, 5), *text = eval_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0}, ly = {KV_TENSOR_INT, 8, 4, 16, 0};
    kv_encoding *e_bf = eval_uniform(m, (kv_encoding){.key = bf, .value = bf});
    kv_encoding *e_ly = eval_uniform(m, (kv_encoding){.key = ly, .value = ly});
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
