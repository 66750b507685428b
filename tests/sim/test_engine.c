/* test_engine.c — the engine against hand computation, event order, determinism. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/sim/eventq.h"
#include "core/study/study.h"
#include "tests/support.h"

Test(eventq, orders_by_time_then_push_order)
{
    kv_eventq q;
    kv_eventq_init(&q);
    kv_eventq_push(&q, 2.0, 1, 0, 0);
    kv_eventq_push(&q, 1.0, 2, 0, 0);
    kv_eventq_push(&q, 2.0, 3, 0, 0);
    kv_eventq_push(&q, 1.0, 4, 0, 0);
    int expect[] = {2, 4, 1, 3};
    kv_event ev;
    for (int i = 0; i < 4; i++) {
        cr_assert(kv_eventq_pop(&q, &ev));
        cr_expect_eq(ev.type, expect[i], "event %d: type %d", i, ev.type);
    }
    cr_expect_eq(kv_eventq_pop(&q, &ev), 0);
    kv_eventq_free(&q);
}

Test(eventq, many_random_events_pop_sorted)
{
    kv_eventq q;
    kv_eventq_init(&q);
    unsigned x = 12345;
    for (int i = 0; i < 5000; i++) {
        x = x * 1103515245u + 12345u;
        kv_eventq_push(&q, (double)(x % 1000), i, 0, 0);
    }
    kv_event prev = {-1, 0, 0, 0, 0}, ev;
    int n = 0;
    while (kv_eventq_pop(&q, &ev)) {
        cr_assert(ev.t_s > prev.t_s || (ev.t_s == prev.t_s && ev.seq > prev.seq));
        prev = ev;
        n++;
    }
    cr_expect_eq(n, 5000);
    kv_eventq_free(&q);
}

/* Llama-3-8B on one H100 (profile figures), bf16 KV, written out by hand. */
Test(engine, one_request_ttft_equals_hand_computation)
{
    kv_scenario *s = NULL;
    kv_study *st = kvt_study_run("tests/fixtures/scenarios/one-request.yaml", NULL, 0, &s);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 3);
    const kv_request_result *r = &o[0].run.requests[0];

    const double L = 32, hidden = 4096, H = 32, KVH = 8, hd = 128, ffn = 14336, vocab = 128256;
    const double weights = 8.03e9 * 2, T = 1000;
    const double flops_peak = 989e12 * 0.6, bw = 3350e9 * 0.8, overhead = 20e-6;
    double linear = 2 * L * (hidden * H * hd + 2 * hidden * KVH * hd + H * hd * hidden + 3 * hidden * ffn);
    double kv_bytes = T * 2 * L * KVH * hd * 2; /* bf16 K and V */
    double prefill_flops = T * linear + 4 * L * H * hd * T * (T + 1) / 2 + 2 * hidden * vocab;
    double prefill = fmax(prefill_flops / flops_peak, (weights + kv_bytes) / bw) + overhead;
    double encode = (kv_bytes + kv_bytes) / bw;
    double transfer = 2 * 5e-6 + kv_bytes * 8 / 100e9;
    /* Decode step producing token k+1 (k = 1..3): it attends T + k tokens and reads their KV. */
    double steps = 0;
    for (int k = 1; k <= 3; k++) {
        double ctx = T + k;
        double step_flops = linear + 4 * L * H * hd * ctx + 2 * hidden * vocab;
        steps += fmax(step_flops / flops_peak, (weights + ctx * 2 * L * KVH * hd * 2) / bw) + overhead;
    }

    cr_expect(fabs(r->prefill_end_s - prefill) < 1e-12, "prefill %.12g vs %.12g", r->prefill_end_s, prefill);
    cr_expect(fabs(r->encode_end_s - (prefill + encode)) < 1e-12, "encode end %.12g", r->encode_end_s);
    cr_expect(fabs(r->kv_arrived_s - (prefill + encode + transfer)) < 1e-12, "arrival %.12g vs %.12g",
              r->kv_arrived_s, prefill + encode + transfer);
    /* Token 1 comes from the prefill node's logits: committed once its whole KV is at the decode node. */
    double ttft = prefill + encode + transfer;
    cr_expect(fabs(r->first_token_s - ttft) < 1e-12, "ttft %.12g vs hand %.12g", r->first_token_s, ttft);
    cr_expect(fabs(o[0].summary.ttft_ms.mean - ttft * 1e3) < 1e-9);
    /* Tokens 2..4: three decode steps, not four. */
    cr_expect_eq(o[0].run.decode_steps, 3, "%llu decode steps for 4 output tokens",
                 (unsigned long long)o[0].run.decode_steps);
    cr_expect(fabs(r->done_s - (ttft + steps)) < 1e-12, "e2el %.12g vs hand %.12g", r->done_s, ttft + steps);
    cr_expect_eq(r->anchor_bytes, kv_bytes);
    /* Smaller KV on the wire: INT8 and INT4 reach the first token sooner. */
    cr_expect(o[1].run.requests[0].first_token_s < r->first_token_s);
    cr_expect(o[2].run.requests[0].first_token_s < o[1].run.requests[0].first_token_s);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(engine, same_seed_same_bytes)
{
    char *dir = kvt_tempdir();
    char args[4096], *out = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "run scenarios/quickstart.yaml --set workload.requests=40 --quiet --out %s/r%d",
                 dir, i);
        cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
        free(out);
    }
    const char *files[] = {"results.json", "requests.csv", "trace.json"};
    for (int f = 0; f < 3; f++) {
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/r0/%s", dir, files[f]);
        snprintf(b, sizeof b, "%s/r1/%s", dir, files[f]);
        size_t la = 0, lb = 0;
        char *ta = kvt_read(a, &la), *tb = kvt_read(b, &lb);
        cr_assert(ta && tb, "missing %s", files[f]);
        cr_expect(la == lb && memcmp(ta, tb, la) == 0, "%s differs between identical runs", files[f]);
        free(ta);
        free(tb);
    }
    /* A different seed gives different requests. */
    snprintf(args, sizeof args, "run scenarios/quickstart.yaml --set workload.requests=40 --seed 2 --quiet --out %s/r2",
             dir);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/r0/requests.csv", dir);
    snprintf(b, sizeof b, "%s/r2/requests.csv", dir);
    char *ta = kvt_read(a, NULL), *tb = kvt_read(b, NULL);
    cr_expect(strcmp(ta, tb) != 0);
    free(ta);
    free(tb);
    kvt_rmtree(dir);
    free(dir);
}

/* With one request there is no contention: SimGrid (CM02) must give the ideal network's times. */
Test(engine, ideal_and_simgrid_agree_without_contention)
{
    kv_scenario *s1 = NULL, *s2 = NULL;
    const char *sim[] = {"network.model=simgrid"};
    kv_study *a = kvt_study_run("tests/fixtures/scenarios/one-request.yaml", NULL, 0, &s1);
    kv_study *b = kvt_study_run("tests/fixtures/scenarios/one-request.yaml", sim, 1, &s2);
    size_t na = 0, nb = 0;
    const kv_policy_outcome *oa = kv_study_outcomes(a, &na), *ob = kv_study_outcomes(b, &nb);
    cr_assert_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        const kv_request_result *x = &oa[i].run.requests[0], *y = &ob[i].run.requests[0];
        cr_expect(fabs(x->kv_arrived_s - y->kv_arrived_s) < 1e-9, "%s: arrival ideal %.12g simgrid %.12g",
                  oa[i].name, x->kv_arrived_s, y->kv_arrived_s);
        cr_expect(fabs(x->first_token_s - y->first_token_s) < 1e-9);
        cr_expect_str_eq(ob[i].run.network, "simgrid");
    }
    kv_study_destroy(a);
    kv_study_destroy(b);
    kv_scenario_destroy(s1);
    kv_scenario_destroy(s2);
}
