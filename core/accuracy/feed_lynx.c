/* feed_lynx.c — Lynx acceptance per speculative position, measured on the reference model and cached (see feed_lynx.h). */
#include "core/accuracy/feed_lynx.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/accuracy/eval.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/feedcache.h"
#include "core/refmodel/model.h"

/* Licence texts that ship with Debian and Ubuntu (base-files), each over 5,000
   tokens: every prompt length up to lynx.max_prompt_tokens' limit of 4096 fits. */
#define FEED_TEXT_DIR "/usr/share/common-licenses/"
static const char *const feed_texts[] = {FEED_TEXT_DIR "GPL-3", FEED_TEXT_DIR "LGPL-2.1", FEED_TEXT_DIR "MPL-1.1",
                                         FEED_TEXT_DIR "GFDL-1.3"};
#define FEED_N_TEXTS ((int)(sizeof feed_texts / sizeof feed_texts[0]))
#define FEED_MIN_PROMPT 16 /* tokens: shorter workload prompts are measured at this length */

/* What a scenario's measurement covers: the same for every policy of the scenario. */
typedef struct plan {
    char model_name[256];   /* accuracy.model, or smollm2-135m */
    char model_path[4096];
    kv_model_config cfg;    /* read from the file's metadata only */
    int n_lengths;          /* curve lengths, 1..4 */
    int lengths[4];         /* ascending */
    int per_length;         /* speculations per length */
    int workload_lo, workload_hi; /* the workload's shortest and longest prompt */
    int cap;                /* lynx.max_prompt_tokens, lowered to fit the context */
    bool clamped;           /* some workload length was above cap */
} plan;

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int kv_feed_lynx_texts(const char *const **texts)
{
    *texts = feed_texts;
    return FEED_N_TEXTS;
}

/* The model file, with a message that says how to get it or avoid it. */
static int find_model(const kv_scenario *s, plan *pl, kv_error *err)
{
    const kv_ynode *acc_model = s->accuracy ? kv_ytree_get(s->accuracy, "model", NULL) : NULL;
    snprintf(pl->model_name, sizeof pl->model_name, "%s",
             acc_model && acc_model->kind == KV_YSCALAR ? acc_model->value : "smollm2-135m");
    kv_error why = {0};
    if (kv_eval_model_path(pl->model_name, pl->model_path, sizeof pl->model_path, &why) == KV_OK)
        return KV_OK;
    char w[512];
    const kv_ynode *from = s->tree ? kv_ytree_get(kv_ytree_get(s->tree, "lynx", NULL), "from", NULL) : NULL;
    if (from)
        kv_scenario_where(s, "lynx.from", w, sizeof w);
    else
        snprintf(w, sizeof w, "%s", s->path);
    return kv_error_set(err, KV_EINPUT,
                        "%s: lynx.from: reference-model%s: Lynx acceptance is measured on the reference model, which "
                        "is not there (%s). Fetch it once with `sh scripts/fetch-model.sh` (about 100 MB, cached in "
                        "~/.cache/kvsim/models), or use the fixed lynx.acceptance instead with `lynx.from: scenario` "
                        "in the scenario (or --set lynx.from=scenario)",
                        w, from ? "" : " (the default for speculative policies)", why.msg);
}

/* Curve lengths: the workload's shortest, longest and thirds (the median alone when lynx.samples < 8),
   clamped, distinct (see feed_lynx.h). */
static void plan_lengths(const kv_scenario *s, int k, const int *prompts, size_t n_prompts, plan *pl)
{
    pl->cap = s->lynx.max_prompt_tokens;
    if (pl->cap > pl->cfg.context_length - k - 1)
        pl->cap = pl->cfg.context_length - k - 1;
    if (pl->cap < FEED_MIN_PROMPT)
        pl->cap = FEED_MIN_PROMPT;
    size_t m = n_prompts ? n_prompts : 1;
    int *sorted = kv_malloc(m * sizeof *sorted);
    if (n_prompts)
        memcpy(sorted, prompts, n_prompts * sizeof *sorted);
    else
        sorted[0] = pl->cap;
    qsort(sorted, m, sizeof *sorted, cmp_int);
    pl->workload_lo = sorted[0];
    pl->workload_hi = sorted[m - 1];
    pl->clamped = pl->workload_hi > pl->cap;
    /* Up to 4 lengths, each with at least one speculation per text: the median alone for few samples. */
    int want = s->lynx.samples / FEED_N_TEXTS;
    want = want < 1 ? 1 : want > 4 ? 4 : want;
    pl->n_lengths = 0;
    for (int i = 0; i < want; i++) {
        double u = want == 1 ? 0.5 : (double)i / (want - 1);
        int q = sorted[(size_t)lround((double)(m - 1) * u)];
        q = q > pl->cap ? pl->cap : q < FEED_MIN_PROMPT ? FEED_MIN_PROMPT : q;
        if (pl->n_lengths == 0 || q > pl->lengths[pl->n_lengths - 1])
            pl->lengths[pl->n_lengths++] = q;
    }
    kv_free(sorted);
    int per = (s->lynx.samples + pl->n_lengths - 1) / pl->n_lengths;
    per = (per + FEED_N_TEXTS - 1) / FEED_N_TEXTS * FEED_N_TEXTS;
    pl->per_length = per < FEED_N_TEXTS ? FEED_N_TEXTS : per;
}

/* Speculation prefixes of a curve: per length, per_text of them spread over the eighth below it, all
   distinct; owner[i] is the index of the length prefix i belongs to. Returns how many. */
static int spread(const int *lengths, int n_lengths, int per_text, int *spec, int *owner)
{
    int n = 0;
    for (int i = 0; i < n_lengths; i++)
        for (int j = 0; j < per_text; j++) {
            int l = lengths[i] - (int)((double)j * (lengths[i] / 8) / per_text);
            for (bool dup = true; dup && l > 1;) {
                dup = false;
                for (int q = 0; q < n; q++)
                    dup |= spec[q] == l;
                l -= dup;
            }
            spec[n] = l < 1 ? 1 : l;
            owner[n++] = i;
        }
    return n;
}

/* Appends to a growing key text. */
typedef struct text {
    char *p;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (w >= 0 && t->p && t->n + (size_t)w < t->cap) {
            t->n += (size_t)w;
            return;
        }
        size_t need = t->n + (size_t)(w > 0 ? w : 0) + 1;
        kv_grow((void **)&t->p, 1, &t->cap, need > 256 ? need : 256);
    }
}

static void put_tensor(text *t, const kv_tensor_enc *e)
{
    put(t, "%d:%d:%d:%d:%d", (int)e->kind, e->bits, e->anchor_bits, e->group_size, e->per_channel);
}

static bool same_encoding(const kv_encoding *a, const kv_encoding *b)
{
    return memcmp(&a->key, &b->key, sizeof a->key) == 0 && memcmp(&a->value, &b->value, sizeof a->value) == 0 &&
           a->full_precision_window == b->full_precision_window && a->diffkv == b->diffkv &&
           (!a->diffkv || (memcmp(&a->key_low, &b->key_low, sizeof a->key_low) == 0 &&
                           memcmp(&a->value_low, &b->value_low, sizeof a->value_low) == 0 &&
                           a->alpha_high == b->alpha_high && a->alpha_low == b->alpha_low && a->window == b->window));
}

/* The cache key of one policy's curve: everything its figures depend on. */
static int make_key(const char *model_path, const int *lengths, int n_lengths, int per_length,
                    const kv_encoding *enc, size_t lanes, int k, text *t, kv_error *err)
{
    char id[4500];
    int rc = kv_feedcache_file_id(model_path, id, sizeof id, err);
    if (rc)
        return rc;
    put(t, "kvsim lynx acceptance v%d\nmodel %s\ntexts (joined when short)", KV_FEED_LYNX_VERSION, id);
    for (int i = 0; i < FEED_N_TEXTS; i++) {
        rc = kv_feedcache_file_id(feed_texts[i], id, sizeof id, err);
        if (rc)
            return kv_error_prefix(err, "lynx: the licence texts: ");
        put(t, " [%s]", id);
    }
    put(t, "\nk %d\ncurve lengths", k);
    for (int i = 0; i < n_lengths; i++)
        put(t, " %d", lengths[i]);
    put(t, "\nsamples per length %d (spread over the eighth below)", per_length);
    put(t, "\nencodings (lane: kind:bits:anchor:group:per_channel K, V; window; diffkv)\n");
    /* Lanes are layer-major (layer * n_kv_heads + head); runs of equal encodings are written once. */
    for (size_t a = 0; a < lanes;) {
        size_t b = a + 1;
        while (b < lanes && same_encoding(&enc[a], &enc[b]))
            b++;
        const kv_encoding *e = &enc[a];
        put(t, "%zu-%zu: ", a, b - 1);
        put_tensor(t, &e->key);
        put(t, ", ");
        put_tensor(t, &e->value);
        put(t, "; %d", e->full_precision_window);
        if (e->diffkv) {
            put(t, "; diffkv ");
            put_tensor(t, &e->key_low);
            put(t, ", ");
            put_tensor(t, &e->value_low);
            put(t, " %.17g %.17g %d", e->alpha_high, e->alpha_low, e->window);
        }
        put(t, "\n");
        a = b;
    }
    return KV_OK;
}

/* Holds the cache folder's measurement lock (flock) while one process measures; -1: none (no folder). */
static int lock_measurement(void)
{
    char dir[4096], path[4200];
    kv_error quiet = {0};
    if (!kv_feedcache_dir(dir, sizeof dir) || kv_mkdirs(dir, &quiet))
        return -1;
    snprintf(path, sizeof path, "%s/lynx-measure.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void unlock_measurement(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

/* One policy's cached curve: [positions, n_lengths, then per length: speculations, conditional acceptance x
   positions]. A hit only with the very shape asked for. */
static int load_cached(const char *key, int positions, const int *lengths, int n_lengths, kv_accept_curve *o,
                       bool *hit, kv_error *err)
{
    double v[2 + KV_CURVE_MAX_LENGTHS * (1 + KV_FEED_MAX_POSITIONS)];
    int nv = 2 + n_lengths * (1 + positions);
    bool found = false;
    *hit = false;
    int rc = kv_feedcache_load(key, v, nv, &found, err);
    if (rc || !found || (int)v[0] != positions || (int)v[1] != n_lengths)
        return rc;
    for (int i = 0; i < n_lengths; i++)
        if (v[2 + i * (1 + positions)] < 1)
            return KV_OK;
    memset(o, 0, sizeof *o);
    o->positions = positions;
    o->n_lengths = n_lengths;
    for (int i = 0; i < n_lengths; i++) {
        const double *row = v + 2 + i * (1 + positions);
        o->lengths[i] = lengths[i];
        o->samples[i] = (long)row[0];
        memcpy(o->accept[i], row + 1, (size_t)positions * sizeof *row);
    }
    *hit = true;
    return KV_OK;
}

static int store_cached(const char *key, const kv_accept_curve *c, kv_error *err)
{
    double v[2 + KV_CURVE_MAX_LENGTHS * (1 + KV_FEED_MAX_POSITIONS)];
    int nv = 2;
    v[0] = c->positions;
    v[1] = c->n_lengths;
    for (int i = 0; i < c->n_lengths; i++) {
        v[nv++] = (double)c->samples[i];
        memcpy(v + nv, c->accept[i], (size_t)c->positions * sizeof *v);
        nv += c->positions;
    }
    return kv_feedcache_store(key, v, nv, err);
}

int kv_feed_lynx_curves(const char *model_path, const kv_eval_policy *pols, int n, const int *lengths, int n_lengths,
                        int samples, FILE *log, kv_accept_curve *out, bool *cached, kv_error *err)
{
    kv_model_config cfg;
    int rc = kv_model_read_config(model_path, &cfg, err);
    if (rc)
        return rc;
    int per_text = (samples + FEED_N_TEXTS - 1) / FEED_N_TEXTS;
    if (n_lengths < 1 || n_lengths > KV_CURVE_MAX_LENGTHS)
        return kv_error_set(err, KV_EINPUT, "lynx: %d lengths to measure; 1..%d can be", n_lengths,
                            KV_CURVE_MAX_LENGTHS);
    if (per_text < 1 || per_text * n_lengths > 64)
        return kv_error_set(err, KV_EINPUT,
                            "lynx: %d samples per length at %d lengths: at most %d per length can be measured in one "
                            "run (64 prompt prefixes per text)", samples, n_lengths, 64 / n_lengths * FEED_N_TEXTS);
    for (int i = 0; i < n; i++)
        if (pols[i].speculate < 1 || pols[i].speculate > KV_FEED_MAX_POSITIONS)
            return kv_error_set(err, KV_EINPUT, "lynx: policy '%s': k = %d speculative positions; 1..%d can be measured",
                                pols[i].name, pols[i].speculate, KV_FEED_MAX_POSITIONS);
    for (int i = 0; i < n_lengths; i++) {
        int k_max = 0;
        for (int j = 0; j < n; j++)
            k_max = pols[j].speculate > k_max ? pols[j].speculate : k_max;
        if (lengths[i] < FEED_MIN_PROMPT || (long)lengths[i] + k_max + 1 > cfg.context_length ||
            (i > 0 && lengths[i] <= lengths[i - 1]))
            return kv_error_set(err, KV_EINPUT,
                                "lynx: length %d: lengths must increase, each in %d..%d (the model's context %d less "
                                "k + 1 = %d)", lengths[i], FEED_MIN_PROMPT, cfg.context_length - k_max - 1,
                                cfg.context_length, k_max + 1);
    }
    size_t lanes = (size_t)cfg.n_layers * (size_t)cfg.n_kv_heads;
    int per_length = per_text * FEED_N_TEXTS;
    text *keys = kv_calloc((size_t)(n ? n : 1), sizeof *keys);
    bool *hit = kv_calloc((size_t)(n ? n : 1), sizeof *hit);
    int misses = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = make_key(model_path, lengths, n_lengths, per_length, pols[i].enc, lanes, pols[i].speculate, &keys[i], err);
        if (!rc)
            rc = load_cached(keys[i].p, pols[i].speculate, lengths, n_lengths, &out[i], &hit[i], err);
        misses += !hit[i];
    }
    int lock = -1;
    if (!rc && misses > 0) {
        /* Another process may be measuring the same: wait for it, then look again. */
        lock = lock_measurement();
        misses = 0;
        for (int i = 0; i < n && !rc; i++)
            if (!hit[i]) {
                rc = load_cached(keys[i].p, pols[i].speculate, lengths, n_lengths, &out[i], &hit[i], err);
                misses += !hit[i];
            }
    }
    kv_model *m = NULL;
    kv_eval_policy *ep = kv_calloc((size_t)(n ? n : 1), sizeof *ep);
    int *ep_of = kv_calloc((size_t)(n ? n : 1), sizeof *ep_of); /* eval policy index -> ours */
    int n_ep = 0, spec[64], owner[64];
    int n_spec = spread(lengths, n_lengths, per_text, spec, owner);
    if (!rc && misses > 0) {
        for (int i = 0; i < n; i++)
            if (!hit[i]) {
                ep[n_ep] = pols[i];
                ep_of[n_ep++] = i;
            }
        if (log)
            fprintf(log, "kvsim: measuring Lynx acceptance of %d polic%s at %d prompt length%s %d..%d (%d speculations "
                         "each per length)\n",
                    n_ep, n_ep == 1 ? "y" : "ies", n_lengths, n_lengths == 1 ? "" : "s", lengths[0],
                    lengths[n_lengths - 1], per_length);
        rc = kv_model_load(model_path, &m, err);
    }
    kv_eval_result *res = NULL;
    if (!rc && n_ep > 0) {
        kv_eval_config ec = {.texts = feed_texts, .n_texts = FEED_N_TEXTS, .context_tokens = lengths[n_lengths - 1],
                             .speculation_lengths = spec, .n_speculation_lengths = n_spec, .join_texts = true,
                             .progress = log};
        rc = kv_eval_run(m, &ec, ep, n_ep, &res, err);
    }
    for (int r = 0; !rc && res && r < res->n_rows; r++) {
        const kv_eval_row *row = &res->rows[r];
        if (row->policy < 0 || row->anchor_view || row->spec_k <= 0 || !row->samples_at)
            continue;
        int i = ep_of[row->policy];
        kv_accept_curve *c = &out[i];
        memset(c, 0, sizeof *c);
        c->positions = row->spec_k;
        c->n_lengths = n_lengths;
        memcpy(c->lengths, lengths, (size_t)n_lengths * sizeof *lengths);
        for (int li = 0; li < n_lengths; li++) {
            /* accepted counts speculations whose first j + 1 tokens were all accepted. */
            long before = 0, acc[KV_FEED_MAX_POSITIONS] = {0};
            for (int e = 0; e < n_spec; e++)
                if (owner[e] == li) {
                    before += row->samples_at[e];
                    for (int j = 0; j < c->positions; j++)
                        acc[j] += row->accepted_at[(size_t)e * (size_t)row->spec_k + (size_t)j];
                }
            c->samples[li] = before;
            for (int j = 0; j < c->positions; j++) {
                c->accept[li][j] = before > 0 ? (double)acc[j] / (double)before : 0.0;
                before = acc[j];
            }
        }
        hit[i] = c->samples[0] > 0;
        for (int li = 0; li < n_lengths; li++)
            hit[i] &= c->samples[li] > 0;
        if (hit[i])
            rc = store_cached(keys[i].p, c, err);
    }
    unlock_measurement(lock);
    for (int i = 0; i < n && !rc; i++)
        if (!hit[i])
            rc = kv_error_set(err, KV_EFAIL, "lynx: policy '%s': no speculation could be measured at every length",
                              pols[i].name);
    for (int i = 0; cached && i < n; i++)
        cached[i] = true;
    for (int e = 0; cached && e < n_ep; e++)
        cached[ep_of[e]] = false; /* measured in this run */
    kv_eval_result_destroy(res);
    kv_model_destroy(m);
    kv_free(ep);
    kv_free(ep_of);
    for (int i = 0; i < n; i++)
        kv_free(keys[i].p);
    kv_free(keys);
    kv_free(hit);
    return rc;
}

static void describe(const plan *pl, int k, kv_feed_acceptance *o)
{
    o->prompt_tokens = pl->lengths[pl->n_lengths - 1];
    char lengths[96] = "";
    for (int i = 0, at = 0; i < pl->n_lengths && at < (int)sizeof lengths; i++)
        at += snprintf(lengths + at, sizeof lengths - (size_t)at, "%s%d", i ? ", " : "", pl->lengths[i]);
    char clamp[160] = "";
    if (pl->clamped)
        snprintf(clamp, sizeof clamp, ", clamped to %d (lynx.max_prompt_tokens; the model holds %d)", pl->cap,
                 pl->cfg.context_length);
    snprintf(o->source, sizeof o->source,
             "reference model %s, %ld speculations of k=%d on anchor-only KV: %d licence texts at prompt lengths "
             "%s tokens, %d speculations each (the workload's prompts are %d..%d tokens%s)",
             pl->model_name, o->speculations, k, FEED_N_TEXTS, lengths, pl->per_length, pl->workload_lo,
             pl->workload_hi, clamp);
}

int kv_feed_acceptance_measure(const kv_scenario *s, kv_policy *const *policies, size_t n, const int *prompt_tokens,
                               size_t n_prompts, FILE *log, kv_feed_acceptance *out, kv_error *err)
{
    memset(out, 0, n * sizeof *out);
    /* Which policies speculate: k from the policy itself (no model needed). */
    int *ks = kv_calloc(n ? n : 1, sizeof *ks);
    int rc = KV_OK, k_max = 0;
    /* Probed at 1,024 tokens and at the workload's shortest, median and longest prompt, so a hook that
       speculates only on some lengths is measured too (the engine refuses a speculating request whose
       policy has no measured acceptance). */
    int probes[4] = {1024, 1024, 1024, 1024};
    if (n_prompts > 0) {
        int *sorted = kv_malloc(n_prompts * sizeof *sorted);
        memcpy(sorted, prompt_tokens, n_prompts * sizeof *sorted);
        qsort(sorted, n_prompts, sizeof *sorted, cmp_int);
        probes[1] = sorted[0];
        probes[2] = sorted[n_prompts / 2];
        probes[3] = sorted[n_prompts - 1];
        kv_free(sorted);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        for (int j = 0; j < 4 && !rc; j++) {
            kv_policy_request probe = {0, probes[j], 16, 0.0};
            int k = 0;
            rc = kv_policy_speculation(policies[i], &probe, &k, err);
            ks[i] = k > ks[i] ? k : ks[i];
        }
        k_max = ks[i] > k_max ? ks[i] : k_max;
    }
    if (rc || k_max == 0) {
        kv_free(ks);
        return rc;
    }
    plan pl;
    memset(&pl, 0, sizeof pl);
    rc = find_model(s, &pl, err);
    if (!rc)
        rc = kv_model_read_config(pl.model_path, &pl.cfg, err);
    if (rc) {
        kv_free(ks);
        return rc == KV_EINPUT && !strstr(err->msg, "lynx.from")
                   ? kv_error_prefix(err, "%s: lynx.from: reference-model: ", s->path)
                   : rc;
    }
    k_max = k_max > KV_FEED_MAX_POSITIONS ? KV_FEED_MAX_POSITIONS : k_max;
    plan_lengths(s, k_max, prompt_tokens, n_prompts, &pl);

    const kv_model_config *c = &pl.cfg;
    size_t lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    kv_policy_model card = {"reference", c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim};
    kv_policy_request req = {0, pl.lengths[pl.n_lengths - 1], 16, 0.0};
    kv_encoding **enc = kv_calloc(n, sizeof *enc);
    kv_eval_policy *ep = kv_calloc(n, sizeof *ep);
    int *ep_of = kv_calloc(n, sizeof *ep_of);
    int n_ep = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (ks[i] <= 0)
            continue;
        int k_here = 0;
        rc = kv_policy_speculation(policies[i], &req, &k_here, err);
        if (rc)
            continue;
        if (k_here > 0)
            ks[i] = k_here; /* else it speculates only at other lengths: measure the k it gave there */
        if (ks[i] > KV_FEED_MAX_POSITIONS)
            ks[i] = KV_FEED_MAX_POSITIONS;
        enc[i] = kv_calloc(lanes, sizeof *enc[i]);
        for (int l = 0; l < c->n_layers && !rc; l++)
            for (int h = 0; h < c->n_kv_heads && !rc; h++)
                rc = kv_policy_encoding(policies[i], &card, &req, l, h, &enc[i][(size_t)l * c->n_kv_heads + h], err);
        if (rc || !kv_eval_encodings_split(enc[i], lanes))
            continue;
        ep[n_ep] = (kv_eval_policy){kv_policy_name(policies[i]), enc[i], ks[i]};
        ep_of[n_ep++] = (int)i;
    }
    kv_accept_curve *curves = kv_calloc((size_t)(n_ep ? n_ep : 1), sizeof *curves);
    bool *cached = kv_calloc((size_t)(n_ep ? n_ep : 1), sizeof *cached);
    if (!rc && n_ep > 0) {
        rc = kv_feed_lynx_curves(pl.model_path, ep, n_ep, pl.lengths, pl.n_lengths, pl.per_length, log, curves, cached,
                                 err);
        if (rc)
            kv_error_prefix(err, "%s: lynx.from: reference-model: ", s->path);
    }
    for (int e = 0; !rc && e < n_ep; e++) {
        kv_feed_acceptance *o = &out[ep_of[e]];
        const kv_accept_curve *cv = &curves[e];
        o->curve = *cv;
        o->positions = cv->positions;
        o->cached = cached[e];
        /* Pooled over the lengths: P(j accepted | j - 1) = sum of accepted j / sum of accepted j - 1. */
        double before[KV_CURVE_MAX_LENGTHS];
        long total = 0;
        for (int li = 0; li < cv->n_lengths; li++) {
            before[li] = (double)cv->samples[li];
            total += cv->samples[li];
        }
        o->speculations = total;
        for (int j = 0; j < cv->positions; j++) {
            double num = 0, den = 0;
            for (int li = 0; li < cv->n_lengths; li++) {
                den += before[li];
                before[li] *= cv->accept[li][j];
                num += before[li];
            }
            o->accept_conditional[j] = den > 0 ? num / den : 0.0;
        }
        describe(&pl, ks[ep_of[e]], o);
        if (log && o->cached)
            fprintf(log, "kvsim: Lynx acceptance of %s: from the feed cache (measured before on %s)\n", ep[e].name,
                    pl.model_name);
    }
    kv_free(curves);
    kv_free(cached);
    kv_free(ep);
    kv_free(ep_of);
    for (size_t i = 0; i < n; i++)
        kv_free(enc[i]);
    kv_free(enc);
    kv_free(ks);
    return rc;
}
