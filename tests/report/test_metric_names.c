/* test_metric_names.c — results.json carries the names vLLM's benchmark users read (mean_/std_/median_/
 * p90_/p99_ of ttft_ms, tpot_ms, itl_ms, e2el_ms; completed, duration, request_throughput,
 * output_throughput, total_input_tokens, total_output_tokens, total_token_throughput), each equal to
 * what requests.csv gives when recomputed here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/jsonread.h"
#include "tests/support.h"

static double num(const kv_jvalue *o, const char *key)
{
    const kv_jvalue *v = kv_jvalue_get(o, key);
    cr_assert(v, "results.json's policy entry has no %s", key);
    return v->kind == KV_JNUMBER ? strtod(v->text, NULL) : NAN;
}

/* Column index of name in a CSV header line. */
static int column(const char *header, const char *name)
{
    char *h = strdup(header);
    int at = -1, i = 0;
    for (char *save = NULL, *f = strtok_r(h, ",\n", &save); f; f = strtok_r(NULL, ",\n", &save), i++)
        if (strcmp(f, name) == 0)
            at = i;
    free(h);
    cr_assert(at >= 0, "requests.csv has no %s", name);
    return at;
}

static const char *field(const char *line, int at, char *buf, size_t size)
{
    for (int i = 0; i < at && line; i++)
        line = strchr(line, ',') ? strchr(line, ',') + 1 : NULL;
    cr_assert(line);
    size_t n = strcspn(line, ",\n");
    snprintf(buf, size, "%.*s", (int)(n < size ? n : size - 1), line);
    return buf;
}

Test(metric_names, vllm_names_in_results_json_match_requests_csv, .timeout = 120)
{
    char *dir = kvt_tempdir(), *scen = kvt_source("tests/fixtures/scenarios/capacity-small.yaml");
    char *args = NULL, *out = NULL;
    cr_assert(asprintf(&args, "run '%s' --out '%s/r' --quiet", scen, dir) > 0);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    char *jpath = kvt_path(dir, "r/results.json"), *cpath = kvt_path(dir, "r/requests.csv");
    kv_jvalue *root = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_jread_file(jpath, &root, &err), 0, "%s", err.msg);
    const kv_jvalue *pols = kv_jvalue_get(root, "policies");
    cr_assert(pols && pols->kind == KV_JARRAY && pols->count > 0);
    const char *metrics[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"};
    const char *stats[] = {"mean_", "std_", "median_", "p90_", "p99_"};
    char *csv = kvt_read(cpath, NULL);
    const char *body = strchr(csv, '\n') + 1;
    int c_pol = column(csv, "policy"), c_ttft = column(csv, "ttft_ms"), c_in = column(csv, "prompt_tokens"),
        c_out = column(csv, "output_tokens"), c_done = column(csv, "done_s");
    for (size_t p = 0; p < pols->count; p++) {
        const kv_jvalue *o = pols->items[p];
        const char *name = kv_jvalue_get(o, "name")->text;
        for (size_t m = 0; m < 4; m++)
            for (size_t s = 0; s < 5; s++) {
                char key[64];
                snprintf(key, sizeof key, "%s%s", stats[s], metrics[m]);
                cr_expect(isfinite(num(o, key)), "%s: %s is not a number", name, key);
            }
        /* Recompute from requests.csv: the TTFT mean and population std, and the token totals. */
        double sum = 0, sq = 0, in = 0, outt = 0;
        size_t n = 0;
        char buf[128];
        for (const char *line = body; *line; line = strchr(line, '\n') + 1) {
            if (strcmp(field(line, c_pol, buf, sizeof buf), name) != 0 || atof(field(line, c_done, buf, sizeof buf)) < 0)
                continue;
            double t = atof(field(line, c_ttft, buf, sizeof buf));
            sum += t;
            sq += t * t;
            in += atof(field(line, c_in, buf, sizeof buf));
            outt += atof(field(line, c_out, buf, sizeof buf));
            n++;
        }
        cr_assert(n > 1);
        double mean = sum / (double)n, sd = sqrt(fmax(0, sq / (double)n - mean * mean));
        cr_expect(fabs(num(o, "mean_ttft_ms") - mean) <= 1e-6 * mean, "%s: mean_ttft_ms %g, csv %g", name,
                  num(o, "mean_ttft_ms"), mean);
        cr_expect(fabs(num(o, "std_ttft_ms") - sd) <= 1e-4 * sd + 1e-6, "%s: std_ttft_ms %g, csv %g", name,
                  num(o, "std_ttft_ms"), sd);
        cr_expect_eq(num(o, "total_input_tokens"), in, "%s: total_input_tokens", name);
        cr_expect_eq(num(o, "total_output_tokens"), outt, "%s: total_output_tokens", name);
        double dur = num(o, "duration");
        cr_expect(fabs(num(o, "total_token_throughput") - (in + outt) / dur) <= 1e-9 * (in + outt) / dur,
                  "%s: total_token_throughput %g, (in + out) / duration %g", name, num(o, "total_token_throughput"),
                  (in + outt) / dur);
        cr_expect(fabs(num(o, "output_throughput") - outt / dur) <= 1e-9 * outt / dur, "%s: output_throughput",
                  name);
    }
    kv_jvalue_free(root);
    free(csv);
    free(jpath);
    free(cpath);
    free(out);
    free(args);
    free(scen);
    kvt_rmtree(dir);
    free(dir);
}
