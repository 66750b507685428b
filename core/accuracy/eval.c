/* eval.c — measures what each KV policy does to the reference model's output (see eval.h). */
#include "core/accuracy/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "core/base/rng.h"

/* A prompt: tokens to prefill, an optional teacher-forced continuation, and
   for needle prompts the number the answer must contain. */
typedef struct prompt {
    char label[160];
    int32_t *tokens;   /* [n] */
    int n;
    const int32_t *cont; /* [n_cont] text after the prompt (borrowed), or NULL */
    int n_cont;
    char needle[16];   /* digits; "" for text prompts */
} prompt;

typedef struct evaluator {
    kv_model *m;
    const kv_model_config *c;
    const kv_eval_config *cfg;
    kv_eval_result *res;
    const kv_encoding **enc; /* [n_rows] encodings of each row */
    kv_encoding *bf16_enc;   /* the internal reference's encodings, when needed */
    int *spec_k;             /* [n_rows] */
    float *logits;           /* [n_rows][vocab] */
} evaluator;

/* ---- Inputs --------------------------------------------------------------------------- */

static int read_file(const char *path, char **out, size_t *len, kv_error *err)
{
    /* A regular file of at most 64 MiB (infile.h: never a FIFO or a device). */
    kv_error why = {0};
    char *buf = NULL;
    size_t n = 0;
    int rc = kv_input_read_all(path, "the text", (uint64_t)64 << 20, &buf, &n, &why);
    if (rc)
        return kv_error_set(err, rc, "accuracy.texts: %s", why.msg);
    if (n == 0) {
        kv_free(buf);
        return kv_error_set(err, KV_EINPUT, "accuracy.texts: '%s' is empty", path);
    }
    *out = buf;
    *len = n;
    return KV_OK;
}

static void encode(const kv_model *m, const char *text, int32_t **ids, size_t *n)
{
    kv_tokenizer_encode(kv_model_tokenizer(m), text, strlen(text), false, ids, n, NULL);
}

/* "file:line:col: " where a key is set, or "" when unknown. */
static const char *key_at(const char *where, char *buf, size_t size)
{
    if (where && where[0])
        snprintf(buf, size, "%s: ", where);
    else
        buf[0] = '\0';
    return buf;
}

/* Needle i's number, drawn from rng, and the tokens of its sentence and question (*s_ids, *q_ids: the
   caller's). */
static void needle_text(const kv_model *m, int i, kv_rng *rng, char *number, size_t number_size, int32_t **s_ids,
                        size_t *n_s, int32_t **q_ids, size_t *n_q)
{
    static const char *const keys[] = {"blue door", "old lighthouse", "north gate", "red locker",
                                       "garden shed", "silver box", "east tower", "library vault"};
    const char *key = keys[(size_t)i % (sizeof keys / sizeof keys[0])];
    unsigned value = 10000u + (unsigned)kv_rng_below(rng, 90000);
    snprintf(number, number_size, "%u", value);
    char sentence[256], question[512];
    snprintf(sentence, sizeof sentence, "\nThe pass code of the %s is %u.\n", key, value);
    snprintf(question, sizeof question, "\nQuestion: What is the pass code of the %s?\nAnswer: The pass code of the %s is",
             key, key);
    encode(m, sentence, s_ids, n_s);
    encode(m, question, q_ids, n_q);
}

/* The shortest accuracy.needle.context_tokens that leaves every needle of this run at least one filler
   token: its sentence and question plus one, the largest over the needles. Draws from a copy of the
   needles' stream exactly as make_needle will (number, then filler start). */
static int needle_min_tokens(const evaluator *ev, size_t n_filler)
{
    kv_rng rng;
    kv_rng_seed(&rng, ev->cfg->seed);
    int need = 0;
    for (int i = 0; i < ev->cfg->needle_count; i++) {
        char number[16];
        int32_t *s_ids, *q_ids;
        size_t n_s, n_q;
        needle_text(ev->m, i, &rng, number, sizeof number, &s_ids, &n_s, &q_ids, &n_q);
        (void)kv_rng_below(&rng, n_filler);
        int n = (int)(n_s + n_q) + 1;
        need = n > need ? n : need;
        kv_free(s_ids);
        kv_free(q_ids);
    }
    return need;
}

/* Needle prompt i: filler text with "The pass code of the <key> is <number>."
   at depth (i + 0.5) / count, then the question. KV_EINPUT when the needle's
   length leaves no filler (kv_eval_run checks it first: this is a backstop). */
static int make_needle(const evaluator *ev, int i, const int32_t *filler, size_t n_filler, kv_rng *rng, prompt *p,
                       kv_error *err)
{
    int32_t *s_ids, *q_ids;
    size_t n_s, n_q;
    needle_text(ev->m, i, rng, p->needle, sizeof p->needle, &s_ids, &n_s, &q_ids, &n_q);
    int total = ev->cfg->needle_context_tokens;
    int64_t n_fill64 = (int64_t)total - (int64_t)n_s - (int64_t)n_q;
    if (n_fill64 < 1 || n_filler == 0) {
        char w[600];
        kv_free(s_ids);
        kv_free(q_ids);
        return kv_error_set(err, KV_EINPUT,
                            "%saccuracy.needle.context_tokens: %d leaves no room for filler in needle %d (its sentence "
                            "and question take %zu tokens); at least %zu are needed",
                            key_at(ev->cfg->where.needle_context_tokens, w, sizeof w), total, i + 1, n_s + n_q,
                            n_s + n_q + 1);
    }
    int n_fill = (int)n_fill64;
    int depth = (int)((double)n_fill * (i + 0.5) / ev->cfg->needle_count);
    size_t start = (size_t)kv_rng_below(rng, n_filler);
    p->tokens = kv_malloc((size_t)total * sizeof *p->tokens);
    int at = 0;
    for (int j = 0; j < n_fill; j++) {
        if (j == depth) {
            memcpy(p->tokens + at, s_ids, n_s * sizeof *s_ids);
            at += (int)n_s;
        }
        p->tokens[at++] = filler[(start + (size_t)j) % n_filler];
    }
    memcpy(p->tokens + at, q_ids, n_q * sizeof *q_ids);
    at += (int)n_q;
    p->n = at;
    snprintf(p->label, sizeof p->label, "needle %d/%d (%d tokens, depth %.0f%%)", i + 1, ev->cfg->needle_count, at,
             100.0 * (i + 0.5) / ev->cfg->needle_count);
    kv_free(s_ids);
    kv_free(q_ids);
    return KV_OK;
}

/* ---- Stores -------------------------------------------------------------------------------- */

/* Prompt lengths at which Lynx speculation is sampled: the configured
   lengths (those within the prompt), or the full prompt and prefixes spread
   over its second half. */
static int spec_points(const evaluator *ev, const prompt *p, int *lens)
{
    if (ev->cfg->speculation_lengths) {
        int n = 0;
        for (int i = 0; i < ev->cfg->n_speculation_lengths; i++)
            if (ev->cfg->speculation_lengths[i] >= 1 && ev->cfg->speculation_lengths[i] <= p->n)
                lens[n++] = ev->cfg->speculation_lengths[i];
        return n;
    }
    int n = ev->cfg->speculation_points > 0 ? ev->cfg->speculation_points : 1;
    for (int i = 0; i < n; i++)
        lens[i] = p->n - (int)((double)i * (p->n / 2) / n);
    return n;
}

/* Exact prefill of a prompt; *first receives the greedy next token, and
   spec_first[i] the one after the prefix of spec_len[i] tokens. */
static int prefill(evaluator *ev, const prompt *p, kv_kvstore **out, int32_t *first, const int *spec_len,
                   int n_spec, int32_t *spec_first, kv_error *err)
{
    kv_kvstore_shape sh = kv_model_kv_shape(ev->m);
    kv_kvstore *s;
    int rc = kv_kvstore_create(&sh, NULL, KV_KVSTORE_SCORES, &s, err);
    if (rc)
        return rc;
    int32_t *pos = kv_malloc((size_t)p->n * sizeof *pos), *seq = kv_calloc((size_t)p->n, sizeof *seq);
    uint8_t *want = kv_calloc((size_t)p->n, 1);
    for (int i = 0; i < p->n; i++)
        pos[i] = i;
    want[p->n - 1] = 1;
    for (int i = 0; i < n_spec; i++)
        want[spec_len[i] - 1] = 1;
    int n_want = 0;
    for (int i = 0; i < p->n; i++)
        n_want += want[i];
    float *logits = kv_malloc((size_t)n_want * (size_t)ev->c->vocab * sizeof *logits);
    kv_batch b = {p->n, p->tokens, pos, seq, want};
    rc = kv_model_forward(ev->m, &b, &s, logits, err);
    if (rc == KV_OK) {
        /* Rows come back in position order. */
        int row = 0;
        for (int i = 0; i < p->n; i++) {
            if (!want[i])
                continue;
            int32_t tok = kv_argmax(logits + (size_t)row++ * ev->c->vocab, ev->c->vocab);
            if (i == p->n - 1)
                *first = tok;
            for (int j = 0; j < n_spec; j++)
                if (spec_len[j] - 1 == i)
                    spec_first[j] = tok;
        }
    }
    kv_free(logits);
    kv_free(pos);
    kv_free(seq);
    kv_free(want);
    if (rc) {
        kv_kvstore_destroy(s);
        return rc;
    }
    *out = s;
    return KV_OK;
}

/* One store per row, copied from the prefill and sealed with the row's encoding. */
static int make_stores(evaluator *ev, const kv_kvstore *prefilled, unsigned flags, kv_kvstore **stores,
                       kv_error *err)
{
    for (int r = 0; r < ev->res->n_rows; r++) {
        int rc = kv_kvstore_clone(prefilled, ev->enc[r], flags, &stores[r], err);
        if (rc) {
            for (int j = 0; j < r; j++)
                kv_kvstore_destroy(stores[j]);
            return rc;
        }
        kv_kvstore_set_backend(stores[r], ev->cfg->backend);
        kv_kvstore_seal(stores[r]);
        if (!ev->res->rows[r].anchor_view)
            kv_kvstore_set_residual(stores[r], true);
    }
    return KV_OK;
}

static void add_stats(evaluator *ev, kv_kvstore **stores)
{
    for (int r = 0; r < ev->res->n_rows; r++) {
        for (int l = 0; l < ev->c->n_layers; l++) {
            kv_kvstore_layer_stats st, *sum = &ev->res->rows[r].layers[l];
            kv_kvstore_get_layer_stats(stores[r], l, &st);
            sum->stored_bytes += st.stored_bytes;
            sum->bf16_bytes += st.bf16_bytes;
            sum->tokens += st.tokens;
            sum->tokens_high += st.tokens_high;
            sum->tokens_low += st.tokens_low;
            sum->tokens_pruned += st.tokens_pruned;
            sum->tokens_window += st.tokens_window;
            sum->att_err_sq += st.att_err_sq;
            sum->att_ref_sq += st.att_ref_sq;
            sum->att_measured += st.att_measured;
        }
        kv_kvstore_destroy(stores[r]);
        stores[r] = NULL;
    }
}

/* One decode step of every row: row r feeds tokens[r] at position pos. */
static int step(evaluator *ev, kv_kvstore **stores, const int32_t *tokens, int32_t pos, kv_error *err)
{
    int R = ev->res->n_rows;
    int32_t *p = kv_malloc((size_t)R * sizeof *p), *seq = kv_malloc((size_t)R * sizeof *seq);
    for (int r = 0; r < R; r++) {
        p[r] = pos;
        seq[r] = r;
    }
    kv_batch b = {R, tokens, p, seq, NULL};
    int rc = kv_model_forward(ev->m, &b, stores, ev->logits, err);
    kv_free(p);
    kv_free(seq);
    return rc;
}

/* log softmax(logits)[target], in double. */
static double log_prob(const float *logits, int n, int32_t target)
{
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    return (double)logits[target] - mx - log(sum);
}

/* Folds one text's paired NLL differences (d[r * stride + i], i < n) into each row's blocks of
   KV_EVAL_BLOCK_TOKENS consecutive tokens; a last block shorter than that joins the one before it. */
static void add_blocks(evaluator *ev, const double *d, int stride, int n)
{
    if (n <= 0)
        return;
    int B = KV_EVAL_BLOCK_TOKENS, nb = n / B > 0 ? n / B : 1;
    for (int r = 0; r < ev->res->n_rows; r++) {
        kv_eval_row *row = &ev->res->rows[r];
        row->block_delta = kv_realloc(row->block_delta, (size_t)(row->n_blocks + nb) * sizeof *row->block_delta);
        for (int b = 0; b < nb; b++) {
            int from = b * B, to = b + 1 == nb ? n : from + B;
            double sum = 0;
            for (int i = from; i < to; i++)
                sum += d[(size_t)r * stride + i];
            row->block_delta[row->n_blocks++] = sum / (to - from);
        }
    }
}

/* Perplexity and top-1 agreement, teacher-forced on the text after the prompt. */
static int score_text(evaluator *ev, const prompt *p, const kv_kvstore *prefilled, kv_error *err)
{
    int R = ev->res->n_rows, V = ev->c->vocab, ref = ev->res->reference_row;
    kv_kvstore **stores = kv_calloc((size_t)R, sizeof *stores);
    int rc = make_stores(ev, prefilled, KV_KVSTORE_MEASURE, stores, err);
    if (rc) {
        kv_free(stores);
        return rc;
    }
    int32_t *tok = kv_malloc((size_t)R * sizeof *tok);
    int n_scored = p->n_cont > 1 ? p->n_cont - 1 : 0;
    /* d[r * n_scored + i]: row r's NLL minus the reference's at scored token i (paired). */
    double *d = kv_calloc((size_t)R * (size_t)(n_scored ? n_scored : 1), sizeof *d), *nll = kv_malloc((size_t)R * sizeof *nll);
    int done = 0;
    for (int i = 0; i + 1 < p->n_cont && rc == KV_OK; i++) {
        for (int r = 0; r < R; r++)
            tok[r] = p->cont[i];
        rc = step(ev, stores, tok, p->n + i, err);
        if (rc)
            break;
        int32_t best_ref = kv_argmax(ev->logits + (size_t)ref * V, V);
        for (int r = 0; r < R; r++) {
            kv_eval_row *row = &ev->res->rows[r];
            const float *l = ev->logits + (size_t)r * V;
            nll[r] = -log_prob(l, V, p->cont[i + 1]);
            row->nll_sum += nll[r];
            row->nll_count++;
            row->top1_agree += kv_argmax(l, V) == best_ref;
            row->top1_total++;
        }
        for (int r = 0; r < R; r++)
            d[(size_t)r * n_scored + i] = nll[r] - nll[ref];
        done++;
    }
    if (rc == KV_OK)
        add_blocks(ev, d, n_scored, done);
    kv_free(d);
    kv_free(nll);
    kv_free(tok);
    add_stats(ev, stores);
    kv_free(stores);
    return rc;
}

/* Free-running greedy decoding of every row; agreement with the reference and needles. */
static int generate(evaluator *ev, const prompt *p, const kv_kvstore *prefilled, int32_t first, kv_error *err)
{
    int R = ev->res->n_rows, V = ev->c->vocab, G = ev->cfg->generate_tokens, ref = ev->res->reference_row;
    if (G <= 0)
        return KV_OK;
    kv_kvstore **stores = kv_calloc((size_t)R, sizeof *stores);
    int rc = make_stores(ev, prefilled, KV_KVSTORE_MEASURE, stores, err);
    if (rc) {
        kv_free(stores);
        return rc;
    }
    int32_t *out = kv_malloc((size_t)R * G * sizeof *out), *tok = kv_malloc((size_t)R * sizeof *tok);
    for (int r = 0; r < R; r++)
        tok[r] = first;
    for (int i = 0; i < G && rc == KV_OK; i++) {
        for (int r = 0; r < R; r++)
            out[(size_t)r * G + i] = tok[r];
        if (i + 1 == G)
            break;
        rc = step(ev, stores, tok, p->n + i, err);
        for (int r = 0; r < R && rc == KV_OK; r++)
            tok[r] = kv_argmax(ev->logits + (size_t)r * V, V);
    }
    for (int r = 0; r < R && rc == KV_OK; r++) {
        kv_eval_row *row = &ev->res->rows[r];
        const int32_t *mine = out + (size_t)r * G, *theirs = out + (size_t)ref * G;
        int prefix = 0;
        while (prefix < G && mine[prefix] == theirs[prefix])
            prefix++;
        for (int i = 0; i < G; i++)
            row->greedy_agree += mine[i] == theirs[i];
        row->greedy_total += G;
        row->prefix_sum += prefix;
        row->prefix_count++;
        if (p->needle[0]) {
            int n_answer = G < 12 ? G : 12; /* the answer comes first */
            char *text = kv_tokenizer_decode(kv_model_tokenizer(ev->m), mine, (size_t)n_answer, NULL);
            row->needle_hits += strstr(text, p->needle) != NULL;
            row->needle_total++;
            kv_free(text);
        }
    }
    kv_free(out);
    kv_free(tok);
    add_stats(ev, stores);
    kv_free(stores);
    return rc;
}

/* Lynx: k greedy tokens on anchor-only KV, then verification on merged KV;
   the longest agreeing prefix is accepted. Every (row, prompt length) pair is
   one speculation with its own store; up to SPEC_BATCH of them decode
   together, one batch row each (and verify together, k batch rows each). */
#define SPEC_BATCH 8
/* ... and at most this many speculated positions in one batch (its logits are rows x vocab floats: with a
   policy's own k up to 4096, eight jobs would need gigabytes). A job alone may exceed it. Rows do not
   depend on what else is in their batch, so the split changes no result. */
#define SPEC_ROWS 2048

typedef struct spec_job {
    int row;        /* the eval row (its encoding and spec_k) */
    int n_prompt;   /* prompt prefix the speculation starts after */
    int32_t first;  /* greedy token after that prefix (exact prefill) */
} spec_job;

static int speculate_batch(evaluator *ev, const spec_job *jobs, int n_jobs, const kv_kvstore *prefilled,
                           kv_error *err)
{
    int V = ev->c->vocab, k_max = 0, rc = KV_OK, total = 0;
    for (int j = 0; j < n_jobs; j++) {
        int k = ev->res->rows[jobs[j].row].spec_k;
        k_max = k > k_max ? k : k_max;
        total += k;
    }
    kv_kvstore **stores = kv_calloc((size_t)n_jobs, sizeof *stores);
    for (int j = 0; j < n_jobs && !rc; j++) {
        rc = kv_kvstore_clone(prefilled, ev->enc[jobs[j].row], 0, &stores[j], err);
        if (rc)
            break;
        kv_kvstore_truncate(stores[j], jobs[j].n_prompt); /* the prefill of a prefix is the prefix of the prefill */
        kv_kvstore_set_backend(stores[j], ev->cfg->backend);
        kv_kvstore_seal(stores[j]);                       /* the anchor has arrived, the residual has not */
    }
    /* in[j][i]: the i-th token job j feeds (the first, then its own greedy picks); spec[j][i]: its i-th pick. */
    int32_t *in = kv_calloc((size_t)n_jobs * (size_t)k_max, sizeof *in);
    int32_t *spec = kv_calloc((size_t)n_jobs * (size_t)k_max, sizeof *spec);
    int32_t *tok = kv_malloc((size_t)total * sizeof *tok), *pos = kv_malloc((size_t)total * sizeof *pos);
    int32_t *seq = kv_malloc((size_t)total * sizeof *seq);
    int *at = kv_malloc((size_t)n_jobs * sizeof *at);
    float *logits = kv_malloc((size_t)total * (size_t)V * sizeof *logits);
    for (int j = 0; j < n_jobs; j++)
        in[(size_t)j * k_max] = jobs[j].first;
    for (int i = 0; i < k_max && !rc; i++) {
        int n = 0;
        for (int j = 0; j < n_jobs; j++)
            if (i < ev->res->rows[jobs[j].row].spec_k) {
                tok[n] = in[(size_t)j * k_max + i];
                pos[n] = jobs[j].n_prompt + i;
                seq[n] = j;
                at[j] = n++;
            }
        kv_batch b = {n, tok, pos, seq, NULL};
        rc = kv_model_forward(ev->m, &b, stores, logits, err);
        for (int j = 0; j < n_jobs && !rc; j++)
            if (i < ev->res->rows[jobs[j].row].spec_k) {
                int32_t t = kv_argmax(logits + (size_t)at[j] * V, V);
                spec[(size_t)j * k_max + i] = t;
                if (i + 1 < k_max)
                    in[(size_t)j * k_max + i + 1] = t;
            }
    }
    if (rc == KV_OK) {
        /* The residual arrives: merge, and verify every speculated position at once. */
        int n = 0;
        for (int j = 0; j < n_jobs; j++) {
            kv_kvstore_truncate(stores[j], jobs[j].n_prompt);
            kv_kvstore_set_residual(stores[j], true);
            at[j] = n;
            for (int i = 0; i < ev->res->rows[jobs[j].row].spec_k; i++, n++) {
                tok[n] = in[(size_t)j * k_max + i];
                pos[n] = jobs[j].n_prompt + i;
                seq[n] = j;
            }
        }
        kv_batch b = {n, tok, pos, seq, NULL};
        rc = kv_model_forward(ev->m, &b, stores, logits, err);
    }
    for (int j = 0; j < n_jobs && rc == KV_OK; j++) {
        kv_eval_row *row = &ev->res->rows[jobs[j].row];
        int accepted = 0;
        while (accepted < row->spec_k &&
               kv_argmax(logits + (size_t)(at[j] + accepted) * V, V) == spec[(size_t)j * k_max + accepted])
            accepted++;
        for (int i = 0; i < accepted; i++)
            row->accepted[i]++;
        row->spec_samples++;
        for (int e = 0; row->samples_at && e < ev->cfg->n_speculation_lengths; e++)
            if (ev->cfg->speculation_lengths[e] == jobs[j].n_prompt) {
                for (int i = 0; i < accepted; i++)
                    row->accepted_at[(size_t)e * (size_t)row->spec_k + (size_t)i]++;
                row->samples_at[e]++;
                break;
            }
    }
    for (int j = 0; j < n_jobs; j++)
        kv_kvstore_destroy(stores[j]);
    kv_free(stores);
    kv_free(in);
    kv_free(spec);
    kv_free(tok);
    kv_free(pos);
    kv_free(seq);
    kv_free(at);
    kv_free(logits);
    return rc;
}

/* Every speculating row at every sampled prompt length (those leaving room for k tokens). */
static int speculate(evaluator *ev, const kv_kvstore *prefilled, const int *spec_len, const int32_t *spec_first,
                     int n_spec, kv_error *err)
{
    spec_job jobs[SPEC_BATCH];
    int n = 0, rows = 0, rc = KV_OK;
    for (int r = 0; r < ev->res->n_rows && !rc; r++)
        for (int i = 0; i < n_spec && !rc; i++) {
            int k = ev->res->rows[r].spec_k;
            if (k <= 0 || (int64_t)spec_len[i] + k > ev->c->context_length)
                continue;
            if (n > 0 && rows + k > SPEC_ROWS) {
                rc = speculate_batch(ev, jobs, n, prefilled, err);
                n = rows = 0;
                if (rc)
                    break;
            }
            jobs[n++] = (spec_job){r, spec_len[i], spec_first[i]};
            rows += k;
            if (n == SPEC_BATCH) {
                rc = speculate_batch(ev, jobs, n, prefilled, err);
                n = rows = 0;
            }
        }
    if (!rc && n > 0)
        rc = speculate_batch(ev, jobs, n, prefilled, err);
    return rc;
}

static int run_prompt(evaluator *ev, const prompt *p, kv_error *err)
{
    if (ev->cfg->progress)
        fprintf(ev->cfg->progress, "kvsim eval: %s\n", p->label);
    kv_kvstore *pre = NULL;
    int32_t first = 0, spec_first[64];
    int spec_len[64], n_spec = 0;
    bool any_spec = false;
    for (int r = 0; r < ev->res->n_rows; r++)
        any_spec |= ev->res->rows[r].spec_k > 0;
    if (any_spec)
        n_spec = spec_points(ev, p, spec_len);
    int rc = prefill(ev, p, &pre, &first, spec_len, n_spec, spec_first, err);
    if (!rc && p->cont)
        rc = score_text(ev, p, pre, err);
    if (!rc)
        rc = generate(ev, p, pre, first, err);
    if (!rc && n_spec > 0)
        rc = speculate(ev, pre, spec_len, spec_first, n_spec, err);
    kv_kvstore_destroy(pre);
    return rc;
}

/* ---- Rows ------------------------------------------------------------------------------------ */

static bool plain_bf16(const kv_encoding *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].key.kind != KV_TENSOR_BF16 || e[i].value.kind != KV_TENSOR_BF16 || e[i].diffkv ||
            e[i].full_precision_window)
            return false;
    return true;
}

bool kv_eval_encodings_split(const kv_encoding *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((e[i].key.kind == KV_TENSOR_INT && e[i].key.anchor_bits > 0) ||
            (e[i].value.kind == KV_TENSOR_INT && e[i].value.anchor_bits > 0))
            return true;
    return false;
}

static kv_eval_row *add_row(kv_eval_result *res, int n_layers)
{
    res->rows = kv_realloc(res->rows, (size_t)(res->n_rows + 1) * sizeof *res->rows);
    kv_eval_row *row = &res->rows[res->n_rows++];
    memset(row, 0, sizeof *row);
    row->layers = kv_calloc((size_t)n_layers, sizeof *row->layers);
    return row;
}

int kv_eval_run(kv_model *m, const kv_eval_config *cfg, const kv_eval_policy *policies, int n_policies,
                kv_eval_result **out, kv_error *err)
{
    *out = NULL;
    const kv_model_config *c = kv_model_get_config(m);
    size_t n_lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    if (n_policies < 1)
        return kv_error_set(err, KV_EINPUT, "policies: at least one policy is needed");
    if (cfg->n_texts < 1 && cfg->needle_count < 1)
        return kv_error_set(err, KV_EINPUT, "accuracy: no texts and no needles: nothing to measure");
    /* Lengths: in 64 bits, so no sum of large values wraps. */
    char w[600];
    const kv_eval_where *at = &cfg->where;
    int64_t ctx = c->context_length, gen = cfg->generate_tokens;
    if (cfg->generate_tokens < 0 || cfg->generate_tokens > ctx)
        return kv_error_set(err, KV_EINPUT, "%saccuracy.generate_tokens: %d must be in 0..%lld (the model's context)",
                            key_at(at->generate_tokens, w, sizeof w), cfg->generate_tokens, (long long)ctx);
    if (cfg->n_texts > 0) {
        if (cfg->context_tokens < 1 || cfg->context_tokens > ctx)
            return kv_error_set(err, KV_EINPUT, "%saccuracy.context_tokens: %d must be in 1..%lld (the model's context)",
                                key_at(at->context_tokens, w, sizeof w), cfg->context_tokens, (long long)ctx);
        if (cfg->score_tokens < 0 || (int64_t)cfg->context_tokens + cfg->score_tokens + gen > ctx)
            return kv_error_set(err, KV_EINPUT,
                                "%saccuracy.score_tokens: %d must be >= 0, and context_tokens %d + score_tokens + "
                                "generate_tokens %d must fit the model's context of %lld tokens",
                                key_at(at->score_tokens, w, sizeof w), cfg->score_tokens, cfg->context_tokens,
                                cfg->generate_tokens, (long long)ctx);
    }
    if (cfg->needle_count < 0)
        return kv_error_set(err, KV_EINPUT, "accuracy.needle.count: %d must be >= 0", cfg->needle_count);
    if (cfg->needle_count > 0 && (cfg->needle_context_tokens < 1 || (int64_t)cfg->needle_context_tokens + gen > ctx))
        return kv_error_set(err, KV_EINPUT,
                            "%saccuracy.needle.context_tokens: %d + generate_tokens %d must fit the model's context "
                            "of %lld tokens",
                            key_at(at->needle_context_tokens, w, sizeof w), cfg->needle_context_tokens,
                            cfg->generate_tokens, (long long)ctx);
    if (cfg->speculative_positions < 0 || cfg->speculative_positions > 256)
        return kv_error_set(err, KV_EINPUT, "%saccuracy.speculative_positions: %d must be in 0..256",
                            key_at(at->speculative_positions, w, sizeof w), cfg->speculative_positions);
    if (cfg->speculation_points < 0 || cfg->speculation_points > 64 || cfg->n_speculation_lengths < 0 ||
        cfg->n_speculation_lengths > 64)
        return kv_error_set(err, KV_EINPUT, "accuracy: speculation_points and speculation lengths must be 0..64");
    for (int i = 0; i < n_policies; i++)
        if (policies[i].speculate < 0 || policies[i].speculate > 4096)
            return kv_error_set(err, KV_EINPUT, "policy '%s': speculate %d is outside 0..4096", policies[i].name,
                                policies[i].speculate);

    evaluator ev = {.m = m, .c = c, .cfg = cfg};
    kv_eval_result *res = kv_calloc(1, sizeof *res);
    res->model = *c;
    ev.res = res;
    const kv_encoding **enc = NULL;
    size_t n_enc = 0, cap = 0;
    res->reference_row = -1;
    for (int i = 0; i < n_policies; i++)
        if (plain_bf16(policies[i].enc, n_lanes)) {
            res->reference_row = 0; /* placed first below */
            break;
        }
    if (res->reference_row < 0) {
        /* No policy is plain bf16: add the reference run. */
        ev.bf16_enc = kv_calloc(n_lanes, sizeof *ev.bf16_enc);
        kv_eval_row *row = add_row(res, c->n_layers);
        snprintf(row->name, sizeof row->name, "bf16 (reference)");
        row->policy = -1;
        row->reference = true;
        res->reference_row = 0;
        kv_grow((void **)&enc, sizeof *enc, &cap, n_enc + 1);
        enc[n_enc++] = ev.bf16_enc;
    }
    bool have_ref = ev.bf16_enc != NULL;
    for (int i = 0; i < n_policies; i++) {
        bool ref = !have_ref && plain_bf16(policies[i].enc, n_lanes);
        kv_eval_row *row = add_row(res, c->n_layers);
        snprintf(row->name, sizeof row->name, "%s", policies[i].name);
        row->policy = i;
        row->reference = ref;
        kv_grow((void **)&enc, sizeof *enc, &cap, n_enc + 1);
        enc[n_enc++] = policies[i].enc;
        if (ref) { /* move it to the front */
            have_ref = true;
            kv_eval_row tmp = res->rows[res->n_rows - 1];
            memmove(res->rows + 1, res->rows, (size_t)(res->n_rows - 1) * sizeof *res->rows);
            res->rows[0] = tmp;
            const kv_encoding *te = enc[n_enc - 1];
            memmove(enc + 1, enc, (n_enc - 1) * sizeof *enc);
            enc[0] = te;
        }
        if (kv_eval_encodings_split(policies[i].enc, n_lanes)) {
            kv_eval_row *main_row = &res->rows[ref ? 0 : res->n_rows - 1];
            int k = cfg->speculative_positions ? cfg->speculative_positions : policies[i].speculate;
            if (k > 0) {
                main_row->spec_k = k;
                main_row->accepted = kv_calloc((size_t)k, sizeof *main_row->accepted);
                if (cfg->speculation_lengths && cfg->n_speculation_lengths > 0) {
                    size_t nl = (size_t)cfg->n_speculation_lengths;
                    main_row->accepted_at = kv_calloc(nl * (size_t)k, sizeof *main_row->accepted_at);
                    main_row->samples_at = kv_calloc(nl, sizeof *main_row->samples_at);
                }
            }
            kv_eval_row *arow = add_row(res, c->n_layers);
            snprintf(arow->name, sizeof arow->name, "%s:anchor", policies[i].name);
            arow->policy = i;
            arow->anchor_view = true;
            kv_grow((void **)&enc, sizeof *enc, &cap, n_enc + 1);
            enc[n_enc++] = policies[i].enc;
        }
    }
    ev.enc = enc;
    ev.logits = kv_malloc((size_t)res->n_rows * (size_t)c->vocab * sizeof *ev.logits);

    /* Check every encoding once, before any work. */
    int rc = KV_OK;
    kv_kvstore_shape sh = kv_model_kv_shape(m);
    for (int r = 0; r < res->n_rows && !rc; r++) {
        kv_kvstore *probe;
        rc = kv_kvstore_create(&sh, enc[r], 0, &probe, err);
        if (rc)
            kv_error_prefix(err, "policy '%s': ", res->rows[r].name);
        kv_kvstore_destroy(probe);
    }

    /* Texts: tokenize, cut the prompt and the scored continuation. */
    int32_t **text_ids = kv_calloc((size_t)(cfg->n_texts + 1), sizeof *text_ids);
    size_t *text_n = kv_calloc((size_t)(cfg->n_texts + 1), sizeof *text_n);
    for (int t = 0; t < cfg->n_texts && !rc; t++) {
        char *buf = NULL;
        size_t len = 0;
        rc = read_file(cfg->texts[t], &buf, &len, err);
        if (rc)
            break;
        kv_tokenizer_encode(kv_model_tokenizer(m), buf, len, false, &text_ids[t], &text_n[t], err);
        size_t need = (size_t)cfg->context_tokens + (size_t)cfg->score_tokens + 1;
        /* Too short and allowed to: the next texts follow, in order, until it is long enough. */
        for (int j = 1; cfg->join_texts && !rc && text_n[t] < need && j < cfg->n_texts; j++) {
            char *more = NULL;
            size_t more_len = 0;
            rc = read_file(cfg->texts[(t + j) % cfg->n_texts], &more, &more_len, err);
            if (rc)
                break;
            buf = kv_realloc(buf, len + 2 + more_len);
            memcpy(buf + len, "\n\n", 2);
            memcpy(buf + len + 2, more, more_len);
            len += 2 + more_len;
            kv_free(more);
            kv_free(text_ids[t]);
            text_ids[t] = NULL;
            kv_tokenizer_encode(kv_model_tokenizer(m), buf, len, false, &text_ids[t], &text_n[t], err);
        }
        kv_free(buf);
        if (rc)
            break;
        if (text_n[t] < need)
            rc = kv_error_set(err, KV_EINPUT,
                              "accuracy.texts: '%s' has %zu tokens; context_tokens + score_tokens + 1 = %zu are needed",
                              cfg->texts[t], text_n[t], need);
    }
    /* Needle filler: the first text, or failing that a fixed paragraph. Every needle's length is checked
       here, before any prompt runs. */
    const int32_t *filler = cfg->n_texts > 0 ? text_ids[0] : NULL;
    size_t n_filler = cfg->n_texts > 0 ? text_n[0] : 0;
    int32_t *own = NULL;
    if (!rc && cfg->needle_count > 0) {
        if (!filler) {
            encode(m, "The river runs past the mill and the bakery, through fields of wheat and rye, "
                      "under three stone bridges, and on to the sea. ", &own, &n_filler);
            filler = own;
        }
        int need = needle_min_tokens(&ev, n_filler);
        if (cfg->needle_context_tokens < need)
            rc = kv_error_set(err, KV_EINPUT,
                              "%saccuracy.needle.context_tokens: %d leaves no room for filler text: the needle "
                              "sentence and question take up to %d tokens with this model's tokenizer; it must be at "
                              "least %d (and at most %lld with generate_tokens %d in the model's context)",
                              key_at(at->needle_context_tokens, w, sizeof w), cfg->needle_context_tokens, need - 1,
                              need, (long long)(ctx - gen), cfg->generate_tokens);
    }
    for (int t = 0; t < cfg->n_texts && !rc; t++) {
        prompt p = {0};
        const char *base = strrchr(cfg->texts[t], '/');
        snprintf(p.label, sizeof p.label, "text %d/%d %s (%d + %d tokens)", t + 1, cfg->n_texts,
                 base ? base + 1 : cfg->texts[t], cfg->context_tokens, cfg->score_tokens);
        p.tokens = text_ids[t];
        p.n = cfg->context_tokens;
        p.cont = text_ids[t] + cfg->context_tokens;
        p.n_cont = cfg->score_tokens + 1;
        rc = run_prompt(&ev, &p, err);
        res->prompts_text++;
    }
    if (!rc && cfg->needle_count > 0) {
        kv_rng rng;
        kv_rng_seed(&rng, cfg->seed);
        for (int i = 0; i < cfg->needle_count && !rc; i++) {
            prompt p = {0};
            rc = make_needle(&ev, i, filler, n_filler, &rng, &p, err);
            if (!rc)
                rc = run_prompt(&ev, &p, err);
            kv_free(p.tokens);
            res->prompts_needle++;
        }
    }
    kv_free(own);
    res->text_tokens_scored = res->n_rows ? res->rows[0].nll_count : 0;
    for (int t = 0; t < cfg->n_texts; t++)
        kv_free(text_ids[t]);
    kv_free(text_ids);
    kv_free(text_n);
    kv_free(ev.logits);
    kv_free(ev.bf16_enc);
    kv_free(enc);
    if (rc) {
        kv_eval_result_destroy(res);
        return rc;
    }
    *out = res;
    return KV_OK;
}

void kv_eval_result_destroy(kv_eval_result *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_rows; i++) {
        kv_free(r->rows[i].accepted);
        kv_free(r->rows[i].accepted_at);
        kv_free(r->rows[i].samples_at);
        kv_free(r->rows[i].layers);
        kv_free(r->rows[i].block_delta);
    }
    kv_free(r->rows);
    kv_free(r);
}
