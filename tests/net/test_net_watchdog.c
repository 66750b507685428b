/* test_net_watchdog.c — SimGrid input that used to hang, abort or give absurd times: through the kvsim binary.
 *
 * Every case runs `kvsim run` (and `kvsim validate`) on a small scenario and wants
 * exit 2, a message naming the scenario file, line and key, no output folder, and a
 * quick end (Criterion's .timeout bounds the cases that used to spin forever). The
 * watchdog case stops the SimGrid child (SIGSTOP) in the middle of a run: kvsim must
 * notice within network.watchdog_s, kill and reap the child, and fail cleanly.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support.h"

/* A small disaggregated scenario; `network` is the body of its network: section
   (lines 7 onwards of the file), each line indented by two spaces. */
static char *scenario(const char *dir, const char *network)
{
    char text[4096];
    snprintf(text, sizeof text,
             "name: watchdog\n"                       /* 1 */
             "model: llama-3-8b\n"                    /* 2 */
             "cluster:\n"                             /* 3 */
             "  prefill: {nodes: 2}\n"                /* 4 */
             "  decode: {nodes: 2}\n"                 /* 5 */
             "network:\n"                             /* 6 */
             "%s"                                     /* 7.. */
             "workload: {requests: 20, rate_per_s: 50}\n"
             "policies: [bf16]\n",
             network);
    return kvt_write(dir, "s.yaml", text);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs `kvsim run` and `kvsim validate` on the scenario; both must exit 2 within a few
   seconds with every |-separated word of `want` in the message, and leave no output. */
static void expect_bad(const char *network, const char *want)
{
    char *dir = kvt_tempdir();
    char *path = scenario(dir, network);
    char out_dir[600], args[1400];
    snprintf(out_dir, sizeof out_dir, "%s/out", dir);
    for (int validate = 0; validate < 2; validate++) {
        if (validate)
            snprintf(args, sizeof args, "validate %s", path);
        else
            snprintf(args, sizeof args, "run %s --quiet --out %s", path, out_dir);
        char *out = NULL;
        double t0 = now_s();
        int rc = kvt_kvsim(args, &out);
        double took = now_s() - t0;
        if (strstr(out, "not built"))
            cr_skip_test("skipped: SimGrid is not built into this kvsim");
        cr_assert_eq(rc, 2, "kvsim %s: want exit 2 for [%s], got %d: %s", args, want, rc, out);
        char words[512];
        snprintf(words, sizeof words, "%s", want);
        for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
            cr_assert(strstr(out, w), "kvsim %s: '%s' not in: %s", validate ? "validate" : "run", w, out);
        cr_assert_not(strstr(out, "died of signal") || strstr(out, "Impossible"), "SimGrid's raw abort: %s", out);
        cr_assert_lt(took, 10.0, "kvsim %s took %.1f s", args, took);
        cr_assert_not(exists(out_dir), "kvsim %s left %s behind", args, out_dir);
        free(out);
    }
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* Used to spin forever inside SimGrid (the child never answered). */
Test(net_watchdog, surf_precision_zero_is_bad_input, .timeout = 60)
{
    expect_bad("  simgrid:\n    network/model: CM02\n    surf/precision: 0\n",
               "s.yaml:9:21: network.simgrid.surf/precision|must be > 0");
}

/* Used to exit 1 with SimGrid's abort text ("Bandwidth factor cannot be 0"). */
Test(net_watchdog, zero_bandwidth_factor_is_bad_input, .timeout = 60)
{
    expect_bad("  simgrid: {network/bandwidth-factor: 0}\n", "s.yaml:7:39: network.simgrid.network/bandwidth-factor");
}

/* Used to exit 1 with "The Impossible Did Happen". */
Test(net_watchdog, huge_maxmin_precision_is_bad_input, .timeout = 60)
{
    expect_bad("  simgrid:\n    maxmin/precision: 1e300\n", "s.yaml:8:23: network.simgrid.maxmin/precision|1e300");
}

/* Used to run and report transfers of 4e305 ms. */
Test(net_watchdog, absurd_latency_factor_is_bad_input, .timeout = 60)
{
    expect_bad("  simgrid:\n    network/latency-factor: 1e308\n",
               "s.yaml:8:29: network.simgrid.network/latency-factor|<= 1000");
    expect_bad("  simgrid:\n    network/latency-factor: nan\n",
               "s.yaml:8:29: network.simgrid.network/latency-factor|finite");
}

/* Options kvsim does not know, and values SimGrid would abort on. */
Test(net_watchdog, unknown_options_and_values_are_bad_input, .timeout = 60)
{
    expect_bad("  simgrid:\n    debug/breakpoint: 0\n", "s.yaml:8:23: network.simgrid.debug/breakpoint|not a SimGrid option");
    expect_bad("  simgrid:\n    network/model: Constant\n", "s.yaml:8:20: network.simgrid.network/model|'Constant'");
    expect_bad("  simgrid:\n    network/crosstraffic: maybe\n", "network.simgrid.network/crosstraffic|boolean");
    expect_bad("  simgrid:\n    network/TCP-gamma: {a: 1}\n", "s.yaml:8:24: network.simgrid.network/TCP-gamma|mapping");
}

/* hosts sorted by name: gpu-a, gpu-b prefill; gpu-c, gpu-d decode; gpu-b reaches nobody. */
static const char no_route_xml[] =
    "<?xml version='1.0'?>\n"
    "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
    "<platform version=\"4.1\">\n"
    "  <zone id=\"lab\" routing=\"%s\">\n"
    "    <host id=\"gpu-a\" speed=\"1Gf\"/>\n"
    "    <host id=\"gpu-b\" speed=\"1Gf\"/>\n"
    "    <host id=\"gpu-c\" speed=\"1Gf\"/>\n"
    "    <host id=\"gpu-d\" speed=\"1Gf\"/>\n"
    "    <link id=\"ac\" bandwidth=\"10GBps\" latency=\"3us\"/>\n"
    "    <link id=\"ad\" bandwidth=\"10GBps\" latency=\"3us\"/>\n"
    "    <route src=\"gpu-a\" dst=\"gpu-c\"><link_ctn id=\"ac\"/></route>\n"
    "    <route src=\"gpu-a\" dst=\"gpu-d\"><link_ctn id=\"ad\"/></route>\n"
    "  </zone>\n"
    "</platform>\n";

/* Used to exit 1 with "no connecting path" (Full), an exception (Floyd) or a
   segmentation fault (Dijkstra) in the middle of the run, and validate said ok. */
Test(net_watchdog, platform_without_a_route_is_bad_input, .timeout = 60)
{
    const char *routings[] = {"Full", "Floyd", "Dijkstra"};
    const char *want[] = {"s.yaml:8:18: network.platform_file|lab.xml|no route from host 'gpu-b' (prefill node "
                          "1) to host 'gpu-c' (decode node 0)",
                          "s.yaml:8:18: network.platform_file|lab.xml|no route from host 'gpu-b'",
                          "s.yaml:8:18: network.platform_file|lab.xml|SimGrid cannot route"};
    for (int k = 0; k < 3; k++) {
        char *dir = kvt_tempdir();
        char xml[2048];
        snprintf(xml, sizeof xml, no_route_xml, routings[k]);
        char *plat = kvt_write(dir, "lab.xml", xml);
        char net[1024];
        snprintf(net, sizeof net, "  topology: platform\n  platform_file: %s\n", plat);
        expect_bad(net, want[k]);
        free(plat);
        kvt_rmtree(dir);
        free(dir);
    }
}

/* ---- the watchdog: a SimGrid child that stops answering ---- */

/* The first child process of `parent` (scanning /proc), or 0. */
static pid_t child_of(pid_t parent)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    pid_t found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (close_paren && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
            found = pid;
    }
    closedir(d);
    return found;
}

/* Starts `kvsim run` on a long run, stops its SimGrid child once the run is under way,
   and waits for kvsim; returns its exit status, output in *out, seconds from the stop to
   kvsim's exit in *after_stop. */
static int run_and_stop_child(const char *network, char **out, double *after_stop, char **out_dir_left)
{
    char *dir = kvt_tempdir();
    char text[4096];
    snprintf(text, sizeof text,
             "name: watchdog\nmodel: llama-3-8b\ncluster:\n  prefill: {nodes: 2}\n  decode: {nodes: 2}\n"
             "network:\n  watchdog_s: 1\n%sworkload: {requests: 100000, rate_per_s: 400}\npolicies: [bf16]\n",
             network);
    char *path = kvt_write(dir, "s.yaml", text);
    char log[600], out_dir[600];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(out_dir, sizeof out_dir, "%s/out", dir);
    const char *bin = getenv("KVSIM");
    if (!bin)
        bin = KV_BINARY_DIR "/kvsim";
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(bin, bin, "run", path, "--quiet", "--out", out_dir, (char *)NULL);
        _exit(127);
    }
    /* Stop the child of the run itself (validation forks a short-lived one first). */
    pid_t child = 0;
    double t0 = now_s();
    while (now_s() - t0 < 20) {
        usleep(50000);
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            pid = 0;
            break;
        }
        pid_t c = child_of(pid);
        if (c && now_s() - t0 > 0.5 && kill(c, SIGSTOP) == 0) {
            child = c;
            break;
        }
    }
    int status = 0;
    double stopped = now_s();
    if (pid > 0) {
        if (!child) {
            kill(pid, SIGKILL);
        }
        waitpid(pid, &status, 0);
    }
    *after_stop = now_s() - stopped;
    *out = kvt_read(log, NULL);
    if (!*out)
        *out = strdup("");
    *out_dir_left = exists(out_dir) ? strdup(out_dir) : NULL;
    cr_assert(child, "never saw the SimGrid child running; kvsim said: %s", *out);
    /* kvsim reaped it: no such process any more (a zombie would still be there). */
    cr_assert(kill(child, 0) != 0 && errno == ESRCH, "the SimGrid child %d is still there", (int)child);
    free(path);
    kvt_rmtree(dir);
    free(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(net_watchdog, a_silent_child_fails_the_run_within_watchdog_s, .timeout = 40)
{
    char *out, *left;
    double after;
    int rc = run_and_stop_child("", &out, &after, &left);
    if (strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    /* No SimGrid option to blame: the run failed (exit 1), not bad input. */
    cr_assert_eq(rc, 1, "want exit 1, got %d: %s", rc, out);
    cr_assert(strstr(out, "made no progress") && strstr(out, "no answer for 1 s") && strstr(out, "network.watchdog_s"),
              "got: %s", out);
    cr_assert_lt(after, 8.0, "kvsim took %.1f s after the child stopped (watchdog_s: 1)", after);
    cr_assert_null(left, "left %s behind", left);
    free(out);
}

Test(net_watchdog, a_silent_child_blames_the_scenarios_simgrid_option, .timeout = 40)
{
    char *out, *left;
    double after;
    int rc = run_and_stop_child("  simgrid:\n    maxmin/precision: 1e-9\n", &out, &after, &left);
    if (strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, 2, "want exit 2, got %d: %s", rc, out);
    cr_assert(strstr(out, "s.yaml:9:23: network.simgrid.maxmin/precision") && strstr(out, "made no progress") &&
                  strstr(out, "likely cause"),
              "got: %s", out);
    cr_assert_lt(after, 8.0, "kvsim took %.1f s after the child stopped (watchdog_s: 1)", after);
    cr_assert_null(left, "left %s behind", left);
    free(out);
}

Test(net_watchdog, watchdog_s_is_a_checked_scenario_key, .timeout = 30)
{
    char *out = NULL;
    char *dir = kvt_tempdir();
    char *path = scenario(dir, "  watchdog_s: 0\n");
    char args[700];
    snprintf(args, sizeof args, "validate %s", path);
    cr_assert_eq(kvt_kvsim(args, &out), 2, "got: %s", out);
    cr_assert(strstr(out, "s.yaml:7:15") && strstr(out, "network.watchdog_s"), "got: %s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("help scenario", &out), 0);
    cr_assert(strstr(out, "watchdog_s: 60"), "got: %s", out);
    free(out);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
