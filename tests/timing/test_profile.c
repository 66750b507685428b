/* test_profile.c — timing.source: profile (core/timing/profile.c) and the roofline's tensor-parallel all-reduces.
 *
 * tests/fixtures/profiles/toy.csv is made from formulas (ms):
 *   prefill(B, P) = 10 + 0.1 P B   on the cross (P at B = 1; B at P = 512),
 *   decode(B, x)  = 20 + 0.5 B + 0.001 x,  x = prompt + generated / 2,
 * with the point (1, 512) measured three times (averaging to the formula) and an
 * artefact at batch 16 (5 ms) that must be dropped. grid.csv is a full 2 x 2 grid:
 *   prefill = 1 + B P / 100, decode = 2 + B + (P + 50) / 1000. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/cards.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"
#include "tests/support.h"

#define TOY KV_SOURCE_DIR "/tests/fixtures/profiles/toy.csv"
#define GRID KV_SOURCE_DIR "/tests/fixtures/profiles/grid.csv"

static kv_profile *load(const char *path, const char *model, const char *hw, int tp)
{
    kv_error err = {0};
    kv_profile *p = NULL;
    int rc = kv_profile_load(path, model, hw, tp, NULL, &p, &err);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    return p;
}

static void near(double got, double want, const char *what)
{
    cr_expect(fabs(got - want) <= 1e-12 * fmax(1, fabs(want)), "%s: got %.15g, want %.15g", what, got, want);
}

Test(profile, cross_is_exact_at_points_and_linear_between)
{
    kv_profile *p = load(TOY, "toy-1b", "gpu-a", 1);
    near(kv_profile_prefill_s(p, 1, 512), 61.2e-3, "prefill(1, 512): three rows averaged");
    near(kv_profile_prefill_s(p, 1, 128), 22.8e-3, "prefill(1, 128)");
    near(kv_profile_prefill_s(p, 1, 768), 86.8e-3, "prefill(1, 768) between knots");
    near(kv_profile_prefill_s(p, 1, 2048), 214.8e-3, "prefill(1, 2048) extrapolated");
    near(kv_profile_prefill_s(p, 4, 512), (10 + 0.1 * 512 * 4) * 1e-3, "prefill(4, 512)");
    /* Off both arms: prefill follows total tokens (the length arm at 2048, times batch 2's ratio, 1 here). */
    near(kv_profile_prefill_s(p, 2, 1024), (10 + 0.1 * 2048) * 1e-3, "prefill(2, 1024) on total tokens");
    near(kv_profile_decode_s(p, 1, 1088), (20.5 + 1.088) * 1e-3, "decode(1, 1088)");
    near(kv_profile_decode_s(p, 8, 576), (20 + 4 + 0.576) * 1e-3, "decode(8, 576)");
    near(kv_profile_decode_s(p, 4, 1088), (20.5 + 1.088) * (22 + 0.576) / 21.076 * 1e-3, "decode(4, 1088)");
    kv_profile_destroy(p);
}

Test(profile, artefact_is_dropped_and_named)
{
    kv_profile *p = load(TOY, "toy-1b", "gpu-a", 1);
    /* Batch 16 measured 5 ms; dropped, so batch 16 extrapolates from batches 4 and 8. */
    near(kv_profile_prefill_s(p, 16, 512), (10 + 0.1 * 512 * 16) * 1e-3, "prefill(16, 512)");
    const char *d = kv_profile_describe(p);
    cr_expect(strstr(d, "dropped prefill batch 16") != NULL, "%s", d);
    cr_expect(strstr(d, "tp 1") != NULL, "%s", d);
    /* 4 prompt lengths at batch 1, and batches 2, 4, 8 at 512 tokens (batch 16 dropped). */
    cr_expect_eq(kv_profile_point_count(p, 0), 7, "prefill points kept: %zu", kv_profile_point_count(p, 0));
    kv_profile_destroy(p);
}

Test(profile, tp_selects_rows)
{
    kv_profile *p = load(TOY, "TOY-1B", "GPU-A", 2); /* names compare case-insensitively */
    near(kv_profile_prefill_s(p, 1, 512), 61.2e-3, "tp 2 has one row at (1, 512)");
    cr_expect(strstr(kv_profile_describe(p), "dropped") == NULL, "%s", kv_profile_describe(p));
    kv_profile_destroy(p);
}

Test(profile, grid_is_bilinear)
{
    kv_profile *p = load(GRID, "grid", "gpu-b", 1);
    near(kv_profile_prefill_s(p, 2.5, 200), 6e-3, "prefill(2.5, 200)");
    near(kv_profile_prefill_s(p, 4, 300), 13e-3, "prefill(4, 300)");
    near(kv_profile_decode_s(p, 2, 250), (2 + 2 + 0.25) * 1e-3, "decode(2, context 250)");
    kv_profile_destroy(p);
}

static void expect_load_error(const char *text, const char *fragment)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "p.csv", text);
    kv_error err = {0};
    kv_profile *p = NULL;
    int rc = kv_profile_load(path, "m", "h", 1, NULL, &p, &err);
    cr_expect_eq(rc, KV_EINPUT, "rc %d for:\n%s", rc, text);
    cr_expect(p == NULL);
    cr_expect(strstr(err.msg, fragment) != NULL, "expected '%s' in: %s", fragment, err.msg);
    kvt_rmtree(dir);
    free(dir);
    free(path);
}

Test(profile, bad_tables_name_line_and_column)
{
    const char *h = "model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n";
    char text[1024];
    expect_load_error("model,hardware,prompt_size\nm,h,1\n", "no 'tensor_parallel' column");
    snprintf(text, sizeof text, "%sm,h,1,512,1,128,abc,3\n", h);
    expect_load_error(text, "p.csv:2:");
    expect_load_error(text, "prompt_time: expected a finite number");
    snprintf(text, sizeof text, "%sm,h,1,512,1,128,-4,3\n", h);
    expect_load_error(text, "prompt_time");
    snprintf(text, sizeof text, "%sm,h,1,512,1,128,nan,3\n", h);
    expect_load_error(text, "finite");
    snprintf(text, sizeof text, "%sm,h,1,512\n", h);
    expect_load_error(text, "p.csv:2: 4 columns");
    snprintf(text, sizeof text, "%s\"m\",h,1,512,1,128,4,3\n", h);
    expect_load_error(text, "quoted fields");
    snprintf(text, sizeof text, "%sother,h,1,512,1,128,4,3\n", h);
    expect_load_error(text, "it has: other/h/tp1");
    /* Neither a grid nor a cross: three points on no common row or column. */
    snprintf(text, sizeof text, "%sm,h,1,100,1,0,1,1\nm,h,1,200,2,0,2,2\nm,h,1,300,3,0,3,3\n", h);
    expect_load_error(text, "neither a full");
    expect_load_error("", "empty profile table");
}

/* A step costed by the profile: prefill and bf16 decode are the table's; compressed KV is corrected by the
   roofline time of the bytes it does not read. */
Test(profile, step_seconds_follow_the_table)
{
    kv_profile *p = load(TOY, "toy-1b", "gpu-a", 1);
    const char *dirs[] = {KV_SOURCE_DIR "/scenarios"};
    kv_model_card m;
    kv_device_profile d;
    kv_error err = {0};
    cr_assert_eq(kv_model_card_load("llama-3-8b", dirs, 1, "test", &m, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_device_profile_load("h100-sxm", dirs, 1, "test", &d, &err), KV_OK, "%s", err.msg);
    kv_timing t;
    kv_timing_init(&t, &m, &d, 1);
    t.profile = p;
    kv_step_work w = {0};
    kv_step_add_prefill(&t, &w, 1024);
    near(kv_step_seconds(&t, &w), 112.4e-3, "one 1024-token prefill");
    double bf16 = kv_model_kv_values_per_token(&m) * 2.0 * 1088;
    kv_step_work dw = {0};
    kv_step_add_decode(&t, &dw, 1088, bf16);
    near(kv_step_seconds(&t, &dw), 21.588e-3, "bf16 decode step at context 1088");
    kv_step_work qw = {0};
    kv_step_add_decode(&t, &qw, 1088, bf16 / 4);
    double saved = 0.75 * bf16 / (d.hbm_bandwidth_gbs * 1e9 * d.memory_efficiency);
    near(kv_step_seconds(&t, &qw), 21.588e-3 - saved, "a quarter of the KV bytes");
    kv_step_work vw = {0};
    kv_step_add_verify(&t, &vw, 4, 1088, bf16);
    double per = kv_profile_decode_s(p, 4, 1088) - 3 * bf16 / (d.hbm_bandwidth_gbs * 1e9 * d.memory_efficiency);
    near(kv_step_seconds(&t, &vw), per, "a 4-token verification: 4 decode slots, KV read once");
    kv_step_work mixed = w;
    kv_step_add_decode(&t, &mixed, 1088, bf16);
    near(kv_step_seconds(&t, &mixed), 112.4e-3 + 21.588e-3, "prefill inside a decode batch adds both parts");
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
    kv_profile_destroy(p);
}

Test(profile, roofline_charges_tensor_parallel_allreduces)
{
    const char *dirs[] = {KV_SOURCE_DIR "/scenarios"};
    kv_model_card m;
    kv_device_profile d;
    kv_error err = {0};
    cr_assert_eq(kv_model_card_load("llama-3-8b", dirs, 1, "test", &m, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_device_profile_load("h100-sxm", dirs, 1, "test", &d, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(d.interconnect_gbs, 450);
    near(d.allreduce_latency_s, 10e-6, "allreduce_latency_us: 10");
    kv_timing t1, t2;
    kv_timing_init(&t1, &m, &d, 1);
    kv_timing_init(&t2, &m, &d, 2);
    kv_step_work w = {0};
    kv_step_add_prefill(&t2, &w, 1000);
    cr_expect_eq(kv_step_allreduce_seconds(&t1, &w), 0, "tp 1 has no all-reduce");
    /* 2 per layer; a ring moves 2(tp-1)/tp of 1000 tokens x hidden x 2 bytes. */
    double one = 10e-6 + 2.0 * 1 / 2 * (1000.0 * m.hidden * 2) / 450e9;
    near(kv_step_allreduce_seconds(&t2, &w), 2 * m.layers * one, "tp 2 all-reduces");
    double compute = w.flops / (d.bf16_tflops * 1e12 * d.compute_efficiency * 2);
    double memory = (kv_model_weight_bytes(&m) + w.kv_bytes) / (d.hbm_bandwidth_gbs * 1e9 * d.memory_efficiency * 2);
    near(kv_step_seconds(&t2, &w), fmax(compute, memory) + 2 * m.layers * one + d.kernel_overhead_s,
         "the roofline step includes them");
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
}

/* ---- Through kvsim run / validate --------------------------------------------------------------- */

static const char *scenario =
    "name: p\n"
    "model: llama-3-8b\n"
    "network: {model: ideal}\n"
    "workload: {requests: 4, rate_per_s: 1, prompt: {value: 512}, output: {value: 8}}\n"
    "policies: [bf16, int4]\n"
    "timing:\n"
    "  source: profile\n";

static int run_text(const char *extra, const char *cmd, char **out, char **dir)
{
    *dir = kvt_tempdir();
    char text[2048];
    snprintf(text, sizeof text, "%s%s", scenario, extra);
    char *path = kvt_write(*dir, "s.yaml", text);
    char args[8400];
    snprintf(args, sizeof args, "%s %s --out %s/out --quiet", cmd, path, *dir);
    if (strcmp(cmd, "validate") == 0)
        snprintf(args, sizeof args, "validate %s", path);
    int rc = kvt_kvsim(args, out);
    free(path);
    return rc;
}

Test(profile, run_uses_the_table)
{
    char *out = NULL, *dir = NULL;
    int rc = run_text("  profile: {file: " TOY ", model: toy-1b, prefill_hardware: gpu-a}\n", "run", &out, &dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[4200];
    snprintf(path, sizeof path, "%s/out/results.json", dir);
    char *json = kvt_read(path, NULL);
    cr_assert(json);
    cr_expect(strstr(json, "\"timing_source\":\"profile ") != NULL, "%.400s", json);
    cr_expect(strstr(json, "toy-1b on gpu-a, tp 1") != NULL, "%.400s", json);
    free(json);
    kvt_rmtree(dir);
    free(dir);
    free(out);
}

static void expect_exit2(const char *extra, const char *fragment)
{
    char *out = NULL, *dir = NULL;
    int rc = run_text(extra, "validate", &out, &dir);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, fragment) != NULL, "expected '%s' in: %s", fragment, out);
    kvt_rmtree(dir);
    free(dir);
    free(out);
}

Test(profile, bad_profile_settings_exit_2)
{
    expect_exit2("", "timing.source: profile needs timing.profile.file");
    expect_exit2("  profile: {file: " TOY "}\n", "needs timing.profile.model");
    expect_exit2("  profile: {file: nowhere.csv, model: toy-1b, prefill_hardware: gpu-a}\n", "timing.profile.file");
    expect_exit2("  profile: {file: " TOY ", model: toy-1b, prefill_hardware: gpu-z}\n",
                 "toy-1b/gpu-a/tp1, toy-1b/gpu-a/tp2");
    expect_exit2("  profile: {file: " TOY ", model: toy-1b, prefill_hardware: gpu-a, decode_hardware: gpu-q}\n",
                 "timing.profile.decode_hardware");
    expect_exit2("  profile: {file: " TOY ", modle: toy-1b}\n", "did you mean 'model'");
}
