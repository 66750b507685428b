/* cmd_calibrate.c — `kvsim calibrate`: fits the roofline's knobs per tp and phase to a profiled table and
 * writes a device profile carrying them (its `roofline` section; docs/timing.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/datadir.h"
#include "core/base/json.h"
#include "core/cli/commands.h"
#include "core/cli/table_args.h"
#include "core/config/cards.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"

#define MAX_TP KV_TABLE_MAX_TP

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvsim calibrate --profile FILE --profile-model NAME --hardware NAME --out FILE\n"
            "                       [--model CARD] [--device PROFILE] [--tp N]...\n"
            "  Fits, per tp degree and phase (prefill, decode), the roofline's floor, efficiency and per-token\n"
            "  overhead, and for prefill a knee (step tokens above which a second per-token cost is added), to\n"
            "  the profiled table's points (kv_timing_fit_phase_tokens, kv_timing_fit_phase_knee: least squares\n"
            "  in log error), prints the error before and after, and writes FILE: a copy of the device profile with\n"
            "  a `roofline` section holding the fitted knobs per tp (written atomically). A scenario whose\n"
            "  pool uses FILE as its device (cluster.<pool>.device: FILE) and has a listed tp gets them.\n"
            "  Defaults: --model llama-2-70b --device h100-sxm; --tp: every tp 1-64 the table has.\n");
}

/* The fitted knobs of one tp and the errors before (stock roofline) and after. */
typedef struct fit_result {
    int tp;
    size_t n[2];
    double floor_s[2], efficiency[2], token_s[2];
    double knee_tokens, knee_token_s; /* prefill's knee (knee_token_s 0: none) */
    double median_before[2], worst_before[2], median_after[2], worst_after[2];
} fit_result;

/* The stock roofline, the tokens and the table's seconds of every point of one phase (arrays owned by the
   caller, n + 1 long). */
static size_t phase_points(const kv_profile *p, const kv_timing *t, int decode, double **roof, double **tokens,
                           double **table)
{
    size_t n = kv_profile_point_count(p, decode);
    *roof = kv_calloc(n + 1, sizeof **roof);
    *tokens = kv_calloc(n + 1, sizeof **tokens);
    *table = kv_calloc(n + 1, sizeof **table);
    for (size_t i = 0; i < n; i++) {
        double batch, x;
        kv_profile_point(p, decode, i, &batch, &x, &(*table)[i]);
        (*roof)[i] = kv_timing_point_stock_seconds(t, decode, batch, x, &(*tokens)[i], NULL);
    }
    return n;
}

static void fit_one(const kv_profile *p, const kv_timing *t, fit_result *r)
{
    for (int ph = 0; ph < 2; ph++) {
        double *roof, *tokens, *table, ratio;
        size_t n = phase_points(p, t, ph, &roof, &tokens, &table);
        r->n[ph] = n;
        kv_timing_fit_errors(roof, tokens, table, n, 0, 1, 0, &r->median_before[ph], &r->worst_before[ph], &ratio);
        kv_timing_knobs k = {0, 1, 0, 0, 0};
        if (ph == 0) /* prefill: with the knee; decode: without (its fit meets the goal, docs/timing.md) */
            kv_timing_fit_phase_knee(roof, tokens, table, n, &k);
        else
            kv_timing_fit_phase_tokens(roof, tokens, table, n, &k.floor_s, &k.efficiency, &k.token_s);
        r->floor_s[ph] = k.floor_s;
        r->efficiency[ph] = k.efficiency;
        r->token_s[ph] = k.token_s;
        if (ph == 0) {
            r->knee_tokens = k.knee_tokens;
            r->knee_token_s = k.knee_token_s;
        }
        kv_timing_knobs_errors(roof, tokens, table, n, &k, &r->median_after[ph], &r->worst_after[ph], &ratio);
        kv_free(roof);
        kv_free(tokens);
        kv_free(table);
    }
}

static void list(FILE *f, const char *key, const fit_result *r, int n, int ph, int what)
{
    fprintf(f, "  %s: [", key);
    for (int i = 0; i < n; i++) {
        double v = what == 0   ? r[i].floor_s[ph] * 1e3
                   : what == 1 ? r[i].efficiency[ph]
                   : what == 2 ? r[i].token_s[ph] * 1e6
                   : what == 3 ? r[i].knee_tokens
                               : r[i].knee_token_s * 1e6;
        if (i)
            fprintf(f, ", ");
        kv_json_number(f, v);
    }
    fprintf(f, "]\n");
}

/* The device profile d with the fitted `roofline` section (strings as JSON strings, which YAML reads). */
static void write_profile(FILE *f, const kv_device_profile *d, const char *device, const char *profile,
                          const char *pmodel, const char *hw, const fit_result *r, int n)
{
    fprintf(f, "# %s with the roofline fitted by kvsim calibrate to %s (model '%s', hardware '%s').\n"
               "# Generated: edit with care (docs/timing.md, \"Calibrating the roofline\").\n",
            device, profile, pmodel, hw);
    fprintf(f, "name: ");
    kv_json_string(f, d->name);
    fprintf(f, "\nvendor: ");
    kv_json_string(f, d->vendor);
    const struct {
        const char *key;
        double v;
    } nums[] = {{"memory_gb", d->memory_gb},
                {"hbm_bandwidth_gbs", d->hbm_bandwidth_gbs},
                {"bf16_tflops", d->bf16_tflops},
                {"fp32_tflops", d->fp32_tflops},
                {"int8_tops", d->int8_tops},
                {"compute_efficiency", d->compute_efficiency},
                {"memory_efficiency", d->memory_efficiency},
                {"kernel_overhead_us", d->kernel_overhead_s * 1e6},
                {"nic_bandwidth_gbps", d->nic_bandwidth_gbps},
                {"interconnect_gbs", d->interconnect_gbs},
                {"allreduce_latency_us", d->allreduce_latency_s * 1e6}};
    fprintf(f, "\n");
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        fprintf(f, "%s: ", nums[i].key);
        kv_json_number(f, nums[i].v);
        fprintf(f, "\n");
    }
    char *src = kv_malloc(strlen(d->source ? d->source : "") + strlen(profile) + strlen(pmodel) + strlen(hw) + 96);
    sprintf(src, "%s; roofline fitted by kvsim calibrate to %s (%s on %s)", d->source ? d->source : "", profile,
            pmodel, hw);
    fprintf(f, "source: ");
    kv_json_string(f, src);
    kv_free(src);
    fprintf(f, "\nroofline:\n  tp: [");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : "", r[i].tp);
    fprintf(f, "]\n");
    list(f, "prefill_floor_ms", r, n, 0, 0);
    list(f, "prefill_efficiency", r, n, 0, 1);
    list(f, "prefill_token_us", r, n, 0, 2);
    list(f, "decode_floor_ms", r, n, 1, 0);
    list(f, "decode_efficiency", r, n, 1, 1);
    list(f, "decode_token_us", r, n, 1, 2);
    list(f, "prefill_knee_tokens", r, n, 0, 3);
    list(f, "prefill_knee_token_us", r, n, 0, 4);
}

/* Writes the profile atomically, then reads the temporary back as a device profile before publishing it. */
static int publish(const char *out, const kv_device_profile *d, const char *device, const char *profile,
                   const char *pmodel, const char *hw, const fit_result *r, int n)
{
    kv_error err = {0};
    kv_afile a;
    if (kv_afile_open(&a, out, &err)) {
        fprintf(stderr, "kvsim calibrate: --out: %s\n", err.msg);
        return 2;
    }
    write_profile(a.f, d, device, profile, pmodel, hw, r, n);
    if (fflush(a.f) != 0 || ferror(a.f)) {
        fprintf(stderr, "kvsim calibrate: --out: %s: write failed\n", out);
        kv_afile_abort(&a);
        return 1;
    }
    char *check = kv_malloc(strlen(a.tmp_path) + 3);
    sprintf(check, "%s%s", strchr(a.tmp_path, '/') ? "" : "./", a.tmp_path);
    kv_device_profile back;
    int rc = kv_device_profile_load(check, NULL, 0, "--out", &back, &err);
    kv_free(check);
    if (!rc && back.n_roofline != (size_t)n)
        rc = kv_error_set(&err, KV_EFAIL, "%zu roofline entries read back, %d written", back.n_roofline, n);
    kv_device_profile_free(&back);
    if (rc) {
        fprintf(stderr, "kvsim calibrate: %s does not read back: %s\n", out, err.msg);
        kv_afile_abort(&a);
        return 1;
    }
    if (kv_afile_commit(&a, &err)) {
        fprintf(stderr, "kvsim calibrate: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int kv_cmd_calibrate(int argc, char **argv)
{
    kv_table_args t;
    const char *out = NULL;
    int parsed = kv_table_args_parse(&t, "calibrate", argc, argv, "--out", &out, usage);
    if (parsed)
        return parsed < 0 ? 0 : parsed;
    if (!t.profile || !t.profile_model || !t.hardware || !out) {
        fprintf(stderr, "kvsim calibrate: --profile, --profile-model, --hardware and --out are required\n");
        usage(stderr);
        return 2;
    }
    int all_tp = t.n_tp == 0;
    if (all_tp)
        for (int tp = 1; tp <= 64; tp *= 2)
            t.tps[t.n_tp++] = tp;
    const char *path = t.profile, *pmodel = t.profile_model, *hw = t.hardware, *device = t.device;
    const int *tps = t.tps;
    int n_tp = t.n_tp;
    kv_error err = {0};
    kv_model_card m;
    kv_device_profile d;
    if (kv_table_args_load(&t, "calibrate", &m, &d))
        return 2;
    printf("kvsim calibrate: %s on %s against %s rows '%s' on '%s'\n"
           "error = |roofline / profiled - 1| per point; before: the stock roofline, after: the fitted knobs\n\n",
           m.name, d.name, path, pmodel, hw);
    fit_result r[MAX_TP];
    int n = 0, rc = 0;
    for (int i = 0; i < n_tp && !rc; i++) {
        kv_profile *p = NULL;
        if (kv_profile_load(path, pmodel, hw, tps[i], "--profile", &p, &err)) {
            int missing = err.code == KV_EINPUT && strstr(err.msg, "no rows");
            if (!missing || !all_tp) { /* a tp asked for by name must be in the table */
                fprintf(stderr, "kvsim calibrate: %s\n", err.msg);
                rc = 2;
            }
            continue;
        }
        kv_timing t;
        kv_timing_init(&t, &m, &d, tps[i]);
        r[n].tp = tps[i];
        fit_one(p, &t, &r[n]);
        for (int ph = 0; ph < 2; ph++) {
            const char *name = ph ? "decode" : "prefill";
            char knee[96] = "";
            if (ph == 0 && r[n].knee_token_s > 0)
                snprintf(knee, sizeof knee, ", above %.0f tokens +%.4g us/token", r[n].knee_tokens,
                         r[n].knee_token_s * 1e6);
            printf("tp %d %-7s floor %.4g ms, efficiency %.4g, %.4g us/token%s: median error %.1f%% (before %.1f%%), "
                   "worst %.1f%% (before %.1f%%) over %zu points\n",
                   tps[i], name, r[n].floor_s[ph] * 1e3, r[n].efficiency[ph], r[n].token_s[ph] * 1e6, knee,
                   100 * r[n].median_after[ph], 100 * r[n].median_before[ph], 100 * r[n].worst_after[ph],
                   100 * r[n].worst_before[ph], r[n].n[ph]);
        }
        n++;
        kv_profile_destroy(p);
    }
    if (!rc && n == 0) {
        fprintf(stderr, "kvsim calibrate: --profile: %s has no rows of '%s' on '%s' at tp 1-64\n", path, pmodel, hw);
        rc = 2;
    }
    if (!rc)
        rc = publish(out, &d, device, path, pmodel, hw, r, n);
    if (!rc)
        printf("\nwrote %s (device profile %s with roofline knobs for %d tp degree%s)\n", out, d.name, n,
               n == 1 ? "" : "s");
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
    return rc;
}
