/* test_capacity.c — kvsim capacity: the goodput rate it finds meets the SLOs and the next step above does
   not, as direct runs at those rates confirm; a faster network never lowers it; a trace's clock is scaled
   the documented way; bad --slo input exits 2 naming the flag; the same input gives the same bytes. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/jsonread.h"
#include "core/config/scenario.h"
#include "core/study/capacity.h"
#include "core/study/study.h"
#include "tests/support.h"

#define SMALL "tests/fixtures/scenarios/capacity-small.yaml"

/* Attainment of policy `name` in a direct run of the scenario with `set` (the knob's value) applied. */
static double direct_attainment(const char *path, const char *set, const char *name, const kv_slo *slo)
{
    char *policies = NULL;
    cr_assert(asprintf(&policies, "policies=[%s]", name) > 0);
    const char *sets[] = {set, policies, "outputs.trace=false"};
    kv_scenario *s = NULL;
    kv_study *st = kvt_study_run(path, sets, 3, &s);
    const kv_policy_outcome *o = kv_study_outcome(st, 0);
    cr_assert_not_null(o);
    double a = kv_capacity_attainment(&o->run, slo, NULL);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    free(policies);
    return a;
}

static kv_jvalue *read_capacity(const char *dir)
{
    char *path = kvt_path(dir, "capacity.json");
    kv_jvalue *root = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_jread_file(path, &root, &err), 0, "%s", err.msg);
    free(path);
    return root;
}

static double num(const kv_jvalue *obj, const char *key)
{
    const kv_jvalue *v = kv_jvalue_get(obj, key);
    cr_assert(v && v->kind == KV_JNUMBER, "no number %s", key);
    return v->number;
}

static const char *str(const kv_jvalue *obj, const char *key)
{
    const kv_jvalue *v = kv_jvalue_get(obj, key);
    cr_assert(v && v->kind == KV_JSTRING, "no string %s", key);
    return v->text;
}

Test(capacity, found_rate_meets_and_next_step_misses_as_direct_runs_confirm)
{
    char *dir = kvt_tempdir(), *out = NULL, *args = NULL;
    char *path = kvt_source(SMALL);
    cr_assert(asprintf(&args, "capacity '%s' --slo ttft_p99_ms=300,tpot_p99_ms=30 --attainment 0.9 --out '%s/c'",
                       path, dir) > 0);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "goodput req/s") && strstr(out, "\nbf16 ") && strstr(out, "\nint4 "), "%s", out);
    char *cdir = kvt_path(dir, "c");
    kv_jvalue *root = read_capacity(cdir);
    const kv_jvalue *pol = kv_jvalue_get(root, "policies");
    cr_assert(pol && pol->kind == KV_JARRAY && pol->count == 2);
    cr_expect_str_eq(str(root, "scaled"), "workload.rate_per_s");
    kv_slo slo = {.ttft_ms = 300, .tpot_ms = 30, .e2el_ms = NAN};
    for (size_t i = 0; i < pol->count; i++) {
        const kv_jvalue *p = pol->items[i];
        cr_assert_str_eq(str(p, "status"), "found");
        const kv_jvalue *best = kv_jvalue_get(p, "best"), *above = kv_jvalue_get(p, "above");
        double r_best = num(best, "rate"), r_above = num(above, "rate");
        cr_expect(num(best, "attainment") >= 0.9 && num(above, "attainment") < 0.9, "%s", str(p, "name"));
        cr_expect(r_above > r_best && r_above - r_best <= 0.02 * r_best + 1e-12, "%g %g", r_best, r_above);
        cr_expect(r_best > 2.0, "the scenario's own rate (2/s) meets these SLOs: %g", r_best);
        cr_expect_eq(num(p, "goodput_rate"), r_best);
        /* A plain run at each rate gives the same attainment (measurements reused, not redone). */
        double a_best = direct_attainment(path, str(best, "set"), str(p, "name"), &slo);
        double a_above = direct_attainment(path, str(above, "set"), str(p, "name"), &slo);
        cr_expect_eq(a_best, num(best, "attainment"), "%s at %s", str(p, "name"), str(best, "set"));
        cr_expect_eq(a_above, num(above, "attainment"), "%s at %s", str(p, "name"), str(above, "set"));
        cr_expect(a_best >= 0.9 && a_above < 0.9);
        /* Every probe is listed, in order of rate. */
        const kv_jvalue *probes = kv_jvalue_get(p, "probes");
        cr_assert(probes && probes->count >= 3);
        for (size_t k = 1; k < probes->count; k++)
            cr_expect(num(probes->items[k], "rate") > num(probes->items[k - 1], "rate"));
    }
    /* Deterministic: the same scenario and seed, the same bytes. */
    char *again = NULL;
    free(args);
    cr_assert(asprintf(&args, "capacity '%s' --slo ttft_p99_ms=300,tpot_p99_ms=30 --out '%s/d' --quiet", path,
                       dir) > 0);
    free(out);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    cr_expect_str_eq(out, "", "--quiet prints nothing");
    char *a = kvt_path(dir, "c/capacity.json"), *b = kvt_path(dir, "d/capacity.json");
    char *ta = kvt_read(a, NULL), *tb = kvt_read(b, NULL);
    cr_assert(ta && tb);
    cr_expect_str_eq(ta, tb);
    free(ta);
    free(tb);
    free(a);
    free(b);
    free(again);
    kv_jvalue_free(root);
    free(cdir);
    free(out);
    free(args);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* Goodput of the first policy, in process, on the small scenario with sets applied. */
static double goodput(const char **sets, int n_sets, const kv_slo *slo)
{
    char *path = kvt_source(SMALL);
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_scenario_load(path, sets, n_sets, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    kv_capacity_config cfg = {.slo = *slo, .attainment = 0.9, .precision = 0.02};
    kv_capacity_result r;
    cr_assert_eq(kv_capacity_search(st, s, &cfg, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.policies[0].status, KV_CAPACITY_FOUND);
    double g = r.policies[0].best.rate;
    kv_capacity_result_free(&r);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    free(path);
    return g;
}

Test(capacity, a_faster_network_never_lowers_capacity)
{
    kv_slo slo = {.ttft_ms = 400, .tpot_ms = NAN, .e2el_ms = NAN};
    const double gbps[] = {10, 25, 100};
    double prev = 0, first = 0;
    for (int i = 0; i < 3; i++) {
        char *bw = NULL;
        cr_assert(asprintf(&bw, "network.nic_bandwidth_gbps=%g", gbps[i]) > 0);
        const char *sets[] = {bw, "policies=[bf16]"};
        double g = goodput(sets, 2, &slo);
        cr_expect(g >= prev, "%g Gbit/s: capacity %g below %g at the slower network", gbps[i], g, prev);
        if (i == 0)
            first = g;
        prev = g;
        free(bw);
    }
    cr_expect(prev > 1.1 * first, "the transfer matters here: %g at 100 Gbit/s, %g at 10", prev, first);
    /* Laxer SLOs never lower it either. */
    kv_slo tight = {.ttft_ms = 200, .tpot_ms = NAN, .e2el_ms = NAN}, lax = {.ttft_ms = 800, .tpot_ms = NAN, .e2el_ms = NAN};
    const char *sets[] = {"policies=[bf16]"};
    cr_expect(goodput(sets, 1, &lax) >= goodput(sets, 1, &tight));
}

Test(capacity, a_trace_is_scaled_by_dividing_its_clock)
{
    /* The load-step trace (24 rows over ~80 s): a smaller time_scale packs arrivals tighter, so every
       probe's rate rises as its time_scale falls, and rate x time_scale is the trace's own constant. */
    char *path = kvt_source("tests/fixtures/scenarios/load-step.yaml");
    const char *sets[] = {"policies=[int8]"};
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_scenario_load(path, sets, 1, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    kv_capacity_config cfg = {.slo = {.ttft_ms = 600, .tpot_ms = NAN, .e2el_ms = NAN}, .attainment = 0.9,
                              .precision = 0.05};
    kv_capacity_result r;
    cr_assert_eq(kv_capacity_search(st, s, &cfg, &r, &err), 0, "%s", err.msg);
    cr_expect_str_eq(r.knob, "workload.trace.time_scale");
    const kv_capacity_policy *p = &r.policies[0];
    cr_assert(p->n_probes >= 2);
    double k0 = p->probes[0].rate * p->probes[0].knob;
    for (size_t i = 1; i < p->n_probes; i++) {
        cr_expect(p->probes[i].knob < p->probes[i - 1].knob && p->probes[i].rate > p->probes[i - 1].rate);
        cr_expect(fabs(p->probes[i].rate * p->probes[i].knob - k0) <= 1e-9 * k0);
        cr_expect_eq(p->probes[i].knob, kv_study_time_scale(s, p->probes[i].factor));
    }
    /* The scenario's own clock misses this SLO (its burst), so the answer is a stretched trace, and a
       plain run with that time_scale agrees. */
    cr_assert_eq(p->status, KV_CAPACITY_FOUND);
    cr_expect(p->best.knob > 1.0 && p->above.knob < p->best.knob);
    char *set = NULL;
    cr_assert(asprintf(&set, "workload.trace.time_scale=%.17g", p->best.knob) > 0);
    cr_expect_eq(direct_attainment(path, set, "int8", &cfg.slo), p->best.attainment);
    free(set);
    kv_capacity_result_free(&r);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    free(path);
}

static void expect_bad(const char *flags, const char *names)
{
    char *path = kvt_source(SMALL), *args = NULL, *out = NULL, *dir = kvt_tempdir();
    cr_assert(asprintf(&args, "capacity '%s' %s --out '%s/o'", path, flags, dir) > 0);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 2, "%s: %s", flags, out);
    cr_expect(strstr(out, names), "%s: expected '%s' in: %s", flags, names, out);
    char *listing = kvt_listing(dir);
    cr_expect_str_eq(listing, "", "%s: nothing written", flags);
    free(listing);
    free(out);
    free(args);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(capacity, bad_slo_input_exits_2_naming_the_flag)
{
    expect_bad("", "--slo: required");
    expect_bad("--slo ''", "--slo");
    expect_bad("--slo ttft_ms=abc", "--slo: ttft_ms");
    expect_bad("--slo ttft_ms=-5", "--slo: ttft_ms");
    expect_bad("--slo ttft_ms=0", "--slo: ttft_ms");
    expect_bad("--slo ttft=300", "--slo: unknown bound 'ttft'");
    expect_bad("--slo ttft_ms=300,ttft_p99_ms=200", "--slo: 'ttft_p99_ms' given twice");
    expect_bad("--slo ttft_ms=300,", "--slo");
    expect_bad("--slo ttft_ms", "--slo: 'ttft_ms'");
    expect_bad("--slo ttft_ms=300 --attainment 1.5", "--attainment");
    expect_bad("--slo ttft_ms=300 --attainment 0", "--attainment");
    expect_bad("--slo ttft_ms=300 --precision 1", "--precision");
    expect_bad("--slo ttft_ms=300 --set workload.rate_per_s=-1", "workload.rate_per_s");
}

Test(capacity, slo_parser_reads_every_bound)
{
    kv_slo slo;
    kv_error err = {0};
    cr_assert_eq(kv_capacity_parse_slo("ttft_p99_ms=250.5,tpot_ms=40,e2el_p99_ms=9000", &slo, &err), 0, "%s",
                 err.msg);
    cr_expect_eq(slo.ttft_ms, 250.5);
    cr_expect_eq(slo.tpot_ms, 40);
    cr_expect_eq(slo.e2el_ms, 9000);
    cr_assert_eq(kv_capacity_parse_slo("tpot_ms=40", &slo, &err), 0);
    cr_expect(isnan(slo.ttft_ms) && isnan(slo.e2el_ms));
}

Test(capacity, plot_draws_attainment_against_rate)
{
    char *path = kvt_source(SMALL), *dir = kvt_tempdir(), *args = NULL, *out = NULL;
    cr_assert(asprintf(&args, "capacity '%s' --slo ttft_ms=300 --set 'policies=[bf16]' --out '%s/c' --plot", path,
                       dir) > 0);
    int rc = kvt_kvsim(args, &out);
    if (strstr(out, "plots skipped")) {
        free(out);
        free(args);
        free(path);
        kvt_rmtree(dir);
        free(dir);
        cr_skip("no Python 3 with matplotlib here");
    }
    cr_assert_eq(rc, 0, "%s", out);
    char *fig = NULL;
    cr_assert(asprintf(&fig, "%s/c/figures/capacity.png", dir) > 0);
    size_t len = 0;
    char *png = kvt_read(fig, &len);
    cr_expect(png && len > 1000, "%s: %s", fig, out);
    free(png);
    free(fig);
    free(out);
    free(args);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
