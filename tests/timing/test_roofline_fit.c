/* test_roofline_fit.c — timing.roofline's per-step floor and efficiency: defaults leave the roofline as it
 * was, the fit (kv_timing_fit_phase) recovers known values and shrinks the error on splitwise-sim's table. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "core/config/cards.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"

#define TABLE KV_SOURCE_DIR "/scenarios/profiles/perf_model.csv"

static void cards(kv_model_card *m, kv_device_profile *d)
{
    const char *dirs[] = {KV_SOURCE_DIR "/scenarios"};
    kv_error err = {0};
    cr_assert_eq(kv_model_card_load("llama-2-70b", dirs, 1, "test", m, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_device_profile_load("h100-sxm", dirs, 1, "test", d, &err), KV_OK, "%s", err.msg);
}

/* The stock roofline's seconds for a table point (bf16 KV, as the table). */
static double roofline(const kv_timing *t, int decode, double batch, double x)
{
    kv_step_work w = {0};
    for (int i = 0; i < (int)batch; i++) {
        if (decode)
            kv_step_add_decode(t, &w, x, kv_model_kv_values_per_token(t->model) * 2.0 * x);
        else
            kv_step_add_prefill(t, &w, x);
    }
    return kv_step_roofline_seconds(t, &w);
}

Test(roofline_fit, defaults_unchanged_and_knobs_apply)
{
    kv_model_card m;
    kv_device_profile d;
    cards(&m, &d);
    kv_timing t;
    kv_timing_init(&t, &m, &d, 8);
    cr_expect(t.step_floor_s[0] == 0 && t.step_floor_s[1] == 0 && t.step_efficiency[0] == 1 &&
              t.step_efficiency[1] == 1);
    double pre = roofline(&t, 0, 1, 2048), dec = roofline(&t, 1, 4, 1000);
    t.step_efficiency[0] = 0.5;
    t.step_floor_s[1] = 0.03;
    cr_expect(fabs(roofline(&t, 0, 1, 2048) - 2 * pre) <= 1e-15, "prefill / efficiency");
    cr_expect_eq(roofline(&t, 1, 4, 1000), fmax(0.03, dec), "decode floor");
    cr_expect(dec < 0.03, "the floor binds here: %g", dec);
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
}

Test(roofline_fit, recovers_known_floor_and_efficiency)
{
    double model[8], table[8];
    for (int i = 0; i < 8; i++) {
        model[i] = 0.004 * (1 << i); /* 4 ms .. 512 ms */
        table[i] = fmax(0.05, model[i] / 0.4);
    }
    double fl, eff;
    kv_timing_fit_phase(model, table, 8, &fl, &eff);
    cr_expect(fabs(fl - 0.05) <= 0.01 * 0.05 + 1e-12, "floor %g", fl);
    cr_expect(fabs(eff / 0.4 - 1) <= 0.005, "efficiency %g", eff);
}

/* On the shipped table (Llama-2-70B, H100, tp 8): the stock roofline is 2.45x (prefill) and 3.90x (decode)
   optimistic; calibrated, the median error per phase is within 15% and the worst within 40%. */
Test(roofline_fit, shrinks_error_on_splitwise_table)
{
    kv_model_card m;
    kv_device_profile d;
    cards(&m, &d);
    kv_timing t;
    kv_timing_init(&t, &m, &d, 8);
    kv_error err = {0};
    kv_profile *p = NULL;
    cr_assert_eq(kv_profile_load(TABLE, "llama2-70b", "h100-80gb", 8, NULL, &p, &err), KV_OK, "%s", err.msg);
    for (int decode = 0; decode < 2; decode++) {
        size_t n = kv_profile_point_count(p, decode);
        double *model = calloc(n, sizeof *model), *table = calloc(n, sizeof *table), *e = calloc(n, sizeof *e);
        double before = 0, after = 0;
        for (size_t i = 0; i < n; i++) {
            double b, x;
            kv_profile_point(p, decode, i, &b, &x, &table[i]);
            model[i] = roofline(&t, decode, b, x);
            before += log(table[i] / model[i]);
        }
        double fl, eff;
        kv_timing_fit_phase(model, table, n, &fl, &eff);
        kv_timing c = t;
        c.step_floor_s[decode] = fl;
        c.step_efficiency[decode] = eff;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double b, x, tab;
            kv_profile_point(p, decode, i, &b, &x, &tab);
            double r = log(tab / roofline(&c, decode, b, x));
            after += r;
            e[i] = fabs(r);
            worst = fmax(worst, e[i]);
        }
        before /= n;
        after /= n;
        cr_expect(exp(before) > 2.3, "%s: stock geometric-mean ratio %.3f", decode ? "decode" : "prefill",
                  exp(before));
        cr_expect(fabs(after) < 0.05, "%s: calibrated geometric-mean ratio %.3f", decode ? "decode" : "prefill",
                  exp(after));
        size_t below = 0;
        for (size_t i = 0; i < n; i++)
            below += e[i] <= log(1.15);
        cr_expect(below * 2 >= n, "%s: median error above 15%% (%zu of %zu within)", decode ? "decode" : "prefill",
                  below, n);
        cr_expect(worst <= log(1.4), "%s: worst error %.3f", decode ? "decode" : "prefill", exp(worst));
        free(model);
        free(table);
        free(e);
    }
    kv_profile_destroy(p);
    kv_model_card_free(&m);
    kv_device_profile_free(&d);
}
