/* workload.h — the requests a run simulates: synthetic arrivals or a trace file.
 *
 * A workload is a list of requests sorted by arrival time, made once before
 * the run from the scenario's `workload:` section and a seeded RNG, so the
 * same scenario and seed give the same list.
 */
#ifndef KV_WORKLOAD_H
#define KV_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/rng.h"

typedef struct kv_request_spec {
    uint64_t id;        /* 0, 1, 2, ... in arrival order */
    double arrival_s;   /* simulated seconds from the start, non-decreasing */
    int prompt_tokens;  /* >= 1 */
    int output_tokens;  /* >= 1 */
} kv_request_spec;

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
    double value, sigma;
    int min, max;
    const int *samples;   /* KV_LEN_EMPIRICAL; owned by the caller */
    size_t n_samples;
} kv_length_dist;

typedef enum kv_trace_format {
    KV_TRACE_NONE = 0,
    KV_TRACE_AZURE = 1,    /* CSV: TIMESTAMP,ContextTokens,GeneratedTokens */
    KV_TRACE_MOONCAKE = 2, /* JSONL: timestamp (ms), input_length, output_length, hash_ids */
    KV_TRACE_BURSTGPT = 3, /* CSV: Timestamp,Model,Request tokens,Response tokens,... */
} kv_trace_format;

typedef struct kv_workload_config {
    int requests;              /* how many to make (synthetic), or cap on trace rows (0 = all) */
    kv_arrival_kind arrival;
    double rate_per_s;
    double burstiness;         /* gamma shape */
    kv_length_dist prompt, output;
    kv_trace_format trace_format;
    const char *trace_path;    /* NULL for synthetic */
    double time_scale;         /* trace timestamps are multiplied by this (1 = as recorded) */
    int max_prompt_tokens;     /* clamp (0 = none), e.g. to the model's context */
} kv_workload_config;

typedef struct kv_workload kv_workload;

/* Makes the request list. Trace problems (missing file, empty, bad row,
   unsorted or negative times) give KV_EINPUT naming the file and line. */
int kv_workload_create(const kv_workload_config *cfg, kv_rng *rng, kv_workload **out, kv_error *err);
void kv_workload_destroy(kv_workload *w); /* NULL is fine */
size_t kv_workload_count(const kv_workload *w);
const kv_request_spec *kv_workload_get(const kv_workload *w, size_t i);

/* Reads a trace file into a list (used by kv_workload_create and the tests). */
int kv_trace_read(kv_trace_format fmt, const char *path, int max_rows, double time_scale,
                  kv_request_spec **out, size_t *count, kv_error *err);
int kv_trace_format_parse(const char *s); /* "azure", "mooncake", "burstgpt"; -1 if unknown */

#endif
