/* diffkv_scores.c — measure DiffKV's significance distribution on the reference model, cached (see diffkv_scores.h). */
#include "core/accuracy/diffkv_scores.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/feedcache.h"
#include "core/refmodel/kvstore.h"
#include "core/refmodel/model.h"

#define CHUNK_VALUES 4000 /* numbers per cache entry (the cache takes at most KV_FEEDCACHE_MAX_VALUES) */

int kv_diffkv_scores_key(const char *model_path, const char *text_path, int tokens, int window, char *key,
                         size_t len, kv_error *err)
{
    char mid[1024], tid[1024];
    int rc = kv_feedcache_file_id(model_path, mid, sizeof mid, err);
    if (!rc)
        rc = kv_feedcache_file_id(text_path, tid, sizeof tid, err);
    if (rc)
        return rc;
    int n = snprintf(key, len, "diffkv-scores v%d points=%d; model %s; text %s; tokens %d; window %d",
                     KV_DIFFKV_SCORES_VERSION, KV_DIFFKV_TABLE_POINTS, mid, tid, tokens, window);
    if (n < 0 || (size_t)n >= len)
        return kv_error_set(err, KV_EFAIL, "diffkv scores: cache key too long");
    return KV_OK;
}

/* Entry `part` of a key: part -1 is the header {layers, kv_heads, tokens, window}. */
static void part_key(const char *key, int part, char *out, size_t len)
{
    if (part < 0)
        snprintf(out, len, "%s; header", key);
    else
        snprintf(out, len, "%s; part %d", key, part);
}

int kv_diffkv_scores_load(const char *key, kv_diffkv_measured *out, bool *found, kv_error *err)
{
    *found = false;
    char k[4096];
    double head[4];
    part_key(key, -1, k, sizeof k);
    int rc = kv_feedcache_load(k, head, 4, found, err);
    if (rc || !*found)
        return rc;
    *found = false;
    if (!(head[0] >= 1 && head[0] <= 4096 && head[1] >= 1 && head[1] <= 4096))
        return KV_OK; /* not a table: a miss */
    int layers = (int)head[0], kv_heads = (int)head[1];
    size_t rows = (size_t)layers * (size_t)kv_heads, total = 2 * rows * KV_DIFFKV_TABLE_POINTS;
    double *z = kv_malloc(total * sizeof *z);
    bool hit = true;
    for (size_t at = 0, part = 0; at < total && hit && !rc; at += CHUNK_VALUES, part++) {
        int n = (int)(total - at < CHUNK_VALUES ? total - at : CHUNK_VALUES);
        part_key(key, (int)part, k, sizeof k);
        rc = kv_feedcache_load(k, z + at, n, &hit, err);
    }
    if (rc || !hit) {
        kv_free(z);
        return rc;
    }
    memset(out, 0, sizeof *out);
    out->z = z;
    out->table = (kv_diffkv_table){layers, kv_heads, z, z + rows * KV_DIFFKV_TABLE_POINTS};
    out->tokens = (int)head[2];
    out->window = (int)head[3];
    out->cached = true;
    *found = true;
    return KV_OK;
}

int kv_diffkv_scores_store(const char *key, const kv_diffkv_measured *m, kv_error *err)
{
    char k[4096];
    size_t total = 2 * (size_t)m->table.layers * (size_t)m->table.kv_heads * KV_DIFFKV_TABLE_POINTS;
    int rc = KV_OK;
    for (size_t at = 0, part = 0; at < total && !rc; at += CHUNK_VALUES, part++) {
        int n = (int)(total - at < CHUNK_VALUES ? total - at : CHUNK_VALUES);
        part_key(key, (int)part, k, sizeof k);
        rc = kv_feedcache_store(k, m->z + at, n, err);
    }
    /* The header last: a reader that finds it finds every part (or misses). */
    double head[4] = {m->table.layers, m->table.kv_heads, m->tokens, m->window};
    part_key(key, -1, k, sizeof k);
    if (!rc)
        rc = kv_feedcache_store(k, head, 4, err);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantiles of v[n] (sorted here) at u = k / (points - 1), linear between order statistics. */
static void quantiles(double *v, int n, double *q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++) {
        double x = (double)k / (KV_DIFFKV_TABLE_POINTS - 1) * (n - 1);
        int i = (int)floor(x);
        double f = x - i;
        q[k] = i + 1 < n ? v[i] + f * (v[i + 1] - v[i]) : v[n - 1];
    }
}

static int read_text(const char *path, char **out, size_t *len, kv_error *err)
{
    kv_error why = {0}; /* a regular file of at most 64 MiB (infile.h) */
    int rc = kv_input_read_all(path, "the text", (uint64_t)64 << 20, out, len, &why);
    return rc ? kv_error_set(err, rc, "diffkv scores: %s", why.msg) : KV_OK;
}

/* The measurement proper: an exact prefill of `tokens` tokens, significance per lane. */
static int measure(const char *model_path, const char *text_path, int tokens, int window, kv_diffkv_measured *out,
                   kv_error *err)
{
    kv_model *m = NULL;
    int rc = kv_model_load(model_path, &m, err);
    if (rc)
        return rc;
    const kv_model_config *c = kv_model_get_config(m);
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    rc = read_text(text_path, &text, &len, err);
    if (!rc)
        rc = kv_tokenizer_encode(kv_model_tokenizer(m), text, len, false, &ids, &n_ids, err);
    kv_free(text);
    if (!rc && (n_ids < (size_t)tokens || tokens > c->context_length))
        rc = kv_error_set(err, KV_EINPUT,
                          "diffkv.measure_tokens: %d tokens wanted; '%s' has %zu and the model's context is %d",
                          tokens, text_path, n_ids, c->context_length);
    if (!rc && tokens - window < 1)
        rc = kv_error_set(err, KV_EINPUT,
                          "diffkv.measure_tokens: %d tokens leave none outside the policy's window of %d", tokens,
                          window);
    kv_kvstore *st = NULL;
    kv_kvstore_shape sh = kv_model_kv_shape(m);
    if (!rc)
        rc = kv_kvstore_create(&sh, NULL, KV_KVSTORE_SCORES, &st, err);
    float *logits = kv_malloc((size_t)c->vocab * sizeof *logits);
    size_t lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    int outside = tokens - window;
    double *exit_z = rc ? NULL : kv_malloc(lanes * (size_t)outside * sizeof *exit_z);
    /* One query at a time, so that each token's sum can be read when it leaves the window:
       after query t, token t - W has received exactly its W + 1 queries. */
    for (int t = 0; !rc && t < tokens; t++) {
        int32_t p = t, sq = 0;
        kv_batch b = {1, &ids[t], &p, &sq, NULL};
        rc = kv_model_forward(m, &b, &st, logits, err);
        int i = t - window;
        for (size_t li = 0; !rc && i >= 0 && i < outside && li < lanes; li++) {
            const float *sum, *q;
            kv_kvstore_scores(st, (int)(li / (size_t)c->n_kv_heads), (int)(li % (size_t)c->n_kv_heads), NULL, &sum,
                              &q);
            exit_z[li * (size_t)outside + (size_t)i] = q[i] > 0 ? (double)(t + 1) * (double)sum[i] / (double)q[i] : 0.0;
        }
    }
    if (!rc) {
        size_t rows = lanes * KV_DIFFKV_TABLE_POINTS;
        memset(out, 0, sizeof *out);
        out->z = kv_malloc(2 * rows * sizeof *out->z);
        out->table = (kv_diffkv_table){c->n_layers, c->n_kv_heads, out->z, out->z + rows};
        out->tokens = tokens;
        out->window = window;
        double *zv = kv_malloc((size_t)outside * sizeof *zv);
        for (size_t li = 0; li < lanes; li++) {
            const float *sum, *q;
            kv_kvstore_scores(st, (int)(li / (size_t)c->n_kv_heads), (int)(li % (size_t)c->n_kv_heads), NULL, &sum, &q);
            /* z = N x mean over the queries at positions >= i (tokens - i of them). */
            for (int i = 0; i < outside; i++)
                zv[i] = q[i] > 0 ? (double)tokens * (double)sum[i] / (double)q[i] : 0.0;
            quantiles(zv, outside, out->z + li * KV_DIFFKV_TABLE_POINTS);
            /* Exits at contexts of N/2 and more only: those at a context of a few dozen tokens
               (queries over a few dozen keys) say little about decode at thousands. */
            int first = outside / 2;
            quantiles(exit_z + li * (size_t)outside + first, outside - first,
                      out->z + rows + li * KV_DIFFKV_TABLE_POINTS);
        }
        kv_free(zv);
    }
    kv_free(exit_z);
    kv_free(logits);
    kv_free(ids);
    kv_kvstore_destroy(st);
    kv_model_destroy(m);
    return rc;
}

int kv_diffkv_scores_measure(const char *model_name, const char *text_path, int tokens, int window,
                             kv_diffkv_measured *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    char path[4096], key[8192];
    int rc = kv_eval_model_path(model_name, path, sizeof path, err);
    if (!rc)
        rc = kv_diffkv_scores_key(path, text_path, tokens, window, key, sizeof key, err);
    bool found = false;
    if (!rc)
        rc = kv_diffkv_scores_load(key, out, &found, err);
    if (!rc && !found) {
        rc = measure(path, text_path, tokens, window, out, err);
        if (!rc)
            rc = kv_diffkv_scores_store(key, out, err);
    }
    if (rc) {
        kv_diffkv_measured_free(out);
        return rc;
    }
    char dir[2048] = "";
    if (!kv_feedcache_dir(dir, sizeof dir))
        snprintf(dir, sizeof dir, "no cache folder");
    snprintf(out->source, sizeof out->source,
             "measured on reference model %s: z quantiles per (layer, KV head) from the prefill attention of %d "
             "tokens of %s, window %d (cache: %s)",
             model_name, out->tokens, text_path, out->window, dir);
    return KV_OK;
}

int kv_diffkv_scores_for_policy(const kv_scenario *s, kv_policy *p, double mean_prompt, kv_diffkv_measured *out,
                                bool *needed, kv_error *err)
{
    memset(out, 0, sizeof *out);
    *needed = false;
    if (s->diffkv.scores != KV_DIFFKV_FROM_MEASURED)
        return KV_OK;
    const kv_model_card *mc = &s->model_card;
    kv_policy_model card = {mc->name, mc->layers, mc->heads, mc->kv_heads, mc->head_dim};
    int tokens = s->diffkv.measure_tokens;
    if (tokens <= 0) {
        tokens = (int)lround(mean_prompt / 64.0) * 64;
        tokens = tokens < 128 ? 128 : tokens > 2048 ? 2048 : tokens;
    }
    kv_policy_request req = {0, tokens, 16, 0.0};
    kv_encoding e;
    int rc = kv_policy_encoding(p, &card, &req, 0, 0, &e, err);
    if (rc || !e.diffkv)
        return rc;
    *needed = true;
    const kv_ynode *acc_model = s->accuracy ? kv_ytree_get(s->accuracy, "model", NULL) : NULL;
    const char *model_name = acc_model && acc_model->kind == KV_YSCALAR ? acc_model->value : "smollm2-135m";
    rc = kv_diffkv_scores_measure(model_name, KV_DIFFKV_SCORES_TEXT, tokens, e.window, out, err);
    if (rc) {
        /* The remedy first: the model's message after it may be long. */
        char w[512];
        kv_error_prefix(err,
                        "%s: diffkv.scores: measured (the default) needs the reference model for policy %s: fetch it "
                        "with `sh scripts/fetch-model.sh`, or set `diffkv.scores: lognormal` (--set "
                        "diffkv.scores=lognormal) for the lognormal stand-in: ",
                        kv_scenario_where(s, "diffkv.scores", w, sizeof w), kv_policy_name(p));
        return rc;
    }
    return KV_OK;
}

void kv_diffkv_measured_free(kv_diffkv_measured *m)
{
    if (!m)
        return;
    kv_free(m->z);
    m->z = NULL;
    m->table.z_prefill = m->table.z_exit = NULL;
}
