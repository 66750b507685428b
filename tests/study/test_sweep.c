/* test_sweep.c — sweep expansion, the worker pool, resume, crashed points, the combined CSV, job scripts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/study/sweep.h"
#include "tests/support.h"

/* Loads sweep_text as dir/sweep.yaml over the tiny base tests/fixtures/scenarios/sweep-base.yaml. */
static kv_sweep *load(const char *dir, const char *sweep_text, kv_error *err, int *rc)
{
    char *base = kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml");
    char *path = kvt_write(dir, "sweep.yaml", sweep_text);
    char out[1024];
    snprintf(out, sizeof out, "%s/out", dir);
    kv_sweep *sw = NULL;
    *rc = kv_sweep_load(path, NULL, 0, out, "/bin/kvsim", &sw, err);
    free(base);
    free(path);
    return sw;
}

/* The value of `--set KEY=...` in a point's argv, or NULL. */
static const char *set_value(char *const *argv, const char *key)
{
    size_t len = strlen(key);
    for (size_t i = 0; argv[i]; i++)
        if (strcmp(argv[i], "--set") == 0 && argv[i + 1] && strncmp(argv[i + 1], key, len) == 0 &&
            argv[i + 1][len] == '=')
            return argv[i + 1] + len + 1;
    return NULL;
}

Test(sweep_expand, cartesian_last_key_fastest)
{
    char *dir = kvt_tempdir();
    kv_error err = {0};
    int rc;
    kv_sweep *sw = load(dir, "base: base.yaml\n"
                             "matrix:\n"
                             "  network.nic_bandwidth_gbps: [10, 25, 100]\n"
                             "  policies: [[bf16, lynx], [int4]]\n",
                        &err, &rc);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    cr_assert_eq(kv_sweep_point_count(sw), 6);
    cr_assert_eq(kv_sweep_key_count(sw), 2);
    cr_expect_str_eq(kv_sweep_key(sw, 0), "network.nic_bandwidth_gbps");
    cr_expect_str_eq(kv_sweep_name(sw), "sweep"); /* no name: the file's base name */
    const char *bw[] = {"10", "10", "25", "25", "100", "100"};
    const char *pol[] = {"[bf16, lynx]", "[int4]", "[bf16, lynx]", "[int4]", "[bf16, lynx]", "[int4]"};
    for (size_t i = 0; i < 6; i++) {
        const kv_sweep_point *p = kv_sweep_point_get(sw, i);
        cr_expect_str_eq(p->values[0], bw[i], "point %zu", i);
        cr_expect_str_eq(p->values[1], pol[i], "point %zu", i);
        char *const *argv = kv_sweep_point_argv(sw, i);
        cr_expect_str_eq(argv[0], "/bin/kvsim");
        cr_expect_str_eq(argv[1], "run");
        cr_expect(strstr(argv[2], "/base.yaml") != NULL && argv[2][0] == '/', "base made absolute: %s", argv[2]);
        cr_expect_str_eq(set_value(argv, "network.nic_bandwidth_gbps"), bw[i]);
        cr_expect_str_eq(set_value(argv, "policies"), pol[i]);
        cr_expect_str_eq(set_value(argv, "outputs.json"), "true");
        const char *cmd = kv_sweep_point_command(sw, i);
        cr_expect(strstr(cmd, "--out ") && strstr(cmd, p->dir) && strstr(cmd, "--quiet"), "%s", cmd);
    }
    cr_expect_str_eq(kv_sweep_point_get(sw, 0)->name, "p00-nic_bandwidth_gbps=10-policies=bf16+lynx");
    cr_expect_str_eq(kv_sweep_point_get(sw, 5)->name, "p05-nic_bandwidth_gbps=100-policies=int4");
    kv_sweep_destroy(sw);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_expand, zip_pairs_values)
{
    char *dir = kvt_tempdir();
    kv_error err = {0};
    int rc;
    kv_sweep *sw = load(dir, "name: z\nbase: base.yaml\nmode: zip\n"
                             "set: {workload.requests: 3, description: 'a: b'}\n"
                             "matrix:\n"
                             "  network.nic_bandwidth_gbps: [10, 25, 100]\n"
                             "  seed: [1, 2, 3]\n",
                        &err, &rc);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    cr_assert_eq(kv_sweep_point_count(sw), 3);
    const char *bw[] = {"10", "25", "100"}, *seed[] = {"1", "2", "3"};
    for (size_t i = 0; i < 3; i++) {
        char *const *argv = kv_sweep_point_argv(sw, i);
        cr_expect_str_eq(set_value(argv, "network.nic_bandwidth_gbps"), bw[i]);
        cr_expect_str_eq(set_value(argv, "seed"), seed[i]);
        cr_expect_str_eq(set_value(argv, "workload.requests"), "3");
        cr_expect_str_eq(set_value(argv, "description"), "'a: b'", "a quoted string stays a string");
    }
    kv_sweep_destroy(sw);

    /* Unequal lengths are an error that points at the list. */
    sw = load(dir, "base: base.yaml\nmode: zip\nmatrix:\n  seed: [1, 2]\n  network.nic_bandwidth_gbps: [10]\n", &err,
              &rc);
    cr_expect_eq(rc, KV_EINPUT);
    cr_expect_null(sw);
    cr_expect(strstr(err.msg, "sweep.yaml:5:") && strstr(err.msg, "equal length"), "got: %s", err.msg);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_expand, bad_files_say_where)
{
    char *dir = kvt_tempdir();
    kv_error err = {0};
    int rc;
    struct {
        const char *text, *expect;
    } cases[] = {
        {"base: base.yaml\nmatrx: {seed: [1]}\n", "unknown key 'matrx' (did you mean 'matrix'?)"},
        {"matrix: {seed: [1]}\n", "base: missing"},
        {"base: nowhere.yaml\n", "sweep.yaml:1:7: base: 'nowhere.yaml' not found"},
        {"base: base.yaml\nmode: diagonal\n", "mode: expected cartesian or zip"},
        {"base: base.yaml\nmatrix: {network: {nic_bandwidth_gbps: [1]}}\n", "write nested keys with dots"},
        {"base: base.yaml\nmatrix: {seed: []}\n", "an empty list gives no points"},
        {"base: base.yaml\nset: [1, 2]\n", "set: expected a mapping"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv_sweep *sw = load(dir, cases[i].text, &err, &rc);
        cr_expect_eq(rc, KV_EINPUT, "case %zu", i);
        cr_expect_null(sw);
        cr_expect(strstr(err.msg, cases[i].expect) != NULL, "case %zu: got: %s", i, err.msg);
        kv_sweep_destroy(sw);
    }
    /* No matrix: one point, the base scenario itself. */
    kv_sweep *sw = load(dir, "base: base.yaml\n", &err, &rc);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    cr_expect_eq(kv_sweep_point_count(sw), 1);
    kv_sweep_destroy(sw);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- The command: workers, crashes, resume, CSV -------------------------------------------------- */

static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += *p == '\n';
    return n;
}

/* Marks a results.json with trailing whitespace (still valid JSON) to see later whether it was rewritten. */
static void mark(const char *path)
{
    FILE *f = fopen(path, "ab");
    cr_assert_not_null(f);
    fputs("   \n", f);
    fclose(f);
}

static int marked(const char *path)
{
    char *text = kvt_read(path, NULL);
    int yes = text && strlen(text) >= 5 && strcmp(text + strlen(text) - 5, "\n   \n") == 0;
    free(text);
    return yes;
}

/* Three points; the middle one loads (so validation lets it through) but fails when it runs: the
   model's weights do not fit in 1% of the decode GPU's memory. (A value the scenario rejects stops
   the whole sweep before anything runs: test_safety_sweep.) */
static const char *crash_sweep = "name: crashy\n"
                                 "base: base.yaml\n"
                                 "matrix:\n"
                                 "  cluster.decode.memory_fraction: [0.9, 0.01, 0.8]\n";

Test(sweep_run, crashed_point_reported_others_finish_and_resume_skips)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *sweep = kvt_write(dir, "sweep.yaml", crash_sweep);
    char *out_dir = kvt_path(dir, "out");
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "sweep %s -j 2 --out %s", sweep, out_dir);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 1, "a failed point makes the sweep exit 1; output:\n%s", out);
    cr_expect(strstr(out, "p01-memory_fraction=0.01 FAILED: exit status 2") != NULL, "got:\n%s", out);
    cr_expect(strstr(out, "cluster.decode") && strstr(out, "    | "), "the tail of stderr is shown:\n%s", out);
    cr_expect(strstr(out, "2 ran, 0 skipped, 1 failed") != NULL, "got:\n%s", out);
    free(out);

    char *ok0 = kvt_path(out_dir, "p00-memory_fraction=0.9/results.json");
    char *ok2 = kvt_path(out_dir, "p02-memory_fraction=0.8/results.json");
    char *bad = kvt_path(out_dir, "p01-memory_fraction=0.01/results.json");
    char *bad_err = kvt_path(out_dir, "p01-memory_fraction=0.01/stderr.txt");
    cr_assert(access(ok0, F_OK) == 0 && access(ok2, F_OK) == 0, "the other points finished");
    cr_expect(access(bad, F_OK) != 0);
    char *err_text = kvt_read(bad_err, NULL);
    cr_assert_not_null(err_text, "the failed point keeps its stderr");
    cr_expect(strstr(err_text, "cluster.decode") && strstr(err_text, "exit status 2"), "%s", err_text);
    free(err_text);
    char *ok_err = kvt_path(out_dir, "p00-memory_fraction=0.9/stderr.txt");
    cr_expect(access(ok_err, F_OK) != 0, "an empty stderr.txt of a good point is removed");

    /* sweep.csv: header + 2 points x 2 policies + 1 row for the failed point. */
    char *csv_path = kvt_path(out_dir, "sweep.csv");
    char *csv = kvt_read(csv_path, NULL);
    cr_assert_not_null(csv);
    cr_expect_eq(count_lines(csv), 1 + 2 * 2 + 1, "got:\n%s", csv);
    cr_expect(strncmp(csv, "point,dir,status,cluster.decode.memory_fraction,policy,", 55) == 0, "header: %.200s", csv);
    cr_expect(strstr(csv, "\n0,p00-memory_fraction=0.9,ok,0.9,bf16,") != NULL, "%s", csv);
    cr_expect(strstr(csv, "\n0,p00-memory_fraction=0.9,ok,0.9,lynx,") != NULL, "%s", csv);
    cr_expect(strstr(csv, "\n1,p01-memory_fraction=0.01,failed,0.01,") != NULL, "%s", csv);
    cr_expect(strstr(csv, "\n2,p02-memory_fraction=0.8,ok,0.8,lynx,") != NULL, "%s", csv);
    cr_expect(strstr(csv, ",mean_ttft_ms,") != NULL, "metrics are columns");

    /* Resume: the finished points are not run again (their results.json is the same file). */
    mark(ok0);
    mark(ok2);
    rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 1, "the bad point fails again:\n%s", out);
    cr_expect(strstr(out, "3 points, 2 finished before (skipped)") != NULL, "got:\n%s", out);
    cr_expect(strstr(out, "0 ran, 2 skipped, 1 failed") != NULL, "got:\n%s", out);
    cr_expect(marked(ok0), "point 0 was rerun");
    cr_expect(marked(ok2), "point 2 was rerun");
    free(out);

    /* --collect rebuilds the same sweep.csv from the folders. */
    unlink(csv_path);
    snprintf(args, sizeof args, "sweep --collect %s", out_dir);
    rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 1, "collect reports the failed point:\n%s", out);
    cr_expect(strstr(out, "3 points: 2 with results, 1 failed, 0 missing") != NULL, "got:\n%s", out);
    free(out);
    char *again = kvt_read(csv_path, NULL);
    cr_assert_not_null(again);
    cr_expect_str_eq(again, csv, "collect gives the same CSV");
    free(again);

    /* A changed command (another --set) makes the old results stale: those points run again. */
    snprintf(args, sizeof args, "sweep %s -j 2 --out %s --set seed=9", sweep, out_dir);
    rc = kvt_kvsim(args, &out);
    cr_expect(strstr(out, "0 finished before") && strstr(out, "2 ran, 0 skipped, 1 failed"), "got:\n%s", out);
    cr_expect(!marked(ok0) && access(ok0, F_OK) == 0, "a stale point is rerun");
    free(out);

    free(csv);
    free(csv_path);
    free(ok0);
    free(ok2);
    free(ok_err);
    free(bad);
    free(bad_err);
    free(out_dir);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

/* The emitted GNU parallel list and Slurm array run the same commands: run them by hand, collect, compare. */
Test(sweep_run, emitted_jobs_match_the_local_run)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *sweep = kvt_write(dir, "sweep.yaml", "base: base.yaml\nmode: zip\n"
                                               "matrix: {network.nic_bandwidth_gbps: [10, 50], seed: [4, 5]}\n");
    char *local = kvt_path(dir, "local"), *par = kvt_path(dir, "par"), *slurm = kvt_path(dir, "slurm");
    char args[4096], *out = NULL;

    snprintf(args, sizeof args, "sweep %s -j 2 --out %s", sweep, local);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);

    snprintf(args, sizeof args, "sweep %s --emit parallel --out %s", sweep, par);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    cr_expect(strstr(out, "jobs.txt (2 commands)") != NULL, "%s", out);
    free(out);
    char *jobs_path = kvt_path(par, "jobs.txt");
    char *jobs = kvt_read(jobs_path, NULL);
    cr_assert_not_null(jobs);
    cr_expect_eq(count_lines(jobs), 2);
    char *cmd_path = kvt_path(par, "p00-nic_bandwidth_gbps=10-seed=4/command.txt");
    char *cmd = kvt_read(cmd_path, NULL);
    cr_assert_not_null(cmd);
    cmd[strcspn(cmd, "\n")] = '\0';
    cr_expect(strstr(jobs, cmd) != NULL, "the job line holds the point's plain kvsim run command:\n%s\n%s", jobs,
              cmd);
    snprintf(args, sizeof args, "sh -e %s", jobs_path); /* what `parallel < jobs.txt` would run, one by one */
    cr_assert_eq(system(args), 0);

    snprintf(args, sizeof args, "sweep %s --emit slurm --out %s", sweep, slurm);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    char *script = kvt_path(slurm, "sweep.slurm");
    char *text = kvt_read(script, NULL);
    cr_assert_not_null(text);
    cr_expect(strstr(text, "#SBATCH --array=0-1") != NULL, "%s", text);
    snprintf(args, sizeof args, "bash -n %s && SLURM_ARRAY_TASK_ID=0 bash %s && SLURM_ARRAY_TASK_ID=1 bash %s",
             script, script, script);
    cr_assert_eq(system(args), 0, "running the array tasks by hand");
    snprintf(args, sizeof args, "SLURM_ARRAY_TASK_ID=7 bash %s 2>/dev/null", script);
    cr_expect_neq(system(args), 0, "a task id with no point fails");
    free(text);

    const char *dirs[] = {par, slurm};
    char *local_csv_path = kvt_path(local, "sweep.csv");
    char *local_csv = kvt_read(local_csv_path, NULL);
    cr_assert_not_null(local_csv);
    for (size_t i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "sweep --collect %s", dirs[i]);
        cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
        cr_expect(strstr(out, "2 points: 2 with results, 0 failed, 0 missing") != NULL, "%s", out);
        free(out);
        char *csv_path = kvt_path(dirs[i], "sweep.csv");
        char *csv = kvt_read(csv_path, NULL);
        cr_assert_not_null(csv);
        cr_expect_str_eq(csv, local_csv, "%s/sweep.csv differs from the local run's", dirs[i]);
        cr_expect_eq(count_lines(csv), 1 + 2 * 2, "one row per point and policy");
        free(csv);
        free(csv_path);
    }

    /* --dry-run prints the same commands. */
    snprintf(args, sizeof args, "sweep %s --dry-run --out %s", sweep, par);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    cr_expect(strstr(out, cmd) != NULL, "%s", out);
    free(out);

    free(local_csv);
    free(local_csv_path);
    free(script);
    free(cmd);
    free(cmd_path);
    free(jobs);
    free(jobs_path);
    free(local);
    free(par);
    free(slurm);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_run, bad_command_lines)
{
    char *out = NULL;
    cr_expect_eq(kvt_kvsim("sweep", &out), 2);
    free(out);
    cr_expect_eq(kvt_kvsim("sweep nowhere.yaml", &out), 2);
    cr_expect(strstr(out, "nowhere.yaml") != NULL, "%s", out);
    free(out);
    cr_expect_eq(kvt_kvsim("sweep x.yaml -j 0", &out), 2);
    cr_expect(strstr(out, "-j") != NULL, "%s", out);
    free(out);
    cr_expect_eq(kvt_kvsim("sweep x.yaml --emit pbs", &out), 2);
    free(out);
    cr_expect_eq(kvt_kvsim("sweep --help", &out), 0);
    cr_expect(strstr(out, "--collect DIR") && strstr(out, "--emit slurm"), "%s", out);
    free(out);
}

/* ---- --plot and the shipped sweep files and tutorial scenarios ---------------------------------- */

static int have_matplotlib(void)
{
    return system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0 ||
           system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
}

static int is_png(const char *path)
{
    size_t len = 0;
    char *data = kvt_read(path, &len);
    int yes = data && len > 1000 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
    free(data);
    return yes;
}

Test(sweep_plot, run_and_sweep_figures)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *sweep = kvt_write(dir, "sweep.yaml", "base: base.yaml\n"
                                               "set: {outputs.trace: true}\n"
                                               "matrix: {network.nic_bandwidth_gbps: [10, 100]}\n");
    char *out_dir = kvt_path(dir, "out");
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "sweep %s -j 2 --out %s --plot", sweep, out_dir);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    int plotting = have_matplotlib();
    if (!plotting) {
        cr_expect(strstr(out, "plots skipped:") != NULL, "a missing matplotlib is said visibly:\n%s", out);
        fprintf(stderr, "skipped: figure checks (no Python 3 with matplotlib here)\n");
    } else {
        char *fig = kvt_path(out_dir, "figures/ttft_vs_nic_bandwidth_gbps.png");
        cr_expect(is_png(fig), "no sweep figure:\n%s", out);
        free(fig);
        fig = kvt_path(out_dir, "figures/ttft_vs_nic_bandwidth_gbps.svg");
        cr_expect(access(fig, F_OK) == 0);
        free(fig);
        cr_expect(strstr(out, "skipped pareto: no accuracy metric") != NULL, "a figure without its data says why:\n%s",
                  out);
    }
    free(out);

    /* A run folder: kvsim run --plot on one point's scenario, beside an accuracy.json as kvsim eval writes it
       (made-up numbers: this checks the plotting, not the model). */
    char *run_dir = kvt_path(dir, "run");
    mkdir(run_dir, 0755);
    free(kvt_write(run_dir, "accuracy.json",
                   "{\"model\": {\"name\": \"test\"}, \"rows\": [\n"
                   "{\"policy\": \"bf16\", \"anchor_view\": false, \"kv_ratio\": 1, \"delta_ppl\": 0, "
                   "\"top1_agreement\": 1, \"spec_accept_rate\": [], \"layers\": []},\n"
                   "{\"policy\": \"lynx\", \"anchor_view\": false, \"kv_ratio\": 1.8, \"delta_ppl\": 0.01, "
                   "\"top1_agreement\": 0.99, \"spec_accept_rate\": [0.9], \"layers\": []},\n"
                   "{\"policy\": \"lynx\", \"anchor_view\": true, \"kv_ratio\": 3.2, \"delta_ppl\": 0.5, "
                   "\"top1_agreement\": 0.9, \"spec_accept_rate\": [0.9], \"layers\": []}]}\n"));
    snprintf(args, sizeof args, "run %s/base.yaml --set outputs.trace=true --out %s --quiet --plot", dir, run_dir);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    if (plotting) {
        const char *figs[] = {"ttft_cdf", "ttft_vs_context", "gantt", "memory", "pareto"};
        for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++) {
            char rel[128];
            snprintf(rel, sizeof rel, "figures/%s.png", figs[i]);
            char *fig = kvt_path(run_dir, rel);
            cr_expect(is_png(fig), "no %s:\n%s", rel, out);
            free(fig);
        }
    }
    free(out);
    free(run_dir);
    free(out_dir);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

/* Every shipped sweep expands and every tutorial scenario runs (with few requests, to stay fast). */
Test(sweep_files, shipped_sweeps_and_tutorial_run)
{
    const char *sweeps[] = {"scenarios/sweeps/lynx-bandwidth.yaml", "scenarios/sweeps/tutorial-02-bandwidth.yaml"};
    char args[2048], *out = NULL;
    for (size_t i = 0; i < sizeof sweeps / sizeof sweeps[0]; i++) {
        snprintf(args, sizeof args, "sweep %s --dry-run", sweeps[i]);
        cr_expect_eq(kvt_kvsim(args, &out), 0, "%s: %s", sweeps[i], out);
        cr_expect_eq(count_lines(out), 8, "%s: 8 points:\n%s", sweeps[i], out);
        free(out);
    }
    const char *tutorial[] = {"01-where-ttft-goes", "02-compression", "03-lynx-speculation", "04-decode-memory"};
    char *dir = kvt_tempdir();
    for (size_t i = 0; i < sizeof tutorial / sizeof tutorial[0]; i++) {
        snprintf(args, sizeof args, "run scenarios/tutorial/%s.yaml --set workload.requests=6 --out %s/%zu --quiet",
                 tutorial[i], dir, i);
        cr_expect_eq(kvt_kvsim(args, &out), 0, "%s: %s", tutorial[i], out);
        free(out);
    }
    /* Each tutorial file says which question it answers and which figure to look at. */
    for (size_t i = 0; i < sizeof tutorial / sizeof tutorial[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "scenarios/tutorial/%s.yaml", tutorial[i]);
        char *path = kvt_source(rel);
        char *text = kvt_read(path, NULL);
        cr_assert_not_null(text, "%s", rel);
        cr_expect(strstr(text, "?") && strstr(text, "figures/") && strstr(text, "Run:"), "%s lacks its question, "
                  "command or figure", rel);
        free(text);
        free(path);
    }
    kvt_rmtree(dir);
    free(dir);
}
