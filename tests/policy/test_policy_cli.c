/* test_policy_cli.c — policies through `kvsim run`: shipped ones side by side, overrides, exit code 2 when bad. */
#define _GNU_SOURCE /* asprintf */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

/* A small, fast scenario (ideal network) comparing `policies`, with `extra` appended. */
static char *write_scenario(const char *dir, const char *policies, const char *extra)
{
    char text[4096];
    snprintf(text, sizeof text,
             "name: t\n"
             "model: llama-3-8b\n"
             "seed: 1\n"
             "network: {model: ideal}\n"
             "workload: {requests: 6, arrival: poisson, rate_per_s: 4, prompt: {dist: fixed, value: 2048}, "
             "output: {dist: fixed, value: 16}}\n"
             "policies: [%s]\n%s"
             "diffkv: {scores: lognormal}\n" /* DiffKV without the reference model (last: line numbers) */
             "lynx: {from: scenario}\n",     /* these tests are about bytes; tests/accuracy/test_lynx_feed.c measures */
             policies, extra ? extra : "");
    return kvt_write(dir, "s.yaml", text);
}

/* The mean anchor bytes per request of policy `name` in results.json. */
static double anchor_bytes(const char *json, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "{\"name\":\"%s\",", name);
    const char *p = strstr(json, key);
    cr_assert_not_null(p, "no policy '%s' in results.json", name);
    p = strstr(p, "\"anchor_bytes\":");
    cr_assert_not_null(p);
    return strtod(p + strlen("\"anchor_bytes\":"), NULL);
}

static int run(const char *scenario, const char *dir, const char *more, char **out)
{
    char args[4096];
    snprintf(args, sizeof args, "run %s --out %s/out %s", scenario, dir, more ? more : "");
    return kvt_kvsim(args, out);
}

Test(cli, shipped_policies_side_by_side_one_row_each)
{
    char *dir = kvt_tempdir();
    char *lynx = kvt_source("policies/lynx.lua");
    char extra[1024];
    snprintf(extra, sizeof extra, "policy:\n  lynx_a3: {file: %s, anchor_bits: 3}\n", lynx);
    char *s = write_scenario(dir, "bf16, int8, int4, kivi2, lynx, diffkv, lynx_a3", extra);
    char *out = NULL;
    int rc = run(s, dir, NULL, &out);
    cr_assert_eq(rc, 0, "%s", out);
    const char *names[] = {"bf16", "int8", "int4", "kivi2", "lynx", "diffkv", "lynx_a3"};
    for (int i = 0; i < 7; i++) {
        char row[32];
        snprintf(row, sizeof row, "\n%s ", names[i]);
        cr_expect(strstr(out, row), "no table row for %s in:\n%s", names[i], out);
    }
    /* The override reached the policy: a 3-bit anchor plus 1 bit/value of metadata
       (G = 32) against 4 + 1 bits for the default split. */
    char *json_path = NULL;
    cr_assert(asprintf(&json_path, "%s/out/results.json", dir) > 0);
    char *json = kvt_read(json_path, NULL);
    cr_assert_not_null(json);
    double a4 = anchor_bytes(json, "lynx"), a3 = anchor_bytes(json, "lynx_a3");
    cr_expect_gt(a4, 0);
    cr_expect_eq(a3 * 5, a4 * 4, "anchor bytes %.0f (a = 3) vs %.0f (a = 4)", a3, a4);
    free(json);
    free(json_path);
    free(out);
    free(s);
    free(lynx);
    kvt_rmtree(dir);
    free(dir);
}

Test(cli, set_reaches_the_policy)
{
    char *dir = kvt_tempdir();
    char *s = write_scenario(dir, "lynx", NULL);
    char *out = NULL;
    cr_assert_eq(run(s, dir, "--set policy.lynx.anchor_bits=2", &out), 0, "%s", out);
    char *json_path = NULL;
    cr_assert(asprintf(&json_path, "%s/out/results.json", dir) > 0);
    char *json = kvt_read(json_path, NULL);
    cr_assert_not_null(json);
    /* Llama-3-8B, 2048 tokens: 32 x 8 x 128 x 2048 x 2 values at 2 + 1 bits. */
    double expect = 32.0 * 8 * 128 * 2048 * 2 * 3 / 8;
    cr_expect_eq(anchor_bytes(json, "lynx"), expect, "anchor bytes %.0f, expected %.0f", anchor_bytes(json, "lynx"),
                 expect);
    free(json);
    free(json_path);
    free(out);
    free(s);
    kvt_rmtree(dir);
    free(dir);
}

Test(cli, bad_set_is_exit_2_with_a_hint)
{
    char *dir = kvt_tempdir();
    char *s = write_scenario(dir, "lynx", NULL);
    char *out = NULL;
    cr_expect_eq(run(s, dir, "--set policy.lynx.anchr_bits=3", &out), 2, "%s", out);
    cr_expect(strstr(out, "did you mean 'anchor_bits'?"), "got: %s", out);
    free(out);
    cr_expect_eq(run(s, dir, "--set policy.lynx.anchor_bits=three", &out), 2, "%s", out);
    cr_expect(strstr(out, "expected an integer"), "got: %s", out);
    free(out);
    free(s);
    kvt_rmtree(dir);
    free(dir);
}

Test(cli, hooks_see_the_model_from_the_first_request)
{
    char *dir = kvt_tempdir();
    char *path = kvt_source("tests/fixtures/policies/model_in_placement.lua");
    char extra[1024];
    snprintf(extra, sizeof extra, "policy:\n  placed: {file: %s}\n", path);
    char *s = write_scenario(dir, "placed", extra);
    char *out = NULL;
    cr_expect_eq(run(s, dir, NULL, &out), 0, "%s", out);
    free(out);
    free(s);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(cli, scenario_param_error_names_file_line_col)
{
    char *dir = kvt_tempdir();
    char *s = write_scenario(dir, "lynx", "policy:\n  lynx:\n    bits: 8\n    anchr_bits: 3\n");
    char *out = NULL;
    cr_expect_eq(run(s, dir, NULL, &out), 2, "%s", out);
    char want[512];
    snprintf(want, sizeof want, "%s:10:5: policy.lynx.anchr_bits: policy 'lynx'", s);
    cr_expect(strstr(out, want), "expected \"%s\" in:\n%s", want, out);
    cr_expect(strstr(out, "did you mean 'anchor_bits'?"), "got: %s", out);
    free(out);
    free(s);
    kvt_rmtree(dir);
    free(dir);
}

/* Runs a scenario comparing bf16 with the fixture `file` as policy 'bad'; expects exit 2 and `want`. */
static void expect_exit_2(const char *file, const char *want1, const char *want2)
{
    char *dir = kvt_tempdir();
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/policies/%s", file);
    char *path = kvt_source(rel);
    char extra[1024];
    snprintf(extra, sizeof extra, "policy:\n  bad: {file: %s}\n", path);
    char *s = write_scenario(dir, "bf16, bad", extra);
    char *out = NULL;
    int rc = run(s, dir, NULL, &out);
    cr_expect_eq(rc, 2, "%s: exit %d:\n%s", file, rc, out);
    cr_expect(strstr(out, want1), "%s: expected \"%s\" in:\n%s", file, want1, out);
    if (want2)
        cr_expect(strstr(out, want2), "%s: expected \"%s\" in:\n%s", file, want2, out);
    free(out);
    free(s);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(cli, syntax_error)
{
    expect_exit_2("syntax_error.lua", "syntax_error.lua:5: 'then' expected", NULL);
}

Test(cli, runtime_error)
{
    expect_exit_2("runtime_error.lua", "runtime_error.lua:6: attempt to index a nil value", "in hook 'encode'");
}

Test(cli, infinite_loop, .timeout = 60)
{
    expect_exit_2("infinite_loop.lua", "used up its instruction budget", "infinite_loop.lua:");
}

Test(cli, memory_bomb, .timeout = 60)
{
    expect_exit_2("memory_bomb.lua", "tried to make a string of 2 MiB, over its limit of 1 MiB per string",
                  "memory_bomb.lua:6");
}

Test(cli, string_rep_bomb, .timeout = 60)
{
    expect_exit_2("rep_bomb.lua", "exceeded its memory cap", "rep_bomb.lua:4");
}

Test(cli, io_os_require)
{
    expect_exit_2("io_access.lua", "attempt to index a nil value (global 'io')", NULL);
    expect_exit_2("os_access.lua", "attempt to index a nil value (global 'os')", NULL);
    expect_exit_2("require_access.lua", "attempt to call a nil value (global 'require')", NULL);
}

Test(cli, binary_chunk)
{
    expect_exit_2("binary_load.lua", "attempt to load a binary chunk", NULL);
}

Test(cli, bad_answers)
{
    expect_exit_2("bad_return_type.lua", "returned 42; expected", NULL);
    expect_exit_2("bits_out_of_range.lua", "key.bits = 17; expected an integer from 1 to 16", NULL);
    expect_exit_2("unknown_field.lua", "did you mean 'encode'?", NULL);
}
