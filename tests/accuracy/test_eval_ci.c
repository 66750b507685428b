/* test_eval_ci.c — the 95% intervals of kvsim eval: Wilson and Student-t unit checks (core/base/ci.h), and on
 * the tiny random model that each interval holds its estimate and the delta-perplexity one narrows with more
 * scored tokens. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/ci.h"
#include "core/accuracy/eval.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

Test(eval_ci, wilson_known_values)
{
    double lo, hi;
    /* 8 of 10: the textbook Wilson interval (z = 1.96) is [0.4902, 0.9433]. */
    kv_ci_wilson(8, 10, &lo, &hi);
    cr_assert(fabs(lo - 0.4902) < 1e-4 && fabs(hi - 0.9433) < 1e-4, "[%f, %f]", lo, hi);
    /* 0 of 10 and 10 of 10: exact ends, the other end 0.2775 away. */
    kv_ci_wilson(0, 10, &lo, &hi);
    cr_assert(lo == 0.0 && fabs(hi - 0.2775) < 1e-4, "[%f, %f]", lo, hi);
    kv_ci_wilson(10, 10, &lo, &hi);
    cr_assert(hi == 1.0 && fabs(lo - 0.7225) < 1e-4, "[%f, %f]", lo, hi);
    /* Symmetric around 1/2, narrower with more trials, always inside [0, 1] and around k/n. */
    kv_ci_wilson(50, 100, &lo, &hi);
    cr_assert(fabs((lo + hi) / 2 - 0.5) < 1e-12);
    double lo2, hi2;
    kv_ci_wilson(500, 1000, &lo2, &hi2);
    cr_assert(hi2 - lo2 < hi - lo);
    for (long n = 1; n <= 40; n++)
        for (long k = 0; k <= n; k++) {
            kv_ci_wilson(k, n, &lo, &hi);
            double p = (double)k / (double)n;
            cr_assert(lo >= 0 && hi <= 1 && lo <= p && p <= hi && lo < hi, "%ld/%ld: [%f, %f]", k, n, lo, hi);
        }
    kv_ci_wilson(0, 0, &lo, &hi);
    cr_assert(isnan(lo) && isnan(hi));
    kv_ci_wilson(3, 2, &lo, &hi);
    cr_assert(isnan(lo) && isnan(hi));
}

Test(eval_ci, student_t)
{
    cr_assert(fabs(kv_ci_t975(1) - 12.706) < 1e-3);
    cr_assert(fabs(kv_ci_t975(10) - 2.228) < 1e-3);
    cr_assert(fabs(kv_ci_t975(1000) - 1.95996) < 1e-5);
    cr_assert(isnan(kv_ci_t975(0)));
    /* 1..5: mean 3, s = sqrt(2.5), half-width t(4) s / sqrt(5) = 2.776445 * 0.707107. */
    double x[] = {1, 2, 3, 4, 5}, m, h;
    kv_ci_mean(x, 5, &m, &h);
    cr_assert(m == 3.0 && fabs(h - 2.776445105 * sqrt(0.5)) < 1e-9, "%f ± %f", m, h);
    kv_ci_mean(x, 1, &m, &h);
    cr_assert(m == 1.0 && h == 0.0);
    kv_ci_mean(x, 0, &m, &h);
    cr_assert(isnan(m) && isnan(h));
}

/* The tiny model evaluated with int4 and a Lynx policy against bf16, score_tokens scored per text. */
static kv_eval_result *run_tiny(kv_model *m, const char *text, int score_tokens)
{
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0}, i4 = {KV_TENSOR_INT, 4, 0, 16, 0}, ly = {KV_TENSOR_INT, 8, 4, 16, 0};
    kv_encoding *e_bf = kvt_uniform_encodings(m, (kv_encoding){.key = bf, .value = bf});
    kv_encoding *e_i4 = kvt_uniform_encodings(m, (kv_encoding){.key = i4, .value = i4});
    kv_encoding *e_ly = kvt_uniform_encodings(m, (kv_encoding){.key = ly, .value = ly});
    kv_eval_policy pols[] = {{"bf16", e_bf, 0}, {"int4", e_i4, 0}, {"lynx", e_ly, 4}};
    const char *texts[] = {text};
    kv_eval_config cfg = {texts, 1, 48, score_tokens, 6, 2, 160, 0, 3, 7, NULL};
    kv_eval_result *r;
    kv_error err;
    cr_assert_eq(kv_eval_run(m, &cfg, pols, 3, &r, &err), KV_OK, "%s", err.msg);
    kv_free(e_bf);
    kv_free(e_i4);
    kv_free(e_ly);
    return r;
}

static void expect_inside(const char *what, double v, const double ci[2])
{
    cr_assert(!isnan(v) && !isnan(ci[0]) && !isnan(ci[1]), "%s: %f [%f, %f]", what, v, ci[0], ci[1]);
    cr_assert(ci[0] <= v && v <= ci[1], "%s: %f outside [%f, %f]", what, v, ci[0], ci[1]);
}

Test(eval_ci, tiny_model_intervals_hold_the_estimate_and_narrow)
{
    char *dir = kvt_tempdir();
    char *model_path = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_eval_result *small = run_tiny(m, text, 64), *large = run_tiny(m, text, 448);
    double width[2];
    for (int pass = 0; pass < 2; pass++) {
        const kv_eval_result *r = pass ? large : small;
        const kv_eval_row *ref = &r->rows[r->reference_row];
        cr_assert_str_eq(r->rows[1].name, "int4");
        const kv_eval_row *i4 = &r->rows[1], *ly = &r->rows[2];
        cr_assert_eq(i4->n_blocks, pass ? 14 : 2, "blocks of %d tokens", KV_EVAL_BLOCK_TOKENS);
        double v, ci[2];
        kv_eval_row_delta_ppl(i4, ref, &v, ci);
        expect_inside("int4 delta ppl", v, ci);
        cr_assert(ci[1] > ci[0]);
        width[pass] = ci[1] - ci[0];
        /* The estimate is the same figure as before: ppl(int4) - ppl(bf16). */
        cr_assert(fabs(v - (kv_eval_row_ppl(i4) - kv_eval_row_ppl(ref))) < 1e-12);
        kv_eval_row_delta_ppl(ref, ref, &v, ci);
        cr_assert(v == 0 && ci[0] == 0 && ci[1] == 0);
        kv_eval_row_top1(i4, &v, ci);
        expect_inside("int4 top1", v, ci);
        kv_eval_row_greedy(i4, &v, ci);
        expect_inside("int4 greedy", v, ci);
        kv_eval_row_needle(i4, &v, ci);
        expect_inside("int4 needle", v, ci);
        for (int j = 1; j <= ly->spec_k; j++) {
            kv_eval_row_accept_ci(ly, j, ci);
            expect_inside("lynx acceptance", kv_eval_row_accept(ly, j), ci);
        }
        kv_eval_row_accepted_share(ly, &v, ci);
        expect_inside("lynx accepted share", v, ci);
        /* The share is the mean of the per-position rates (sum over j of P(at least j accepted)) / k. */
        double sum = 0;
        for (int j = 1; j <= ly->spec_k; j++)
            sum += kv_eval_row_accept(ly, j);
        cr_assert(fabs(v - sum / ly->spec_k) < 1e-12);
    }
    cr_assert(width[1] < width[0], "448 scored tokens give [%g] wide, 64 give [%g]", width[1], width[0]);
    kv_eval_result_destroy(small);
    kv_eval_result_destroy(large);
    kv_model_destroy(m);
    free(model_path);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}
