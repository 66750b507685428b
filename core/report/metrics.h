/* metrics.h — per-policy summary statistics of a run, named as vLLM's benchmark names them. */
#ifndef KV_METRICS_H
#define KV_METRICS_H

#include <stddef.h>

#include "core/sim/engine.h"

typedef struct kv_stat {
    double mean, std, median, p90, p99; /* std: population (numpy's np.std, as vLLM's std_*_ms) */
    size_t n; /* samples; 0 means the metric did not occur (printed as null) */
} kv_stat;

typedef struct kv_summary {
    size_t completed;
    double duration_s;           /* first arrival to last completion */
    double request_throughput;   /* requests / s */
    double output_throughput;    /* output tokens / s */
    double total_input_tokens, total_output_tokens; /* over completed requests (vLLM's names) */
    double total_token_throughput; /* (input + output tokens) / s, vLLM's */
    kv_stat ttft_ms, ttft_spec_ms, ttkt_ms, tpot_ms, e2el_ms;
    kv_stat itl_ms;              /* from the run's histogram: percentiles within 0.39% */
    kv_stat transfer_ms;         /* encode end to all KV at the decode node */
    kv_stat anchor_transfer_ms;  /* encode end to anchor at the decode node */
    kv_stat queue_ms;            /* arrival to prefill start */
    double kv_wire_bytes;        /* total over requests */
    double mean_kv_wire_bytes, mean_anchor_bytes, mean_residual_bytes;
    double compression_ratio;    /* bf16 KV bytes / wire bytes */
    double kept_tokens_fraction; /* DiffKV: mean */
    double spec_tokens, accepted_tokens, wasted_tokens;
    double spec_accept_rate;     /* accepted / speculated, NaN when nothing was speculated */
    double kv_mem_peak_bytes;
    int max_decode_batch;
} kv_summary;

/* Sorts a copy of values and fills mean/median/p90/p99 (linear interpolation, as numpy). */
void kv_stat_compute(const double *values, size_t n, kv_stat *out);
/* The same from a histogram (core/base/histogram.h: each order statistic within 0.39% of the exact
   one), values multiplied by scale. Inter-token latencies are summarised this way: their count grows
   with every generated token, the histogram's memory does not. */
void kv_stat_from_histogram(const kv_histogram *h, double scale, kv_stat *out);
/* Summarises a run; bf16_bytes_per_token is 2 * layers * kv_heads * head_dim * 2. */
void kv_summary_compute(const kv_run_result *r, double bf16_bytes_per_token, kv_summary *out);

#endif
