/* test_itl_histogram.c — inter-token latencies in bounded memory: kv_histogram's mean and percentiles
 * against exact ones, its memory, and the ITL summary of a run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/histogram.h"
#include "core/base/rng.h"
#include "core/config/scenario.h"
#include "core/report/metrics.h"
#include "core/report/report.h"
#include "core/study/study.h"
#include "tests/support.h"

/* The documented bound (core/base/histogram.h, README Outputs): 2^-8 relative, under 0.5%. */
#define BOUND (1.0 / 256)

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy's default (linear) percentile of sorted[n]. */
static double exact_percentile(const double *sorted, size_t n, double p)
{
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - (double)lo);
}

static size_t rows_used(const kv_histogram *h)
{
    size_t n = 0;
    for (size_t r = 0; h->rows && r < KV_HIST_EXPONENTS; r++)
        n += h->rows[r] != NULL;
    return n;
}

Test(itl_histogram, every_percentile_within_bound_of_exact)
{
    /* Log-normal latencies around 30 ms over several binary exponents, a fifth of them one repeated value. */
    size_t n = 200000;
    double *v = malloc(n * sizeof *v);
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    kv_histogram h = {0};
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = i % 5 == 0 ? 0.0312 : 0.03 * exp(0.8 * kv_rng_normal(&rng));
        sum += v[i];
        kv_histogram_add(&h, v[i]);
    }
    qsort(v, n, sizeof *v, cmp_double);
    cr_expect_eq(h.n, n);
    cr_expect(fabs(kv_histogram_mean(&h) - sum / n) <= 1e-12 * sum / n, "mean %.15g vs %.15g",
              kv_histogram_mean(&h), sum / n);
    double worst = 0;
    for (int k = 0; k <= 1000; k++) {
        double p = k / 10.0, want = exact_percentile(v, n, p), got = kv_histogram_percentile(&h, p);
        double e = fabs(got - want) / want;
        cr_expect(e <= BOUND, "p%g: histogram %.12g, exact %.12g (%.3g%%)", p, got, want, 100 * e);
        worst = fmax(worst, e);
    }
    cr_expect(worst > 0, "the test should exercise binning, not only exact bins");
    /* The repeated value is alone in its bin: where it is the order statistic, it comes back exactly. */
    cr_expect(fabs(kv_histogram_percentile(&h, 50) - exact_percentile(v, n, 50)) <= BOUND * v[n / 2]);
    cr_expect_eq(kv_histogram_percentile(&h, 0), v[0], "the minimum is alone in its bin");
    cr_expect_eq(kv_histogram_percentile(&h, 100), v[n - 1], "the maximum is alone in its bin");
    kv_histogram_free(&h);
    free(v);
}

Test(itl_histogram, memory_does_not_grow_with_the_count)
{
    kv_histogram h = {0};
    kv_rng rng;
    kv_rng_seed(&rng, 3);
    for (size_t i = 0; i < 2000000; i++)
        kv_histogram_add(&h, 0.005 + 0.02 * kv_rng_uniform(&rng)); /* 5-25 ms: binary exponents of 2^-8 .. 2^-6 */
    cr_expect_eq(h.n, 2000000);
    cr_expect_leq(rows_used(&h), 3, "rows %zu: one per binary exponent seen", rows_used(&h));
    kv_histogram_free(&h);
    cr_expect(h.rows == NULL && h.n == 0, "free leaves it empty");
}

Test(itl_histogram, zero_single_values_and_invalid)
{
    kv_histogram h = {0};
    kv_stat st;
    kv_stat_from_histogram(&h, 1e3, &st);
    cr_expect(st.n == 0 && isnan(st.mean) && isnan(st.p99), "empty: n 0 and NaN, as kv_stat_compute");
    kv_histogram_add(&h, 0.0);
    kv_histogram_add(&h, -0.0);
    kv_histogram_add(&h, 0.25);
    kv_histogram_add(&h, -1);
    kv_histogram_add(&h, NAN);
    kv_histogram_add(&h, INFINITY);
    cr_expect_eq(h.n, 3);
    cr_expect_eq(h.n_invalid, 3);
    kv_stat_from_histogram(&h, 1e3, &st);
    double vals[] = {0, 0, 0.25};
    kv_stat want;
    kv_stat_compute(vals, 3, &want);
    cr_expect_eq(st.n, 3);
    cr_expect_eq(st.median, want.median * 1e3);
    cr_expect_eq(st.p90, want.p90 * 1e3, "p90 %.17g vs %.17g", st.p90, want.p90 * 1e3);
    cr_expect_eq(st.mean, want.mean * 1e3);
    kv_histogram_free(&h);
}

/* A whole run (bench-sim's scenario, 2,000 requests, int8: one token per commit): the summary counts one ITL
   per token after each request's first, its mean is the ITLs' mean (sum of step gaps = done - first token),
   and its histogram holds a few rows, not one value per token. */
Test(itl_histogram, run_summary_counts_every_itl)
{
    const char *sets[] = {"workload.requests=2000"};
    kv_scenario *s = NULL;
    kv_study *st = kvt_study_run(KV_SOURCE_DIR "/scenarios/bench-sim.yaml", sets, 1, &s);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 1);
    double tokens = 0, gaps = 0;
    for (size_t i = 0; i < o->run.n_requests; i++) {
        const kv_request_result *q = &o->run.requests[i];
        cr_assert(q->done_s >= 0);
        tokens += q->output_tokens - 1;
        gaps += q->done_s - q->first_token_s;
        if (q->output_tokens > 1)
            cr_expect(q->second_commit_s > q->first_token_s && q->second_commit_s <= q->done_s);
        else
            cr_expect(q->second_commit_s < 0);
    }
    cr_expect_eq((double)o->summary.itl_ms.n, tokens);
    cr_expect(fabs(o->summary.itl_ms.mean - gaps / tokens * 1e3) <= 1e-9 * o->summary.itl_ms.mean,
              "mean ITL %.12g ms, gaps %.12g ms", o->summary.itl_ms.mean, gaps / tokens * 1e3);
    cr_expect(o->summary.itl_ms.median <= o->summary.itl_ms.p90 && o->summary.itl_ms.p90 <= o->summary.itl_ms.p99);
    cr_expect_leq(rows_used(&o->run.itl_s), 8, "%zu rows for %.0f ITLs", rows_used(&o->run.itl_s), tokens);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}
