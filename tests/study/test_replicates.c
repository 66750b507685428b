/* test_replicates.c — kvsim run --seeds N (and `replicates: N`): each metric's mean is the mean of the N
   single-seed runs and its Student-t 95% interval is right and holds them; N = 1 writes today's bytes. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/jsonread.h"
#include "core/report/replicates.h"
#include "tests/support.h"

#define SMALL "tests/fixtures/scenarios/capacity-small.yaml"

/* kvsim run SMALL FLAGS --out DIR/name --quiet; returns results.json parsed. */
static kv_jvalue *run(const char *dir, const char *name, const char *flags)
{
    char *path = kvt_source(SMALL), *args = NULL, *out = NULL;
    cr_assert(asprintf(&args, "run '%s' %s --out '%s/%s' --quiet", path, flags, dir, name) > 0);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "%s: %s", args, out);
    char *sub = kvt_path(dir, name), *res = kvt_path(sub, "results.json");
    kv_jvalue *root = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_jread_file(res, &root, &err), 0, "%s", err.msg);
    free(sub);
    free(res);
    free(out);
    free(args);
    free(path);
    return root;
}

static const kv_jvalue *policy(const kv_jvalue *root, size_t i)
{
    const kv_jvalue *p = kv_jvalue_get(root, "policies");
    cr_assert(p && p->kind == KV_JARRAY && p->count > i);
    return p->items[i];
}

Test(replicates, mean_is_the_mean_of_single_seed_runs_and_the_ci_holds_them)
{
    char *dir = kvt_tempdir();
    kv_jvalue *rep = run(dir, "rep", "--seeds 3");
    kv_jvalue *one[3];
    for (int k = 0; k < 3; k++) {
        char flags[32], name[16];
        snprintf(flags, sizeof flags, "--seed %d", k + 1);
        snprintf(name, sizeof name, "s%d", k + 1);
        one[k] = run(dir, name, flags);
    }
    for (size_t p = 0; p < 2; p++) {
        const kv_jvalue *r = kv_jvalue_get(policy(rep, p), "replicates");
        cr_assert(r && r->kind == KV_JOBJECT, "no replicates object");
        cr_expect_eq(kv_jvalue_get(r, "n")->number, 3);
        const kv_jvalue *seeds = kv_jvalue_get(r, "seeds");
        cr_assert(seeds && seeds->count == 3);
        for (int k = 0; k < 3; k++)
            cr_expect_eq(seeds->items[k]->number, k + 1);
        const kv_jvalue *mean = kv_jvalue_get(r, "mean"), *ci = kv_jvalue_get(r, "ci95");
        cr_assert(mean && ci && mean->count == ci->count);
        size_t checked = 0, varied = 0;
        for (size_t m = 0; m < mean->count; m++) {
            const char *key = mean->keys[m];
            double x[3];
            int null = 0;
            for (int k = 0; k < 3; k++) {
                const kv_jvalue *v = kv_jvalue_get(policy(one[k], p), key);
                cr_assert(v, "seed %d lacks %s", k + 1, key);
                null |= v->kind != KV_JNUMBER;
                x[k] = v->kind == KV_JNUMBER ? v->number : NAN;
            }
            if (null) {
                cr_expect_eq(mean->items[m]->kind, KV_JNULL, "%s", key);
                continue;
            }
            double want = (x[0] + x[1] + x[2]) / 3;
            double sd = sqrt(((x[0] - want) * (x[0] - want) + (x[1] - want) * (x[1] - want) +
                              (x[2] - want) * (x[2] - want)) / 2);
            double got = mean->items[m]->number, half = ci->items[m]->number;
            cr_expect(fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)), "%s: mean %.17g, want %.17g", key, got, want);
            cr_expect(fabs(half - 4.302652730 * sd / sqrt(3.0)) <= 1e-9 * fmax(1.0, half), "%s: ci %.17g", key, half);
            for (int k = 0; k < 3; k++)
                cr_expect(x[k] >= got - half - 1e-9 && x[k] <= got + half + 1e-9, "%s: seed %d outside", key, k + 1);
            checked++;
            varied += half > 0;
        }
        cr_expect(checked > 40, "%zu metrics", checked);
        cr_expect(varied > 10, "seeds change the results: %zu metrics varied", varied);
        /* The entry's own fields stay those of the first seed (with its requests.csv). */
        cr_expect_eq(kv_jvalue_get(policy(rep, p), "mean_ttft_ms")->number,
                     kv_jvalue_get(policy(one[0], p), "mean_ttft_ms")->number);
    }
    kv_jvalue_free(rep);
    for (int k = 0; k < 3; k++)
        kv_jvalue_free(one[k]);
    kvt_rmtree(dir);
    free(dir);
}

Test(replicates, one_seed_writes_todays_bytes)
{
    char *dir = kvt_tempdir();
    kv_jvalue_free(run(dir, "plain", ""));
    kv_jvalue_free(run(dir, "one", "--seeds 1"));
    kv_jvalue_free(run(dir, "key", "--set replicates=1"));
    const char *files[] = {"results.json", "requests.csv"};
    for (int f = 0; f < 2; f++) {
        char *a = NULL, *b = NULL, *c = NULL;
        cr_assert(asprintf(&a, "%s/plain/%s", dir, files[f]) > 0 && asprintf(&b, "%s/one/%s", dir, files[f]) > 0 &&
                  asprintf(&c, "%s/key/%s", dir, files[f]) > 0);
        char *ta = kvt_read(a, NULL), *tb = kvt_read(b, NULL), *tc = kvt_read(c, NULL);
        cr_assert(ta && tb && tc);
        cr_expect(!strstr(ta, "replicates"));
        cr_expect_str_eq(ta, tb, "%s", files[f]);
        if (f == 1) /* results.json lists the --set values: only requests.csv can match the key's run */
            cr_expect_str_eq(ta, tc, "%s", files[f]);
        free(ta);
        free(tb);
        free(tc);
        free(a);
        free(b);
        free(c);
    }
    kvt_rmtree(dir);
    free(dir);
}

Test(replicates, scenario_key_and_table)
{
    char *path = kvt_source(SMALL), *args = NULL, *out = NULL;
    cr_assert(asprintf(&args, "run '%s' --set replicates=2", path) > 0);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    cr_expect(strstr(out, "seeds 1..2 (2 runs)") && strstr(out, "\xc2\xb1") && strstr(out, "t = 12.706"), "%s", out);
    free(out);
    free(args);
    /* --seeds beats the key; bad values exit 2 naming the flag or key. */
    cr_assert(asprintf(&args, "run '%s' --set replicates=2 --seeds 0", path) > 0);
    cr_expect_eq(kvt_kvsim(args, &out), 2);
    cr_expect(strstr(out, "--seeds"), "%s", out);
    free(out);
    free(args);
    cr_assert(asprintf(&args, "run '%s' --set replicates=0", path) > 0);
    cr_expect_eq(kvt_kvsim(args, &out), 2);
    cr_expect(strstr(out, "replicates"), "%s", out);
    free(out);
    free(args);
    cr_assert(asprintf(&args, "run '%s' --seed 2147483647 --seeds 2", path) > 0);
    cr_expect_eq(kvt_kvsim(args, &out), 2);
    cr_expect(strstr(out, "--seeds") && strstr(out, "2147483647"), "%s", out);
    free(out);
    free(args);
    free(path);
}

Test(replicates, t_quantiles_and_interval)
{
    cr_expect(fabs(kv_replicates_t975(1) - 12.7062) < 1e-4);
    cr_expect(fabs(kv_replicates_t975(9) - 2.2622) < 1e-4);
    cr_expect(fabs(kv_replicates_t975(29) - 2.0452) < 1e-4);
    cr_expect(fabs(kv_replicates_t975(30) - 1.96) < 1e-3); /* n > 30: the normal quantile */
    for (int d = 2; d < 40; d++) /* decreasing over the table, then the normal quantile */
        cr_expect(d < 30 ? kv_replicates_t975(d) < kv_replicates_t975(d - 1)
                         : kv_replicates_t975(d) == kv_replicates_t975(30), "dof %d", d);
    const double x[] = {1, 2, 3, 4};
    double m, ci;
    kv_replicates_mean_ci(x, 4, &m, &ci);
    cr_expect_eq(m, 2.5);
    cr_expect(fabs(ci - 3.182446305 * sqrt(5.0 / 3.0) / 2.0) < 1e-12, "%.17g", ci);
    kv_replicates_mean_ci(x, 1, &m, &ci);
    cr_expect(m == 1 && ci == 0);
}
