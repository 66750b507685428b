/* kvmem.c — unified pages, the circular free list on the backend, bidirectional page tables (see kvmem.h). */
#include "core/sim/kvmem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/alloc.h"

/* An internal invariant broke: a wrong number is worse than a crash. */
#define MEM_ASSERT(cond)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "kvsim: internal error %s:%d: kvmem invariant failed: %s\n", __FILE__, __LINE__,     \
                    #cond);                                                                                       \
            abort();                                                                                              \
        }                                                                                                         \
    } while (0)

/* Scores one page size: its worst waste over the tiers; keeps it in out when that is below *best,
   or equal to it on a smaller page (less internal fragmentation). */
static void page_score(double page, const double *token_bytes, int tiers, double *best, kv_mem_page_choice *out)
{
    double worst = 0, waste[KV_MEM_MAX_TIERS] = {0};
    uint32_t tokens[KV_MEM_MAX_TIERS] = {0};
    for (int t = 0; t < tiers; t++) {
        double n = floor(page / token_bytes[t]);
        tokens[t] = (uint32_t)n;
        waste[t] = (page - n * token_bytes[t]) / page;
        if (waste[t] > worst)
            worst = waste[t];
    }
    if (worst < *best || (worst == *best && page < out->page_bytes)) {
        *best = worst;
        out->page_bytes = (uint32_t)page;
        for (int t = 0; t < tiers; t++) {
            out->tokens_per_page[t] = tokens[t];
            out->waste[t] = waste[t];
        }
    }
}

int kv_mem_choose_page(const double *token_bytes, int tiers, int min_tokens, int max_tokens, uint32_t align_bytes,
                       kv_mem_page_choice *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    if (tiers < 1 || tiers > KV_MEM_MAX_TIERS)
        return kv_error_set(err, KV_EINPUT, "memory: %d tiers (1 or 2 supported)", tiers);
    if (min_tokens < 1 || max_tokens < min_tokens)
        return kv_error_set(err, KV_EINPUT, "memory: page size range %d..%d tokens is empty", min_tokens, max_tokens);
    double largest = 0;
    for (int t = 0; t < tiers; t++) {
        if (!(token_bytes[t] > 0) || !isfinite(token_bytes[t]))
            return kv_error_set(err, KV_EINPUT, "memory: tier %d has %g bytes per token", t, token_bytes[t]);
        if (token_bytes[t] > largest)
            largest = token_bytes[t];
    }
    if (align_bytes == 0)
        align_bytes = 32;
    double lo = ceil(min_tokens * largest / align_bytes) * align_bytes;
    double hi = floor(max_tokens * largest / align_bytes) * align_bytes;
    if (hi < lo)
        hi = lo; /* a range narrower than one alignment step: the smallest page that fits */
    if (hi > 4294967295.0)
        return kv_error_set(err, KV_EINPUT, "memory: pages of %.0f bytes are too large", hi);
    /* Within a run of pages whose token counts (floor(page / token_bytes[t]) for every tier) stay the
       same, every tier's waste 1 - n * token_bytes / page grows with the page (by at least 16 / page per
       32-byte step, far above double rounding), so the least worst waste is at a run's first page: lo,
       or the smallest aligned page at which some tier's count reaches n. Only those pages are scored,
       about (max_tokens - min_tokens) per tier, where scoring every aligned page of the range took
       hundreds of thousands of steps for a whole-token page of a large model. Same choice, bit for bit
       (tests/sim/test_kvmem.c compares it with the full scan). */
    double best = INFINITY;
    page_score(lo, token_bytes, tiers, &best, out);
    for (int t = 0; t < tiers; t++) {
        double tb = token_bytes[t];
        if (tb < align_bytes) { /* a count can change at every aligned page: score them all */
            for (double page = lo + align_bytes; page <= hi; page += align_bytes)
                page_score(page, token_bytes, tiers, &best, out);
            break;
        }
        for (double n = floor(lo / tb) + 1; n <= floor(hi / tb); n++) {
            double page = ceil(n * tb / align_bytes) * align_bytes;
            while (page - align_bytes >= lo && floor((page - align_bytes) / tb) >= n)
                page -= align_bytes;
            while (page <= hi && floor(page / tb) < n)
                page += align_bytes;
            if (page <= hi)
                page_score(page, token_bytes, tiers, &best, out);
        }
    }
    return KV_OK;
}

/* ---- The manager ------------------------------------------------------------------------------ */

typedef struct mem_seq {
    bool open;
    int heads;       /* page tables of this sequence (kv_mem_seq_open_tables) */
    int n_cap;       /* heads the n array has room for */
    uint32_t cap;    /* entries per head table */
    uint32_t *table; /* [heads][cap]: tier 0 from the front, tier 1 from the back */
    uint32_t *n;     /* [heads][2]: pages per tier */
    uint64_t total;  /* pages held */
} mem_seq;

/* A backend buffer that grows. */
typedef struct dev_array {
    kv_buffer *buf;
    size_t cap; /* u32 entries */
} dev_array;

struct kv_mem {
    kv_backend *be;                      /* borrowed */
    int heads, tiers;
    kv_mem_page_choice page;
    uint32_t capacity;                   /* pages */
    uint32_t free_count;                 /* host mirror of state[2] */
    kv_buffer *free_list, *state;        /* u32 [capacity], u32 [4] */
    dev_array demand, offsets, pages;
    uint32_t *h_demand, *h_offsets, *h_pages; /* host staging */
    size_t h_cap_entries, h_cap_pages;
    mem_seq *seqs;
    size_t n_seqs, cap_seqs;
    int *free_slots;
    size_t n_free_slots, cap_free_slots;
    kv_mem_stats stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int dev_reserve(kv_mem *m, dev_array *a, size_t entries, kv_error *err)
{
    if (entries <= a->cap && a->buf)
        return KV_OK;
    size_t cap = a->cap ? a->cap : 1024;
    while (cap < entries)
        cap *= 2;
    kv_buffer_free(m->be, a->buf);
    a->buf = NULL;
    a->cap = 0;
    int rc = kv_buffer_alloc(m->be, cap * 4, &a->buf, err);
    if (rc)
        return rc;
    a->cap = cap;
    return KV_OK;
}

static void host_reserve(kv_mem *m, size_t entries, size_t pages)
{
    if (entries > m->h_cap_entries) {
        size_t cap = m->h_cap_entries ? m->h_cap_entries : 1024;
        while (cap < entries)
            cap *= 2;
        m->h_demand = kv_realloc(m->h_demand, cap * 4);
        m->h_offsets = kv_realloc(m->h_offsets, cap * 4);
        m->h_cap_entries = cap;
    }
    if (pages > m->h_cap_pages) {
        size_t cap = m->h_cap_pages ? m->h_cap_pages : 1024;
        while (cap < pages)
            cap *= 2;
        m->h_pages = kv_realloc(m->h_pages, cap * 4);
        m->h_cap_pages = cap;
    }
}

int kv_mem_create(kv_backend *be, const kv_mem_config *cfg, kv_mem **out, kv_error *err)
{
    *out = NULL;
    if (cfg->heads < 1)
        return kv_error_set(err, KV_EINPUT, "memory: %d heads per sequence", cfg->heads);
    kv_mem_page_choice pc;
    int rc = kv_mem_choose_page(cfg->token_bytes, cfg->tiers, cfg->min_page_tokens, cfg->max_page_tokens,
                                cfg->align_bytes, &pc, err);
    if (rc)
        return rc;
    double pages = floor(cfg->capacity_bytes / pc.page_bytes);
    if (cfg->max_pages > 0 && pages > cfg->max_pages)
        pages = cfg->max_pages;
    if (!(pages >= 1))
        return kv_error_set(err, KV_EINPUT, "memory: %.3g bytes hold no page of %u bytes", cfg->capacity_bytes,
                            pc.page_bytes);
    if (pages > 4294967295.0)
        return kv_error_set(err, KV_EINPUT, "memory: %.0f pages of %u bytes exceed the 2^32-1 page ids", pages,
                            pc.page_bytes);
    kv_mem *m = kv_calloc(1, sizeof *m);
    m->be = be;
    m->heads = cfg->heads;
    m->tiers = cfg->tiers;
    m->page = pc;
    m->capacity = (uint32_t)pages;
    m->free_count = m->capacity;
    rc = kv_buffer_alloc(be, (size_t)m->capacity * 4, &m->free_list, err);
    if (!rc)
        rc = kv_buffer_alloc(be, 16, &m->state, err);
    /* Every page starts free, in order; written in chunks to keep host staging small. */
    uint32_t chunk[4096];
    for (uint64_t at = 0; !rc && at < m->capacity; at += 4096) {
        uint32_t k = m->capacity - at < 4096 ? (uint32_t)(m->capacity - at) : 4096;
        for (uint32_t i = 0; i < k; i++)
            chunk[i] = (uint32_t)(at + i);
        rc = kv_buffer_write(be, m->free_list, at * 4, chunk, (size_t)k * 4, err);
    }
    uint32_t state[4] = {0, 0, m->capacity, 0};
    if (!rc)
        rc = kv_buffer_write(be, m->state, 0, state, sizeof state, err);
    if (rc) {
        kv_mem_destroy(m);
        return rc;
    }
    *out = m;
    return KV_OK;
}

void kv_mem_destroy(kv_mem *m)
{
    if (!m)
        return;
    kv_buffer_free(m->be, m->free_list);
    kv_buffer_free(m->be, m->state);
    kv_buffer_free(m->be, m->demand.buf);
    kv_buffer_free(m->be, m->offsets.buf);
    kv_buffer_free(m->be, m->pages.buf);
    kv_free(m->h_demand);
    kv_free(m->h_offsets);
    kv_free(m->h_pages);
    for (size_t i = 0; i < m->n_seqs; i++) {
        kv_free(m->seqs[i].table);
        kv_free(m->seqs[i].n);
    }
    kv_free(m->seqs);
    kv_free(m->free_slots);
    kv_free(m);
}

uint32_t kv_mem_page_bytes(const kv_mem *m)
{
    return m->page.page_bytes;
}

uint32_t kv_mem_tokens_per_page(const kv_mem *m, int tier)
{
    return tier >= 0 && tier < m->tiers ? m->page.tokens_per_page[tier] : 0;
}

uint32_t kv_mem_capacity_pages(const kv_mem *m)
{
    return m->capacity;
}

uint32_t kv_mem_free_pages(const kv_mem *m)
{
    return m->free_count;
}

uint32_t kv_mem_used_pages(const kv_mem *m)
{
    return m->capacity - m->free_count;
}

int kv_mem_heads(const kv_mem *m)
{
    return m->heads;
}

int kv_mem_tiers(const kv_mem *m)
{
    return m->tiers;
}

/* ---- Sequences and their tables ---------------------------------------------------------------- */

static mem_seq *seq_at(const kv_mem *m, int slot)
{
    MEM_ASSERT(slot >= 0 && (size_t)slot < m->n_seqs && m->seqs[slot].open);
    return &m->seqs[slot];
}

int kv_mem_seq_open(kv_mem *m)
{
    return kv_mem_seq_open_tables(m, m->heads);
}

int kv_mem_seq_open_tables(kv_mem *m, int tables)
{
    MEM_ASSERT(tables >= 1);
    int slot;
    if (m->n_free_slots > 0) {
        slot = m->free_slots[--m->n_free_slots];
    } else {
        kv_grow((void **)&m->seqs, sizeof *m->seqs, &m->cap_seqs, m->n_seqs + 1);
        slot = (int)m->n_seqs++;
        memset(&m->seqs[slot], 0, sizeof m->seqs[slot]);
    }
    mem_seq *s = &m->seqs[slot];
    if (s->n_cap < tables) {
        kv_free(s->n);
        s->n = kv_calloc((size_t)tables * 2, sizeof *s->n);
        s->n_cap = tables;
    }
    if (s->heads != tables) { /* a reused slot's tables have another shape: start them afresh */
        kv_free(s->table);
        s->table = NULL;
        s->cap = 0;
    }
    s->heads = tables;
    s->open = true;
    s->total = 0;
    memset(s->n, 0, (size_t)tables * 2 * sizeof *s->n);
    return slot;
}

void kv_mem_seq_close(kv_mem *m, int slot)
{
    mem_seq *s = seq_at(m, slot);
    MEM_ASSERT(s->total == 0); /* closing a sequence that still holds pages would leak them */
    s->open = false;
    kv_grow((void **)&m->free_slots, sizeof *m->free_slots, &m->cap_free_slots, m->n_free_slots + 1);
    m->free_slots[m->n_free_slots++] = slot;
}

uint32_t kv_mem_seq_pages(const kv_mem *m, int slot, int head, int tier)
{
    const mem_seq *s = seq_at(m, slot);
    return s->n[(size_t)head * 2 + (size_t)tier];
}

/* Index in the head's table of page i of a tier. */
static size_t table_index(const mem_seq *s, int tier, uint32_t i)
{
    return tier == 0 ? i : s->cap - 1 - i;
}

uint32_t kv_mem_seq_page(const kv_mem *m, int slot, int head, int tier, uint32_t i)
{
    const mem_seq *s = seq_at(m, slot);
    MEM_ASSERT(i < s->n[(size_t)head * 2 + (size_t)tier]);
    return s->table[(size_t)head * s->cap + table_index(s, tier, i)];
}

uint64_t kv_mem_seq_total_pages(const kv_mem *m, int slot)
{
    return seq_at(m, slot)->total;
}

const uint32_t *kv_mem_seq_table(const kv_mem *m, int slot, int head, uint32_t *cap)
{
    const mem_seq *s = seq_at(m, slot);
    *cap = s->cap;
    return s->table ? s->table + (size_t)head * s->cap : NULL;
}

/* Makes every head's table hold at least `need` pages; tier-1 pages move to the new back. */
static void seq_grow(kv_mem *m, mem_seq *s, uint32_t need)
{
    if (need <= s->cap)
        return;
    uint32_t cap = s->cap ? s->cap : 16;
    while (cap < need)
        cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    (void)m;
    uint32_t *t = kv_calloc((size_t)s->heads * cap, sizeof *t);
    for (int h = 0; h < s->heads && s->table; h++) {
        uint32_t n0 = s->n[(size_t)h * 2], n1 = s->n[(size_t)h * 2 + 1];
        const uint32_t *old = s->table + (size_t)h * s->cap;
        uint32_t *nw = t + (size_t)h * cap;
        memcpy(nw, old, (size_t)n0 * 4);
        memcpy(nw + cap - n1, old + s->cap - n1, (size_t)n1 * 4);
    }
    kv_free(s->table);
    s->table = t;
    s->cap = cap;
}

/* ---- Batch allocation and release ---------------------------------------------------------------- */

static void count_call(kv_mem *m, size_t n, uint64_t pages, double t0)
{
    /* demand read + offsets written per entry; pages: one ring read and one table write each; state. */
    double bytes = 8.0 * (double)n + 8.0 * (double)pages + 16.0;
    double wall = now_s() - t0;
    m->stats.calls++;
    m->stats.entries += n;
    m->stats.bytes_touched += bytes;
    m->stats.last_bytes_touched = bytes;
    m->stats.wall_s += wall;
    m->stats.last_wall_s = wall;
    uint32_t used = m->capacity - m->free_count;
    if (used > m->stats.peak_used_pages)
        m->stats.peak_used_pages = used;
}

static int read_state(kv_mem *m, uint32_t state[4], kv_error *err)
{
    return kv_buffer_read(m->be, m->state, 0, state, 16, err);
}

/* Runs one compaction call over h_demand[0..n) (and h_pages for release). */
static int run_compact(kv_mem *m, size_t n, uint64_t total, bool release, uint32_t state[4], kv_error *err)
{
    if (n > UINT32_MAX || total > UINT32_MAX)
        return kv_error_set(err, KV_EFAIL, "memory: batch of %zu entries / %llu pages is too large", n,
                            (unsigned long long)total);
    int rc = dev_reserve(m, &m->demand, n, err);
    if (!rc)
        rc = dev_reserve(m, &m->offsets, n, err);
    if (!rc)
        rc = dev_reserve(m, &m->pages, total ? total : 1, err);
    if (!rc)
        rc = kv_buffer_write(m->be, m->demand.buf, 0, m->h_demand, n * 4, err);
    if (!rc && release && total)
        rc = kv_buffer_write(m->be, m->pages.buf, 0, m->h_pages, total * 4, err);
    if (rc)
        return rc;
    kv_compact_args a = {
        .n = (uint32_t)n,
        .capacity = m->capacity,
        .demand = {m->demand.buf, 0},
        .offsets = {m->offsets.buf, 0},
        .pages = {m->pages.buf, 0},
        .free_list = {m->free_list, 0},
        .state = {m->state, 0},
    };
    rc = release ? kv_backend_compact_release(m->be, &a, err) : kv_backend_compact_alloc(m->be, &a, err);
    if (!rc)
        rc = kv_backend_synchronize(m->be, err);
    if (!rc)
        rc = read_state(m, state, err);
    return rc;
}

int kv_mem_alloc(kv_mem *m, const kv_mem_demand *d, size_t n, bool *granted, kv_error *err)
{
    *granted = true;
    if (n == 0)
        return KV_OK;
    double t0 = now_s();
    uint64_t total = 0;
    host_reserve(m, n, 0);
    for (size_t i = 0; i < n; i++) {
        MEM_ASSERT(d[i].tier >= 0 && d[i].tier < m->tiers && d[i].head >= 0 &&
                   d[i].head < seq_at(m, d[i].slot)->heads);
        m->h_demand[i] = d[i].pages;
        total += d[i].pages;
    }
    uint32_t state[4];
    int rc = run_compact(m, n, total, false, state, err);
    if (rc)
        return rc;
    if (state[3] == 1) {
        /* Too few free pages: the kernel changed nothing (kv_compact_args). */
        MEM_ASSERT(state[2] == m->free_count && total > m->free_count);
        *granted = false;
        m->stats.failed_allocs++;
        count_call(m, n, 0, t0);
        return KV_OK;
    }
    MEM_ASSERT(state[3] == 0 && (uint64_t)state[2] + total == m->free_count);
    m->free_count = state[2];
    host_reserve(m, n, total);
    rc = kv_buffer_read(m->be, m->offsets.buf, 0, m->h_offsets, n * 4, err);
    if (!rc && total)
        rc = kv_buffer_read(m->be, m->pages.buf, 0, m->h_pages, total * 4, err);
    if (rc)
        return rc;
    /* Place each entry's range into its table; the ranges are the exclusive prefix sum. */
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        MEM_ASSERT(m->h_offsets[i] == expect);
        mem_seq *s = seq_at(m, d[i].slot);
        uint32_t *cnt = &s->n[(size_t)d[i].head * 2];
        seq_grow(m, s, cnt[0] + cnt[1] + d[i].pages);
        uint32_t *table = s->table + (size_t)d[i].head * s->cap;
        for (uint32_t j = 0; j < d[i].pages; j++) {
            uint32_t page = m->h_pages[expect + j];
            MEM_ASSERT(page < m->capacity);
            table[table_index(s, d[i].tier, cnt[d[i].tier])] = page;
            cnt[d[i].tier]++;
        }
        s->total += d[i].pages;
        expect += d[i].pages;
    }
    m->stats.pages_allocated += total;
    count_call(m, n, total, t0);
    return KV_OK;
}

int kv_mem_release(kv_mem *m, const kv_mem_demand *d, size_t n, kv_error *err)
{
    if (n == 0)
        return KV_OK;
    double t0 = now_s();
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += d[i].pages;
    host_reserve(m, n, total);
    /* Gather the newest pages of each entry, newest last (the order they were granted in). */
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        mem_seq *s = seq_at(m, d[i].slot);
        MEM_ASSERT(d[i].tier >= 0 && d[i].tier < m->tiers && d[i].head >= 0 && d[i].head < s->heads);
        uint32_t have = s->n[(size_t)d[i].head * 2 + (size_t)d[i].tier];
        MEM_ASSERT(d[i].pages <= have);
        const uint32_t *table = s->table + (size_t)d[i].head * s->cap;
        for (uint32_t j = have - d[i].pages; j < have; j++)
            m->h_pages[at++] = table[table_index(s, d[i].tier, j)];
        m->h_demand[i] = d[i].pages;
    }
    uint32_t state[4];
    int rc = run_compact(m, n, total, true, state, err);
    if (rc)
        return rc;
    /* Status 2 = more pages than could ever be out: a double free. */
    MEM_ASSERT(state[3] == 0 && state[2] == m->free_count + total);
    m->free_count = state[2];
    for (size_t i = 0; i < n; i++) {
        mem_seq *s = seq_at(m, d[i].slot);
        s->n[(size_t)d[i].head * 2 + (size_t)d[i].tier] -= d[i].pages;
        s->total -= d[i].pages;
    }
    m->stats.pages_released += total;
    count_call(m, n, total, t0);
    return KV_OK;
}

int kv_mem_release_seqs(kv_mem *m, const int *slots, size_t n, kv_error *err)
{
    size_t entries = 0;
    for (size_t i = 0; i < n; i++)
        if (seq_at(m, slots[i])->total > 0)
            entries += (size_t)seq_at(m, slots[i])->heads * (size_t)m->tiers;
    if (entries == 0)
        return KV_OK;
    kv_mem_demand *d = kv_malloc(entries * sizeof *d);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const mem_seq *s = seq_at(m, slots[i]);
        if (s->total == 0)
            continue;
        for (int h = 0; h < s->heads; h++)
            for (int t = 0; t < m->tiers; t++)
                d[k++] = (kv_mem_demand){slots[i], h, t, s->n[(size_t)h * 2 + (size_t)t]};
    }
    int rc = kv_mem_release(m, d, k, err);
    kv_free(d);
    return rc;
}

void kv_mem_move(kv_mem *m, int slot, int head, int from_tier, int to_tier, uint32_t pages)
{
    mem_seq *s = seq_at(m, slot);
    MEM_ASSERT(from_tier >= 0 && from_tier < m->tiers && to_tier >= 0 && to_tier < m->tiers);
    if (from_tier == to_tier || pages == 0)
        return;
    uint32_t *cnt = &s->n[(size_t)head * 2];
    MEM_ASSERT(pages <= cnt[from_tier]);
    uint32_t *table = s->table + (size_t)head * s->cap;
    /* Take the pages out first: in a full table the segments touch, and writing the
       destination in place could overwrite a page not yet moved. Oldest first, so the
       moved pages keep their order. */
    uint32_t *moved = kv_malloc((size_t)pages * 4);
    uint32_t first = cnt[from_tier] - pages;
    for (uint32_t j = 0; j < pages; j++)
        moved[j] = table[table_index(s, from_tier, first + j)];
    cnt[from_tier] -= pages;
    for (uint32_t j = 0; j < pages; j++)
        table[table_index(s, to_tier, cnt[to_tier]++)] = moved[j];
    kv_free(moved);
}

void kv_mem_get_stats(const kv_mem *m, kv_mem_stats *out)
{
    *out = m->stats;
}

int kv_mem_check(kv_mem *m, bool full, kv_error *err)
{
    uint32_t state[4];
    int rc = read_state(m, state, err);
    if (rc)
        return rc;
    if (state[2] != m->free_count)
        return kv_error_set(err, KV_EFAIL, "memory: device free count %u, host mirror %u", state[2], m->free_count);
    if (state[1] != (uint32_t)(((uint64_t)state[0] + state[2]) % m->capacity))
        return kv_error_set(err, KV_EFAIL, "memory: ring head %u + free %u != tail %u (capacity %u)", state[0],
                            state[2], state[1], m->capacity);
    uint64_t held = 0;
    for (size_t i = 0; i < m->n_seqs; i++)
        if (m->seqs[i].open)
            held += m->seqs[i].total;
    if (held + state[2] != m->capacity)
        return kv_error_set(err, KV_EFAIL, "memory: %llu pages held + %u free != capacity %u",
                            (unsigned long long)held, state[2], m->capacity);
    if (!full)
        return KV_OK;
    uint32_t *ring = kv_malloc((size_t)m->capacity * 4);
    uint8_t *seen = kv_calloc(m->capacity, 1);
    rc = kv_buffer_read(m->be, m->free_list, 0, ring, (size_t)m->capacity * 4, err);
    /* The free pages: ring slots head .. head+free-1, in at most two contiguous runs. */
    uint32_t first = m->capacity - state[0] < state[2] ? m->capacity - state[0] : state[2];
    const uint32_t *runs[2] = {ring + state[0], ring};
    uint32_t lens[2] = {first, state[2] - first};
    for (int k = 0; !rc && k < 2; k++)
        for (uint32_t j = 0; !rc && j < lens[k]; j++) {
            uint32_t page = runs[k][j];
            if (page >= m->capacity || seen[page]++)
                rc = kv_error_set(err, KV_EFAIL, "memory: page %u is on the free ring twice (or out of range)", page);
        }
    for (size_t i = 0; !rc && i < m->n_seqs; i++) {
        const mem_seq *s = &m->seqs[i];
        if (!s->open)
            continue;
        for (int h = 0; !rc && h < s->heads; h++)
            for (int t = 0; !rc && t < m->tiers; t++)
                for (uint32_t j = 0; !rc && j < s->n[(size_t)h * 2 + (size_t)t]; j++) {
                    uint32_t page = s->table[(size_t)h * s->cap + table_index(s, t, j)];
                    if (page >= m->capacity || seen[page]++)
                        rc = kv_error_set(err, KV_EFAIL,
                                          "memory: page %u is held twice (slot %zu head %d tier %d), or also free",
                                          page, i, h, t);
                }
    }
    for (uint32_t p = 0; !rc && p < m->capacity; p++)
        if (!seen[p])
            rc = kv_error_set(err, KV_EFAIL, "memory: page %u leaked: neither free nor held", p);
    kv_free(ring);
    kv_free(seen);
    return rc;
}
