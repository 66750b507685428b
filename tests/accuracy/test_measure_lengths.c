/* test_measure_lengths.c — statistics measured at several prompt lengths (#20).
 *
 * On the tiny fixture model: DiffKV tables of several lengths from one pass are the tables of separate
 * passes; a short text is joined with the next; a Lynx curve gives at each length the rates of that length
 * measured alone; the reference-model mode measures up to 4 lengths spanning the workload. On the real
 * model: a subset of the shipped scenarios/stats/smollm2-135m.json measured again gives the same numbers,
 * and its DiffKV tier shares differ between 1K and 8K prompts. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/accuracy/diffkv_scores.h"
#include "core/accuracy/feed_lynx.h"
#include "core/accuracy/model_stats.h"
#include "core/config/scenario.h"
#include "core/policy/policy_spec.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

#define SHIPPED KV_SOURCE_DIR "/scenarios/stats/smollm2-135m.json"

typedef struct env {
    char *dir, *model, *text;
} env;

static env setup(void)
{
    env e;
    e.dir = kvt_tempdir();
    e.model = kvt_tiny_model_file(e.dir, 3);
    e.text = kvt_tiny_model_text(e.dir);
    cr_assert(e.model && e.text);
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", e.dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    return e;
}

/* A fresh, empty cache folder, so that the next measurement really measures. */
static void fresh_cache(const env *e, const char *name)
{
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/%s", e->dir, name);
    setenv("KVSIM_CACHE_DIR", cache, 1);
}

static void teardown(env *e)
{
    kvt_rmtree(e->dir);
    free(e->dir);
    free(e->model);
    free(e->text);
    unsetenv("KVSIM_CACHE_DIR");
}

static size_t table_rows(const kv_diffkv_table *t)
{
    return (size_t)t->layers * (size_t)t->kv_heads * KV_DIFFKV_TABLE_POINTS;
}

Test(measure_lengths, diffkv_tables_of_one_pass_are_those_of_separate_passes, .timeout = 300)
{
    env e = setup();
    const char *texts[] = {e.text};
    int both[] = {48, 96}, shorter[] = {48}, longer[] = {96};
    kv_diffkv_measured curve, a, b;
    kv_error err = {0};
    cr_assert_eq(kv_diffkv_scores_curve(e.model, texts, 1, both, 2, 16, NULL, &curve, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(curve.curve.n_lengths, 2);
    cr_expect(curve.curve.lengths[0] == 48 && curve.curve.lengths[1] == 96 && curve.curve.window == 16);
    fresh_cache(&e, "cache2");
    cr_assert_eq(kv_diffkv_scores_curve(e.model, texts, 1, shorter, 1, 16, NULL, &a, NULL, &err), 0, "%s", err.msg);
    fresh_cache(&e, "cache3");
    bool cached = true;
    cr_assert_eq(kv_diffkv_scores_curve(e.model, texts, 1, longer, 1, 16, NULL, &b, &cached, &err), 0, "%s", err.msg);
    cr_expect(!cached, "measured, not read from a cache");
    size_t rows = table_rows(&a.table);
    cr_assert_eq(rows, table_rows(&curve.curve.table[0]));
    cr_expect(memcmp(curve.curve.table[0].z_prefill, a.table.z_prefill, rows * sizeof(double)) == 0 &&
                  memcmp(curve.curve.table[0].z_exit, a.table.z_exit, rows * sizeof(double)) == 0,
              "the 48-token tables of a 96-token pass are those of a 48-token pass");
    cr_expect(memcmp(curve.curve.table[1].z_prefill, b.table.z_prefill, rows * sizeof(double)) == 0 &&
                  memcmp(curve.curve.table[1].z_exit, b.table.z_exit, rows * sizeof(double)) == 0,
              "and its 96-token tables those of a 96-token pass");
    cr_expect(memcmp(curve.curve.table[0].z_prefill, curve.curve.table[1].z_prefill, rows * sizeof(double)) != 0,
              "the two lengths' tables differ");
    /* A second call reads both lengths from the cache: the same numbers. */
    fresh_cache(&e, "cache");
    kv_diffkv_measured again;
    cr_assert_eq(kv_diffkv_scores_curve(e.model, texts, 1, both, 2, 16, NULL, &again, &cached, &err), 0, "%s",
                 err.msg);
    cr_expect(cached);
    cr_expect(memcmp(again.z, curve.z, 2 * 2 * rows * sizeof(double)) == 0);
    kv_diffkv_measured_free(&curve);
    kv_diffkv_measured_free(&a);
    kv_diffkv_measured_free(&b);
    kv_diffkv_measured_free(&again);
    teardown(&e);
}

Test(measure_lengths, a_short_text_continues_with_the_next, .timeout = 300)
{
    env e = setup();
    char *short_text = kvt_write(e.dir, "short.txt", "A short text of a few words.\n");
    const char *alone[] = {short_text}, *joined[] = {short_text, e.text};
    int n = 64;
    kv_diffkv_measured m;
    kv_error err = {0};
    cr_expect_eq(kv_diffkv_scores_curve(e.model, alone, 1, &n, 1, 16, NULL, &m, NULL, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "short.txt") != NULL, "%s", err.msg);
    cr_assert_eq(kv_diffkv_scores_curve(e.model, joined, 2, &n, 1, 16, NULL, &m, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(m.curve.n_lengths, 1);
    kv_diffkv_measured_free(&m);
    free(short_text);
    teardown(&e);
}

/* 8 = 4 + 4 for every (layer, KV head) of the tiny model. */
static kv_encoding *tiny_lynx_encodings(const env *e)
{
    kv_model_config c;
    kv_error err = {0};
    cr_assert_eq(kv_model_read_config(e->model, &c, &err), 0, "%s", err.msg);
    kv_encoding one;
    cr_assert_eq(kv_encoding_parse("k=int8a4g16,v=int8a4g16", &one, &err), 0, "%s", err.msg);
    size_t lanes = (size_t)c.n_layers * (size_t)c.n_kv_heads;
    kv_encoding *enc = kv_calloc(lanes, sizeof *enc);
    for (size_t i = 0; i < lanes; i++)
        enc[i] = one;
    return enc;
}

Test(measure_lengths, a_lynx_curve_gives_each_length_its_own_rates, .timeout = 300)
{
    env e = setup();
    kv_encoding *enc = tiny_lynx_encodings(&e);
    kv_eval_policy p = {"a4", enc, 3};
    int both[] = {96, 192}, longer[] = {192};
    kv_accept_curve c2, c1;
    kv_error err = {0};
    cr_assert_eq(kv_feed_lynx_curves(e.model, &p, 1, both, 2, 8, NULL, &c2, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(c2.n_lengths, 2);
    cr_expect(c2.lengths[0] == 96 && c2.lengths[1] == 192 && c2.positions == 3);
    cr_expect(c2.samples[0] == 8 && c2.samples[1] == 8, "8 speculations at each length (2 per text)");
    fresh_cache(&e, "cache2");
    bool cached = true;
    cr_assert_eq(kv_feed_lynx_curves(e.model, &p, 1, longer, 1, 8, NULL, &c1, &cached, &err), 0, "%s", err.msg);
    cr_expect(!cached);
    for (int j = 0; j < 3; j++)
        cr_expect_eq(c2.accept[1][j], c1.accept[0][j], "position %d: the 192-token rates of the curve are those "
                                                        "of 192 alone", j);
    /* Out of range: a length past the context less k + 1, lengths not increasing, too many samples. */
    int past[] = {KVT_TINY_CTX - 3}, down[] = {192, 96};
    cr_expect_eq(kv_feed_lynx_curves(e.model, &p, 1, past, 1, 8, NULL, &c1, NULL, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "context") != NULL, "%s", err.msg);
    cr_expect_eq(kv_feed_lynx_curves(e.model, &p, 1, down, 2, 8, NULL, &c1, NULL, &err), KV_EINPUT);
    cr_expect_eq(kv_feed_lynx_curves(e.model, &p, 1, both, 2, 256, NULL, &c1, NULL, &err), KV_EINPUT);
    kv_free(enc);
    teardown(&e);
}

Test(measure_lengths, reference_mode_measures_lengths_spanning_the_workload, .timeout = 300)
{
    env e = setup();
    char text[2048];
    snprintf(text, sizeof text,
             "name: span\nmodel: llama-3-8b\nseed: 2\nnetwork: {model: ideal, nic_bandwidth_gbps: 100}\n"
             "workload: {requests: 40, prompt: {dist: uniform, min: 64, max: 400}, output: {dist: fixed, value: 8}}\n"
             "accuracy: {model: %s}\nlynx: {samples: 16, max_prompt_tokens: 300}\n"
             "policies: [a4]\npolicy:\n  a4: {file: policies/lynx.lua, speculate: 3}\n",
             e.model);
    char *path = kvt_write(e.dir, "span.yaml", text);
    kv_scenario *s = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_scenario_load(path, NULL, 0, &s, &err), 0, "%s", err.msg);
    kv_policy_spec spec;
    kv_policy *pol = NULL;
    cr_assert_eq(kv_policy_spec_read(s, 0, &spec, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_policy_spec_load(&spec, s, &pol, &err), 0, "%s", err.msg);
    kv_policy_spec_free(&spec);
    int prompts[40];
    for (int i = 0; i < 40; i++)
        prompts[i] = 64 + i * 8; /* 64..376 */
    kv_feed_acceptance a;
    cr_assert_eq(kv_feed_acceptance_measure(s, &pol, 1, prompts, 40, NULL, &a, &err), 0, "%s", err.msg);
    const kv_accept_curve *c = &a.curve;
    /* The workload at 0, 1/3, 2/3 and 1: 64, 168, 272 and 376, clamped to 300. */
    cr_assert_eq(c->n_lengths, 4, "16 samples: 4 lengths of 4");
    cr_expect_eq(c->lengths[0], 64, "the shortest prompt");
    cr_expect(c->lengths[1] == 168 && c->lengths[2] == 272, "the thirds: %d %d", c->lengths[1], c->lengths[2]);
    cr_expect_eq(c->lengths[3], 300, "the longest, clamped to lynx.max_prompt_tokens");
    long total = 0;
    for (int i = 0; i < 4; i++)
        total += c->samples[i];
    cr_expect_eq(total, 16);
    cr_expect_eq(a.speculations, 16);
    cr_expect(strstr(a.source, "prompt lengths 64, 168, 272, 300 tokens") != NULL && strstr(a.source, "clamped to 300"),
              "%s", a.source);
    /* The pooled rate of the first position is the samples-weighted mean of the lengths'. */
    double pooled = 0;
    for (int i = 0; i < 4; i++)
        pooled += (double)c->samples[i] * c->accept[i][0] / 16.0;
    cr_expect(fabs(pooled - a.accept_conditional[0]) < 1e-12, "%g vs %g", pooled, a.accept_conditional[0]);
    kv_policy_destroy(pol);
    kv_scenario_destroy(s);
    free(path);
    teardown(&e);
}

/* ---- The real model and the shipped file ------------------------------------------------------------ */

static const kv_stats_diffkv *shipped_diffkv(kv_model_stats *st)
{
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(SHIPPED, st, &err), 0, "%s", err.msg);
    cr_assert_geq(st->n_diffkv, 1);
    return &st->diffkv[0];
}

/* The shipped 1,024-token DiffKV tables measured again on the first text alone (the shipped measurement
   runs one pass over the texts in order; 1,024 tokens lie within the first): the same numbers. Exactly
   on the kind of CPU that measured them (the forward pass is deterministic and a shorter pass gives the
   prefix's tables; diffkv_tables_of_one_pass_are_those_of_separate_passes checks that on any CPU). On
   another, OpenBLAS picks another sgemm kernel for the core, which sums in another order: measured on
   an AMD Zen 3 against the shipped (AVX-512 Intel) tables, 1.1e-3 at most; 1e-2 allowed. */
#define CROSS_CPU_TABLE_DRIFT 1e-2
Test(measure_lengths, the_shipped_diffkv_tables_at_1024_measure_again_the_same, .timeout = 1200)
{
    kv_model_stats st;
    const kv_stats_diffkv *d = shipped_diffkv(&st);
    int at = -1;
    for (int i = 0; i < d->curve.n_lengths; i++)
        if (d->curve.lengths[i] == 1024)
            at = i;
    cr_assert_geq(at, 0, "the shipped file has DiffKV at 1024 tokens");
    char reason[512];
    char *model = kvt_real_model(reason, sizeof reason);
    if (!model) {
        kv_model_stats_free(&st);
        KVT_MODEL_MISSING(reason);
    }
    char *dir = kvt_tempdir();
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    const char *const *texts = NULL;
    cr_assert_geq(kv_feed_lynx_texts(&texts), 1);
    int n = 1024;
    kv_diffkv_measured m;
    kv_error err = {0};
    bool cached = true;
    cr_assert_eq(kv_diffkv_scores_curve(model, texts, 1, &n, 1, d->curve.window, NULL, &m, &cached, &err), 0, "%s",
                 err.msg);
    cr_expect(!cached);
    size_t rows = table_rows(&m.table);
    cr_assert_eq(rows, table_rows(&d->curve.table[at]));
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double x = fabs(m.table.z_prefill[r] - d->curve.table[at].z_prefill[r]);
        double y = fabs(m.table.z_exit[r] - d->curve.table[at].z_exit[r]);
        worst = fmax(worst, fmax(x, y));
    }
    cr_log_info("re-measured tables differ from the shipped ones by up to %g", worst);
    cr_expect(worst <= CROSS_CPU_TABLE_DRIFT, "re-measured tables differ from the shipped ones by up to %g", worst);
    kv_diffkv_measured_free(&m);
    kv_model_stats_free(&st);
    kvt_rmtree(dir);
    free(dir);
    free(model);
    unsetenv("KVSIM_CACHE_DIR");
}

/* Tier shares of a table with DiffKV's default thresholds (policies/diffkv.lua: alpha_h = 1, alpha_l = 0.02),
   at the window exit (the decision of decode) and at the end of prefill, averaged over the heads. */
static void tier_shares(const kv_diffkv_table *t, double *high_exit, double *pruned_exit, double *high_prefill,
                        double *pruned_prefill)
{
    int rows = t->layers * t->kv_heads;
    *high_exit = *pruned_exit = *high_prefill = *pruned_prefill = 0;
    for (int r = 0; r < rows; r++) {
        const double *qe = t->z_exit + (size_t)r * KV_DIFFKV_TABLE_POINTS;
        const double *qp = t->z_prefill + (size_t)r * KV_DIFFKV_TABLE_POINTS;
        *high_exit += (1 - kv_diffkv_table_cdf(qe, 1.0)) / rows;
        *pruned_exit += kv_diffkv_table_cdf(qe, 0.02) / rows;
        *high_prefill += (1 - kv_diffkv_table_cdf(qp, 1.0)) / rows;
        *pruned_prefill += kv_diffkv_table_cdf(qp, 0.02) / rows;
    }
}

/* The test: on the same model, DiffKV's tier shares depend on the context length, 1K against 8K
   prompts (SmolLM2's trained context). What the measurement shows
   (docs/diffkv.md "Tiers by context length"): z = L x the mean probability a token receives grows with L
   for the tokens that matter (attention does not spread its mass over a longer context evenly), so with
   thresholds in units of 1/L more tokens stay high, and fewer are pruned, at the longer context. */
Test(measure_lengths, diffkv_tier_shares_depend_on_the_context_length)
{
    kv_model_stats st;
    const kv_stats_diffkv *d = shipped_diffkv(&st);
    int lo = -1, hi = d->curve.n_lengths - 1;
    for (int i = 0; i < d->curve.n_lengths; i++) {
        if (d->curve.lengths[i] == 1024)
            lo = i;
        if (d->curve.lengths[i] == 8192)
            hi = i;
    }
    cr_assert(lo >= 0 && d->curve.lengths[hi] == 8192, "the shipped file has DiffKV at 1024 and at 8192 tokens");
    double h1, p1, hp1, pp1, h8, p8, hp8, pp8;
    tier_shares(&d->curve.table[lo], &h1, &p1, &hp1, &pp1);
    tier_shares(&d->curve.table[hi], &h8, &p8, &hp8, &pp8);
    int n8 = d->curve.lengths[hi];
    fprintf(stderr, "diffkv tiers at the window exit: 1024: high %.4f pruned %.4f; %d: high %.4f pruned %.4f\n", h1,
            p1, n8, h8, p8);
    fprintf(stderr, "diffkv tiers at the end of prefill: 1024: high %.4f pruned %.4f; %d: high %.4f pruned %.4f\n",
            hp1, pp1, n8, hp8, pp8);
    cr_expect(h8 > h1 + 0.01, "more tokens stay high at %d than at 1024 (window exit): %.4f vs %.4f", n8, h8, h1);
    cr_expect(p8 < p1, "fewer are pruned at %d (window exit): %.4f vs %.4f", n8, p8, p1);
    cr_expect(hp8 > hp1 + 0.01, "and at the end of prefill: %.4f vs %.4f", hp8, hp1);
    kv_model_stats_free(&st);
}
