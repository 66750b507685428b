/* feed_lynx.c — Lynx acceptance per speculative position, measured on the reference model and cached (see feed_lynx.h). */
#include "core/accuracy/feed_lynx.h"

#include <fcntl.h>
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

/* What one measurement covers: the same for every policy of the scenario. */
typedef struct plan {
    char model_name[256];   /* accuracy.model, or smollm2-135m */
    char model_path[4096];
    kv_model_config cfg;    /* read from the file's metadata only */
    int points;             /* prompt lengths per text */
    int lengths[64];        /* [points], ascending */
    int prompt_tokens;      /* the longest length: each text's prefill */
    int workload_lo, workload_hi; /* the workload's lengths at the first and last quantile */
    int cap;                /* lynx.max_prompt_tokens, lowered to fit the context */
    bool clamped;           /* some workload length was above cap */
    int samples;            /* points * texts */
} plan;

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
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

/* Prompt lengths: workload quantiles, clamped, made distinct (see feed_lynx.h). */
static void plan_lengths(const kv_scenario *s, int k, const int *prompts, size_t n_prompts, plan *pl)
{
    pl->points = (s->lynx.samples + FEED_N_TEXTS - 1) / FEED_N_TEXTS;
    if (pl->points > 64)
        pl->points = 64;
    pl->samples = pl->points * FEED_N_TEXTS;
    pl->cap = s->lynx.max_prompt_tokens;
    if (pl->cap > pl->cfg.context_length - k - 1)
        pl->cap = pl->cfg.context_length - k - 1;
    if (pl->cap < FEED_MIN_PROMPT)
        pl->cap = FEED_MIN_PROMPT;
    int *sorted = kv_malloc((n_prompts ? n_prompts : 1) * sizeof *sorted);
    if (n_prompts)
        memcpy(sorted, prompts, n_prompts * sizeof *sorted);
    else
        sorted[0] = pl->cap;
    size_t m = n_prompts ? n_prompts : 1;
    qsort(sorted, m, sizeof *sorted, cmp_int);
    pl->clamped = false;
    for (int i = 0; i < pl->points; i++) {
        size_t at = (size_t)(((double)i + 0.5) / pl->points * (double)m);
        int q = sorted[at < m ? at : m - 1];
        if (i == 0)
            pl->workload_lo = q;
        pl->workload_hi = q;
        if (q > pl->cap) {
            q = pl->cap;
            pl->clamped = true;
        }
        pl->lengths[i] = q < FEED_MIN_PROMPT ? FEED_MIN_PROMPT : q;
    }
    kv_free(sorted);
    /* Runs of equal lengths (clamping, or a fixed-length workload): spread each over the quarter below. */
    for (int a = 0; a < pl->points;) {
        int b = a;
        while (b < pl->points && pl->lengths[b] == pl->lengths[a])
            b++;
        int v = pl->lengths[a], run = b - a;
        for (int j = 0; j < run; j++) {
            int l = v - (int)((double)j * (v / 4) / run);
            pl->lengths[b - 1 - j] = l < FEED_MIN_PROMPT ? FEED_MIN_PROMPT : l;
        }
        a = b;
    }
    qsort(pl->lengths, (size_t)pl->points, sizeof pl->lengths[0], cmp_int);
    pl->prompt_tokens = pl->lengths[pl->points - 1];
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

/* The cache key of one policy: everything its figures depend on. */
static int make_key(const plan *pl, const kv_encoding *enc, size_t lanes, int k, text *t, kv_error *err)
{
    char id[4500];
    int rc = kv_feedcache_file_id(pl->model_path, id, sizeof id, err);
    if (rc)
        return rc;
    put(t, "kvsim lynx acceptance v%d\nmodel %s\ntexts", KV_FEED_LYNX_VERSION, id);
    for (int i = 0; i < FEED_N_TEXTS; i++) {
        rc = kv_feedcache_file_id(feed_texts[i], id, sizeof id, err);
        if (rc)
            return kv_error_prefix(err, "lynx.from: reference-model: ");
        put(t, " [%s]", id);
    }
    put(t, "\nk %d\nprompt %d\nlengths", k, pl->prompt_tokens);
    for (int i = 0; i < pl->points; i++)
        put(t, " %d", pl->lengths[i]);
    put(t, "\nsamples %d\nencodings (lane: kind:bits:anchor:group:per_channel K, V; window; diffkv)\n", pl->samples);
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

/* One policy's cached figures: [positions, speculations, conditional acceptance x positions]. */
static int load_cached(const char *key, int positions, kv_feed_acceptance *o, kv_error *err)
{
    double v[2 + KV_FEED_MAX_POSITIONS];
    bool found = false;
    int rc = kv_feedcache_load(key, v, 2 + positions, &found, err);
    if (rc || !found || (int)v[0] != positions || v[1] < 1)
        return rc;
    o->positions = positions;
    o->speculations = (long)v[1];
    memcpy(o->accept_conditional, v + 2, (size_t)positions * sizeof *v);
    o->cached = true;
    return KV_OK;
}

static void describe(const plan *pl, int k, kv_feed_acceptance *o)
{
    o->prompt_tokens = pl->prompt_tokens;
    char lengths[64];
    if (pl->lengths[0] == pl->prompt_tokens)
        snprintf(lengths, sizeof lengths, "%d", pl->prompt_tokens);
    else
        snprintf(lengths, sizeof lengths, "%d..%d", pl->lengths[0], pl->prompt_tokens);
    char workload[200];
    int q_lo = (int)(100.0 * 0.5 / pl->points + 0.5), q_hi = 100 - q_lo;
    snprintf(workload, sizeof workload, "the workload's prompts at p%d..p%d are %d..%d tokens%s", q_lo, q_hi,
             pl->workload_lo, pl->workload_hi, pl->clamped ? "" : ", not clamped");
    char clamp[160] = "";
    if (pl->clamped)
        snprintf(clamp, sizeof clamp, ", clamped to %d (lynx.max_prompt_tokens; the model holds %d)", pl->cap,
                 pl->cfg.context_length);
    snprintf(o->source, sizeof o->source,
             "reference model %s, %ld speculations of k=%d on anchor-only KV: %d licence texts x %d prompt lengths "
             "%s tokens (%s%s)",
             pl->model_name, o->speculations, k, FEED_N_TEXTS, pl->points, lengths, workload, clamp);
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
    plan_lengths(s, k_max, prompt_tokens, n_prompts, &pl);

    const kv_model_config *c = &pl.cfg;
    size_t lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    kv_policy_model card = {"reference", c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim};
    kv_policy_request req = {0, pl.prompt_tokens, 16, 0.0};
    kv_encoding **enc = kv_calloc(n, sizeof *enc);
    text *keys = kv_calloc(n, sizeof *keys);
    bool *want = kv_calloc(n, sizeof *want);
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
        want[i] = true;
        rc = make_key(&pl, enc[i], lanes, ks[i], &keys[i], err);
        if (!rc)
            rc = load_cached(keys[i].p, ks[i], &out[i], err);
    }
    int lock = -1, misses = 0;
    for (size_t i = 0; i < n && !rc; i++)
        misses += want[i] && !out[i].cached;
    if (!rc && misses > 0) {
        /* Another process may be measuring the same: wait for it, then look again. */
        lock = lock_measurement();
        misses = 0;
        for (size_t i = 0; i < n && !rc; i++)
            if (want[i] && !out[i].cached) {
                rc = load_cached(keys[i].p, ks[i], &out[i], err);
                misses += !out[i].cached;
            }
    }
    kv_model *m = NULL;
    kv_eval_policy *ep = kv_calloc(n, sizeof *ep);
    int *ep_of = kv_calloc(n, sizeof *ep_of); /* eval policy index -> our index */
    int n_ep = 0;
    if (!rc && misses > 0) {
        for (size_t i = 0; i < n; i++)
            if (want[i] && !out[i].cached) {
                ep[n_ep] = (kv_eval_policy){kv_policy_name(policies[i]), enc[i], ks[i]};
                ep_of[n_ep++] = (int)i;
            }
        if (log)
            fprintf(log, "kvsim: measuring Lynx acceptance of %d polic%s on %s (%d speculations each, prompts of "
                         "%d..%d tokens; about a minute, then cached)\n",
                    n_ep, n_ep == 1 ? "y" : "ies", pl.model_name, pl.samples, pl.lengths[0], pl.prompt_tokens);
        rc = kv_model_load(pl.model_path, &m, err);
        if (rc)
            kv_error_prefix(err, "%s: lynx.from: reference-model: ", s->path);
    }
    kv_eval_result *res = NULL;
    if (!rc && n_ep > 0) {
        kv_eval_config cfg = {.texts = feed_texts, .n_texts = FEED_N_TEXTS, .context_tokens = pl.prompt_tokens,
                              .score_tokens = 0, .generate_tokens = 0, .needle_count = 0,
                              .speculative_positions = 0, .speculation_lengths = pl.lengths,
                              .n_speculation_lengths = pl.points, .seed = 0};
        rc = kv_eval_run(m, &cfg, ep, n_ep, &res, err);
        if (rc)
            kv_error_prefix(err, "%s: lynx.from: reference-model: ", s->path);
    }
    for (int r = 0; !rc && res && r < res->n_rows; r++) {
        const kv_eval_row *row = &res->rows[r];
        if (row->policy < 0 || row->anchor_view || row->spec_k <= 0 || row->spec_samples <= 0)
            continue;
        kv_feed_acceptance *o = &out[ep_of[row->policy]];
        o->positions = row->spec_k < KV_FEED_MAX_POSITIONS ? row->spec_k : KV_FEED_MAX_POSITIONS;
        o->speculations = row->spec_samples;
        long before = row->spec_samples;
        for (int j = 0; j < o->positions; j++) {
            /* accepted[j] counts speculations whose first j+1 tokens were all accepted. */
            o->accept_conditional[j] = before > 0 ? (double)row->accepted[j] / (double)before : 0.0;
            before = row->accepted[j];
        }
        double v[2 + KV_FEED_MAX_POSITIONS] = {(double)o->positions, (double)o->speculations};
        memcpy(v + 2, o->accept_conditional, (size_t)o->positions * sizeof *v);
        rc = kv_feedcache_store(keys[ep_of[row->policy]].p, v, 2 + o->positions, err);
    }
    unlock_measurement(lock);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!want[i])
            continue;
        if (out[i].positions <= 0) {
            rc = kv_error_set(err, KV_EFAIL, "%s: lynx.from: reference-model: policy '%s': no speculation could be "
                                             "measured", s->path, kv_policy_name(policies[i]));
            break;
        }
        describe(&pl, ks[i], &out[i]);
        if (log && out[i].cached)
            fprintf(log, "kvsim: Lynx acceptance of %s: from the feed cache (measured before on %s)\n",
                    kv_policy_name(policies[i]), pl.model_name);
    }
    kv_eval_result_destroy(res);
    kv_model_destroy(m);
    kv_free(ep);
    kv_free(ep_of);
    for (size_t i = 0; i < n; i++) {
        kv_free(enc[i]);
        kv_free(keys[i].p);
    }
    kv_free(enc);
    kv_free(keys);
    kv_free(want);
    kv_free(ks);
    return rc;
}
