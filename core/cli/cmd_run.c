/* cmd_run.c — `kvsim run`, `kvsim validate` and `kvsim help`: load a scenario, run every policy, report. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/sim/engine.h"
#include "core/report/metrics.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/evalcache.h"
#include "core/report/plot.h"
#include "core/report/report.h"
#include "core/config/scenario.h"
#include "core/study/study.h"
#include "core/study/study_stats.h"

typedef struct run_args {
    const char *scenario;
    const char **sets; /* "key=value" overrides, in order */
    int n_sets;
    const char *out_dir;
    int quiet;
    int plot; /* --plot: scripts/plot on the output folder afterwards */
    int strict; /* validate --strict: feasibility warnings are errors */
    int seeds;  /* run --seeds N: replicates (0: the scenario's `replicates`) */
} run_args;

/* The signal registry: the staging folder (or previous folder) a SIGINT/SIGTERM/SIGHUP must remove
   (afile.h, invariant I3). It is the one piece of mutable state outside main, because a signal
   handler can reach nothing else; only kv_outdir_* (through the pointer kv_cmd_cleanup_slot hands
   out) and the handler touch it. */
static kv_cleanup_slot cleanup_slot;

static void on_fatal_signal(int sig)
{
    kv_cleanup_slot_run(&cleanup_slot); /* system calls only: async-signal-safe */
    _exit(128 + sig);                   /* 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP */
}

kv_cleanup_slot *kv_cmd_cleanup_slot(void)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(&sa.sa_mask, sigs[i]); /* no second signal interrupts the cleanup */
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue; /* nohup, or a background job: an ignored signal stays ignored */
        sigaction(sigs[i], &sa, NULL);
    }
    return &cleanup_slot;
}

char *kv_cmd_seed_override(const char *cmd, const char *value)
{
    char *end = NULL;
    long seed = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || seed < 0 || seed > 2147483647) {
        fprintf(stderr, "kvsim %s: --seed: expected a whole number 0..2147483647, got '%s'\n", cmd, value);
        return NULL;
    }
    size_t len = strlen(value) + 8;
    char *set = kv_malloc(len);
    snprintf(set, len, "seed=%s", value);
    return set;
}

static void run_usage(FILE *out, const char *cmd)
{
    fprintf(out,
            "usage: kvsim %s SCENARIO [--set key.path=value]... [--seed N]%s\n"
            "  --set key.path=value  override any scenario key (YAML value: 4, true, [a, b], {k: v}); a path\n"
            "                        given here is relative to the working folder\n"
            "  --seed N              same as --set seed=N\n"
            "%s",
            cmd, strcmp(cmd, "run") == 0 ? " [--seeds N] [--out DIR] [--quiet] [--plot]" : " [--strict]",
            strcmp(cmd, "run") == 0 ? "  --seeds N             run seeds seed..seed+N-1 (1..1000): the table and results.json\n"
                                      "                        give each metric's mean and 95% CI (Student t); as\n"
                                      "                        --set replicates=N\n"
                                      "  --out DIR             write results.json, requests.csv, trace.json there\n"
                                      "  --quiet               no table on stdout\n"
                                      "  --plot                figures into DIR/figures/ (scripts/plot; needs matplotlib)\n"
                                    : "  --strict              feasibility warnings are errors (exit 2)\n"
                                      "Checks every key, file and policy, and that the scenario can run: weights fit\n"
                                      "each device at its tp, requests fit the model's context, a request's KV fits a\n"
                                      "decode node. Measures nothing (no kernels, no reference model).\n");
}

/* Parses the arguments; returns 0, or 2 after printing the problem. */
static int parse(int argc, char **argv, run_args *a, char **seed_set)
{
    memset(a, 0, sizeof *a);
    a->sets = kv_calloc((size_t)argc + 1, sizeof *a->sets);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            run_usage(stdout, argv[0]);
            return -1;
        } else if (strcmp(arg, "--set") == 0 && has_value) {
            a->sets[a->n_sets++] = argv[++i];
        } else if (strncmp(arg, "--set=", 6) == 0) {
            a->sets[a->n_sets++] = arg + 6;
        } else if (strcmp(arg, "--seed") == 0 && has_value) {
            char *set = kv_cmd_seed_override(argv[0], argv[++i]);
            if (!set)
                return 2;
            for (int k = 0; *seed_set && k < a->n_sets; k++)
                if (a->sets[k] == *seed_set)
                    a->sets[k] = set; /* a second --seed replaces the first, in its place */
            if (!*seed_set)
                a->sets[a->n_sets++] = set;
            kv_free(*seed_set);
            *seed_set = set;
        } else if (strcmp(arg, "--seeds") == 0 && has_value && strcmp(argv[0], "run") == 0) {
            const char *v = argv[++i];
            char *end = NULL;
            long n = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || n < 1 || n > 1000) {
                fprintf(stderr, "kvsim %s: --seeds: expected a whole number 1..1000, got '%s'\n", argv[0], v);
                return 2;
            }
            a->seeds = (int)n;
        } else if (strcmp(arg, "--out") == 0 && has_value && strcmp(argv[0], "run") == 0) {
            a->out_dir = argv[++i];
            if (!a->out_dir[0]) {
                fprintf(stderr, "kvsim %s: --out: an empty folder name (leave --out out to write no folder)\n",
                        argv[0]);
                return 2;
            }
        } else if (strcmp(arg, "--quiet") == 0 && strcmp(argv[0], "run") == 0) {
            a->quiet = 1;
        } else if (strcmp(arg, "--plot") == 0 && strcmp(argv[0], "run") == 0) {
            a->plot = 1;
        } else if (strcmp(arg, "--strict") == 0 && strcmp(argv[0], "validate") == 0) {
            a->strict = 1;
        } else if (arg[0] == '-') {
            fprintf(stderr, "kvsim %s: unknown or incomplete option '%s'\n", argv[0], arg);
            run_usage(stderr, argv[0]);
            return 2;
        } else if (!a->scenario) {
            a->scenario = arg;
        } else {
            fprintf(stderr, "kvsim %s: one scenario at a time (got '%s' and '%s')\n", argv[0], a->scenario, arg);
            return 2;
        }
    }
    if (!a->scenario) {
        run_usage(stderr, argv[0]);
        return 2;
    }
    return 0;
}

/* Appends printf-style text to buf[size] (at *len; cut at the end of buf). */
static void note(char *buf, size_t size, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void note(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < size ? *len + (size_t)n : size - 1;
}

/* kvsim run: each policy's accuracy on the reference model, as kvsim eval of this scenario measured it (the
   feed cache), attached to the study with the lines under its table: the model, and what is not measured with
   the command that measures it. *out (the caller's, kv_free) stays NULL when nothing was looked up. */
static int run_accuracy(const run_args *a, const kv_scenario *s, kv_study *study, kv_acc_figures **out,
                        kv_error *err)
{
    *out = NULL;
    char why[4200], notes[8192];
    size_t len = 0;
    kv_evalcache *ec = NULL;
    /* The scenario's statistics file first: its accuracy[] entries win over the eval cache, and its model's
       shape stands in for the model file where that is not fetched. */
    kv_model_stats own; /* read here when the study did not read the file */
    memset(&own, 0, sizeof own);
    bool have_stats = s->stats && s->stats[0] && s->accuracy;
    const kv_model_stats *stats = have_stats ? kv_study_stats(study) : NULL;
    int rc = KV_OK;
    if (have_stats && !stats) {
        rc = kv_study_stats_read(s, &own, err);
        stats = &own;
    }
    if (!rc)
        rc = kv_evalcache_prepare(s, NULL, stats ? &stats->model : NULL, &ec, why, sizeof why, err);
    if (rc || !ec) {
        kv_model_stats_free(&own);
        if (rc)
            return rc;
        note(notes, sizeof notes, &len, "accuracy: not measured: %s\n", why);
        kv_study_set_accuracy(study, NULL, notes);
        return KV_OK;
    }
    const kv_eval_scenario *es = kv_evalcache_scenario(ec);
    kv_acc_figures *acc = kv_calloc((size_t)es->n_policies + 1, sizeof *acc);
    for (int i = 0; i < es->n_policies && !rc; i++)
        rc = kv_evalcache_lookup(ec, i, stats, &acc[i], err);
    kv_model_stats_free(&own);
    if (rc) {
        kv_free(acc);
        kv_evalcache_destroy(ec);
        return rc;
    }
    const char *path = kv_evalcache_model_path(ec), *base = strrchr(path, '/');
    note(notes, sizeof notes, &len,
         "accuracy: kvsim eval on the reference model %s (%s): %d text(s) x %d scored tokens after %d-token prompts, "
         "%d needle(s); ±: 95%% CI",
         kv_evalcache_model(ec)->name, base ? base + 1 : path, es->n_texts, es->score_tokens, es->context_tokens,
         es->needle_count);
    static const char *const sources[] = {"stats file", "eval cache"};
    for (size_t k = 0; k < 2; k++)
        for (int i = 0; i < es->n_policies; i++)
            if (acc[i].measured && strcmp(acc[i].source, sources[k]) == 0) {
                note(notes, sizeof notes, &len, "; from the %s%s%s", sources[k], k == 0 ? " " : "",
                     k == 0 ? s->stats : "");
                break;
            }
    note(notes, sizeof notes, &len, "\n");
    int missing = 0;
    for (int i = 0; i < es->n_policies; i++)
        if (!acc[i].measured)
            note(notes, sizeof notes, &len, "%s%s", missing++ ? ", " : "accuracy: not measured for ",
                 es->policies[i].name);
    if (missing && kv_evalcache_shape_only(ec)) {
        note(notes, sizeof notes, &len, ": %s, then `kvsim eval %s`\n", why, a->scenario);
    } else if (missing) {
        note(notes, sizeof notes, &len, ": run `kvsim eval %s", a->scenario);
        for (int k = 0; k < a->n_sets; k++)
            note(notes, sizeof notes, &len, " --set '%s'", a->sets[k]);
        note(notes, sizeof notes, &len, "` (about %.0f s)\n", kv_evalcache_estimate_s(ec));
    }
    kv_study_set_accuracy(study, acc, notes);
    kv_evalcache_destroy(ec);
    *out = acc;
    return KV_OK;
}

static int run_or_validate(int argc, char **argv, int validate_only)
{
    run_args a;
    char *seed_set = NULL;
    int rc = parse(argc, argv, &a, &seed_set);
    if (rc) {
        kv_free(a.sets);
        kv_free(seed_set);
        return rc < 0 ? 0 : rc;
    }
    kv_error err = {0};
    kv_scenario *s = NULL;
    kv_study *study = NULL;
    kv_acc_figures *accuracy = NULL; /* kvsim run: each policy's, borrowed by the study's outcomes */
    int plot_rc = 0;
    rc = kv_scenario_load(a.scenario, a.sets, a.n_sets, &s, &err);
    if (!rc && s->note)
        fprintf(stderr, "kvsim %s: %s\n", argv[0], s->note);
    size_t n_requests = 0;
    if (!rc && validate_only)
        rc = kv_study_validate(s, a.strict, stderr, &n_requests, &err); /* measures nothing */
    else if (!rc)
        rc = kv_study_prepare(s, &study, &err);
    if (!rc && validate_only && s->accuracy) {
        /* The accuracy section's keys are checked the way kvsim eval checks them. */
        kv_eval_scenario *es = NULL;
        rc = kv_eval_scenario_from(s, &es, &err);
        kv_eval_scenario_destroy(es);
    }
    if (!rc && validate_only) {
        printf("ok: %s: %s, %zu requests, policies:", a.scenario, s->model_card.name, n_requests);
        for (size_t i = 0; i < s->policies.count; i++)
            printf(" %s", s->policies.items[i]);
        printf("\n");
    }
    if (!rc && !validate_only) {
        const char *dir = a.out_dir ? a.out_dir : s->outputs.dir;
        int to_folder = dir && dir[0];
        kv_outdir od;
        memset(&od, 0, sizeof od);
        /* The folder is checked (created, test-written) before simulating: exit 2 now, not after the run. */
        if (to_folder)
            rc = kv_outdir_begin(&od, dir, kv_report_owned_names, kv_report_owned_count, kv_cmd_cleanup_slot(),
                                 &err);
        if (!rc)
            rc = kv_study_run(study, &err);
        int runs = a.seeds ? a.seeds : s->replicates;
        if (!rc && runs > 1 && (long long)s->seed + runs - 1 > 2147483647LL) {
            rc = kv_error_set(&err, KV_EINPUT, "%s: seeds %d..%lld pass the largest seed, 2147483647",
                              a.seeds ? "--seeds" : "replicates", s->seed, (long long)s->seed + runs - 1);
        } else if (!rc && runs > 1) {
            rc = kv_study_replicate(study, runs, &err);
        }
        if (!rc)
            rc = run_accuracy(&a, s, study, &accuracy, &err);
        if (!rc && !a.quiet)
            kv_study_print(study, stdout);
        if (!rc && to_folder)
            rc = kv_study_write(study, kv_outdir_staging(&od), &err);
        if (!rc && to_folder && a.plot) {
            /* Figures go into the staging folder too, which first gets links to DIR's other entries (the
               plots read an accuracy.json there). */
            rc = kv_outdir_carry(&od, &err);
            if (!rc)
                plot_rc = kv_plot_folder(kv_outdir_staging(&od), dir, stdout, od.slot); /* it says why */
            if (plot_rc) {
                /* Publish the results without half-drawn figures; the exit status says plotting failed. */
                char figures[4200];
                snprintf(figures, sizeof figures, "%s/figures", kv_outdir_staging(&od));
                kv_rmtree(figures);
            }
        }
        if (to_folder) {
            if (!rc) {
                rc = kv_outdir_commit(&od, &err);
                if (!rc && !a.quiet)
                    printf("wrote %s/\n", dir);
            } else {
                kv_outdir_abort(&od); /* DIR stays as it was */
            }
        }
        if (!rc && a.plot && !to_folder)
            printf("plots skipped: no output folder (use --out DIR or outputs.dir)\n");
    }
    if (rc)
        fprintf(stderr, "kvsim %s: %s\n", argv[0], err.msg);
    kv_study_destroy(study);
    kv_free(accuracy);
    kv_scenario_destroy(s);
    kv_free(a.sets);
    kv_free(seed_set);
    return rc ? rc : plot_rc;
}

int kv_cmd_run(int argc, char **argv)
{
    return run_or_validate(argc, argv, 0);
}

int kv_cmd_validate(int argc, char **argv)
{
    return run_or_validate(argc, argv, 1);
}

int kv_cmd_help(int argc, char **argv)
{
    const char *topic = argc > 1 ? argv[1] : "";
    if (strcmp(topic, "scenario") == 0) {
        kv_scenario_print_reference(stdout);
        return 0;
    }
    if (strcmp(topic, "cards") == 0) {
        kv_cards_print_reference(stdout);
        return 0;
    }
    fprintf(topic[0] ? stderr : stdout, "usage: kvsim help scenario | cards\n"
                                        "  scenario  every scenario key with its default and meaning\n"
                                        "  cards     the keys of model cards and device profiles\n");
    return topic[0] ? 2 : 0;
}
