/* kvcache.c — a request's KV on a decode node: tier counts per head and the pages they need (see kvcache.h). */
#include "core/sim/kvcache.h"

#include <math.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/kv/kvbytes.h"

/* Bytes per token of one tensor stored as t (planes and metadata), over a long run of tokens. */
static double tensor_per_token(const kv_tensor_enc *t, int head_dim)
{
    const int n = 4096; /* a multiple of every usual group size, so per-channel groups come out exact */
    double a, r;
    kv_tensor_bytes(t, n, head_dim, &a, &r);
    return (a + r) / n;
}

int kv_cache_init(kv_cache *c, const kv_encoding *enc, int heads, int head_dim, const kv_diffkv_score_model *sm,
                  const kv_diffkv_head_params *head_model, uint64_t seed, kv_error *err)
{
    memset(c, 0, sizeof *c);
    c->heads = heads;
    c->kind = enc[0].diffkv ? KV_CACHE_DIFFKV : enc[0].full_precision_window > 0 ? KV_CACHE_KIVI : KV_CACHE_PLAIN;
    c->tiers = c->kind == KV_CACHE_PLAIN ? 1 : 2;
    const kv_tensor_enc bf16 = {.kind = KV_TENSOR_BF16};
    for (int h = 0; h < heads; h++) {
        const kv_encoding *e = &enc[h];
        kv_cache_kind kind = e->diffkv ? KV_CACHE_DIFFKV : e->full_precision_window > 0 ? KV_CACHE_KIVI : KV_CACHE_PLAIN;
        if (kind != c->kind)
            return kv_error_set(err, KV_EINPUT,
                                "encoding of (layer, KV head) %d is %s but of head 0 %s: a request's heads must all "
                                "be DiffKV, all KIVI-windowed, or all plain",
                                h, kind == KV_CACHE_DIFFKV ? "DiffKV" : kind == KV_CACHE_KIVI ? "KIVI" : "plain",
                                c->kind == KV_CACHE_DIFFKV ? "DiffKV" : c->kind == KV_CACHE_KIVI ? "KIVI" : "plain");
        double b[2] = {0, 0};
        if (kind == KV_CACHE_DIFFKV) {
            b[0] = tensor_per_token(&e->key, head_dim) + tensor_per_token(&e->value, head_dim) +
                   KV_DIFFKV_TOKEN_META_BYTES;
            b[1] = tensor_per_token(&e->key_low, head_dim) + tensor_per_token(&e->value_low, head_dim) +
                   KV_DIFFKV_TOKEN_META_BYTES;
        } else if (kind == KV_CACHE_KIVI) {
            b[0] = tensor_per_token(&e->key, head_dim) + tensor_per_token(&e->value, head_dim);
            b[1] = 2 * tensor_per_token(&bf16, head_dim);
            if (e->full_precision_window > c->window)
                c->window = e->full_precision_window;
        } else {
            b[0] = tensor_per_token(&e->key, head_dim) + tensor_per_token(&e->value, head_dim);
        }
        for (int t = 0; t < 2; t++)
            if (b[t] > c->head_bytes[t])
                c->head_bytes[t] = b[t];
    }
    if (c->kind == KV_CACHE_PLAIN)
        c->head_bytes[1] = c->head_bytes[0];
    /* DiffKV: a page table per (layer, KV head). Otherwise every head holds the same tokens, so one
       table for the whole sequence whose pages span every layer and head (vLLM's blocks). */
    c->tables = c->kind == KV_CACHE_DIFFKV ? heads : 1;
    for (int t = 0; t < 2; t++)
        c->token_bytes[t] = c->head_bytes[t] * (heads / c->tables);
    c->room = kv_calloc((size_t)c->tables * 2, sizeof *c->room);
    if (c->kind == KV_CACHE_DIFFKV) {
        kv_diffkv_head_params *hp = kv_calloc((size_t)heads, sizeof *hp);
        for (int h = 0; h < heads; h++)
            hp[h] = (kv_diffkv_head_params){enc[h].alpha_high, enc[h].alpha_low, enc[h].window,
                                            head_model ? head_model[h].head_factor : 1.0,
                                            head_model ? head_model[h].table_row : 0};
        c->dkv = kv_diffkv_seq_create(sm, hp, heads, seed);
        kv_free(hp);
    }
    return KV_OK;
}

void kv_cache_init_like(kv_cache *c, const kv_cache *proto)
{
    *c = *proto;
    c->dkv = NULL;
    c->room = kv_calloc((size_t)c->tables * 2, sizeof *c->room);
}

void kv_cache_free(kv_cache *c)
{
    if (!c)
        return;
    kv_diffkv_seq_destroy(c->dkv);
    kv_free(c->room);
    c->dkv = NULL;
    c->room = NULL;
}

void kv_cache_set_tokens(kv_cache *c, int64_t tokens, bool prompt_high)
{
    c->tokens = tokens;
    c->prompt_high = prompt_high && c->kind == KV_CACHE_DIFFKV;
    if (c->kind == KV_CACHE_DIFFKV && !c->prompt_high)
        kv_diffkv_seq_prefill(c->dkv, (int)tokens);
}

void kv_cache_grow_to(kv_cache *c, int64_t tokens)
{
    if (c->kind != KV_CACHE_DIFFKV) {
        c->tokens = tokens;
        return;
    }
    if (c->prompt_high)
        kv_cache_set_tokens(c, c->tokens, false);
    while (c->tokens < tokens) {
        kv_diffkv_seq_step(c->dkv);
        c->tokens++;
    }
}

void kv_cache_counts(const kv_cache *c, int head, uint32_t out[2])
{
    uint64_t L = c->tokens > 0 ? (uint64_t)c->tokens : 0;
    switch (c->kind) {
    case KV_CACHE_DIFFKV:
        if (c->prompt_high) {
            out[0] = (uint32_t)L;
            out[1] = 0;
        } else {
            out[0] = kv_diffkv_seq_high(c->dkv)[head];
            out[1] = kv_diffkv_seq_low(c->dkv)[head];
        }
        break;
    case KV_CACHE_KIVI: {
        uint64_t w = L < (uint64_t)c->window ? L : (uint64_t)c->window;
        out[0] = (uint32_t)(L - w);
        out[1] = (uint32_t)w;
        break;
    }
    default:
        out[0] = (uint32_t)L;
        out[1] = 0;
    }
}

void kv_cache_totals(const kv_cache *c, double *tier0, double *tier1, double *pruned)
{
    double all = (double)(c->tokens > 0 ? c->tokens : 0) * c->heads;
    if (c->kind == KV_CACHE_DIFFKV && !c->prompt_high) {
        uint64_t h, l, p;
        kv_diffkv_seq_totals(c->dkv, &h, &l, &p);
        *tier0 = (double)h;
        *tier1 = (double)l;
        *pruned = (double)p;
        return;
    }
    uint32_t n[2];
    kv_cache_counts(c, 0, n);
    *tier0 = (double)n[0] * c->heads;
    *tier1 = (double)n[1] * c->heads;
    *pruned = all - *tier0 - *tier1;
}

double kv_cache_read_bytes(const kv_cache *c)
{
    double t0, t1, p;
    kv_cache_totals(c, &t0, &t1, &p);
    return t0 * c->head_bytes[0] + t1 * c->head_bytes[1];
}

void kv_cache_wire_bytes(kv_cache *c, const kv_encoding *enc, int head_dim, int tokens, double *bytes,
                         double *kept_tokens)
{
    *bytes = *kept_tokens = 0;
    if (c->kind != KV_CACHE_DIFFKV) {
        for (int h = 0; h < c->heads; h++) {
            kv_head_bytes hb;
            kv_encoding_bytes(&enc[h], tokens, head_dim, NULL, &hb);
            *bytes += hb.anchor + hb.residual;
            *kept_tokens += hb.kept_tokens;
        }
        return;
    }
    kv_cache_set_tokens(c, tokens, false);
    for (int h = 0; h < c->heads; h++) {
        uint32_t n[2];
        kv_cache_counts(c, h, n);
        const kv_encoding *e = &enc[h];
        double a, r;
        const kv_tensor_enc *parts[4] = {&e->key, &e->value, &e->key_low, &e->value_low};
        for (int k = 0; k < 4; k++) {
            kv_tensor_bytes(parts[k], (int)n[k / 2], head_dim, &a, &r);
            *bytes += a + r;
        }
        *bytes += (double)(n[0] + n[1]) * KV_DIFFKV_TOKEN_META_BYTES;
        *kept_tokens += n[0] + n[1];
    }
}

int kv_cache_bind(kv_cache *c, const kv_mem *m, kv_error *err)
{
    uint32_t page = kv_mem_page_bytes(m);
    /* The node's page size came from the first request planned, maybe of another encoding. A plain or
       KIVI sequence whose token (every layer and head together) does not fit one page keeps a page table
       per (layer, KV head) instead, as DiffKV does: its pages then hold tokens of one head. */
    bool fits = true;
    for (int t = 0; t < c->tiers; t++)
        fits = fits && floor(page / c->token_bytes[t]) >= 1;
    if (!fits && c->kind != KV_CACHE_DIFFKV && c->tables == 1 && c->heads > 1) {
        c->tables = c->heads;
        for (int t = 0; t < 2; t++)
            c->token_bytes[t] = c->head_bytes[t];
        kv_free(c->room);
        c->room = kv_calloc((size_t)c->tables * 2, sizeof *c->room);
    }
    for (int t = 0; t < c->tiers; t++) {
        double n = floor(page / c->token_bytes[t]);
        if (n < 1)
            return kv_error_set(err, KV_EINPUT,
                                "a token of tier %d takes %.0f bytes per page table but the decode node's pages "
                                "hold %u bytes (the page size comes from the first request's encoding)",
                                t, c->token_bytes[t], page);
        c->per_page[t] = (uint32_t)n;
    }
    c->ring_pages = c->kind == KV_CACHE_KIVI ? (uint32_t)((c->window + c->per_page[1] - 1) / c->per_page[1]) : 0;
    return KV_OK;
}

/* Pages tier t needs for `count` tokens, with room for one more (growing tiers). */
static uint32_t need(const kv_cache *c, int t, uint32_t count)
{
    if (t >= c->tiers)
        return 0;
    if (c->kind == KV_CACHE_KIVI && t == 1)
        return c->tokens > 0 ? c->ring_pages : 0;
    return count / c->per_page[t] + 1;
}

uint64_t kv_cache_pages_needed(const kv_cache *c)
{
    uint64_t total = 0;
    bool uniform = c->kind != KV_CACHE_DIFFKV || c->prompt_high;
    for (int h = 0; h < (uniform ? 1 : c->tables); h++) {
        uint32_t n[2];
        kv_cache_counts(c, h, n);
        total += need(c, 0, n[0]) + need(c, 1, n[1]);
    }
    return uniform ? total * (uint64_t)c->tables : total;
}

void kv_cache_sync(kv_cache *c, const kv_mem *m, int slot)
{
    for (int h = 0; h < c->tables; h++)
        for (int t = 0; t < 2; t++)
            c->room[(size_t)t * c->tables + h] =
                slot >= 0 && t < c->tiers ? kv_mem_seq_pages(m, slot, h, t) * c->per_page[t] : 0;
}

typedef uint32_t v4u32 __attribute__((vector_size(16)));

static inline v4u32 load4(const uint32_t *p)
{
    v4u32 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* First head >= from whose tiers lack room (count >= room), or heads. Four heads at a time. */
static int next_short_head(const kv_cache *c, int from)
{
    const uint32_t *hi = kv_diffkv_seq_high(c->dkv), *lo = kv_diffkv_seq_low(c->dkv);
    const uint32_t *r0 = c->room, *r1 = c->room + c->heads;
    int h = from;
    for (; h + 4 <= c->heads; h += 4) {
        v4u32 m = (v4u32)(load4(hi + h) >= load4(r0 + h)) | (v4u32)(load4(lo + h) >= load4(r1 + h));
        if (m[0] | m[1] | m[2] | m[3])
            break;
    }
    for (; h < c->heads; h++)
        if (hi[h] >= r0[h] || lo[h] >= r1[h])
            return h;
    return c->heads;
}

bool kv_cache_short(const kv_cache *c, const kv_mem *m, int slot)
{
    (void)m;
    if (slot < 0)
        return true;
    if (c->kind != KV_CACHE_DIFFKV || c->prompt_high) {
        uint32_t n[2];
        kv_cache_counts(c, 0, n);
        if (n[0] >= c->room[0])
            return true;
        return c->kind == KV_CACHE_KIVI && c->tokens > 0 && c->room[c->tables] < c->ring_pages * c->per_page[1];
    }
    return next_short_head(c, 0) < c->heads;
}

size_t kv_cache_demands(const kv_cache *c, const kv_mem *m, int slot, kv_mem_demand *out, uint64_t *pages)
{
    size_t k = 0;
    bool diffkv = c->kind == KV_CACHE_DIFFKV && !c->prompt_high;
    uint32_t n[2];
    if (!diffkv) {
        kv_cache_counts(c, 0, n);
        /* Every head holds the same: when head 0 has room, all have. */
        if (slot >= 0 && !kv_cache_short(c, m, slot))
            return 0;
    }
    for (int h = 0; h < c->tables; h++) {
        if (diffkv) {
            /* Most heads have room: jump to the next one that does not. */
            if (slot >= 0 && (h = next_short_head(c, h)) >= c->heads)
                break;
            n[0] = kv_diffkv_seq_high(c->dkv)[h];
            n[1] = kv_diffkv_seq_low(c->dkv)[h];
        }
        for (int t = 0; t < c->tiers; t++) {
            uint32_t want = need(c, t, n[t]);
            uint32_t held = slot >= 0 ? c->room[(size_t)t * c->tables + h] / c->per_page[t] : 0; /* room = held x per_page */
            if (want > held) {
                if (out)
                    out[k] = (kv_mem_demand){slot, h, t, want - held};
                k++;
                *pages += want - held;
            }
        }
    }
    return k;
}

void kv_cache_granted(kv_cache *c, const kv_mem_demand *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        c->room[(size_t)d[i].tier * c->tables + (size_t)d[i].head] += d[i].pages * c->per_page[d[i].tier];
}

size_t kv_cache_shrink(kv_cache *c, kv_mem *m, int slot, kv_mem_demand *out)
{
    size_t k = 0;
    for (int h = 0; h < c->tables; h++) {
        uint32_t n[2];
        kv_cache_counts(c, h, n);
        uint32_t held[2] = {kv_mem_seq_pages(m, slot, h, 0), c->tiers > 1 ? kv_mem_seq_pages(m, slot, h, 1) : 0};
        uint32_t want[2] = {need(c, 0, n[0]), need(c, 1, n[1])};
        if (c->tiers > 1 && want[1] > held[1] && held[0] > want[0]) {
            /* The low tier's pages come out of the prompt's high allocation (DiffKV's free_prompt). */
            uint32_t mv = want[1] - held[1] < held[0] - want[0] ? want[1] - held[1] : held[0] - want[0];
            kv_mem_move(m, slot, h, 0, 1, mv);
            held[0] -= mv;
            held[1] += mv;
        }
        for (int t = 0; t < c->tiers; t++) {
            if (held[t] > want[t]) {
                out[k++] = (kv_mem_demand){slot, h, t, held[t] - want[t]};
                held[t] = want[t];
            }
            c->room[(size_t)t * c->tables + h] = held[t] * c->per_page[t]; /* as it will be once released */
        }
    }
    return k;
}
