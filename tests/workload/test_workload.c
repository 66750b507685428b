/* test_workload.c — synthetic workloads are deterministic and have the asked-for statistics; traces cap, scale and tile. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/workload/workload.h"

#define SAMPLES "scenarios/traces/"

static kv_workload_config poisson(int requests, double rate)
{
    kv_workload_config c = {0};
    c.requests = requests;
    c.arrival = KV_ARRIVAL_POISSON;
    c.rate_per_s = rate;
    c.prompt = (kv_length_dist){.kind = KV_LEN_FIXED, .value = 512};
    c.output = (kv_length_dist){.kind = KV_LEN_FIXED, .value = 64};
    return c;
}

static kv_workload *make(const kv_workload_config *c, uint64_t seed)
{
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    kv_workload *w = NULL;
    kv_error err = {0};
    int rc = kv_workload_create(c, &rng, &w, &err);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    cr_assert_not_null(w);
    return w;
}

/* The invariants of every list: ids in order, first at 0, sorted, tokens >= 1. */
static void check_list(const kv_workload *w)
{
    size_t n = kv_workload_count(w);
    cr_assert(n > 0);
    cr_assert_eq(kv_workload_get(w, 0)->arrival_s, 0.0);
    for (size_t i = 0; i < n; i++) {
        const kv_request_spec *r = kv_workload_get(w, i);
        cr_assert_eq(r->id, i);
        cr_assert(r->prompt_tokens >= 1 && r->output_tokens >= 1);
        if (i > 0)
            cr_assert(r->arrival_s >= kv_workload_get(w, i - 1)->arrival_s);
    }
    cr_assert_null(kv_workload_get(w, n));
}

static int same_list(const kv_workload *a, const kv_workload *b)
{
    if (kv_workload_count(a) != kv_workload_count(b))
        return 0;
    return memcmp(kv_workload_get(a, 0), kv_workload_get(b, 0), kv_workload_count(a) * sizeof(kv_request_spec)) == 0;
}

/* Mean and coefficient of variation of the gaps between arrivals. */
static void gap_stats(const kv_workload *w, double *mean, double *cv)
{
    size_t n = kv_workload_count(w);
    double sum = 0, sum2 = 0;
    for (size_t i = 1; i < n; i++) {
        double g = kv_workload_get(w, i)->arrival_s - kv_workload_get(w, i - 1)->arrival_s;
        sum += g;
        sum2 += g * g;
    }
    *mean = sum / (double)(n - 1);
    *cv = sqrt(sum2 / (double)(n - 1) - *mean * *mean) / *mean;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

Test(workload, same_seed_same_list_other_seed_other_list)
{
    kv_workload_config c = poisson(1000, 5.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_LOGNORMAL, .value = 600, .sigma = 0.8, .max = 8192};
    c.output = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 10, .max = 300};
    kv_workload *a = make(&c, 42), *b = make(&c, 42), *d = make(&c, 43);
    check_list(a);
    cr_expect(same_list(a, b), "same seed must give byte-identical lists");
    cr_expect(!same_list(a, d), "another seed must give another list");
    kv_workload_destroy(a);
    kv_workload_destroy(b);
    kv_workload_destroy(d);
    kv_workload_destroy(NULL);
}

Test(workload, poisson_rate_and_gaps)
{
    kv_workload_config c = poisson(20000, 8.0);
    kv_workload *w = make(&c, 1);
    check_list(w);
    double mean, cv;
    gap_stats(w, &mean, &cv);
    cr_expect(fabs(mean * 8.0 - 1.0) < 0.03, "mean gap %g, expected 0.125", mean);
    cr_expect(fabs(cv - 1.0) < 0.05, "exponential gaps have cv 1, got %g", cv);
    kv_workload_destroy(w);
}

Test(workload, gamma_burstiness)
{
    kv_workload_config c = poisson(20000, 4.0);
    c.arrival = KV_ARRIVAL_GAMMA;
    c.burstiness = 0.25; /* cv = 1 / sqrt(0.25) = 2 */
    kv_workload *w = make(&c, 2);
    check_list(w);
    double mean, cv;
    gap_stats(w, &mean, &cv);
    cr_expect(fabs(mean * 4.0 - 1.0) < 0.06, "mean gap %g, expected 0.25", mean);
    cr_expect(fabs(cv - 2.0) < 0.2, "cv %g, expected 2", cv);
    kv_workload_destroy(w);

    c.burstiness = 4.0; /* smoother than Poisson: cv 0.5 */
    w = make(&c, 2);
    gap_stats(w, &mean, &cv);
    cr_expect(fabs(mean * 4.0 - 1.0) < 0.03, "mean gap %g", mean);
    cr_expect(fabs(cv - 0.5) < 0.03, "cv %g, expected 0.5", cv);
    kv_workload_destroy(w);
}

Test(workload, fixed_arrivals)
{
    kv_workload_config c = poisson(10, 4.0);
    c.arrival = KV_ARRIVAL_FIXED;
    kv_workload *w = make(&c, 3);
    for (size_t i = 0; i < 10; i++)
        cr_expect_eq(kv_workload_get(w, i)->arrival_s, (double)i / 4.0);
    kv_workload_destroy(w);
    c.rate_per_s = 0.0; /* everything at once */
    w = make(&c, 3);
    for (size_t i = 0; i < 10; i++)
        cr_expect_eq(kv_workload_get(w, i)->arrival_s, 0.0);
    kv_workload_destroy(w);
}

Test(workload, fixed_and_uniform_lengths)
{
    kv_workload_config c = poisson(20000, 10.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_FIXED, .value = 333.4};
    c.output = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 5, .max = 14};
    kv_workload *w = make(&c, 4);
    long counts[10] = {0};
    for (size_t i = 0; i < kv_workload_count(w); i++) {
        const kv_request_spec *r = kv_workload_get(w, i);
        cr_assert_eq(r->prompt_tokens, 333);
        cr_assert(r->output_tokens >= 5 && r->output_tokens <= 14, "got %d", r->output_tokens);
        counts[r->output_tokens - 5]++;
    }
    for (int k = 0; k < 10; k++) /* each of 10 values ~2000 times */
        cr_expect(counts[k] > 1800 && counts[k] < 2200, "value %d drawn %ld times", k + 5, counts[k]);
    kv_workload_destroy(w);
}

Test(workload, lognormal_median_and_clamp)
{
    kv_workload_config c = poisson(20001, 10.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_LOGNORMAL, .value = 1000, .sigma = 1.0};
    c.output = (kv_length_dist){.kind = KV_LEN_LOGNORMAL, .value = 100, .sigma = 2.0, .min = 20, .max = 400};
    kv_workload *w = make(&c, 5);
    size_t n = kv_workload_count(w);
    int *prompt = malloc(n * sizeof *prompt);
    long at_min = 0, at_max = 0;
    double sum_log = 0, sum_log2 = 0;
    for (size_t i = 0; i < n; i++) {
        const kv_request_spec *r = kv_workload_get(w, i);
        prompt[i] = r->prompt_tokens;
        double l = log(r->prompt_tokens);
        sum_log += l;
        sum_log2 += l * l;
        cr_assert(r->output_tokens >= 20 && r->output_tokens <= 400, "got %d", r->output_tokens);
        at_min += r->output_tokens == 20;
        at_max += r->output_tokens == 400;
    }
    qsort(prompt, n, sizeof *prompt, cmp_int);
    cr_expect(prompt[n / 2] > 950 && prompt[n / 2] < 1050, "median %d, expected ~1000", prompt[n / 2]);
    double mean_log = sum_log / (double)n, sd_log = sqrt(sum_log2 / (double)n - mean_log * mean_log);
    cr_expect(fabs(sd_log - 1.0) < 0.05, "sd of ln(length) %g, expected 1", sd_log);
    /* P(X < 20) = Phi(ln(0.2)/2) = 0.21, P(X > 400) = 1 - Phi(ln(4)/2) = 0.24 */
    cr_expect(at_min > 0.18 * (double)n && at_min < 0.24 * (double)n, "%ld clamped to min", at_min);
    cr_expect(at_max > 0.21 * (double)n && at_max < 0.27 * (double)n, "%ld clamped to max", at_max);
    free(prompt);
    kv_workload_destroy(w);
}

Test(workload, empirical_lengths)
{
    static const int samples[4] = {7, 100, 100, 2000}; /* 100 twice: weight 1/2 */
    kv_workload_config c = poisson(20000, 10.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_EMPIRICAL, .samples = samples, .n_samples = 4};
    kv_workload *w = make(&c, 6);
    long n7 = 0, n100 = 0, n2000 = 0;
    for (size_t i = 0; i < kv_workload_count(w); i++) {
        int p = kv_workload_get(w, i)->prompt_tokens;
        cr_assert(p == 7 || p == 100 || p == 2000, "got %d", p);
        n7 += p == 7;
        n100 += p == 100;
        n2000 += p == 2000;
    }
    cr_expect(n7 > 4600 && n7 < 5400, "%ld", n7);
    cr_expect(n100 > 9500 && n100 < 10500, "%ld", n100);
    cr_expect(n2000 > 4600 && n2000 < 5400, "%ld", n2000);
    kv_workload_destroy(w);
}

/* Arrivals and lengths come from separate streams: changing the rate leaves the lengths alone. */
Test(workload, streams_are_independent)
{
    kv_workload_config c = poisson(500, 2.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 1, .max = 4096};
    kv_workload *a = make(&c, 7);
    c.arrival = KV_ARRIVAL_GAMMA;
    c.burstiness = 0.5;
    c.rate_per_s = 9.0;
    kv_workload *b = make(&c, 7);
    int differ = 0;
    for (size_t i = 0; i < 500; i++) {
        cr_assert_eq(kv_workload_get(a, i)->prompt_tokens, kv_workload_get(b, i)->prompt_tokens);
        differ += kv_workload_get(a, i)->arrival_s != kv_workload_get(b, i)->arrival_s;
    }
    cr_expect(differ > 400);
    kv_workload_destroy(a);
    kv_workload_destroy(b);
}

Test(workload, fit_context_cuts_prompt_plus_output_to_the_context)
{
    kv_workload_config c = poisson(2000, 10.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 1, .max = 6000};
    c.output = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 1, .max = 2000};
    c.max_prompt_tokens = 4096;
    kv_workload *plain = make(&c, 8);
    c.fit_context = true;
    kv_workload *fit = make(&c, 8);
    long cut = 0;
    for (size_t i = 0; i < kv_workload_count(fit); i++) {
        const kv_request_spec *a = kv_workload_get(plain, i), *b = kv_workload_get(fit, i);
        cr_assert(b->prompt_tokens + b->output_tokens <= 4096, "request %zu: %d + %d", i, b->prompt_tokens,
                  b->output_tokens);
        cr_assert(b->prompt_tokens >= 1 && b->output_tokens >= 1);
        if (a->prompt_tokens + a->output_tokens <= 4096)
            cr_assert(a->prompt_tokens == b->prompt_tokens && a->output_tokens == b->output_tokens,
                      "request %zu fits and must be left as it is", i);
        else
            cut++;
    }
    cr_expect(cut > 500, "about a third should be cut, got %ld", cut);
    kv_workload_destroy(plain);
    kv_workload_destroy(fit);
}

Test(workload, max_prompt_tokens_clamps)
{
    kv_workload_config c = poisson(2000, 10.0);
    c.prompt = (kv_length_dist){.kind = KV_LEN_UNIFORM, .min = 1, .max = 10000};
    c.max_prompt_tokens = 4096;
    kv_workload *w = make(&c, 8);
    long clamped = 0;
    for (size_t i = 0; i < kv_workload_count(w); i++) {
        cr_assert(kv_workload_get(w, i)->prompt_tokens <= 4096);
        clamped += kv_workload_get(w, i)->prompt_tokens == 4096;
    }
    cr_expect(clamped > 1000, "about 59%% should hit the clamp, got %ld", clamped);
    kv_workload_destroy(w);

    kv_workload_config t = {.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv",
                            .max_prompt_tokens = 1000};
    w = make(&t, 0);
    cr_expect_eq(kv_workload_get(w, 0)->prompt_tokens, 1000); /* 4808 in the trace */
    cr_expect_eq(kv_workload_get(w, 2)->prompt_tokens, 110);
    kv_workload_destroy(w);
}

Test(workload, trace_cap_and_time_scale)
{
    kv_workload_config c = {.requests = 100, .trace_format = KV_TRACE_AZURE,
                            .trace_path = SAMPLES "azure-code-2023-sample.csv", .time_scale = 0.5};
    kv_workload *w = make(&c, 0);
    check_list(w);
    cr_expect_eq(kv_workload_count(w), 100);
    cr_expect(fabs(kv_workload_get(w, 1)->arrival_s - 0.026) < 1e-9);
    kv_workload_destroy(w);
    c.requests = 0; /* all rows */
    c.time_scale = 0; /* as recorded */
    w = make(&c, 0);
    cr_expect_eq(kv_workload_count(w), 300);
    cr_expect(fabs(kv_workload_get(w, 299)->arrival_s - 216.838239) < 1e-9);
    kv_workload_destroy(w);
    c.requests = 1000; /* more than the trace holds, no repeat: the whole trace */
    w = make(&c, 0);
    cr_expect_eq(kv_workload_count(w), 300);
    kv_workload_destroy(w);
}

/* What `kvsim bench sim` uses: the Azure code sample tiled to 10,000 requests (34 copies, capped). */
Test(workload, trace_repeat_tiles_and_keeps_the_rate)
{
    kv_workload_config c = {.requests = 10000, .repeat = 34, .trace_format = KV_TRACE_AZURE,
                            .trace_path = SAMPLES "azure-code-2023-sample.csv"};
    kv_workload *w = make(&c, 0);
    check_list(w);
    cr_assert_eq(kv_workload_count(w), 10000);
    const double span = 216.838239, period = span * 300.0 / 299.0;
    for (size_t j = 300; j < 10000; j++) {
        const kv_request_spec *r = kv_workload_get(w, j), *src = kv_workload_get(w, j % 300);
        cr_assert_eq(r->prompt_tokens, src->prompt_tokens);
        cr_assert_eq(r->output_tokens, src->output_tokens);
        cr_assert(fabs(r->arrival_s - (src->arrival_s + (double)(j / 300) * period)) < 1e-6, "request %zu", j);
    }
    /* mean rate over whole copies equals the trace's (n - 1) / span per gap */
    double rate_trace = 299.0 / span, rate_tiled = 9899.0 / kv_workload_get(w, 9899)->arrival_s;
    cr_expect(fabs(rate_tiled / rate_trace - 1.0) < 1e-9, "tiled rate %g vs %g", rate_tiled, rate_trace);
    kv_workload_destroy(w);

    c.requests = 50; /* fewer than the trace: the first 50 */
    w = make(&c, 0);
    cr_expect_eq(kv_workload_count(w), 50);
    kv_workload_destroy(w);

    c.requests = 1000; /* Mooncake starts with many rows at t = 0 */
    c.trace_format = KV_TRACE_MOONCAKE;
    c.trace_path = SAMPLES "mooncake-sample.jsonl";
    w = make(&c, 0);
    check_list(w);
    cr_expect(fabs(kv_workload_get(w, 300)->arrival_s - 102.0 * 300.0 / 299.0) < 1e-9);
    kv_workload_destroy(w);
}

typedef struct bad_config {
    kv_workload_config cfg;
    int code;
    const char *message;
} bad_config;

Test(workload, bad_configs)
{
    static const int zero_sample[2] = {5, 0};
    const kv_length_dist fixed = {.kind = KV_LEN_FIXED, .value = 10};
    const bad_config cases[] = {
        {{.requests = 0, .rate_per_s = 1, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.requests:"},
        {{.requests = -5, .rate_per_s = 1, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.requests:"},
        {{.requests = 5, .rate_per_s = -1, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.rate_per_s: must be > 0"},
        {{.requests = 5, .rate_per_s = NAN, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.rate_per_s:"},
        {{.requests = 5, .rate_per_s = INFINITY, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.rate_per_s:"},
        {{.requests = 5, .rate_per_s = 0, .prompt = fixed, .output = fixed}, KV_EINPUT, "workload.rate_per_s:"},
        {{.requests = 5, .arrival = KV_ARRIVAL_FIXED, .rate_per_s = -2, .prompt = fixed, .output = fixed}, KV_EINPUT,
         "workload.rate_per_s: must be >= 0"},
        {{.requests = 5, .arrival = KV_ARRIVAL_GAMMA, .rate_per_s = 1, .prompt = fixed, .output = fixed}, KV_EINPUT,
         "workload.burstiness:"},
        {{.requests = 5, .arrival = 9, .rate_per_s = 1, .prompt = fixed, .output = fixed}, KV_EINPUT,
         "workload.arrival:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_FIXED, .value = NAN}, .output = fixed}, KV_EINPUT,
         "workload.prompt.value:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = fixed, .output = {.kind = KV_LEN_FIXED, .value = 0}}, KV_EINPUT,
         "workload.output.value:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_UNIFORM, .min = 3}, .output = fixed}, KV_EINPUT,
         "workload.prompt.max: a uniform length needs max"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_UNIFORM, .min = 30, .max = 3}, .output = fixed},
         KV_EINPUT, "workload.prompt.max: 3 is below min 30"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_UNIFORM, .min = -1, .max = 3}, .output = fixed},
         KV_EINPUT, "workload.prompt.min:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_LOGNORMAL, .value = 0, .sigma = 1},
          .output = fixed}, KV_EINPUT, "workload.prompt.value: the median must be > 0"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_LOGNORMAL, .value = 10, .sigma = -1},
          .output = fixed}, KV_EINPUT, "workload.prompt.sigma:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_LOGNORMAL, .value = 10, .sigma = NAN},
          .output = fixed}, KV_EINPUT, "workload.prompt.sigma:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = KV_LEN_EMPIRICAL}, .output = fixed}, KV_EINPUT,
         "workload.prompt.samples: an empirical length needs samples"},
        {{.requests = 5, .rate_per_s = 1, .prompt = fixed,
          .output = {.kind = KV_LEN_EMPIRICAL, .samples = zero_sample, .n_samples = 2}}, KV_EINPUT,
         "workload.output.samples[1]: must be >= 1 (got 0)"},
        {{.requests = 5, .rate_per_s = 1, .prompt = {.kind = 7}, .output = fixed}, KV_EINPUT, "workload.prompt.kind:"},
        {{.requests = 5, .rate_per_s = 1, .prompt = fixed, .output = fixed, .max_prompt_tokens = -1}, KV_EINPUT,
         "workload.max_prompt_tokens:"},
        {{.trace_path = SAMPLES "azure-code-2023-sample.csv"}, KV_EINPUT, "workload.trace.format:"},
        {{.trace_format = KV_TRACE_AZURE}, KV_EINPUT, "workload.trace.path:"},
        {{.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv", .repeat = -1},
         KV_EINPUT, "workload.trace.repeat: must be 1 to 1000000 copies"},
        {{.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv", .repeat = 1000000},
         KV_EINPUT, "workload.trace.repeat: 1000000 copies of the trace's 300 rows are more than"},
        {{.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv", .time_scale = -1},
         KV_EINPUT, "workload.trace.time_scale:"},
        {{.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv", .time_scale = NAN},
         KV_EINPUT, "workload.trace.time_scale:"},
        {{.trace_format = KV_TRACE_AZURE, .trace_path = SAMPLES "azure-code-2023-sample.csv", .requests = -1},
         KV_EINPUT, "workload.requests:"},
        /* trace errors come through with their file:line:col */
        {{.trace_format = KV_TRACE_AZURE, .trace_path = "tests/fixtures/traces/bad-azure-unsorted.csv"}, KV_EINPUT,
         "tests/fixtures/traces/bad-azure-unsorted.csv:3:1: TIMESTAMP: time goes backwards"},
        {{.trace_format = KV_TRACE_MOONCAKE, .trace_path = "tests/fixtures/traces/missing.jsonl"}, KV_EINPUT,
         "tests/fixtures/traces/missing.jsonl: cannot open trace"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv_rng rng;
        kv_rng_seed(&rng, 1);
        kv_workload *w = (kv_workload *)&w; /* must be reset to NULL */
        kv_error err = {0};
        int rc = kv_workload_create(&cases[i].cfg, &rng, &w, &err);
        cr_expect_eq(rc, cases[i].code, "case %zu: rc %d (%s)", i, rc, err.msg);
        cr_expect_null(w, "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].message) == err.msg, "case %zu: expected '%s...', got '%s'", i,
                  cases[i].message, err.msg);
    }
}
