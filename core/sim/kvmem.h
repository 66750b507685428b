/* kvmem.h — the decode node's KV memory manager: unified pages, a circular free list, per-head page tables.
 *
 * Design notes (after DiffKV, 2412.03131, section 5).
 *
 * Pages. Every page has the same size in bytes (unified pages); a page holds
 * tokens_per_page[t] tokens of one (layer, KV head) in tier t (DiffKV: tier 0
 * = high K8V4, tier 1 = low K4V2; single-precision policies use tier 0 only,
 * which is vLLM's paged KV with per-head pages). The size is chosen once, as
 * DiffKV does: among page sizes holding min..max tokens of the largest tier,
 * in steps of `align` bytes, the one whose worst per-tier leftover fraction
 * is smallest; ties go to the smaller page.
 *
 * Free list. A ring of capacity page ids in backend memory, with state
 * {head, tail, free_count, status} (backends/backend.h, kv_compact_args).
 * Allocation and release go through the backend's compaction kernels, one
 * call for a whole batch: an exclusive prefix sum over the per-(sequence,
 * head, tier) page demands gives every entry a disjoint range of the ring.
 *
 * Page tables. Each open sequence has one table per (layer, KV head): an
 * array of `cap` page ids in which tier-0 pages grow from the front
 * ([0, n0)) and tier-1 pages from the back ([cap - n1, cap)), so neither tier
 * needs to know the other's size (DiffKV's bidirectional page table). The
 * tables live in host memory: the compaction kernel writes the granted page
 * ids to a backend buffer, which is read back and placed.
 *
 * Invariants (kv_mem_check verifies 1-2 against backend memory):
 *  1. The pages on the free ring and the pages in all page tables are
 *     exactly 0 .. capacity-1, each once (no leak, no double free).
 *  2. free_count on the device equals the host's mirror.
 *  3. An allocation either grants every entry or changes nothing.
 *
 * Cost. Every call is timed (host wall clock, including buffer transfers);
 * the bytes the kernels touch are counted so a roofline can cost the call
 * deterministically.
 */
#ifndef KV_KVMEM_H
#define KV_KVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/base/error.h"

#define KV_MEM_MAX_TIERS 2

/* The page size chosen for a set of tiers. */
typedef struct kv_mem_page_choice {
    uint32_t page_bytes;                         /* bytes per page */
    uint32_t tokens_per_page[KV_MEM_MAX_TIERS];  /* tokens of each tier a page holds */
    double waste[KV_MEM_MAX_TIERS];              /* unused fraction of a full page, per tier */
} kv_mem_page_choice;

/* Chooses the unified page size (see the file comment). token_bytes[t] > 0:
   bytes one token of one (layer, KV head) takes in tier t. KV_EINPUT on bad
   arguments. */
int kv_mem_choose_page(const double *token_bytes, int tiers, int min_tokens, int max_tokens, uint32_t align_bytes,
                       kv_mem_page_choice *out, kv_error *err);

typedef struct kv_mem_config {
    double capacity_bytes;                /* KV memory of the node */
    int tiers;                            /* 1 or 2 */
    double token_bytes[KV_MEM_MAX_TIERS]; /* per token per (layer, KV head), tier by tier */
    int heads;                            /* page tables per sequence: layers x KV heads */
    int min_page_tokens, max_page_tokens; /* page size search range, in tokens of the largest tier */
    uint32_t align_bytes;                 /* page size granularity (0: 32) */
    uint32_t max_pages;                   /* cap on the page count (0: none; tests use small pools) */
} kv_mem_config;

typedef struct kv_mem kv_mem;

/* Creates the manager and its free list (all pages free) in `be`'s memory.
   The manager borrows `be`, which must outlive it. KV_EINPUT when the
   configuration is impossible (no page fits, more than 2^32-1 pages). */
int kv_mem_create(kv_backend *be, const kv_mem_config *cfg, kv_mem **out, kv_error *err);
void kv_mem_destroy(kv_mem *m); /* NULL is fine; frees the backend buffers */

uint32_t kv_mem_page_bytes(const kv_mem *m);
uint32_t kv_mem_tokens_per_page(const kv_mem *m, int tier);
uint32_t kv_mem_capacity_pages(const kv_mem *m);
uint32_t kv_mem_free_pages(const kv_mem *m);
uint32_t kv_mem_used_pages(const kv_mem *m);
int kv_mem_heads(const kv_mem *m); /* page tables per sequence the page size was chosen for */
int kv_mem_tiers(const kv_mem *m);

/* Opens a sequence with empty page tables, kv_mem_heads(m) of them; returns its slot (>= 0). */
int kv_mem_seq_open(kv_mem *m);
/* Opens a sequence with `tables` (>= 1) page tables: requests of different encodings share a node, one
   table for a plain sequence, one per (layer, KV head) for DiffKV's (kvcache.h, kv_cache_bind). */
int kv_mem_seq_open_tables(kv_mem *m, int tables);
/* Closes a slot; it must hold no pages (release them first). */
void kv_mem_seq_close(kv_mem *m, int slot);
/* Pages of one tier of one head, and page i of them (0 = oldest). */
uint32_t kv_mem_seq_pages(const kv_mem *m, int slot, int head, int tier);
uint32_t kv_mem_seq_page(const kv_mem *m, int slot, int head, int tier, uint32_t i);
uint64_t kv_mem_seq_total_pages(const kv_mem *m, int slot);
/* The raw bidirectional table of one head: *cap entries; tier 0 at the front, tier 1 at the back. */
const uint32_t *kv_mem_seq_table(const kv_mem *m, int slot, int head, uint32_t *cap);

/* One entry of a batch: `pages` pages for (slot, head, tier). */
typedef struct kv_mem_demand {
    int32_t slot;
    int32_t head;
    int32_t tier;
    uint32_t pages;
} kv_mem_demand;

/* Allocates every entry's pages in one compaction call and appends them to
   the entries' tables (newest last). All or nothing: *granted is false and
   nothing changes when the free pages do not cover the total. */
int kv_mem_alloc(kv_mem *m, const kv_mem_demand *d, size_t n, bool *granted, kv_error *err);
/* Releases the newest `pages` pages of each entry's tier in one call. */
int kv_mem_release(kv_mem *m, const kv_mem_demand *d, size_t n, kv_error *err);
/* Releases every page of the given sequences in one call (slots stay open). */
int kv_mem_release_seqs(kv_mem *m, const int *slots, size_t n, kv_error *err);
/* Moves the newest `pages` pages of from_tier of (slot, head) to become the
   newest pages of to_tier (DiffKV's prompt phase: pages allocated high are
   handed to the low tier). Host tables only; no kernel. */
void kv_mem_move(kv_mem *m, int slot, int head, int from_tier, int to_tier, uint32_t pages);

typedef struct kv_mem_stats {
    uint64_t calls;            /* compaction kernel calls */
    uint64_t entries;          /* demand entries over all calls */
    uint64_t pages_allocated, pages_released;
    uint64_t failed_allocs;    /* calls that found too few free pages */
    uint32_t peak_used_pages;
    double wall_s;             /* measured wall time of all calls (non-deterministic) */
    double bytes_touched;      /* bytes the kernels read and wrote in backend memory */
    double last_bytes_touched; /* of the latest call */
    double last_wall_s;        /* of the latest call */
} kv_mem_stats;

void kv_mem_get_stats(const kv_mem *m, kv_mem_stats *out);

/* Reads the ring state back from the backend and verifies invariant 2 and
   that held + free pages = capacity; `full` also reads the whole ring and
   verifies invariant 1 page by page (O(capacity)). KV_EFAIL naming the
   first violation. */
int kv_mem_check(kv_mem *m, bool full, kv_error *err);

#endif
