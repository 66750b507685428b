/* encset.c — the policy's encodings per (layer, KV head), kept across requests when fixed, and their byte totals. */
#include "core/policy/encset.h"

#include <math.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/kv/kvbytes.h"

enum { MAX_DISTINCT = 32 }; /* beyond this many different encodings, sum head by head */

struct kv_encset {
    int layers, kv_heads;    /* shape of enc */
    kv_encoding *enc;        /* [layers * kv_heads] the last fill's answers */
    bool fixed;              /* enc is the same for every request (see kv_encset_fill) */
    const kv_policy *policy; /* whose answers enc holds, while fixed */
    kv_policy_model model;   /* for which model (name pointer not owned), while fixed */
    uint64_t epoch;          /* the policy's cache epoch when enc was fetched */
    kv_encoding distinct[MAX_DISTINCT]; /* the different encodings in enc, when fixed */
    int count[MAX_DISTINCT]; /* heads using each */
    int n_distinct;          /* -1: more than MAX_DISTINCT */
    uint64_t generation;     /* fills that asked the policy */
};

kv_encset *kv_encset_create(int layers, int kv_heads)
{
    kv_encset *s = kv_calloc(1, sizeof *s);
    s->layers = layers > 0 ? layers : 0;
    s->kv_heads = kv_heads > 0 ? kv_heads : 0;
    s->enc = kv_calloc((size_t)s->layers * (size_t)s->kv_heads + 1, sizeof *s->enc);
    return s;
}

void kv_encset_destroy(kv_encset *s)
{
    if (!s)
        return;
    kv_free(s->enc);
    kv_free(s);
}

static bool same_tensor(const kv_tensor_enc *a, const kv_tensor_enc *b)
{
    return a->kind == b->kind && a->bits == b->bits && a->anchor_bits == b->anchor_bits &&
           a->group_size == b->group_size && a->per_channel == b->per_channel;
}

static bool same_encoding(const kv_encoding *a, const kv_encoding *b)
{
    return same_tensor(&a->key, &b->key) && same_tensor(&a->value, &b->value) &&
           a->full_precision_window == b->full_precision_window && a->diffkv == b->diffkv &&
           same_tensor(&a->key_low, &b->key_low) && same_tensor(&a->value_low, &b->value_low) &&
           a->alpha_high == b->alpha_high && a->alpha_low == b->alpha_low && a->window == b->window;
}

static bool same_model(const kv_policy_model *a, const kv_policy_model *b)
{
    return a->layers == b->layers && a->heads == b->heads && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->name == b->name;
}

static void group(kv_encset *s)
{
    int heads = s->layers * s->kv_heads;
    s->n_distinct = 0;
    for (int h = 0; h < heads; h++) {
        int g = 0;
        while (g < s->n_distinct && !same_encoding(&s->distinct[g], &s->enc[h]))
            g++;
        if (g == s->n_distinct) {
            if (g == MAX_DISTINCT) {
                s->n_distinct = -1;
                return;
            }
            s->distinct[g] = s->enc[h];
            s->count[g] = 0;
            s->n_distinct++;
        }
        s->count[g]++;
    }
}

int kv_encset_fill(kv_encset *s, kv_policy *p, const kv_policy_model *m, const kv_policy_request *r,
                   const kv_encoding **out, kv_error *err)
{
    *out = s->enc;
    if (m->layers != s->layers || m->kv_heads != s->kv_heads)
        return kv_error_set(err, KV_EFAIL, "kv_encset_fill: model has %d x %d heads, the set %d x %d", m->layers,
                            m->kv_heads, s->layers, s->kv_heads);
    if (s->fixed && s->policy == p && same_model(&s->model, m) && s->epoch == kv_policy_cache_epoch(p))
        return KV_OK;
    s->fixed = false;
    s->generation++;
    bool fixed = true;
    for (int layer = 0; layer < m->layers; layer++) {
        for (int head = 0; head < m->kv_heads; head++) {
            int rc = kv_policy_encoding(p, m, r, layer, head, &s->enc[layer * m->kv_heads + head], err);
            if (rc)
                return rc;
            fixed = fixed && kv_policy_encoding_fixed(p, m, layer, head);
        }
    }
    if (fixed) {
        s->fixed = true;
        s->policy = p;
        s->model = *m;
        s->epoch = kv_policy_cache_epoch(p);
        group(s);
    }
    return KV_OK;
}

bool kv_encset_fixed(const kv_encset *s)
{
    return s->fixed;
}

uint64_t kv_encset_generation(const kv_encset *s)
{
    return s->generation;
}

static void bytes_by_head(const kv_encset *s, int tokens, int head_dim, double *anchor, double *residual,
                          double *kept)
{
    *anchor = *residual = *kept = 0;
    int heads = s->layers * s->kv_heads;
    for (int h = 0; h < heads; h++) {
        if (s->enc[h].diffkv)
            continue;
        kv_head_bytes hb;
        kv_encoding_bytes(&s->enc[h], tokens, head_dim, NULL, &hb);
        *anchor += hb.anchor;
        *residual += hb.residual;
        *kept += hb.kept_tokens;
    }
}

/* x is an integer and x * n stays an exact integer. */
static bool exact_multiple(double x, int n)
{
    return x == floor(x) && fabs(x) * n < 0x1p52;
}

void kv_encset_bytes(const kv_encset *s, int tokens, int head_dim, double *anchor, double *residual, double *kept)
{
    if (!s->fixed || s->n_distinct < 0) {
        bytes_by_head(s, tokens, head_dim, anchor, residual, kept);
        return;
    }
    double a = 0, r = 0, k = 0;
    for (int g = 0; g < s->n_distinct; g++) {
        if (s->distinct[g].diffkv)
            continue;
        kv_head_bytes hb;
        kv_encoding_bytes(&s->distinct[g], tokens, head_dim, NULL, &hb);
        int n = s->count[g];
        if (!exact_multiple(hb.anchor, n) || !exact_multiple(hb.residual, n) || !exact_multiple(hb.kept_tokens, n)) {
            bytes_by_head(s, tokens, head_dim, anchor, residual, kept);
            return;
        }
        a += hb.anchor * n;
        r += hb.residual * n;
        k += hb.kept_tokens * n;
    }
    if (a >= 0x1p52 || r >= 0x1p52 || k >= 0x1p52) {
        bytes_by_head(s, tokens, head_dim, anchor, residual, kept);
        return;
    }
    *anchor = a;
    *residual = r;
    *kept = k;
}
