/* cmd_sweep.c — `kvsim sweep`: run a sweep's points in worker processes, emit job scripts, collect results.
 *
 * Each point runs as a child process executing this same binary
 * (/proc/self/exe) with the point's `kvsim run ... --quiet` argv, its stderr
 * in POINT/stderr.txt, so what runs here is exactly what the emitted Slurm
 * and GNU parallel scripts run. A point that fails (non-zero exit, a signal,
 * or no results.json) is reported with the tail of its stderr; the others go
 * on. The exit code is 1 when any point failed.
 *
 * Before any point runs (or a job script is written, or --dry-run prints), every point is loaded as
 * `kvsim validate` loads it (kv_sweep_validate): a mistake stops the sweep with exit 2.
 *
 * SIGINT, SIGTERM and SIGHUP (those not ignored) are blocked while workers run and taken with
 * sigtimedwait, with SIGCHLD, so the sweep needs no handler and no global state. On one, the sweep
 * sends it to every running worker (kvsim run removes its staging folder and exits), waits for them
 * (SIGKILL after STOP_GRACE_S, or at a second signal), removes temporaries they left, and exits
 * 128 + the signal. Workers are tracked by pid; they stay in the sweep's process group, so a
 * terminal's Ctrl-C or Ctrl-Z reaches them as well.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/datadir.h"
#include "core/cli/commands.h"
#include "core/base/infile.h"
#include "core/report/plot.h"
#include "core/base/progress.h"
#include "core/study/sweep.h"

typedef struct sweep_args {
    const char *file;
    const char **sets;    /* extra "key=value" for every point */
    int n_sets;
    const char *out_dir;
    const char *emit;     /* slurm | parallel */
    const char *collect;  /* folder */
    const char *kvsim;    /* binary for the commands (default: this one) */
    int jobs;
    int force, plot, dry_run;
} sweep_args;

static void sweep_usage(FILE *out)
{
    fprintf(out,
            "usage: kvsim sweep SWEEP.yaml [-j N] [--set key=value]... [--out DIR] [--force] [--plot]\n"
            "       kvsim sweep SWEEP.yaml --emit slurm|parallel [--kvsim PATH] [--out DIR]\n"
            "       kvsim sweep SWEEP.yaml --dry-run\n"
            "       kvsim sweep --collect DIR [--plot]\n"
            "  -j N              points run at once in worker processes (default: the CPUs online)\n"
            "  --set key=value   an override for every point, after the file's set:\n"
            "  --out DIR         the sweep's folder (default: the file's out:, else out/sweeps/NAME)\n"
            "  --force           rerun finished points too (default: skip those with results.json, or\n"
            "                    capacity.json for output: capacity)\n"
            "  --plot            run scripts/plot on the sweep folder at the end\n"
            "  --emit slurm      write DIR/sweep.slurm, a job array with one task per point\n"
            "  --emit parallel   write DIR/jobs.txt, one command per line for GNU parallel\n"
            "  --kvsim PATH      the kvsim the emitted commands call (default: this binary)\n"
            "  --dry-run         print each point's command, run nothing\n"
            "  --collect DIR     rebuild DIR/sweep.csv from the point folders\n"
            "Sweep files: docs/sweeps.md. Exit codes: 0 ok, 1 a point failed, 2 bad input.\n");
}

static int parse_jobs(const char *v, int *jobs)
{
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 1 || n > 4096) {
        fprintf(stderr, "kvsim sweep: -j: expected a number of workers 1..4096, got '%s'\n", v);
        return 2;
    }
    *jobs = (int)n;
    return 0;
}

static int parse(int argc, char **argv, sweep_args *a)
{
    memset(a, 0, sizeof *a);
    a->sets = kv_calloc((size_t)argc + 1, sizeof *a->sets);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    a->jobs = cpus > 0 ? (int)cpus : 1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            sweep_usage(stdout);
            return -1;
        } else if ((strcmp(arg, "-j") == 0 || strcmp(arg, "--jobs") == 0) && has_value) {
            if (parse_jobs(argv[++i], &a->jobs))
                return 2;
        } else if (strncmp(arg, "-j", 2) == 0 && arg[2]) {
            if (parse_jobs(arg + 2, &a->jobs))
                return 2;
        } else if (strcmp(arg, "--set") == 0 && has_value) {
            a->sets[a->n_sets++] = argv[++i];
        } else if (strcmp(arg, "--out") == 0 && has_value) {
            a->out_dir = argv[++i];
            if (!a->out_dir[0]) {
                fprintf(stderr, "kvsim sweep: --out: an empty folder name (leave --out out for the default)\n");
                return 2;
            }
        } else if (strcmp(arg, "--emit") == 0 && has_value) {
            a->emit = argv[++i];
            if (strcmp(a->emit, "slurm") != 0 && strcmp(a->emit, "parallel") != 0) {
                fprintf(stderr, "kvsim sweep: --emit: expected slurm or parallel, got '%s'\n", a->emit);
                return 2;
            }
        } else if (strcmp(arg, "--collect") == 0 && has_value) {
            a->collect = argv[++i];
            if (!a->collect[0]) {
                fprintf(stderr, "kvsim sweep: --collect: an empty folder name\n");
                return 2;
            }
        } else if (strcmp(arg, "--kvsim") == 0 && has_value) {
            a->kvsim = argv[++i];
        } else if (strcmp(arg, "--force") == 0) {
            a->force = 1;
        } else if (strcmp(arg, "--plot") == 0) {
            a->plot = 1;
        } else if (strcmp(arg, "--dry-run") == 0) {
            a->dry_run = 1;
        } else if (arg[0] == '-') {
            fprintf(stderr, "kvsim sweep: unknown or incomplete option '%s'\n", arg);
            sweep_usage(stderr);
            return 2;
        } else if (!a->file) {
            a->file = arg;
        } else {
            fprintf(stderr, "kvsim sweep: one sweep file at a time (got '%s' and '%s')\n", a->file, arg);
            return 2;
        }
    }
    if (!a->file == !a->collect) {
        if (a->file && a->collect)
            fprintf(stderr, "kvsim sweep: give a sweep file or --collect DIR, not both\n");
        sweep_usage(stderr);
        return 2;
    }
    return 0;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- Collect ---------------------------------------------------------------------------------- */

static int collect(const char *dir, int plot)
{
    kv_error err = {0};
    kv_sweep_totals t;
    if (kv_sweep_collect(dir, &t, &err)) {
        fprintf(stderr, "kvsim sweep: %s\n", err.msg);
        return err.code;
    }
    printf("collected %s: %zu points: %zu with results, %zu failed, %zu missing; wrote %s/sweep.csv (%zu rows)\n",
           dir, t.points, t.ok, t.failed, t.missing, dir, t.rows);
    int rc = t.failed ? 1 : 0;
    if (plot && kv_plot_folder(dir, NULL, stdout, NULL))
        rc = 1;
    return rc;
}

/* ---- Running points --------------------------------------------------------------------------- */

enum { STOP_GRACE_S = 10 }; /* seconds a worker gets to exit after the stop signal, before SIGKILL */

typedef struct worker {
    pid_t pid;
    size_t point;
    double start_s;
} worker;

typedef struct run_state {
    const kv_sweep *sw;
    const char *self;     /* the binary to exec */
    int tty;              /* stderr is a terminal: draw the progress line */
    size_t total, skipped, ran, failed, launched, stopped;
    size_t todo;          /* points to run this time */
    double start_s, last_draw_s;
    int line_drawn;
    sigset_t waited;      /* SIGCHLD and the stop signals not ignored: blocked, taken by sigtimedwait */
    sigset_t child_mask;  /* the mask a worker starts with (the sweep's own before blocking) */
    int stopping;         /* the stop signal, once one came */
} run_state;

static int is_stop_signal(int sig)
{
    return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

static const char *stop_signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

static void clear_line(run_state *st)
{
    if (st->line_drawn) {
        fputs("\r\033[K", stderr);
        st->line_drawn = 0;
    }
}

static void draw_line(run_state *st, size_t running)
{
    if (!st->tty)
        return;
    double t = wall_s();
    int secs = (int)(t - st->start_s);
    fprintf(stderr, "\r\033[Ksweep %s: %zu/%zu done (%zu skipped, %zu failed), %zu running, %d:%02d elapsed",
            kv_sweep_name(st->sw), st->skipped + st->ran + st->failed, st->total, st->skipped, st->failed, running,
            secs / 60, secs % 60);
    fflush(stderr);
    st->line_drawn = 1;
    st->last_draw_s = t;
}

static pid_t launch(run_state *st, size_t i)
{
    const kv_sweep_point *p = kv_sweep_point_get(st->sw, i);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/stderr.txt", p->dir);
    char *const *argv = kv_sweep_point_argv(st->sw, i);
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* Child: the signals the sweep blocked are unblocked again (kvsim run handles them), stderr to
       the point's file, stdout to nothing (the run is --quiet), then this binary. */
    sigprocmask(SIG_SETMASK, &st->child_mask, NULL);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
    int null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
        dup2(null_fd, 0);
        dup2(null_fd, 1);
        close(null_fd);
    }
    execv(st->self, argv);
    dprintf(2, "kvsim sweep: cannot run %s: %s\n", st->self, strerror(errno));
    _exit(127);
}

/* Prints the last lines of a point's stderr.txt, indented. */
static void print_tail(const char *path, int lines)
{
    kv_error quiet = {0};
    FILE *f = kv_input_fopen(path, "stderr.txt", KV_INPUT_NO_CAP, &quiet); /* a FIFO there must not block */
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > 4096 ? size - 4096 : 0;
    fseek(f, from, SEEK_SET);
    char buf[4097];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    /* Find the start of the last `lines` lines. */
    size_t at = n;
    int seen = 0;
    while (at > 0) {
        if (buf[at - 1] == '\n' && ++seen == lines)
            break;
        at--;
    }
    char *line = buf + at;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        printf("    | %s\n", line);
        line = nl ? nl + 1 : NULL;
    }
}

static void finished(run_state *st, const worker *w, int status)
{
    const kv_sweep_point *p = kv_sweep_point_get(st->sw, w->point);
    char results[PATH_MAX + 32], errpath[PATH_MAX + 32];
    snprintf(results, sizeof results, "%s/%s", p->dir, kv_sweep_result_file(st->sw));
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", p->dir);
    struct stat sb;
    int have_results = stat(results, &sb) == 0;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && have_results;
    double secs = wall_s() - w->start_s;
    clear_line(st);
    if (!ok && st->stopping) {
        /* Stopped by the sweep: not a failure of the point (its stderr.txt says nothing); it runs
           again on resume. */
        st->stopped++;
        printf("%s stopped (%.1f s)\n", p->name, secs);
    } else if (ok) {
        st->ran++;
        if (stat(errpath, &sb) == 0 && sb.st_size == 0)
            unlink(errpath);
        printf("[%zu/%zu] %s ok (%.1f s)\n", st->ran + st->failed, st->todo, p->name, secs);
    } else {
        st->failed++;
        char why[96];
        if (WIFSIGNALED(status))
            snprintf(why, sizeof why, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (WEXITSTATUS(status) != 0)
            snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
        else
            snprintf(why, sizeof why, "exit status 0 but no %s", kv_sweep_result_file(st->sw));
        /* Record the outcome in the point's stderr.txt: --collect reads a non-empty one as failed. */
        FILE *f = fopen(errpath, "ab");
        if (f) {
            fprintf(f, "kvsim sweep: point %s failed: %s\n", p->name, why);
            fclose(f);
        }
        printf("[%zu/%zu] %s FAILED: %s; last lines of %s:\n", st->ran + st->failed, st->todo, p->name, why,
               errpath);
        print_tail(errpath, 6);
    }
    fflush(stdout);
}

/* A stop signal that is pending (blocked, not taken yet), taken now; 0 if none. */
static int take_pending_stop(const run_state *st)
{
    sigset_t pending;
    if (sigpending(&pending) != 0)
        return 0;
    const int stops[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        if (sigismember(&st->waited, stops[i]) == 1 && sigismember(&pending, stops[i]) == 1) {
            sigset_t one;
            sigemptyset(&one);
            sigaddset(&one, stops[i]);
            struct timespec zero = {0, 0};
            if (sigtimedwait(&one, NULL, &zero) == stops[i])
                return stops[i];
        }
    }
    return 0;
}

/* Reaps every worker that has exited, without blocking. Returns how many; -1 on a waitpid error.
   A worker that a stop signal ended (a terminal's Ctrl-C reaches the workers too) while that
   signal waits for the sweep starts the stop here, so the point counts as stopped, not failed. */
static int reap(run_state *st, worker *workers, int jobs, size_t *running)
{
    int n = 0;
    while (*running > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == 0)
            return n;
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "kvsim sweep: waitpid: %s\n", strerror(errno));
            return -1;
        }
        int by_stop = (WIFSIGNALED(status) && is_stop_signal(WTERMSIG(status))) ||
                      (WIFEXITED(status) && WEXITSTATUS(status) > 128 && is_stop_signal(WEXITSTATUS(status) - 128));
        if (by_stop && !st->stopping)
            st->stopping = take_pending_stop(st);
        for (int k = 0; k < jobs; k++) {
            if (workers[k].pid == pid) {
                finished(st, &workers[k], status);
                workers[k].pid = 0;
                (*running)--;
                n++;
                break;
            }
        }
    }
    return n;
}

/* Waits up to `seconds` for a signal of st->waited; returns it, or 0 on timeout. */
static int next_signal(const run_state *st, double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    for (;;) {
        int sig = sigtimedwait(&st->waited, NULL, &ts);
        if (sig >= 0)
            return sig;
        if (errno != EINTR)
            return 0; /* EAGAIN: the time is up */
    }
}

/* The stop: the signal to every running worker, wait (SIGKILL after the grace time or at a second
   signal), then the temporaries of the stopped points, whose pids are dead now. */
static void stop_workers(run_state *st, worker *workers, int jobs, size_t *running)
{
    size_t *points = kv_calloc((size_t)jobs, sizeof *points);
    size_t n_points = 0;
    for (int k = 0; k < jobs; k++) {
        if (workers[k].pid > 0) {
            kill(workers[k].pid, st->stopping);
            points[n_points++] = workers[k].point;
        }
    }
    double deadline = wall_s() + STOP_GRACE_S;
    int killed = 0;
    while (*running > 0) {
        if (reap(st, workers, jobs, running) < 0)
            break;
        if (*running == 0)
            break;
        double left = deadline - wall_s();
        int sig = next_signal(st, left > 0.2 ? 0.2 : (left > 0 ? left : 0.01));
        if (!killed && (wall_s() >= deadline || is_stop_signal(sig))) {
            for (int k = 0; k < jobs; k++)
                if (workers[k].pid > 0)
                    kill(workers[k].pid, SIGKILL);
            killed = 1;
        }
    }
    for (size_t i = 0; i < n_points; i++) {
        kv_error err = {0};
        if (kv_stale_reap(kv_sweep_out_dir(st->sw), kv_sweep_point_get(st->sw, points[i])->name, NULL, &err))
            fprintf(stderr, "kvsim sweep: %s\n", err.msg);
    }
    kv_free(points);
}

static int run_points(run_state *st, const int *pending, int jobs)
{
    worker *workers = kv_calloc((size_t)jobs, sizeof *workers);
    size_t running = 0, next = 0, n = kv_sweep_point_count(st->sw);
    int rc = 0;
    for (;;) {
        while (running < (size_t)jobs && next < n) {
            if (!pending[next]) {
                next++;
                continue;
            }
            pid_t pid = launch(st, next);
            if (pid < 0) {
                fprintf(stderr, "kvsim sweep: fork: %s\n", strerror(errno));
                rc = 1;
                next = n; /* start nothing more; wait for the running ones */
                break;
            }
            for (int k = 0; k < jobs; k++) {
                if (workers[k].pid == 0) {
                    workers[k] = (worker){pid, next, wall_s()};
                    break;
                }
            }
            running++;
            next++;
        }
        if (running == 0)
            break;
        if (st->tty && wall_s() - st->last_draw_s > 0.5)
            draw_line(st, running);
        int reaped = reap(st, workers, jobs, &running);
        if (reaped < 0) {
            rc = 1;
            break;
        }
        int sig = st->stopping;
        if (reaped > 0 && !sig) {
            if (st->tty)
                draw_line(st, running);
            continue;
        }
        /* SIGCHLD wakes this up when a worker exits; the time limit redraws the progress line and
           covers a SIGCHLD merged with one already taken. */
        if (!sig)
            sig = next_signal(st, st->tty ? 0.5 : 1.0);
        if (is_stop_signal(sig)) {
            st->stopping = sig;
            clear_line(st);
            printf("sweep %s: %s: stopping %zu running point%s\n", kv_sweep_name(st->sw), stop_signal_name(sig),
                   running, running == 1 ? "" : "s");
            fflush(stdout);
            stop_workers(st, workers, jobs, &running);
            break;
        }
    }
    clear_line(st);
    kv_free(workers);
    return rc;
}

int kv_cmd_sweep(int argc, char **argv)
{
    sweep_args a;
    int rc = parse(argc, argv, &a);
    if (rc) {
        kv_free(a.sets);
        return rc < 0 ? 0 : rc;
    }
    if (a.collect) {
        rc = collect(a.collect, a.plot);
        kv_free(a.sets);
        return rc;
    }
    char self[PATH_MAX];
    if (!kv_self_exe(self, sizeof self)) {
        fprintf(stderr, "kvsim sweep: cannot find this binary through /proc/self/exe: %s\n", strerror(errno));
        kv_free(a.sets);
        return 1;
    }
    kv_error err = {0};
    kv_sweep *sw = NULL;
    rc = kv_sweep_load(a.file, a.sets, a.n_sets, a.out_dir, a.kvsim ? a.kvsim : self, &sw, &err);
    kv_free(a.sets);
    if (rc) {
        fprintf(stderr, "kvsim sweep: %s\n", err.msg);
        return rc;
    }
    rc = kv_sweep_validate(sw, &err);
    if (rc) {
        fprintf(stderr, "kvsim sweep: %s\n", err.msg);
        kv_sweep_destroy(sw);
        return rc;
    }
    size_t n = kv_sweep_point_count(sw);
    if (a.dry_run) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", kv_sweep_point_command(sw, i));
        kv_sweep_destroy(sw);
        return 0;
    }
    /* Which points are finished, before prepare rewrites each command.txt. */
    int *pending = kv_calloc(n ? n : 1, sizeof *pending);
    size_t stale = 0, skipped = 0, interrupted = 0;
    for (size_t i = 0; i < n && !a.emit; i++) {
        int is_stale = 0, was_interrupted = 0;
        int state = kv_sweep_point_state(sw, i, &is_stale, &was_interrupted);
        stale += (size_t)is_stale;
        interrupted += (size_t)was_interrupted;
        if (state == KV_POINT_FINISHED && !a.force) {
            skipped++;
        } else {
            pending[i] = 1;
            if (state == KV_POINT_FINISHED) {
                /* --force: remove the old results first, so a crash cannot leave them looking finished. */
                char results[PATH_MAX + 32];
                snprintf(results, sizeof results, "%s/%s", kv_sweep_point_get(sw, i)->dir, kv_sweep_result_file(sw));
                unlink(results);
            }
        }
    }
    rc = kv_sweep_prepare(sw, &err);
    if (rc) {
        fprintf(stderr, "kvsim sweep: %s\n", err.msg);
        kv_free(pending);
        kv_sweep_destroy(sw);
        return rc;
    }
    if (a.emit) {
        char *written = NULL;
        rc = kv_sweep_emit(sw, a.emit, &written, &err);
        if (rc) {
            fprintf(stderr, "kvsim sweep: %s\n", err.msg);
        } else if (strcmp(a.emit, "slurm") == 0) {
            printf("wrote %s (%zu array tasks)\nsubmit:  sbatch %s\nthen:    kvsim sweep --collect %s\n", written,
                   n, written, kv_sweep_out_dir(sw));
        } else {
            printf("wrote %s (%zu commands)\nrun:     parallel -j N < %s   (or --sshloginfile HOSTS on a shared "
                   "folder)\nthen:    kvsim sweep --collect %s\n",
                   written, n, written, kv_sweep_out_dir(sw));
        }
        kv_free(written);
        kv_free(pending);
        kv_sweep_destroy(sw);
        return rc;
    }
    run_state st = {.sw = sw, .self = self, .tty = kv_progress_is_terminal(stderr), .total = n, .skipped = skipped,
                    .todo = n - skipped, .start_s = wall_s()};
    /* The stop signals (unless ignored: nohup) and SIGCHLD are taken by sigtimedwait from now on. */
    sigemptyset(&st.waited);
    sigaddset(&st.waited, SIGCHLD);
    const int stops[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        struct sigaction old;
        if (sigaction(stops[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaddset(&st.waited, stops[i]);
    }
    if (sigprocmask(SIG_BLOCK, &st.waited, &st.child_mask) != 0) {
        fprintf(stderr, "kvsim sweep: sigprocmask: %s\n", strerror(errno));
        kv_free(pending);
        kv_sweep_destroy(sw);
        return 1;
    }
    printf("sweep %s: %zu points, %zu finished before (skipped), %d worker%s, folder %s\n", kv_sweep_name(sw), n,
           skipped, a.jobs, a.jobs == 1 ? "" : "s", kv_sweep_out_dir(sw));
    if (stale)
        printf("  %zu point%s had results from a different command; rerunning them\n", stale, stale == 1 ? "" : "s");
    if (interrupted)
        printf("  %zu point%s had a run killed before it finished (its temporaries are removed); rerunning %s\n",
               interrupted, interrupted == 1 ? "" : "s", interrupted == 1 ? "it" : "them");
    fflush(stdout);
    int run_rc = run_points(&st, pending, a.jobs);
    kv_free(pending);
    if (st.stopping) {
        /* The signal was taken, not delivered: exit as a process it ended would (130, 143, 129), with
           the stop signals still blocked so a second one cannot cut this short. */
        printf("sweep %s: stopped by %s: %zu ran, %zu failed, %zu stopped (they run again on resume); sweep.csv "
               "not rewritten (kvsim sweep --collect %s)\n",
               kv_sweep_name(sw), stop_signal_name(st.stopping), st.ran, st.failed, st.stopped, kv_sweep_out_dir(sw));
        fflush(stdout);
        rc = 128 + st.stopping;
        kv_sweep_destroy(sw);
        return rc;
    }
    sigprocmask(SIG_SETMASK, &st.child_mask, NULL);
    kv_sweep_totals t;
    rc = kv_sweep_collect(kv_sweep_out_dir(sw), &t, &err);
    if (rc) {
        fprintf(stderr, "kvsim sweep: %s\n", err.msg);
    } else {
        printf("sweep %s: %zu ran, %zu skipped, %zu failed in %.1f s; wrote %s/sweep.csv (%zu rows)\n",
               kv_sweep_name(sw), st.ran, st.skipped, st.failed, wall_s() - st.start_s, kv_sweep_out_dir(sw),
               t.rows);
        if (a.plot && kv_plot_folder(kv_sweep_out_dir(sw), NULL, stdout, NULL))
            rc = 1;
    }
    kv_sweep_destroy(sw);
    if (!rc && (run_rc || st.failed))
        rc = 1;
    return rc;
}
