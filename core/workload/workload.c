/* workload.c — makes a run's request list: synthetic arrivals and lengths, or a trace (optionally tiled).
 *
 * Invariants of every list made here:
 *   1. ids are 0, 1, 2, ... in list order;
 *   2. arrival_s is finite, >= 0 and non-decreasing, the first is 0;
 *   3. prompt_tokens and output_tokens are >= 1 (prompt <= max_prompt_tokens when set).
 * kv_workload_create checks them before returning, so a bug here is a failure,
 * never a silently wrong run.
 */
#include "core/workload/workload.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdbool.h>

#include "core/base/alloc.h"
#include "core/workload/trace.h"

struct kv_workload {
    kv_request_spec *requests; /* [count], owned */
    size_t count;
};

/* Labels of the RNG streams forked from the caller's RNG. */
enum { STREAM_ARRIVALS = 1, STREAM_PROMPT = 2, STREAM_OUTPUT = 3 };

/* The bounds of a length distribution, with 0 meaning "1" and "unbounded". */
static int dist_min(const kv_length_dist *d)
{
    return d->min > 0 ? d->min : 1;
}

static int dist_max(const kv_length_dist *d)
{
    return d->max > 0 ? d->max : INT_MAX;
}

/* A length distribution's error, keyed workload.<dist>.<field> (kv_scenario_locate adds the position). */
static int bad_length(kv_error *err, const char *dist, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad_length(kv_error *err, const char *dist, const char *field, const char *fmt, ...)
{
    char key[96], what[512];
    snprintf(key, sizeof key, "workload.%s.%s", dist, field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kv_error_set_key(err, KV_EINPUT, key, "%s: %s", key, what);
}

static int check_dist(const kv_length_dist *d, const char *key, kv_error *err)
{
    if (d->min < 0)
        return bad_length(err, key, "min", "must be >= 0 (got %d)", d->min);
    if (d->max < 0)
        return bad_length(err, key, "max", "must be >= 0 (got %d)", d->max);
    if (dist_max(d) < dist_min(d))
        return bad_length(err, key, "max", "%d is below min %d", d->max, dist_min(d));
    switch (d->kind) {
    case KV_LEN_FIXED:
        if (!isfinite(d->value) || !(d->value >= 0.5) || d->value > (double)INT_MAX)
            return bad_length(err, key, "value", "must be a number of tokens >= 1 (got %g)", d->value);
        return KV_OK;
    case KV_LEN_UNIFORM:
        if (d->max == 0)
            return bad_length(err, key, "max", "a uniform length needs max");
        return KV_OK;
    case KV_LEN_LOGNORMAL:
        if (!isfinite(d->value) || !(d->value > 0.0))
            return bad_length(err, key, "value", "the median must be > 0 (got %g)",
                                d->value);
        if (!isfinite(d->sigma) || !(d->sigma >= 0.0))
            return bad_length(err, key, "sigma", "must be >= 0 (got %g)", d->sigma);
        return KV_OK;
    case KV_LEN_EMPIRICAL:
        if (!d->samples || d->n_samples == 0)
            return bad_length(err, key, "samples", "an empirical length needs samples");
        for (size_t i = 0; i < d->n_samples; i++)
            if (d->samples[i] < 1) {
                char dotted[96];
                snprintf(dotted, sizeof dotted, "workload.%s.samples", key);
                return kv_error_set_key(err, KV_EINPUT, dotted, "%s[%zu]: must be >= 1 (got %d)", dotted, i,
                                        d->samples[i]);
            }
        return KV_OK;
    }
    return bad_length(err, key, "kind", "unknown length distribution %d", (int)d->kind);
}

/* Rounds x to the nearest integer in [lo, hi]; x may be huge or tiny. */
static int clamp_round(double x, int lo, int hi)
{
    if (!(x >= lo)) /* also catches NaN, which cannot come from a valid config */
        return lo;
    if (x >= hi)
        return hi;
    long long v = llround(x);
    return v < lo ? lo : v > hi ? hi : (int)v;
}

static int draw_length(const kv_length_dist *d, kv_rng *rng)
{
    int lo = dist_min(d), hi = dist_max(d);
    switch (d->kind) {
    case KV_LEN_FIXED:
        return clamp_round(d->value, 1, INT_MAX);
    case KV_LEN_UNIFORM:
        return lo + (int)kv_rng_below(rng, (uint64_t)hi - (uint64_t)lo + 1);
    case KV_LEN_LOGNORMAL:
        /* ln(length) ~ N(ln(median), sigma^2) */
        return clamp_round(d->value * exp(d->sigma * kv_rng_normal(rng)), lo, hi);
    case KV_LEN_EMPIRICAL:
        return d->samples[kv_rng_below(rng, d->n_samples)];
    }
    return lo; /* unreachable: check_dist rejected other kinds */
}

static int check_synthetic(const kv_workload_config *cfg, kv_error *err)
{
    if (cfg->requests < 1)
        return kv_error_set_key(err, KV_EINPUT, "workload.requests",
                                "workload.requests: a synthetic workload needs >= 1 (got %d)",
                            cfg->requests);
    switch (cfg->arrival) {
    case KV_ARRIVAL_POISSON:
    case KV_ARRIVAL_GAMMA:
        if (!isfinite(cfg->rate_per_s) || !(cfg->rate_per_s > 0.0))
            return kv_error_set_key(err, KV_EINPUT, "workload.rate_per_s",
                                    "workload.rate_per_s: must be > 0 (got %g)", cfg->rate_per_s);
        if (cfg->arrival == KV_ARRIVAL_GAMMA && (!isfinite(cfg->burstiness) || !(cfg->burstiness > 0.0)))
            return kv_error_set_key(err, KV_EINPUT, "workload.burstiness",
                                    "workload.burstiness: the gamma shape must be > 0 (got %g)",
                                cfg->burstiness);
        break;
    case KV_ARRIVAL_FIXED:
        if (!isfinite(cfg->rate_per_s) || !(cfg->rate_per_s >= 0.0))
            return kv_error_set_key(err, KV_EINPUT, "workload.rate_per_s",
                                    "workload.rate_per_s: must be >= 0 (got %g)", cfg->rate_per_s);
        break;
    default:
        return kv_error_set_key(err, KV_EINPUT, "workload.arrival",
                                "workload.arrival: unknown arrival process %d", (int)cfg->arrival);
    }
    int rc = check_dist(&cfg->prompt, "prompt", err);
    return rc ? rc : check_dist(&cfg->output, "output", err);
}

static void make_synthetic(const kv_workload_config *cfg, kv_rng *rng, kv_request_spec *reqs)
{
    kv_rng arrivals, prompts, outputs;
    kv_rng_fork(rng, STREAM_ARRIVALS, &arrivals);
    kv_rng_fork(rng, STREAM_PROMPT, &prompts);
    kv_rng_fork(rng, STREAM_OUTPUT, &outputs);
    double t = 0.0;
    for (size_t i = 0; i < (size_t)cfg->requests; i++) {
        if (i > 0) {
            switch (cfg->arrival) {
            case KV_ARRIVAL_POISSON:
                t += kv_rng_exponential(&arrivals, cfg->rate_per_s);
                break;
            case KV_ARRIVAL_GAMMA:
                /* mean gap shape * scale = 1 / rate; cv = 1 / sqrt(shape) */
                t += kv_rng_gamma(&arrivals, cfg->burstiness, 1.0 / (cfg->rate_per_s * cfg->burstiness));
                break;
            case KV_ARRIVAL_FIXED:
                t = cfg->rate_per_s > 0.0 ? (double)i / cfg->rate_per_s : 0.0; /* no accumulated rounding */
                break;
            }
        }
        reqs[i].id = i;
        reqs[i].arrival_s = t;
        reqs[i].prompt_tokens = draw_length(&cfg->prompt, &prompts);
        reqs[i].output_tokens = draw_length(&cfg->output, &outputs);
    }
}

/* Tiles rows[0..n) end to end until `want` requests: copy k is shifted by
   k * period with period = span * n / (n - 1), i.e. the trace's span plus one
   mean gap, so the mean arrival rate of the tiled list is the trace's. A
   trace of one row, or of rows all at one time, has period 0 (they all
   arrive together, as in the trace). */
static kv_request_spec *tile_trace(const kv_request_spec *rows, size_t n, size_t want)
{
    double span = rows[n - 1].arrival_s - rows[0].arrival_s;
    double period = n >= 2 ? span * (double)n / (double)(n - 1) : 0.0;
    kv_request_spec *out = kv_calloc(want, sizeof *out);
    for (size_t j = 0; j < want; j++) {
        size_t copy = j / n;
        out[j] = rows[j % n];
        out[j].id = j;
        out[j].arrival_s = rows[j % n].arrival_s + (double)copy * period;
    }
    return out;
}

static int make_from_trace(const kv_workload_config *cfg, kv_request_spec **reqs, size_t *count, kv_error *err)
{
    if (!cfg->trace_path)
        return kv_error_set_key(err, KV_EINPUT, "workload.trace.path",
                                "workload.trace.path: a trace workload needs a file");
    if (cfg->requests < 0)
        return kv_error_set_key(err, KV_EINPUT, "workload.requests",
                                "workload.requests: must be >= 0 (got %d)", cfg->requests);
    if (!isfinite(cfg->time_scale) || !(cfg->time_scale >= 0.0))
        return kv_error_set_key(err, KV_EINPUT, "workload.trace.time_scale",
                                "workload.trace.time_scale: must be > 0 (got %g)", cfg->time_scale);
    if (cfg->repeat < 0 || cfg->repeat > KV_WORKLOAD_MAX_COPIES)
        return kv_error_set_key(err, KV_EINPUT, "workload.trace.repeat",
                                "workload.trace.repeat: must be 1 to %d copies (got %d)",
                            KV_WORKLOAD_MAX_COPIES, cfg->repeat);
    size_t copies = cfg->repeat > 1 ? (size_t)cfg->repeat : 1;
    /* One copy: read only the rows asked for. Several: the whole trace, whose span sets the period. */
    int rc = kv_trace_read(cfg->trace_format, cfg->trace_path, copies == 1 ? cfg->requests : 0, cfg->time_scale,
                           reqs, count, err);
    if (rc)
        return rc;
    size_t n = *count, want = n * copies; /* n <= KV_WORKLOAD_MAX_REQUESTS: no overflow */
    if (cfg->requests > 0 && want > (size_t)cfg->requests)
        want = (size_t)cfg->requests; /* workload.requests caps the rows of all copies */
    if (want > KV_WORKLOAD_MAX_REQUESTS) {
        kv_free(*reqs);
        *reqs = NULL;
        *count = 0;
        return kv_error_set_key(err, KV_EINPUT, "workload.trace.repeat",
                                "workload.trace.repeat: %zu copies of the trace's %zu rows are more "
                            "than %d requests (set workload.requests to cap them)", copies, n,
                            KV_WORKLOAD_MAX_REQUESTS);
    }
    if (want < n) {
        *count = want;
    } else if (want > n) {
        kv_request_spec *tiled = tile_trace(*reqs, n, want);
        kv_free(*reqs);
        *reqs = tiled;
        *count = want;
        if (tiled[want - 1].arrival_s > KV_TRACE_MAX_TIME_S) {
            double last = tiled[want - 1].arrival_s;
            kv_free(*reqs);
            *reqs = NULL;
            *count = 0;
            return kv_error_set_key(err, KV_EINPUT, "workload.trace.repeat",
                                    "workload.trace.repeat: the last of %zu tiled requests arrives at "
                                "%.9g s, past the %.0e s kvsim keeps exact", want, last, KV_TRACE_MAX_TIME_S);
        }
    }
    return KV_OK;
}

int kv_workload_create(const kv_workload_config *cfg, kv_rng *rng, kv_workload **out, kv_error *err)
{
    *out = NULL;
    if (cfg->max_prompt_tokens < 0)
        return kv_error_set_key(err, KV_EINPUT, "workload.max_prompt_tokens",
                                "workload.max_prompt_tokens: must be >= 0 (got %d)",
                            cfg->max_prompt_tokens);
    kv_request_spec *reqs = NULL;
    size_t count = 0;
    if (cfg->trace_format != KV_TRACE_NONE || cfg->trace_path) {
        if (cfg->trace_format == KV_TRACE_NONE)
            return kv_error_set_key(err, KV_EINPUT, "workload.trace.format",
                                    "workload.trace.format: a trace file needs its format "
                                "(azure, mooncake or burstgpt)");
        int rc = make_from_trace(cfg, &reqs, &count, err);
        if (rc)
            return rc;
    } else {
        int rc = check_synthetic(cfg, err);
        if (rc)
            return rc;
        if (!rng)
            return kv_error_set(err, KV_EFAIL, "workload: internal error: a synthetic workload needs an RNG");
        count = (size_t)cfg->requests;
        reqs = kv_calloc(count, sizeof *reqs);
        make_synthetic(cfg, rng, reqs);
    }
    for (size_t i = 0; i < count; i++) {
        if (cfg->max_prompt_tokens > 0 && reqs[i].prompt_tokens > cfg->max_prompt_tokens)
            reqs[i].prompt_tokens = cfg->max_prompt_tokens;
        if (cfg->fit_context && cfg->max_prompt_tokens > 1 &&
            (long)reqs[i].prompt_tokens + reqs[i].output_tokens > cfg->max_prompt_tokens) {
            if (reqs[i].prompt_tokens >= cfg->max_prompt_tokens)
                reqs[i].prompt_tokens = cfg->max_prompt_tokens - 1;
            reqs[i].output_tokens = cfg->max_prompt_tokens - reqs[i].prompt_tokens;
        }
        bool ok = reqs[i].id == i && isfinite(reqs[i].arrival_s) && reqs[i].arrival_s >= 0.0 &&
                  (i == 0 ? reqs[i].arrival_s == 0.0 : reqs[i].arrival_s >= reqs[i - 1].arrival_s) &&
                  reqs[i].prompt_tokens >= 1 && reqs[i].output_tokens >= 1;
        if (!ok) {
            kv_error_set(err, KV_EFAIL, "workload: internal error: request %zu breaks the list's invariants "
                         "(arrival %g s, %d prompt, %d output tokens)", i, reqs[i].arrival_s,
                         reqs[i].prompt_tokens, reqs[i].output_tokens);
            kv_free(reqs);
            return KV_EFAIL;
        }
    }
    kv_workload *w = kv_malloc(sizeof *w);
    w->requests = reqs;
    w->count = count;
    *out = w;
    return KV_OK;
}

void kv_workload_destroy(kv_workload *w)
{
    if (!w)
        return;
    kv_free(w->requests);
    kv_free(w);
}

size_t kv_workload_count(const kv_workload *w)
{
    return w->count;
}

const kv_request_spec *kv_workload_get(const kv_workload *w, size_t i)
{
    return i < w->count ? &w->requests[i] : NULL;
}
