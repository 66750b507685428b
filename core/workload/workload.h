/* workload.h — the requests a run simulates: synthetic arrivals or a trace file.
 *
 * A workload is a list of requests sorted by arrival time, made once before
 * the run from the scenario's `workload:` section and a seeded RNG, so the
 * same scenario and seed give the same list.
 *
 * Synthetic: request 0 arrives at 0 s, each next one a gap later (exponential,
 * gamma or fixed gaps of mean 1/rate_per_s). Gaps, prompt lengths and output
 * lengths come from three streams forked from the caller's RNG (labels 1, 2, 3;
 * the caller's RNG is not advanced), so changing the arrival process leaves
 * the lengths as they were.
 *
 * Trace: times are counted from the trace's first row (which arrives at 0 s)
 * and multiplied by time_scale.
 *
 * A zero-filled kv_workload_config is a valid start: 0 means "default" for
 * requests (all trace rows), time_scale (1), max_prompt_tokens (none),
 * a length's min (1) and max (no upper bound; required by uniform).
 */
#ifndef KV_WORKLOAD_H
#define KV_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/workload/trace.h"

typedef enum kv_arrival_kind {
    KV_ARRIVAL_POISSON = 0, /* exponential gaps at rate_per_s */
    KV_ARRIVAL_GAMMA = 1,   /* gamma gaps at rate_per_s with shape `burstiness` (cv = 1/sqrt(shape)) */
    KV_ARRIVAL_FIXED = 2,   /* evenly spaced at rate_per_s (all at 0 when rate is 0) */
} kv_arrival_kind;

typedef enum kv_length_kind {
    KV_LEN_FIXED = 0,     /* value */
    KV_LEN_UNIFORM = 1,   /* integer uniform in [min, max] */
    KV_LEN_LOGNORMAL = 2, /* median `value`, sigma `sigma`, clamped to [min, max] */
    KV_LEN_EMPIRICAL = 3, /* drawn from `samples` with equal weight */
} kv_length_kind;

typedef struct kv_length_dist {
    kv_length_kind kind;
    double value;         /* tokens: fixed length, or lognormal median; rounded to nearest */
    double sigma;         /* lognormal: sd of ln(length), >= 0 */
    int min, max;         /* tokens: bounds (0 = 1 and unbounded) for uniform and lognormal
                             (which clamps into them); fixed and empirical ignore them */
    const int *samples;   /* KV_LEN_EMPIRICAL: lengths in tokens, each >= 1; owned by the caller,
                             read only during kv_workload_create */
    size_t n_samples;     /* KV_LEN_EMPIRICAL: >= 1 */
} kv_length_dist;

#define KV_WORKLOAD_MAX_COPIES 1000000     /* workload.trace.repeat's maximum (KV_TRACE_* and
                                              KV_WORKLOAD_MAX_REQUESTS: trace.h) */

typedef struct kv_workload_config {
    int requests;              /* how many to make (synthetic, >= 1), or cap on the rows of all the trace's
                                  copies (0 = all) */
    kv_arrival_kind arrival;
    double rate_per_s;         /* requests per simulated second; > 0 (fixed: >= 0) */
    double burstiness;         /* gamma shape, > 0: 1 = Poisson, < 1 burstier, > 1 smoother */
    kv_length_dist prompt, output;
    kv_trace_format trace_format;
    const char *trace_path;    /* NULL for synthetic; read only during kv_workload_create */
    double time_scale;         /* trace timestamps are multiplied by this (0 or 1 = as recorded) */
    int repeat;                /* trace: copies of the trace laid end to end in time (0 or 1: the trace
                                  once; at most KV_WORKLOAD_MAX_COPIES): copy k is shifted by
                                  k * span * n/(n-1) for n rows spanning `span` seconds, so the mean
                                  rate is kept; `requests` caps the rows of all copies */
    int max_prompt_tokens;     /* clamp (0 = none), e.g. to the model's context */
    bool fit_context;          /* with max_prompt_tokens: also cut each request's prompt + output to it
                                  (prompt to at most max - 1, output to what remains) */
} kv_workload_config;

typedef struct kv_workload kv_workload;

/* Makes the request list into *out (free with kv_workload_destroy); *out is NULL
   on failure. Trace problems (missing file, empty, bad row, unsorted or
   negative times) give KV_EINPUT naming the file, line and column; a bad
   config value gives KV_EINPUT naming its key ("workload.rate_per_s: ..."),
   for the scenario loader to prefix with file:line:col. rng may be NULL
   for a trace workload. */
int kv_workload_create(const kv_workload_config *cfg, kv_rng *rng, kv_workload **out, kv_error *err);
void kv_workload_destroy(kv_workload *w); /* NULL is fine */
size_t kv_workload_count(const kv_workload *w);
const kv_request_spec *kv_workload_get(const kv_workload *w, size_t i); /* NULL if i >= count */

#endif
