/* test_sweep_capacity.c — a sweep whose points are capacity searches (output: capacity): sweep.csv's
 * capacity and goodput columns equal what `kvsim capacity` finds for the same --set; its input mistakes;
 * and a sweep's relative path values resolving against the sweep's working folder, in emitted jobs too. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/base/jsonread.h"
#include "tests/support.h"

#define SMALL "tests/fixtures/scenarios/capacity-small.yaml"

/* Runs `cd DIR && CMD` through the shell (CMD may name kvsim as $KV); output in *out (free it). */
static int sh_in(const char *dir, const char *cmd, char **out)
{
    const char *bin = getenv("KVSIM");
    char *full = NULL;
    cr_assert(asprintf(&full, "cd '%s' && KV='%s' && %s", dir, bin ? bin : KV_BINARY_DIR "/kvsim", cmd) > 0);
    int rc = kvt_sh(full, out);
    cr_assert(*out, "%s", full);
    free(full);
    return rc;
}

/* The value of column `col` in the sweep.csv row whose dir and policy match (no quoted fields here). */
static double csv_value(const char *csv, const char *dir, const char *policy, const char *col)
{
    const char *nl = strchr(csv, '\n');
    cr_assert(nl);
    char *header = strndup(csv, (size_t)(nl - csv));
    int want = -1, idx = 0, dir_at = -1, pol_at = -1;
    for (char *save = NULL, *f = strtok_r(header, ",", &save); f; f = strtok_r(NULL, ",", &save), idx++) {
        if (strcmp(f, col) == 0)
            want = idx;
        if (strcmp(f, "dir") == 0)
            dir_at = idx;
        if (strcmp(f, "policy") == 0)
            pol_at = idx;
    }
    free(header);
    cr_assert(want >= 0 && dir_at >= 0 && pol_at >= 0, "sweep.csv has no column %s:\n%s", col, csv);
    for (const char *line = nl + 1; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        const char *end = strchr(line, '\n');
        char *row = strndup(line, end ? (size_t)(end - line) : strlen(line));
        char *fields[64] = {0};
        int nf = 0;
        for (char *p = row; nf < 64;) {
            fields[nf++] = p;
            char *c = strchr(p, ',');
            if (!c)
                break;
            *c = '\0';
            p = c + 1;
        }
        if (nf > want && nf > dir_at && nf > pol_at && strcmp(fields[dir_at], dir) == 0 &&
            strcmp(fields[pol_at], policy) == 0) {
            double v = fields[want][0] ? strtod(fields[want], NULL) : NAN;
            free(row);
            return v;
        }
        free(row);
    }
    cr_assert_fail("no row %s/%s in sweep.csv:\n%s", dir, policy, csv);
    return NAN;
}

static double json_number(const kv_jvalue *o, const char *key)
{
    const kv_jvalue *v = kv_jvalue_get(o, key);
    return v && v->kind == KV_JNUMBER ? strtod(v->text, NULL) : NAN;
}

Test(sweep_capacity, columns_equal_kvsim_capacity_per_point_and_plot_draws_them, .timeout = 240)
{
    char *dir = kvt_tempdir();
    char *base = kvt_source(SMALL);
    char *text = NULL;
    cr_assert(asprintf(&text,
                       "base: %s\noutput: capacity\nslo: {ttft_p99_ms: 300, tpot_p99_ms: 30}\nattainment: 0.9\n"
                       "precision: 0.02\nmatrix:\n  network.nic_bandwidth_gbps: [10, 25]\nout: out\n",
                       base) > 0);
    kvt_write(dir, "cap.yaml", text);
    char *out = NULL;
    int rc = sh_in(dir, "\"$KV\" sweep cap.yaml -j 2 --plot", &out);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *csv_path = kvt_path(dir, "out/sweep.csv");
    char *csv = kvt_read(csv_path, NULL);
    cr_assert(strstr(csv, ",capacity_req_s,") && strstr(csv, ",goodput_req_s,"), "%s", csv);
    cr_expect(strstr(csv, ",policy.status,"), "the search's status is policy.status (status is the point's):\n%s", csv);
    const char *points[] = {"p00-nic_bandwidth_gbps=10", "p01-nic_bandwidth_gbps=25"};
    const char *gbps[] = {"10", "25"};
    int found = 0;
    for (int i = 0; i < 2; i++) {
        /* The same search run by hand with the point's --set. */
        char *args = NULL;
        cr_assert(asprintf(&args, "\"$KV\" capacity '%s' --slo ttft_p99_ms=300,tpot_p99_ms=30 --attainment 0.9 "
                           "--precision 0.02 --set network.nic_bandwidth_gbps=%s --out direct%d --quiet",
                           base, gbps[i], i) > 0);
        rc = sh_in(dir, args, &out);
        cr_assert_eq(rc, 0, "%s", out);
        free(out);
        free(args);
        char *name = NULL;
        cr_assert(asprintf(&name, "direct%d/capacity.json", i) > 0);
        char *jpath = kvt_path(dir, name);
        kv_jvalue *root = NULL;
        kv_error err = {0};
        cr_assert_eq(kv_jread_file(jpath, &root, &err), 0, "%s", err.msg);
        const kv_jvalue *pols = kv_jvalue_get(root, "policies");
        cr_assert(pols && pols->kind == KV_JARRAY && pols->count == 2);
        for (size_t p = 0; p < pols->count; p++) {
            const kv_jvalue *pn = kv_jvalue_get(pols->items[p], "name");
            double rate = json_number(pols->items[p], "goodput_rate");
            double att = json_number(pols->items[p], "attainment");
            double col = csv_value(csv, points[i], pn->text, "capacity_req_s");
            double good = csv_value(csv, points[i], pn->text, "goodput_req_s");
            if (isnan(rate)) {
                cr_expect(isnan(col), "%s %s: capacity %g where kvsim capacity found none", points[i], pn->text, col);
                continue;
            }
            found++;
            cr_expect_eq(col, rate, "%s %s: capacity_req_s %g, kvsim capacity %g", points[i], pn->text, col, rate);
            cr_expect(fabs(good - rate * att) <= 1e-9 * rate, "%s %s: goodput %g, rate x attainment %g", points[i],
                      pn->text, good, rate * att);
            cr_expect(att >= 0.9, "attainment at capacity %g below the target", att);
        }
        kv_jvalue_free(root);
        free(jpath);
        free(name);
    }
    cr_expect(found >= 3, "at least three (point, policy) pairs have a capacity (got %d)", found);
    /* The figure of capacity against the swept key (when matplotlib is here, as --plot needs). */
    rc = sh_in(dir, "python3 -c 'import matplotlib' >/dev/null 2>&1", &out);
    free(out);
    if (rc == 0) {
        char *fig = kvt_path(dir, "out/figures/capacity_vs_nic_bandwidth_gbps.png");
        FILE *f = fopen(fig, "rb");
        cr_expect(f, "no %s", fig);
        if (f)
            fclose(f);
        free(fig);
    }
    /* Resume: finished points (capacity.json) are skipped. */
    rc = sh_in(dir, "\"$KV\" sweep cap.yaml -j 2", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "2 finished before (skipped)"), "%s", out);
    free(out);
    free(csv);
    free(csv_path);
    free(text);
    free(base);
    kvt_rmtree(dir);
    free(dir);
}

/* A mistake in the capacity keys stops the sweep (exit 2) naming the sweep file's line and the key. */
static void expect_bad(const char *body, const char *needle)
{
    char *dir = kvt_tempdir();
    char *base = kvt_source(SMALL);
    char *text = NULL;
    cr_assert(asprintf(&text, "base: %s\n%s", base, body) > 0);
    kvt_write(dir, "bad.yaml", text);
    char *out = NULL;
    int rc = sh_in(dir, "\"$KV\" sweep bad.yaml --dry-run", &out);
    cr_expect_eq(rc, 2, "%s\n%s", body, out);
    cr_expect(strstr(out, needle), "expected '%s' in:\n%s", needle, out);
    cr_expect(strstr(out, "bad.yaml:"), "the message names the file:\n%s", out);
    free(out);
    free(text);
    free(base);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_capacity, bad_capacity_keys_exit_2_naming_line_and_key)
{
    expect_bad("output: capacity\n", "needs slo:");
    expect_bad("output: capacty\nslo: {ttft_ms: 300}\n", "output: expected run");
    expect_bad("output: capacity\nslo: {ttft_ms: -3}\n", "slo:");
    expect_bad("output: capacity\nslo: {nosuch_ms: 3}\n", "slo:");
    expect_bad("output: capacity\nslo: {ttft_ms: 300}\nattainment: 1.5\n", "attainment:");
    expect_bad("output: capacity\nslo: {ttft_ms: 300}\nprecision: 0\n", "precision:");
    expect_bad("slo: {ttft_ms: 300}\n", "only for output: capacity");
}

/* A relative path among a sweep's values (here policy.int4.file) is relative to the folder kvsim sweep
   runs in, as a --set path is: locally, and in the emitted jobs run from another folder. */
Test(sweep_paths, relative_value_paths_resolve_in_the_sweeps_working_folder, .timeout = 240)
{
    char *dir = kvt_tempdir();
    char *base = kvt_source(SMALL);
    char *lua_src = kvt_source("policies/int4.lua");
    char *lua = kvt_read(lua_src, NULL);
    kvt_write(dir, "mine.lua", lua);
    char *text = NULL;
    cr_assert(asprintf(&text, "base: %s\nset: {workload.requests: 6, policies: [int4]}\n"
                       "matrix:\n  policy.int4.file: [mine.lua, ./mine.lua]\nout: out\n", base) > 0);
    kvt_write(dir, "paths.yaml", text);
    char *out = NULL;
    int rc = sh_in(dir, "\"$KV\" sweep paths.yaml -j 1", &out);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    /* The emitted job list, run from the root folder: each job goes to the sweep's folder first. */
    rc = sh_in(dir, "\"$KV\" sweep paths.yaml --emit parallel --out out-jobs >/dev/null && cd / && sh \"$OLDPWD/out-jobs/jobs.txt\" "
               "&& cd \"$OLDPWD\" && \"$KV\" sweep --collect out-jobs",
               &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "2 with results, 0 failed"), "%s", out);
    free(out);
    char *csv_path = kvt_path(dir, "out-jobs/sweep.csv");
    char *csv = kvt_read(csv_path, NULL);
    cr_expect(csv && !strstr(csv, ",failed,"), "%s", csv ? csv : "(no sweep.csv)");
    free(csv);
    free(csv_path);
    free(text);
    free(lua);
    free(lua_src);
    free(base);
    kvt_rmtree(dir);
    free(dir);
}
