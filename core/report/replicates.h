/* replicates.h — every metric of a run over several seeds: its mean and 95% confidence interval
 * (kvsim run --seeds N, or the scenario's `replicates: N`).
 *
 * The metrics are the numeric fields of each policy's results.json entry (kv_report_json), read back
 * from the JSON a run would write, so that every metric there is covered and none is forgotten. The
 * interval is Student's t: mean ± t(0.975, n-1) × s / sqrt(n), s the sample standard deviation (n-1 in
 * the denominator); t is tabled for n <= 30 (kv_replicates_t975) and is the normal quantile 1.959964
 * beyond. A metric that is null (NaN) in any run has a null mean and interval.
 */
#ifndef KV_REPLICATES_H
#define KV_REPLICATES_H

#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/config/scenario.h"

struct kv_policy_outcome; /* core/report/report.h */

/* One policy's metrics over the runs. */
typedef struct kv_replicate_set {
    size_t n_metrics;
    char **names;     /* [n_metrics] results.json field names, in that file's order (owned) */
    double *values;   /* [n_metrics * runs]: metric m of run r at m * runs + r */
    double *mean;     /* [n_metrics], by kv_replicates_finish */
    double *ci95;     /* [n_metrics] the half-width */
} kv_replicate_set;

typedef struct kv_replicates {
    int runs;              /* planned */
    int added;             /* added so far */
    int *seeds;            /* [runs] */
    size_t n_policies;
    kv_replicate_set *sets; /* [n_policies] in scenario order */
} kv_replicates;

/* Student t's 0.975 quantile with dof degrees of freedom (dof >= 1); 1.959964 above 29. */
double kv_replicates_t975(int dof);
/* Mean and 95% half-width of x[0..n) (n >= 1; n = 1: the half-width is 0). */
void kv_replicates_mean_ci(const double *x, size_t n, double *mean, double *ci95);

/* For `runs` runs (>= 2) of n_policies policies. Free with kv_replicates_destroy. */
kv_replicates *kv_replicates_create(size_t n_policies, int runs);
void kv_replicates_destroy(kv_replicates *r); /* NULL is fine */
/* Adds one seed's outcomes (the same policies, in the same order, as every other run). The first run
   fixes the metric names. KV_EFAIL when the run's JSON cannot be rendered or read back. */
int kv_replicates_add(kv_replicates *r, int seed, const kv_scenario *s, const struct kv_policy_outcome *o,
                      size_t n, kv_error *err);
/* Computes every mean and interval once all runs are added. */
void kv_replicates_finish(kv_replicates *r);

/* The "replicates" member of a policy's results.json entry:
   {"n":N,"seeds":[...],"t975":t,"mean":{metric: value, ...},"ci95":{metric: half-width, ...}}. */
void kv_replicates_json(FILE *out, const kv_replicates *r, size_t policy);
/* The comparison table's columns as mean±ci95 over the runs (under it, the first seed's memory table). */
void kv_replicates_table(FILE *out, const kv_scenario *s, const struct kv_policy_outcome *o, size_t n,
                         const kv_replicates *r);

#endif
