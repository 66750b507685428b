/* test_length_curves.c — the engine reads Lynx acceptance and DiffKV significance at each request's own length (#20). */
#define _GNU_SOURCE /* open_memstream */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/scenario.h"
#include "core/kv/curves.h"
#include "core/policy/policy.h"
#include "core/report/metrics.h"
#include "core/report/report.h"
#include "core/sim/engine.h"
#include "core/sim/engine_config.h"
#include "core/workload/workload.h"
#include "tests/support.h"

/* The scenario's engine configuration (tests/fixtures/scenarios/length-curves.yaml). */
typedef struct fixture {
    kv_scenario *s;
    kv_engine_config cfg;
} fixture;

static void fixture_load(fixture *f)
{
    kv_error err = {0};
    char *path = kvt_source("tests/fixtures/scenarios/length-curves.yaml");
    cr_assert_eq(kv_scenario_load(path, NULL, 0, &f->s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_engine_config_build(f->s, &f->cfg, &err), 0, "%s", err.msg);
    free(path);
}

/* n requests, 4 per second, prompts drawn from prompts[n_prompts], `output` tokens each (owned by the caller). */
static kv_workload *workload_of(int n, const int *prompts, size_t n_prompts, int output)
{
    kv_workload_config wc = {.requests = n, .arrival = KV_ARRIVAL_FIXED, .rate_per_s = 4,
                             .prompt = {.kind = KV_LEN_EMPIRICAL, .samples = prompts, .n_samples = n_prompts},
                             .output = {.kind = KV_LEN_FIXED, .value = output}};
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    kv_workload *w = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_workload_create(&wc, &rng, &w, &err), 0, "%s", err.msg);
    return w;
}

/* Runs policies/<policy>.lua over w with the curves (NULL: none). */
static int run(const fixture *f, const char *policy, const kv_workload *w, const kv_accept_curve *a,
               const kv_diffkv_curve *d, kv_run_result *out, kv_error *err)
{
    char rel[64];
    snprintf(rel, sizeof rel, "policies/%s.lua", policy);
    char *path = kvt_source(rel);
    kv_policy *p = kvt_policy_load(path, NULL, 0);
    free(path);
    kv_run_inputs in = {.config = &f->cfg, .policy = p, .workload = w, .accept_curve = a, .diffkv_curve = d,
                        .accept_source = "test curve", .diffkv_source = "test curve"};
    int rc = kv_engine_run(&in, out, err);
    kv_policy_destroy(p);
    return rc;
}

static kv_accept_curve accept_curve2(int len0, double a0, int len1, double a1)
{
    kv_accept_curve c = {.positions = 4, .n_lengths = 2, .lengths = {len0, len1}, .samples = {100, 100}};
    for (int j = 0; j < 4; j++) {
        c.accept[0][j] = a0;
        c.accept[1][j] = a1;
    }
    return c;
}

/* One head's quantiles: narrow (z in 0.5..1.5) or wide (ln z in -6..2). */
static double narrow_z[KV_DIFFKV_TABLE_POINTS], wide_z[KV_DIFFKV_TABLE_POINTS];

static void make_tables(void)
{
    for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++) {
        narrow_z[k] = 0.5 + k / 128.0;
        wide_z[k] = exp(-6.0 + 8.0 * k / 128.0);
    }
}

static kv_diffkv_table table_of(const double *z)
{
    return (kv_diffkv_table){1, 1, z, z};
}

static kv_diffkv_curve diffkv_curve2(int len0, const double *z0, int len1, const double *z1)
{
    kv_diffkv_curve c = {.window = 64, .n_lengths = 2, .lengths = {len0, len1}};
    c.table[0] = table_of(z0);
    c.table[1] = table_of(z1);
    return c;
}

Test(length_curves, locate_is_linear_in_log_length_and_held_outside)
{
    int lengths[] = {1024, 4096, 8192};
    kv_curve_point p = kv_curve_locate(lengths, 3, 2048);
    cr_expect(p.lo == 0 && p.hi == 1 && !p.beyond);
    cr_expect(fabs(p.w - 0.5) < 1e-12, "w %g", p.w);
    p = kv_curve_locate(lengths, 3, 512);
    cr_expect(p.lo == 0 && p.hi == 0 && p.w == 0 && !p.beyond);
    p = kv_curve_locate(lengths, 3, 4096);
    cr_expect(p.lo == 1 && p.hi == 1 && p.w == 0 && !p.beyond);
    p = kv_curve_locate(lengths, 3, 8192);
    cr_expect(p.lo == 2 && p.hi == 2 && !p.beyond);
    p = kv_curve_locate(lengths, 3, 9000);
    cr_expect(p.lo == 2 && p.hi == 2 && p.w == 0 && p.beyond);
    kv_accept_curve c = accept_curve2(1024, 0.9, 4096, 0.5);
    cr_expect(fabs(kv_accept_curve_at(&c, 2, 2048) - 0.7) < 1e-12);
    cr_expect(kv_accept_curve_at(&c, 9, 100000) == 0.5, "held beyond the longest");
    /* The trend of the two longest: 16384 is two more doublings past 4096 (w = 2): 0.9 - 2 x 0.4 = 0.1. */
    cr_expect(fabs(kv_accept_curve_trend(&c, 0, 16384) - 0.1) < 1e-12, "%g", kv_accept_curve_trend(&c, 0, 16384));
    cr_expect(kv_accept_curve_trend(&c, 0, 65536) == 0.0, "clamped to [0, 1]");
}

/* Accepted / speculated over the requests of one prompt length. */
static double accept_rate(const kv_run_result *r, int prompt, int *spec)
{
    long s = 0, a = 0;
    for (size_t i = 0; i < r->n_requests; i++)
        if (r->requests[i].prompt_tokens == prompt) {
            s += r->requests[i].spec_tokens;
            a += r->requests[i].accepted_tokens;
        }
    *spec = (int)s;
    return s > 0 ? (double)a / (double)s : NAN;
}

Test(length_curves, acceptance_falling_with_length_accepts_less_at_8k_than_1k)
{
    fixture f;
    fixture_load(&f);
    int prompts[] = {1024, 8192};
    kv_workload *w = workload_of(40, prompts, 2, 128);
    kv_accept_curve c = accept_curve2(1024, 0.95, 8192, 0.4);
    kv_run_result r;
    kv_error err = {0};
    cr_assert_eq(run(&f, "lynx", w, &c, NULL, &r, &err), 0, "%s", err.msg);
    int s1, s8;
    double a1 = accept_rate(&r, 1024, &s1), a8 = accept_rate(&r, 8192, &s8);
    cr_assert(s1 > 30 && s8 > 30, "speculated %d / %d tokens", s1, s8);
    cr_expect(a1 > 0.7, "1K prompts accept %g", a1);
    cr_expect(a8 < 0.55, "8K prompts accept %g", a8);
    cr_expect_eq(r.accept_beyond_requests, 0);
    cr_expect_eq(r.accept_longest_tokens, 8192);
    kv_run_result_free(&r);
    kv_workload_destroy(w);
    kv_scenario_destroy(f.s);
}

Test(length_curves, a_one_length_acceptance_curve_is_the_single_value_path)
{
    fixture f;
    fixture_load(&f);
    int prompts[] = {1024, 8192};
    kv_workload *w = workload_of(24, prompts, 2, 96);
    /* The scenario's lynx.acceptance_per_position, and the same figures as a curve of one length. */
    kv_accept_curve c = {.positions = 4, .n_lengths = 1, .lengths = {4096}, .samples = {10},
                         .accept = {{0.9, 0.8, 0.7, 0.6}}};
    kv_run_result a, b;
    kv_error err = {0};
    cr_assert_eq(run(&f, "lynx", w, NULL, NULL, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(run(&f, "lynx", w, &c, NULL, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(a.n_requests, b.n_requests);
    long spec = 0;
    for (size_t i = 0; i < a.n_requests; i++) {
        cr_expect_eq(a.requests[i].spec_tokens, b.requests[i].spec_tokens);
        cr_expect_eq(a.requests[i].accepted_tokens, b.requests[i].accepted_tokens);
        cr_expect_eq(a.requests[i].done_s, b.requests[i].done_s);
        spec += a.requests[i].spec_tokens;
    }
    cr_expect(spec > 0);
    size_t beyond = 0;
    for (size_t i = 0; i < a.n_requests; i++)
        beyond += a.requests[i].prompt_tokens > 4096;
    cr_expect_eq(b.accept_beyond_requests, beyond, "the 8K prompts are beyond the one length, 4096");
    cr_expect_eq(a.accept_longest_tokens, 0, "no curve: nothing measured");
    cr_expect(fabs(b.accept_held_mean - 0.75) < 1e-12 && b.accept_trend_mean == b.accept_held_mean,
              "one length: the band is the held figure (%g, %g)", b.accept_held_mean, b.accept_trend_mean);
    kv_run_result_free(&a);
    kv_run_result_free(&b);

    /* DiffKV: two lengths with the same table give what one length gives. */
    make_tables();
    kv_diffkv_curve one = {.window = 64, .n_lengths = 1, .lengths = {2048}, .table = {table_of(wide_z)}};
    kv_diffkv_curve two = diffkv_curve2(1024, wide_z, 8192, wide_z);
    cr_assert_eq(run(&f, "diffkv", w, NULL, &one, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(run(&f, "diffkv", w, NULL, &two, &b, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < a.n_requests; i++) {
        cr_expect_eq(a.requests[i].tier_high_fraction, b.requests[i].tier_high_fraction);
        cr_expect_eq(a.requests[i].tier_pruned_fraction, b.requests[i].tier_pruned_fraction);
        cr_expect_eq(a.requests[i].done_s, b.requests[i].done_s);
    }
    kv_run_result_free(&a);
    kv_run_result_free(&b);
    kv_workload_destroy(w);
    kv_scenario_destroy(f.s);
}

/* Mean over the requests of one prompt length of a tier share. */
static double mean_share(const kv_run_result *r, int prompt, bool pruned)
{
    double sum = 0;
    int n = 0;
    for (size_t i = 0; i < r->n_requests; i++)
        if (r->requests[i].prompt_tokens == prompt) {
            sum += pruned ? r->requests[i].tier_pruned_fraction : r->requests[i].tier_high_fraction;
            n++;
        }
    return n ? sum / n : NAN;
}

Test(length_curves, diffkv_spread_growing_with_length_gives_other_tiers_at_8k_than_1k)
{
    fixture f;
    fixture_load(&f);
    make_tables();
    int prompts[] = {1024, 8192};
    kv_workload *w = workload_of(16, prompts, 2, 64);
    kv_diffkv_curve c = diffkv_curve2(1024, narrow_z, 8192, wide_z);
    kv_run_result r;
    kv_error err = {0};
    cr_assert_eq(run(&f, "diffkv", w, NULL, &c, &r, &err), 0, "%s", err.msg);
    /* 1K: z in 0.5..1.5, none below alpha_low = 0.02; 8K: P(z < 0.02) = (ln 0.02 + 6) / 8 = 0.26. */
    double p1 = mean_share(&r, 1024, true), p8 = mean_share(&r, 8192, true);
    cr_expect(p1 < 0.01, "1K pruned %g", p1);
    cr_expect(p8 > 0.2 && p8 < 0.3, "8K pruned %g", p8);
    double h1 = mean_share(&r, 1024, false), h8 = mean_share(&r, 8192, false);
    cr_expect(h1 > 0.45, "1K high %g", h1);
    cr_expect(h8 < 0.32, "8K high %g", h8);
    size_t long_prompts = 0;
    for (size_t i = 0; i < r.n_requests; i++)
        long_prompts += r.requests[i].prompt_tokens == 8192;
    cr_expect(long_prompts > 0 && long_prompts < r.n_requests);
    cr_expect_eq(r.diffkv_beyond_requests, long_prompts, "8K prompts + 64 outputs go beyond 8192: %zu",
                 r.diffkv_beyond_requests);
    kv_run_result_free(&r);

    /* The 1K table alone (today's single length) prunes nothing at 8K either. */
    kv_diffkv_curve one = {.window = 64, .n_lengths = 1, .lengths = {1024}, .table = {table_of(narrow_z)}};
    cr_assert_eq(run(&f, "diffkv", w, NULL, &one, &r, &err), 0, "%s", err.msg);
    cr_expect(mean_share(&r, 8192, true) < 0.01);
    kv_run_result_free(&r);
    kv_workload_destroy(w);
    kv_scenario_destroy(f.s);
}

/* The table marks the row and says why under it; results.json carries the figures. */
static void expect_reported(const fixture *f, const kv_run_result *r)
{
    char *path = kvt_source("policies/lynx.lua");
    kv_policy *p = kvt_policy_load(path, NULL, 0);
    free(path);
    kv_policy_outcome o = {.name = "lynx", .file = "lynx.lua", .policy = p, .run = *r};
    kv_summary_compute(&o.run, 1.0, &o.summary);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    cr_assert_not_null(mem);
    kv_report_table(mem, f->s, &o, 1);
    kv_report_json(mem, f->s, &o, 1);
    fclose(mem);
    cr_expect(strstr(text, "\nlynx\xe2\x80\xa0 "), "the row is marked:\n%s", text);
    cr_expect(strstr(text, "% of requests beyond the measured 8,192 prompt tokens: acceptance held there (mean 0.50); "
                           "trend band 0.35\xe2\x80\x93" "0.50"),
              "the footnote:\n%s", text);
    cr_expect(strstr(text, "\"beyond_measured\":{\"method\":\"held at the longest measured length\",\"lynx\":{"
                           "\"longest_measured_tokens\":8192,"),
              "results.json:\n%s", text);
    const char *trend = strstr(text, "\"trend_mean_accept\":");
    cr_expect(trend && fabs(strtod(trend + strlen("\"trend_mean_accept\":"), NULL) - 0.35) < 1e-12,
              "results.json:\n%s", text);
    free(text);
    kv_policy_destroy(p);
}

Test(length_curves, requests_beyond_the_longest_length_are_counted_with_the_band)
{
    fixture f;
    fixture_load(&f);
    make_tables();
    int prompts[] = {1024, 16384};
    kv_workload *w = workload_of(20, prompts, 2, 64);
    size_t long_prompts = 0;
    for (size_t i = 0; i < kv_workload_count(w); i++)
        long_prompts += kv_workload_get(w, i)->prompt_tokens == 16384;
    cr_assert(long_prompts > 0 && long_prompts < 20);

    kv_accept_curve a = accept_curve2(1024, 0.95, 8192, 0.5);
    kv_run_result r;
    kv_error err = {0};
    cr_assert_eq(run(&f, "lynx", w, &a, NULL, &r, &err), 0, "%s", err.msg);
    cr_expect_eq(r.accept_longest_tokens, 8192);
    cr_expect_eq(r.accept_beyond_requests, long_prompts);
    cr_expect(fabs(r.accept_beyond_share - (double)long_prompts / 20.0) < 1e-12);
    cr_expect_eq(r.accept_beyond_max_tokens, 16384);
    cr_expect(fabs(r.accept_held_mean - 0.5) < 1e-12, "held %g", r.accept_held_mean);
    /* 16384 is 4/3 of the way from 1024 to 8192 again in log length: 0.95 - 4/3 x 0.45 = 0.35. */
    cr_expect(fabs(r.accept_trend_mean - 0.35) < 1e-12, "trend %g", r.accept_trend_mean);
    cr_expect(isnan(r.diffkv_held_high), "no DiffKV curve");
    expect_reported(&f, &r);
    kv_run_result_free(&r);

    kv_diffkv_curve d = diffkv_curve2(1024, narrow_z, 8192, wide_z);
    cr_assert_eq(run(&f, "diffkv", w, NULL, &d, &r, &err), 0, "%s", err.msg);
    cr_expect_eq(r.diffkv_longest_tokens, 8192);
    cr_expect_eq(r.diffkv_beyond_requests, long_prompts);
    cr_expect_eq(r.diffkv_beyond_max_tokens, 16384 + 64);
    double high1 = 1 - kv_diffkv_table_cdf(narrow_z, 1.0), high8 = 1 - kv_diffkv_table_cdf(wide_z, 1.0);
    double wt = log((16384.0 + 64) / 1024.0) / log(8.0);
    cr_expect(fabs(r.diffkv_held_high - high8) < 1e-12, "held high %g, expected %g", r.diffkv_held_high, high8);
    cr_expect(fabs(r.diffkv_trend_high - (high1 + wt * (high8 - high1))) < 1e-12, "trend high %g",
              r.diffkv_trend_high);
    cr_expect(r.diffkv_trend_high < r.diffkv_held_high);
    kv_run_result_free(&r);
    kv_workload_destroy(w);
    kv_scenario_destroy(f.s);
}

Test(length_curves, invalid_curves_are_rejected_with_a_message)
{
    fixture f;
    fixture_load(&f);
    make_tables();
    int prompts[] = {1024};
    kv_workload *w = workload_of(2, prompts, 1, 16);
    kv_run_result r;
    kv_error err = {0};
    kv_accept_curve a = accept_curve2(2048, 0.9, 1024, 0.8);
    cr_expect_eq(run(&f, "lynx", w, &a, NULL, &r, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "increase strictly") && strstr(err.msg, "test curve"), "%s", err.msg);
    kv_run_result_free(&r);
    a = accept_curve2(1024, 0.9, 2048, 1.5);
    cr_expect_eq(run(&f, "lynx", w, &a, NULL, &r, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "must be in [0, 1]"), "%s", err.msg);
    kv_run_result_free(&r);
    a.n_lengths = 0;
    cr_expect_eq(run(&f, "lynx", w, &a, NULL, &r, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "0 measured lengths"), "%s", err.msg);
    kv_run_result_free(&r);

    kv_diffkv_curve d = diffkv_curve2(1024, narrow_z, 8192, wide_z);
    d.table[1].layers = 2;
    cr_expect_eq(run(&f, "diffkv", w, NULL, &d, &r, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "same shape"), "%s", err.msg);
    kv_run_result_free(&r);
    double bad[KV_DIFFKV_TABLE_POINTS];
    memcpy(bad, narrow_z, sizeof bad);
    bad[5] = 0.1; /* decreasing */
    d = diffkv_curve2(1024, narrow_z, 8192, bad);
    cr_expect_eq(run(&f, "diffkv", w, NULL, &d, &r, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "non-decreasing"), "%s", err.msg);
    kv_run_result_free(&r);
    kv_workload_destroy(w);
    kv_scenario_destroy(f.s);
}
