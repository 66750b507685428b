/* test_bench_sim.c — `kvsim bench sim`: rates per wall- and CPU-second, and --write timing real outputs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

Test(bench_sim, write_times_complete_outputs, .timeout = 300)
{
    char *dir = kvt_tempdir();
    char args[1024];
    snprintf(args, sizeof args, "bench sim --requests 300 --write %s/out", dir);
    char *out = NULL;
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "per CPU-second"), "%s", out);
    cr_expect(strstr(out, "outputs written"), "%s", out);
    char path[1024];
    snprintf(path, sizeof path, "%s/out/requests.csv", dir);
    char *csv = kvt_read(path, NULL);
    cr_assert(csv, "no requests.csv");
    size_t lines = 0;
    for (const char *p = csv; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 301, "header + 300 rows, got %zu lines", lines);
    snprintf(path, sizeof path, "%s/out/results.json", dir);
    char *json = kvt_read(path, NULL);
    cr_expect(json && strstr(json, "\"completed\":300"), "results.json");
    free(json);
    free(csv);
    free(out);
    kvt_rmtree(dir);
    free(dir);
}

Test(bench_sim, bad_options_exit_2)
{
    char *out = NULL;
    cr_expect_eq(kvt_kvsim("bench sim --write", &out), 2, "%s", out);
    cr_expect(strstr(out, "--write DIR"), "%s", out);
    free(out);
    cr_expect_eq(kvt_kvsim("bench sim --requests 0", &out), 2, "%s", out);
    free(out);
}

/* --scenario times any scenario (here quickstart, 2 + 2 nodes, its own requests unless --requests),
   --repeats N alternates the networks and says so; #22's target line is printed beside the ratios. */
Test(bench_sim, scenario_and_repeats, .timeout = 300)
{
    char *out = NULL;
    int rc = kvt_kvsim("bench sim --scenario scenarios/quickstart.yaml --requests 40 --repeats 2 --network simgrid",
                       &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "kvsim bench sim: scenarios/quickstart.yaml, 40 requests, 2 prefill + 2 decode nodes"),
              "%s", out);
    cr_expect(strstr(out, "best of 2 runs of each network, alternated,"), "%s", out);
    cr_expect(strstr(out, "vs the ideal network"), "%s", out);
    cr_expect(strstr(out, "target (#22)         >= 0.25x the ideal network per wall- and per CPU-second: "), "%s",
              out);
    free(out);
    /* without --network, the scenario's own (quickstart's is simgrid), compared with the ideal one */
    rc = kvt_kvsim("bench sim --scenario scenarios/quickstart.yaml --requests 20", &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "20 requests, 2 prefill + 2 decode nodes, simgrid network (the run in its child)"), "%s", out);
    cr_expect(strstr(out, "vs the ideal network"), "%s", out);
    free(out);
}

Test(bench_sim, bad_scenario_and_repeats_exit_2)
{
    char *out = NULL;
    cr_expect_eq(kvt_kvsim("bench sim --scenario no/such/file.yaml", &out), 2, "%s", out);
    cr_expect(strstr(out, "no/such/file.yaml"), "%s", out);
    free(out);
    cr_expect_eq(kvt_kvsim("bench sim --repeats 0", &out), 2, "%s", out);
    cr_expect(strstr(out, "--repeats"), "%s", out);
    free(out);
}
