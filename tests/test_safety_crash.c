/* test_safety_crash.c — issue #17's crashes and non-determinism: Lynx planes arriving in either order,
 * kvsim eval's length arithmetic on small and large accuracy.* values, and a fixed pairs()/next() order. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/study.h"
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
