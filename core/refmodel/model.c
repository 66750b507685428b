/* model.c — llama forward pass (RMSNorm, RoPE, GQA, SwiGLU) over OpenBLAS, in the manner of llama2.c.
 *
 * Weights are ggml's row-major [out][in] matrices (GGUF dims {in, out}),
 * dequantized once at load to fp32 and kept transposed, Wt [in][out], so a
 * projection of n rows is Y[n][out] = X[n][in] · Wt: single-threaded sgemm
 * panels for a prefill, a fixed-order loop for decode rows, so that a row's
 * result never depends on the batch around it nor on the thread count (see
 * "Products" below). RoPE rotates adjacent pairs
 * (x[2i], x[2i+1]) — the GGUF llama convention (the converter permutes Q and K
 * so that this equals Hugging Face's rotate-half). The output projection is
 * the token embedding when the file has no output.weight (tied, as SmolLM2).
 */
#include "core/refmodel/model.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/refmodel/gguf.h"

enum {
    SGEMM_MIN_ROWS = 16, /* sequences of at least this many rows in a batch go through sgemm */
    PANEL = 128,         /* columns of one sgemm panel (a multiple of OpenBLAS's unroll) */
    JB = 2048,           /* columns of one matmul_rows pass (its rows' blocks stay in cache) */
    MAX_THREADS = 64,
};

typedef struct layer_weights {
    float *attn_norm; /* (dim) */
    float *wq;        /* (dim, dim): transposed, [in][out] */
    float *wk;        /* (dim, kv_dim) */
    float *wv;        /* (dim, kv_dim) */
    float *wo;        /* (dim, dim) */
    float *ffn_norm;  /* (dim) */
    float *w_gate;    /* (dim, hidden) */
    float *w_up;      /* (dim, hidden) */
    float *w_down;    /* (hidden, dim) */
} layer_weights;

struct kv_model {
    kv_model_config cfg;
    kv_tokenizer *tok;
    float *embedding;     /* (vocab, dim): row t is token t's vector */
    float *output;        /* (dim, vocab): the output projection transposed (the embedding's when tied) */
    float *output_norm;   /* (dim) */
    layer_weights *layers;/* [n_layers] */
    double *inv_freq;     /* (head_dim / 2): RoPE base^(-2i / head_dim) */
    int threads;          /* threads a product may use (OpenBLAS's count at load); results do not depend on it */
};

/* ---- Loading ---------------------------------------------------------------------------- */

static int get_dim(const kv_gguf *g, const char *key, uint32_t lo, uint32_t hi, int *out, kv_error *err)
{
    uint32_t v;
    if (kv_gguf_get_u32(g, key, &v, err))
        return KV_EINPUT;
    if (v < lo || v > hi)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' is %u (must be %u..%u)", kv_gguf_name(g), key, v, lo, hi);
    *out = (int)v;
    return KV_OK;
}

/* out[j][i] = in[i][j] for in [rows][cols]. */
static float *transpose(const float *in, size_t rows, size_t cols)
{
    float *out = kv_malloc(rows * cols * sizeof *out);
    enum { B = 32 };
    for (size_t i0 = 0; i0 < rows; i0 += B)
        for (size_t j0 = 0; j0 < cols; j0 += B)
            for (size_t i = i0; i < i0 + B && i < rows; i++)
                for (size_t j = j0; j < j0 + B && j < cols; j++)
                    out[j * rows + i] = in[i * cols + j];
    return out;
}

/* Loads tensor `name` of shape {d0, d1} (d1 = 1 for a vector) as fp32. */
static int load_tensor(const kv_gguf *g, const char *name, uint64_t d0, uint64_t d1, float **out, double *count,
                       kv_error *err)
{
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    if (!t)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s' is missing", kv_gguf_name(g), name);
    uint64_t rows = t->n_elements / t->dims[0];
    if (t->dims[0] != d0 || rows != d1 || t->dims[2] != 1 || t->dims[3] != 1)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s' has shape {%llu, %llu, %llu, %llu}, expected {%llu, %llu}",
                            kv_gguf_name(g), name, (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                            (unsigned long long)t->dims[2], (unsigned long long)t->dims[3], (unsigned long long)d0,
                            (unsigned long long)d1);
    float *w = kv_malloc((size_t)(d0 * d1) * sizeof *w);
    int rc = kv_gguf_tensor_rows_f32(t, 0, d1, w, err);
    if (rc) {
        kv_free(w);
        return kv_error_prefix(err, "%s: ", kv_gguf_name(g));
    }
    *out = w;
    *count += (double)(d0 * d1);
    return KV_OK;
}

/* Loads a matrix {in, out} and keeps it transposed, [in][out]. */
static int load_matrix(const kv_gguf *g, const char *name, uint64_t in, uint64_t out, float **wt, double *count,
                       kv_error *err)
{
    float *w;
    int rc = load_tensor(g, name, in, out, &w, count, err);
    if (rc)
        return rc;
    *wt = transpose(w, (size_t)out, (size_t)in);
    kv_free(w);
    return KV_OK;
}

static int load_config(const kv_gguf *g, kv_model_config *c, kv_error *err)
{
    const char *file = kv_gguf_name(g);
    kv_gguf_str arch;
    if (kv_gguf_get_string(g, "general.architecture", &arch, err))
        return KV_EINPUT;
    if (!kv_gguf_str_eq(arch, "llama"))
        return kv_error_set(err, KV_EINPUT, "%s: key 'general.architecture': '%.*s' is not supported (llama is)", file,
                            (int)(arch.len < 40 ? arch.len : 40), arch.ptr);
    kv_gguf_str name = {"", 0};
    if (kv_gguf_has(g, "general.name"))
        kv_gguf_get_string(g, "general.name", &name, NULL);
    snprintf(c->name, sizeof c->name, "%.*s", (int)(name.len < 120 ? name.len : 120), name.ptr);
    if (get_dim(g, "llama.block_count", 1, 1024, &c->n_layers, err) ||
        get_dim(g, "llama.embedding_length", 1, 1 << 16, &c->dim, err) ||
        get_dim(g, "llama.feed_forward_length", 1, 1 << 18, &c->hidden, err) ||
        get_dim(g, "llama.attention.head_count", 1, 1024, &c->n_heads, err) ||
        get_dim(g, "llama.context_length", 1, 1 << 20, &c->context_length, err))
        return KV_EINPUT;
    c->n_kv_heads = c->n_heads;
    if (kv_gguf_has(g, "llama.attention.head_count_kv") &&
        get_dim(g, "llama.attention.head_count_kv", 1, 1024, &c->n_kv_heads, err))
        return KV_EINPUT;
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2)
        return kv_error_set(err, KV_EINPUT,
                            "%s: %d heads and %d KV heads do not divide embedding_length %d into even head sizes", file,
                            c->n_heads, c->n_kv_heads, c->dim);
    c->head_dim = c->dim / c->n_heads;
    if (kv_gguf_has(g, "llama.rope.dimension_count")) {
        int rd;
        if (get_dim(g, "llama.rope.dimension_count", 1, 1 << 16, &rd, err))
            return KV_EINPUT;
        if (rd != c->head_dim)
            return kv_error_set(err, KV_EINPUT,
                                "%s: key 'llama.rope.dimension_count' is %d; only full rotary embedding (%d) is supported",
                                file, rd, c->head_dim);
    }
    c->rope_base = 10000.0f;
    c->norm_eps = 1e-5f;
    if (kv_gguf_has(g, "llama.rope.freq_base") && kv_gguf_get_f32(g, "llama.rope.freq_base", &c->rope_base, err))
        return KV_EINPUT;
    if (kv_gguf_has(g, "llama.attention.layer_norm_rms_epsilon") &&
        kv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->norm_eps, err))
        return KV_EINPUT;
    if (!(c->rope_base > 1.0f) || !(c->norm_eps > 0.0f) || !(c->norm_eps < 1.0f))
        return kv_error_set(err, KV_EINPUT, "%s: rope.freq_base %g or layer_norm_rms_epsilon %g out of range", file,
                            (double)c->rope_base, (double)c->norm_eps);
    if (kv_gguf_has(g, "llama.rope.scaling.type")) {
        kv_gguf_str st;
        if (kv_gguf_get_string(g, "llama.rope.scaling.type", &st, err))
            return KV_EINPUT;
        if (!kv_gguf_str_eq(st, "none"))
            return kv_error_set(err, KV_EINPUT, "%s: key 'llama.rope.scaling.type': RoPE scaling is not supported",
                                file);
    }
    return KV_OK;
}

int kv_model_load(const char *path, kv_model **out, kv_error *err)
{
    *out = NULL;
    kv_gguf *g;
    int rc = kv_gguf_open(path, &g, err);
    if (rc)
        return rc;
    kv_model *m = kv_calloc(1, sizeof *m);
    kv_model_config *c = &m->cfg;
    rc = load_config(g, c, err);
    if (!rc)
        rc = kv_tokenizer_create(g, &m->tok, err);
    const kv_gguf_tensor *emb = rc ? NULL : kv_gguf_find_tensor(g, "token_embd.weight");
    if (!rc && !emb)
        rc = kv_error_set(err, KV_EINPUT, "%s: tensor 'token_embd.weight' is missing", path);
    if (!rc) {
        c->vocab = (int)(emb->n_elements / emb->dims[0]);
        if (c->vocab != kv_tokenizer_vocab_size(m->tok))
            rc = kv_error_set(err, KV_EINPUT, "%s: token_embd.weight has %d rows but the tokenizer has %d tokens", path,
                              c->vocab, kv_tokenizer_vocab_size(m->tok));
    }
    double n = 0;
    uint64_t D = (uint64_t)c->dim, KV = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, H = (uint64_t)c->hidden;
    if (!rc)
        rc = load_tensor(g, "token_embd.weight", D, (uint64_t)c->vocab, &m->embedding, &n, err);
    if (!rc)
        rc = load_tensor(g, "output_norm.weight", D, 1, &m->output_norm, &n, err);
    if (!rc) {
        if (kv_gguf_find_tensor(g, "output.weight"))
            rc = load_matrix(g, "output.weight", D, (uint64_t)c->vocab, &m->output, &n, err);
        else /* tied: the same weights, also kept transposed */
            m->output = transpose(m->embedding, (size_t)c->vocab, (size_t)D);
    }
    if (!rc)
        m->layers = kv_calloc((size_t)c->n_layers, sizeof *m->layers);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        layer_weights *w = &m->layers[l];
        char name[96];
#define LOAD(how, field, suffix, d0, d1)                                                                         \
    if (!rc) {                                                                                                   \
        snprintf(name, sizeof name, "blk.%d." suffix, l);                                                        \
        rc = how(g, name, d0, d1, &w->field, &n, err);                                                           \
    }
        LOAD(load_tensor, attn_norm, "attn_norm.weight", D, 1)
        LOAD(load_matrix, wq, "attn_q.weight", D, D)
        LOAD(load_matrix, wk, "attn_k.weight", D, KV)
        LOAD(load_matrix, wv, "attn_v.weight", D, KV)
        LOAD(load_matrix, wo, "attn_output.weight", D, D)
        LOAD(load_tensor, ffn_norm, "ffn_norm.weight", D, 1)
        LOAD(load_matrix, w_gate, "ffn_gate.weight", D, H)
        LOAD(load_matrix, w_up, "ffn_up.weight", D, H)
        LOAD(load_matrix, w_down, "ffn_down.weight", H, D)
#undef LOAD
    }
    kv_gguf_destroy(g); /* everything needed was copied or dequantized */
    if (rc) {
        kv_model_destroy(m);
        return rc;
    }
    c->parameters = n;
    m->threads = openblas_get_num_threads();
    m->threads = m->threads < 1 ? 1 : m->threads > MAX_THREADS ? MAX_THREADS : m->threads;
    m->inv_freq = kv_malloc((size_t)(c->head_dim / 2) * sizeof *m->inv_freq);
    for (int i = 0; i < c->head_dim / 2; i++)
        m->inv_freq[i] = pow((double)c->rope_base, -2.0 * i / c->head_dim);
    *out = m;
    return KV_OK;
}

int kv_model_read_config(const char *path, kv_model_config *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    kv_gguf *g;
    int rc = kv_gguf_open(path, &g, err);
    if (rc)
        return rc;
    rc = load_config(g, out, err);
    kv_gguf_destroy(g);
    return rc;
}

/* OpenBLAS's fork handler (exported, in no header); weak, so other BLAS builds link without it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

void kv_model_blas_park(void)
{
    if (blas_thread_shutdown_ != NULL)
        (void)blas_thread_shutdown_(); /* always 0 */
}

void kv_model_destroy(kv_model *m)
{
    if (!m)
        return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            layer_weights *w = &m->layers[l];
            float *all[] = {w->attn_norm, w->wq, w->wk, w->wv, w->wo, w->ffn_norm, w->w_gate, w->w_up, w->w_down};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                kv_free(all[i]);
        }
    kv_free(m->layers);
    kv_free(m->output);
    kv_free(m->embedding);
    kv_free(m->output_norm);
    kv_free(m->inv_freq);
    kv_tokenizer_destroy(m->tok);
    kv_free(m);
}

const kv_model_config *kv_model_get_config(const kv_model *m) { return &m->cfg; }
const kv_tokenizer *kv_model_tokenizer(const kv_model *m) { return m->tok; }

kv_kvstore_shape kv_model_kv_shape(const kv_model *m)
{
    return (kv_kvstore_shape){m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim};
}

/* ---- The forward pass ------------------------------------------------------------------------ */

/* out[n][dim] = x[n][dim] / rms(x) * w (sum of squares in double). */
static void rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            o[i] = xr[i] * inv * w[i];
    }
}

/* ---- Products that round the same whatever the batch and the thread count ---------------------------- */

/* OpenBLAS's sgemm rounds a row differently with the matrix's height and
   with its thread count (tried: one row of a 1024-row product differs from
   the same row in a 7-row product, and a 1024-row product with 1 thread
   differs from the same with 2). So the forward pass never lets it choose:
   - rows of short sequences (decode, speculation) go through matmul_rows,
     every sum in the order i = 0..in-1: a row's result depends on its own
     input alone;
   - a long sequence (a prefill) is one single-threaded sgemm per fixed panel
     of PANEL columns: a panel's result depends on the sequence's length and
     the panel alone.
   Column blocks and panels are spread over up to kv_model.threads threads;
   which thread computes a block changes nothing in it. */

typedef struct product {
    float *y;        /* [n][out] */
    const float *x;  /* [n][in] */
    const float *wt; /* [in][out] */
    int n, in, out;  /* rows, inner and output dimension */
    bool sgemm;      /* blocks are sgemm panels of PANEL columns, else matmul_rows blocks of JB */
} product;

typedef struct product_share {
    const product *p; /* the product */
    int j0, j1;       /* its columns [j0, j1): whole panels for sgemm */
} product_share;

/* Columns [j0, j0 + nj) of y = x · Wt, every sum in the order i = 0..in-1. */
static void rows_block(const product *p, int j0, int nj)
{
    size_t out = (size_t)p->out, in = (size_t)p->in;
    for (int r = 0; r < p->n; r++)
        memset(p->y + (size_t)r * out + j0, 0, (size_t)nj * sizeof *p->y);
    for (size_t i = 0; i < in; i++) {
        const float *restrict w = p->wt + i * out + j0;
        for (int r = 0; r < p->n; r++) {
            float a = p->x[(size_t)r * in + i];
            float *restrict yr = p->y + (size_t)r * out + j0;
            for (int j = 0; j < nj; j++)
                yr[j] += a * w[j];
        }
    }
}

static void *product_run(void *arg)
{
    const product_share *sh = arg;
    const product *p = sh->p;
    int w = p->sgemm ? PANEL : JB;
    for (int j0 = sh->j0; j0 < sh->j1; j0 += w) {
        int nj = sh->j1 - j0 < w ? sh->j1 - j0 : w;
        if (p->sgemm)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->n, nj, p->in, 1.0f, p->x, p->in, p->wt + j0,
                        p->out, 0.0f, p->y + j0, p->out);
        else
            rows_block(p, j0, nj);
    }
    return NULL;
}

/* Runs p's blocks on up to `threads` threads (this one included). */
static void product_compute(const product *p, int threads)
{
    int nb = p->sgemm ? (p->out + PANEL - 1) / PANEL : (p->out + 63) / 64;
    /* below about a million multiply-adds a thread costs more than it saves */
    double work = (double)p->n * p->in * p->out;
    int t = threads < nb ? threads : nb;
    if (work < 1e6 || t < 1)
        t = 1;
    t = t > MAX_THREADS ? MAX_THREADS : t;
    product_share sh[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started = 1;
    for (int i = 0; i < t; i++) { /* contiguous shares of nb units: panels, or 64 columns */
        int u = p->sgemm ? PANEL : 64, b0 = (int)((long)nb * i / t), b1 = (int)((long)nb * (i + 1) / t);
        int j1 = b1 * u < p->out ? b1 * u : p->out;
        sh[i] = (product_share){p, b0 * u, j1};
    }
    for (int i = 1; i < t; i++) {
        if (pthread_create(&tid[i], NULL, product_run, &sh[i]) != 0)
            break;
        started++;
    }
    if (started < t) /* no more threads: this one does the rest, same blocks */
        for (int i = started; i < t; i++)
            product_run(&sh[i]);
    product_run(&sh[0]);
    for (int i = 1; i < started; i++)
        pthread_join(tid[i], NULL);
}

/* y[n][out] = x[n][in] · Wt, rows independent: matmul_rows' blocks. */
static void matmul_rows(const kv_model *m, float *y, const float *x, const float *wt, int n, int in, int out)
{
    product p = {y, x, wt, n, in, out, false};
    product_compute(&p, m->threads);
}

/* y[n][out] = x[n][in] · Wt for the rows of batch b: a sequence of
   SGEMM_MIN_ROWS rows or more through sgemm panels, runs of shorter ones
   through matmul_rows. No row's result depends on the other sequences in the
   batch, nor on the thread count. */
static void matmul(const kv_model *m, float *y, const float *x, const float *wt, const kv_batch *b, int in, int out)
{
    int n = b->n;
    for (int r0 = 0; r0 < n;) {
        int r1 = r0 + 1;
        while (r1 < n && b->seq[r1] == b->seq[r0])
            r1++;
        if (r1 - r0 >= SGEMM_MIN_ROWS) {
            product p = {y + (size_t)r0 * out, x + (size_t)r0 * in, wt, r1 - r0, in, out, true};
            product_compute(&p, m->threads);
            r0 = r1;
            continue;
        }
        int s0 = r0; /* a run of short sequences: one pass over Wt for all of them */
        while (r0 < n) {
            r1 = r0 + 1;
            while (r1 < n && b->seq[r1] == b->seq[r0])
                r1++;
            if (r1 - r0 >= SGEMM_MIN_ROWS)
                break;
            r0 = r1;
        }
        matmul_rows(m, y + (size_t)s0 * out, x + (size_t)s0 * in, wt, r0 - s0, in, out);
    }
}

/* Rotates adjacent pairs of every head of every row by its position. */
static void rope(const kv_model *m, float *x, const int32_t *pos, int n, int heads)
{
    int hd = m->cfg.head_dim;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < hd / 2; i++) {
            double angle = (double)pos[r] * m->inv_freq[i];
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int h = 0; h < heads; h++) {
                float *p = x + ((size_t)r * heads + (size_t)h) * hd + 2 * i;
                float x0 = p[0], x1 = p[1];
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
        }
}

static int check_batch(const kv_model *m, const kv_batch *b, kv_kvstore **stores, kv_error *err)
{
    for (int i = 0; i < b->n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab)
            return kv_error_set(err, KV_EINPUT, "row %d: token id %d is outside the vocabulary (%d)", i, b->tokens[i],
                                m->cfg.vocab);
        if (b->pos[i] < 0 || b->pos[i] >= m->cfg.context_length)
            return kv_error_set(err, KV_EINPUT, "row %d: position %d is outside the context length %d", i, b->pos[i],
                                m->cfg.context_length);
        bool starts = i == 0 || b->seq[i] != b->seq[i - 1];
        if (starts) {
            for (int j = 0; j < i; j++)
                if (b->seq[j] == b->seq[i])
                    return kv_error_set(err, KV_EINPUT, "row %d: the rows of sequence %d are not contiguous", i,
                                        b->seq[i]);
            if (b->pos[i] < kv_kvstore_length(stores[b->seq[i]]))
                return kv_error_set(err, KV_EINPUT, "row %d: position %d is already in sequence %d's KV store", i,
                                    b->pos[i], b->seq[i]);
        } else if (b->pos[i] <= b->pos[i - 1]) {
            return kv_error_set(err, KV_EINPUT, "row %d: positions of sequence %d do not increase", i, b->seq[i]);
        }
    }
    return KV_OK;
}

int kv_model_forward(kv_model *m, const kv_batch *b, kv_kvstore **stores, float *logits, kv_error *err)
{
    const kv_model_config *c = &m->cfg;
    int n = b->n, D = c->dim, KV = c->n_kv_heads * c->head_dim, H = c->hidden;
    if (n <= 0)
        return KV_OK;
    int rc = check_batch(m, b, stores, err);
    if (rc)
        return rc;
    /* One OpenBLAS thread while the batch runs: its sgemm rounds differently with the
       thread count; the products spread fixed panels over threads themselves. */
    int blas_threads = openblas_get_num_threads();
    if (blas_threads != 1)
        openblas_set_num_threads(1);
    size_t N = (size_t)n;
    float *x = kv_malloc(N * D * sizeof *x), *xb = kv_malloc(N * D * sizeof *xb);
    float *q = kv_malloc(N * D * sizeof *q), *att = kv_malloc(N * D * sizeof *att);
    float *k = kv_malloc(N * KV * sizeof *k), *v = kv_malloc(N * KV * sizeof *v);
    float *hb = kv_malloc(N * H * sizeof *hb), *hb2 = kv_malloc(N * H * sizeof *hb2);

    for (int r = 0; r < n; r++)
        memcpy(x + (size_t)r * D, m->embedding + (size_t)b->tokens[r] * D, (size_t)D * sizeof *x);

    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        /* attention */
        rmsnorm(xb, x, w->attn_norm, n, D, c->norm_eps);
        matmul(m, q, xb, w->wq, b, D, D);
        matmul(m, k, xb, w->wk, b, D, KV);
        matmul(m, v, xb, w->wv, b, D, KV);
        rope(m, q, b->pos, n, c->n_heads);
        rope(m, k, b->pos, n, c->n_kv_heads);
        for (int r0 = 0; r0 < n;) {
            int r1 = r0 + 1;
            while (r1 < n && b->seq[r1] == b->seq[r0])
                r1++;
            kv_kvstore *s = stores[b->seq[r0]];
            kv_kvstore_append(s, l, k + (size_t)r0 * KV, v + (size_t)r0 * KV, b->pos + r0, r1 - r0);
            if (!rc)
                rc = kv_kvstore_attention(s, l, q + (size_t)r0 * D, b->pos + r0, r1 - r0, att + (size_t)r0 * D, err);
            r0 = r1;
        }
        matmul(m, xb, att, w->wo, b, D, D);
        for (size_t i = 0; i < N * D; i++)
            x[i] += xb[i];
        /* feed-forward: SwiGLU */
        rmsnorm(xb, x, w->ffn_norm, n, D, c->norm_eps);
        matmul(m, hb, xb, w->w_gate, b, D, H);
        matmul(m, hb2, xb, w->w_up, b, D, H);
        for (size_t i = 0; i < N * H; i++)
            hb[i] = hb[i] / (1.0f + expf(-hb[i])) * hb2[i];
        matmul(m, xb, hb, w->w_down, b, H, D);
        for (size_t i = 0; i < N * D; i++)
            x[i] += xb[i];
    }

    /* final norm and logits of the wanted rows */
    int nw = 0;
    for (int r = 0; r < n; r++)
        if (!b->want || b->want[r])
            memcpy(q + (size_t)nw++ * D, x + (size_t)r * D, (size_t)D * sizeof *x);
    if (nw > 0) {
        rmsnorm(xb, q, m->output_norm, nw, D, c->norm_eps);
        /* row by row whatever the batch: the wanted rows of a prefill vary with the speculation points */
        matmul_rows(m, logits, xb, m->output, nw, D, c->vocab);
    }
    kv_free(x);
    kv_free(xb);
    kv_free(q);
    kv_free(att);
    kv_free(k);
    kv_free(v);
    kv_free(hb);
    kv_free(hb2);
    if (blas_threads != 1)
        openblas_set_num_threads(blas_threads);
    return rc;
}

int32_t kv_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}
