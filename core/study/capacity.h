/* capacity.h — kvsim capacity: per policy, the highest request rate at which the SLOs are met.
 *
 * Goodput as DistServe defines it: at a given rate a run meets its SLOs when the fraction of requests
 * that meet every bound (attainment) is at least the target (0.9 by default). A request meets the
 * bounds when it completed, its TTFT (arrival to first committed token) is <= ttft_ms, its TPOT
 * ((last token - first token) / (output tokens - 1); a one-token request has none and meets it) is
 * <= tpot_ms and its end-to-end latency is <= e2el_ms; a bound left out (NaN) always holds.
 *
 * The rate is the scenario's load times a factor f (kv_study_rescale): a synthetic workload's
 * workload.rate_per_s x f, a trace's workload.trace.time_scale / f (a smaller time_scale packs the
 * arrivals tighter). Search, per policy: f = 1; while it meets the SLOs double f (at most
 * KV_CAPACITY_MAX_STEPS times), else halve it until it does (as many times at most, and no further than
 * a trace can be stretched: its last arrival within KV_TRACE_MAX_TIME_S); then bisect
 * between the highest f that met the SLOs and the lowest above it that did not, until they are within
 * `precision` (relative: hi - lo <= precision x lo). The answer is the lower end, with its attainment,
 * and the upper end ("the next step above") with its attainment. Attainment need not fall
 * monotonically with the rate; the search finds one crossing, and every probe is reported.
 *
 * One prepared study serves every probe: only the workload is rebuilt (measurements are done once).
 * Deterministic: the same scenario and seed give the same probes and the same capacity.json bytes.
 */
#ifndef KV_CAPACITY_H
#define KV_CAPACITY_H

#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/config/scenario.h"
#include "core/sim/engine.h"
#include "core/study/study.h"

#define KV_CAPACITY_MAX_STEPS 16 /* doublings (or halvings) of the rate while bracketing */

typedef struct kv_slo {
    double ttft_ms, tpot_ms, e2el_ms; /* per-request bounds; NaN: none */
} kv_slo;

typedef struct kv_capacity_config {
    kv_slo slo;
    double attainment; /* target fraction of requests meeting every bound, (0, 1] */
    double precision;  /* relative width at which bisection stops, (0, 1) */
} kv_capacity_config;

typedef struct kv_capacity_probe {
    double factor;     /* load factor on the scenario's */
    double rate;       /* offered requests per second (kv_study_offered_rate) */
    double knob;       /* the scaled key's value: rate_per_s, or time_scale for a trace */
    double attainment; /* met / requests */
    size_t met, requests;
} kv_capacity_probe;

typedef enum kv_capacity_status {
    KV_CAPACITY_FOUND = 0,   /* best meets the SLOs, above (within precision) does not */
    KV_CAPACITY_UNBOUNDED,   /* every doubling met them: best is the highest probed, no above */
    KV_CAPACITY_NONE,        /* no halving met them: no best; above is the lowest probed */
} kv_capacity_status;

extern const char *const kv_capacity_status_names[]; /* "found", "unbounded", "none" */

typedef struct kv_capacity_policy {
    const char *name;        /* borrowed from the scenario */
    kv_capacity_status status;
    kv_capacity_probe best, above; /* best: FOUND, UNBOUNDED; above: FOUND, NONE */
    kv_capacity_probe *probes;     /* [n_probes] in order of factor (owned) */
    size_t n_probes;
} kv_capacity_policy;

typedef struct kv_capacity_result {
    kv_capacity_config cfg;
    const char *knob;               /* "workload.rate_per_s" or "workload.trace.time_scale" */
    kv_capacity_policy *policies;   /* [n] in scenario order (owned) */
    size_t n;
} kv_capacity_result;

/* Parses "ttft_ms=500,tpot_ms=50" (also ttft_p99_ms, tpot_p99_ms, e2el_ms, e2el_p99_ms: the same
   per-request bounds; with attainment 0.99 a bound is the metric's p99). KV_EINPUT naming the part
   that is wrong; at least one bound, each a positive number of ms, none twice. */
int kv_capacity_parse_slo(const char *text, kv_slo *slo, kv_error *err);
/* The fraction of r's requests meeting every bound of slo; *met gets their count (may be NULL). */
double kv_capacity_attainment(const kv_run_result *r, const kv_slo *slo, size_t *met);

/* Searches every policy of a prepared study (kv_study_prepare; its workload is rescaled, so run
   nothing else on it afterwards). KV_EINPUT when the load cannot be scaled (a fixed workload at rate
   0); a failed probe's error otherwise. *out: free with kv_capacity_result_free. */
int kv_capacity_search(kv_study *st, const kv_scenario *s, const kv_capacity_config *cfg,
                       kv_capacity_result *out, kv_error *err);
void kv_capacity_result_free(kv_capacity_result *r);

/* The table: policy, goodput req/s, attainment there, the next rate above and its attainment. */
void kv_capacity_print(FILE *out, const kv_scenario *s, const kv_capacity_result *r);
/* capacity.json: the configuration, and per policy the answer and every probe. */
void kv_capacity_json(FILE *out, const kv_scenario *s, const kv_capacity_result *r);
/* Writes dir/capacity.json (dir: a kv_outdir's staging folder). */
int kv_capacity_write(const char *dir, const kv_scenario *s, const kv_capacity_result *r, kv_error *err);

#endif
