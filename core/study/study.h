/* study.h — one scenario's comparison: the workload, every policy loaded, their runs and reports. */
#ifndef KV_STUDY_H
#define KV_STUDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/report/report.h"
#include "core/config/scenario.h"

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
/* Results of kv_study_run, one per policy in scenario order. */
const kv_policy_outcome *kv_study_outcomes(const kv_study *st, size_t *n);
void kv_study_print(const kv_study *st, FILE *out);
int kv_study_write(const kv_study *st, const char *dir, kv_error *err);

#endif
