/* curves.c — measured statistics read at a context length: where a length falls, the figures there, the trend beyond. */
#include "core/kv/curves.h"

#include <math.h>
#include <stdio.h>

kv_curve_point kv_curve_locate(const int *lengths, int n_lengths, int tokens)
{
    kv_curve_point p = {0, 0, 0.0, false};
    if (n_lengths <= 0)
        return p;
    if (tokens <= lengths[0])
        return p;
    if (tokens >= lengths[n_lengths - 1]) {
        p.lo = p.hi = n_lengths - 1;
        p.beyond = tokens > lengths[n_lengths - 1];
        return p;
    }
    /* lengths[lo] <= tokens < lengths[lo + 1] */
    int lo = 0, hi = n_lengths - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (lengths[mid] <= tokens)
            lo = mid;
        else
            hi = mid;
    }
    p.lo = lo;
    if (tokens == lengths[lo]) {
        p.hi = lo;
        return p;
    }
    p.hi = hi;
    p.w = (log((double)tokens) - log((double)lengths[lo])) / (log((double)lengths[hi]) - log((double)lengths[lo]));
    return p;
}

double kv_curve_trend_weight(const int *lengths, int n_lengths, int tokens)
{
    if (n_lengths < 2 || tokens <= 0)
        return 1.0;
    double a = log((double)lengths[n_lengths - 2]), b = log((double)lengths[n_lengths - 1]);
    return (log((double)tokens) - a) / (b - a);
}

/* A rate as the figures of two lengths give it at weight w (w = 0: a; w = 1: b). */
static double mix(double a, double b, double w)
{
    return w == 0.0 ? a : (1.0 - w) * a + w * b;
}

double kv_accept_curve_at(const kv_accept_curve *c, int pos, int tokens)
{
    int j = pos < 0 ? 0 : pos < c->positions ? pos : c->positions - 1;
    kv_curve_point p = kv_curve_locate(c->lengths, c->n_lengths, tokens);
    return mix(c->accept[p.lo][j], c->accept[p.hi][j], p.w);
}

double kv_accept_curve_trend(const kv_accept_curve *c, int pos, int tokens)
{
    int j = pos < 0 ? 0 : pos < c->positions ? pos : c->positions - 1;
    int n = c->n_lengths;
    if (n < 2)
        return c->accept[0][j];
    double v = mix(c->accept[n - 2][j], c->accept[n - 1][j], kv_curve_trend_weight(c->lengths, n, tokens));
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

/* Lengths positive and strictly increasing, 1..KV_CURVE_MAX_LENGTHS of them. */
static bool lengths_valid(const char *what, const int *lengths, int n, char *why, int len)
{
    if (n < 1 || n > KV_CURVE_MAX_LENGTHS) {
        snprintf(why, (size_t)len, "%s: %d measured lengths (1..%d)", what, n, KV_CURVE_MAX_LENGTHS);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (lengths[i] < 1) {
            snprintf(why, (size_t)len, "%s: length %d is %d tokens (must be at least 1)", what, i, lengths[i]);
            return false;
        }
        if (i > 0 && lengths[i] <= lengths[i - 1]) {
            snprintf(why, (size_t)len, "%s: lengths must increase strictly, but length %d (%d tokens) follows %d",
                     what, i, lengths[i], lengths[i - 1]);
            return false;
        }
    }
    return true;
}

bool kv_accept_curve_valid(const kv_accept_curve *c, char *why, int len)
{
    if (!c) {
        snprintf(why, (size_t)len, "acceptance curve: none");
        return false;
    }
    if (c->positions < 1 || c->positions > KV_CURVE_MAX_POSITIONS) {
        snprintf(why, (size_t)len, "acceptance curve: %d positions (1..%d)", c->positions, KV_CURVE_MAX_POSITIONS);
        return false;
    }
    if (!lengths_valid("acceptance curve", c->lengths, c->n_lengths, why, len))
        return false;
    for (int i = 0; i < c->n_lengths; i++) {
        for (int j = 0; j < c->positions; j++) {
            double a = c->accept[i][j];
            if (!(a >= 0 && a <= 1)) {
                snprintf(why, (size_t)len,
                         "acceptance curve: acceptance of position %d at %d tokens is %g (must be in [0, 1])", j,
                         c->lengths[i], a);
                return false;
            }
        }
        if (c->samples[i] < 0) {
            snprintf(why, (size_t)len, "acceptance curve: %ld samples at %d tokens", c->samples[i], c->lengths[i]);
            return false;
        }
    }
    return true;
}

/* One head's quantiles: finite and non-decreasing. */
static bool quantiles_valid(const double *q, int length, const char *moment, int row, char *why, int len)
{
    for (int k = 0; k < KV_DIFFKV_TABLE_POINTS; k++) {
        if (!isfinite(q[k]) || (k > 0 && q[k] < q[k - 1])) {
            snprintf(why, (size_t)len,
                     "DiffKV curve: %s quantile %d of row %d at %d tokens is %g (quantiles must be finite and "
                     "non-decreasing)",
                     moment, k, row, length, q[k]);
            return false;
        }
    }
    return true;
}

bool kv_diffkv_curve_valid(const kv_diffkv_curve *c, char *why, int len)
{
    if (!c) {
        snprintf(why, (size_t)len, "DiffKV curve: none");
        return false;
    }
    if (c->window < 0) {
        snprintf(why, (size_t)len, "DiffKV curve: window %d (must be at least 0)", c->window);
        return false;
    }
    if (!lengths_valid("DiffKV curve", c->lengths, c->n_lengths, why, len))
        return false;
    const kv_diffkv_table *t0 = &c->table[0];
    for (int i = 0; i < c->n_lengths; i++) {
        const kv_diffkv_table *t = &c->table[i];
        if (t->layers < 1 || t->kv_heads < 1 || !t->z_prefill || !t->z_exit) {
            snprintf(why, (size_t)len, "DiffKV curve: the table at %d tokens is empty (%d layers, %d KV heads)",
                     c->lengths[i], t->layers, t->kv_heads);
            return false;
        }
        if (t->layers != t0->layers || t->kv_heads != t0->kv_heads) {
            snprintf(why, (size_t)len,
                     "DiffKV curve: the table at %d tokens has %d layers x %d KV heads but the one at %d tokens %d x %d "
                     "(every length needs the same shape)",
                     c->lengths[i], t->layers, t->kv_heads, c->lengths[0], t0->layers, t0->kv_heads);
            return false;
        }
        for (int r = 0; r < t->layers * t->kv_heads; r++)
            if (!quantiles_valid(t->z_prefill + (size_t)r * KV_DIFFKV_TABLE_POINTS, c->lengths[i], "prefill", r, why,
                                 len) ||
                !quantiles_valid(t->z_exit + (size_t)r * KV_DIFFKV_TABLE_POINTS, c->lengths[i], "exit", r, why, len))
                return false;
    }
    return true;
}
