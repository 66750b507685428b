/* cmd_eval.c — `kvsim eval SCENARIO`: the accuracy of each policy's KV on the reference model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/accuracy/eval.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/evalcache.h"
#include "core/accuracy/model_stats.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvsim eval SCENARIO [--set key.path=value]... [--seed N] [--out DIR] [--stats FILE] [--model PATH]\n"
               "                  [--quiet]\n\n"
               "Runs the reference model (SmolLM2-135M) with each policy of the scenario's `policies` list\n"
               "compressing its KV cache, and prints accuracy against the bf16-KV run: perplexity,\n"
               "token agreement, needle retrieval, Lynx acceptance per speculative position, DiffKV\n"
               "tiers and compression per layer, attention output error per layer.\n"
               "The scenario needs an `accuracy:` section (docs/accuracy.md); it is read as `kvsim run` reads it.\n"
               "Every figure has a 95%% confidence interval. Each policy's figures are kept in the feed cache, where\n"
               "`kvsim run` of the same scenario finds them and shows them beside its latency.\n\n"
               "  --set key.path=value  override any scenario key, as for kvsim run\n"
               "  --seed N      same as --set seed=N\n"
               "  --out DIR     also write DIR/accuracy.json\n"
               "  --stats FILE  also write each policy's figures into the accuracy[] entries of FILE, a model\n"
               "                statistics file (docs/stats-format.md; an entry with the same encodings is replaced)\n"
               "  --model PATH  use this GGUF instead of accuracy.model\n"
               "  --quiet       no progress lines on stderr\n\n"
               "The default model is fetched once by scripts/fetch-model.sh. Exit codes: 0 ok, 1 failed, 2 bad input.\n");
}

int kv_cmd_eval(int argc, char **argv)
{
    const char *scenario = NULL, *out_dir = NULL, *model_arg = NULL, *stats_path = NULL;
    int quiet = 0, n_sets = 0;
    const char **sets = kv_calloc((size_t)argc + 1, sizeof *sets);
    char *seed_set = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            kv_free(sets);
            kv_free(seed_set);
            return 0;
        } else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            sets[n_sets++] = argv[i] + 6;
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc && !seed_set) {
            seed_set = kv_cmd_seed_override("eval", argv[++i]);
            if (!seed_set) {
                kv_free(sets);
                return 2;
            }
            sets[n_sets++] = seed_set;
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_dir = argv[++i];
            if (!out_dir[0]) {
                fprintf(stderr, "kvsim eval: --out: an empty folder name (leave --out out to write no folder)\n");
                kv_free(sets);
                kv_free(seed_set);
                return 2;
            }
        } else if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc) {
            stats_path = argv[++i];
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model_arg = argv[++i];
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (argv[i][0] == '-' || scenario) {
            fprintf(stderr, "kvsim eval: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            kv_free(sets);
            kv_free(seed_set);
            return 2;
        } else {
            scenario = argv[i];
        }
    }
    if (!scenario) {
        usage(stderr);
        kv_free(sets);
        kv_free(seed_set);
        return 2;
    }
    kv_error err;
    kv_error_clear(&err);
    kv_scenario *scen = NULL;
    const kv_eval_scenario *sc = NULL;
    kv_evalcache *cache = NULL;
    kv_model *m = NULL;
    kv_eval_policy *pp = NULL;
    kv_eval_result *res = NULL;
    kv_backend *be = NULL;
    kv_model_stats stats;
    memset(&stats, 0, sizeof stats);
    char why[4200] = "";
    static const char *const owned[] = {"accuracy.json"}; /* the one name eval replaces in DIR (afile.h) */
    kv_outdir od;
    memset(&od, 0, sizeof od);
    int rc = kv_scenario_load(scenario, sets, n_sets, &scen, &err);
    if (!rc && !scen->accuracy) { /* the eval settings' own message */
        kv_eval_scenario *none = NULL;
        rc = kv_eval_scenario_from(scen, &none, &err);
        kv_eval_scenario_destroy(none);
    }
    if (!rc)
        rc = kv_evalcache_prepare(scen, model_arg, NULL, &cache, why, sizeof why, &err);
    if (!rc && !cache) /* no model file: for eval, bad input (the message names where it looked) */
        rc = kv_error_set(&err, KV_EINPUT, "%s", why);
    if (!rc)
        sc = kv_evalcache_scenario(cache);
    /* The statistics file is read (and checked) before the model runs: exit 2 now, not at the end. */
    if (!rc && stats_path)
        rc = kv_model_stats_read(stats_path, &stats, &err);
    if (!rc && stats_path) {
        const kv_model_config *mc = kv_evalcache_model(cache);
        if (stats.model.layers != mc->n_layers || stats.model.kv_heads != mc->n_kv_heads)
            rc = kv_error_set(&err, KV_EINPUT,
                              "--stats %s: the file's model has %d layers and %d KV heads; the evaluated model %s has "
                              "%d and %d",
                              stats_path, stats.model.layers, stats.model.kv_heads, mc->name, mc->n_layers,
                              mc->n_kv_heads);
    }
    /* The folder is checked (created, test-written) before the model loads: exit 2 now, not at the end. */
    if (!rc && out_dir)
        rc = kv_outdir_begin(&od, out_dir, owned, 1, kv_cmd_cleanup_slot(), &err);
    const char *model_path = cache ? kv_evalcache_model_path(cache) : "";
    if (!rc && !quiet)
        fprintf(stderr, "kvsim eval: loading %s\n", model_path);
    if (!rc)
        rc = kv_model_load(model_path, &m, &err);
    if (!rc && strcmp(sc->backend, "none") != 0) {
        rc = kv_backend_open(sc->backend, 0, &be, &err);
        if (rc)
            kv_error_prefix(&err, "accuracy.backend: ");
    }
    if (!rc) {
        pp = kv_calloc((size_t)sc->n_policies, sizeof *pp);
        for (int i = 0; i < sc->n_policies; i++) {
            int k = 0;
            const kv_encoding *e = kv_evalcache_encodings(cache, i, &k);
            pp[i] = (kv_eval_policy){sc->policies[i].name, e, k};
        }
    }
    if (!rc) {
        kv_eval_config cfg = {
            .texts = (const char *const *)sc->texts,
            .n_texts = sc->n_texts,
            .context_tokens = sc->context_tokens,
            .score_tokens = sc->score_tokens,
            .generate_tokens = sc->generate_tokens,
            .needle_count = sc->needle_count,
            .needle_context_tokens = sc->needle_context_tokens,
            .speculative_positions = sc->speculative_positions,
            .speculation_points = sc->speculation_points,
            .seed = sc->seed,
            .progress = quiet ? NULL : stderr,
            .backend = be,
            .where = sc->where,
        };
        rc = kv_eval_run(m, &cfg, pp, sc->n_policies, &res, &err);
    }
    if (!rc) {
        printf("kvsim eval %s: %d policies, model %s, decode attention on %s\n", scenario, sc->n_policies,
               model_path, be ? kv_backend_name(be) : "the reference loop");
        kv_eval_print(stdout, res);
        fflush(stdout);
        rc = kv_evalcache_store(cache, res, &err); /* for kvsim run; a cache that cannot be written is no error */
        if (!rc && stats_path) {
            rc = kv_evalcache_merge_stats(cache, res, &stats, stats_path, &err);
            if (!rc) {
                kv_model_stats_add_command(&stats, "eval", argc, argv); /* the file says what wrote its accuracy[] */
                rc = kv_model_stats_write(stats_path, &stats, &err);
            }
            if (!rc && !quiet)
                fprintf(stderr, "kvsim eval: wrote the accuracy entries of %s\n", stats_path);
        }
        if (!rc && out_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/accuracy.json", kv_outdir_staging(&od));
            rc = kv_eval_write_json(res, path, &err);
            if (!rc)
                rc = kv_outdir_commit(&od, &err); /* only accuracy.json changes in DIR */
            if (!rc && !quiet)
                fprintf(stderr, "kvsim eval: wrote %s/accuracy.json\n", out_dir);
        }
    }
    kv_outdir_abort(&od); /* after a commit, or when something failed: DIR stays as it was */
    if (rc)
        fprintf(stderr, "kvsim eval: %s\n", err.msg);
    kv_eval_result_destroy(res);
    kv_free(pp);
    kv_model_destroy(m);
    kv_backend_close(be);
    kv_model_stats_free(&stats);
    kv_evalcache_destroy(cache);
    kv_scenario_destroy(scen);
    kv_free(sets);
    kv_free(seed_set);
    return rc == KV_OK ? 0 : (rc == KV_EINPUT ? 2 : 1);
}
