/* cpu_attention.h — what the files of the fast CPU attention (cpu_attention.c and the AVX2 and AVX-512 items) share (not for use outside cpu/). */
#ifndef KV_CPU_ATTENTION_H
#define KV_CPU_ATTENTION_H

#include "backends/cpu/cpu_internal.h"

/* Resolved arguments. */
typedef struct attn {
    const kv_attention_args *a;
    const cpu_ctx *c;
    const float *q;
    const uint32_t *q_pos, *head_pages, *positions;
    const kv_page_desc *pages;
    const uint8_t *kv;
    float *out, *scores;
    uint32_t group;          /* query heads per KV head */
    uint32_t max_page_tokens;
    uint64_t *head_tokens;   /* [n_kv_heads] tokens of each KV head */
    uint64_t max_head_tokens;
} attn;

/* Per-worker scratch of the fast path. */
typedef struct fast_ws {
    float *tile;          /* [max_page_tokens][head_dim] */
    float *logits;        /* [block][group][max_head_tokens] */
    float *acc;           /* [block][group][head_dim] */
    float *score_acc;     /* [group][max_head_tokens] when scores are asked for */
    kv_cpu_scratch dec;   /* for the fused decode */
    float *qpad;          /* AVX-512 and AVX2 paths: [rows rounded up to 4][head_dim] */
    float *sz;            /* AVX-512 and AVX2 paths: a page's scales then zeros as f32, [2][page groups] */
} fast_ws;

typedef struct fast_job {
    const attn *t;
    fast_ws *ws;      /* one per worker */
    uint32_t block;   /* queries per block */
    uint32_t blocks;  /* blocks per KV head */
    int per_head;     /* 1: an item is a whole KV head (scores asked for) */
} fast_job;

/* One page's K (value = 0) or V (value = 1) as f32 [ntokens][head_dim] (cpu_attention.c). */
void kv_cpu_page_tile(const attn *t, const kv_page_desc *pg, int value, float *tile, uint16_t *codes,
                      kv_cpu_scratch *scratch);

/* Lines of a later page still to be prefetched into L2: one line is asked for
   per chunk of work (kv_cpu_prefetch_step), so that the requests spread over
   the page being computed instead of arriving in a burst that fills the
   line-fill buffers and stalls the core. Pages are a few KiB, and the hardware
   prefetchers stop at 4 KiB page boundaries. */
typedef struct pf_cursor {
    const char *at[2]; /* data, metadata */
    size_t n[2];       /* 64-byte lines left in each */
} pf_cursor;

enum { KV_CPU_PREFETCH_PAGES = 2 }; /* how far ahead the SIMD items prefetch */

static inline __attribute__((always_inline)) void kv_cpu_prefetch_step(pf_cursor *c)
{
    /* no indexing by a variable, so that a local cursor stays in registers */
    if (c->n[0]) {
        __builtin_prefetch(c->at[0], 0, 2); /* locality 2: prefetcht1 on x86 */
        c->at[0] += 64;
        c->n[0]--;
    } else if (c->n[1]) {
        __builtin_prefetch(c->at[1], 0, 2);
        c->at[1] += 64;
        c->n[1]--;
    }
}

/* Sets *c to the K (value = 0) or V (value = 1) data and metadata of pg (cpu_attention.c). */
void kv_cpu_prefetch_page(const attn *t, const kv_page_desc *pg, int value, pf_cursor *c);
/* Issues what is left of *c (a page shorter than its successor's prefetch). */
void kv_cpu_prefetch_rest(pf_cursor *c);

/* What a work item covers: its KV head, its blocks of queries, the head's
   tokens and pages (every item of the three attention items starts so). */
typedef struct item_span {
    uint32_t kh, b0, b1;   /* KV head; blocks [b0, b1) */
    size_t T;              /* tokens of the KV head */
    uint32_t pfirst, pend; /* its pages, [pfirst, pend) */
} item_span;

/* Fills *s for work item `item` and clears the scores it will sum (w->score_acc). */
void kv_cpu_item_begin(const fast_job *j, fast_ws *w, size_t item, item_span *s);

/* Block b's first query (*q0) and rows, (query, head in group) pairs: returns the rows. */
uint32_t kv_cpu_block_rows(const fast_job *j, uint32_t b, uint32_t *q0);

/* Page p of a SIMD item's pass over [.., pend): what is left of *pf is issued
   and the page KV_CPU_PREFETCH_PAGES ahead begun (its K, value = 0, or V);
   NULL when p holds no tokens. */
const kv_page_desc *kv_cpu_pass_page(const attn *t, uint32_t p, uint32_t pend, int value, pf_cursor *pf);

/* Adds row group g4's probabilities (token-major, L[T][4]) to the scores, row
   r of the nq rows into w->score_acc[r % group]; nothing when none are asked for. */
void kv_cpu_scores_add4(const attn *t, fast_ws *w, const float *L, uint32_t g4, uint32_t nq, size_t T);

/* A KV head's scores: for each of its T tokens, the largest probability any
   of its GQA heads summed over the item's queries (w->score_acc, [group][T]). */
void kv_cpu_scores_store(const attn *t, const fast_ws *w, uint32_t kh, size_t T);

/* Rows [0, nq) of a block (row r: query q0 + r / group, head kh * group + r % group)
   from their double sums acc[r][head_dim] to f32 outputs. */
void kv_cpu_rows_store(const attn *t, const double *acc, uint32_t q0, uint32_t nq, uint32_t kh);

/* The AVX-512 work item (cpu_attention_avx512.c); usable when head_dim % 32 == 0. */
void kv_cpu_attention_item_avx512(void *job, size_t i0, size_t i1, int worker);

/* The AVX2 work item (cpu_attention_avx2.c); usable when head_dim % 16 == 0. */
void kv_cpu_attention_item_avx2(void *job, size_t i0, size_t i1, int worker);

#endif
