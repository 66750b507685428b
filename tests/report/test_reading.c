/* test_reading.c — the table's one-line reading names the right rows and ratios. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/reading.h"

static void row(kv_policy_outcome *o, const char *name, double ttft, double spec, double p99, double ratio,
                double e2el)
{
    memset(o, 0, sizeof *o);
    o->name = name;
    o->summary.ttft_ms.mean = ttft;
    o->summary.ttft_spec_ms.mean = spec;
    o->summary.ttft_ms.p99 = p99;
    o->summary.compression_ratio = ratio;
    o->summary.e2el_ms.mean = e2el;
    o->summary.spec_tokens = isnan(spec) ? 0 : 100;
}

static char *reading(const kv_policy_outcome *o, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    kv_report_reading(f, o, n);
    fclose(f);
    return buf;
}

Test(reading, names_each_winner_against_bf16)
{
    kv_policy_outcome o[3];
    row(&o[0], "int4", 50, NAN, 90, 3.8, 900);
    row(&o[1], "bf16", 100, NAN, 200, 1.0, 1000);
    row(&o[2], "lynx", 80, 40, 120, 2.0, 1100);
    char *t = reading(o, 3);
    cr_expect(strstr(t, "against bf16") != NULL, "%s", t);
    cr_expect(strstr(t, "soonest with lynx (0.40x bf16's mean, speculative)") != NULL, "%s", t);
    cr_expect(strstr(t, "lowest with int4 (0.45x)") != NULL, "%s", t);
    cr_expect(strstr(t, "smallest with int4 (3.80x smaller)") != NULL, "%s", t);
    cr_expect(strstr(t, "finish soonest with int4 (0.90x") != NULL, "%s", t);
    free(t);
}

Test(reading, baseline_is_least_compressed_without_bf16)
{
    kv_policy_outcome o[2];
    row(&o[0], "int4", 50, NAN, 90, 4.0, 900);
    row(&o[1], "int8", 100, NAN, 200, 2.0, 1000);
    char *t = reading(o, 2);
    cr_expect(strstr(t, "against int8") != NULL, "%s", t);
    cr_expect(strstr(t, "int4 leads on every count") != NULL && strstr(t, "KV on the wire 2.00x smaller") != NULL, "%s", t);
    free(t);
}

Test(reading, one_policy_leading_everywhere_is_said_once)
{
    kv_policy_outcome o[2];
    row(&o[0], "bf16", 100, 100, 200, 1.0, 1000);
    row(&o[1], "kivi2", 78, 78, 164, 4.7, 920);
    o[0].summary.spec_tokens = o[1].summary.spec_tokens = 0; /* ttft_spec = ttft without speculation */
    char *t = reading(o, 2);
    cr_expect(strstr(t, "kivi2 leads on every count: first token 0.78x, p99 TTFT 0.82x, KV on the wire 4.70x "
                        "smaller, mean end-to-end latency 0.92x") != NULL, "%s", t);
    free(t);
}

Test(reading, delta_perplexity_of_each_named_policy_when_measured)
{
    kv_policy_outcome o[3];
    row(&o[0], "int4", 50, NAN, 90, 3.8, 900);
    row(&o[1], "bf16", 100, NAN, 200, 1.0, 1000);
    row(&o[2], "lynx", 80, 40, 120, 2.0, 1100);
    kv_acc_figures a4 = {.measured = true, .delta_ppl = 0.848, .delta_ppl_ci95 = {0.221, 1.475}};
    kv_acc_figures al = {.measured = false};
    o[0].accuracy = &a4;
    o[2].accuracy = &al;
    char *t = reading(o, 3);
    cr_expect(strstr(t, "; at a delta perplexity of int4 +0.848 ±0.627 on the reference model\n") != NULL, "%s", t);
    cr_expect(strstr(t, "lynx -") == NULL && strstr(t, "lynx +") == NULL, "lynx is not measured: %s", t);
    free(t);
    /* a measured policy that wins nothing but loses the least accuracy is named once, with its ratio */
    kv_acc_figures a8 = {.measured = true, .delta_ppl = -0.031, .delta_ppl_ci95 = {-0.059, -0.003}};
    kv_policy_outcome p[4];
    memcpy(p, o, sizeof o);
    row(&p[3], "int8", 90, NAN, 180, 1.78, 1050);
    p[3].accuracy = &a8;
    t = reading(p, 4);
    cr_expect(strstr(t, "on the reference model; the least accuracy lost: int8 -0.031 ±0.028 with 1.78x smaller KV\n")
                  != NULL, "%s", t);
    free(t);
}

Test(reading, small_ratios_keep_two_significant_digits)
{
    kv_policy_outcome o[2];
    row(&o[0], "bf16", 1473125.2, NAN, 6810586.27, 1.0, 4332695.3);
    row(&o[1], "diffkv", 2579.85, NAN, 3477.84, 2.95, 1704319.5);
    char *t = reading(o, 2);
    cr_expect(strstr(t, "first token 0.0018x, p99 TTFT 0.00051x, KV on the wire 2.95x smaller, mean end-to-end "
                        "latency 0.39x") != NULL, "%s", t);
    free(t);
}

Test(reading, nothing_for_one_row_or_missing_figures)
{
    kv_policy_outcome o[2];
    row(&o[0], "bf16", 100, NAN, 200, 1.0, 1000);
    char *t = reading(o, 1);
    cr_expect_str_empty(t);
    free(t);
    row(&o[1], "int8", NAN, NAN, NAN, 2.0, NAN);
    row(&o[0], "bf16", NAN, NAN, NAN, 1.0, NAN);
    t = reading(o, 2);
    cr_expect_str_empty(t);
    free(t);
}
