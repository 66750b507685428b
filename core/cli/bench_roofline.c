/* bench_roofline.c — `kvsim bench roofline`: the roofline's error against a profiled table, point by point. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/datadir.h"
#include "core/config/cards.h"
#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/cli/table_args.h"
#include "core/report/metrics.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"


static void usage(FILE *out)
{
    fprintf(out, "usage: kvsim bench roofline --profile FILE --profile-model NAME --hardware NAME\n"
                 "                            [--model CARD] [--device PROFILE] [--tp N]... [--calibrated FILE]\n"
                 "  For every point of a profiled table (splitwise-sim's perf_model.csv layout), the\n"
                 "  profiled time, kvsim's roofline for the same step, and their ratio; with and without\n"
                 "  the tensor-parallel all-reduces. Defaults: --model llama-2-70b --device h100-sxm,\n"
                 "  --tp 2 --tp 4 --tp 8 (a tp the table lacks is reported and skipped). Then, per tp and phase,\n"
                 "  timing.roofline's floor and efficiency fitted to the table (kv_timing_fit_phase) and the\n"
                 "  ratios profiled / calibrated roofline that remain: median and worst. --calibrated FILE (a\n"
                 "  kvsim calibrate output) also prints, per tp and phase, the median and worst error of the\n"
                 "  roofline with FILE's knobs (its device figures too, and its prefill knee) against the table.\n");
}

/* The stock roofline's seconds for a profiled point (whatever knobs the device profile carries). */
static double roofline(const kv_timing *t, int decode, double batch, double x, double *no_comm_s)
{
    double tokens;
    return kv_timing_point_stock_seconds(t, decode, batch, x, &tokens, no_comm_s);
}

/* Per phase, the error of the roofline calibrated by `cal` (a kvsim calibrate output) against p's points. */
static void print_calibrated(const kv_profile *p, const kv_model_card *m, const kv_device_profile *cal,
                             const char *cal_path, int tp)
{
    const kv_device_roofline *r = kv_device_roofline_find(cal, tp);
    if (!r) {
        printf("tp %d calibrated: %s has no roofline entry for tp %d\n\n", tp, cal_path, tp);
        return;
    }
    kv_timing t;
    kv_timing_init(&t, m, cal, tp);
    for (int decode = 0; decode < 2; decode++) {
        size_t n = kv_profile_point_count(p, decode);
        double *roof = kv_calloc(n + 1, sizeof *roof), *tokens = kv_calloc(n + 1, sizeof *tokens);
        double *table = kv_calloc(n + 1, sizeof *table);
        for (size_t i = 0; i < n; i++) {
            double batch, x;
            kv_profile_point(p, decode, i, &batch, &x, &table[i]);
            roof[i] = kv_timing_point_stock_seconds(&t, decode, batch, x, &tokens[i], NULL);
        }
        double median, worst, worst_ratio;
        kv_timing_knobs k = {r->floor_s[decode], r->efficiency[decode], r->token_s[decode], r->knee_tokens[decode],
                             r->knee_token_s[decode]};
        kv_timing_knobs_errors(roof, tokens, table, n, &k, &median, &worst, &worst_ratio);
        char knee[96] = "";
        if (k.knee_token_s > 0)
            snprintf(knee, sizeof knee, ", above %.0f tokens +%.4g us/token", k.knee_tokens, k.knee_token_s * 1e6);
        printf("tp %d %-7s calibrated (%s: floor %.4g ms, efficiency %.4g, %.4g us/token%s): median error %.1f%%, "
               "worst %.1f%% (ratio %.3f) over %zu points\n",
               tp, decode ? "decode" : "prefill", cal_path, r->floor_s[decode] * 1e3, r->efficiency[decode],
               r->token_s[decode] * 1e6, knee, 100 * median, 100 * worst, worst_ratio, n);
        kv_free(roof);
        kv_free(tokens);
        kv_free(table);
    }
    printf("\n");
}

typedef struct ratio_sum {
    double log_sum, log_sum_nc, min, max;
    int n;
} ratio_sum;

static int compare_tp(const char *path, const char *pmodel, const char *hw, int tp, const kv_model_card *m,
                      const kv_device_profile *d, const kv_device_profile *cal, const char *cal_path,
                      ratio_sum sums[2])
{
    kv_error err = {0};
    kv_profile *p = NULL;
    if (kv_profile_load(path, pmodel, hw, tp, NULL, &p, &err)) {
        printf("tp %d: skipped (%s)\n\n", tp, err.msg);
        return err.code == KV_EINPUT && strstr(err.msg, "no rows") ? 0 : 2;
    }
    kv_timing t;
    kv_timing_init(&t, m, d, tp);
    printf("%s\n%-8s %6s %8s %12s %12s %8s %14s\n", kv_profile_describe(p), "step", "batch", "tokens",
           "profile ms", "roofline ms", "ratio", "ratio no-comm");
    for (int decode = 0; decode < 2; decode++) {
        for (size_t i = 0; i < kv_profile_point_count(p, decode); i++) {
            double batch, x, measured, nc;
            kv_profile_point(p, decode, i, &batch, &x, &measured);
            double model = roofline(&t, decode, batch, x, &nc);
            double r = measured / model, r_nc = measured / nc;
            printf("%-8s %6g %8g %12.3f %12.3f %8.3f %14.3f\n", decode ? "decode" : "prefill", batch, x,
                   measured * 1e3, model * 1e3, r, r_nc);
            ratio_sum *s = &sums[decode];
            s->log_sum += log(r);
            s->log_sum_nc += log(r_nc);
            s->min = s->n ? fmin(s->min, r) : r;
            s->max = s->n ? fmax(s->max, r) : r;
            s->n++;
        }
    }
    printf("\n");
    for (int decode = 0; decode < 2; decode++) {
        size_t n = kv_profile_point_count(p, decode);
        double *model = kv_calloc(n + 1, sizeof *model), *table = kv_calloc(n + 1, sizeof *table);
        double *err_abs = kv_calloc(n + 1, sizeof *err_abs);
        for (size_t i = 0; i < n; i++) {
            double batch, x, nc;
            kv_profile_point(p, decode, i, &batch, &x, &table[i]);
            model[i] = roofline(&t, decode, batch, x, &nc);
        }
        double floor_s, eff;
        kv_timing_fit_phase(model, table, n, &floor_s, &eff);
        double worst = 1, worst_abs = 0;
        for (size_t i = 0; i < n; i++) {
            double m = fmax(model[i] / eff, floor_s), r = table[i] / m;
            err_abs[i] = fabs(log(r));
            if (err_abs[i] > worst_abs) {
                worst_abs = err_abs[i];
                worst = r;
            }
        }
        kv_stat st;
        kv_stat_compute(err_abs, n, &st);
        const char *ph = decode ? "decode" : "prefill";
        printf("tp %d %-7s fitted: timing.roofline.%s_floor_ms=%.4g timing.roofline.%s_efficiency=%.4g; "
               "profiled / calibrated roofline: median error %.1f%%, worst ratio %.3f over %zu points\n",
               tp, ph, ph, floor_s * 1e3, ph, eff, 100 * (exp(st.median) - 1), worst, n);
        kv_free(model);
        kv_free(table);
        kv_free(err_abs);
    }
    printf("\n");
    if (cal)
        print_calibrated(p, m, cal, cal_path, tp);
    kv_profile_destroy(p);
    return 0;
}

int kv_cmd_bench_roofline(int argc, char **argv)
{
    kv_table_args t;
    const char *cal_path = NULL;
    int parsed = kv_table_args_parse(&t, "bench roofline", argc, argv, "--calibrated", &cal_path, usage);
    if (parsed)
        return parsed < 0 ? 0 : parsed;
    if (!t.profile || !t.profile_model || !t.hardware) {
        fprintf(stderr, "kvsim bench roofline: --profile, --profile-model and --hardware are required\n");
        usage(stderr);
        return 2;
    }
    if (t.n_tp == 0) {
        t.tps[t.n_tp++] = 2;
        t.tps[t.n_tp++] = 4;
        t.tps[t.n_tp++] = 8;
    }
    const char *path = t.profile, *pmodel = t.profile_model, *hw = t.hardware, *model = t.model;
    const int *tps = t.tps;
    int n_tp = t.n_tp;
    char root[KV_DATA_PATH_MAX], data[KV_DATA_PATH_MAX + 16];
    snprintf(data, sizeof data, "%s/scenarios", kv_data_dir(root, sizeof root) ? root : ".");
    const char *dirs[] = {".", data};
    kv_error err = {0};
    kv_model_card m;
    kv_device_profile d;
    if (kv_table_args_load(&t, "bench roofline", &m, &d))
        return 2;
    kv_device_profile cal;
    if (cal_path && kv_device_profile_load(cal_path, dirs, 2, "--calibrated", &cal, &err)) {
        fprintf(stderr, "kvsim bench roofline: %s\n", err.msg);
        kv_model_card_free(&m);
        kv_device_profile_free(&d);
        return 2;
    }
    printf("kvsim bench roofline: %s (%s) on %s against %s rows '%s' on '%s'\n"
           "ratio = profiled time / roofline time (1 = exact; > 1: the roofline is optimistic)\n\n",
           m.name, model, d.name, path, pmodel, hw);
    int rc = 0;
    for (int i = 0; i < n_tp && !rc; i++) {
        ratio_sum sums[2] = {{0}};
        rc = compare_tp(path, pmodel, hw, tps[i], &m, &d, cal_path ? &cal : NULL, cal_path, sums);
        for (int k = 0; k < 2 && !rc; k++)
            if (sums[k].n)
                printf("tp %d %-7s: geometric-mean ratio %.2f (without all-reduces %.2f), range %.2f-%.2f over %d "
                       "points\n%s",
                       tps[i], k ? "decode" : "prefill", exp(sums[k].log_sum / sums[k].n),
                       exp(sums[k].log_sum_nc / sums[k].n), sums[k].min, sums[k].max, sums[k].n, k ? "\n" : "");
    }
    if (cal_path)
        kv_device_profile_free(&cal);
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
    return rc;
}
