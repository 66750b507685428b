/* metrics.c — percentiles and per-policy summaries. */
#include "core/report/metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[n] ascending into exactly what qsort with cmp_double gives: -0 and NaN
   (whose order qsort leaves to its algorithm) go through qsort; otherwise equal
   keys are equal bit patterns, so the ascending order is unique and an LSD radix
   sort over the 64-bit order-preserving keys (8 passes of 8 bits, passes where
   every key has the same byte skipped) finds it in O(n). */
static void sort_doubles(double *v, size_t n)
{
    if (n < 256) {
        qsort(v, n, sizeof *v, cmp_double);
        return;
    }
    uint64_t *key = kv_malloc(n * sizeof *key);
    size_t (*count)[256] = kv_calloc(8, sizeof *count);
    for (size_t i = 0; i < n; i++) {
        uint64_t b;
        memcpy(&b, &v[i], sizeof b);
        if (isnan(v[i]) || b == 0x8000000000000000ULL) {
            kv_free(count);
            kv_free(key);
            qsort(v, n, sizeof *v, cmp_double);
            return;
        }
        b = (b >> 63) ? ~b : b | 0x8000000000000000ULL;
        key[i] = b;
        for (int d = 0; d < 8; d++)
            count[d][(b >> (8 * d)) & 0xff]++;
    }
    uint64_t *tmp = kv_malloc(n * sizeof *tmp);
    for (int d = 0; d < 8; d++) {
        if (count[d][(key[0] >> (8 * d)) & 0xff] == n)
            continue; /* every key has this byte */
        size_t pos = 0;
        for (int b = 0; b < 256; b++) {
            size_t c = count[d][b];
            count[d][b] = pos;
            pos += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[d][(key[i] >> (8 * d)) & 0xff]++] = key[i];
        uint64_t *t = key;
        key = tmp;
        tmp = t;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t b = key[i];
        b = (b >> 63) ? b & ~0x8000000000000000ULL : ~b;
        memcpy(&v[i], &b, sizeof b);
    }
    kv_free(tmp);
    kv_free(key);
    kv_free(count);
}

static double percentile(const double *sorted, size_t n, double p)
{
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

void kv_stat_compute(const double *values, size_t n, kv_stat *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0) {
        out->mean = out->std = out->median = out->p90 = out->p99 = NAN;
        return;
    }
    double *v = kv_malloc(n * sizeof *v);
    memcpy(v, values, n * sizeof *v);
    sort_doubles(v, n);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    out->mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (v[i] - out->mean) * (v[i] - out->mean);
    out->std = sqrt(ss / (double)n);
    out->median = percentile(v, n, 50);
    out->p90 = percentile(v, n, 90);
    out->p99 = percentile(v, n, 99);
    kv_free(v);
}

void kv_stat_from_histogram(const kv_histogram *h, double scale, kv_stat *out)
{
    memset(out, 0, sizeof *out);
    out->n = (size_t)h->n;
    if (h->n == 0) {
        out->mean = out->std = out->median = out->p90 = out->p99 = NAN;
        return;
    }
    out->mean = kv_histogram_mean(h) * scale;
    out->std = kv_histogram_std(h) * scale;
    out->median = kv_histogram_percentile(h, 50) * scale;
    out->p90 = kv_histogram_percentile(h, 90) * scale;
    out->p99 = kv_histogram_percentile(h, 99) * scale;
}

/* Collects one value per request where `ok`, in milliseconds. */
typedef struct collector {
    double *v;
    size_t n;
} collector;

static void collect(collector *c, int ok, double seconds)
{
    if (ok)
        c->v[c->n++] = seconds * 1e3;
}

void kv_summary_compute(const kv_run_result *r, double bf16_bytes_per_token, kv_summary *out)
{
    memset(out, 0, sizeof *out);
    size_t n = r->n_requests;
    collector ttft = {kv_calloc(n + 1, sizeof(double)), 0}, spec = {kv_calloc(n + 1, sizeof(double)), 0},
              kth = {kv_calloc(n + 1, sizeof(double)), 0}, tpot = {kv_calloc(n + 1, sizeof(double)), 0},
              e2el = {kv_calloc(n + 1, sizeof(double)), 0}, xfer = {kv_calloc(n + 1, sizeof(double)), 0},
              axfer = {kv_calloc(n + 1, sizeof(double)), 0}, queue = {kv_calloc(n + 1, sizeof(double)), 0};
    double first_arrival = INFINITY, last_done = 0, out_tokens = 0, bf16 = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        const kv_request_result *q = &r->requests[i];
        if (q->done_s < 0)
            continue;
        out->completed++;
        first_arrival = fmin(first_arrival, q->arrival_s);
        last_done = fmax(last_done, q->done_s);
        out_tokens += q->output_tokens;
        out->total_input_tokens += q->prompt_tokens;
        collect(&ttft, 1, q->first_token_s - q->arrival_s);
        collect(&spec, q->first_spec_s >= 0, q->first_spec_s - q->arrival_s);
        collect(&kth, q->kth_token_s >= 0, q->kth_token_s - q->arrival_s);
        collect(&tpot, q->output_tokens > 1, (q->done_s - q->first_token_s) / (q->output_tokens - 1));
        collect(&e2el, 1, q->done_s - q->arrival_s);
        collect(&xfer, q->kv_arrived_s >= 0 && q->encode_end_s >= 0, q->kv_arrived_s - q->encode_end_s);
        collect(&axfer, q->anchor_arrived_s >= 0 && q->encode_end_s >= 0, q->anchor_arrived_s - q->encode_end_s);
        collect(&queue, q->prefill_start_s >= 0, q->prefill_start_s - q->arrival_s);
        out->kv_wire_bytes += q->anchor_bytes + q->residual_bytes;
        out->mean_anchor_bytes += q->anchor_bytes;
        out->mean_residual_bytes += q->residual_bytes;
        out->spec_tokens += q->spec_tokens;
        out->accepted_tokens += q->accepted_tokens;
        bf16 += bf16_bytes_per_token * q->prompt_tokens;
        kept += q->kept_tokens_fraction;
    }
    kv_stat_compute(ttft.v, ttft.n, &out->ttft_ms);
    kv_stat_compute(spec.v, spec.n, &out->ttft_spec_ms);
    kv_stat_compute(kth.v, kth.n, &out->ttkt_ms);
    kv_stat_compute(tpot.v, tpot.n, &out->tpot_ms);
    kv_stat_compute(e2el.v, e2el.n, &out->e2el_ms);
    kv_stat_compute(xfer.v, xfer.n, &out->transfer_ms);
    kv_stat_compute(axfer.v, axfer.n, &out->anchor_transfer_ms);
    kv_stat_compute(queue.v, queue.n, &out->queue_ms);
    kv_stat_from_histogram(&r->itl_s, 1e3, &out->itl_ms);
    collector *all[] = {&ttft, &spec, &kth, &tpot, &e2el, &xfer, &axfer, &queue};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kv_free(all[i]->v);
    size_t c = out->completed;
    out->duration_s = c ? last_done - first_arrival : 0;
    out->request_throughput = out->duration_s > 0 ? (double)c / out->duration_s : NAN;
    out->output_throughput = out->duration_s > 0 ? out_tokens / out->duration_s : NAN;
    out->total_output_tokens = out_tokens;
    out->total_token_throughput = out->duration_s > 0 ? (out->total_input_tokens + out_tokens) / out->duration_s : NAN;
    out->mean_kv_wire_bytes = c ? out->kv_wire_bytes / (double)c : 0;
    out->mean_anchor_bytes = c ? out->mean_anchor_bytes / (double)c : 0;
    out->mean_residual_bytes = c ? out->mean_residual_bytes / (double)c : 0;
    out->compression_ratio = out->kv_wire_bytes > 0 ? bf16 / out->kv_wire_bytes : NAN;
    out->kept_tokens_fraction = c ? kept / (double)c : NAN;
    out->wasted_tokens = out->spec_tokens - out->accepted_tokens;
    out->spec_accept_rate = out->spec_tokens > 0 ? out->accepted_tokens / out->spec_tokens : NAN;
    out->kv_mem_peak_bytes = r->kv_mem_peak_bytes;
    out->max_decode_batch = r->max_decode_batch;
}
