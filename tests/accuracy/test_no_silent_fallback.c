/* test_no_silent_fallback.c — a speculating request whose policy has no measured acceptance stops the run
 * (exit 2, saying why and what to run) instead of using the fixed lynx.acceptance unannounced (#20). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

/* A Lynx split whose speculate hook answers 0 before the run (ctx.now is 0 when acceptance is probed)
   and 4 while it runs: nothing is measured for it. */
static const char *const late_speculator =
    "return {\n"
    "  encode = function(ctx) return {key = {bits = 8, anchor_bits = 4, group_size = 32},\n"
    "                                 value = {bits = 8, anchor_bits = 4, group_size = 32}} end,\n"
    "  transfer = function(ctx) return {order = \"anchor_first\"} end,\n"
    "  speculate = function(ctx) if ctx.now > 0 then return 4 end return 0 end,\n"
    "}\n";

static char *scenario(const char *dir)
{
    char body[2048];
    snprintf(body, sizeof body,
             "name: fallback\nseed: 1\nmodel: llama-3.1-8b\n"
             "cluster:\n  prefill: {nodes: 1, device: h100-sxm}\n  decode: {nodes: 1, device: h100-sxm}\n"
             "network: {model: ideal, nic_bandwidth_gbps: 25}\n"
             "workload: {requests: 4, rate_per_s: 1, prompt: {dist: fixed, value: 4096}, "
             "output: {dist: fixed, value: 16}}\n"
             "policies: [late]\npolicy:\n  late: {file: %s/late.lua}\n",
             dir);
    return kvt_write(dir, "s.yaml", body);
}

Test(no_silent_fallback, speculating_without_measured_acceptance_exits_2)
{
    char *dir = kvt_tempdir();
    free(kvt_write(dir, "late.lua", late_speculator));
    char *sc = scenario(dir), args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out %s/out", sc, dir);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(out && strstr(out, "policy late speculates 4 tokens on request 0"), "%s", out);
    cr_expect(out && strstr(out, "--set lynx.from=scenario"), "the message says what to run: %s", out);
    free(out);
    char results[4200];
    snprintf(results, sizeof results, "%s/out/results.json", dir);
    FILE *f = fopen(results, "r");
    cr_expect_null(f, "no results from a refused run");
    if (f)
        fclose(f);
    /* Asked for explicitly, the fixed value is used, and results.json says so. */
    snprintf(args, sizeof args, "run %s --quiet --out %s/out --set lynx.from=scenario", sc, dir);
    rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    free(out);
    char *json = kvt_read(results, NULL);
    cr_expect(json && strstr(json, "\"acceptance_source\":\"scenario (lynx.acceptance)\""), "%s", json);
    free(json);
    free(sc);
    kvt_rmtree(dir);
    free(dir);
}
