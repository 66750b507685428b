/* test_placement.c — decode placement with KV in flight, N-1 decode steps, exact layer-wise flow bytes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/policy.h"
#include "core/study/study.h"
#include "tests/support.h"

#define BURST "tests/fixtures/scenarios/burst-placement.yaml"
#define MIXED "tests/fixtures/scenarios/burst-mixed.yaml"
#define ONE "tests/fixtures/scenarios/one-request.yaml"
#define LYNX_ONE "tests/fixtures/scenarios/lynx-one.yaml"

typedef struct run {
    kv_scenario *s;
    kv_study *st;
    const kv_policy_outcome *o;
    size_t n;
} run;

static void run_start(run *r, const char *path, const char **sets, int n_sets)
{
    kv_error err = {0};
    memset(r, 0, sizeof *r);
    cr_assert_eq(kv_scenario_load(path, sets, n_sets, &r->s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(r->s, &r->st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(r->st, &err), 0, "%s", err.msg);
    r->o = kv_study_outcomes(r->st, &r->n);
}

static void run_free(run *r)
{
    kv_study_destroy(r->st);
    kv_scenario_destroy(r->s);
}

static const kv_policy_outcome *outcome(const run *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->o[i].name, name) == 0)
            return &r->o[i];
    cr_assert_fail("no policy %s in the run", name);
    return NULL;
}

static const kv_policy_request req1 = {1, 1000, 10, 0.0};

/* ---- The default rule and what hooks see ---------------------------------------------------- */

Test(placement, default_counts_requests_in_flight)
{
    kv_error err = {0};
    kv_policy *p = kvt_policy_load("policies/bf16.lua", NULL, 0);
    /* Node 0 has nothing queued or running but three requests' KV on its way: node 1 is less loaded. */
    kv_policy_node nodes[] = {{.index = 0, .kv_free_bytes = 1e9, .incoming = 3, .kv_reserved_bytes = 3e8},
                              {.index = 1, .running = 2, .kv_free_bytes = 1e9}};
    int n = -1;
    cr_assert_eq(kv_policy_decode_node(p, &req1, nodes, 2, &n, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(n, 1, "picked node %d", n);
    /* Equal load (queued + running + incoming): the lowest index. */
    nodes[1].running = 3;
    cr_assert_eq(kv_policy_decode_node(p, &req1, nodes, 2, &n, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(n, 0, "tie: picked node %d", n);
    kv_policy_destroy(p);
}

Test(placement, decode_node_hook_sees_incoming_and_reserved_bytes)
{
    char *dir = kvt_tempdir();
    char *lua = kvt_write(dir, "inflight.lua",
                          "return {\n"
                          "  decode_node = function(ctx)\n"
                          "    local best = ctx.nodes[1]\n"
                          "    for _, n in ipairs(ctx.nodes) do\n"
                          "      if n.kv_reserved_bytes > best.kv_reserved_bytes then best = n end\n"
                          "    end\n"
                          "    return best.index + 0 * best.incoming\n"
                          "  end,\n"
                          "  prefill_node = function(ctx) return ctx.nodes[1].index + ctx.nodes[1].incoming end,\n"
                          "}\n");
    char *typo = kvt_write(dir, "typo.lua", "return { decode_node = function(ctx) return ctx.nodes[1].incomming end }\n");
    kv_error err = {0};
    kv_policy *p = kvt_policy_load(lua, NULL, 0);
    kv_policy_node nodes[] = {{.index = 0, .incoming = 1, .kv_reserved_bytes = 1e8},
                              {.index = 1, .incoming = 2, .kv_reserved_bytes = 5e8},
                              {.index = 2, .incoming = 0, .kv_reserved_bytes = 0}};
    int n = -1;
    cr_assert_eq(kv_policy_decode_node(p, &req1, nodes, 3, &n, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(n, 1, "the hook saw kv_reserved_bytes: picked %d", n);
    cr_assert_eq(kv_policy_prefill_node(p, &req1, nodes + 2, 1, &n, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(n, 2, "a prefill node's incoming is 0");
    /* The strict node table knows the new fields: a typo names them. */
    kv_policy *q = kvt_policy_load(typo, NULL, 0);
    cr_expect_neq(kv_policy_decode_node(q, &req1, nodes, 3, &n, &err), KV_OK);
    cr_expect(strstr(err.msg, "incoming") != NULL, "%s", err.msg);
    kv_policy_destroy(p);
    kv_policy_destroy(q);
    kvt_rmtree(dir);
    free(dir);
    free(lua);
    free(typo);
}

/* ---- What placement does to a run ------------------------------------------------------------ */

/* 8 prefill nodes hand a 64-request burst to N decode nodes of 8 slots: with the requests whose KV is
   in flight counted, the burst spreads and decode throughput grows with the decode nodes. */
Test(placement, decode_throughput_scales_with_decode_nodes)
{
    double tput[4];
    int nodes[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        char set[64];
        snprintf(set, sizeof set, "cluster.decode.nodes=%d", nodes[i]);
        const char *sets[] = {set, "policies=[bf16]"};
        run r;
        run_start(&r, BURST, sets, 2);
        tput[i] = r.o[0].summary.output_throughput;
        /* Every decode node got its share of the burst. */
        int *per = calloc((size_t)nodes[i], sizeof *per);
        for (size_t k = 0; k < r.o[0].run.n_requests; k++)
            per[r.o[0].run.requests[k].decode_node]++;
        for (int d = 0; d < nodes[i]; d++)
            cr_expect_eq(per[d], 64 / nodes[i], "%d decode nodes: node %d got %d requests", nodes[i], d, per[d]);
        free(per);
        run_free(&r);
        if (i > 0)
            cr_expect_gt(tput[i], tput[i - 1], "%d decode nodes: %.0f tok/s, %d: %.0f tok/s", nodes[i], tput[i],
                         nodes[i - 1], tput[i - 1]);
    }
    cr_expect_geq(tput[1] / tput[0], 1.6, "1 -> 2 decode nodes: x%.2f", tput[1] / tput[0]);
    cr_expect_geq(tput[3] / tput[0], 4.0, "1 -> 8 decode nodes: x%.2f", tput[3] / tput[0]);
}

/* Lynx's committed first token needs the residual: anchor + residual are INT8's bytes, so no request's
   committed TTFT may come before its INT8 TTFT (1 ns for the network's rounding). */
Test(placement, lynx_never_commits_before_int8, .timeout = 300)
{
    const char *nets[] = {"network.model=ideal", "network.model=simgrid"};
    const char *bws[] = {"network.nic_bandwidth_gbps=10", "network.nic_bandwidth_gbps=25",
                         "network.nic_bandwidth_gbps=100", "network.nic_bandwidth_gbps=400"};
    for (int m = 0; m < 2; m++)
        for (int b = 0; b < 4; b++) {
            const char *sets[] = {nets[m], bws[b], "policies=[int8, lynx]"};
            run r;
            run_start(&r, BURST, sets, 3);
            const kv_policy_outcome *i8 = outcome(&r, "int8"), *ly = outcome(&r, "lynx");
            cr_assert_eq(i8->run.n_requests, ly->run.n_requests);
            for (size_t k = 0; k < i8->run.n_requests; k++) {
                const kv_request_result *a = &i8->run.requests[k], *l = &ly->run.requests[k];
                cr_expect_eq(l->anchor_bytes + l->residual_bytes, a->anchor_bytes);
                cr_expect_geq(l->first_token_s - l->arrival_s, a->first_token_s - a->arrival_s - 1e-9,
                              "%s %s: request %zu: lynx ttft %.6f ms < int8 %.6f ms", nets[m], bws[b], k,
                              (l->first_token_s - l->arrival_s) * 1e3, (a->first_token_s - a->arrival_s) * 1e3);
            }
            cr_expect_geq(ly->summary.ttft_ms.mean, i8->summary.ttft_ms.mean - 1e-6, "%s %s: mean", nets[m], bws[b]);
            run_free(&r);
        }
}

/* A faster network never makes a run longer, for every policy (mixed lengths, 4 decode nodes). */
Test(placement, makespan_never_rises_with_bandwidth)
{
    const char *bws[] = {"network.nic_bandwidth_gbps=10", "network.nic_bandwidth_gbps=25",
                         "network.nic_bandwidth_gbps=100", "network.nic_bandwidth_gbps=400"};
    const char *shapes[][2] = {{"cluster.decode.nodes=4", "cluster.prefill.max_batch=1"},
                               {"cluster.decode.nodes=2", "cluster.prefill.max_batch=4"}};
    for (int c = 0; c < 2; c++) {
        double prev[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
        for (int b = 0; b < 4; b++) {
            const char *sets[] = {bws[b], shapes[c][0], shapes[c][1]};
            run r;
            run_start(&r, MIXED, sets, 3);
            cr_assert_eq(r.n, 4);
            for (size_t i = 0; i < r.n; i++) {
                double mk = r.o[i].run.makespan_s;
                cr_expect_leq(mk, prev[i] * (1 + 1e-12), "%s, %s: %s: makespan %.6f s at %s, %.6f s before",
                              shapes[c][0], shapes[c][1], r.o[i].name, mk, bws[b], prev[i]);
                prev[i] = mk;
            }
            run_free(&r);
        }
    }
}

/* ---- N output tokens, N - 1 decode steps ------------------------------------------------------- */

/* The prefill node's last logits give token 1; the decode node makes the other N - 1. */
Test(decode_steps, n_output_tokens_make_n_minus_one_steps)
{
    int outs[] = {1, 2, 5, 17};
    for (int i = 0; i < 4; i++) {
        char set[64];
        snprintf(set, sizeof set, "workload.output.value=%d", outs[i]);
        const char *sets[] = {set};
        run r;
        run_start(&r, ONE, sets, 1);
        for (size_t p = 0; p < r.n; p++) {
            const kv_request_result *q = &r.o[p].run.requests[0];
            cr_expect_eq(r.o[p].run.decode_steps, (uint64_t)(outs[i] - 1), "%s, %d tokens: %llu decode steps",
                         r.o[p].name, outs[i], (unsigned long long)r.o[p].run.decode_steps);
            cr_expect_eq(q->first_token_s, q->kv_arrived_s, "%s: token 1 is committed when the KV is in",
                         r.o[p].name);
            if (outs[i] == 1) {
                cr_expect_eq(q->done_s, q->first_token_s);
                cr_expect_eq(q->admitted_s, -1, "one token: never decoded");
            }
        }
        run_free(&r);
    }
}

/* Lynx with every speculated token accepted: the speculative steps, the verification and the normal
   steps still add up to N - 1 (the verification commits the speculated tokens plus one). */
Test(decode_steps, lynx_full_acceptance_makes_n_minus_one_steps)
{
    run r;
    run_start(&r, LYNX_ONE, NULL, 0); /* output 32, acceptance 1.0 */
    const kv_policy_outcome *ly = outcome(&r, "lynx");
    cr_expect_gt(ly->run.requests[0].spec_tokens, 0);
    cr_expect_eq(ly->run.requests[0].accepted_tokens, ly->run.requests[0].spec_tokens);
    for (size_t p = 0; p < r.n; p++)
        cr_expect_eq(r.o[p].run.decode_steps, 31, "%s: %llu steps", r.o[p].name,
                     (unsigned long long)r.o[p].run.decode_steps);
    run_free(&r);
}

/* ---- Layer-wise flows carry exactly the reported bytes ---------------------------------------- */

static void expect_sent_equals_wire(const run *r)
{
    for (size_t p = 0; p < r->n; p++) {
        const kv_run_result *run = &r->o[p].run;
        double sent = 0;
        for (size_t l = 0; l < run->n_links; l++)
            if (strstr(run->links[l].name, "-up"))
                sent += (double)run->links[l].bytes;
        cr_expect_gt(sent, 0, "%s: nothing sent", r->o[p].name);
        cr_expect_eq(sent, r->o[p].summary.kv_wire_bytes, "%s: %.0f bytes sent, %.0f reported", r->o[p].name, sent,
                     r->o[p].summary.kv_wire_bytes);
    }
}

Test(flows, layerwise_bytes_sent_equal_kv_wire_bytes)
{
    char *dir = kvt_tempdir();
    char *lua = kvt_write(dir, "diffkv_lw.lua",
                          "return {\n"
                          "  encode = function(ctx)\n"
                          "    return { key = { bits = 8, group_size = 32 }, value = { bits = 4, group_size = 32 },\n"
                          "             diffkv = { key_low = { bits = 4, group_size = 32 },\n"
                          "                        value_low = { bits = 2, group_size = 32 },\n"
                          "                        alpha_high = 1.0, alpha_low = 0.02, window = 64 } }\n"
                          "  end,\n"
                          "  transfer = function(ctx) return { layerwise = true } end,\n"
                          "}\n");
    char pol[4096];
    snprintf(pol, sizeof pol, "policy={diffkv_lw: {file: %s}}", lua);
    const char *dsets[] = {"cluster.colocated=false", "workload.requests=6", "workload.output.min=20",
                           "workload.output.max=40", "policies=[diffkv, diffkv_lw]", pol};
    run r;
    run_start(&r, "scenarios/diffkv.yaml", dsets, 6);
    expect_sent_equals_wire(&r);
    run_free(&r);
    const char *lsets[] = {"policy.lynx.layerwise=true"};
    run_start(&r, LYNX_ONE, lsets, 1);
    expect_sent_equals_wire(&r);
    run_free(&r);
    kvt_rmtree(dir);
    free(dir);
    free(lua);
}
