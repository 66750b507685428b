/* test_diffkv_measured.c — the engine's default DiffKV significance: measured on the reference model, cached.
 *
 * Hermetic: the "model" is a file of garbage bytes (loading it would fail), and the cache folder is
 * pre-filled with a known table under the key that model file and the text give. A run that succeeds
 * therefore read the cache and never loaded a model; its tiers follow the table and the alphas.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kv/diffkv.h"
#include "core/accuracy/diffkv_scores.h"
#include "core/study/study.h"
#include "tests/support.h"

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct env {
    char *dir, *models, *cache;
} env;

/* A temp folder with models/<garbage model> and cache/ holding a table of z(u) = 4u^2 (P(z < x) =
   sqrt(x) / 2) in both phases, for 256 tokens and window 64. */
static env setup_env(bool fill)
{
    env e;
    e.dir = kvt_tempdir();
    cr_assert(asprintf(&e.models, "%s/models", e.dir) > 0 && asprintf(&e.cache, "%s/cache", e.dir) > 0);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p %s %s", e.models, e.cache);
    cr_assert_eq(system(cmd), 0);
    free(kvt_write(e.models, MODEL_FILE, "this is not a GGUF file\n"));
    setenv("KVSIM_MODEL_DIR", e.models, 1);
    setenv("KVSIM_CACHE_DIR", e.cache, 1);
    if (fill) {
        char path[4096], key[8192];
        snprintf(path, sizeof path, "%s/%s", e.models, MODEL_FILE);
        kv_error err = {0};
        cr_assert_eq(kv_diffkv_scores_key(path, KV_DIFFKV_SCORES_TEXT, 256, 64, key, sizeof key, &err), 0, "%s",
                     err.msg);
        double *z = malloc(2 * 3 * KV_DIFFKV_TABLE_POINTS * sizeof *z);
        for (int t = 0; t < 2 * 3; t++)
            for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++) {
                double u = (double)k / (KV_DIFFKV_TABLE_POINTS - 1);
                z[t * KV_DIFFKV_TABLE_POINTS + k] = 4 * u * u;
            }
        kv_diffkv_measured m = {.table = {3, 1, z, z + 3 * KV_DIFFKV_TABLE_POINTS}, .z = z, .tokens = 256,
                                .window = 64};
        cr_assert_eq(kv_diffkv_scores_store(key, &m, &err), 0, "%s", err.msg);
        free(z);
    }
    return e;
}

static void teardown_env(env *e)
{
    kvt_rmtree(e->dir);
    free(e->dir);
    free(e->models);
    free(e->cache);
    unsetenv("KVSIM_MODEL_DIR");
    unsetenv("KVSIM_CACHE_DIR");
}

/* Runs scenarios/diffkv.yaml small with the default score model and two extra overrides. */
static void run_default(const char *alpha_high, const char *alpha_low, double *high, double *pruned, char *source,
                        size_t len)
{
    char ah[64], al[64];
    snprintf(ah, sizeof ah, "policy.diffkv.alpha_high=%s", alpha_high);
    snprintf(al, sizeof al, "policy.diffkv.alpha_low=%s", alpha_low);
    const char *sets[] = {"workload.requests=8", "workload.output.min=64", "workload.output.max=128",
                          "policies=[bf16,diffkv]", "diffkv.measure_tokens=256", ah, al};
    kv_error err = {0};
    kv_scenario *s = NULL;
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load("scenarios/diffkv.yaml", sets, 7, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(s->diffkv.scores, KV_DIFFKV_FROM_MEASURED, "the default is %s",
                 kv_diffkv_scores_from_names[s->diffkv.scores]);
    cr_assert_eq(kv_study_prepare(s, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(st, &err), 0, "%s", err.msg);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 2);
    *high = o[1].run.tier_high_fraction;
    *pruned = o[1].run.tier_pruned_fraction;
    snprintf(source, len, "%s", o[1].run.tiers_source);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
}

Test(diffkv_measured, default_reads_the_cache_without_the_model_and_follows_the_alphas)
{
    env e = setup_env(true);
    double h1, p1, h2, p2;
    char src[1024];
    run_default("1", "0.09", &h1, &p1, src, sizeof src);
    cr_expect(strstr(src, "measured on reference model") && strstr(src, "(cache: "), "%s", src);
    run_default("2.25", "0.25", &h2, &p2, src, sizeof src);
    /* Of the tokens outside the window the table gives P(z < 0.09) = 0.15, P(z < 1) = 0.5 and
       P(z < 0.25) = 0.25, P(z < 2.25) = 0.75; the window's tokens (64 of 320-1100 per head) are high,
       so over all tokens pruned is a bit under those shares and high a bit over. */
    cr_expect(p1 > 0.10 && p1 < 0.15, "pruned %.4f (alpha_low 0.09)", p1);
    cr_expect(p2 > 0.18 && p2 < 0.25, "pruned %.4f (alpha_low 0.25)", p2);
    cr_expect(h1 > 0.5 && h1 < 0.62, "high %.4f (alpha_high 1)", h1);
    cr_expect(h2 > 0.25 && h2 < 0.40, "high %.4f (alpha_high 2.25)", h2);
    teardown_env(&e);
}

/* No model and no cache: exit 2 naming the fetch command and the opt-out, no results written; a
   scenario without DiffKV does not need the model. */
Test(diffkv_measured, missing_model_exits_2_with_the_fetch_command_and_the_opt_out)
{
    env e = setup_env(false);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", e.models, MODEL_FILE);
    remove(path);
    char args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "run scenarios/diffkv.yaml --set workload.requests=4 --set workload.output.max=4096 --out %s/out", e.dir);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 2, "rc %d: %s", rc, out);
    cr_expect(strstr(out, "sh scripts/fetch-model.sh") != NULL, "%s", out);
    cr_expect(strstr(out, "diffkv.scores: lognormal") != NULL, "%s", out);
    char res[4200];
    snprintf(res, sizeof res, "%s/out/results.json", e.dir);
    cr_expect_null(kvt_read(res, NULL), "results.json written by a failed run");
    free(out);
    snprintf(args, sizeof args,
             "run scenarios/diffkv.yaml --set workload.requests=4 --set workload.output.max=4096 --set "
             "policies=[bf16] --out %s/out2",
             e.dir);
    rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 0, "bf16 only: %s", out);
    free(out);
    snprintf(args, sizeof args,
             "run scenarios/diffkv.yaml --set workload.requests=4 --set workload.output.max=4096 --set "
             "diffkv.scores=lognormal --out %s/out3",
             e.dir);
    rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 0, "lognormal opt-out: %s", out);
    free(out);
    teardown_env(&e);
}
