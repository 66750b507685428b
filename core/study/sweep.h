/* sweep.h — a parameter sweep: a base scenario, a matrix of --set values, one `kvsim run` per point.
 *
 * The sweep file (docs/sweeps.md):
 *
 *   name: lynx-bandwidth              # optional; default: the file's base name
 *   base: ../lynx.yaml                # the scenario, relative to this file
 *   set: {workload.requests: 16}      # overrides applied to every point (optional)
 *   mode: cartesian                   # or zip (the lists side by side, equal lengths)
 *   matrix:
 *     network.nic_bandwidth_gbps: [10, 25, 50, 100, 200]
 *   out: out/sweeps/lynx-bandwidth    # relative to the current folder (--out overrides)
 *   output: capacity                  # optional: each point a kvsim capacity search (default: run)
 *   slo: {ttft_p99_ms: 300}           # output: capacity: --slo; also attainment:, precision:
 *
 * Each point is exactly the command
 *   kvsim run BASE --set K=V... --set outputs.json=true --out OUT/POINT --quiet
 * run locally by `kvsim sweep` or written into a Slurm array / GNU parallel job
 * list. A point is finished when OUT/POINT/results.json exists and no
 * temporary OUT/POINT.tmp.<pid> is beside it: `kvsim run` publishes the point's
 * folder whole with one rename (afile.h), so a killed run leaves the previous
 * folder as it was plus a temporary that resuming removes. OUT/points.json lists the points; OUT/sweep.csv combines
 * their results, one row per (point, policy).
 */
#ifndef KV_SWEEP_H
#define KV_SWEEP_H

#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"

typedef struct kv_sweep kv_sweep;

typedef struct kv_sweep_point {
    size_t index;   /* 0-based, in expansion order */
    char *name;     /* folder name under the sweep's out folder, e.g. "p03-nic_bandwidth_gbps=100" */
    char *dir;      /* out folder + "/" + name */
    char **values;  /* [n_keys] each swept key's value as --set text (YAML flow; control characters
                       as double-quoted escapes, "a\nb", so the text is one line and --set parses it
                       back to the same bytes) */
} kv_sweep_point;

/* Loads and expands a sweep file. extra_sets ("key=value") are added to the
   file's `set:`; out_dir (may be NULL) replaces its `out:`. kvsim is the binary
   the point commands run (an absolute path is best). KV_EINPUT with
   file:line:col on bad input, including: a base that is not a regular file; an out folder (or a
   folder on its way) that exists and is not a folder; a control character (newline, tab, ...) in
   the sweep's name, a key, the base, out or kvsim path or an extra set (none can be written on one
   line of a job script). */
int kv_sweep_load(const char *path, const char *const *extra_sets, int n_extra, const char *out_dir,
                  const char *kvsim, kv_sweep **out, kv_error *err);
void kv_sweep_destroy(kv_sweep *sw); /* NULL is fine */

const char *kv_sweep_name(const kv_sweep *sw);
const char *kv_sweep_out_dir(const kv_sweep *sw);  /* absolute */
const char *kv_sweep_base(const kv_sweep *sw);     /* absolute path of the base scenario */
/* The file whose presence makes a point finished: "results.json" (output: run, the default) or
   "capacity.json" (output: capacity, each point a `kvsim capacity`). */
const char *kv_sweep_result_file(const kv_sweep *sw);
size_t kv_sweep_key_count(const kv_sweep *sw);
const char *kv_sweep_key(const kv_sweep *sw, size_t i);
size_t kv_sweep_point_count(const kv_sweep *sw);
const kv_sweep_point *kv_sweep_point_get(const kv_sweep *sw, size_t i);

/* The point's command as an argv (argv[0] is the kvsim binary), NULL-terminated;
   owned by the sweep. */
char *const *kv_sweep_point_argv(const kv_sweep *sw, size_t i);
/* The same command as one shell line (every argument quoted where needed), owned by the sweep. */
const char *kv_sweep_point_command(const kv_sweep *sw, size_t i);

/* Writes one POSIX shell word on one line: bare when it only holds characters no shell gives a
   meaning (letters, digits, _@%+=:,./- and not NAME=... , which starts an assignment), else in
   single quotes (' as '\''). A word with a control byte (newline, tab, CR, ESC, DEL: 0x01-0x1f,
   0x7f) cannot be written on one line of a POSIX sh script or a GNU parallel job list: nothing is
   written and -1 returned (kv_sweep_load refuses such paths and keys first; values are written as
   YAML escapes, see kv_sweep_point). Returns 0 otherwise. Every byte kvsim sweep writes into a
   command, job list or script goes through here or is one of its own fixed texts. */
int kv_sweep_shell_quote(FILE *out, const char *word);

/* Loads every point's scenario as `kvsim validate` does (kv_scenario_load: the base, the --set
   values, the cards; kv_study_check: the workload, the network, the policies), without measuring
   or simulating. The first point that fails
   gives KV_EINPUT with the sweep file's file:line:col of the matrix value, set: key or base
   responsible, the key and the point. */
int kv_sweep_validate(const kv_sweep *sw, kv_error *err);

/* Creates the out folder and every point folder, writes OUT/points.json and
   OUT/POINT/command.txt (the point's shell command). */
int kv_sweep_prepare(const kv_sweep *sw, kv_error *err);

enum kv_sweep_state {
    KV_POINT_PENDING = 0,  /* not run yet (or its results are stale) */
    KV_POINT_FINISHED = 1, /* results.json exists and command.txt matches */
};
/* Whether a point is finished. A point whose results.json exists but whose
   command.txt names a different command is stale: its results.json is removed
   (so a crash cannot leave it looking finished) and *stale is set. A point with
   temporaries beside it (OUT/POINT.tmp.<pid>: a run killed before publishing,
   or one still going) is never finished: the dead ones are removed and
   *interrupted is set. */
int kv_sweep_point_state(const kv_sweep *sw, size_t i, int *stale, int *interrupted);

/* Writes a job script: "slurm" (a job array, one task per point) or
   "parallel" (one command per line for GNU parallel) into OUT/sweep.slurm or
   OUT/jobs.txt; *written gets the file's path (owned by the caller). */
int kv_sweep_emit(const kv_sweep *sw, const char *kind, char **written, kv_error *err);

typedef struct kv_sweep_totals {
    size_t points;   /* points listed */
    size_t ok;       /* with results.json */
    size_t failed;   /* no results, stderr.txt not empty */
    size_t missing;  /* no results, no error recorded (not run yet, or still running) */
    size_t rows;     /* data rows written to sweep.csv */
} kv_sweep_totals;

/* Rebuilds DIR/sweep.csv from DIR/points.json and each point's results.json
   (without points.json: every sub-folder holding results.json or command.txt,
   in name order, with no key columns). Columns: point, dir, status, the swept
   keys, policy, then every scalar field of the policies in results.json (the
   union, in first-seen order). One row per (point, policy); a point without
   results gets one row with status failed or missing. */
int kv_sweep_collect(const char *dir, kv_sweep_totals *totals, kv_error *err);

#endif
