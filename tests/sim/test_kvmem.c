/* test_kvmem.c — the decode node's memory manager: page size choice, the compaction kernel through the
 * manager (disjoint complete ranges, wrap-around), bidirectional page tables, and a long random run that
 * must neither leak nor double free. Runs on the CPU backend (device 0, the threaded one). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/sim/kvmem.h"
#include "core/base/rng.h"

static kv_backend *open_cpu(void)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open("cpu", 0, &be, &err), 0, "%s", err.msg);
    return be;
}

/* A pool of `pages` pages of 1000 bytes (one tier of 100-byte tokens: 10 a page, or two tiers). */
static kv_mem *small_pool(kv_backend *be, uint32_t pages, int heads, int tiers)
{
    kv_mem_config cfg = {.capacity_bytes = 1e12, .tiers = tiers, .token_bytes = {100, 50}, .heads = heads,
                         .min_page_tokens = 10, .max_page_tokens = 10, .align_bytes = 100, .max_pages = pages};
    kv_mem *m = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_mem_create(be, &cfg, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_mem_page_bytes(m), 1000);
    cr_assert_eq(kv_mem_capacity_pages(m), pages);
    return m;
}

static void check(kv_mem *m)
{
    kv_error err = {0};
    cr_assert_eq(kv_mem_check(m, true, &err), 0, "%s", err.msg);
}

/* ---- Page size ------------------------------------------------------------------------------- */

/* Tiers of 100 and 60 bytes a token, 2..4 tokens of the larger, 20-byte steps: pages 200..400.
   By hand (worst leftover fraction over both tiers): 200 -> 2 | 3 tokens, 0 | 20/200 = 0.10;
   220 -> 0.18; 240 -> 40/240 = 0.167 | 0; ... 300 -> 3 | 5 tokens, 0 | 0. So 300 bytes. */
Test(kvmem, page_size_hand_example)
{
    double tb[2] = {100, 60};
    kv_mem_page_choice pc;
    kv_error err = {0};
    cr_assert_eq(kv_mem_choose_page(tb, 2, 2, 4, 20, &pc, &err), 0, "%s", err.msg);
    cr_expect_eq(pc.page_bytes, 300);
    cr_expect_eq(pc.tokens_per_page[0], 3);
    cr_expect_eq(pc.tokens_per_page[1], 5);
    cr_expect_eq(pc.waste[0], 0);
    cr_expect_eq(pc.waste[1], 0);
}

/* bf16 (512 B a token per head) gives vLLM's 16-token page; DiffKV K8V4 / K4V2 with group 32 plus the
   score and position (232 / 136 B) gets the least worst-case waste of every page in its range. */
Test(kvmem, page_size_minimises_waste)
{
    kv_mem_page_choice pc;
    kv_error err = {0};
    double bf16 = 512;
    cr_assert_eq(kv_mem_choose_page(&bf16, 1, 16, 64, 32, &pc, &err), 0, "%s", err.msg);
    cr_expect_eq(pc.page_bytes, 8192);
    cr_expect_eq(pc.tokens_per_page[0], 16);

    double tb[2] = {232, 136};
    cr_assert_eq(kv_mem_choose_page(tb, 2, 16, 64, 32, &pc, &err), 0, "%s", err.msg);
    cr_expect_geq(pc.tokens_per_page[0], 16);
    cr_expect_leq(pc.page_bytes, 64 * 232);
    double chosen = pc.waste[0] > pc.waste[1] ? pc.waste[0] : pc.waste[1];
    for (uint32_t page = 3712; page <= 64 * 232; page += 32) {
        double w0 = (page - (double)(page / 232) * 232) / page, w1 = (page - (double)(page / 136) * 136) / page;
        double worst = w0 > w1 ? w0 : w1;
        cr_expect(worst >= chosen, "page %u wastes %.5f, less than the chosen %u's %.5f", page, worst,
                  pc.page_bytes, chosen);
        if (page < pc.page_bytes)
            cr_expect(worst > chosen, "smaller page %u ties the chosen one", page);
    }
    cr_expect_eq(pc.tokens_per_page[0], pc.page_bytes / 232);
    cr_expect_eq(pc.tokens_per_page[1], pc.page_bytes / 136);
}

/* The page choice scores only the first page of each run of equal token counts; it must pick what
   scoring every aligned page of the range picks (the scan it replaced), bit for bit. */
static void scan_page(const double *tb, int tiers, int min_tokens, int max_tokens, uint32_t align,
                      kv_mem_page_choice *out)
{
    double largest = tiers > 1 && tb[1] > tb[0] ? tb[1] : tb[0];
    double lo = ceil(min_tokens * largest / align) * align, hi = floor(max_tokens * largest / align) * align;
    if (hi < lo)
        hi = lo;
    double best = INFINITY;
    for (double page = lo; page <= hi; page += align) {
        double worst = 0, waste[KV_MEM_MAX_TIERS] = {0};
        for (int t = 0; t < tiers; t++) {
            waste[t] = (page - floor(page / tb[t]) * tb[t]) / page;
            worst = waste[t] > worst ? waste[t] : worst;
        }
        if (worst < best) {
            best = worst;
            out->page_bytes = (uint32_t)page;
            for (int t = 0; t < tiers; t++) {
                out->tokens_per_page[t] = (uint32_t)floor(page / tb[t]);
                out->waste[t] = waste[t];
            }
        }
    }
}

Test(kvmem, page_size_is_the_full_scans_choice)
{
    kv_rng rng;
    kv_rng_seed(&rng, 11);
    const uint32_t aligns[] = {32, 20, 64, 4096};
    int compared = 0;
    for (int round = 0; round < 3000; round++) {
        int tiers = 1 + (int)(kv_rng_below(&rng, 2));
        double tb[2];
        for (int t = 0; t < tiers; t++) {
            /* a (layer, head) token of a few bytes to a whole token of a large model, some whole numbers */
            double v = exp(log(3.0) + (log(400000.0) - log(3.0)) * kv_rng_uniform(&rng));
            tb[t] = kv_rng_below(&rng, 2) ? floor(v) + 1 : v;
            if (kv_rng_below(&rng, 3) == 0) /* small whole sizes: ties between pages (multiples) */
                tb[t] = (double)(8 * (1 + kv_rng_below(&rng, 64)));
        }
        int min_tokens = 1 + (int)kv_rng_below(&rng, 64);
        int max_tokens = min_tokens + (int)kv_rng_below(&rng, 96);
        uint32_t align = aligns[kv_rng_below(&rng, 4)];
        double largest = tiers > 1 && tb[1] > tb[0] ? tb[1] : tb[0];
        if (max_tokens * largest / align > 200000)
            continue; /* keep the reference scan short */
        kv_mem_page_choice got, want = {0};
        kv_error err = {0};
        cr_assert_eq(kv_mem_choose_page(tb, tiers, min_tokens, max_tokens, align, &got, &err), 0, "%s", err.msg);
        scan_page(tb, tiers, min_tokens, max_tokens, align, &want);
        cr_assert_eq(got.page_bytes, want.page_bytes, "round %d: tiers %d (%.17g, %.17g), tokens %d..%d, align %u: %u, "
                     "the scan %u", round, tiers, tb[0], tiers > 1 ? tb[1] : 0.0, min_tokens, max_tokens, align,
                     got.page_bytes, want.page_bytes);
        for (int t = 0; t < tiers; t++) {
            cr_assert_eq(got.tokens_per_page[t], want.tokens_per_page[t]);
            cr_assert_eq(got.waste[t], want.waste[t]);
        }
        compared++;
    }
    cr_expect_gt(compared, 1500, "only %d cases compared", compared);
}

Test(kvmem, page_size_rejects_bad_input)
{
    kv_mem_page_choice pc;
    kv_error err = {0};
    double zero = 0, tb = 100;
    cr_expect_eq(kv_mem_choose_page(&zero, 1, 16, 64, 32, &pc, &err), KV_EINPUT);
    cr_expect_eq(kv_mem_choose_page(&tb, 3, 16, 64, 32, &pc, &err), KV_EINPUT);
    cr_expect_eq(kv_mem_choose_page(&tb, 1, 8, 4, 32, &pc, &err), KV_EINPUT);
}

/* ---- The compaction kernel through the manager -------------------------------------------------- */

/* From a fresh ring (0, 1, 2, ... in order, head 0) entry i must get exactly the ring positions
   [offset_i, offset_i + demand_i): contiguous, disjoint, complete. */
Test(kvmem, random_demands_get_disjoint_complete_ranges)
{
    kv_backend *be = open_cpu();
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    for (int round = 0; round < 20; round++) {
        kv_mem *m = small_pool(be, 5000, 64, 2);
        int slots[4];
        for (int s = 0; s < 4; s++)
            slots[s] = kv_mem_seq_open(m);
        size_t n = 4 * 64 * 2;
        kv_mem_demand *d = calloc(n, sizeof *d);
        size_t k = 0;
        uint32_t total = 0;
        for (int s = 0; s < 4; s++)
            for (int h = 0; h < 64; h++)
                for (int t = 0; t < 2; t++) {
                    uint32_t pages = (uint32_t)kv_rng_below(&rng, 8); /* zeros included */
                    d[k++] = (kv_mem_demand){slots[s], h, t, pages};
                    total += pages;
                }
        bool granted = false;
        kv_error err = {0};
        cr_assert_eq(kv_mem_alloc(m, d, n, &granted, &err), 0, "%s", err.msg);
        cr_assert(granted);
        cr_expect_eq(kv_mem_free_pages(m), 5000 - total);
        uint32_t offset = 0;
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(kv_mem_seq_pages(m, d[i].slot, d[i].head, d[i].tier), d[i].pages);
            for (uint32_t j = 0; j < d[i].pages; j++)
                cr_assert_eq(kv_mem_seq_page(m, d[i].slot, d[i].head, d[i].tier, j), offset + j,
                             "entry %zu page %u: got %u, want ring position %u", i, j,
                             kv_mem_seq_page(m, d[i].slot, d[i].head, d[i].tier, j), offset + j);
            offset += d[i].pages;
        }
        check(m);
        cr_assert_eq(kv_mem_release_seqs(m, slots, 4, &err), 0, "%s", err.msg);
        cr_expect_eq(kv_mem_free_pages(m), 5000);
        check(m);
        free(d);
        kv_mem_destroy(m);
    }
    kv_backend_close(be);
}

/* Drive head and tail around the ring's end: an allocation then reads across the wrap. */
Test(kvmem, allocation_wraps_around_the_ring)
{
    kv_backend *be = open_cpu();
    kv_mem *m = small_pool(be, 100, 2, 1);
    int a = kv_mem_seq_open(m), b = kv_mem_seq_open(m);
    kv_error err = {0};
    bool granted;
    /* a takes 0..89, b 90..94; releasing a puts 0..89 at the tail (ring slots 0..89 again,
       after 95..99): free = 95..99, 0..89 in that ring order, head at 95. */
    kv_mem_demand da = {a, 0, 0, 90}, db = {b, 1, 0, 5};
    cr_assert_eq(kv_mem_alloc(m, &da, 1, &granted, &err), 0, "%s", err.msg);
    cr_assert(granted);
    cr_assert_eq(kv_mem_alloc(m, &db, 1, &granted, &err), 0, "%s", err.msg);
    cr_assert(granted);
    cr_assert_eq(kv_mem_release_seqs(m, &a, 1, &err), 0, "%s", err.msg);
    check(m);
    /* Now 8 pages: ring slots 95..99 then 0..2 -> pages 95..99, 0, 1, 2. */
    kv_mem_demand dw[2] = {{a, 0, 0, 3}, {a, 1, 0, 5}};
    cr_assert_eq(kv_mem_alloc(m, dw, 2, &granted, &err), 0, "%s", err.msg);
    cr_assert(granted);
    uint32_t want0[3] = {95, 96, 97}, want1[5] = {98, 99, 0, 1, 2};
    for (uint32_t j = 0; j < 3; j++)
        cr_expect_eq(kv_mem_seq_page(m, a, 0, 0, j), want0[j]);
    for (uint32_t j = 0; j < 5; j++)
        cr_expect_eq(kv_mem_seq_page(m, a, 1, 0, j), want1[j], "page %u: %u", j, kv_mem_seq_page(m, a, 1, 0, j));
    check(m);
    /* Release across the wrap too: everything back, nothing lost. */
    int both[2] = {a, b};
    cr_assert_eq(kv_mem_release_seqs(m, both, 2, &err), 0, "%s", err.msg);
    cr_expect_eq(kv_mem_free_pages(m), 100);
    check(m);
    kv_mem_destroy(m);
    kv_backend_close(be);
}

Test(kvmem, allocation_is_all_or_nothing)
{
    kv_backend *be = open_cpu();
    kv_mem *m = small_pool(be, 50, 4, 2);
    int s = kv_mem_seq_open(m);
    kv_error err = {0};
    bool granted = true;
    kv_mem_demand d[3] = {{s, 0, 0, 20}, {s, 1, 1, 20}, {s, 2, 0, 11}};
    cr_assert_eq(kv_mem_alloc(m, d, 3, &granted, &err), 0, "%s", err.msg);
    cr_expect(!granted);
    cr_expect_eq(kv_mem_free_pages(m), 50);
    cr_expect_eq(kv_mem_seq_total_pages(m, s), 0);
    check(m);
    d[2].pages = 10; /* exactly the pool */
    cr_assert_eq(kv_mem_alloc(m, d, 3, &granted, &err), 0, "%s", err.msg);
    cr_expect(granted);
    cr_expect_eq(kv_mem_free_pages(m), 0);
    kv_mem_stats st;
    kv_mem_get_stats(m, &st);
    cr_expect_eq(st.failed_allocs, 1);
    cr_expect_eq(st.calls, 2);
    cr_expect_eq(st.peak_used_pages, 50);
    check(m);
    cr_assert_eq(kv_mem_release_seqs(m, &s, 1, &err), 0, "%s", err.msg);
    check(m);
    kv_mem_destroy(m);
    kv_backend_close(be);
}

/* ---- Bidirectional page tables ------------------------------------------------------------------ */

Test(kvmem, high_pages_grow_from_the_front_low_from_the_back)
{
    kv_backend *be = open_cpu();
    kv_mem *m = small_pool(be, 1000, 2, 2);
    int s = kv_mem_seq_open(m);
    kv_error err = {0};
    bool granted;
    /* Interleave small grants so the table has to grow (it starts at 16 entries) with both tiers in it. */
    uint32_t high[40], low[40], nh = 0, nl = 0, next = 0;
    for (int round = 0; round < 10; round++) {
        kv_mem_demand d[2] = {{s, 1, 0, 3}, {s, 1, 1, 2}};
        cr_assert_eq(kv_mem_alloc(m, d, 2, &granted, &err), 0, "%s", err.msg);
        cr_assert(granted);
        for (int j = 0; j < 3; j++)
            high[nh++] = next++;
        for (int j = 0; j < 2; j++)
            low[nl++] = next++;
    }
    uint32_t cap = 0;
    const uint32_t *t = kv_mem_seq_table(m, s, 1, &cap);
    cr_assert_geq(cap, 50);
    for (uint32_t i = 0; i < nh; i++)
        cr_expect_eq(t[i], high[i], "front entry %u: %u, want high page %u", i, t[i], high[i]);
    for (uint32_t i = 0; i < nl; i++)
        cr_expect_eq(t[cap - 1 - i], low[i], "back entry %u: %u, want low page %u", cap - 1 - i, t[cap - 1 - i],
                     low[i]);
    cr_expect_eq(kv_mem_seq_pages(m, s, 0, 0) + kv_mem_seq_pages(m, s, 0, 1), 0); /* head 0 untouched */
    /* DiffKV's prompt phase: pages granted high handed to the low tier keep their order at the back. */
    kv_mem_move(m, s, 1, 0, 1, 4);
    t = kv_mem_seq_table(m, s, 1, &cap);
    cr_expect_eq(kv_mem_seq_pages(m, s, 1, 0), nh - 4);
    cr_expect_eq(kv_mem_seq_pages(m, s, 1, 1), nl + 4);
    for (uint32_t j = 0; j < 4; j++)
        cr_expect_eq(kv_mem_seq_page(m, s, 1, 1, nl + j), high[nh - 4 + j]);
    /* Releasing the newest low pages returns exactly those. */
    kv_mem_demand r = {s, 1, 1, 4};
    cr_assert_eq(kv_mem_release(m, &r, 1, &err), 0, "%s", err.msg);
    cr_expect_eq(kv_mem_seq_pages(m, s, 1, 1), nl);
    cr_expect_eq(kv_mem_free_pages(m), 1000 - 50 + 4);
    check(m);
    cr_assert_eq(kv_mem_release_seqs(m, &s, 1, &err), 0, "%s", err.msg);
    check(m);
    kv_mem_destroy(m);
    kv_backend_close(be);
}

/* ---- A long random run ---------------------------------------------------------------------------- */

/* Sequences come and go; each step every live sequence asks for a few pages per (head, tier) in one
   batch, sometimes gives back its newest pages, sometimes finishes. Checked against the backend's
   ring every 25 steps: every page is free or held exactly once. */
Test(kvmem, long_random_run_neither_leaks_nor_double_frees)
{
    kv_backend *be = open_cpu();
    const int heads = 16, max_live = 12;
    kv_mem *m = small_pool(be, 3000, heads, 2);
    kv_rng rng;
    kv_rng_seed(&rng, 2024);
    int live[12];
    int n_live = 0;
    kv_mem_demand *d = calloc((size_t)max_live * heads * 2, sizeof *d);
    kv_error err = {0};
    uint64_t granted_total = 0, released_total = 0, refused = 0;
    for (int step = 0; step < 2000; step++) {
        while (n_live < max_live && kv_rng_below(&rng, 3) == 0)
            live[n_live++] = kv_mem_seq_open(m);
        size_t n = 0;
        uint64_t asked = 0;
        for (int i = 0; i < n_live; i++)
            for (int h = 0; h < heads; h++)
                for (int t = 0; t < 2; t++)
                    if (kv_rng_below(&rng, 4) == 0) {
                        uint32_t p = 1 + (uint32_t)kv_rng_below(&rng, 3);
                        d[n++] = (kv_mem_demand){live[i], h, t, p};
                        asked += p;
                    }
        uint32_t free_before = kv_mem_free_pages(m);
        bool granted = false;
        cr_assert_eq(kv_mem_alloc(m, d, n, &granted, &err), 0, "%s", err.msg);
        cr_assert_eq(granted, asked <= free_before, "step %d: asked %llu with %u free, granted %d", step,
                     (unsigned long long)asked, free_before, granted);
        if (granted)
            granted_total += asked;
        else
            refused++;
        /* Shrink some tiers (DiffKV's prompt phase gives back surplus pages). */
        n = 0;
        for (int i = 0; i < n_live; i++)
            for (int h = 0; h < heads; h++)
                for (int t = 0; t < 2; t++) {
                    uint32_t have = kv_mem_seq_pages(m, live[i], h, t);
                    if (have > 0 && kv_rng_below(&rng, 10) == 0) {
                        uint32_t p = 1 + (uint32_t)kv_rng_below(&rng, have);
                        d[n++] = (kv_mem_demand){live[i], h, t, p};
                        released_total += p;
                    }
                }
        cr_assert_eq(kv_mem_release(m, d, n, &err), 0, "%s", err.msg);
        /* Finish some sequences, or many when memory is tight (preemption-like). */
        int finish[12], n_finish = 0;
        for (int i = 0; i < n_live;) {
            bool tight = kv_mem_free_pages(m) < 200;
            if (kv_rng_below(&rng, tight ? 2 : 50) == 0) {
                finish[n_finish++] = live[i];
                live[i] = live[--n_live];
            } else {
                i++;
            }
        }
        for (int i = 0; i < n_finish; i++)
            released_total += kv_mem_seq_total_pages(m, finish[i]);
        cr_assert_eq(kv_mem_release_seqs(m, finish, (size_t)n_finish, &err), 0, "%s", err.msg);
        for (int i = 0; i < n_finish; i++)
            kv_mem_seq_close(m, finish[i]);
        if (step % 25 == 0)
            check(m);
    }
    for (int i = 0; i < n_live; i++)
        released_total += kv_mem_seq_total_pages(m, live[i]);
    cr_assert_eq(kv_mem_release_seqs(m, live, (size_t)n_live, &err), 0, "%s", err.msg);
    cr_expect_eq(kv_mem_free_pages(m), 3000);
    cr_expect_eq(granted_total, released_total);
    cr_expect_gt(refused, 0, "the run never filled the pool: it did not test refusals");
    cr_expect_gt(granted_total, 10 * 3000, "the ring did not go round several times");
    kv_mem_stats st;
    kv_mem_get_stats(m, &st);
    cr_expect_eq(st.pages_allocated, granted_total);
    cr_expect_eq(st.pages_released, released_total);
    check(m);
    free(d);
    kv_mem_destroy(m);
    kv_backend_close(be);
}
