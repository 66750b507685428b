/* test_adaptive_policies.c — the shipped adaptive policies: lynx-ordered, cachegen, lynx-adaptive, bandit (#19). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/scenario.h"
#include "core/policy/policy.h"
#include "core/study/study.h"
#include "tests/net_support.h"
#include "tests/support.h"

#define BURST "tests/fixtures/scenarios/burst-fifo.yaml"
#define STEP "tests/fixtures/scenarios/adaptive-step.yaml"

/* Runs a fixture (with overrides) and returns its outcomes; the caller frees st and s. */
static const kv_policy_outcome *run_fixture(const char *fixture, const char **sets, int n_sets, size_t want,
                                            kv_study **st, kv_scenario **s)
{
    char *path = kvt_source(fixture);
    *st = kvt_study_run(path, sets, n_sets, s);
    free(path);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(*st, &n);
    cr_assert_eq(n, want);
    return o;
}

/* burst-fifo.yaml: int8, int4, lynx-ordered. The figures: TTKT within 5% of INT8's (or better), the
   first speculative token within 5% of INT4's first token. */
static void check_burst_figures(const kv_policy_outcome *o)
{
    const kv_summary *i8 = &o[0].summary, *i4 = &o[1].summary, *lo = &o[2].summary;
    cr_assert_str_eq(o[2].name, "lynx-ordered");
    cr_assert_eq(lo->completed, 64);
    cr_expect(lo->ttkt_ms.mean <= 1.05 * i8->ttkt_ms.mean, "TTKT@10 %.1f ms against INT8's %.1f", lo->ttkt_ms.mean,
              i8->ttkt_ms.mean);
    cr_expect(lo->ttft_spec_ms.mean <= 1.05 * i4->ttft_ms.mean, "first speculative token %.1f ms against INT4's "
              "first token %.1f", lo->ttft_spec_ms.mean, i4->ttft_ms.mean);
    cr_expect(lo->spec_tokens > 0, "lynx-ordered speculated nothing");
}

Test(adaptive_policies, lynx_ordered_meets_the_burst_figures_on_simgrid)
{
    kv_study *st;
    kv_scenario *s;
    const kv_policy_outcome *o = run_fixture(BURST, NULL, 0, 3, &st, &s);
    cr_assert_str_eq(o[0].run.network, "simgrid");
    check_burst_figures(o);
    /* FIFO burst: mean and p99 committed TTFT no worse than INT8's. */
    const kv_summary *i8 = &o[0].summary, *lo = &o[2].summary;
    cr_expect(lo->ttft_ms.mean <= i8->ttft_ms.mean, "mean TTFT %.3f against INT8's %.3f", lo->ttft_ms.mean,
              i8->ttft_ms.mean);
    cr_expect(lo->ttft_ms.p99 <= i8->ttft_ms.p99, "p99 TTFT %.3f against INT8's %.3f", lo->ttft_ms.p99,
              i8->ttft_ms.p99);
    /* Same bytes as INT8 (8 bits split 4 + 4 carry INT8's codes and metadata). */
    cr_expect_eq(lo->kv_wire_bytes, i8->kv_wire_bytes);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(adaptive_policies, lynx_ordered_meets_the_burst_figures_on_ideal)
{
    const char *sets[] = {"network.model=ideal"};
    kv_study *st;
    kv_scenario *s;
    const kv_policy_outcome *o = run_fixture(BURST, sets, 1, 3, &st, &s);
    cr_assert_str_eq(o[0].run.network, "ideal");
    check_burst_figures(o);
    /* No link is shared, so levels change nothing: each request's first committed token comes when its
       residual has arrived, which starts once its anchor is in: INT8's time plus one more route latency
       (two NICs of 5 us). */
    const kv_run_result *i8 = &o[0].run, *lo = &o[2].run;
    for (size_t i = 0; i < lo->n_requests; i++) {
        double d = (lo->requests[i].first_token_s - lo->requests[i].arrival_s) -
                   (i8->requests[i].first_token_s - i8->requests[i].arrival_s);
        cr_expect(d <= 10e-6 + 1e-9, "request %zu: TTFT %.9f s after INT8's", i, d);
    }
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

/* adaptive-step.yaml: requests 0-3 and 20-23 quiet (10 s apart), 4-19 the burst (within 0.15 s at 40 s).
   Request 4 opens it: when its prefill ends nothing is travelling yet. */
static bool in_burst(size_t id)
{
    return id >= 5 && id <= 19;
}

static bool quiet(size_t id)
{
    return id <= 3 || id >= 20;
}

Test(adaptive_policies, cachegen_fewer_bits_during_the_burst)
{
    kv_study *st;
    kv_scenario *s;
    const kv_policy_outcome *o = run_fixture(STEP, NULL, 0, 5, &st, &s);
    cr_assert_str_eq(o[2].name, "cachegen");
    const kv_run_result *cg = &o[2].run;
    cr_assert_eq(cg->n_requests, 24);
    int fewer = 0;
    double burst_bits = 0, burst_bytes = 0, quiet_bytes = 0;
    for (size_t i = 0; i < cg->n_requests; i++) {
        const kv_request_result *q = &cg->requests[i];
        if (quiet(i)) {
            cr_expect_eq(q->bits, 9.0, "quiet request %zu: %g bits, want 8 + 1 (scale and zero)", i, q->bits);
            quiet_bytes = q->anchor_bytes;
        }
        if (in_burst(i)) {
            fewer += q->bits < 9.0;
            burst_bits += q->bits / 15;
            burst_bytes += q->anchor_bytes / 15;
        }
    }
    cr_expect(fewer >= 10, "only %d of the 15 burst requests got fewer than 8 bits", fewer);
    cr_expect(burst_bits < 7.0, "mean bits in the burst %g", burst_bits);
    cr_expect(burst_bytes < quiet_bytes);
    /* Fewer bytes under load: its TTFT is below INT8's. */
    cr_expect(o[2].summary.ttft_ms.mean < o[0].summary.ttft_ms.mean);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(adaptive_policies, lynx_adaptive_thinner_anchor_when_busy)
{
    kv_study *st;
    kv_scenario *s;
    const kv_policy_outcome *o = run_fixture(STEP, NULL, 0, 5, &st, &s);
    cr_assert_str_eq(o[1].name, "lynx");
    cr_assert_str_eq(o[3].name, "lynx-adaptive");
    const kv_run_result *ly = &o[1].run, *la = &o[3].run;
    for (size_t i = 0; i < la->n_requests; i++) {
        const kv_request_result *a = &la->requests[i], *l = &ly->requests[i];
        cr_expect_eq(a->anchor_bytes + a->residual_bytes, l->anchor_bytes + l->residual_bytes,
                     "request %zu: 8 bits either way", i);
        if (quiet(i))
            cr_expect_eq(a->anchor_bytes, l->anchor_bytes, "quiet request %zu: lynx's 4-bit anchor", i);
        if (in_burst(i))
            cr_expect(a->anchor_bytes < 0.7 * l->anchor_bytes, "burst request %zu: anchor %g B, lynx's %g B", i,
                      a->anchor_bytes, l->anchor_bytes);
    }
    cr_expect(o[3].summary.spec_tokens > 0);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(adaptive_policies, bandit_learns_from_the_burst_in_a_run)
{
    kv_study *st;
    kv_scenario *s;
    const kv_policy_outcome *o = run_fixture(STEP, NULL, 0, 5, &st, &s);
    cr_assert_str_eq(o[4].name, "bandit");
    const kv_request_result *q = o[4].run.requests;
    /* The first round tries each arm in turn: int8 (8 + 1 bits), int4 (4 + 1), kivi2 (about 3.4). */
    cr_expect_eq(q[0].bits, 9.0);
    cr_expect_eq(q[1].bits, 5.0);
    cr_expect(q[2].bits > 3.0 && q[2].bits < 4.0, "%g", q[2].bits);
    /* Quiet feedback (requests 0-2 finish before request 3 arrives): INT8's quality wins. */
    cr_expect_eq(q[3].bits, 9.0);
    /* After the burst has taught it INT8's TTFT under load, the quiet requests get fewer bits. */
    for (size_t i = 20; i < 24; i++)
        cr_expect(q[i].bits < 9.0, "request %zu after the burst: %g bits", i, q[i].bits);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

static int bandit_bits(kv_policy *p, uint64_t id)
{
    kv_policy_model m = {"toy", 2, 4, 2, 64};
    kv_policy_request r = {.id = id, .prompt_tokens = 100, .output_tokens = 4, .prefill_start_s = 0,
                           .prefill_end_s = 0.1};
    kv_encoding e;
    kv_error err = {0};
    cr_assert_eq(kv_policy_encoding(p, &m, &r, 0, 0, &e, &err), 0, "%s", err.msg);
    return e.key.bits;
}

static void bandit_done(kv_policy *p, uint64_t id, double ttft_s)
{
    kv_policy_request r = {.id = id, .prompt_tokens = 100, .output_tokens = 4, .prefill_start_s = 0,
                           .prefill_end_s = 0.1};
    kv_policy_finished f = {.ttft_s = ttft_s, .ttft_spec_s = ttft_s, .ttkt_s = -1, .done_s = ttft_s + 1,
                            .anchor_bytes = 1e6, .bits = 9};
    kv_error err = {0};
    cr_assert_eq(kv_policy_complete(p, &r, &f, &err), 0, "%s", err.msg);
}

Test(adaptive_policies, bandit_choices_change_after_feedback)
{
    char *path = kvt_source("policies/bandit.lua");
    kv_policy_param greedy[] = {{"epsilon", "0", "test"}};
    kv_policy *p = kvt_policy_load(path, greedy, 1);
    cr_expect_eq(bandit_bits(p, 0), 8);
    cr_expect_eq(bandit_bits(p, 1), 4);
    cr_expect_eq(bandit_bits(p, 2), 2);
    cr_expect_eq(bandit_bits(p, 0), 8, "a request's later (layer, head) calls keep its arm");
    cr_expect_eq(bandit_bits(p, 3), 8, "no feedback yet: the first arm not rewarded");
    /* Rewards quality - ttft / 1 s: int8 1 - 3 = -2, int4 0.8 - 0.2 = 0.6, kivi2 0.5 - 0.2 = 0.3. */
    bandit_done(p, 0, 3.0);
    bandit_done(p, 1, 0.2);
    bandit_done(p, 2, 0.2);
    cr_expect_eq(bandit_bits(p, 4), 4, "int4 has the best mean reward");
    bandit_done(p, 4, 5.0); /* int4: (0.6 + 0.8 - 5) / 2 = -1.8 */
    cr_expect_eq(bandit_bits(p, 5), 2, "kivi2 is now the best");
    kv_policy_destroy(p);
    free(path);
}

Test(adaptive_policies, bandit_is_deterministic_with_exploration)
{
    char *path = kvt_source("policies/bandit.lua");
    kv_policy_param explore[] = {{"epsilon", "0.5", "test"}};
    kv_policy *a = kvt_policy_load(path, explore, 1), *b = kvt_policy_load(path, explore, 1);
    int seen[17] = {0};
    for (uint64_t id = 0; id < 60; id++) {
        int x = bandit_bits(a, id), y = bandit_bits(b, id);
        cr_expect_eq(x, y, "request %llu: %d bits against %d", (unsigned long long)id, x, y);
        seen[x]++;
        bandit_done(a, id, 0.1 * (double)(id % 7));
        bandit_done(b, id, 0.1 * (double)(id % 7));
    }
    cr_expect(seen[8] > 0 && seen[4] > 0 && seen[2] > 0, "exploration visits every arm");
    kv_policy_destroy(a);
    kv_policy_destroy(b);
    free(path);
}

/* Same scenario, same seed: the same encodings, bytes and timings for every adaptive policy. */
Test(adaptive_policies, same_scenario_same_bytes)
{
    char *dir = kvt_tempdir();
    char *a = kvt_path(dir, "a"), *b = kvt_path(dir, "b");
    char *src = kvt_source(STEP);
    const char *names[] = {"results.json", "requests.csv"};
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out %s", src, a);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "run %s --quiet --out %s", src, b);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    kvt_expect_same_files(a, b, names, 2);
    free(src);
    free(a);
    free(b);
    kvt_rmtree(dir);
    free(dir);
}

static bool have_matplotlib(void)
{
    return system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0 ||
           system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
}

static bool is_png(const char *path)
{
    size_t n = 0;
    char *t = kvt_read(path, &n);
    bool ok = t && n > 8 && memcmp(t, "\x89PNG", 4) == 0;
    free(t);
    return ok;
}

/* Tutorial 5 runs, says its question, command and figure, and --plot draws bits_over_time for it (a
   run whose policies never change their bits skips that figure, saying why). */
Test(adaptive_policies, tutorial_runs_and_plots_bits_over_time, .timeout = 120)
{
    char *dir = kvt_tempdir();
    char *tut = kvt_source("scenarios/tutorial/05-adaptive.yaml");
    char *text = kvt_read(tut, NULL);
    cr_assert_not_null(text);
    cr_expect(strstr(text, "?") && strstr(text, "figures/bits_over_time.png") && strstr(text, "Run:"));
    free(text);
    char *readme = kvt_source("scenarios/tutorial/README.md");
    text = kvt_read(readme, NULL);
    cr_expect(text && strstr(text, "`05-adaptive.yaml`"), "scenarios/tutorial/README.md has no row for tutorial 5");
    free(text);
    free(readme);
    char *run = kvt_path(dir, "run"), *stat = kvt_path(dir, "static");
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out %s --plot", tut, run);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    bool plotting = have_matplotlib();
    if (plotting) {
        char *fig = kvt_path(run, "figures/bits_over_time.png");
        cr_expect(is_png(fig), "no bits_over_time.png:\n%s", out);
        free(fig);
    } else {
        cr_expect(strstr(out, "plots skipped:") != NULL, "%s", out);
    }
    free(out);
    snprintf(args, sizeof args, "run %s --quiet --out %s --plot --set 'policies=[int8,lynx]'", tut, stat);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    if (plotting)
        cr_expect(strstr(out, "skipped bits_over_time: no policy changes its bits between requests"), "%s", out);
    free(out);
    free(run);
    free(stat);
    free(tut);
    kvt_rmtree(dir);
    free(dir);
}

/* A bug the request-aware Lynx found (net/simgrid/sg_child.cpp relevel): in the levels mode every flow's penalty
   was set again at each change of the flows, and SimGrid (lazy updates) takes an action off its completion heap
   on every set, while an unchanged penalty does not mark it for the next solve. A flow on links that the change
   did not touch then never completed: on 2 prefill + 2 decode nodes lynx-ordered stalled for seconds, or SimGrid
   stopped with "Deadlock detected". Two level-0 flows on disjoint routes; the short one ends first. */
Test(adaptive_policies, levels_flow_on_untouched_links_still_completes, .timeout = 60)
{
    const double gbps = 25, lat = 5e-6, bps = gbps * 1e9 / 8;
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, gbps, lat);
    kv_net *net = nett_create(&cfg, &r);
    kv_error err;
    kv_flow_spec a = {.src = 0, .dst = 2, .bytes = 2000000000, .has_level = 1, .level = 0, .weight = 1};
    kv_flow_spec b = {.src = 1, .dst = 3, .bytes = 100000000, .has_level = 1, .level = 0, .weight = 1};
    kv_flow_id ia = 0, ib = 0;
    double t = 0;
    cr_assert_eq(kv_net_flow_start(net, &a, 0, &ia, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_net_advance(net, 0.01, &t, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_net_flow_start(net, &b, 0.01, &ib, &err), KV_OK, "%s", err.msg);
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    nett_close(r.t[nett_find(&r, ib)], 0.01 + 2 * lat + (double)b.bytes / bps, 1e-9, "the short flow");
    nett_close(r.t[nett_find(&r, ia)], 2 * lat + (double)a.bytes / bps, 1e-9, "the long flow, as if alone");
    kv_net_destroy(net);
}
