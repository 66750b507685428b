/* cpu_attention.c — attention over paged, mixed-precision KV: the
 * double-precision reference (device 1) and the fast float path (device 0).
 *
 * Both first check every page descriptor against the buffers, then turn a
 * page's K or V into an f32 tile [ntokens][head_dim] with the exact decode
 * numerics (reference: cpu_ref.c loops; fast: the fused decode), so the two
 * differ only in the attention arithmetic.
 *
 * Reference: for each (query, head), logits, softmax and the weighted sum of
 * V in double over the whole KV head, rounded to f32 at the end.
 * Fast: work items are (KV head, block of queries); for each item, pass 1
 * decodes each K page once and computes the logits of all queries x GQA heads
 * of the block, pass 2 takes exp and the sums, pass 3 decodes each V page once
 * and accumulates. When scores are asked for, an item is a whole KV head (so
 * that no two threads add to the same score) and loops over query blocks.
 * This file holds the portable item; cpu_attention_avx512.c and
 * cpu_attention_avx2.c the ones that fuse dequantization into the dot
 * products, used on AVX-512 and on AVX2 CPUs. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_attention.h"
#include "backends/cpu/cpu_internal.h"
#include "backends/numerics.h"
#include "core/base/alloc.h"


/* ---- Checks ------------------------------------------------------------------ */

static size_t store_bytes(const kv_store_format *f, uint32_t ntok, uint32_t hd, size_t *meta)
{
    *meta = 0;
    if (f->kind == KV_STORE_F32)
        return (size_t)ntok * hd * 4;
    if (f->kind == KV_STORE_BF16)
        return (size_t)ntok * hd * 2;
    kv_quant_layout l = {ntok, hd, f->group_size, (kv_grouping)f->grouping};
    *meta = kv_layout_meta_bytes(&l);
    return kv_layout_packed_bytes(&l, f->anchor_bits ? f->anchor_bits : f->bits);
}

static int check_format(const kv_store_format *f, uint32_t page, const char *which, kv_error *err)
{
    if (f->kind > KV_STORE_QUANT)
        return kv_error_set(err, KV_EINPUT, "attention: page %u %s: unknown store kind %u", page, which, f->kind);
    if (f->kind != KV_STORE_QUANT)
        return KV_OK;
    if (f->bits < 1 || f->bits > 16 || f->group_size == 0 || f->grouping > KV_GROUP_CHANNEL ||
        (f->anchor_bits && f->anchor_bits >= f->bits))
        return kv_error_set(err, KV_EINPUT,
                            "attention: page %u %s: bad quantized format (bits %u, anchor_bits %u, group_size %u, "
                            "grouping %u)",
                            page, which, f->bits, f->anchor_bits, f->group_size, f->grouping);
    return KV_OK;
}

static int check_range(uint64_t off, size_t bytes, size_t align, size_t have, uint32_t page, const char *which,
                       const char *part, kv_error *err)
{
    if (off % align)
        return kv_error_set(err, KV_EINPUT, "attention: page %u %s %s offset %llu is not a multiple of %zu", page,
                            which, part, (unsigned long long)off, align);
    if (off > have || bytes > have - off)
        return kv_error_set(err, KV_EINPUT, "attention: page %u %s %s needs %zu bytes at %llu, kv_data holds %zu",
                            page, which, part, bytes, (unsigned long long)off, have);
    return KV_OK;
}

static int check_store(const kv_store_format *f, uint32_t ntok, uint32_t hd, uint64_t data, uint64_t meta,
                       size_t have, uint32_t page, const char *which, kv_error *err)
{
    int rc = check_format(f, page, which, err);
    if (rc)
        return rc;
    size_t meta_bytes, bytes = store_bytes(f, ntok, hd, &meta_bytes);
    rc = check_range(data, bytes, f->kind == KV_STORE_F32 ? 4 : f->kind == KV_STORE_BF16 ? 2 : 1, have, page, which,
                     "data", err);
    if (!rc && f->kind == KV_STORE_QUANT)
        rc = check_range(meta, meta_bytes, 2, have, page, which, "meta", err);
    return rc;
}

static size_t buffer_left(const kv_bref *r)
{
    return r->buf && r->offset <= r->buf->bytes ? r->buf->bytes - r->offset : 0;
}

/* Resolves and checks all arguments; fills *t (free t->head_tokens after). */
static int attn_resolve(const cpu_ctx *c, const kv_attention_args *a, attn *t, kv_error *err)
{
    memset(t, 0, sizeof *t);
    t->a = a;
    t->c = c;
    t->group = a->n_heads / a->n_kv_heads;
    size_t qn = (size_t)a->n_queries * a->n_heads * a->head_dim;
    int rc = kv_cpu_span(&a->q, qn * 4, (void **)&t->q, "attention", "q", err);
    if (!rc)
        rc = kv_cpu_span(&a->q_pos, (size_t)a->n_queries * 4, (void **)&t->q_pos, "attention", "q_pos", err);
    if (!rc)
        rc = kv_cpu_span(&a->out, qn * 4, (void **)&t->out, "attention", "out", err);
    if (!rc)
        rc = kv_cpu_span(&a->head_pages, (size_t)a->n_kv_heads * 8, (void **)&t->head_pages, "attention",
                         "head_pages", err);
    if (!rc && a->n_pages)
        rc = kv_cpu_span(&a->pages, (size_t)a->n_pages * sizeof(kv_page_desc), (void **)&t->pages, "attention",
                         "pages", err);
    if (!rc && a->scores.buf)
        rc = kv_cpu_span(&a->scores, (size_t)a->n_kv_heads * a->score_stride * 4, (void **)&t->scores,
                         "attention", "scores", err);
    if (rc)
        return rc;
    size_t n_positions = buffer_left(&a->positions) / 4, kv_bytes = buffer_left(&a->kv_data);
    if (a->n_pages) {
        t->positions = (const uint32_t *)(a->positions.buf->data + a->positions.offset);
        t->kv = a->kv_data.buf->data + a->kv_data.offset;
    }
    for (uint32_t p = 0; p < a->n_pages && !rc; p++) {
        const kv_page_desc *pg = &t->pages[p];
        if ((uint64_t)pg->pos_index + pg->ntokens > n_positions)
            rc = kv_error_set(err, KV_EINPUT, "attention: page %u uses positions [%u, %llu) but positions holds %zu",
                              p, pg->pos_index, (unsigned long long)pg->pos_index + pg->ntokens, n_positions);
        if (!rc && pg->ntokens)
            rc = check_store(&pg->key, pg->ntokens, a->head_dim, pg->key_data, pg->key_meta, kv_bytes, p, "key",
                             err);
        if (!rc && pg->ntokens)
            rc = check_store(&pg->value, pg->ntokens, a->head_dim, pg->value_data, pg->value_meta, kv_bytes, p,
                             "value", err);
        if (pg->ntokens > t->max_page_tokens)
            t->max_page_tokens = pg->ntokens;
    }
    if (rc)
        return rc;
    t->head_tokens = kv_calloc(a->n_kv_heads ? a->n_kv_heads : 1, sizeof *t->head_tokens);
    for (uint32_t h = 0; h < a->n_kv_heads; h++) {
        uint32_t first = t->head_pages[2 * h], count = t->head_pages[2 * h + 1];
        if ((uint64_t)first + count > a->n_pages) {
            kv_free(t->head_tokens);
            t->head_tokens = NULL;
            return kv_error_set(err, KV_EINPUT, "attention: KV head %u uses pages [%u, %llu) but there are %u", h,
                                first, (unsigned long long)first + count, a->n_pages);
        }
        for (uint32_t p = first; p < first + count; p++)
            t->head_tokens[h] += t->pages[p].ntokens;
        if (t->head_tokens[h] > t->max_head_tokens)
            t->max_head_tokens = t->head_tokens[h];
        if (t->scores && t->head_tokens[h] > a->score_stride) {
            kv_free(t->head_tokens);
            t->head_tokens = NULL;
            return kv_error_set(err, KV_EINPUT, "attention: KV head %u has %llu tokens but score_stride is %u", h,
                                (unsigned long long)t->head_tokens[h], a->score_stride);
        }
    }
    return KV_OK;
}

/* ---- Pages to f32 --------------------------------------------------------- */

/* One page's K (value = 0) or V (value = 1) as f32 [ntokens][head_dim]. The
   reference uses cpu_ref.c; the fast device the fused decode. codes is
   scratch of ntokens*head_dim u16 (reference only). */
void kv_cpu_page_tile(const attn *t, const kv_page_desc *pg, int value, float *tile, uint16_t *codes,
                      kv_cpu_scratch *scratch)
{
    const kv_store_format *f = value ? &pg->value : &pg->key;
    const uint8_t *data = t->kv + (value ? pg->value_data : pg->key_data);
    uint32_t hd = t->a->head_dim;
    size_t n = (size_t)pg->ntokens * hd;
    if (f->kind == KV_STORE_F32) {
        memcpy(tile, data, n * 4);
        return;
    }
    if (f->kind == KV_STORE_BF16) {
        const uint16_t *h = (const uint16_t *)data;
        for (size_t i = 0; i < n; i++)
            tile[i] = kv_bf16_to_f32(h[i]);
        return;
    }
    kv_quant_layout l = {pg->ntokens, hd, f->group_size, (kv_grouping)f->grouping};
    const uint16_t *scale = (const uint16_t *)(t->kv + (value ? pg->value_meta : pg->key_meta));
    const uint16_t *zero = scale + kv_layout_groups(&l);
    unsigned width = f->anchor_bits ? f->anchor_bits : f->bits;
    size_t groups = kv_layout_groups(&l);
    if (t->c->reference) {
        kv_cpu_ref_unpack(&l, width, data, codes, 0, groups);
        kv_cpu_ref_dequantize(&l, f->bits, f->anchor_bits, codes, scale, zero, tile, 0, groups);
    } else {
        kv_cpu_fast_decode(t->c->isa, &l, f->bits, f->anchor_bits, data, NULL, scale, zero, tile, 0, groups,
                           scratch);
    }
}

/* ---- Reference (double) ---------------------------------------------------- */

static int attention_reference(const attn *t)
{
    const kv_attention_args *a = t->a;
    uint32_t hd = a->head_dim;
    size_t maxtok = t->max_head_tokens ? t->max_head_tokens : 1;
    float *K = kv_malloc(maxtok * hd * sizeof *K), *V = kv_malloc(maxtok * hd * sizeof *V);
    uint32_t *pos = kv_malloc(maxtok * sizeof *pos);
    uint16_t *codes = kv_malloc(((size_t)t->max_page_tokens * hd + 1) * sizeof *codes);
    double *logit = kv_malloc(maxtok * sizeof *logit), *acc = kv_malloc(hd * sizeof *acc);
    double *prob_sum = kv_malloc(maxtok * sizeof *prob_sum);
    for (uint32_t kh = 0; kh < a->n_kv_heads; kh++) {
        /* the whole KV head as f32, tokens in page order */
        size_t T = 0;
        for (uint32_t p = t->head_pages[2 * kh]; p < t->head_pages[2 * kh] + t->head_pages[2 * kh + 1]; p++) {
            const kv_page_desc *pg = &t->pages[p];
            if (!pg->ntokens)
                continue;
            kv_cpu_page_tile(t, pg, 0, K + T * hd, codes, NULL);
            kv_cpu_page_tile(t, pg, 1, V + T * hd, codes, NULL);
            for (uint32_t i = 0; i < pg->ntokens; i++)
                pos[T + i] = t->positions[pg->pos_index + i];
            T += pg->ntokens;
        }
        for (uint32_t g = 0; g < t->group; g++) {
            uint32_t h = kh * t->group + g;
            for (size_t i = 0; i < T; i++)
                prob_sum[i] = 0.0;
            for (uint32_t qi = 0; qi < a->n_queries; qi++) {
                const float *q = t->q + ((size_t)qi * a->n_heads + h) * hd;
                float *out = t->out + ((size_t)qi * a->n_heads + h) * hd;
                double mx = -INFINITY;
                for (size_t i = 0; i < T; i++) {
                    if (pos[i] > t->q_pos[qi]) {
                        logit[i] = -INFINITY;
                        continue;
                    }
                    double dot = 0.0;
                    for (uint32_t d = 0; d < hd; d++)
                        dot += (double)q[d] * (double)K[i * hd + d];
                    logit[i] = (double)a->scale * dot;
                    if (logit[i] > mx)
                        mx = logit[i];
                }
                for (uint32_t d = 0; d < hd; d++)
                    acc[d] = 0.0;
                if (mx == -INFINITY) { /* no visible token */
                    for (uint32_t d = 0; d < hd; d++)
                        out[d] = 0.0f;
                    continue;
                }
                double sum = 0.0;
                for (size_t i = 0; i < T; i++) {
                    logit[i] = logit[i] == -INFINITY ? 0.0 : exp(logit[i] - mx);
                    sum += logit[i];
                }
                for (size_t i = 0; i < T; i++) {
                    double p = logit[i] / sum;
                    prob_sum[i] += p;
                    if (p == 0.0)
                        continue;
                    for (uint32_t d = 0; d < hd; d++)
                        acc[d] += p * (double)V[i * hd + d];
                }
                for (uint32_t d = 0; d < hd; d++)
                    out[d] = (float)acc[d];
            }
            if (t->scores) {
                float *sc = t->scores + (size_t)kh * a->score_stride;
                for (size_t i = 0; i < T; i++)
                    if (g == 0 || (float)prob_sum[i] > sc[i])
                        sc[i] = (float)prob_sum[i];
            }
        }
    }
    kv_free(K);
    kv_free(V);
    kv_free(pos);
    kv_free(codes);
    kv_free(logit);
    kv_free(acc);
    kv_free(prob_sum);
    return KV_OK;
}

/* ---- Prefetch of later pages (the SIMD items) ---------------------------------- */

void kv_cpu_prefetch_page(const attn *t, const kv_page_desc *pg, int value, pf_cursor *c)
{
    size_t meta = 0, bytes = store_bytes(value ? &pg->value : &pg->key, pg->ntokens, t->a->head_dim, &meta);
    c->at[0] = (const char *)t->kv + (value ? pg->value_data : pg->key_data);
    c->at[1] = (const char *)t->kv + (value ? pg->value_meta : pg->key_meta);
    c->n[0] = bytes ? (bytes + 63) / 64 : 0;
    c->n[1] = meta ? (meta + 63) / 64 : 0;
}

void kv_cpu_prefetch_rest(pf_cursor *c)
{
    while (c->n[0] || c->n[1])
        kv_cpu_prefetch_step(c);
}

/* ---- The items' common steps ----------------------------------------------------- */

void kv_cpu_item_begin(const fast_job *j, fast_ws *w, size_t item, item_span *s)
{
    const attn *t = j->t;
    s->kh = (uint32_t)(j->per_head ? item : item / j->blocks);
    s->b0 = j->per_head ? 0 : (uint32_t)(item % j->blocks);
    s->b1 = j->per_head ? j->blocks : s->b0 + 1;
    s->T = t->head_tokens[s->kh];
    s->pfirst = t->head_pages[2 * s->kh];
    s->pend = s->pfirst + t->head_pages[2 * s->kh + 1];
    if (w->score_acc)
        memset(w->score_acc, 0, (size_t)t->group * (s->T ? s->T : 1) * sizeof(float));
}

uint32_t kv_cpu_block_rows(const fast_job *j, uint32_t b, uint32_t *q0)
{
    uint32_t n = j->t->a->n_queries, first = b * j->block, last = first + j->block < n ? first + j->block : n;
    *q0 = first;
    return (last - first) * j->t->group;
}

const kv_page_desc *kv_cpu_pass_page(const attn *t, uint32_t p, uint32_t pend, int value, pf_cursor *pf)
{
    kv_cpu_prefetch_rest(pf);
    if (p + KV_CPU_PREFETCH_PAGES < pend)
        kv_cpu_prefetch_page(t, &t->pages[p + KV_CPU_PREFETCH_PAGES], value, pf);
    return t->pages[p].ntokens ? &t->pages[p] : NULL;
}

/* ---- Scores (every item) ------------------------------------------------------- */

void kv_cpu_scores_add4(const attn *t, fast_ws *w, const float *L, uint32_t g4, uint32_t nq, size_t T)
{
    if (!w->score_acc)
        return;
    for (uint32_t r = 0; r < 4 && g4 * 4 + r < nq; r++) {
        float *sa = w->score_acc + (size_t)((g4 * 4 + r) % t->group) * T;
        for (size_t i = 0; i < T; i++)
            sa[i] += L[4 * i + r];
    }
}

void kv_cpu_scores_store(const attn *t, const fast_ws *w, uint32_t kh, size_t T)
{
    float *sc = t->scores + (size_t)kh * t->a->score_stride;
    for (size_t i = 0; i < T; i++) {
        float m = w->score_acc[i];
        for (uint32_t g = 1; g < t->group; g++)
            m = w->score_acc[g * T + i] > m ? w->score_acc[g * T + i] : m;
        sc[i] = m;
    }
}

/* ---- Outputs (the portable and AVX2 items) ------------------------------------ */

void kv_cpu_rows_store(const attn *t, const double *acc, uint32_t q0, uint32_t nq, uint32_t kh)
{
    const kv_attention_args *a = t->a;
    uint32_t hd = a->head_dim, G = t->group;
    for (uint32_t r = 0; r < nq; r++) {
        float *out = t->out + ((size_t)(q0 + r / G) * a->n_heads + kh * G + r % G) * hd;
        for (uint32_t d = 0; d < hd; d++)
            out[d] = (float)acc[(size_t)r * hd + d];
    }
}

/* ---- Fast (float) ------------------------------------------------------------ */

/* In double (each product exact): an f32 sum of head_dim products drifts by
   more than 1e-5 of a large query's logits, which the softmax then amplifies
   over thousands of tokens (cpu_kivi_verify's huge queries at 4097 tokens). */
static float dot_generic(const float *a, const float *b, uint32_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint32_t d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += (double)a[d] * b[d];
        s1 += (double)a[d + 1] * b[d + 1];
        s2 += (double)a[d + 2] * b[d + 2];
        s3 += (double)a[d + 3] * b[d + 3];
    }
    for (; d < n; d++)
        s0 += (double)a[d] * b[d];
    return (float)((s0 + s1) + (s2 + s3));
}

/* y (double) += p * x: the weighted sum of V over a whole KV head is kept in
   double so that long contexts stay within the 1e-5 tolerance. */
static void axpy_generic(double *y, float p, const float *x, uint32_t n)
{
    for (uint32_t d = 0; d < n; d++)
        y[d] += (double)(p * x[d]);
}

/* exp(x − mx) over a row; exact 0 where x == -Inf. Returns the sum (in double). */
static double exp_row_generic(float *x, size_t n, float mx)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        x[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - mx);
        sum += x[i];
    }
    return sum;
}


/* The portable work item (any head_dim, any CPU). */
static void fast_item(void *arg, size_t i0, size_t i1, int worker)
{
    const fast_job *j = arg;
    const attn *t = j->t;
    const kv_attention_args *a = t->a;
    fast_ws *w = &j->ws[worker];
    uint32_t hd = a->head_dim, G = t->group;
    for (size_t item = i0; item < i1; item++) {
        item_span s;
        kv_cpu_item_begin(j, w, item, &s);
        uint32_t kh = s.kh, pfirst = s.pfirst, pend = s.pend;
        size_t T = s.T;
        for (uint32_t b = s.b0; b < s.b1; b++) {
            uint32_t q0, nq = kv_cpu_block_rows(j, b, &q0); /* rows: (query, head in group) */
            const float *qs[64 * 16];
            float dots[64 * 16];
            for (uint32_t r = 0; r < nq; r++)
                qs[r] = t->q + ((size_t)(q0 + r / G) * a->n_heads + kh * G + r % G) * hd;
            /* pass 1: logits */
            size_t base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = &t->pages[p];
                if (!pg->ntokens)
                    continue;
                kv_cpu_page_tile(t, pg, 0, w->tile, NULL, &w->dec);
                for (uint32_t i = 0; i < pg->ntokens; i++) {
                    const float *k = w->tile + (size_t)i * hd;
                    for (uint32_t r = 0; r < nq; r++)
                        dots[r] = dot_generic(qs[r], k, hd);
                    uint32_t pos = t->positions[pg->pos_index + i];
                    for (uint32_t r = 0; r < nq; r++)
                        w->logits[r * T + base + i] = pos <= t->q_pos[q0 + r / G] ? a->scale * dots[r] : -INFINITY;
                }
                base += pg->ntokens;
            }
            /* pass 2: softmax of each row */
            for (uint32_t r = 0; r < nq; r++) {
                float *row = w->logits + r * T, mx = -INFINITY;
                for (size_t i = 0; i < T; i++)
                    mx = row[i] > mx ? row[i] : mx;
                if (mx == -INFINITY) { /* no visible token: probabilities 0, output 0 */
                    memset(row, 0, T * sizeof *row);
                    continue;
                }
                float inv = (float)(1.0 / exp_row_generic(row, T, mx));
                for (size_t i = 0; i < T; i++)
                    row[i] *= inv;
                if (w->score_acc)
                    for (size_t i = 0; i < T; i++)
                        w->score_acc[(r % G) * T + i] += row[i];
            }
            /* pass 3: weighted sum of V */
            double *acc = (double *)w->acc; /* w->acc has room for doubles (attention_fast) */
            memset(acc, 0, (size_t)nq * hd * sizeof(double));
            base = 0;
            for (uint32_t p = pfirst; p < pend; p++) {
                const kv_page_desc *pg = &t->pages[p];
                if (!pg->ntokens)
                    continue;
                kv_cpu_page_tile(t, pg, 1, w->tile, NULL, &w->dec);
                for (uint32_t i = 0; i < pg->ntokens; i++) {
                    const float *v = w->tile + (size_t)i * hd;
                    for (uint32_t r = 0; r < nq; r++) {
                        float pr = w->logits[r * T + base + i];
                        if (pr == 0.0f)
                            continue;
                        axpy_generic(acc + (size_t)r * hd, pr, v, hd);
                    }
                }
                base += pg->ntokens;
            }
            kv_cpu_rows_store(t, acc, q0, nq, kh);
        }
        if (w->score_acc)
            kv_cpu_scores_store(t, w, kh, T);
    }
}

static int attention_fast(const attn *t)
{
    const kv_attention_args *a = t->a;
    int workers = t->c->threads;
    size_t T = t->max_head_tokens ? t->max_head_tokens : 1;
    /* queries per block: at most 64 rows of (query, head) and about 1 M logits */
    uint32_t block = (uint32_t)(1048576 / ((size_t)t->group * T));
    uint32_t cap = 1024 / t->group;
    block = block < 1 ? 1 : block > cap ? cap : block;
    if (block > a->n_queries)
        block = a->n_queries ? a->n_queries : 1;
    fast_job j = {t, kv_calloc((size_t)workers, sizeof(fast_ws)), block, (a->n_queries + block - 1) / block,
                  t->scores != NULL};
    uint32_t max_group = 1;
    for (uint32_t p = 0; p < a->n_pages; p++) {
        if (t->pages[p].key.kind == KV_STORE_QUANT && t->pages[p].key.group_size > max_group)
            max_group = t->pages[p].key.group_size;
        if (t->pages[p].value.kind == KV_STORE_QUANT && t->pages[p].value.group_size > max_group)
            max_group = t->pages[p].value.group_size;
    }
    for (int i = 0; i < workers; i++) {
        fast_ws *w = &j.ws[i];
        w->tile = kv_malloc(((size_t)t->max_page_tokens * a->head_dim + 16) * sizeof(float));
        w->logits = kv_malloc((size_t)block * t->group * T * sizeof(float));
        w->acc = kv_malloc((size_t)block * t->group * a->head_dim * sizeof(float));
        w->score_acc = t->scores ? kv_malloc((size_t)t->group * T * sizeof(float)) : NULL;
        kv_cpu_scratch_init(&w->dec, max_group);
        size_t rows4 = ((size_t)block * t->group + 3) / 4 * 4;
        w->qpad = kv_calloc(3 * rows4 * a->head_dim, sizeof(float)); /* AVX-512: q in 3 element orders */
        w->logits = kv_realloc(w->logits, rows4 * T * sizeof(float));
        w->acc = kv_realloc(w->acc, 3 * rows4 * a->head_dim * sizeof(double)); /* AVX-512: 3 orders, doubles */
        w->sz = kv_malloc(((size_t)t->max_page_tokens * a->head_dim + 16) * 2 * sizeof(float));
    }
    size_t items = j.per_head ? a->n_kv_heads : (size_t)a->n_kv_heads * j.blocks;
    kv_cpu_range_fn item = fast_item;
    if (strcmp(t->c->isa, "avx512") == 0 && a->head_dim % 32 == 0)
        item = kv_cpu_attention_item_avx512;
    else if (strcmp(t->c->isa, "avx2") == 0 && a->head_dim % 16 == 0)
        item = kv_cpu_attention_item_avx2;
    if (a->n_queries)
        kv_cpu_pool_run(t->c->pool, items, 1, item, &j);
    for (int i = 0; i < workers; i++) {
        kv_free(j.ws[i].tile);
        kv_free(j.ws[i].logits);
        kv_free(j.ws[i].acc);
        kv_free(j.ws[i].score_acc);
        kv_cpu_scratch_free(&j.ws[i].dec);
        kv_free(j.ws[i].qpad);
        kv_free(j.ws[i].sz);
    }
    kv_free(j.ws);
    return KV_OK;
}

int kv_cpu_attention(cpu_ctx *c, const kv_attention_args *a, kv_error *err)
{
    attn t;
    int rc = attn_resolve(c, a, &t, err);
    if (rc)
        return rc;
    if (t.group > 1024)
        rc = kv_error_set(err, KV_EINPUT, "attention: %u query heads per KV head (at most 1024)", t.group);
    else
        rc = c->reference ? attention_reference(&t) : attention_fast(&t);
    kv_free(t.head_tokens);
    return rc;
}
