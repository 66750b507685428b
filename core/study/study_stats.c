/* study_stats.c — each policy's Lynx and DiffKV curves from the model statistics file (see study_stats.h). */
#include "core/study/study_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/accuracy/eval.h"
#include "core/base/alloc.h"

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static kv_policy_request request(int prompt_tokens)
{
    return (kv_policy_request){.id = 0, .prompt_tokens = prompt_tokens, .output_tokens = 16, .arrival_s = 0.0,
                               .prefill_start_s = -1, .prefill_end_s = -1};
}

/* "1024, 2048, 4096" */
static void lengths_text(const int *lengths, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%d", i ? ", " : "", lengths[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

/* The distinct encodings of enc[0..n), for a message: one text, or "per (layer, KV head): A | B ...". */
static void encodings_text(const kv_encoding *enc, size_t n, char *buf, size_t len)
{
    char texts[3][256];
    int distinct = 0;
    size_t more = 0;
    for (size_t i = 0; i < n; i++) {
        char t[256];
        if (kv_encoding_text(&enc[i], t, sizeof t))
            snprintf(t, sizeof t, "(unwritable)");
        int seen = 0;
        for (int d = 0; d < distinct && !seen; d++)
            seen = strcmp(texts[d], t) == 0;
        if (seen)
            continue;
        if (distinct < 3)
            snprintf(texts[distinct++], sizeof texts[0], "%s", t);
        else
            more++;
    }
    if (distinct == 1) {
        snprintf(buf, len, "%s", texts[0]);
        return;
    }
    snprintf(buf, len, "per (layer, KV head): %s | %s%s%s%s", texts[0], distinct > 1 ? texts[1] : "",
             distinct > 2 ? " | " : "", distinct > 2 ? texts[2] : "", more ? " | ..." : "");
}

/* The largest k the policy speculates at 1,024 tokens and the workload's shortest, median and longest prompt. */
static int speculation_k(kv_policy *p, const int *sorted, size_t n_prompts, int *k_max, kv_error *err)
{
    int probes[4] = {1024, 1024, 1024, 1024};
    if (n_prompts > 0) {
        probes[1] = sorted[0];
        probes[2] = sorted[n_prompts / 2];
        probes[3] = sorted[n_prompts - 1];
    }
    *k_max = 0;
    for (int j = 0; j < 4; j++) {
        kv_policy_request r = request(probes[j]);
        int k = 0;
        int rc = kv_policy_speculation(p, &r, &k, err);
        if (rc)
            return rc;
        *k_max = k > *k_max ? k : *k_max;
    }
    return KV_OK;
}

static int lynx_curve(const kv_scenario *s, const kv_model_stats *st, kv_policy *p, int median, int k,
                      kv_stats_policy *o, kv_error *err)
{
    const kv_stats_model *m = &st->model;
    size_t lanes = (size_t)m->layers * (size_t)m->kv_heads;
    kv_policy_model card = {m->name, m->layers, m->heads, m->kv_heads, m->head_dim};
    kv_policy_request r = request(median);
    kv_encoding *enc = kv_calloc(lanes, sizeof *enc);
    int rc = KV_OK;
    for (int l = 0; l < m->layers && !rc; l++)
        for (int h = 0; h < m->kv_heads && !rc; h++)
            rc = kv_policy_encoding(p, &card, &r, l, h, &enc[(size_t)l * (size_t)m->kv_heads + (size_t)h], err);
    if (rc || !kv_eval_encodings_split(enc, lanes)) { /* no anchor split: it never speculates in the engine */
        kv_free(enc);
        return rc;
    }
    const kv_stats_lynx *e = kv_model_stats_find_lynx(st, enc, (int)lanes);
    char w[512], encs[900];
    encodings_text(enc, lanes, encs, sizeof encs);
    kv_free(enc);
    if (!e)
        return kv_error_set(err, KV_EINPUT,
                            "%s: lynx.from: file: %s has no Lynx acceptance for policy '%s' (encodings %s, on the "
                            "file's model %s: %d layers x %d KV heads): measure it with `kvsim measure %s --out "
                            "%s`, or set lynx.from: reference-model",
                            kv_scenario_where(s, "lynx.from", w, sizeof w), s->stats, kv_policy_name(p), encs,
                            m->name, m->layers, m->kv_heads, s->path, s->stats);
    if (e->curve.positions < k)
        return kv_error_set(err, KV_EINPUT,
                            "%s: lynx.from: file: %s measures %d speculative position%s for policy '%s' (encodings "
                            "%s), which speculates up to %d: measure it again with `kvsim measure %s --out %s`",
                            kv_scenario_where(s, "lynx.from", w, sizeof w), s->stats, e->curve.positions,
                            e->curve.positions == 1 ? "" : "s", kv_policy_name(p), encs, k, s->path, s->stats);
    o->accept = e->curve;
    o->speculations = 0;
    for (int i = 0; i < e->curve.n_lengths; i++)
        o->speculations += e->curve.samples[i];
    char lengths[200];
    lengths_text(e->curve.lengths, e->curve.n_lengths, lengths, sizeof lengths);
    snprintf(o->accept_source, sizeof o->accept_source,
             "file %s: model %s (sha256 %s), measurement %d, %ld speculations of k=%d on anchor-only KV at prompt "
             "lengths %s tokens",
             s->stats, m->name, m->sha256[0] ? m->sha256 : "none", st->measurement, o->speculations,
             e->curve.positions, lengths);
    return KV_OK;
}

static int diffkv_curve(const kv_scenario *s, const kv_model_stats *st, kv_policy *p, int median,
                        kv_stats_policy *o, kv_error *err)
{
    const kv_model_card *mc = &s->model_card;
    kv_policy_model card = {mc->name, mc->layers, mc->heads, mc->kv_heads, mc->head_dim};
    kv_policy_request r = request(median);
    kv_encoding e;
    int rc = kv_policy_encoding(p, &card, &r, 0, 0, &e, err);
    if (rc || !e.diffkv)
        return rc;
    char w[512];
    const kv_stats_diffkv *d = kv_model_stats_find_diffkv(st, e.window);
    if (!d)
        return kv_error_set(err, KV_EINPUT,
                            "%s: diffkv.scores: file: %s has no DiffKV significance for window %d (policy '%s'): "
                            "measure it with `kvsim measure %s --out %s`, or set diffkv.scores: measured",
                            kv_scenario_where(s, "diffkv.scores", w, sizeof w), s->stats, e.window,
                            kv_policy_name(p), s->path, s->stats);
    if (d->points != KV_DIFFKV_TABLE_POINTS)
        return kv_error_set(err, KV_EINPUT,
                            "%s: diffkv.scores: file: %s's table for window %d has %d quantiles per head; the "
                            "engine reads %d (u = 0, 1/%d, ..., 1)",
                            kv_scenario_where(s, "diffkv.scores", w, sizeof w), s->stats, e.window, d->points,
                            KV_DIFFKV_TABLE_POINTS, KV_DIFFKV_TABLE_POINTS - 1);
    o->diffkv = d->curve;
    char lengths[200];
    lengths_text(d->curve.lengths, d->curve.n_lengths, lengths, sizeof lengths);
    snprintf(o->diffkv_source, sizeof o->diffkv_source,
             "file %s: model %s (sha256 %s), measurement %d, significance quantiles of %d layers x %d KV heads, "
             "window %d, at prompt lengths %s tokens",
             s->stats, st->model.name, st->model.sha256[0] ? st->model.sha256 : "none", st->measurement,
             st->model.layers, st->model.kv_heads, d->curve.window, lengths);
    return KV_OK;
}

int kv_study_stats_read(const kv_scenario *s, kv_model_stats *stats, kv_error *err)
{
    char path[4096];
    int rc = kv_scenario_find_file(s, s->stats, "stats", path, sizeof path, err);
    return rc ? rc : kv_model_stats_read(path, stats, err);
}

int kv_study_stats_curves(const kv_scenario *s, kv_policy *const *policies, size_t n, const int *prompts,
                          size_t n_prompts, kv_model_stats *stats, kv_stats_policy *out, kv_error *err)
{
    memset(out, 0, n * sizeof *out);
    int rc = kv_study_stats_read(s, stats, err);
    if (rc)
        return rc;
    int *sorted = kv_malloc((n_prompts ? n_prompts : 1) * sizeof *sorted);
    if (n_prompts)
        memcpy(sorted, prompts, n_prompts * sizeof *sorted);
    qsort(sorted, n_prompts, sizeof *sorted, cmp_int);
    int median = n_prompts ? sorted[n_prompts / 2] : 1024;
    for (size_t i = 0; !rc && i < n; i++) {
        if (s->lynx.from == KV_LYNX_FROM_FILE) {
            int k = 0;
            rc = speculation_k(policies[i], sorted, n_prompts, &k, err);
            if (!rc && k > 0)
                rc = lynx_curve(s, stats, policies[i], median, k, &out[i], err);
        }
        if (!rc && s->diffkv.scores == KV_DIFFKV_FROM_FILE)
            rc = diffkv_curve(s, stats, policies[i], median, &out[i], err);
    }
    kv_free(sorted);
    return rc;
}
