/* cmd_capacity.c — `kvsim capacity`: per policy, the highest request rate meeting the SLOs (core/study/capacity.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/config/scenario.h"
#include "core/report/plot.h"
#include "core/study/capacity.h"
#include "core/study/study.h"

static const char *const capacity_owned[] = {"capacity.json", "figures"};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvsim capacity SCENARIO --slo BOUNDS [--attainment A] [--precision P] [--set key.path=value]...\n"
            "                      [--seed N] [--out DIR] [--quiet] [--plot]\n"
            "  --slo BOUNDS      per-request bounds in ms, comma-separated: ttft_ms=500,tpot_ms=50 (also e2el_ms;\n"
            "                    ttft_p99_ms, tpot_p99_ms, e2el_p99_ms are the same bounds)\n"
            "  --attainment A    fraction of requests that must meet every bound, in (0, 1] (default 0.9)\n"
            "  --precision P     bisection stops when the bracket is within P relative, in (0, 1) (default 0.02)\n"
            "  --set, --seed     as for kvsim run\n"
            "  --out DIR         write DIR/capacity.json (every probe; with --plot, DIR/figures/capacity.*)\n"
            "Per policy: the scenario's load (workload.rate_per_s, or a trace's clock, workload.trace.time_scale,\n"
            "divided) is doubled until attainment falls below A (or halved until it reaches it), at most %d\n"
            "times, then bisected. Goodput = the highest rate meeting the SLOs (DistServe's definition).\n",
            KV_CAPACITY_MAX_STEPS);
}

/* A number in (lo, hi] (or (lo, hi) when open_hi) for a flag; 0, or 2 after printing the problem. */
static int number_flag(const char *flag, const char *v, double lo, double hi, int open_hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double d = *v ? strtod(v, &end) : NAN;
    if (!*v || *end != '\0' || errno || !isfinite(d) || !(d > lo) || (open_hi ? !(d < hi) : !(d <= hi))) {
        fprintf(stderr, "kvsim capacity: %s: expected a number in (%g, %g%c, got '%s'\n", flag, lo, hi,
                open_hi ? ')' : ']', v);
        return 2;
    }
    *out = d;
    return 0;
}

int kv_cmd_capacity(int argc, char **argv)
{
    const char *scenario = NULL, *out_dir = NULL, *slo_text = NULL;
    const char **sets = kv_calloc((size_t)argc + 1, sizeof *sets);
    char **owned_sets = kv_calloc((size_t)argc + 1, sizeof *owned_sets);
    int n_sets = 0, n_owned = 0, quiet = 0, plot = 0, rc = 0;
    kv_capacity_config cfg = {.attainment = 0.9, .precision = 0.02};
    for (int i = 1; i < argc && !rc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            rc = -1;
        } else if (strcmp(arg, "--slo") == 0 && has_value) {
            slo_text = argv[++i];
        } else if (strcmp(arg, "--attainment") == 0 && has_value) {
            rc = number_flag("--attainment", argv[++i], 0, 1, 0, &cfg.attainment);
        } else if (strcmp(arg, "--precision") == 0 && has_value) {
            rc = number_flag("--precision", argv[++i], 0, 1, 1, &cfg.precision);
        } else if (strcmp(arg, "--set") == 0 && has_value) {
            sets[n_sets++] = argv[++i];
        } else if (strncmp(arg, "--set=", 6) == 0) {
            sets[n_sets++] = arg + 6;
        } else if (strcmp(arg, "--seed") == 0 && has_value) {
            char *set = kv_cmd_seed_override("capacity", argv[++i]);
            if (!set) {
                rc = 2;
            } else {
                owned_sets[n_owned++] = set;
                sets[n_sets++] = set;
            }
        } else if (strcmp(arg, "--out") == 0 && has_value) {
            out_dir = argv[++i];
            if (!out_dir[0]) {
                fprintf(stderr, "kvsim capacity: --out: an empty folder name (leave --out out to write no folder)\n");
                rc = 2;
            }
        } else if (strcmp(arg, "--quiet") == 0) {
            quiet = 1;
        } else if (strcmp(arg, "--plot") == 0) {
            plot = 1;
        } else if (arg[0] == '-') {
            fprintf(stderr, "kvsim capacity: unknown or incomplete option '%s'\n", arg);
            usage(stderr);
            rc = 2;
        } else if (!scenario) {
            scenario = arg;
        } else {
            fprintf(stderr, "kvsim capacity: one scenario at a time (got '%s' and '%s')\n", scenario, arg);
            rc = 2;
        }
    }
    kv_error err = {0};
    if (!rc && !scenario) {
        usage(stderr);
        rc = 2;
    }
    if (!rc && !slo_text) {
        fprintf(stderr, "kvsim capacity: --slo: required (e.g. --slo ttft_ms=500,tpot_ms=50)\n");
        rc = 2;
    }
    if (!rc && kv_capacity_parse_slo(slo_text, &cfg.slo, &err) != KV_OK) {
        fprintf(stderr, "kvsim capacity: %s\n", err.msg);
        rc = 2;
    }
    kv_scenario *s = NULL;
    kv_study *study = NULL;
    kv_capacity_result result = {0};
    int plot_rc = 0, searched = 0;
    if (!rc) {
        rc = kv_scenario_load(scenario, sets, n_sets, &s, &err);
        if (!rc && s->note)
            fprintf(stderr, "kvsim capacity: %s\n", s->note);
        kv_outdir od;
        memset(&od, 0, sizeof od);
        if (!rc && out_dir) /* checked before any probe runs */
            rc = kv_outdir_begin(&od, out_dir, capacity_owned, sizeof capacity_owned / sizeof capacity_owned[0],
                                 kv_cmd_cleanup_slot(), &err);
        if (!rc)
            rc = kv_study_prepare(s, &study, &err); /* measurements once, for every probe */
        if (!rc) {
            rc = kv_capacity_search(study, s, &cfg, &result, &err);
            searched = 1;
        }
        if (!rc && !quiet)
            kv_capacity_print(stdout, s, &result);
        if (!rc && out_dir)
            rc = kv_capacity_write(kv_outdir_staging(&od), s, &result, &err);
        if (!rc && out_dir && plot) {
            rc = kv_outdir_carry(&od, &err);
            if (!rc)
                plot_rc = kv_plot_folder(kv_outdir_staging(&od), out_dir, stdout, od.slot);
            if (plot_rc) {
                char figures[4200];
                snprintf(figures, sizeof figures, "%s/figures", kv_outdir_staging(&od));
                kv_rmtree(figures);
            }
        }
        if (out_dir) {
            if (!rc) {
                rc = kv_outdir_commit(&od, &err);
                if (!rc && !quiet)
                    printf("wrote %s/\n", out_dir);
            } else {
                kv_outdir_abort(&od);
            }
        }
        if (!rc && plot && !out_dir)
            printf("plots skipped: no output folder (use --out DIR)\n");
        if (rc)
            fprintf(stderr, "kvsim capacity: %s\n", err.msg);
    }
    if (searched)
        kv_capacity_result_free(&result);
    kv_study_destroy(study);
    kv_scenario_destroy(s);
    for (int i = 0; i < n_owned; i++)
        kv_free(owned_sets[i]);
    kv_free(owned_sets);
    kv_free(sets);
    if (rc < 0)
        return 0;
    return rc ? rc : plot_rc;
}
