/* evalcache.c — kvsim eval's per-policy figures in the feed cache and a statistics file, for kvsim run (see
   evalcache.h). */
#include "core/accuracy/evalcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/accuracy/feedcache.h"
#include "core/policy/policy.h"

#define N_VALUES 17 /* the figures' numbers in one cache entry (pack/unpack below) */

struct kv_evalcache {
    kv_eval_scenario *sc;
    char model_path[4096];
    kv_model_config model;
    char *key_base;          /* everything but the policy: model and texts' identities, settings */
    int n;                   /* policies */
    kv_encoding **enc;       /* [n][layers * kv_heads] */
    int *speculate;          /* [n] */
};

/* Appends text to a growing string. */
static void put(char **s, size_t *len, size_t *cap, const char *text)
{
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t cap2 = *cap ? *cap * 2 : 1024;
        while (cap2 < *len + n + 1)
            cap2 *= 2;
        *s = kv_realloc(*s, cap2);
        *cap = cap2;
    }
    memcpy(*s + *len, text, n + 1);
    *len += n;
}

/* The policies' encodings for every (layer, KV head) of the reference model, as kvsim eval asks them: the
   policy sees the smollm2-135m card and a request of context_tokens prompt and generate_tokens output. */
static int load_encodings(kv_evalcache *c, kv_error *err)
{
    const kv_model_config *m = &c->model;
    kv_policy_model card = {"smollm2-135m", m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim};
    kv_policy_request req = {0, c->sc->context_tokens, c->sc->generate_tokens, 0.0};
    size_t lanes = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    c->enc = kv_calloc((size_t)c->n + 1, sizeof *c->enc);
    c->speculate = kv_calloc((size_t)c->n + 1, sizeof *c->speculate);
    int rc = KV_OK;
    for (int i = 0; i < c->n && !rc; i++) {
        const kv_policy_spec *ps = &c->sc->policies[i];
        kv_policy *pol = NULL;
        rc = kv_policy_load(ps->name, ps->file, ps->params, ps->n_params, &c->sc->policy_limits, &pol, err);
        if (rc)
            break;
        c->enc[i] = kv_calloc(lanes, sizeof *c->enc[i]);
        for (int l = 0; l < m->n_layers && !rc; l++)
            for (int h = 0; h < m->n_kv_heads && !rc; h++)
                rc = kv_policy_encoding(pol, &card, &req, l, h, &c->enc[i][(size_t)l * m->n_kv_heads + h], err);
        if (!rc)
            rc = kv_policy_speculation(pol, &req, &c->speculate[i], err);
        kv_policy_destroy(pol);
    }
    return rc;
}

static int make_key_base(kv_evalcache *c, kv_error *err)
{
    char *s = NULL, buf[8192];
    size_t len = 0, cap = 0;
    snprintf(buf, sizeof buf, "kvsim eval row v%d block %d\nmodel ", KV_EVALCACHE_VERSION, KV_EVAL_BLOCK_TOKENS);
    put(&s, &len, &cap, buf);
    int rc = kv_feedcache_file_id(c->model_path, buf, sizeof buf, err);
    if (!rc)
        put(&s, &len, &cap, buf);
    for (int t = 0; t < c->sc->n_texts && !rc; t++) {
        put(&s, &len, &cap, "\ntext ");
        rc = kv_feedcache_file_id(c->sc->texts[t], buf, sizeof buf, err);
        if (!rc)
            put(&s, &len, &cap, buf);
    }
    const kv_eval_scenario *e = c->sc;
    snprintf(buf, sizeof buf,
             "\ncontext %d score %d generate %d needles %d needle_context %d speculative %d points %d seed %llu "
             "backend %s\n",
             e->context_tokens, e->score_tokens, e->generate_tokens, e->needle_count, e->needle_context_tokens,
             e->speculative_positions, e->speculation_points, (unsigned long long)e->seed, e->backend);
    put(&s, &len, &cap, buf);
    c->key_base = s;
    return rc;
}

/* The model's shape from a statistics file, for a context without the model file. */
static void shape_config(const kv_stats_model *m, kv_model_config *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", m->name);
    out->n_layers = m->layers;
    out->n_heads = m->heads;
    out->n_kv_heads = m->kv_heads;
    out->head_dim = m->head_dim;
    out->dim = m->heads * m->head_dim;
    out->context_length = m->context;
}

bool kv_evalcache_shape_only(const kv_evalcache *c)
{
    return c->key_base == NULL;
}

int kv_evalcache_prepare(const kv_scenario *s, const char *model, const kv_stats_model *shape, kv_evalcache **out,
                         char *why, size_t why_len, kv_error *err)
{
    *out = NULL;
    why[0] = '\0';
    if (!s->accuracy) {
        snprintf(why, why_len, "the scenario has no `accuracy:` section (scenarios/accuracy.yaml has one)");
        return KV_OK;
    }
    kv_evalcache *c = kv_calloc(1, sizeof *c);
    int rc = kv_eval_scenario_from(s, &c->sc, err);
    bool absent = false; /* the model file is not there: the context stands on the statistics file's shape */
    if (!rc) {
        kv_error miss = {0};
        absent = kv_eval_model_path(model ? model : c->sc->model, c->model_path, sizeof c->model_path, &miss);
        if (absent && !shape) {
            snprintf(why, why_len, "%s", miss.msg);
            kv_evalcache_destroy(c);
            return KV_OK;
        }
        if (absent) {
            snprintf(why, why_len, "%s", miss.msg); /* the caller says why only the file's figures are shown */
            snprintf(c->model_path, sizeof c->model_path, "%s", shape->file);
            shape_config(shape, &c->model);
        } else {
            rc = kv_model_read_config(c->model_path, &c->model, err);
        }
    }
    c->n = c->sc ? c->sc->n_policies : 0;
    if (!rc)
        rc = load_encodings(c, err);
    if (!rc && !absent)
        rc = make_key_base(c, err); /* no key base: kv_evalcache_shape_only, nothing to look up */
    if (rc) {
        kv_evalcache_destroy(c);
        return rc;
    }
    *out = c;
    return KV_OK;
}

void kv_evalcache_destroy(kv_evalcache *c)
{
    if (!c)
        return;
    for (int i = 0; c->enc && i < c->n; i++)
        kv_free(c->enc[i]);
    kv_free(c->enc);
    kv_free(c->speculate);
    kv_free(c->key_base);
    kv_eval_scenario_destroy(c->sc);
    kv_free(c);
}

const kv_eval_scenario *kv_evalcache_scenario(const kv_evalcache *c)
{
    return c->sc;
}

const char *kv_evalcache_model_path(const kv_evalcache *c)
{
    return c->model_path;
}

const kv_model_config *kv_evalcache_model(const kv_evalcache *c)
{
    return &c->model;
}

const kv_encoding *kv_evalcache_encodings(const kv_evalcache *c, int i, int *speculate)
{
    if (speculate)
        *speculate = c->speculate[i];
    return c->enc[i];
}

double kv_evalcache_estimate_s(const kv_evalcache *c)
{
    /* Fitted to scenarios/accuracy.yaml and a smaller eval on 2 busy shared cores (load 4 to 8) with
       SmolLM2-135M: about 10 ms per prefill token and 170 ms per decoded token of one row (a policy, plus an
       anchor view per Lynx policy and the bf16 reference), speculation included. An idle machine is faster. */
    const kv_eval_scenario *e = c->sc;
    int rows = 1;
    for (int i = 0; i < c->n; i++)
        rows += 1 + (c->speculate[i] > 0);
    double prefill = (double)e->n_texts * e->context_tokens + (double)e->needle_count * e->needle_context_tokens;
    double steps = (double)e->n_texts * (e->score_tokens + e->generate_tokens) +
                   (double)e->needle_count * e->generate_tokens;
    /* Scaled by the weights a token passes through, against SmolLM2-135M's 106 million. */
    const kv_model_config *m = &c->model;
    double w = (double)m->n_layers * ((double)m->dim * (2.0 * m->dim + 2.0 * m->n_kv_heads * m->head_dim) +
                                      3.0 * m->dim * m->hidden);
    double s = (0.010 * prefill + 0.17 * steps * rows) * (w > 0 ? w / 106e6 : 1.0);
    return s < 1 ? 1 : s;
}

/* The key of policy i: the base, the speculation k, and every lane's encoding text. */
static char *policy_key(const kv_evalcache *c, int i, kv_error *err)
{
    char *s = NULL, buf[512];
    size_t len = 0, cap = 0;
    put(&s, &len, &cap, c->key_base);
    snprintf(buf, sizeof buf, "speculate %d\nencodings", c->speculate[i]);
    put(&s, &len, &cap, buf);
    size_t lanes = (size_t)c->model.n_layers * (size_t)c->model.n_kv_heads;
    for (size_t l = 0; l < lanes; l++) {
        if (kv_encoding_text(&c->enc[i][l], buf, sizeof buf)) {
            kv_free(s);
            kv_error_set(err, KV_EFAIL, "policy '%s': an encoding's text is too long", c->sc->policies[i].name);
            return NULL;
        }
        put(&s, &len, &cap, " ");
        put(&s, &len, &cap, buf);
    }
    return s;
}

void kv_evalcache_figures(const kv_eval_result *r, int row, int context_tokens, kv_acc_figures *out)
{
    const kv_eval_row *x = &r->rows[row];
    memset(out, 0, sizeof *out);
    out->measured = true;
    out->context_tokens = context_tokens;
    out->scored_tokens = x->nll_count;
    kv_eval_row_delta_ppl(x, &r->rows[r->reference_row], &out->delta_ppl, out->delta_ppl_ci95);
    kv_eval_row_top1(x, &out->top1, out->top1_ci95);
    kv_eval_row_needle(x, &out->needle, out->needle_ci95);
    kv_eval_row_accepted_share(x, &out->accept, out->accept_ci95);
    out->spec_k = x->spec_k;
}

static void pack(const kv_acc_figures *f, double *v)
{
    double x[N_VALUES] = {f->context_tokens, (double)f->scored_tokens, f->delta_ppl, f->delta_ppl_ci95[0],
                          f->delta_ppl_ci95[1], f->top1, f->top1_ci95[0], f->top1_ci95[1], f->needle,
                          f->needle_ci95[0], f->needle_ci95[1], f->accept, f->accept_ci95[0], f->accept_ci95[1],
                          f->spec_k, KV_EVALCACHE_VERSION, N_VALUES};
    memcpy(v, x, sizeof x);
}

static bool unpack(const double *v, kv_acc_figures *f)
{
    if (v[15] != KV_EVALCACHE_VERSION || v[16] != N_VALUES || !(v[0] >= 1 && v[0] <= 1e9) || !(v[1] >= 0))
        return false;
    memset(f, 0, sizeof *f);
    f->measured = true;
    f->context_tokens = (int)v[0];
    f->scored_tokens = (long)v[1];
    f->delta_ppl = v[2];
    f->delta_ppl_ci95[0] = v[3];
    f->delta_ppl_ci95[1] = v[4];
    f->top1 = v[5];
    f->top1_ci95[0] = v[6];
    f->top1_ci95[1] = v[7];
    f->needle = v[8];
    f->needle_ci95[0] = v[9];
    f->needle_ci95[1] = v[10];
    f->accept = v[11];
    f->accept_ci95[0] = v[12];
    f->accept_ci95[1] = v[13];
    f->spec_k = (int)v[14];
    snprintf(f->source, sizeof f->source, "eval cache");
    return true;
}

int kv_evalcache_store(const kv_evalcache *c, const kv_eval_result *r, kv_error *err)
{
    for (int row = 0; row < r->n_rows; row++) {
        const kv_eval_row *x = &r->rows[row];
        if (x->policy < 0 || x->policy >= c->n || x->anchor_view)
            continue; /* the internal reference and the anchor views are no policy's figures */
        kv_acc_figures f;
        kv_evalcache_figures(r, row, c->sc->context_tokens, &f);
        double v[N_VALUES];
        pack(&f, v);
        char *key = policy_key(c, x->policy, err);
        if (!key)
            return err->code;
        int rc = kv_feedcache_store(key, v, N_VALUES, err);
        kv_free(key);
        if (rc)
            return rc;
    }
    return KV_OK;
}

int kv_evalcache_lookup(const kv_evalcache *c, int i, const kv_model_stats *stats, kv_acc_figures *out,
                        kv_error *err)
{
    memset(out, 0, sizeof *out);
    int lanes = c->model.n_layers * c->model.n_kv_heads;
    const kv_stats_accuracy *a = NULL;
    if (stats && stats->model.layers == c->model.n_layers && stats->model.kv_heads == c->model.n_kv_heads)
        a = kv_model_stats_find_accuracy(stats, c->enc[i], lanes);
    if (a) {
        out->measured = true;
        snprintf(out->source, sizeof out->source, "stats file");
        out->context_tokens = a->context_tokens;
        out->scored_tokens = a->scored_tokens;
        out->delta_ppl = a->delta_ppl;
        memcpy(out->delta_ppl_ci95, a->delta_ppl_ci95, sizeof out->delta_ppl_ci95);
        out->top1 = a->top1_agree;
        memcpy(out->top1_ci95, a->top1_agree_ci95, sizeof out->top1_ci95);
        out->needle = a->needle_recall;
        memcpy(out->needle_ci95, a->needle_recall_ci95, sizeof out->needle_ci95);
        out->accept = a->accepted_share; /* NaN where the entry has none */
        memcpy(out->accept_ci95, a->accepted_share_ci95, sizeof out->accept_ci95);
        out->spec_k = isfinite(a->accepted_share) ? c->speculate[i] : 0;
        return KV_OK;
    }
    if (!c->key_base)
        return KV_OK; /* made from a statistics file's shape: nothing else to look in */
    char *key = policy_key(c, i, err);
    if (!key)
        return err->code;
    double v[N_VALUES];
    bool found = false;
    int rc = kv_feedcache_load(key, v, N_VALUES, &found, err);
    kv_free(key);
    if (rc)
        return rc;
    if (found && !unpack(v, out))
        memset(out, 0, sizeof *out); /* a foreign entry: not measured */
    return KV_OK;
}

int kv_evalcache_merge_stats(const kv_evalcache *c, const kv_eval_result *r, kv_model_stats *s, const char *path,
                             kv_error *err)
{
    if (s->model.layers != c->model.n_layers || s->model.kv_heads != c->model.n_kv_heads)
        return kv_error_set(err, KV_EINPUT,
                            "--stats %s: the file's model has %d layers and %d KV heads; the evaluated model %s has %d "
                            "and %d",
                            path, s->model.layers, s->model.kv_heads, c->model.name, c->model.n_layers,
                            c->model.n_kv_heads);
    int lanes = c->model.n_layers * c->model.n_kv_heads;
    for (int row = 0; row < r->n_rows; row++) {
        const kv_eval_row *x = &r->rows[row];
        if (x->policy < 0 || x->policy >= c->n || x->anchor_view)
            continue; /* the internal reference and the anchor views are no policy's figures */
        kv_acc_figures f;
        kv_evalcache_figures(r, row, c->sc->context_tokens, &f);
        if (!isfinite(f.delta_ppl) || !isfinite(f.top1))
            continue; /* no text scored: nothing the file can hold */
        kv_stats_accuracy *a = (kv_stats_accuracy *)kv_model_stats_find_accuracy(s, c->enc[x->policy], lanes);
        if (!a) {
            s->accuracy = kv_realloc(s->accuracy, (s->n_accuracy + 1) * sizeof *s->accuracy);
            a = &s->accuracy[s->n_accuracy++];
            memset(a, 0, sizeof *a);
            a->encodings.n = lanes;
            a->encodings.enc = kv_malloc((size_t)lanes * sizeof *a->encodings.enc);
            memcpy(a->encodings.enc, c->enc[x->policy], (size_t)lanes * sizeof *a->encodings.enc);
        }
        kv_free(a->attention_error);
        a->attention_error = kv_malloc((size_t)c->model.n_layers * sizeof *a->attention_error);
        a->n_layers = c->model.n_layers;
        for (int l = 0; l < c->model.n_layers; l++) {
            double e = kv_eval_layer_att_err(&x->layers[l]);
            a->attention_error[l] = isfinite(e) ? e : 0.0;
        }
        a->context_tokens = f.context_tokens;
        a->scored_tokens = f.scored_tokens;
        a->delta_ppl = f.delta_ppl;
        memcpy(a->delta_ppl_ci95, f.delta_ppl_ci95, sizeof a->delta_ppl_ci95);
        a->top1_agree = f.top1;
        memcpy(a->top1_agree_ci95, f.top1_ci95, sizeof a->top1_agree_ci95);
        a->needle_recall = f.needle;
        memcpy(a->needle_recall_ci95, f.needle_ci95, sizeof a->needle_recall_ci95);
        a->accepted_share = f.accept;
        memcpy(a->accepted_share_ci95, f.accept_ci95, sizeof a->accepted_share_ci95);
    }
    return KV_OK;
}
