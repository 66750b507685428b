/* sweep_emit.c — a sweep as a job script: GNU parallel or a Slurm array (kvsim sweep --emit). */
#include "core/study/sweep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/study/sweep_internal.h"

/* ---- Job scripts ----------------------------------------------------------------------------- */

/* One point as a self-contained shell command on one line: go to the folder kvsim sweep ran in (a
   relative path among the values is relative to it, as --set paths are), skip if finished, else run,
   stderr to the point folder. Every word is quoted (the command too: build_commands). -1 if a path
   cannot be. */
static int job_line(FILE *f, const kv_sweep *sw, size_t i)
{
    const kv_sweep_point *p = &sw->points[i];
    char *results = kv_sweep_join3(p->dir, "/", kv_sweep_result_file(sw));
    char *stderr_path = kv_sweep_join3(p->dir, "/", "stderr.txt");
    int rc = 0;
    fputs("cd ", f);
    rc |= kv_sweep_shell_quote(f, sw->cwd);
    fputs(" && mkdir -p ", f);
    rc |= kv_sweep_shell_quote(f, p->dir);
    fputs(" && { test -f ", f);
    rc |= kv_sweep_shell_quote(f, results);
    fprintf(f, " || %s 2> ", sw->commands[i]);
    rc |= kv_sweep_shell_quote(f, stderr_path);
    fputs("; }", f);
    kv_free(results);
    kv_free(stderr_path);
    return rc;
}

/* Text for an #SBATCH line: sbatch splits those lines at blanks, reads quotes, backslashes and
   '#' itself, and expands %x patterns in file names; only [A-Za-z0-9._+-] pass, the rest is '_'. */
static void sbatch_word(FILE *f, const char *s, size_t max)
{
    for (size_t n = 0; s[n] && n < max; n++) {
        char c = s[n];
        fputc((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._+-", c)
                  ? c
                  : '_',
              f);
    }
}

/* Whether a path can stand in an #SBATCH line as it is (the characters of sbatch_word, and '/'). */
static int sbatch_safe_path(const char *s)
{
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._+-/", *p)))
            return 0;
    return s[0] != '\0';
}

int kv_sweep_emit(const kv_sweep *sw, const char *kind, char **written, kv_error *err)
{
    *written = NULL;
    int slurm = strcmp(kind, "slurm") == 0;
    if (!slurm && strcmp(kind, "parallel") != 0)
        return kv_error_set(err, KV_EINPUT, "--emit %s: expected slurm or parallel", kind);
    char *path = kv_sweep_join3(sw->out_dir, "/", slurm ? "sweep.slurm" : "jobs.txt");
    kv_afile a;
    int rc = kv_afile_open(&a, path, err);
    if (rc) {
        kv_free(path);
        return rc;
    }
    FILE *f = a.f;
    /* Every byte that comes from the sweep goes through kv_sweep_shell_quote (commands, paths in
       comments) or sbatch_word (#SBATCH lines); the name has no control character (kv_sweep_load),
       so a comment stays one line. */
    int bad_word = 0;
    size_t last = sw->n_points ? sw->n_points - 1 : 0;
    if (slurm) {
        fprintf(f, "#!/bin/bash\n# kvsim sweep ");
        bad_word |= kv_sweep_shell_quote(f, sw->name);
        fprintf(f, ": %zu points, one Slurm array task each.\n# Submit:   sbatch ", sw->n_points);
        bad_word |= kv_sweep_shell_quote(f, path);
        fprintf(f, "\n#           (at most 16 at a time: sbatch --array=0-%zu%%16 ", last);
        bad_word |= kv_sweep_shell_quote(f, path);
        fputs(")\n# Collect:  kvsim sweep --collect ", f);
        bad_word |= kv_sweep_shell_quote(f, sw->out_dir);
        fprintf(f, "\n# A task whose point already has %s does nothing, so resubmitting resumes.\n",
                kv_sweep_result_file(sw));
        fputs("#SBATCH --job-name=kvsim-", f);
        sbatch_word(f, sw->name, 100);
        fprintf(f, "\n#SBATCH --array=0-%zu\n#SBATCH --cpus-per-task=1\n", last);
        if (sbatch_safe_path(sw->out_dir)) {
            fputs("#SBATCH --output=", f);
            fputs(sw->out_dir, f); /* sbatch_safe_path: only [A-Za-z0-9._+-/] */
            fputs("/slurm-%A_%a.out\n", f);
        } else {
            fputs("# (no #SBATCH --output: the folder's path has characters an #SBATCH line cannot carry;\n"
                  "#  Slurm writes slurm-JOB_TASK.out in the folder sbatch is run from)\n", f);
        }
        fputs("\ncase \"$SLURM_ARRAY_TASK_ID\" in\n", f);
        for (size_t i = 0; i < sw->n_points; i++) {
            fprintf(f, "%zu) ", i);
            bad_word |= job_line(f, sw, i);
            fputs(" ;;\n", f);
        }
        fputs("*) echo \"kvsim sweep: no point $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;\nesac\n", f);
    } else {
        for (size_t i = 0; i < sw->n_points; i++) {
            bad_word |= job_line(f, sw, i);
            fputc('\n', f);
        }
    }
    if (bad_word) {
        kv_afile_abort(&a);
        kv_free(path);
        return kv_error_set(err, KV_EINPUT, "%s: a path or name of the sweep has a control character (newline, "
                            "tab, ...) that no job script can carry on one line", sw->path);
    }
    rc = kv_afile_commit(&a, err);
    if (!rc && slurm)
        chmod(path, 0755);
    if (rc)
        kv_free(path);
    else
        *written = path;
    return rc;
}
