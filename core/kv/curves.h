/* curves.h — measured statistics as functions of context length, as the engine reads them.
 *
 * A real model's Lynx acceptance and DiffKV significance change with the
 * context: attention gets sparser as it grows. Measurements are taken at a few
 * prompt lengths (docs/stats-format.md, core/accuracy/model_stats.h); the
 * engine reads them at each request's own length:
 *   - between two measured lengths, linearly in log(length);
 *   - below the shortest, the shortest's figures;
 *   - beyond the longest, the longest's figures ("held"), and the request is
 *     counted as beyond what was measured (kv_run_result says how many, and
 *     the band: the figures a log-linear trend over the two longest lengths
 *     would give instead).
 * The curves borrow their numbers; the measurement that made them owns them.
 */
#ifndef KV_CURVES_H
#define KV_CURVES_H

#include <stdbool.h>

#include "core/kv/diffkv.h"

#define KV_CURVE_MAX_LENGTHS 16    /* measured prompt lengths per curve */
#define KV_CURVE_MAX_POSITIONS 64  /* speculative positions per acceptance curve */

/* Lynx: one policy's conditional acceptance P(position j accepted | j - 1
   accepted) at each measured prompt length. */
typedef struct kv_accept_curve {
    int positions;                           /* k, 1..KV_CURVE_MAX_POSITIONS */
    int n_lengths;                           /* 1..KV_CURVE_MAX_LENGTHS */
    int lengths[KV_CURVE_MAX_LENGTHS];       /* prompt tokens, strictly increasing */
    double accept[KV_CURVE_MAX_LENGTHS][KV_CURVE_MAX_POSITIONS]; /* [length][position], each in [0, 1] */
    long samples[KV_CURVE_MAX_LENGTHS];      /* speculations behind each length's rates */
} kv_accept_curve;

/* DiffKV: one window's significance tables at each measured length; table[i]
   was measured with N = lengths[i] prompt tokens (its z borrowed). */
typedef struct kv_diffkv_curve {
    int window;                              /* W the tables were measured with */
    int n_lengths;
    int lengths[KV_CURVE_MAX_LENGTHS];       /* strictly increasing */
    kv_diffkv_table table[KV_CURVE_MAX_LENGTHS]; /* same layers and kv_heads in every one */
} kv_diffkv_curve;

/* Where a length falls on a curve's lengths: the figures are
   (1 - w) x figures[lo] + w x figures[hi] (lo == hi, w = 0 at or outside the
   ends); *beyond when tokens exceeds the longest measured length. */
typedef struct kv_curve_point {
    int lo, hi;
    double w;
    bool beyond;
} kv_curve_point;

kv_curve_point kv_curve_locate(const int *lengths, int n_lengths, int tokens);
/* The band beyond the longest length: the weight w of the log-linear trend
   over the two longest lengths, figures = (1 - w) x figures[n - 2] +
   w x figures[n - 1] (w > 1 beyond the longest; 1 when n_lengths < 2: the
   longest's figures). */
double kv_curve_trend_weight(const int *lengths, int n_lengths, int tokens);

/* Conditional acceptance of 0-based position pos (the last measured position
   for pos >= positions) at a prompt of `tokens` tokens. */
double kv_accept_curve_at(const kv_accept_curve *c, int pos, int tokens);
/* The same on the trend of the two longest lengths (kv_curve_trend_weight),
   clamped to [0, 1]: the band's figure for a request beyond them. */
double kv_accept_curve_trend(const kv_accept_curve *c, int pos, int tokens);

/* Checks a curve's invariants (lengths increasing and positive, rates in
   [0, 1], tables of one shape); false and a message in why[len] otherwise. */
bool kv_accept_curve_valid(const kv_accept_curve *c, char *why, int len);
bool kv_diffkv_curve_valid(const kv_diffkv_curve *c, char *why, int len);

#endif
