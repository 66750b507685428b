/* kvstore_attention.c — attention over a KV store: exact before the seal, then over the stored
 * values, on the host or through a backend. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/kv/diffkv.h"
#include "core/refmodel/kvquant.h"
#include "core/refmodel/kvstore_internal.h"

/* ---- Attention ---------------------------------------------------------------------------------------- */

/* Softmax of x[0..n) in place (max subtracted; sum in double). */
static void softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* Tokens of lane L at positions <= p (positions increase). */
static int visible(const lane *L, int32_t p)
{
    int lo = 0, hi = L->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (L->pos[mid] <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Exact prefill attention through OpenBLAS. For each KV head and block of QB
   query rows, the rows of the G query heads that share the KV head are
   gathered into one matrix, so each block is two sgemm calls:
   S = Q K^T (scaled), row softmax over the visible keys, O = S V.
   DiffKV lanes (or KV_KVSTORE_SCORES) gather the probabilities every query
   gives each token (DiffKV's significance, core/kv/diffkv.h): summed over
   queries per head, then the maximum over the heads of the group. */
static void attention_exact(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out)
{
    enum { QB = 128 };
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim, G = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    size_t ld = (size_t)H * hd, GR = (size_t)G * QB;
    float *Qg = kv_malloc(GR * hd * sizeof *Qg), *Og = kv_malloc(GR * hd * sizeof *Og);
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        lane *L = &s->lanes[li];
        bool scores = (s->flags & KV_KVSTORE_SCORES) || (s->enc && s->enc[li].diffkv);
        int nk_all = visible(L, pos[T - 1]);
        size_t nka = (size_t)(nk_all ? nk_all : 1);
        float *S = kv_malloc(GR * nka * sizeof *S);
        float *acc = scores ? kv_calloc((size_t)G * nka, sizeof *acc) : NULL;
        for (int r0 = 0; r0 < T; r0 += QB) {
            int rows = T - r0 < QB ? T - r0 : QB;
            int nk = visible(L, pos[r0 + rows - 1]);
            if (nk == 0) {
                for (int r = 0; r < rows; r++)
                    memset(out + (size_t)(r0 + r) * ld + (size_t)g * G * hd, 0, (size_t)G * hd * sizeof(float));
                continue;
            }
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++)
                    memcpy(Qg + ((size_t)hh * rows + r) * hd, q + (size_t)(r0 + r) * ld + (size_t)(g * G + hh) * hd,
                           (size_t)hd * sizeof(float));
            int M = G * rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, hd, scale, Qg, hd, L->k, hd, 0.0f, S, nk);
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++) {
                    float *row = S + ((size_t)hh * rows + r) * nk;
                    int m = visible(L, pos[r0 + r]);
                    softmax(row, m);
                    memset(row + m, 0, (size_t)(nk - m) * sizeof *row);
                    if (scores)
                        for (int j = 0; j < m; j++)
                            acc[(size_t)hh * nka + j] += row[j];
                }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, nk, 1.0f, S, nk, L->v, hd, 0.0f, Og, hd);
            for (int hh = 0; hh < G; hh++)
                for (int r = 0; r < rows; r++)
                    memcpy(out + (size_t)(r0 + r) * ld + (size_t)(g * G + hh) * hd, Og + ((size_t)hh * rows + r) * hd,
                           (size_t)hd * sizeof(float));
        }
        if (scores)
            for (int j = 0; j < nk_all; j++) {
                float best = 0.0f;
                for (int hh = 0; hh < G; hh++)
                    best = acc[(size_t)hh * nka + j] > best ? acc[(size_t)hh * nka + j] : best;
                L->sig[j] += best;
                for (int r = 0; r < T; r++)
                    L->sig_n[j] += pos[r] >= L->pos[j] ? 1.0f : 0.0f;
            }
        kv_free(S);
        kv_free(acc);
    }
    kv_free(Qg);
    kv_free(Og);
}

/* Attention of one query row over the first m tokens of a lane: keys from
   the transposed copy Kt (stride ld), values V [m][hd]. Plain loops that
   vectorize across tokens and channels while every sum keeps its order;
   p [m] receives the probabilities. */
static void attend_row(const float *qr, const float *Kt, size_t ld, const float *V, int m, int hd, float scale,
                       float *p, float *o)
{
    memset(o, 0, (size_t)hd * sizeof *o);
    if (m == 0)
        return;
    memset(p, 0, (size_t)m * sizeof *p);
    for (int c = 0; c < hd; c++) {
        float qc = qr[c];
        const float *kc = Kt + (size_t)c * ld;
        for (int j = 0; j < m; j++)
            p[j] += qc * kc[j];
    }
    for (int j = 0; j < m; j++)
        p[j] *= scale;
    softmax(p, m);
    for (int j = 0; j < m; j++) {
        float pj = p[j];
        const float *vj = V + (size_t)j * hd;
        for (int c = 0; c < hd; c++)
            o[c] += pj * vj[c];
    }
}

/* ---- Attention through a backend ------------------------------------------------------------ */

/* How token i of a lane stores K (value false) or V, as a backend page format. */
static kv_store_format token_format(const kv_kvstore *s, const kv_encoding *e, const lane *L, int i, bool value)
{
    kv_store_format f = {0};
    const kv_tensor_enc *t = NULL;
    switch (L->tier[i]) {
    case TIER_EXACT:
        f.kind = KV_STORE_F32;
        return f;
    case TIER_WINDOW:
        f.kind = KV_STORE_BF16;
        return f;
    case TIER_HIGH:
        t = value ? &e->value : &e->key;
        break;
    default:
        t = value ? &e->value_low : &e->key_low;
        break;
    }
    if (t->kind == KV_TENSOR_BF16) {
        f.kind = KV_STORE_BF16;
        return f;
    }
    f.kind = KV_STORE_QUANT;
    f.bits = (uint8_t)t->bits;
    f.anchor_bits = (uint8_t)(i < L->n_split && !s->residual ? t->anchor_bits : 0);
    f.grouping = (uint8_t)(t->per_channel ? KV_GROUP_CHANNEL : KV_GROUP_TOKEN);
    f.group_size = (uint32_t)t->group_size;
    return f;
}

static bool same_format(const kv_store_format *a, const kv_store_format *b)
{
    return a->kind == b->kind && a->bits == b->bits && a->anchor_bits == b->anchor_bits &&
           a->grouping == b->grouping && a->group_size == b->group_size;
}

typedef struct bytes_vec {
    uint8_t *p;
    size_t n, cap;
} bytes_vec;

/* Reserves n zeroed bytes at a 16-byte aligned offset; returns the offset. */
static size_t bv_take(bytes_vec *b, size_t n)
{
    size_t at = (b->n + 15) & ~(size_t)15;
    if (at + n > b->cap)
        kv_grow((void **)&b->p, 1, &b->cap, at + n);
    memset(b->p + b->n, 0, at + n - b->n);
    b->n = at + n;
    return at;
}

/* Writes one group's codes (element i at codes[i * stride], shifted right by
   shift) as a little-endian bit stream of width w into zeroed dst. */
static void pack_group(uint8_t *dst, const uint16_t *codes, size_t n, size_t stride, unsigned shift, unsigned w)
{
    uint64_t acc = 0;
    unsigned have = 0;
    uint32_t mask = (1u << w) - 1u;
    for (size_t i = 0; i < n; i++) {
        acc |= (uint64_t)(((uint32_t)codes[i * stride] >> shift) & mask) << have;
        for (have += w; have >= 8; have -= 8, acc >>= 8)
            *dst++ = (uint8_t)acc;
    }
    if (have)
        *dst = (uint8_t)acc;
}

/* Writes tokens [i0, i0 + n) of one tensor of lane L in format f into kv;
   returns the data offset and sets *meta_off (scale[groups] then zero[groups]). */
static size_t put_tensor(bytes_vec *kv, const kv_store_format *f, const lane *L, bool value, int i0, int n, int hd,
                         uint64_t *meta_off)
{
    const float *x = (value ? L->v : L->k) + (size_t)i0 * hd;
    size_t count = (size_t)n * hd;
    *meta_off = 0;
    if (f->kind == KV_STORE_F32) {
        size_t at = bv_take(kv, count * 4);
        memcpy(kv->p + at, x, count * 4);
        return at;
    }
    if (f->kind == KV_STORE_BF16) { /* the stored values are bf16 numbers: their top 16 bits */
        size_t at = bv_take(kv, count * 2);
        for (size_t i = 0; i < count; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            uint16_t h = (uint16_t)(bits >> 16);
            memcpy(kv->p + at + 2 * i, &h, 2);
        }
        return at;
    }
    const uint16_t *codes = (value ? L->vc : L->kc) + (size_t)i0 * hd;
    const uint16_t *sc = (value ? L->vs : L->ks) + (size_t)i0 * hd, *zr = (value ? L->vz : L->kz) + (size_t)i0 * hd;
    kv_quant_layout lay = {(uint32_t)n, (uint32_t)hd, f->group_size, (kv_grouping)f->grouping};
    unsigned w = f->anchor_bits ? f->anchor_bits : f->bits;
    unsigned shift = f->anchor_bits ? (unsigned)(f->bits - f->anchor_bits) : 0;
    size_t groups = kv_layout_groups(&lay);
    size_t at = bv_take(kv, kv_layout_packed_bytes(&lay, w));
    size_t meta = bv_take(kv, kv_layout_meta_bytes(&lay));
    size_t off = at;
    for (size_t g = 0; g < groups; g++) {
        size_t len = kv_layout_group_len(&lay, g), first, stride;
        uint16_t s, z;
        if (f->grouping == KV_GROUP_TOKEN) {
            size_t gpr = ((size_t)hd + f->group_size - 1) / f->group_size, row = g / gpr, gi = g % gpr;
            first = row * (size_t)hd + gi * f->group_size;
            stride = 1;
            s = sc[row * (size_t)hd + gi];
            z = zr[row * (size_t)hd + gi];
        } else { /* channel c of a block of group_size tokens */
            size_t block = g / (size_t)hd, c = g % (size_t)hd;
            first = block * f->group_size * (size_t)hd + c;
            stride = (size_t)hd;
            s = sc[first];
            z = zr[first];
        }
        pack_group(kv->p + off, codes + first, len, stride, shift, w);
        off += (len * w + 7) / 8;
        memcpy(kv->p + meta + 2 * g, &s, 2);
        memcpy(kv->p + meta + 2 * (groups + g), &z, 2);
    }
    *meta_off = meta;
    return at;
}

/* Backend buffer `slot` of the store with room for bytes (kept between calls;
   grown by half again when too small). */
static int dev_reserve(kv_kvstore *s, int slot, size_t bytes, kv_buffer **out, kv_error *err)
{
    bytes = bytes ? bytes : 4;
    if (s->dev_bytes[slot] < bytes) {
        if (s->dev[slot])
            kv_buffer_free(s->backend, s->dev[slot]);
        s->dev[slot] = NULL;
        s->dev_bytes[slot] = 0;
        size_t want = bytes + bytes / 2;
        int rc = kv_buffer_alloc(s->backend, want, &s->dev[slot], err);
        if (rc)
            return rc;
        s->dev_bytes[slot] = want;
    }
    *out = s->dev[slot];
    return KV_OK;
}

/* Writes host bytes into backend buffer `slot`. */
static int upload(kv_kvstore *s, int slot, const void *src, size_t bytes, kv_buffer **out, kv_error *err)
{
    int rc = dev_reserve(s, slot, bytes, out, err);
    if (!rc && bytes)
        rc = kv_buffer_write(s->backend, *out, 0, src, bytes, err);
    return rc;
}

/* The layer's lanes as backend pages (one per run of tokens stored alike;
   per-channel groups also end a page at their block edge), then
   kv_backend_attention over them. DiffKV lanes take the per-token
   probabilities back for their significance. */
static int attention_backend(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                             kv_error *err)
{
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim;
    kv_page_desc *pages = NULL;
    size_t n_pages = 0, cap_pages = 0, n_pos = 0;
    uint32_t *head_pages = kv_malloc((size_t)KVH * 2 * sizeof *head_pages), *positions = NULL;
    bytes_vec kv = {s->host, 0, s->host_cap};
    bool scores = false;
    uint32_t stride = 1;
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        const lane *L = &s->lanes[li];
        const kv_encoding *e = s->enc ? &s->enc[li] : NULL;
        scores |= e && e->diffkv;
        stride = (uint32_t)L->n > stride ? (uint32_t)L->n : stride;
        head_pages[2 * g] = (uint32_t)n_pages;
        positions = kv_realloc(positions, (n_pos + (size_t)L->n + 1) * sizeof *positions);
        for (int i0 = 0; i0 < L->n;) {
            kv_store_format kf = token_format(s, e, L, i0, false), vf = token_format(s, e, L, i0, true);
            int B = 0;
            if (kf.kind == KV_STORE_QUANT && kf.grouping == KV_GROUP_CHANNEL)
                B = (int)kf.group_size;
            else if (vf.kind == KV_STORE_QUANT && vf.grouping == KV_GROUP_CHANNEL)
                B = (int)vf.group_size;
            int i1 = i0 + 1;
            while (i1 < L->n && (B == 0 || i1 % B != 0)) {
                kv_store_format k2 = token_format(s, e, L, i1, false), v2 = token_format(s, e, L, i1, true);
                if (!same_format(&kf, &k2) || !same_format(&vf, &v2))
                    break;
                i1++;
            }
            if (n_pages == cap_pages)
                kv_grow((void **)&pages, sizeof *pages, &cap_pages, n_pages + 1);
            kv_page_desc *pg = &pages[n_pages++];
            memset(pg, 0, sizeof *pg);
            pg->ntokens = (uint32_t)(i1 - i0);
            pg->pos_index = (uint32_t)n_pos;
            pg->key = kf;
            pg->value = vf;
            pg->key_data = put_tensor(&kv, &kf, L, false, i0, i1 - i0, hd, &pg->key_meta);
            pg->value_data = put_tensor(&kv, &vf, L, true, i0, i1 - i0, hd, &pg->value_meta);
            for (int i = i0; i < i1; i++)
                positions[n_pos++] = (uint32_t)L->pos[i];
            i0 = i1;
        }
        head_pages[2 * g + 1] = (uint32_t)n_pages - head_pages[2 * g];
    }
    uint32_t *qpos = kv_malloc((size_t)T * sizeof *qpos);
    for (int t = 0; t < T; t++)
        qpos[t] = (uint32_t)pos[t];
    size_t qbytes = (size_t)T * H * hd * sizeof(float), sbytes = (size_t)KVH * stride * sizeof(float);
    kv_backend *be = s->backend;
    kv_buffer *bq = NULL, *bqp = NULL, *bpg = NULL, *bhp = NULL, *bpos = NULL, *bkv = NULL, *bout = NULL,
              *bsc = NULL;
    s->host = kv.p; /* kept for the next call */
    s->host_cap = kv.cap;
    int rc = upload(s, 0, q, qbytes, &bq, err);
    if (!rc)
        rc = upload(s, 1, qpos, (size_t)T * 4, &bqp, err);
    if (!rc)
        rc = upload(s, 2, pages, n_pages * sizeof *pages, &bpg, err);
    if (!rc)
        rc = upload(s, 3, head_pages, (size_t)KVH * 8, &bhp, err);
    if (!rc)
        rc = upload(s, 4, positions, n_pos * 4, &bpos, err);
    if (!rc)
        rc = upload(s, 5, kv.p, kv.n, &bkv, err);
    if (!rc)
        rc = dev_reserve(s, 6, qbytes, &bout, err);
    if (!rc && scores)
        rc = dev_reserve(s, 7, sbytes, &bsc, err);
    float *sc = scores ? kv_malloc(sbytes) : NULL;
    if (!rc) {
        kv_attention_args a = {
            .n_queries = (uint32_t)T,
            .n_heads = (uint32_t)H,
            .n_kv_heads = (uint32_t)KVH,
            .head_dim = (uint32_t)hd,
            .n_pages = (uint32_t)n_pages,
            .score_stride = stride,
            .scale = 1.0f / sqrtf((float)hd),
            .q = {bq, 0},
            .q_pos = {bqp, 0},
            .pages = {n_pages ? bpg : NULL, 0},
            .head_pages = {bhp, 0},
            .positions = {n_pages ? bpos : NULL, 0},
            .kv_data = {n_pages ? bkv : NULL, 0},
            .out = {bout, 0},
            .scores = {bsc, 0},
        };
        rc = kv_backend_attention(be, &a, err);
    }
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    if (!rc)
        rc = kv_buffer_read(be, bout, 0, out, qbytes, err);
    if (!rc && scores)
        rc = kv_buffer_read(be, bsc, 0, sc, sbytes, err);
    if (!rc && scores)
        for (int g = 0; g < KVH; g++) {
            size_t li = (size_t)layer * KVH + (size_t)g;
            lane *L = &s->lanes[li];
            if (!s->enc[li].diffkv)
                continue;
            for (int j = 0; j < L->n; j++) {
                L->sig[j] += sc[(size_t)g * stride + (size_t)j];
                for (int t = 0; t < T; t++)
                    L->sig_n[j] += pos[t] >= L->pos[j] ? 1.0f : 0.0f;
            }
        }
    kv_free(sc);
    kv_free(qpos);
    kv_free(pages);
    kv_free(head_pages);
    kv_free(positions);
    if (rc)
        kv_error_prefix(err, "layer %d: ", layer);
    return rc;
}

/* Attention over the stored (encoded) KV after the seal: the backend's kernel
   when one is set, else the loop over the reconstructed values. With
   KV_KVSTORE_MEASURE, the same queries also run over the bf16 reference. */
static int attention_stored_run(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                            kv_error *err)
{
    int H = s->shape.n_heads, KVH = s->shape.n_kv_heads, hd = s->shape.head_dim, G = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    bool measure = (s->flags & KV_KVSTORE_MEASURE) != 0, own = s->backend == NULL;
    if (!own) {
        int rc = attention_backend(s, layer, q, pos, T, out, err);
        if (rc || !measure)
            return rc;
    }
    float *ref = measure ? kv_malloc((size_t)hd * sizeof *ref) : NULL;
    for (int g = 0; g < KVH; g++) {
        size_t li = (size_t)layer * KVH + (size_t)g;
        lane *L = &s->lanes[li];
        bool scores = own && s->enc && s->enc[li].diffkv;
        int nk_all = L->n ? L->n : 1;
        kv_kvstore_lane_sync_kt(L, hd);
        size_t ldk = (size_t)L->kt_cap;
        float *p = kv_malloc((size_t)nk_all * sizeof *p);
        float *acc = scores ? kv_calloc((size_t)G * (size_t)nk_all, sizeof *acc) : NULL;
        for (int t = 0; t < T; t++) {
            int m = visible(L, pos[t]);
            for (int hh = 0; hh < G; hh++) {
                int h = g * G + hh;
                const float *qr = q + ((size_t)t * H + (size_t)h) * hd;
                float *o = out + ((size_t)t * H + (size_t)h) * hd;
                if (own)
                    attend_row(qr, L->kt, ldk, L->v, m, hd, scale, p, o);
                if (scores)
                    for (int j = 0; j < m; j++)
                        acc[(size_t)hh * nk_all + j] += p[j];
                if (measure) {
                    /* The same query over bf16 K/V of the same tokens, pruned ones included. */
                    attend_row(qr, L->rkt, ldk, L->rv, m, hd, scale, p, ref);
                    double e2 = 0, r2 = 0;
                    for (int c = 0; c < hd; c++) {
                        double d = (double)o[c] - ref[c];
                        e2 += d * d;
                        r2 += (double)ref[c] * ref[c];
                    }
                    s->err_sq[layer] += e2;
                    s->ref_sq[layer] += r2;
                    s->measured[layer] += 1;
                }
            }
            if (scores)
                for (int j = 0; j < m; j++)
                    L->sig_n[j] += 1.0f;
        }
        if (scores)
            for (int j = 0; j < L->n; j++) {
                float best = 0.0f;
                for (int hh = 0; hh < G; hh++)
                    best = acc[(size_t)hh * nk_all + j] > best ? acc[(size_t)hh * nk_all + j] : best;
                L->sig[j] += best;
            }
        kv_free(p);
        kv_free(acc);
    }
    kv_free(ref);
    return KV_OK;
}

/* DiffKV decode: the tokens that have left the recent window since the last
   decision get their final tier, with the probabilities this step's queries
   just added and the context `context` (core/kv/diffkv.h). Tokens are decided
   in position order, so the undecided ones are the lane's last. */
static void decide_leaving(const kv_encoding *e, lane *L, int64_t context, int hd)
{
    int i = L->n;
    while (i > 0 && !L->fixed[i - 1])
        i--;
    while (i < L->n - e->window)
        if (kv_kvstore_apply_tier(e, L, i, context, hd))
            i++;
}

static int attention_stored(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                            kv_error *err)
{
    int rc = attention_stored_run(s, layer, q, pos, T, out, err);
    if (rc || !s->enc)
        return rc;
    int32_t last = pos[0];
    for (int t = 1; t < T; t++)
        last = pos[t] > last ? pos[t] : last;
    for (int g = 0; g < s->shape.n_kv_heads; g++) {
        size_t li = (size_t)layer * s->shape.n_kv_heads + (size_t)g;
        if (s->enc[li].diffkv)
            decide_leaving(&s->enc[li], &s->lanes[li], (int64_t)last + 1, s->shape.head_dim);
    }
    return KV_OK;
}

void kv_kvstore_set_backend(kv_kvstore *s, kv_backend *be)
{
    for (int i = 0; i < 8; i++) {
        if (s->dev[i])
            kv_buffer_free(s->backend, s->dev[i]);
        s->dev[i] = NULL;
        s->dev_bytes[i] = 0;
    }
    s->backend = be;
}

int kv_kvstore_attention(kv_kvstore *s, int layer, const float *q, const int32_t *pos, int T, float *out,
                         kv_error *err)
{
    if (T <= 0)
        return KV_OK;
    if (!s->sealed) {
        attention_exact(s, layer, q, pos, T, out);
        return KV_OK;
    }
    return attention_stored(s, layer, q, pos, T, out, err);
}
