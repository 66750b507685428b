/* cmd_eval.c — `kvsim eval SCENARIO`: the accuracy of each policy's KV on the reference model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/accuracy/eval.h"
#include "core/accuracy/eval_config.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvsim eval SCENARIO [--set key.path=value]... [--seed N] [--out DIR] [--model PATH] [--quiet]\n\n"
               "Runs the reference model (SmolLM2-135M) with each policy of the scenario's `policies` list\n"
               "compressing its KV cache, and prints accuracy against the bf16-KV run: perplexity,\n"
               "token agreement, needle retrieval, Lynx acceptance per speculative position, DiffKV\n"
               "tiers and compression per layer, attention output error per layer.\n"
               "The scenario needs an `accuracy:` section (docs/accuracy.md); it is read as `kvsim run` reads it.\n\n"
               "  --set key.path=value  override any scenario key, as for kvsim run\n"
               "  --seed N      same as --set seed=N\n"
               "  --out DIR     also write DIR/accuracy.json\n"
               "  --model PATH  use this GGUF instead of accuracy.model\n"
               "  --quiet       no progress lines on stderr\n\n"
               "The default model is fetched once by scripts/fetch-model.sh. Exit codes: 0 ok, 1 failed, 2 bad input.\n");
}

/* The policies' encodings for every (layer, KV head) of the model. */
static int load_policies(const kv_eval_scenario *sc, const kv_model_config *c, kv_policy **pols,
                         kv_encoding **encs, kv_eval_policy *out, kv_error *err)
{
    kv_policy_model card = {"smollm2-135m", c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim};
    kv_policy_request req = {0, sc->context_tokens, sc->generate_tokens, 0.0};
    size_t n_lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    for (int i = 0; i < sc->n_policies; i++) {
        const kv_policy_spec *ps = &sc->policies[i];
        int rc = kv_policy_load(ps->name, ps->file, ps->params, ps->n_params, &sc->policy_limits, &pols[i], err);
        if (rc)
            return rc;
        encs[i] = kv_calloc(n_lanes, sizeof *encs[i]);
        for (int l = 0; l < c->n_layers && !rc; l++)
            for (int h = 0; h < c->n_kv_heads && !rc; h++)
                rc = kv_policy_encoding(pols[i], &card, &req, l, h, &encs[i][(size_t)l * c->n_kv_heads + h], err);
        int k = 0;
        if (!rc)
            rc = kv_policy_speculation(pols[i], &req, &k, err);
        if (rc)
            return rc;
        out[i] = (kv_eval_policy){ps->name, encs[i], k};
    }
    return KV_OK;
}

int kv_cmd_eval(int argc, char **argv)
{
    const char *scenario = NULL, *out_dir = NULL, *model_arg = NULL;
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
    kv_eval_scenario *sc = NULL;
    kv_model *m = NULL;
    kv_policy **pols = NULL;
    kv_encoding **encs = NULL;
    kv_eval_policy *pp = NULL;
    kv_eval_result *res = NULL;
    kv_backend *be = NULL;
    char model_path[4096];
    static const char *const owned[] = {"accuracy.json"}; /* the one name eval replaces in DIR (afile.h) */
    kv_outdir od;
    memset(&od, 0, sizeof od);
    int rc = kv_scenario_load(scenario, sets, n_sets, &scen, &err);
    if (!rc)
        rc = kv_eval_scenario_from(scen, &sc, &err);
    /* The folder is checked (created, test-written) before the model loads: exit 2 now, not at the end. */
    if (!rc && out_dir)
        rc = kv_outdir_begin(&od, out_dir, owned, 1, kv_cmd_cleanup_slot(), &err);
    if (!rc)
        rc = model_arg ? kv_eval_model_path(model_arg, model_path, sizeof model_path, &err)
                       : kv_eval_model_path(sc->model, model_path, sizeof model_path, &err);
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
        pols = kv_calloc((size_t)sc->n_policies, sizeof *pols);
        encs = kv_calloc((size_t)sc->n_policies, sizeof *encs);
        pp = kv_calloc((size_t)sc->n_policies, sizeof *pp);
        rc = load_policies(sc, kv_model_get_config(m), pols, encs, pp, &err);
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
        if (out_dir) {
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
    for (int i = 0; sc && i < sc->n_policies; i++) {
        if (pols)
            kv_policy_destroy(pols[i]);
        if (encs)
            kv_free(encs[i]);
    }
    kv_free(pols);
    kv_free(encs);
    kv_free(pp);
    kv_model_destroy(m);
    kv_backend_close(be);
    kv_eval_scenario_destroy(sc);
    kv_scenario_destroy(scen);
    kv_free(sets);
    kv_free(seed_set);
    return rc == KV_OK ? 0 : (rc == KV_EINPUT ? 2 : 1);
}
