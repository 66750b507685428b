/* feed.c — evaluate a policy on the reference model and turn the result into simulator inputs. */
#include "core/model/feed.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/model/eval.h"
#include "core/model/eval_config.h"
#include "core/model/model.h"

/* A short study: one licence text that ships with Debian, 512 prompt tokens. */
#define FEED_TEXT "/usr/share/common-licenses/GPL-3"
#define FEED_CONTEXT 512

int kv_feed_measure(const kv_scenario *s, kv_policy *p, kv_feed *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    const kv_ynode *acc_model = s->accuracy ? kv_ytree_get(s->accuracy, "model", NULL) : NULL;
    const char *model_name = acc_model && acc_model->kind == KV_YSCALAR ? acc_model->value : "smollm2-135m";
    char path[4096];
    int rc = kv_eval_model_path(model_name, path, sizeof path, err);
    kv_model *m = NULL;
    if (!rc)
        rc = kv_model_load(path, &m, err);
    if (rc)
        return kv_error_prefix(err, "%s: lynx.from: reference-model: ", s->path);
    const kv_model_config *c = kv_model_get_config(m);
    kv_policy_model card = {"reference", c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim};
    kv_policy_request req = {0, FEED_CONTEXT, 16, 0.0};
    size_t lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    kv_encoding *enc = kv_calloc(lanes, sizeof *enc);
    for (int l = 0; l < c->n_layers && !rc; l++)
        for (int h = 0; h < c->n_kv_heads && !rc; h++)
            rc = kv_policy_encoding(p, &card, &req, l, h, &enc[(size_t)l * c->n_kv_heads + h], err);
    int k = 0;
    if (!rc)
        rc = kv_policy_speculation(p, &req, &k, err);
    if (k > KV_FEED_MAX_POSITIONS)
        k = KV_FEED_MAX_POSITIONS;
    kv_eval_result *res = NULL;
    if (!rc) {
        const char *texts[] = {FEED_TEXT};
        kv_eval_config cfg = {.texts = texts, .n_texts = 1, .context_tokens = FEED_CONTEXT, .score_tokens = 16,
                              .generate_tokens = 8, .needle_count = 0, .needle_context_tokens = 0,
                              .speculative_positions = k, .speculation_points = 8, .seed = (uint64_t)s->seed};
        kv_eval_policy ep = {kv_policy_name(p), enc, k};
        rc = kv_eval_run(m, &cfg, &ep, 1, &res, err);
    }
    for (int i = 0; !rc && i < res->n_rows; i++) {
        const kv_eval_row *row = &res->rows[i];
        if (row->reference || row->anchor_view)
            continue;
        if (row->spec_k > 0 && row->spec_samples > 0) {
            out->positions = row->spec_k < KV_FEED_MAX_POSITIONS ? row->spec_k : KV_FEED_MAX_POSITIONS;
            out->speculations = row->spec_samples;
            long before = row->spec_samples;
            for (int j = 0; j < out->positions; j++) {
                /* accepted[j] counts speculations whose first j+1 tokens were all accepted. */
                out->accept_conditional[j] = before > 0 ? (double)row->accepted[j] / (double)before : 0.0;
                before = row->accepted[j];
            }
        }
    }
    if (!rc && out->speculations > 0)
        snprintf(out->source, sizeof out->source, "reference model %s, %ld speculation samples, %d-token prompt of %s",
                 model_name, out->speculations, FEED_CONTEXT, FEED_TEXT);
    else if (!rc)
        snprintf(out->source, sizeof out->source, "reference model %s, %d-token prompt of %s", model_name,
                 FEED_CONTEXT, FEED_TEXT);
    kv_eval_result_destroy(res);
    kv_free(enc);
    kv_model_destroy(m);
    return rc;
}
