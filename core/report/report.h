/* report.h — what a run shows and writes: the terminal table, results.json, requests.csv, trace.json. */
#ifndef KV_REPORT_H
#define KV_REPORT_H

#include <stdio.h>

#include "core/accuracy/evalcache.h"
#include "core/sim/engine.h"
#include "core/report/metrics.h"
#include "core/config/scenario.h"
#include "core/sim/timeline.h"

/* One compared policy's outcome. */
typedef struct kv_policy_outcome {
    const char *name;   /* as listed in the scenario */
    const char *file;   /* the Lua file it came from */
    const kv_policy *policy; /* its parameters, for results.json (borrowed; NULL: none recorded) */
    long acceptance_samples; /* speculations behind a measured Lynx acceptance (0: the scenario's) */
    kv_run_result run;
    kv_summary summary;
    const char *replicates_json; /* several seeds: the "replicates" member of its results.json entry, as
                                    kv_replicates_json renders it (borrowed); NULL: one run */
    const kv_acc_figures *accuracy; /* kvsim run: its accuracy on the reference model, as kvsim eval measured it
                                       (borrowed); NULL: not looked up (no `accuracy:` section; capacity, sweeps) */
} kv_policy_outcome;

void kv_report_table(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n);
/* kvsim run's accuracy beside latency: per policy its TTFT and TPOT, then delta perplexity, top-1 agreement,
   needle recall and Lynx's accepted share, each "value ±95%" ("-": not measured), from o[i].accuracy; then
   the lines of `notes` (the model measured on, what is not measured and how to measure it). */
void kv_report_accuracy_table(FILE *out, const kv_policy_outcome *o, size_t n, const char *notes);
/* The paged-KV memory table (printed under kv_report_table's). */
void kv_report_memory_table(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n);
void kv_report_json(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n);
void kv_report_csv(FILE *out, const kv_policy_outcome *o, size_t n);

/* The names kvsim run owns in its output folder, replaced as a set (afile.h, step 3a):
   results.json, requests.csv, trace.json, figures. */
extern const char *const kv_report_owned_names[];
extern const size_t kv_report_owned_count;

/* Writes results.json, requests.csv and trace.json (as the scenario asks) into dir: the staging
   folder of a kv_outdir (afile.h), which publishes them together or not at all. KV_EFAIL naming
   the file when a write fails (the caller then aborts the staging folder). */
int kv_report_write(const char *dir, const kv_scenario *s, const kv_policy_outcome *o, size_t n,
                    const kv_timeline *tl, kv_error *err);

#endif
