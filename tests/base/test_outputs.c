/* test_outputs.c — output folders all or nothing: signals, kill -9, failed publishes, unwritable --out, sweep resume. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "tests/support.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *kvsim_bin(void)
{
    const char *bin = getenv("KVSIM");
    return bin && bin[0] ? bin : KV_BINARY_DIR "/kvsim";
}

/* Starts `kvsim run SCENARIO --set workload.requests=N --quiet --out OUT`, with default signal
   dispositions (a test runner may ignore SIGINT), output to /dev/null. */
static pid_t spawn_run(const char *scenario, int requests, const char *out)
{
    char set[64];
    snprintf(set, sizeof set, "workload.requests=%d", requests);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(kvsim_bin(), kvsim_bin(), "run", scenario, "--set", set, "--quiet", "--out", out, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Whether dir has an entry whose name starts with prefix. */
static int has_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL)
        found = strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return found;
}

/* Polls (every 2 ms, at most 120 s) until dir has an entry starting with prefix. Returns 1 then;
   0 if the child exited first (its status in *status, and *exited set). */
static int wait_for_entry(const char *dir, const char *prefix, pid_t pid, int *status, int *exited)
{
    *exited = 0;
    double until = now_s() + 120;
    while (now_s() < until) {
        if (has_prefix(dir, prefix))
            return 1;
        if (waitpid(pid, status, WNOHANG) == pid) {
            *exited = 1;
            return has_prefix(dir, prefix);
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int wait_exit(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return status;
}

static void expect_signal_cleanup(int sig)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-long.yaml", dir, "long.yaml");
    char *parent = kvt_path(dir, "runs");
    mkdir(parent, 0755);
    char *out = kvt_path(parent, "out");
    pid_t pid = spawn_run(scenario, 20000, out);
    int status = 0, exited = 0;
    /* Anything of the output appearing (the staging folder, or DIR itself) means the run is past its
       start; it then has seconds of simulation left, so the signal lands mid-run. */
    int seen = wait_for_entry(parent, "out", pid, &status, &exited);
    if (!exited) {
        kill(pid, sig);
        status = wait_exit(pid);
    }
    cr_expect(seen, "the run showed no sign of its output folder");
    cr_expect(!exited, "the run ended before the signal was sent");
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig,
              "signal %d: expected exit %d, got %s %d", sig, 128 + sig, WIFEXITED(status) ? "exit" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    char *left = kvt_listing(parent);
    cr_expect_str_eq(left, "", "signal %d left in the parent folder: %s", sig, left);
    free(left);
    free(out);
    free(parent);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

Test(outputs_signals, sigterm_mid_run_leaves_nothing)
{
    expect_signal_cleanup(SIGTERM);
}

Test(outputs_signals, sigint_mid_run_leaves_nothing)
{
    expect_signal_cleanup(SIGINT);
}

/* kill -9 cannot be caught: its staging folder stays, and the next run on the folder removes it.
   A temporary of a live process is left alone; one of a dead process next to a missing folder
   (a crash between the fallback's two renames) is renamed back. */
Test(outputs_stale, sigkill_leftovers_removed_by_next_run)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-long.yaml", dir, "long.yaml");
    char *parent = kvt_path(dir, "runs");
    mkdir(parent, 0755);
    char *out = kvt_path(parent, "out");
    pid_t pid = spawn_run(scenario, 20000, out);
    int status = 0, exited = 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "out.tmp.%ld", (long)pid);
    int seen = wait_for_entry(parent, prefix, pid, &status, &exited);
    if (!exited) {
        kill(pid, SIGKILL);
        wait_exit(pid);
    }
    cr_expect(seen && !exited, "no staging folder %s appeared while the run was going (got: %s)", prefix,
              kvt_listing(parent));
    char *left = kvt_listing(parent);
    cr_expect_str_eq(left, prefix, "after kill -9 only the staging folder is left, DIR is not there: %s", left);
    free(left);

    /* A fake stale temporary of another dead process, with content, and one of a live process (us). */
    char fake[64], live[64];
    snprintf(fake, sizeof fake, "out.tmp.%ld", (long)kvt_dead_pid());
    snprintf(live, sizeof live, "out.tmp.%ld", (long)getpid());
    char *fake_dir = kvt_path(parent, fake);
    char *live_dir = kvt_path(parent, live);
    mkdir(fake_dir, 0755);
    free(kvt_write(fake_dir, KV_OUTDIR_MARK, "results.json\n")); /* what marks a staging folder as kvsim's */
    free(kvt_write(fake_dir, "results.json", "{\"half\": "));
    mkdir(live_dir, 0755);

    char args[4096], *text = NULL;
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --quiet --out %s", scenario, out);
    int rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 0, "%s", text);
    free(text);
    char want[128];
    snprintf(want, sizeof want, "out %s", live);
    left = kvt_listing(parent);
    cr_expect_str_eq(left, want, "the dead processes' temporaries are gone, the live one stays: %s", left);
    free(left);
    left = kvt_listing(out);
    cr_expect_str_eq(left, "requests.csv results.json trace.json", "got: %s", left);
    free(left);
    rmdir(live_dir);

    /* DIR missing and DIR.old.<deadpid> present: the previous folder comes back, then the run replaces its
       own files in it and keeps the rest. */
    char *out2 = kvt_path(parent, "out2");
    char old[64];
    snprintf(old, sizeof old, "out2.old.%ld", (long)kvt_dead_pid());
    char *old_dir = kvt_path(parent, old);
    mkdir(old_dir, 0755);
    free(kvt_write(old_dir, "note.txt", "mine\n"));
    free(kvt_write(old_dir, "results.json", "{}\n"));
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --quiet --out %s", scenario, out2);
    rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 0, "%s", text);
    free(text);
    left = kvt_listing(out2);
    cr_expect_str_eq(left, "note.txt requests.csv results.json trace.json", "got: %s", left);
    free(left);
    char *results = kvt_path(out2, "results.json");
    char *body = kvt_read(results, NULL);
    cr_expect(body && strstr(body, "\"policies\""), "results.json is the new run's");
    free(body);
    free(results);
    cr_expect(access(old_dir, F_OK) != 0, "%s was renamed back", old);

    free(old_dir);
    free(out2);
    free(fake_dir);
    free(live_dir);
    free(out);
    free(parent);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* Files identical (both missing counts as identical). */
static int same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = kvt_read(a, &la), *y = kvt_read(b, &lb);
    int same = (!x && !y) || (x && y && la == lb && memcmp(x, y, la) == 0);
    free(x);
    free(y);
    return same;
}

Test(outputs_publish, failed_publish_leaves_folder_as_it_was)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-long.yaml", dir, "long.yaml");
    char args[4096], *text = NULL;

    /* 1. An earlier run's folder whose trace.json is now a non-empty folder: the rename of one file
       used to fail after results.json was already replaced. Now the run's files go in as a set: the
       run either succeeds with all three new, or fails leaving every file as it was. */
    char *out = kvt_path(dir, "out");
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --quiet --out %s", scenario, out);
    cr_assert_eq(kvt_kvsim(args, &text), 0, "%s", text);
    free(text);
    char *results = kvt_path(out, "results.json");
    char *trace = kvt_path(out, "trace.json");
    free(kvt_write(out, "results.json", "{\"earlier\": true}\n"));
    char *before = kvt_path(dir, "before.json");
    free(kvt_write(dir, "before.json", "{\"earlier\": true}\n"));
    unlink(trace);
    mkdir(trace, 0755);
    free(kvt_write(trace, "inside", "x"));
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --seed 3 --quiet --out %s", scenario, out);
    int rc = kvt_kvsim(args, &text);
    struct stat st;
    if (rc == 0) {
        cr_expect(stat(trace, &st) == 0 && S_ISREG(st.st_mode), "trace.json is the new file");
        cr_expect(!same_file(results, before), "results.json is the new one");
    } else {
        cr_expect(same_file(results, before), "the run failed (%d) but replaced results.json:\n%s", rc, text);
        cr_expect(stat(trace, &st) == 0 && S_ISDIR(st.st_mode));
    }
    free(text);
    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "before.json long.yaml out", "no temporaries: %s", left);
    free(left);

    /* 2. DIR is replaced by a regular file while the run simulates: publishing fails, the file stays as
       it is, and the staging folder is removed. */
    char *parent = kvt_path(dir, "p2");
    mkdir(parent, 0755);
    char *out2 = kvt_path(parent, "out");
    pid_t pid = spawn_run(scenario, 8000, out2); /* seconds of simulation: time to swap DIR */
    int status = 0, exited = 0;
    int seen = wait_for_entry(parent, "out.tmp.", pid, &status, &exited);
    free(kvt_write(parent, "out", "not a folder\n"));
    if (!exited)
        status = wait_exit(pid);
    cr_expect(seen && !exited, "no staging folder appeared while the run was going");
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "publishing onto a file fails with exit 1");
    char *body = kvt_read(out2, NULL);
    cr_expect(body && strcmp(body, "not a folder\n") == 0, "the file is left as it was");
    free(body);
    left = kvt_listing(parent);
    cr_expect_str_eq(left, "out", "no staging folder is left: %s", left);
    free(left);

    /* 3. DIR holds a socket: kvsim never moves what it does not own, so the run publishes its own
       names beside it and the socket stays as it was. */
    char *out3 = kvt_path(dir, "out3");
    mkdir(out3, 0755);
    free(kvt_write(out3, "results.json", "{\"earlier\": true}\n"));
    char *sock_path = kvt_path(out3, "s.sock");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
    struct stat sock_before, sock_after;
    cr_assert_eq(lstat(sock_path, &sock_before), 0);
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --quiet --out %s", scenario, out3);
    rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 0, "a socket in DIR is left alone:\n%s", text);
    free(text);
    left = kvt_listing(out3);
    cr_expect_str_eq(left, "requests.csv results.json s.sock trace.json", "the socket stays: %s", left);
    free(left);
    cr_expect(lstat(sock_path, &sock_after) == 0 && S_ISSOCK(sock_after.st_mode) &&
                  sock_after.st_ino == sock_before.st_ino, "the socket is the same one");
    char *r3 = kvt_path(out3, "results.json");
    cr_expect(!same_file(r3, before), "results.json is the new run's");
    free(r3);
    close(s);
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "before.json long.yaml out out3 p2", "no temporaries: %s", left);
    free(left);

    free(sock_path);
    free(out3);
    free(out2);
    free(parent);
    free(before);
    free(trace);
    free(results);
    free(out);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

Test(outputs_check, unwritable_out_exits_2_before_simulating)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-long.yaml", dir, "long.yaml");
    char *file = kvt_write(dir, "file", "a file\n");
    /* A policy that fails only once the simulation runs (placement happens at the first transfer): a
       run that simulated before checking --out would report this error instead of the path. */
    char *boom = kvt_write(dir, "boom.lua", "return { name = 'boom', decode_node = function(ctx) "
                                            "error('the simulation ran') end }\n");
    char args[8192], *text = NULL;

    snprintf(args, sizeof args, "run %s --quiet --set policies=[boom] --set policy.boom.file=%s", scenario, boom);
    cr_assert_eq(kvt_kvsim(args, &text), 2, "%s", text);
    cr_assert(strstr(text, "the simulation ran") != NULL, "the policy fails when simulating: %s", text);
    free(text);

    /* Under a regular file: no folder can be made there, not even by root. */
    const char *bad[] = {"/etc/passwd/x", NULL, NULL};
    char *under = kvt_path(file, "sub/out");
    bad[1] = under;
    bad[2] = file; /* an existing file as the folder */
    for (size_t i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "run %s --quiet --out %s --set policies=[boom] --set policy.boom.file=%s",
                 scenario, bad[i], boom);
        int rc = kvt_kvsim(args, &text);
        cr_expect_eq(rc, 2, "--out %s: exit 2, got %d:\n%s", bad[i], rc, text);
        cr_expect(strstr(text, bad[i]) != NULL, "the message names %s:\n%s", bad[i], text);
        cr_expect(strstr(text, "the simulation ran") == NULL, "--out %s checked after simulating:\n%s", bad[i],
                  text);
        free(text);
    }
    free(boom);
    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "boom.lua file long.yaml", "nothing written: %s", left);
    free(left);
    char *body = kvt_read(file, NULL);
    cr_expect_str_eq(body, "a file\n");
    free(body);

    /* kvsim eval checks its --out before loading the model. */
    char *eval_sc = kvt_source("scenarios/accuracy.yaml");
    snprintf(args, sizeof args, "eval %s --quiet --out %s", eval_sc, under);
    int rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 2, "eval: exit %d: %.300s", rc, text);
    cr_expect(strstr(text, under) != NULL && strstr(text, "nothing was run"), "eval names the folder:\n%.300s", text);
    free(text);
    free(eval_sc);

    free(under);
    free(file);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

Test(outputs_sweep, resume_reruns_points_with_stale_temporaries)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *sweep = kvt_write(dir, "sweep.yaml", "name: st\nbase: base.yaml\nmatrix: {seed: [1, 2]}\n");
    char *out = kvt_path(dir, "out");
    char args[4096], *text = NULL;
    snprintf(args, sizeof args, "sweep %s -j 2 --out %s", sweep, out);
    cr_assert_eq(kvt_kvsim(args, &text), 0, "%s", text);
    cr_expect(strstr(text, "2 ran, 0 skipped, 0 failed") != NULL, "%s", text);
    free(text);

    /* Point 0 looks finished, but a run of it was killed with -9 (its staging folder is there), and the
       sweep itself was killed while writing points.json. */
    pid_t dead = kvt_dead_pid();
    char name[128];
    snprintf(name, sizeof name, "p00-seed=1.tmp.%ld", (long)dead);
    char *stale = kvt_path(out, name);
    mkdir(stale, 0755);
    free(kvt_write(stale, KV_OUTDIR_MARK, "results.json\n")); /* what marks a staging folder as kvsim's */
    free(kvt_write(stale, "results.json", "{\"half"));
    snprintf(name, sizeof name, "points.json.tmp.%ld", (long)dead);
    free(kvt_write(out, name, "{\"sweep\""));
    char *point0 = kvt_path(out, "p00-seed=1");
    char *point0_cmd = kvt_path(point0, "command.txt");
    cr_expect(access(point0_cmd, F_OK) == 0);

    int rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 0, "%s", text);
    cr_expect(strstr(text, "1 ran, 1 skipped, 0 failed") != NULL, "the interrupted point runs again:\n%s", text);
    cr_expect(strstr(text, "p00-seed=1 ok") != NULL, "%s", text);
    free(text);
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, "p00-seed=1 p01-seed=2 points.json sweep.csv", "temporaries removed: %s", left);
    free(left);
    cr_expect(access(point0_cmd, F_OK) == 0, "the point keeps its command.txt across the republish");
    char *csv_path = kvt_path(out, "sweep.csv");
    char *csv = kvt_read(csv_path, NULL);
    cr_expect(csv && !strstr(csv, ".tmp."), "sweep.csv lists no temporary:\n%s", csv);
    free(csv);
    free(csv_path);

    free(point0_cmd);
    free(point0);
    free(stale);
    free(out);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- The library calls themselves ------------------------------------------------------------- */

/* Publishing over an existing folder, by exchange and by the two-rename fallback: the owned names
   are replaced as a set, the rest is kept (the same inode: hard links), nothing temporary stays. */
static void publish_over(int exchange_off)
{
    char *dir = kvt_tempdir();
    char *out = kvt_path(dir, "out");
    mkdir(out, 0755);
    char *note = kvt_write(out, "note.txt", "mine\n");
    free(kvt_write(out, "results.json", "{\"old\": 1}\n"));
    free(kvt_write(out, "trace.json", "old trace\n"));
    char *sub = kvt_path(out, "sub");
    mkdir(sub, 0755);
    free(kvt_write(sub, "deep.txt", "deep\n"));
    struct stat before;
    cr_assert_eq(stat(note, &before), 0);

    static const char *const owned[] = {"results.json", "requests.csv", "trace.json", "figures"};
    kv_outdir od;
    kv_cleanup_slot slot;
    memset(&slot, 0, sizeof slot);
    kv_error err = {0};
    cr_assert_eq(kv_outdir_begin(&od, out, owned, 4, &slot, &err), KV_OK, "%s", err.msg);
    cr_expect(slot.armed && strcmp(slot.path, kv_outdir_staging(&od)) == 0, "the registry names the staging folder");
    free(kvt_write(kv_outdir_staging(&od), "results.json", "{\"new\": 1}\n"));
    od.plain_rename = exchange_off;
    cr_assert_eq(kv_outdir_commit(&od, &err), KV_OK, "%s", err.msg);
    cr_expect(!slot.armed, "disarmed after publishing");

    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "out", "exchange_off=%d: %s", exchange_off, left);
    free(left);
    left = kvt_listing(out);
    cr_expect_str_eq(left, "note.txt results.json sub", "trace.json (owned, not written) is gone: %s", left);
    free(left);
    char *results = kvt_path(out, "results.json");
    char *body = kvt_read(results, NULL);
    cr_expect_str_eq(body, "{\"new\": 1}\n");
    free(body);
    struct stat after;
    cr_expect(stat(note, &after) == 0 && after.st_ino == before.st_ino, "note.txt is the same file (linked)");
    char *deep = kvt_path(sub, "deep.txt");
    body = kvt_read(deep, NULL);
    cr_expect(body && strcmp(body, "deep\n") == 0, "sub-folders are kept");
    free(body);
    free(deep);
    free(results);
    free(sub);
    free(note);
    free(out);
    kvt_rmtree(dir);
    free(dir);
}

Test(outputs_lib, publish_by_exchange)
{
    publish_over(0);
}

Test(outputs_lib, publish_by_two_renames)
{
    publish_over(1);
}

/* kv_rmtree removes a tree without following symbolic links out of it; the abort path leaves DIR as it was. */
Test(outputs_lib, rmtree_stays_inside_and_abort_keeps_dir)
{
    char *dir = kvt_tempdir();
    char *outside = kvt_path(dir, "outside");
    mkdir(outside, 0755);
    char *precious = kvt_write(outside, "precious", "keep\n");
    char *tree = kvt_path(dir, "tree");
    mkdir(tree, 0755);
    char *link = kvt_path(tree, "link");
    cr_assert_eq(symlink(outside, link), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s", tree);
    for (int i = 0; i < 5; i++) {
        strcat(path, "/d");
        mkdir(path, 0755);
        free(kvt_write(path, "f", "x"));
    }
    cr_expect_eq(kv_rmtree(tree), 0);
    cr_expect(access(tree, F_OK) != 0, "the tree is gone");
    cr_expect(access(precious, F_OK) == 0, "what a symbolic link pointed to is not");

    char *out = kvt_path(dir, "out");
    mkdir(out, 0755);
    free(kvt_write(out, "results.json", "{}\n"));
    kv_outdir od;
    kv_error err = {0};
    static const char *const owned[] = {"results.json"};
    cr_assert_eq(kv_outdir_begin(&od, out, owned, 1, NULL, &err), KV_OK, "%s", err.msg);
    free(kvt_write(kv_outdir_staging(&od), "results.json", "{\"new\": 1}\n"));
    kv_outdir_abort(&od);
    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "out outside", "%s", left);
    free(left);
    left = kvt_listing(out);
    cr_expect_str_eq(left, "results.json", "%s", left);
    free(left);

    free(out);
    free(link);
    free(tree);
    free(precious);
    free(outside);
    kvt_rmtree(dir);
    free(dir);
}

/* Figures are part of the folder: drawn in the staging folder (the messages name DIR), published with
   the rest; a plotting failure publishes the results without its half-drawn figures and exits 1. */
Test(outputs_plot, figures_staged_and_failed_plots_not_published)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-long.yaml", dir, "long.yaml");
    /* A stand-in for Python with matplotlib: writes one figure where scripts/plot would. */
    char *py = kvt_write(dir, "fakepy", "#!/bin/sh\n"
                                        "[ \"$1\" = -c ] && exit 0\n"
                                        "mkdir -p \"$2/figures\" && echo png > \"$2/figures/a.png\" || exit 3\n"
                                        "echo \"wrote $2/figures/a{.png}\"\n"
                                        "[ -e \"$2/fail-plots\" ] && exit 1\n"
                                        "exit 0\n");
    chmod(py, 0755);
    char *out = kvt_path(dir, "out");
    char args[4096], *text = NULL;
    snprintf(args, sizeof args, "run %s --set workload.requests=5 --quiet --plot --out %s", scenario, out);
    setenv("KVSIM_PYTHON", py, 1);
    int rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 0, "%s", text);
    char want[4200];
    snprintf(want, sizeof want, "wrote %s/figures/a{.png}", out);
    cr_expect(strstr(text, want) != NULL, "the message names the final folder, not the staging one:\n%s", text);
    free(text);
    char *fig = kvt_path(out, "figures/a.png");
    cr_expect(access(fig, F_OK) == 0, "the figure was published with the results");

    /* The plotting fails this time (the marker file is carried into the staging folder). */
    free(kvt_write(out, "fail-plots", ""));
    unlink(fig);
    rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 1, "a failed plot makes the run exit 1:\n%s", text);
    free(text);
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, "fail-plots requests.csv results.json trace.json", "no half-drawn figures: %s", left);
    free(left);
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "fakepy long.yaml out", "no temporaries: %s", left);
    free(left);
    unsetenv("KVSIM_PYTHON");
    free(fig);
    free(out);
    free(py);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}
