/* test_kernels_timing.c — `kvsim bench kernels` runs, prints its table and
 * writes JSON that the calibration loader reads back; the measured-timing
 * API returns positive times and rejects bad input; the loader names the
 * file and position of a syntax error. No timed assertions. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/kernel_time.h"
#include "tests/kernels_util.h"
#include "tests/support.h"

Test(bench_kernels, quick_run_prints_table_and_json_that_calibrates)
{
    char *dir = kvt_tempdir(), *out = NULL, args[512], path[512];
    snprintf(path, sizeof path, "%s/k.json", dir);
    snprintf(args, sizeof args, "bench kernels --backend cpu --quick --repeats 2 --json %s", path);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "STREAM triad"), "%s", out);
    cr_assert(strstr(out, "encode") && strstr(out, "attention") && strstr(out, "compact"), "%s", out);
    cr_assert(strstr(out, "exact"), "%s", out);
    cr_assert(!strstr(out, "MISMATCH") && !strstr(out, "OFF BY"), "%s", out);
    cr_assert(strstr(out, "targets (cpu"), "%s", out);
    /* #22's targets, one row each: encodes at 0.5, KIVI-2 and verification at 0.35 */
    cr_assert(strstr(out, "encode     lynx b16/a4 g128 (q+split+pack)      >= 0.50:"), "%s", out);
    cr_assert(strstr(out, "attention  decode int4 g32                      >= 0.50:"), "%s", out);
    cr_assert(strstr(out, "attention  verify k=4 int8 g32                  >= 0.35:"), "%s", out);
    cr_assert(strstr(out, " of 11 targets met (#22 sets them at 32768 tokens"), "%s", out);
    kv_kernel_calib *c = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_kernel_calib_load(path, "cpu", &c, &err), KV_OK, "%s", err.msg);
    double e = kv_kernel_calib_efficiency(c, "encode", -1);
    cr_assert(e > 0 && e < 100, "encode efficiency %g", e);
    cr_assert(kv_kernel_calib_efficiency(c, "attention_decode", -1) > 0);
    cr_assert_eq(kv_kernel_calib_efficiency(c, "no_such_kernel", -7), -7);
    cr_assert(kv_kernel_calib_bandwidth_gbps(c) > 0);
    kv_kernel_calib_destroy(c);
    cr_assert_eq(kv_kernel_calib_load(path, "nosuch", &c, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "nosuch"), "%s", err.msg);
    free(out);
    kvt_rmtree(dir);
    free(dir);
}

Test(bench_kernels, bad_options_are_input_errors)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("bench kernels --backend nosuch", &out), 2);
    cr_assert(strstr(out, "not built"), "%s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("bench kernels --frobnicate", &out), 2);
    free(out);
    cr_assert_eq(kvt_kvsim("bench kernels --help", &out), 0);
    cr_assert(strstr(out, "--json"), "%s", out);
    free(out);
}

Test(calibration, largest_context_wins_and_errors_name_the_place)
{
    char *dir = kvt_tempdir();
    char *ok = kvt_write(dir, "ok.json",
                         "{\"backends\": [{\"backend\": \"cpu\", \"bandwidth_gbps\": 10, \"kernels\": [\n"
                         "  {\"calib\": \"encode\", \"context\": 4096, \"ratio\": 0.9},\n"
                         "  {\"calib\": \"encode\", \"context\": 32768, \"ratio\": 0.4},\n"
                         "  {\"calib\": \"encode\", \"context\": 32768, \"ratio\": 0.6},\n"
                         "  {\"calib\": \"decode\", \"context\": 1, \"ratio\": 0.5, \"extra\": [1, true, null]}\n"
                         "]}]}\n");
    kv_kernel_calib *c = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_kernel_calib_load(ok, NULL, &c, &err), KV_OK, "%s", err.msg);
    cr_assert_float_eq(kv_kernel_calib_efficiency(c, "encode", 0), 0.5, 1e-12);
    cr_assert_float_eq(kv_kernel_calib_efficiency(c, "decode", 0), 0.5, 1e-12);
    cr_assert_float_eq(kv_kernel_calib_bandwidth_gbps(c), 10, 1e-12);
    kv_kernel_calib_destroy(c);
    char *bad = kvt_write(dir, "bad.json", "{\"backends\": [\n  {\"backend\" \"cpu\"}\n]}\n");
    cr_assert_eq(kv_kernel_calib_load(bad, NULL, &c, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "bad.json:2:14: expected ':'"), "%s", err.msg);
    cr_assert_eq(kv_kernel_calib_load("/nonexistent/k.json", NULL, &c, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "/nonexistent/k.json"), "%s", err.msg);
    free(ok), free(bad);
    kvt_rmtree(dir);
    free(dir);
}

Test(measured_timing, kernels_report_positive_times)
{
    kv_backend *be = kvt_open("cpu", 0);
    kv_error err = {0};
    kv_kernel_timing opts = {2, 0.5};
    kv_quant_layout l = {256, 128, 32, KV_GROUP_TOKEN};
    double s = -1;
    cr_assert_eq(kv_kernel_time_encode(be, &l, 8, 4, &opts, &s, &err), KV_OK, "%s", err.msg);
    cr_assert(s > 0);
    cr_assert_eq(kv_kernel_time_decode(be, &l, 8, 4, 1, &opts, &s, &err), KV_OK, "%s", err.msg);
    cr_assert(s > 0);
    kv_quant_layout kivi = {64, 128, 32, KV_GROUP_CHANNEL};
    cr_assert_eq(kv_kernel_time_encode(be, &kivi, 2, 0, NULL, &s, &err), KV_OK, "%s", err.msg);
    cr_assert(s > 0);
    kv_store_format f = {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 32};
    kv_attn_spec spec = {1, 8, 2, 64, 200, 32, &f, &f, 1, 0, 0, 1};
    cr_assert_eq(kv_kernel_time_attention(be, &spec, &opts, &s, &err), KV_OK, "%s", err.msg);
    cr_assert(s > 0);
    cr_assert_eq(kv_kernel_time_compact(be, 100, 2, NULL, &s, &err), KV_OK, "%s", err.msg);
    cr_assert(s > 0);
    /* bad input comes back as an error, not a crash */
    cr_assert_eq(kv_kernel_time_encode(be, &l, 17, 0, NULL, &s, &err), KV_EINPUT);
    kv_attn_spec bad = spec;
    bad.n_kv_heads = 3;
    cr_assert_eq(kv_kernel_time_attention(be, &bad, NULL, &s, &err), KV_EINPUT);
    kv_backend_close(be);
}
