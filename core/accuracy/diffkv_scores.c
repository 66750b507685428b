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

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

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

/* At least `need` tokens of texts[0], joined with the next texts (after a blank line) while short. */
static int read_tokens(const kv_model *m, const char *const *texts, int n_texts, size_t need, int32_t **ids,
                       size_t *n_ids, kv_error *err)
{
    char *text = NULL;
    size_t len = 0;
    *ids = NULL;
    *n_ids = 0;
    int rc = KV_OK;
    for (int t = 0; t < n_texts && !rc && *n_ids < need; t++) {
        char *more = NULL;
        size_t more_len = 0;
        rc = read_text(texts[t], &more, &more_len, err);
        if (rc)
            break;
        text = kv_realloc(text, len + 2 + more_len);
        if (t > 0) {
            memcpy(text + len, "\n\n", 2);
            len += 2;
        }
        memcpy(text + len, more, more_len);
        len += more_len;
        kv_free(more);
        kv_free(*ids);
        *ids = NULL;
        rc = kv_tokenizer_encode(kv_model_tokenizer(m), text, len, false, ids, n_ids, err);
    }
    kv_free(text);
    return rc;
}

/* The measurement proper: one exact pass of the longest length, one query at a time, significance per lane;
   z[i] receives length i's tables ([2][lanes][POINTS]). */
static int measure(const char *model_path, const char *const *texts, int n_texts, const int *lengths,
                   int n_lengths, int window, FILE *progress, double *const *z, const char *const *keys, int *layers,
                   int *kv_heads, kv_error *err)
{
    kv_model *m = NULL;
    int rc = kv_model_load(model_path, &m, err);
    if (rc)
        return rc;
    const kv_model_config *c = kv_model_get_config(m);
    int tokens = lengths[n_lengths - 1];
    size_t n_ids = 0;
    int32_t *ids = NULL;
    rc = read_tokens(m, texts, n_texts, (size_t)tokens, &ids, &n_ids, err);
    if (!rc && (n_ids < (size_t)tokens || tokens > c->context_length))
        rc = kv_error_set(err, KV_EINPUT,
                          "diffkv.measure_tokens: %d tokens wanted; '%s'%s has %zu and the model's context is %d",
                          tokens, texts[0], n_texts > 1 ? " with the texts after it" : "", n_ids, c->context_length);
    if (!rc && lengths[0] - window < 1)
        rc = kv_error_set(err, KV_EINPUT,
                          "diffkv.measure_tokens: %d tokens leave none outside the policy's window of %d", lengths[0],
                          window);
    kv_kvstore *st = NULL;
    kv_kvstore_shape sh = kv_model_kv_shape(m);
    if (!rc)
        rc = kv_kvstore_create(&sh, NULL, KV_KVSTORE_SCORES, &st, err);
    float *logits = kv_malloc((size_t)c->vocab * sizeof *logits);
    size_t lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads, rows = lanes * KV_DIFFKV_TABLE_POINTS;
    int outside_max = tokens - window;
    double *exit_z = rc ? NULL : kv_malloc(lanes * (size_t)outside_max * sizeof *exit_z);
    double *zv = rc ? NULL : kv_malloc((size_t)outside_max * sizeof *zv);
    /* One query at a time, so that each token's sum can be read when it leaves the window:
       after query t, token t - W has received exactly its W + 1 queries. */
    for (int t = 0, li = 0; !rc && t < tokens; t++) {
        int32_t p = t, sq = 0;
        kv_batch b = {1, &ids[t], &p, &sq, NULL};
        rc = kv_model_forward(m, &b, &st, logits, err);
        int i = t - window;
        for (size_t ln = 0; !rc && i >= 0 && i < outside_max && ln < lanes; ln++) {
            const float *sum, *q;
            kv_kvstore_scores(st, (int)(ln / (size_t)c->n_kv_heads), (int)(ln % (size_t)c->n_kv_heads), NULL, &sum,
                              &q);
            exit_z[ln * (size_t)outside_max + (size_t)i] =
                q[i] > 0 ? (double)(t + 1) * (double)sum[i] / (double)q[i] : 0.0;
        }
        if (!rc && progress && (t + 1) % 1024 == 0)
            fprintf(progress, "kvsim: DiffKV significance, window %d: %d of %d tokens\n", window, t + 1, tokens);
        /* A length reached: its prefill tables now (the sums cover exactly its first N queries). */
        for (; !rc && li < n_lengths && t + 1 == lengths[li]; li++) {
            int n = lengths[li], outside = n - window;
            for (size_t ln = 0; ln < lanes; ln++) {
                const float *sum, *q;
                kv_kvstore_scores(st, (int)(ln / (size_t)c->n_kv_heads), (int)(ln % (size_t)c->n_kv_heads), NULL,
                                  &sum, &q);
                /* z = N x mean over the queries at positions >= i (N - i of them). */
                for (int k = 0; k < outside; k++)
                    zv[k] = q[k] > 0 ? (double)n * (double)sum[k] / (double)q[k] : 0.0;
                quantiles(zv, outside, z[li] + ln * KV_DIFFKV_TABLE_POINTS);
                /* Exits at contexts of N/2 and more only: those at a context of a few dozen tokens
                   (queries over a few dozen keys) say little about decode at thousands. */
                int first = outside / 2;
                memcpy(zv, exit_z + ln * (size_t)outside_max + first, (size_t)(outside - first) * sizeof *zv);
                quantiles(zv, outside - first, z[li] + rows + ln * KV_DIFFKV_TABLE_POINTS);
            }
            /* Cached now: a long pass that is interrupted keeps the lengths it has passed. */
            kv_diffkv_measured done = {.table = {c->n_layers, c->n_kv_heads, z[li], z[li] + rows}, .z = z[li],
                                       .tokens = n, .window = window};
            rc = kv_diffkv_scores_store(keys[li], &done, err);
        }
    }
    *layers = c->n_layers;
    *kv_heads = c->n_kv_heads;
    kv_free(zv);
    kv_free(exit_z);
    kv_free(logits);
    kv_free(ids);
    kv_kvstore_destroy(st);
    kv_model_destroy(m);
    return rc;
}

/* The cache key of one length: kv_diffkv_scores_key's, with the texts joined after the first. */
static int curve_key(const char *model_path, const char *const *texts, int n_texts, int tokens, int window,
                     char *key, size_t len, kv_error *err)
{
    int rc = kv_diffkv_scores_key(model_path, texts[0], tokens, window, key, len, err);
    for (int t = 1; t < n_texts && !rc; t++) {
        char tid[1024];
        size_t at = strlen(key);
        rc = kv_feedcache_file_id(texts[t], tid, sizeof tid, err);
        if (!rc && (size_t)snprintf(key + at, len - at, "; then %s", tid) >= len - at)
            rc = kv_error_set(err, KV_EFAIL, "diffkv scores: cache key too long");
    }
    return rc;
}

int kv_diffkv_scores_curve(const char *model_path, const char *const *texts, int n_texts, const int *lengths,
                           int n_lengths, int window, FILE *progress, kv_diffkv_measured *out, bool *cached_out,
                           kv_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_lengths < 1 || n_lengths > KV_CURVE_MAX_LENGTHS || n_texts < 1)
        return kv_error_set(err, KV_EINPUT, "diffkv scores: %d lengths on %d texts; 1..%d lengths on 1 or more texts",
                            n_lengths, n_texts, KV_CURVE_MAX_LENGTHS);
    for (int i = 0; i < n_lengths; i++)
        if (lengths[i] <= window || (i > 0 && lengths[i] <= lengths[i - 1]))
            return kv_error_set(err, KV_EINPUT,
                                "diffkv scores: length %d: lengths must increase, each above the window of %d",
                                lengths[i], window);
    char key[8192];
    kv_diffkv_measured one[KV_CURVE_MAX_LENGTHS];
    memset(one, 0, sizeof one);
    bool all = true;
    int rc = KV_OK, layers = 0, kv_heads = 0;
    for (int i = 0; i < n_lengths && !rc && all; i++) {
        bool found = false;
        rc = curve_key(model_path, texts, n_texts, lengths[i], window, key, sizeof key, err);
        if (!rc)
            rc = kv_diffkv_scores_load(key, &one[i], &found, err);
        all = found && (i == 0 || (one[i].table.layers == one[0].table.layers &&
                                   one[i].table.kv_heads == one[0].table.kv_heads));
    }
    if (!rc && all) {
        layers = one[0].table.layers;
        kv_heads = one[0].table.kv_heads;
    }
    size_t rows = 0;
    if (!rc && !all) {
        kv_model_config cfg;
        rc = kv_model_read_config(model_path, &cfg, err);
        if (!rc && lengths[n_lengths - 1] > cfg.context_length)
            rc = kv_error_set(err, KV_EINPUT, "diffkv scores: length %d is past the model's context of %d",
                              lengths[n_lengths - 1], cfg.context_length);
        if (!rc) {
            rows = (size_t)cfg.n_layers * (size_t)cfg.n_kv_heads * KV_DIFFKV_TABLE_POINTS;
            out->z = kv_malloc((size_t)n_lengths * 2 * rows * sizeof *out->z);
            double *zs[KV_CURVE_MAX_LENGTHS];
            char *keys[KV_CURVE_MAX_LENGTHS] = {NULL};
            for (int i = 0; i < n_lengths && !rc; i++) {
                zs[i] = out->z + (size_t)i * 2 * rows;
                keys[i] = kv_malloc(sizeof key);
                rc = curve_key(model_path, texts, n_texts, lengths[i], window, keys[i], sizeof key, err);
            }
            if (!rc)
                rc = measure(model_path, texts, n_texts, lengths, n_lengths, window, progress, zs,
                             (const char *const *)keys, &layers, &kv_heads, err);
            for (int i = 0; i < n_lengths; i++)
                kv_free(keys[i]);
        }
    } else if (!rc) {
        rows = (size_t)layers * (size_t)kv_heads * KV_DIFFKV_TABLE_POINTS;
        out->z = kv_malloc((size_t)n_lengths * 2 * rows * sizeof *out->z);
        for (int i = 0; i < n_lengths; i++)
            memcpy(out->z + (size_t)i * 2 * rows, one[i].z, 2 * rows * sizeof *out->z);
    }
    for (int i = 0; i < n_lengths; i++)
        kv_diffkv_measured_free(&one[i]);
    if (rc) {
        kv_diffkv_measured_free(out);
        return rc;
    }
    out->curve.window = window;
    out->curve.n_lengths = n_lengths;
    for (int i = 0; i < n_lengths; i++) {
        out->curve.lengths[i] = lengths[i];
        const double *zi = out->z + (size_t)i * 2 * rows;
        out->curve.table[i] = (kv_diffkv_table){layers, kv_heads, zi, zi + rows};
    }
    out->table = out->curve.table[n_lengths - 1];
    out->tokens = lengths[n_lengths - 1];
    out->window = window;
    out->cached = all;
    if (cached_out)
        *cached_out = all;
    return KV_OK;
}

int kv_diffkv_scores_measure(const char *model_name, const char *text_path, int tokens, int window,
                             kv_diffkv_measured *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    char path[4096];
    int rc = kv_eval_model_path(model_name, path, sizeof path, err);
    const char *texts[] = {text_path};
    if (!rc)
        rc = kv_diffkv_scores_curve(path, texts, 1, &tokens, 1, window, NULL, out, NULL, err);
    if (rc)
        return rc;
    char dir[2048] = "";
    if (!kv_feedcache_dir(dir, sizeof dir))
        snprintf(dir, sizeof dir, "no cache folder");
    snprintf(out->source, sizeof out->source,
             "measured on reference model %s: z quantiles per (layer, KV head) from the prefill attention of %d "
             "tokens of %s, window %d (cache: %s)",
             model_name, out->tokens, text_path, out->window, dir);
    return KV_OK;
}

static int round_tokens(double v)
{
    int t = (int)lround(v / 64.0) * 64;
    return t < 128 ? 128 : t > 2048 ? 2048 : t;
}

int kv_diffkv_scores_for_policy(const kv_scenario *s, kv_policy *p, const int *prompts, size_t n_prompts,
                                kv_diffkv_measured *out, bool *needed, kv_error *err)
{
    memset(out, 0, sizeof *out);
    *needed = false;
    if (s->diffkv.scores != KV_DIFFKV_FROM_MEASURED)
        return KV_OK;
    const kv_model_card *mc = &s->model_card;
    kv_policy_model card = {mc->name, mc->layers, mc->heads, mc->kv_heads, mc->head_dim};
    int tokens = s->diffkv.measure_tokens, lengths[4], n_lengths = 1;
    if (tokens <= 0) {
        double mean = 0;
        for (size_t r = 0; r < n_prompts; r++)
            mean += (double)prompts[r] / (double)n_prompts;
        tokens = round_tokens(mean);
        int *sorted = kv_malloc((n_prompts ? n_prompts : 1) * sizeof *sorted);
        if (n_prompts)
            memcpy(sorted, prompts, n_prompts * sizeof *sorted);
        qsort(sorted, n_prompts, sizeof *sorted, cmp_int);
        int cand[4] = {tokens, tokens, tokens, tokens};
        if (n_prompts) {
            cand[1] = round_tokens(sorted[0]);
            cand[2] = round_tokens(sorted[n_prompts / 2]);
            cand[3] = round_tokens(sorted[n_prompts - 1]);
        }
        kv_free(sorted);
        qsort(cand, 4, sizeof *cand, cmp_int);
        n_lengths = 0;
        for (int i = 0; i < 4; i++)
            if (n_lengths == 0 || cand[i] > lengths[n_lengths - 1])
                lengths[n_lengths++] = cand[i];
    } else {
        lengths[0] = tokens;
    }
    kv_policy_request req = {0, tokens, 16, 0.0};
    kv_encoding e;
    int rc = kv_policy_encoding(p, &card, &req, 0, 0, &e, err);
    if (rc || !e.diffkv)
        return rc;
    *needed = true;
    const kv_ynode *acc_model = s->accuracy ? kv_ytree_get(s->accuracy, "model", NULL) : NULL;
    const char *model_name = acc_model && acc_model->kind == KV_YSCALAR ? acc_model->value : "smollm2-135m";
    char path[4096];
    const char *texts[] = {KV_DIFFKV_SCORES_TEXT};
    rc = kv_eval_model_path(model_name, path, sizeof path, err);
    if (!rc)
        rc = kv_diffkv_scores_curve(path, texts, 1, lengths, n_lengths, e.window, NULL, out, NULL, err);
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
    /* The engine's single table (until it reads the curve): the one at N. */
    for (int i = 0; i < out->curve.n_lengths; i++)
        if (out->curve.lengths[i] == tokens)
            out->table = out->curve.table[i];
    out->tokens = tokens;
    char dir[2048] = "", ls[96] = "";
    if (!kv_feedcache_dir(dir, sizeof dir))
        snprintf(dir, sizeof dir, "no cache folder");
    for (int i = 0, at = 0; i < n_lengths && at < (int)sizeof ls; i++)
        at += snprintf(ls + at, sizeof ls - (size_t)at, "%s%d", i ? ", " : "", lengths[i]);
    char also[160] = "";
    if (n_lengths > 1)
        snprintf(also, sizeof also, "; a curve over %s tokens", ls);
    snprintf(out->source, sizeof out->source,
             "measured on reference model %s: z quantiles per (layer, KV head) from the prefill attention of %d "
             "tokens of %s, window %d (cache: %s%s)",
             model_name, tokens, KV_DIFFKV_SCORES_TEXT, e.window, dir, also);
    return KV_OK;
}

void kv_diffkv_measured_free(kv_diffkv_measured *m)
{
    if (!m)
        return;
    kv_free(m->z);
    m->z = NULL;
    m->table.z_prefill = m->table.z_exit = NULL;
    m->curve.n_lengths = 0;
}
