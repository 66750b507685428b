/* test_simgrid_inchild_cli.c — `kvsim run` with each policy's run inside the SimGrid child (network.in_child,
 * the default) against the same run over the socket (in_child: false): the same results.json, requests.csv
 * and trace.json on a contended star with classes and a Lua policy that reads the live network; a policy's
 * error raised inside the child reaches the user as over the socket (exit 2, file:line), no output left. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/support.h"

/* 4 prefill + 2 decode nodes on a 10 Gb/s star: transfers share the decode NICs. */
static char *scenario(const char *dir, const char *policies, const char *extra)
{
    char text[4096];
    snprintf(text, sizeof text,
             "name: inchild\nseed: 3\nmodel: llama-3.1-8b\ncluster:\n  prefill: {nodes: 4}\n  decode: {nodes: 2}\n"
             "network:\n  model: simgrid\n  nic_bandwidth_gbps: 10\n  nic_latency_us: 5\n"
             "workload:\n  requests: 40\n  rate_per_s: 40\n  prompt: {dist: fixed, value: 4096}\n"
             "  output: {dist: fixed, value: 32}\noutputs: {trace: true}\npolicies: [%s]\n%s",
             policies, extra);
    return kvt_write(dir, "s.yaml", text);
}

/* Runs the scenario into dir/name with network.in_child set as given; returns the exit code. */
static int run(const char *path, const char *dir, const char *name, const char *in_child, char **out)
{
    char args[2048];
    snprintf(args, sizeof args, "run %s --quiet --set network.in_child=%s --out %s/%s", path, in_child, dir, name);
    int rc = kvt_kvsim(args, out);
    if (*out && strstr(*out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    return rc;
}

/* The file without its "overrides" line (the --set values differ by in_child); free it. */
static char *without_overrides(const char *path)
{
    char *text = kvt_read(path, NULL);
    cr_assert(text, "%s is missing", path);
    char *at = strstr(text, "\"overrides\"");
    if (at) {
        char *end = strchr(at, '\n');
        memmove(at, end ? end + 1 : at + strlen(at), strlen(end ? end + 1 : at + strlen(at)) + 1);
    }
    return text;
}

static void expect_same_outputs(const char *policies, const char *extra)
{
    char *dir = kvt_tempdir();
    char *path = scenario(dir, policies, extra);
    char *out_a = NULL, *out_b = NULL;
    cr_assert_eq(run(path, dir, "child", "true", &out_a), 0, "in the child: %s", out_a);
    cr_assert_eq(run(path, dir, "socket", "false", &out_b), 0, "over the socket: %s", out_b);
    const char *files[] = {"results.json", "requests.csv", "trace.json"};
    for (int i = 0; i < 3; i++) {
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/child/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/socket/%s", dir, files[i]);
        char *ta = without_overrides(a), *tb = without_overrides(b);
        cr_assert_gt(strlen(ta), 100, "%s is nearly empty", a);
        cr_expect_str_eq(ta, tb, "%s differs between the modes", files[i]);
        free(ta);
        free(tb);
    }
    free(out_a);
    free(out_b);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(simgrid_inchild_cli, same_outputs_with_classes_and_several_policies, .timeout = 120)
{
    /* lynx splits anchor and residual into strict classes; int8 sends one plane. */
    expect_same_outputs("int8, lynx", "lynx: {from: scenario, acceptance: 0.8}\n");
}

Test(simgrid_inchild_cli, same_outputs_with_a_policy_that_reads_the_network, .timeout = 120)
{
    char *file = kvt_source("tests/fixtures/policies/live_bits.lua");
    char extra[1024];
    snprintf(extra, sizeof extra, "policy:\n  live: {file: %s}\n", file);
    expect_same_outputs("live, bf16", extra);
    free(file);
}

Test(simgrid_inchild_cli, a_policy_error_inside_the_child_is_exit_2_with_its_line, .timeout = 120)
{
    char *dir = kvt_tempdir();
    /* Fails only in the run (ctx.now > 0), never in the checks kvsim makes before it. */
    char *lua = kvt_write(dir, "late.lua",
                          "-- late.lua: fails once simulated time has started\n"
                          "return {\n"
                          "  encode = function(ctx)\n"
                          "    if ctx.now > 0 then local t = nil; return t.bits end\n"
                          "    return { key = { bits = 8 }, value = { bits = 8 } }\n"
                          "  end,\n"
                          "}\n");
    char extra[1024];
    snprintf(extra, sizeof extra, "policy:\n  late: {file: %s}\n", lua);
    char *path = scenario(dir, "late", extra);
    char *out_a = NULL, *out_b = NULL;
    int rc_a = run(path, dir, "child", "true", &out_a);
    int rc_b = run(path, dir, "socket", "false", &out_b);
    cr_expect_eq(rc_a, 2, "in the child: exit %d: %s", rc_a, out_a);
    cr_expect_eq(rc_b, 2, "over the socket: exit %d: %s", rc_b, out_b);
    cr_expect(strstr(out_a, "late.lua:4: attempt to index a nil value"), "got: %s", out_a);
    cr_expect_str_eq(out_a, out_b);
    char child_dir[1024];
    snprintf(child_dir, sizeof child_dir, "%s/child", dir);
    struct stat st;
    cr_expect(stat(child_dir, &st) != 0, "a failed run left %s", child_dir);
    free(out_a);
    free(out_b);
    free(path);
    free(lua);
    kvt_rmtree(dir);
    free(dir);
}
