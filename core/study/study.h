/* study.h — one scenario's comparison: the workload, every policy loaded, their runs and reports. */
#ifndef KV_STUDY_H
#define KV_STUDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/report/report.h"
#include "core/config/scenario.h"
#include "core/accuracy/model_stats.h"

typedef struct kv_study kv_study;

/* Builds the workload and loads every policy (checking their parameters), so
   that all bad input is found before anything runs. The scenario must outlive the study. */
int kv_study_prepare(const kv_scenario *s, kv_study **out, kv_error *err);
void kv_study_destroy(kv_study *st); /* NULL is fine */
/* The checks of kv_study_prepare that measure nothing (the workload, the network, every policy
   loaded with its parameters), for kvsim sweep's validation of each point. */
int kv_study_check(const kv_scenario *s, kv_error *err);
/* kvsim validate: kv_study_check, the files timing reads (calibration, profile table), and the
   feasibility checks of core/study/feasible.h (warnings to log; errors with strict). Runs no
   measurement: no kernels, no reference model. *n_requests: the workload's size. */
int kv_study_validate(const kv_scenario *s, bool strict, FILE *log, size_t *n_requests, kv_error *err);
size_t kv_study_request_count(const kv_study *st);

/* Runs every policy on the same workload. */
int kv_study_run(kv_study *st, kv_error *err);
/* Runs policy i (scenario order) alone on the workload in use, replacing its earlier outcome. */
int kv_study_run_policy(kv_study *st, size_t i, kv_error *err);
/* Policy i's latest outcome (NULL past the end). */
const kv_policy_outcome *kv_study_outcome(const kv_study *st, size_t i);

/* Rebuilds the workload with its load multiplied by factor (> 0), for kvsim capacity: a synthetic
   workload's workload.rate_per_s times factor; a trace's clock workload.trace.time_scale divided by
   factor (arrivals packed tighter). Lengths and request counts stay as they were (workload.h: they come
   from streams of their own), so the measurements kv_study_prepare made (kernel costs, Lynx acceptance,
   DiffKV significance: functions of the prompts) hold for every factor and are not redone. Earlier
   outcomes are dropped; from now on no timeline is kept. On failure the workload stays as it was. */
int kv_study_rescale(kv_study *st, double factor, kv_error *err);
/* The trace time_scale kv_study_rescale uses for factor: the scenario's (0 = 1) over factor. */
double kv_study_time_scale(const kv_scenario *s, double factor);
/* The offered request rate of the workload in use: a synthetic one's rate (rate_per_s x factor), a
   trace's (requests - 1) / (last arrival - first arrival). */
double kv_study_offered_rate(const kv_study *st);

/* After kv_study_run: runs seeds seed+1 .. seed+runs-1 as `kvsim run --seed K` would (the scenario
   loaded again with its --set values and seed=K, prepared and run), and attaches every metric's mean
   and 95% interval over the runs (core/report/replicates.h) to the outcomes, which the table and
   results.json then show. runs <= 1 does nothing. requests.csv and trace.json stay the first seed's. */
int kv_study_replicate(kv_study *st, int runs, kv_error *err);
/* Results of kv_study_run, one per policy in scenario order. */
const kv_policy_outcome *kv_study_outcomes(const kv_study *st, size_t *n);
void kv_study_print(const kv_study *st, FILE *out);
/* kvsim run: attaches each policy's accuracy (fig[n], scenario order, borrowed until the study is destroyed;
   NULL: none looked up) to the outcomes, which results.json then carries, and the lines kv_study_print
   shows under the table (copied; NULL: none). Call after kv_study_run / kv_study_replicate. */
void kv_study_set_accuracy(kv_study *st, const kv_acc_figures *fig, const char *notes);
/* The scenario's statistics file as the study read it (lynx.from or diffkv.scores: file), borrowed until the
   study is destroyed; NULL when the study did not read one. */
const kv_model_stats *kv_study_stats(const kv_study *st);
int kv_study_write(const kv_study *st, const char *dir, kv_error *err);

#endif
