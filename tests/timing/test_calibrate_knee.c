/* test_calibrate_knee.c — `kvsim calibrate`'s prefill knee (#22): the goal at every (hardware, tp) of
 * splitwise-sim's table, the knee written, read back exactly and applied by the timing, a device profile
 * without the knee lists giving the outputs of the binary before them, and bad knee values exiting 2 with
 * the file, line and key. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/cards.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"
#include "tests/support.h"

#define TABLE KV_SOURCE_DIR "/scenarios/profiles/perf_model.csv"
#define TABLE_ARGS "--profile " TABLE " --profile-model llama2-70b "
#define FIXTURE "calibrate-knee/"

static const char *const hardware[] = {"h100-80gb", "a100-80gb"}, *const devices[] = {"h100-sxm", "a100-80gb"};

static void cards(const char *device, kv_model_card *m, kv_device_profile *d)
{
    const char *dirs[] = {KV_SOURCE_DIR "/scenarios"};
    kv_error err = {0};
    cr_assert_eq(kv_model_card_load("llama-2-70b", dirs, 1, "test", m, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_device_profile_load(device, dirs, 1, "test", d, &err), KV_OK, "%s", err.msg);
}

/* The stock roofline, tokens and table seconds of the prefill points of (hw, tp); returns their count. */
static size_t prefill_points(const char *hw, int tp, const kv_model_card *m, const kv_device_profile *d,
                             double *roof, double *tokens, double *table, size_t cap)
{
    kv_profile *p = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_profile_load(TABLE, "llama2-70b", hw, tp, NULL, &p, &err), KV_OK, "%s", err.msg);
    kv_timing t;
    kv_timing_init(&t, m, d, tp);
    size_t n = kv_profile_point_count(p, 0);
    cr_assert(n > 5 && n <= cap);
    for (size_t i = 0; i < n; i++) {
        double batch, x;
        kv_profile_point(p, 0, i, &batch, &x, &table[i]);
        roof[i] = kv_timing_point_stock_seconds(&t, 0, batch, x, &tokens[i], NULL);
    }
    kv_profile_destroy(p);
    return n;
}

/* The percentage after `key` on the line starting `line_start`, as a fraction. */
static double printed(const char *out, const char *line_start, const char *key)
{
    const char *l = strstr(out, line_start);
    cr_assert(l, "no line '%s' in:\n%s", line_start, out);
    const char *k = strstr(l, key);
    cr_assert(k && !memchr(l, '\n', (size_t)(k - l)), "no '%s' on '%s'", key, line_start);
    return strtod(k + strlen(key), NULL) / 100;
}

/* Both tables, every tp, both phases: kvsim calibrate prints median <= 10% and worst <= 25% (the goal), the
   knee fit reaches it where the knee-less fit does not (H100 tp 8, A100 tp 4 and 8), and the fit is
   deterministic. */
Test(calibrate_knee, goal_met_at_every_hardware_and_tp)
{
    char *dir = kvt_tempdir(), *o = kvt_path(dir, "fit.yaml"), args[4096];
    for (int h = 0; h < 2; h++) {
        char *out = NULL;
        snprintf(args, sizeof args, "calibrate " TABLE_ARGS "--hardware %s --device %s --out %s", hardware[h],
                 devices[h], o);
        cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
        kv_model_card m;
        kv_device_profile d;
        cards(devices[h], &m, &d);
        for (int tp = 2; tp <= 8; tp *= 2) {
            for (int decode = 0; decode < 2; decode++) {
                char line[64];
                snprintf(line, sizeof line, "tp %d %-7s floor", tp, decode ? "decode" : "prefill");
                double med = printed(out, line, "median error "), worst = printed(out, line, "worst ");
                cr_expect(med <= 0.10 && worst <= 0.25, "%s %s: median %.3f worst %.3f", hardware[h], line, med,
                          worst);
            }
            double roof[64], tokens[64], table[64], med, worst, ratio;
            size_t n = prefill_points(hardware[h], tp, &m, &d, roof, tokens, table, 64);
            kv_timing_knobs k, again;
            kv_timing_fit_phase_knee(roof, tokens, table, n, &k);
            kv_timing_fit_phase_knee(roof, tokens, table, n, &again);
            cr_expect(memcmp(&k, &again, sizeof k) == 0, "%s tp %d: the same fit twice", hardware[h], tp);
            kv_timing_knobs_errors(roof, tokens, table, n, &k, &med, &worst, &ratio);
            cr_expect(med <= 0.10 && worst <= 0.25, "%s tp %d prefill: median %.3f worst %.3f", hardware[h], tp, med,
                      worst);
            double fl, eff, tok, med0, worst0;
            kv_timing_fit_phase_tokens(roof, tokens, table, n, &fl, &eff, &tok);
            kv_timing_fit_errors(roof, tokens, table, n, fl, eff, tok, &med0, &worst0, &ratio);
            if (tp == 8 || (h == 1 && tp == 4)) {
                cr_expect(worst0 > 0.25, "%s tp %d: without the knee the worst is %.3f", hardware[h], tp, worst0);
                cr_expect(k.knee_token_s > 0 && k.knee_tokens >= 1024 && k.knee_tokens <= 4096,
                          "%s tp %d: knee %g tokens, %g s/token", hardware[h], tp, k.knee_tokens, k.knee_token_s);
            }
        }
        kv_model_card_free(&m);
        kv_device_profile_free(&d);
        free(out);
    }
    free(o);
    kvt_rmtree(dir);
    free(dir);
}

/* A synthetic phase made from a known knee at one of its token counts is recovered. */
Test(calibrate_knee, recovers_a_known_knee)
{
    double roof[14], tokens[14], table[14];
    kv_timing_knobs truth = {0.03, 0.5, 0, 3072, 4e-5};
    for (int i = 0; i < 14; i++) {
        tokens[i] = 256.0 * (1 << (i % 7)) * (i < 7 ? 1 : 1.5);
        roof[i] = 2e-5 * tokens[i] + 1e-9 * tokens[i] * tokens[i] * (i % 2);
        table[i] = kv_timing_knobs_seconds(&truth, roof[i], tokens[i]);
    }
    kv_timing_knobs k;
    double med, worst, ratio;
    kv_timing_fit_phase_knee(roof, tokens, table, 14, &k);
    kv_timing_knobs_errors(roof, tokens, table, 14, &k, &med, &worst, &ratio);
    cr_expect(worst < 0.001, "worst %.4f (knee %g, %g s/token)", worst, k.knee_tokens, k.knee_token_s);
    cr_expect(fabs(k.efficiency / 0.5 - 1) < 0.01 && fabs(k.knee_token_s / 4e-5 - 1) < 0.01 && k.knee_tokens == 3072,
              "efficiency %g, knee %g tokens at %g s/token", k.efficiency, k.knee_tokens, k.knee_token_s);
}

/* The written file carries the knee lists; they read back as the fitted knobs, a timing built on the file
   costs a prefill step above the knee with them, and bench roofline --calibrated prints calibrate's errors. */
Test(calibrate_knee, written_knee_reads_back_and_is_applied)
{
    char *dir = kvt_tempdir(), *path = kvt_path(dir, "h100-fitted.yaml"), *out = NULL, args[4096];
    snprintf(args, sizeof args, "calibrate " TABLE_ARGS "--hardware h100-80gb --out %s", path);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    char *text = kvt_read(path, NULL);
    cr_assert(text && strstr(text, "\n  prefill_knee_tokens: [") && strstr(text, "\n  prefill_knee_token_us: ["),
              "%s", text);
    kv_model_card m;
    kv_device_profile stock, fitted;
    cards("h100-sxm", &m, &stock);
    kv_error err = {0};
    cr_assert_eq(kv_device_profile_load(path, NULL, 0, "test", &fitted, &err), KV_OK, "%s", err.msg);
    for (int tp = 2; tp <= 8; tp *= 2) {
        double roof[64], tokens[64], table[64];
        size_t n = prefill_points("h100-80gb", tp, &m, &stock, roof, tokens, table, 64);
        kv_timing_knobs k;
        kv_timing_fit_phase_knee(roof, tokens, table, n, &k);
        const kv_device_roofline *r = kv_device_roofline_find(&fitted, tp);
        cr_assert(r);
        cr_expect(r->floor_s[0] == k.floor_s && r->efficiency[0] == k.efficiency &&
                      r->knee_tokens[0] == k.knee_tokens && fabs(r->token_s[0] - k.token_s) <= 1e-15 &&
                      fabs(r->knee_token_s[0] - k.knee_token_s) <= 1e-15,
                  "tp %d: knee %g / %g against %g / %g", tp, r->knee_tokens[0], r->knee_token_s[0], k.knee_tokens,
                  k.knee_token_s);
        cr_expect(r->knee_tokens[1] == 0 && r->knee_token_s[1] == 0, "no decode knee");
        if (tp == 8)
            cr_expect(k.knee_token_s > 0, "tp 8 has a knee");
        /* 8 prompts of 512 tokens: 4,096 step tokens, above the tp 8 knee. */
        kv_timing t;
        kv_timing_init(&t, &m, &fitted, tp);
        kv_step_work w = {0};
        for (int i = 0; i < 8; i++)
            kv_step_add_prefill(&t, &w, 512);
        double step_tokens, stock_s = kv_timing_point_stock_seconds(&t, 0, 8, 512, &step_tokens, NULL);
        kv_timing_knobs from_file = {r->floor_s[0], r->efficiency[0], r->token_s[0], r->knee_tokens[0],
                                     r->knee_token_s[0]};
        double want = kv_timing_knobs_seconds(&from_file, stock_s, step_tokens);
        cr_expect(fabs(kv_step_roofline_seconds(&t, &w) - want) < 1e-12, "tp %d: %.9f s against %.9f s", tp,
                  kv_step_roofline_seconds(&t, &w), want);
        if (k.knee_token_s > 0)
            cr_expect(want > fmax(from_file.floor_s, stock_s / from_file.efficiency) * 1.01, "the knee adds time");
    }
    char *bench = NULL;
    snprintf(args, sizeof args, "bench roofline " TABLE_ARGS "--hardware h100-80gb --calibrated %s", path);
    cr_assert_eq(kvt_kvsim(args, &bench), 0, "%s", bench);
    for (int tp = 2; tp <= 8; tp *= 2) {
        char cal[64], fit[64];
        snprintf(cal, sizeof cal, "tp %d prefill calibrated", tp);
        snprintf(fit, sizeof fit, "tp %d prefill floor", tp);
        cr_expect(fabs(printed(bench, cal, "median error ") - printed(out, fit, "median error ")) < 1e-9, "%s", bench);
        cr_expect(fabs(printed(bench, cal, "worst ") - printed(out, fit, "worst ")) < 1e-9, "%s", bench);
    }
    const char *tp8 = strstr(bench, "tp 8 prefill calibrated");
    cr_expect(tp8 && strstr(tp8, "above 2048 tokens"), "%s", bench);
    free(bench);
    kv_device_profile_free(&fitted);
    kv_device_profile_free(&stock);
    kv_model_card_free(&m);
    free(text);
    free(out);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* Runs the fixture scenario in dir on `device_text` as h100-tp8-no-knee.yaml, writing dir/<out>. */
static void run_fixture(const char *dir, const char *device_text, const char *out)
{
    free(kvt_write(dir, "h100-tp8-no-knee.yaml", device_text));
    const char *bin = getenv("KVSIM");
    char cmd[8192], *log = NULL;
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' run scenario.yaml --out %s", dir, bin ? bin : KV_BINARY_DIR "/kvsim",
             out);
    cr_assert_eq(kvt_sh(cmd, &log), 0, "%s", log);
    free(log);
}

/* text with every "@KV_SOURCE_DIR@" replaced by this checkout's source folder; *len its new length. */
static char *with_source_dir(const char *text, size_t *len)
{
    const char *mark = "@KV_SOURCE_DIR@";
    size_t ml = strlen(mark), sl = strlen(KV_SOURCE_DIR), n = 0;
    for (const char *p = strstr(text, mark); p; p = strstr(p + ml, mark))
        n++;
    char *out = malloc(strlen(text) + n * sl + 1), *o = out;
    cr_assert(out);
    for (const char *p = text;;) {
        const char *m = strstr(p, mark);
        size_t k = m ? (size_t)(m - p) : strlen(p);
        memcpy(o, p, k);
        o += k;
        if (!m)
            break;
        memcpy(o, KV_SOURCE_DIR, sl);
        o += sl;
        p = m + ml;
    }
    *o = 0;
    *len = (size_t)(o - out);
    return out;
}

/* expected-*: written by the binary before the knee (commit 9d2dbb6) from the same scenario and device file. */
static void expect_old_outputs(const char *dir, const char *out)
{
    const char *files[] = {"results.json", "requests.csv"};
    for (int i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "%s/%s", out, files[i]);
        char want_rel[256];
        snprintf(want_rel, sizeof want_rel, "tests/fixtures/" FIXTURE "expected-%s", files[i]);
        char *got_path = kvt_path(dir, rel), *want_path = kvt_source(want_rel);
        size_t lg = 0, lw = 0;
        char *got = kvt_read(got_path, &lg), *stored = kvt_read(want_path, &lw);
        cr_assert(got && stored, "%s or %s missing", got_path, want_path);
        char *want = with_source_dir(stored, &lw); /* the policies' paths are the checkout's */
        free(stored);
        cr_expect(lg == lw && memcmp(got, want, lg) == 0, "%s differs from %s", got_path, want_path);
        free(got);
        free(want);
        free(got_path);
        free(want_path);
    }
}

/* The first mean_ttft_ms of a results.json. */
static double mean_ttft(const char *dir, const char *out)
{
    char rel[256];
    snprintf(rel, sizeof rel, "%s/results.json", out);
    char *p = kvt_path(dir, rel), *text = kvt_read(p, NULL);
    cr_assert(text);
    const char *k = strstr(text, "\"mean_ttft_ms\":");
    cr_assert(k, "no mean_ttft_ms in %s", p);
    double v = strtod(k + strlen("\"mean_ttft_ms\":"), NULL);
    free(text);
    free(p);
    return v;
}

/* A device profile without the knee lists, or with the knee's cost 0, gives results.json and requests.csv
   byte for byte as the binary before the knee; a knee with a cost moves the 3,000-token prefills. */
Test(calibrate_knee, profile_without_knee_gives_the_old_outputs)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy(FIXTURE "scenario.yaml", dir, "scenario.yaml"));
    char *src = kvt_source("tests/fixtures/" FIXTURE "h100-tp8-no-knee.yaml"), *stock = kvt_read(src, NULL);
    cr_assert(stock);
    run_fixture(dir, stock, "none");
    expect_old_outputs(dir, "none");
    char text[8192];
    snprintf(text, sizeof text, "%s  prefill_knee_tokens: [2048]\n  prefill_knee_token_us: [0]\n", stock);
    run_fixture(dir, text, "off");
    expect_old_outputs(dir, "off");
    snprintf(text, sizeof text, "%s  prefill_knee_tokens: [2048]\n  prefill_knee_token_us: [30]\n", stock);
    run_fixture(dir, text, "on");
    double off = mean_ttft(dir, "off"), on = mean_ttft(dir, "on");
    cr_expect(on > off * 1.02, "the knee's 30 us per token above 2,048: TTFT %.3f ms against %.3f", on, off);
    free(stock);
    free(src);
    kvt_rmtree(dir);
    free(dir);
}

/* The 1-based line of the first `needle` in text. */
static int line_of(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    cr_assert(at, "no '%s'", needle);
    int line = 1;
    for (const char *c = text; c < at; c++)
        line += *c == '\n';
    return line;
}

/* Bad knee values, lists of the wrong length and a knee list without the other exit 2 naming the file, the
   line and the key, under bench roofline --calibrated and in a scenario whose pool uses the file. */
Test(calibrate_knee, bad_knee_values_exit_2_naming_file_line_and_key)
{
    static const struct {
        const char *lines, *key, *message;
    } cases[] = {
        {"  prefill_knee_tokens: [-1]\n  prefill_knee_token_us: [1]\n", "prefill_knee_tokens", "out of range"},
        {"  prefill_knee_tokens: [2048]\n  prefill_knee_token_us: [-5]\n", "prefill_knee_token_us", "out of range"},
        {"  prefill_knee_tokens: [2048]\n  prefill_knee_token_us: [nan]\n", "prefill_knee_token_us", "finite number"},
        {"  prefill_knee_tokens: [2048, 4096]\n  prefill_knee_token_us: [1]\n", "prefill_knee_tokens",
         "2 items, but roofline.tp has 1"},
        {"  prefill_knee_tokens: [2048]\n  prefill_knee_token_us: []\n", "prefill_knee_token_us",
         "0 items, but roofline.tp has 1"},
        {"  prefill_knee_tokens: [2048]\n", "prefill_knee_tokens", "without roofline.prefill_knee_token_us"},
        {"  prefill_knee_token_us: [3]\n", "prefill_knee_token_us", "without roofline.prefill_knee_tokens"},
    };
    char *dir = kvt_tempdir(), *src = kvt_source("tests/fixtures/" FIXTURE "h100-tp8-no-knee.yaml");
    char *stock = kvt_read(src, NULL), *scen = kvt_fixture_copy(FIXTURE "scenario.yaml", dir, "scenario.yaml");
    cr_assert(stock);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[8192], needle[128], key[96], args[4096], *out = NULL;
        snprintf(text, sizeof text, "%s%s", stock, cases[i].lines);
        snprintf(key, sizeof key, "  %s:", cases[i].key);
        free(kvt_write(dir, "h100-tp8-no-knee.yaml", text));
        snprintf(needle, sizeof needle, "h100-tp8-no-knee.yaml:%d:", line_of(text, key));
        snprintf(args, sizeof args,
                 "bench roofline " TABLE_ARGS "--hardware h100-80gb --tp 8 --calibrated %s/h100-tp8-no-knee.yaml", dir);
        int rc = kvt_kvsim(args, &out);
        cr_expect_eq(rc, 2, "case %zu: rc %d\n%s", i, rc, out);
        cr_expect(strstr(out, needle) && strstr(out, cases[i].key) && strstr(out, cases[i].message),
                  "case %zu: no '%s', '%s', '%s' in:\n%s", i, needle, cases[i].key, cases[i].message, out);
        free(out);
        snprintf(args, sizeof args, "run %s --out %s/out", scen, dir);
        rc = kvt_kvsim(args, &out);
        cr_expect_eq(rc, 2, "case %zu (run): rc %d\n%s", i, rc, out);
        cr_expect(strstr(out, needle) && strstr(out, cases[i].key), "case %zu (run): no '%s' in:\n%s", i, needle, out);
        free(out);
    }
    char *listing = kvt_listing(dir);
    cr_expect(!strstr(listing, "out"), "no output written: %s", listing);
    free(listing);
    free(scen);
    free(stock);
    free(src);
    kvt_rmtree(dir);
    free(dir);
}
