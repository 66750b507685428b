/* histogram.h — a log-scale histogram of non-negative values: bounded memory, quantiles within 0.4%.
 *
 * A value v > 0 falls in the bin of its binary exponent and the top KV_HIST_SUB_BITS bits of its
 * mantissa, so a bin spans [a, a (1 + 2^-8)) and any value in it is within 2^-8 (0.39%) of any other.
 * Each bin keeps its count and the sum of its values; a bin's representative is the mean of its
 * values, so an order statistic read from the histogram is within 0.39% (relative) of the exact one,
 * and exact where a bin holds one distinct value. 0 has a bin of its own (exact). Memory: one row of
 * 256 bins (4 KiB) per binary exponent seen, whatever the number of values.
 *
 * Ownership: the histogram owns its rows; kv_histogram_free releases them. Zero-initialise to start.
 */
#ifndef KV_HISTOGRAM_H
#define KV_HISTOGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/stream.h"

#define KV_HIST_SUB_BITS 8
#define KV_HIST_SUBS (1 << KV_HIST_SUB_BITS)
#define KV_HIST_EXPONENTS 2048 /* of a double */

typedef struct kv_hist_row {
    uint64_t n;                  /* values in the row */
    uint64_t count[KV_HIST_SUBS];
    double sum[KV_HIST_SUBS];
} kv_hist_row;

typedef struct kv_histogram {
    kv_hist_row **rows; /* [KV_HIST_EXPONENTS], allocated at the first value; a row at its first value */
    uint64_t n;         /* values counted */
    uint64_t n_invalid; /* values left out: negative, NaN or infinite */
} kv_histogram;

/* Counts v (finite, >= 0; anything else only increments n_invalid). */
void kv_histogram_add(kv_histogram *h, double v);
/* The mean of the values (sums taken per bin, in bin order); NaN when empty. */
double kv_histogram_mean(const kv_histogram *h);
/* The standard deviation of the values (population, numpy's np.std), each value taken as its bin's
   mean (so within 0.39% of it); NaN when empty. */
double kv_histogram_std(const kv_histogram *h);
/* Percentile p in [0, 100], linear interpolation between order statistics as numpy's default, each
   order statistic its bin's mean; NaN when empty. */
double kv_histogram_percentile(const kv_histogram *h, double p);
void kv_histogram_free(kv_histogram *h); /* leaves it empty and reusable */
/* Writes h to a stream / reads one written so into an empty h (from another process, bit for bit).
   0, or -1 when the stream failed or holds no histogram (h is then left empty). */
int kv_histogram_save(const kv_histogram *h, kv_stream *out);
int kv_histogram_load(kv_histogram *h, kv_stream *in);

#endif
