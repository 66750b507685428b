/* test_emit_cluster.c — a sweep's emitted jobs run end to end: jobs.txt under GNU parallel and sweep.slurm
 * as a job array on a real single-node Slurm (tests/scripts/slurm-single-node.sh), each collected into a
 * sweep.csv byte-equal to `kvsim sweep`'s own. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support.h"

static const char *kvsim_bin(void)
{
    const char *bin = getenv("KVSIM");
    return bin ? bin : KV_BINARY_DIR "/kvsim";
}

/* A two-point sweep of a small scenario (a fraction of a second a point) in dir; its path (free it). */
static char *small_sweep(const char *dir)
{
    char *base = kvt_source("tests/fixtures/scenarios/capacity-small.yaml");
    char *text = NULL;
    cr_assert(asprintf(&text, "base: %s\nset: {workload.requests: 8}\nmatrix:\n  network.nic_bandwidth_gbps: [10, 25]\n",
                       base) > 0);
    char *path = kvt_write(dir, "small.yaml", text);
    free(text);
    free(base);
    return path;
}

Test(emit_cluster, parallel_jobs_collect_to_the_same_sweep_csv, .timeout = 240)
{
    char *out = NULL;
    if (kvt_sh("command -v parallel", &out) != 0) {
        free(out);
        cr_skip_test("skipped: GNU parallel is not installed (Debian: parallel; scripts/setup.sh installs it)");
    }
    free(out);
    char *dir = kvt_tempdir();
    char *sweep = small_sweep(dir);
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "cd '%s' && '%s' sweep '%s' -j 2 --out local && '%s' sweep '%s' --emit parallel --out par "
                       "&& cd / && parallel -j 2 < '%s/par/jobs.txt' && '%s' sweep --collect '%s/par'",
                       dir, kvsim_bin(), sweep, kvsim_bin(), sweep, dir, kvsim_bin(), dir) > 0);
    int rc = kvt_sh(cmd, &out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
    cr_expect(strstr(out, "2 with results, 0 failed, 0 missing"), "%s", out);
    free(out);
    char *a_path = kvt_path(dir, "local/sweep.csv"), *b_path = kvt_path(dir, "par/sweep.csv");
    size_t la = 0, lb = 0;
    char *a = kvt_read(a_path, &la), *b = kvt_read(b_path, &lb);
    cr_assert(a && b);
    cr_expect(la == lb && memcmp(a, b, la) == 0, "sweep.csv differs:\n--- kvsim sweep\n%s\n--- parallel\n%s", a, b);
    cr_expect(strstr(a, ",ok,") != NULL, "%s", a);
    free(a);
    free(b);
    free(a_path);
    free(b_path);
    free(cmd);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

Test(emit_cluster, slurm_single_node_runs_the_emitted_array, .timeout = 420)
{
    char *dir = kvt_tempdir();
    char *sweep = small_sweep(dir);
    char *script = kvt_source("tests/scripts/slurm-single-node.sh");
    char *cmd = NULL, *out = NULL;
    cr_assert(asprintf(&cmd, "sh '%s' '%s' '%s'", script, kvsim_bin(), sweep) > 0);
    int rc = kvt_sh(cmd, &out);
    if (rc == 77) {
        /* The script's one line: "skipped: slurm cannot start here: <reason>". */
        char *line = strstr(out, "skipped: ");
        char *nl = line ? strchr(line, '\n') : NULL;
        if (nl)
            *nl = '\0';
        char reason[600];
        snprintf(reason, sizeof reason, "%s", line ? line : "skipped: slurm cannot start here: (no reason given)");
        free(out);
        free(cmd);
        free(script);
        free(sweep);
        kvt_rmtree(dir);
        free(dir);
        cr_skip_test("%s", reason);
    }
    cr_expect_eq(rc, 0, "%s\n%s", cmd, out);
    cr_expect(strstr(out, "sweep.csv equal to kvsim sweep's"), "%s", out);
    free(out);
    free(cmd);
    free(script);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}
