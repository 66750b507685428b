/* test_kernels_compact.c — compaction invariants on both CPU devices:
 * offsets are the exclusive prefix sum, the ranges are disjoint and complete,
 * the ring wraps, failures change nothing, and over a long random run every
 * release returns exactly the pages that were allocated. */
#include <criterion/criterion.h>

#include "backends/backend.h"
#include "tests/kernels_util.h"

typedef struct ring {
    kv_backend *be;
    uint32_t capacity, n;
    kv_buffer *free_list, *state, *demand, *offsets, *pages;
} ring;

static ring ring_open(int device, uint32_t capacity, uint32_t n, uint32_t head)
{
    ring r = {kvt_open("cpu", device), capacity, n, NULL, NULL, NULL, NULL, NULL};
    uint32_t *fl = malloc(capacity * 4);
    for (uint32_t i = 0; i < capacity; i++)
        fl[i] = 1000 + i; /* page ids, distinct */
    uint32_t state[4] = {head, head, capacity, 7}; /* full ring: tail == head */
    r.free_list = kvt_put(r.be, fl, capacity * 4);
    r.state = kvt_put(r.be, state, 16);
    r.demand = kvt_fill(r.be, n * 4, 0);
    r.offsets = kvt_fill(r.be, n * 4, 0);
    r.pages = kvt_fill(r.be, capacity * 4, 0);
    free(fl);
    return r;
}

static void ring_close(ring *r)
{
    kv_buffer_free(r->be, r->free_list), kv_buffer_free(r->be, r->state), kv_buffer_free(r->be, r->demand);
    kv_buffer_free(r->be, r->offsets), kv_buffer_free(r->be, r->pages);
    kv_backend_close(r->be);
}

/* Runs alloc or release with the given demands; pages (for release) are written first. */
static uint32_t *ring_run(ring *r, int release, const uint32_t *demand, const uint32_t *pages, uint32_t total,
                          uint32_t state[4])
{
    kv_error err = {0};
    cr_assert_eq(kv_buffer_write(r->be, r->demand, 0, demand, r->n * 4, &err), KV_OK);
    if (release && total)
        cr_assert_eq(kv_buffer_write(r->be, r->pages, 0, pages, total * 4, &err), KV_OK);
    kv_compact_args a = {r->n, r->capacity, {r->demand, 0}, {r->offsets, 0}, {r->pages, 0}, {r->free_list, 0},
                         {r->state, 0}};
    int rc = release ? kv_backend_compact_release(r->be, &a, &err) : kv_backend_compact_alloc(r->be, &a, &err);
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    uint32_t *st = kvt_get(r->be, r->state, 16);
    memcpy(state, st, 16);
    free(st);
    return kvt_get(r->be, r->pages, r->capacity * 4);
}

static void prefix_sum_and_ranges(int device)
{
    ring r = ring_open(device, 50, 5, 45); /* head near the end: the allocation wraps */
    uint32_t demand[5] = {3, 0, 4, 1, 2}, state[4];
    uint32_t *pages = ring_run(&r, 0, demand, NULL, 0, state);
    uint32_t *off = kvt_get(r.be, r.offsets, 20);
    uint32_t want_off[5] = {0, 3, 3, 7, 8};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(off[i], want_off[i], "offset %d", i);
    /* entry 0 gets ring slots 45, 46, 47; entry 2 slots 48, 49, 0, 1; ... */
    uint32_t want_pages[10] = {1045, 1046, 1047, 1048, 1049, 1000, 1001, 1002, 1003, 1004};
    for (int i = 0; i < 10; i++)
        cr_assert_eq(pages[i], want_pages[i], "page %d: %u", i, pages[i]);
    cr_assert_eq(state[0], 5);  /* head wrapped */
    cr_assert_eq(state[1], 45); /* tail unchanged */
    cr_assert_eq(state[2], 40);
    cr_assert_eq(state[3], 0);
    free(pages), free(off);
    ring_close(&r);
}

Test(compact, prefix_sum_disjoint_ranges_and_wrap)
{
    prefix_sum_and_ranges(0);
    prefix_sum_and_ranges(1);
}

static void failures_change_nothing(int device)
{
    ring r = ring_open(device, 10, 2, 3);
    uint32_t demand[2] = {6, 5}, state[4];
    uint32_t *pages = ring_run(&r, 0, demand, NULL, 0, state);
    cr_assert_eq(state[3], 1, "alloc beyond free pages must report status 1");
    cr_assert_eq(state[0], 3);
    cr_assert_eq(state[2], 10);
    free(pages);
    /* release into a full ring */
    uint32_t one[2] = {1, 0}, page = 77;
    pages = ring_run(&r, 1, one, &page, 1, state);
    cr_assert_eq(state[3], 2, "release beyond capacity must report status 2");
    cr_assert_eq(state[1], 3);
    cr_assert_eq(state[2], 10);
    free(pages);
    /* an inconsistent state is an input error */
    uint32_t bad[4] = {3, 4, 10, 0};
    kv_error err = {0};
    cr_assert_eq(kv_buffer_write(r.be, r.state, 0, bad, 16, &err), KV_OK);
    kv_compact_args a = {r.n, r.capacity, {r.demand, 0}, {r.offsets, 0}, {r.pages, 0}, {r.free_list, 0},
                         {r.state, 0}};
    cr_assert_eq(kv_backend_compact_alloc(r.be, &a, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "inconsistent"), "%s", err.msg);
    ring_close(&r);
}

Test(compact, failures_change_nothing)
{
    failures_change_nothing(0);
    failures_change_nothing(1);
}

/* A long random run: a host model tracks which pages each entry holds; every
   allocation hands out distinct free pages, every release returns exactly an
   entry's oldest pages, and at the end the free list holds every page once. */
static void long_random_run(int device)
{
    enum { CAP = 257, N = 24 };
    ring r = ring_open(device, CAP, N, 100);
    kv_rng rng;
    kv_rng_seed(&rng, 99 + device);
    uint32_t held[N][CAP], nheld[N] = {0}, state[4] = {100, 100, CAP, 0};
    int in_use[CAP + 1000] = {0};
    for (int step = 0; step < 2000; step++) {
        uint32_t demand[N] = {0}, total = 0;
        int release = kv_rng_below(&rng, 2) == 1;
        for (int i = 0; i < N; i++) {
            uint32_t d = (uint32_t)kv_rng_below(&rng, 5);
            if (release && d > nheld[i])
                d = nheld[i];
            demand[i] = d;
            total += d;
        }
        if (release) {
            uint32_t give[CAP], k = 0;
            for (int i = 0; i < N; i++)
                for (uint32_t j = 0; j < demand[i]; j++)
                    give[k++] = held[i][j];
            uint32_t *out = ring_run(&r, 1, demand, give, total, state);
            free(out);
            cr_assert_eq(state[3], 0);
            for (int i = 0; i < N; i++) {
                for (uint32_t j = 0; j < demand[i]; j++)
                    in_use[held[i][j]] = 0;
                memmove(held[i], held[i] + demand[i], (nheld[i] - demand[i]) * 4);
                nheld[i] -= demand[i];
            }
        } else {
            uint32_t before = state[2];
            uint32_t *pages = ring_run(&r, 0, demand, NULL, 0, state);
            if (total > before) {
                cr_assert_eq(state[3], 1, "an allocation beyond the free pages fails");
                free(pages);
                continue;
            }
            cr_assert_eq(state[3], 0);
            uint32_t *off = kvt_get(r.be, r.offsets, N * 4);
            uint32_t sum = 0;
            for (int i = 0; i < N; i++) {
                cr_assert_eq(off[i], sum, "offsets are the exclusive prefix sum");
                for (uint32_t j = 0; j < demand[i]; j++) {
                    uint32_t pg = pages[off[i] + j];
                    cr_assert(pg >= 1000 && pg < 1000 + CAP, "page id %u", pg);
                    cr_assert(!in_use[pg], "page %u handed out twice (step %d)", pg, step);
                    in_use[pg] = 1;
                    held[i][nheld[i]++] = pg;
                }
                sum += demand[i];
            }
            free(off), free(pages);
        }
        uint32_t used = 0;
        for (int i = 0; i < N; i++)
            used += nheld[i];
        cr_assert_eq(state[2], CAP - used, "free_count tracks the pages held (step %d)", step);
        cr_assert_eq(state[1], (state[0] + state[2]) % CAP, "tail == head + free_count");
    }
    /* release everything: the ring holds every page exactly once */
    uint32_t demand[N], give[CAP], k = 0;
    for (int i = 0; i < N; i++) {
        demand[i] = nheld[i];
        for (uint32_t j = 0; j < nheld[i]; j++)
            give[k++] = held[i][j];
    }
    free(ring_run(&r, 1, demand, give, k, state));
    cr_assert_eq(state[2], CAP);
    uint32_t *fl = kvt_get(r.be, r.free_list, CAP * 4);
    int seen[CAP] = {0};
    for (int i = 0; i < CAP; i++) {
        cr_assert(fl[i] >= 1000 && fl[i] < 1000 + CAP);
        cr_assert(!seen[fl[i] - 1000], "page %u twice in the free list", fl[i]);
        seen[fl[i] - 1000] = 1;
    }
    free(fl);
    ring_close(&r);
}

Test(compact, release_returns_exactly_what_was_allocated)
{
    long_random_run(0);
    long_random_run(1);
}
