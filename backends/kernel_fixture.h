/* kernel_fixture.h — kernel problems for tests, the benchmark and measured
 * timing: a paged, mixed-precision KV cache with queries, built on the host
 * (deterministically from a seed) and uploadable to any backend. */
#ifndef KV_KERNEL_FIXTURE_H
#define KV_KERNEL_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

typedef struct kv_attn_spec {
    uint32_t n_queries;   /* 1: decode; k: verification of k tokens; T: prefill */
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* KV heads */
    uint32_t head_dim;
    uint32_t tokens;      /* context tokens per KV head; the queries are the last n_queries of them */
    uint32_t page_tokens; /* tokens per page (a KV head's last page may be shorter) */
    const kv_store_format *key_formats;   /* page p (counted over all KV heads) uses [p % n_formats] */
    const kv_store_format *value_formats; /* likewise */
    uint32_t n_formats;   /* >= 1 */
    int scores;           /* 1: ask for the significance scores */
    int empty_pages;      /* 1: put a zero-token page before every KV head's pages (tests) */
    uint64_t seed;
} kv_attn_spec;

typedef struct kv_attn_problem kv_attn_problem; /* host copy, opaque */
typedef struct kv_attn_device kv_attn_device;   /* a problem uploaded to a backend */

/* Builds the host copy. K has a few outlier channels (x8) as real keys do;
   V is standard normal; q is scaled so that the softmax is peaked. Formats
   are checked (KV_EINPUT). Free with kv_attn_problem_destroy. */
int kv_attn_problem_create(const kv_attn_spec *spec, kv_attn_problem **out, kv_error *err);
void kv_attn_problem_destroy(kv_attn_problem *p); /* NULL is fine */
const kv_attn_spec *kv_attn_problem_spec(const kv_attn_problem *p);
/* Tests of huge and tiny query elements: multiplies query element e (over
   the whole [n_queries][n_heads][head_dim] array) by `big` where
   e % stride == 0, else by `small` (stride 1: every element by big). Call
   before kv_attn_device_create. */
void kv_attn_problem_scale_q(kv_attn_problem *p, uint32_t stride, float big, float small);
/* Bytes one attention pass must move at least: every page's K and V data
   and metadata, the positions, q and out (and the scores). */
uint64_t kv_attn_problem_bytes(const kv_attn_problem *p);
size_t kv_attn_problem_out_floats(const kv_attn_problem *p);   /* n_queries * n_heads * head_dim */
size_t kv_attn_problem_score_floats(const kv_attn_problem *p); /* n_kv_heads * score_stride, 0 if none */

/* Uploads to a backend and prepares the arguments (out and scores filled
   with a NaN pattern first, so unwritten outputs show). */
int kv_attn_device_create(const kv_attn_problem *p, kv_backend *be, kv_attn_device **out, kv_error *err);
void kv_attn_device_destroy(kv_attn_device *d); /* NULL is fine */
/* Enqueues the attention kernel (does not wait). */
int kv_attn_device_run(kv_attn_device *d, kv_error *err);
/* Synchronises and copies out (and scores, when asked for and non-NULL). */
int kv_attn_device_read(kv_attn_device *d, float *out, float *scores, kv_error *err);
/* The four steps at once: create, run, read into out (and scores), destroy. */
int kv_attn_solve(const kv_attn_problem *p, kv_backend *be, float *out, float *scores, kv_error *err);

/* The conformance measure for attention: the largest |got − want| of a row
   (one query and head) divided by the largest |want| of that row (1e-30 if
   the row is zero), maximised over rows. NaN anywhere gives +Inf. */
double kv_attn_rel_error(const float *got, const float *want, size_t rows, size_t cols);

/* Deterministic test values: n floats, normal(0, 1) from seed. */
void kv_fixture_normal(float *x, size_t n, uint64_t seed);

#endif
