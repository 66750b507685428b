/* histogram.c — log-scale histogram with per-bin sums: bounded-memory mean and percentiles. */
#include "core/base/histogram.h"

#include <math.h>
#include <string.h>

#include "core/base/alloc.h"

/* Row (binary exponent) and bin of a finite v >= 0; -0 is 0. */
static void locate(double v, size_t *row, size_t *sub)
{
    uint64_t b;
    if (v == 0)
        v = 0; /* -0 -> +0 */
    memcpy(&b, &v, sizeof b);
    *row = (size_t)(b >> 52) & (KV_HIST_EXPONENTS - 1);
    *sub = (size_t)(b >> (52 - KV_HIST_SUB_BITS)) & (KV_HIST_SUBS - 1);
}

void kv_histogram_add(kv_histogram *h, double v)
{
    if (!(v >= 0) || isinf(v)) {
        h->n_invalid++;
        return;
    }
    if (!h->rows)
        h->rows = kv_calloc(KV_HIST_EXPONENTS, sizeof *h->rows);
    size_t r, s;
    locate(v, &r, &s);
    kv_hist_row *row = h->rows[r];
    if (!row)
        row = h->rows[r] = kv_calloc(1, sizeof *row);
    row->n++;
    row->count[s]++;
    row->sum[s] += v;
    h->n++;
}

double kv_histogram_mean(const kv_histogram *h)
{
    if (h->n == 0)
        return NAN;
    double sum = 0;
    for (size_t r = 0; r < KV_HIST_EXPONENTS; r++)
        if (h->rows[r])
            for (size_t s = 0; s < KV_HIST_SUBS; s++)
                sum += h->rows[r]->sum[s];
    return sum / (double)h->n;
}

double kv_histogram_std(const kv_histogram *h)
{
    if (h->n == 0)
        return NAN;
    double mean = kv_histogram_mean(h), ss = 0;
    for (size_t r = 0; r < KV_HIST_EXPONENTS; r++) {
        const kv_hist_row *row = h->rows[r];
        for (size_t s = 0; row && s < KV_HIST_SUBS; s++) {
            if (row->count[s] == 0)
                continue;
            double d = row->sum[s] / (double)row->count[s] - mean;
            ss += (double)row->count[s] * d * d;
        }
    }
    return sqrt(ss / (double)h->n);
}

/* The k-th smallest value (0-based, k < n), as its bin's mean. */
static double order_stat(const kv_histogram *h, uint64_t k)
{
    for (size_t r = 0; r < KV_HIST_EXPONENTS; r++) {
        const kv_hist_row *row = h->rows[r];
        if (!row)
            continue;
        if (k >= row->n) {
            k -= row->n;
            continue;
        }
        for (size_t s = 0; s < KV_HIST_SUBS; s++) {
            if (k < row->count[s])
                return row->sum[s] / (double)row->count[s];
            k -= row->count[s];
        }
    }
    return NAN; /* not reached: the rows' counts add up to n */
}

double kv_histogram_percentile(const kv_histogram *h, double p)
{
    if (h->n == 0)
        return NAN;
    double pos = p / 100.0 * (double)(h->n - 1);
    uint64_t lo = (uint64_t)floor(pos);
    uint64_t hi = lo + 1 < h->n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    double a = order_stat(h, lo), b = hi == lo ? a : order_stat(h, hi);
    return a + (b - a) * frac;
}

void kv_histogram_free(kv_histogram *h)
{
    if (h->rows)
        for (size_t r = 0; r < KV_HIST_EXPONENTS; r++)
            kv_free(h->rows[r]);
    kv_free(h->rows);
    memset(h, 0, sizeof *h);
}

int kv_histogram_save(const kv_histogram *h, kv_stream *out)
{
    kv_stream_put(out, &h->n, sizeof h->n);
    kv_stream_put(out, &h->n_invalid, sizeof h->n_invalid);
    for (uint32_t r = 0; h->rows && r < KV_HIST_EXPONENTS; r++) {
        if (!h->rows[r])
            continue;
        kv_stream_put(out, &r, sizeof r);
        kv_stream_put(out, h->rows[r], sizeof *h->rows[r]);
    }
    uint32_t end = UINT32_MAX;
    kv_stream_put(out, &end, sizeof end);
    return out->failed ? -1 : 0;
}

int kv_histogram_load(kv_histogram *h, kv_stream *in)
{
    memset(h, 0, sizeof *h);
    if (kv_stream_get(in, &h->n, sizeof h->n) != 0 || kv_stream_get(in, &h->n_invalid, sizeof h->n_invalid) != 0)
        goto fail;
    for (;;) {
        uint32_t r;
        if (kv_stream_get(in, &r, sizeof r) != 0)
            goto fail;
        if (r == UINT32_MAX)
            return 0;
        if (r >= KV_HIST_EXPONENTS || (h->rows && h->rows[r]))
            goto fail;
        if (!h->rows)
            h->rows = kv_calloc(KV_HIST_EXPONENTS, sizeof *h->rows);
        h->rows[r] = kv_malloc(sizeof *h->rows[r]);
        if (kv_stream_get(in, h->rows[r], sizeof *h->rows[r]) != 0)
            goto fail;
    }
fail:
    kv_histogram_free(h);
    return -1;
}
