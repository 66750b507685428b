/* kvcache.h — one request's KV on a decode node: tokens per tier and (layer, KV head), and the pages they need.
 *
 * The engine keeps one kv_cache per request. It knows how the policy stores
 * KV (one precision, KIVI's quantized tokens plus a bf16 window, or DiffKV's
 * high / low / pruned tiers), how many tokens each (layer, KV head) holds in
 * each tier, and so how many unified pages (core/sim/kvmem.h) it needs. DiffKV's
 * heads differ, so it has a page table per (layer, KV head); the other
 * encodings store the same tokens in every head, so a sequence has one table
 * and a page spans every layer and head (vLLM's blocks).
 *   - growing tiers keep room for one more token: pages = tokens / per_page + 1
 *     (DiffKV's prepare_append allocates a page for a tier as soon as it is
 *     full, so every step can append without waiting; vLLM likewise);
 *   - KIVI's bf16 window is a ring of R tokens, allocated whole.
 * DiffKV's counts come from the tier process in core/kv/diffkv.h; during its
 * prompt phase every prompt token is counted high (DiffKV allocates the
 * prompt at high precision, then frees what the tiering does not keep:
 * kv_cache_shrink).
 */
#ifndef KV_KVCACHE_H
#define KV_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kv/diffkv.h"
#include "core/base/error.h"
#include "core/sim/kvmem.h"
#include "core/kv/encoding.h"

#define KV_DIFFKV_TOKEN_META_BYTES 8 /* DiffKV stores a running score (f32) and a position (i32) per token */

typedef enum kv_cache_kind {
    KV_CACHE_PLAIN = 0,  /* one precision for every token (bf16, int8, int4, Lynx once merged) */
    KV_CACHE_KIVI = 1,   /* tier 0: quantized tokens; tier 1: the most recent R tokens in bf16 */
    KV_CACHE_DIFFKV = 2, /* tier 0: high; tier 1: low; the rest pruned */
} kv_cache_kind;

typedef struct kv_cache {
    kv_cache_kind kind;
    int tiers;               /* tiers in use: 1 or 2 */
    int heads;               /* layers x KV heads */
    int tables;              /* page tables per sequence: heads for DiffKV, else 1 (pages span all heads) */
    double head_bytes[2];    /* stored bytes per token per (layer, KV head), tier by tier (max over heads) */
    double token_bytes[2];   /* per token per page table: head_bytes x heads / tables */
    int window;              /* KIVI: R tokens in bf16 */
    kv_diffkv_seq *dkv;      /* DiffKV: the tier process (owned) */
    int64_t tokens;          /* L: tokens whose KV is stored (pruned ones included) */
    bool prompt_high;        /* DiffKV prompt phase: every token counted high */
    uint32_t per_page[2];    /* tokens a page holds, per tier (kv_cache_bind) */
    uint32_t ring_pages;     /* KIVI: pages of the bf16 window */
    uint32_t *room;          /* [2][tables] tokens the held pages can hold, tier by tier (kv_cache_sync) */
} kv_cache;

/* Sets up a request's cache from its encodings enc[heads] (all DiffKV or
   none). DiffKV needs the score model, the per-head part of it head_model[heads]
   (head_factor from kv_diffkv_head_factors, table_row from kv_diffkv_table_row;
   alphas and window come from enc; NULL: factor 1, row 0) and a seed for the
   request's token draws. Starts with no tokens. KV_EINPUT on encodings that
   mix kinds. */
int kv_cache_init(kv_cache *c, const kv_encoding *enc, int heads, int head_dim, const kv_diffkv_score_model *sm,
                  const kv_diffkv_head_params *head_model, uint64_t seed, kv_error *err);
void kv_cache_free(kv_cache *c); /* frees what init allocated; c itself is the caller's */
/* Sets c up as kv_cache_init would from the encodings that made proto (a cache
   fresh from kv_cache_init, not DiffKV: DiffKV's tier process is per request):
   same kind and sizes, its own page rooms, no tokens. proto is unchanged. */
void kv_cache_init_like(kv_cache *c, const kv_cache *proto);

/* Bytes the prefill node sends for a prompt of `tokens` tokens: DiffKV sends
   the kept tiers at their precision plus each kept token's score and
   position; it classifies the prompt (kv_cache_set_tokens(c, tokens, false)). */
void kv_cache_wire_bytes(kv_cache *c, const kv_encoding *enc, int head_dim, int tokens, double *bytes,
                         double *kept_tokens);

/* Resets to `tokens` tokens (a prefill, or a recompute after preemption).
   prompt_high: DiffKV's prompt phase, before its tiering. */
void kv_cache_set_tokens(kv_cache *c, int64_t tokens, bool prompt_high);
/* Appends tokens until L = tokens (DiffKV: one tier step each). L never
   shrinks for DiffKV (its counts cannot be rewound); the others follow. */
void kv_cache_grow_to(kv_cache *c, int64_t tokens);

/* Tokens of (head) per tier now. */
void kv_cache_counts(const kv_cache *c, int head, uint32_t out[2]);
/* Sums over heads of tokens stored high (tier 0), low (tier 1) and pruned. */
void kv_cache_totals(const kv_cache *c, double *tier0, double *tier1, double *pruned);
/* Bytes one decode step reads: every stored token of every head. */
double kv_cache_read_bytes(const kv_cache *c);

/* Uses node memory m: tokens per page of each tier. Requests of any encodings share a node: a plain or
   KIVI cache whose whole token does not fit m's page takes a page table per (layer, KV head) (tables =
   heads), and a DiffKV one always has them (open its sequence with kv_mem_seq_open_tables(m, c->tables)).
   KV_EINPUT when even one head's token does not fit a page. */
int kv_cache_bind(kv_cache *c, const kv_mem *m, kv_error *err);
/* Pages a fresh allocation of the current state needs (admission). */
uint64_t kv_cache_pages_needed(const kv_cache *c);
/* Refreshes the room the held pages give from the page tables (slot < 0: none). */
void kv_cache_sync(kv_cache *c, const kv_mem *m, int slot);
/* Adds the room of granted entries d[n] (this request's) without reading the tables. */
void kv_cache_granted(kv_cache *c, const kv_mem_demand *d, size_t n);
/* Appends to out the entries this request still needs so that every tier of
   every head has room for one more token (slot < 0: nothing held). Returns
   the number of entries (out may be NULL to count) and adds the pages to *pages. */
size_t kv_cache_demands(const kv_cache *c, const kv_mem *m, int slot, kv_mem_demand *out, uint64_t *pages);
/* True when some head lacks room (cheap check before kv_cache_demands). */
bool kv_cache_short(const kv_cache *c, const kv_mem *m, int slot);
/* After DiffKV's prompt tiering: hands surplus high pages to the low tier
   (kv_mem_move) and appends release entries for what is left over; the room
   is set to what remains once they are released. Returns the number of
   entries. out needs room for 2 x heads entries. */
size_t kv_cache_shrink(kv_cache *c, kv_mem *m, int slot, kv_mem_demand *out);

#endif
