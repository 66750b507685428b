/* kernel_fixture.c — builds paged mixed-precision KV problems on the host and
 * uploads them (see kernel_fixture.h). Quantized pages are encoded with the
 * CPU fast path, which the conformance suite holds equal to the reference. */
#include "backends/kernel_fixture.h"

#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/numerics.h"
#include "core/base/alloc.h"
#include "core/base/rng.h"

struct kv_attn_problem {
    kv_attn_spec spec;
    kv_store_format *kf, *vf; /* copies of the formats */
    uint8_t *kv;              /* kv_data image */
    size_t kv_bytes;
    kv_page_desc *pages;
    uint32_t n_pages;
    uint32_t *head_pages;     /* [n_kv_heads][2] */
    uint32_t *positions;      /* [n_kv_heads * tokens] */
    float *q;                 /* [n_queries][n_heads][head_dim] */
    uint32_t *q_pos;          /* [n_queries] */
    uint64_t bytes;           /* kv_attn_problem_bytes */
};

struct kv_attn_device {
    kv_backend *be;
    kv_attention_args args;
    size_t out_floats, score_floats;
    kv_buffer *bufs[8];
};

void kv_fixture_normal(float *x, size_t n, uint64_t seed)
{
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)kv_rng_normal(&rng);
}

static size_t align4(size_t n)
{
    return (n + 3) / 4 * 4;
}

static int check_format(const kv_store_format *f, const char *which, kv_error *err)
{
    if (f->kind > KV_STORE_QUANT)
        return kv_error_set(err, KV_EINPUT, "attention fixture: %s format: unknown kind %u", which, f->kind);
    if (f->kind == KV_STORE_QUANT &&
        (f->bits < 1 || f->bits > 16 || f->group_size == 0 || f->grouping > KV_GROUP_CHANNEL ||
         (f->anchor_bits && f->anchor_bits >= f->bits)))
        return kv_error_set(err, KV_EINPUT, "attention fixture: %s format: bad bits %u / anchor %u / group %u",
                            which, f->bits, f->anchor_bits, f->group_size);
    return KV_OK;
}

/* Bytes of a page's data and metadata in format f. */
static size_t store_sizes(const kv_store_format *f, uint32_t ntok, uint32_t hd, size_t *meta)
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

/* Writes x (f32 [ntok][hd]) in format f at kv + data (and kv + meta). */
static void store_page(const kv_store_format *f, uint32_t ntok, uint32_t hd, const float *x, uint8_t *kv,
                       uint64_t data, uint64_t meta, const char *isa)
{
    size_t n = (size_t)ntok * hd;
    if (f->kind == KV_STORE_F32) {
        memcpy(kv + data, x, n * 4);
        return;
    }
    if (f->kind == KV_STORE_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = kv_bf16_from_f32(x[i]);
            memcpy(kv + data + 2 * i, &h, 2);
        }
        return;
    }
    kv_quant_layout l = {ntok, hd, f->group_size, (kv_grouping)f->grouping};
    size_t groups = kv_layout_groups(&l);
    uint8_t *residual = NULL;
    if (f->anchor_bits)
        residual = kv_malloc(kv_layout_packed_bytes(&l, f->bits - f->anchor_bits) + 1);
    uint16_t *scale = (uint16_t *)(kv + meta);
    kv_cpu_fast_encode(isa, kv_cpu_fast_divides(), &l, f->bits, f->anchor_bits, x, kv + data, residual, scale,
                       scale + groups, 0, groups, NULL);
    kv_free(residual);
}

int kv_attn_problem_create(const kv_attn_spec *spec, kv_attn_problem **out, kv_error *err)
{
    *out = NULL;
    const kv_attn_spec *s = spec;
    if (!s->n_kv_heads || !s->n_heads || s->n_heads % s->n_kv_heads || !s->head_dim || !s->page_tokens ||
        !s->n_formats || s->n_queries > s->tokens)
        return kv_error_set(err, KV_EINPUT,
                            "attention fixture: bad shape (%u queries, %u heads, %u KV heads, head_dim %u, %u "
                            "tokens, %u per page, %u formats)",
                            s->n_queries, s->n_heads, s->n_kv_heads, s->head_dim, s->tokens, s->page_tokens,
                            s->n_formats);
    for (uint32_t i = 0; i < s->n_formats; i++) {
        int rc = check_format(&s->key_formats[i], "key", err);
        if (!rc)
            rc = check_format(&s->value_formats[i], "value", err);
        if (rc)
            return rc;
    }
    kv_attn_problem *p = kv_calloc(1, sizeof *p);
    p->spec = *s;
    p->kf = kv_malloc(s->n_formats * sizeof *p->kf);
    p->vf = kv_malloc(s->n_formats * sizeof *p->vf);
    memcpy(p->kf, s->key_formats, s->n_formats * sizeof *p->kf);
    memcpy(p->vf, s->value_formats, s->n_formats * sizeof *p->vf);
    p->spec.key_formats = p->kf;
    p->spec.value_formats = p->vf;
    uint32_t hd = s->head_dim;
    uint32_t per_head = (s->tokens + s->page_tokens - 1) / s->page_tokens + (s->empty_pages ? 1 : 0);
    p->n_pages = per_head * s->n_kv_heads;
    p->pages = kv_calloc(p->n_pages ? p->n_pages : 1, sizeof *p->pages);
    p->head_pages = kv_calloc((size_t)s->n_kv_heads * 2, sizeof *p->head_pages);
    p->positions = kv_calloc((size_t)s->n_kv_heads * s->tokens + 1, sizeof *p->positions);

    /* Lay the pages out: KV head after KV head, K data, K meta, V data, V meta. */
    size_t at = 0;
    uint32_t pi = 0;
    for (uint32_t kh = 0; kh < s->n_kv_heads; kh++) {
        p->head_pages[2 * kh] = pi;
        p->head_pages[2 * kh + 1] = per_head;
        uint32_t t0 = 0;
        for (uint32_t j = 0; j < per_head; j++, pi++) {
            kv_page_desc *pg = &p->pages[pi];
            uint32_t ntok = s->empty_pages && j == 0 ? 0
                            : s->tokens - t0 < s->page_tokens ? s->tokens - t0
                                                               : s->page_tokens;
            pg->ntokens = ntok;
            pg->pos_index = kh * s->tokens + t0;
            pg->key = p->kf[pi % s->n_formats];
            pg->value = p->vf[pi % s->n_formats];
            size_t km, vm, kd = store_sizes(&pg->key, ntok, hd, &km), vd = store_sizes(&pg->value, ntok, hd, &vm);
            pg->key_data = at;
            at += align4(kd);
            pg->key_meta = at;
            at += align4(km);
            pg->value_data = at;
            at += align4(vd);
            pg->value_meta = at;
            at += align4(vm);
            p->bytes += kd + km + vd + vm;
            for (uint32_t i = 0; i < ntok; i++)
                p->positions[pg->pos_index + i] = t0 + i;
            t0 += ntok;
        }
    }
    p->kv_bytes = at;
    p->kv = kv_calloc(at ? at : 1, 1);

    /* Fill them: K ~ N(0,1) with every 16th channel x8 (outlier channels), V ~ N(0,1). */
    const char *isa = kv_cpu_fast_isa();
    kv_rng rng;
    kv_rng_seed(&rng, s->seed);
    float *tile = kv_malloc(((size_t)s->page_tokens * hd + 1) * sizeof *tile);
    for (uint32_t i = 0; i < p->n_pages; i++) {
        kv_page_desc *pg = &p->pages[i];
        size_t n = (size_t)pg->ntokens * hd;
        for (size_t e = 0; e < n; e++)
            tile[e] = (float)(kv_rng_normal(&rng) * (e % hd % 16 == 3 ? 8.0 : 1.0));
        store_page(&pg->key, pg->ntokens, hd, tile, p->kv, pg->key_data, pg->key_meta, isa);
        for (size_t e = 0; e < n; e++)
            tile[e] = (float)kv_rng_normal(&rng);
        store_page(&pg->value, pg->ntokens, hd, tile, p->kv, pg->value_data, pg->value_meta, isa);
    }
    kv_free(tile);
    size_t qn = (size_t)s->n_queries * s->n_heads * hd;
    p->q = kv_malloc((qn ? qn : 1) * sizeof *p->q);
    for (size_t e = 0; e < qn; e++)
        p->q[e] = (float)(kv_rng_normal(&rng) * 2.0);
    p->q_pos = kv_malloc((s->n_queries ? s->n_queries : 1) * sizeof *p->q_pos);
    for (uint32_t i = 0; i < s->n_queries; i++)
        p->q_pos[i] = s->tokens - s->n_queries + i;
    p->bytes += (uint64_t)s->n_kv_heads * s->tokens * 4 + 2 * qn * 4 + s->n_queries * 4;
    if (s->scores)
        p->bytes += (uint64_t)s->n_kv_heads * s->tokens * 4;
    *out = p;
    return KV_OK;
}

void kv_attn_problem_destroy(kv_attn_problem *p)
{
    if (!p)
        return;
    kv_free(p->kf);
    kv_free(p->vf);
    kv_free(p->kv);
    kv_free(p->pages);
    kv_free(p->head_pages);
    kv_free(p->positions);
    kv_free(p->q);
    kv_free(p->q_pos);
    kv_free(p);
}

const kv_attn_spec *kv_attn_problem_spec(const kv_attn_problem *p)
{
    return &p->spec;
}

void kv_attn_problem_scale_q(kv_attn_problem *p, uint32_t stride, float big, float small)
{
    size_t qn = (size_t)p->spec.n_queries * p->spec.n_heads * p->spec.head_dim;
    for (size_t e = 0; e < qn; e++)
        p->q[e] *= stride && e % stride == 0 ? big : small;
}

uint64_t kv_attn_problem_bytes(const kv_attn_problem *p)
{
    return p->bytes;
}

size_t kv_attn_problem_out_floats(const kv_attn_problem *p)
{
    return (size_t)p->spec.n_queries * p->spec.n_heads * p->spec.head_dim;
}

size_t kv_attn_problem_score_floats(const kv_attn_problem *p)
{
    return p->spec.scores ? (size_t)p->spec.n_kv_heads * p->spec.tokens : 0;
}

/* ---- On a backend ------------------------------------------------------------ */

static int upload(kv_attn_device *d, int slot, const void *src, size_t bytes, kv_bref *ref, kv_error *err)
{
    int rc = kv_buffer_alloc(d->be, bytes ? bytes : 4, &d->bufs[slot], err);
    if (!rc && src && bytes)
        rc = kv_buffer_write(d->be, d->bufs[slot], 0, src, bytes, err);
    ref->buf = d->bufs[slot];
    ref->offset = 0;
    return rc;
}

/* Fills a device buffer with NaNs (0xff bytes) so that unwritten outputs show. */
static int poison(kv_attn_device *d, int slot, size_t bytes, kv_error *err)
{
    if (!bytes)
        return KV_OK;
    void *tmp = kv_malloc(bytes);
    memset(tmp, 0xff, bytes);
    int rc = kv_buffer_write(d->be, d->bufs[slot], 0, tmp, bytes, err);
    kv_free(tmp);
    return rc;
}

int kv_attn_device_create(const kv_attn_problem *p, kv_backend *be, kv_attn_device **out, kv_error *err)
{
    *out = NULL;
    const kv_attn_spec *s = &p->spec;
    kv_attn_device *d = kv_calloc(1, sizeof *d);
    d->be = be;
    d->out_floats = kv_attn_problem_out_floats(p);
    d->score_floats = kv_attn_problem_score_floats(p);
    kv_attention_args *a = &d->args;
    a->n_queries = s->n_queries;
    a->n_heads = s->n_heads;
    a->n_kv_heads = s->n_kv_heads;
    a->head_dim = s->head_dim;
    a->n_pages = p->n_pages;
    a->score_stride = s->scores ? s->tokens : 0;
    a->scale = 1.0f / sqrtf((float)s->head_dim);
    int rc = upload(d, 0, p->q, d->out_floats * 4, &a->q, err);
    if (!rc)
        rc = upload(d, 1, p->q_pos, (size_t)s->n_queries * 4, &a->q_pos, err);
    if (!rc)
        rc = upload(d, 2, p->pages, (size_t)p->n_pages * sizeof *p->pages, &a->pages, err);
    if (!rc)
        rc = upload(d, 3, p->head_pages, (size_t)s->n_kv_heads * 8, &a->head_pages, err);
    if (!rc)
        rc = upload(d, 4, p->positions, (size_t)s->n_kv_heads * s->tokens * 4, &a->positions, err);
    if (!rc)
        rc = upload(d, 5, p->kv, p->kv_bytes, &a->kv_data, err);
    if (!rc)
        rc = upload(d, 6, NULL, d->out_floats * 4, &a->out, err);
    if (!rc)
        rc = poison(d, 6, d->out_floats * 4, err);
    if (!rc && s->scores)
        rc = upload(d, 7, NULL, d->score_floats * 4, &a->scores, err);
    if (!rc && s->scores)
        rc = poison(d, 7, d->score_floats * 4, err);
    if (rc) {
        kv_attn_device_destroy(d);
        return rc;
    }
    *out = d;
    return KV_OK;
}

void kv_attn_device_destroy(kv_attn_device *d)
{
    if (!d)
        return;
    for (int i = 0; i < 8; i++)
        kv_buffer_free(d->be, d->bufs[i]);
    kv_free(d);
}

int kv_attn_device_run(kv_attn_device *d, kv_error *err)
{
    return kv_backend_attention(d->be, &d->args, err);
}

int kv_attn_device_read(kv_attn_device *d, float *out, float *scores, kv_error *err)
{
    int rc = kv_backend_synchronize(d->be, err);
    if (!rc && out)
        rc = kv_buffer_read(d->be, d->args.out.buf, 0, out, d->out_floats * 4, err);
    if (!rc && scores && d->args.scores.buf)
        rc = kv_buffer_read(d->be, d->args.scores.buf, 0, scores, d->score_floats * 4, err);
    return rc;
}

double kv_attn_rel_error(const float *got, const float *want, size_t rows, size_t cols)
{
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++) {
        double scale = 0.0, diff = 0.0;
        for (size_t c = 0; c < cols; c++) {
            double g = got[r * cols + c], w = want[r * cols + c];
            if (isnan(g) || isnan(w))
                return INFINITY;
            scale = fmax(scale, fabs(w));
            diff = fmax(diff, fabs(g - w));
        }
        double e = diff / (scale > 0.0 ? scale : 1e-30);
        if (e > worst)
            worst = e;
    }
    return worst;
}

int kv_attn_solve(const kv_attn_problem *p, kv_backend *be, float *out, float *scores, kv_error *err)
{
    kv_attn_device *d = NULL;
    int rc = kv_attn_device_create(p, be, &d, err);
    if (!rc)
        rc = kv_attn_device_run(d, err);
    if (!rc)
        rc = kv_attn_device_read(d, out, scores, err);
    kv_attn_device_destroy(d);
    return rc;
}
