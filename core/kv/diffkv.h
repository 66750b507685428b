/* diffkv.h — DiffKV's tiers: which tokens of each (layer, KV head) stay high (K8V4), go low (K4V2) or are pruned.
 *
 * ONE rule (the paper's, arXiv 2412.03131 Section 4 / Algorithm 1), used by
 * the engine and by the reference model's KV store (core/refmodel/kvstore.c):
 *
 *   significance(token i at context length N) = mean probability token i
 *     received from every query at positions >= i (in prefill: every later
 *     query of the prompt, its own included: N - i of them; in decode each new
 *     query adds to the running sum), where a query's probability is the
 *     maximum over the query heads of the token's GQA group;
 *   tier = high if significance >= alpha_high / N, low if >= alpha_low / N,
 *     pruned below (kv_diffkv_classify, fp32 as on the device);
 *   the W most recent tokens stay high; a token is decided once, when it
 *     leaves the window (prefill: every token outside it; decode: the one
 *     token that leaves it each step), and its tier is then final.
 *
 * Equivalently in normalised form z = N x significance (the probabilities of
 * a query sum to 1, so z averages 1): high if z >= alpha_high, low if
 * alpha_low <= z < alpha_high, pruned below alpha_low (kv_diffkv_classify_z).
 *
 * Two processes apply it:
 *
 *  1. The exact process over real attention probabilities, one KV head at a
 *     time (kv_diffkv_prefill_tiers, kv_diffkv_head_*): per-token running sums
 *     and query counts, as DiffKV's kernels keep them in the page. The
 *     hand-worked tests feed it; the reference model's store calls the same
 *     kv_diffkv_classify on its own sums.
 *
 *  2. The sequence process the engine runs for every request
 *     (kv_diffkv_seq_*), per (layer, KV head) counts only, cheap enough for
 *     batches of hundreds of sequences x hundreds of heads per step. It draws
 *     each token's z from a significance distribution
 *     (kv_diffkv_score_model) and classifies it with the same rule: a draw u
 *     gives z = F^-1(u), and z >= alpha <=> u >= F(alpha), so the per-head
 *     thresholds F(alpha_low), F(alpha_high) decide every token without
 *     computing z. The distributions:
 *       - measured (the default): per (layer, KV head) quantile tables of z
 *         measured on the reference model's prefill attention over real text
 *         (core/accuracy/diffkv_scores.h), a head of the simulated model reading
 *         the table of the reference head at the same relative depth;
 *       - lognormal: ln z ~ N(-s_h^2/2, s_h), E[z] = 1, s_h varying per head;
 *       - fixed: each token high / low / pruned with fixed probabilities
 *         (the policy's alphas are then ignored).
 *
 * DiffKV's released decode kernel (compress_and_append_cache_decode_phase)
 * differs: it re-examines the lowest-significance high token every step
 * rather than the token leaving the window. kvsim follows the paper's
 * Algorithm 1 (docs/design-notes.md).
 */
#ifndef KV_DIFFKV_H
#define KV_DIFFKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"

typedef enum kv_tier {
    KV_TIER_HIGH = 0,   /* K8V4 by default */
    KV_TIER_LOW = 1,    /* K4V2 by default */
    KV_TIER_PRUNED = 2, /* not stored, not sent */
} kv_tier;

/* ---- The rule ---------------------------------------------------------------------------------- */

/* The tier of a token that received probabilities summing to `sum` from
   `queries` queries (queries <= 0: significance 0) at context length
   `context` (>= 1): mean = sum / queries against alpha / context, in fp32. */
kv_tier kv_diffkv_classify(float sum, float queries, int64_t context, float alpha_high, float alpha_low);
/* The same rule on z = context x significance. */
kv_tier kv_diffkv_classify_z(double z, double alpha_high, double alpha_low);

/* ---- 1. The exact process (one KV head) --------------------------------------------------- */

/* Prefill tiers of `tokens` tokens. score_sum[i]: probability token i received,
   summed over every query at positions i .. tokens-1 (causal: tokens - i of
   them) and maximised over the GQA group, i.e. the attention kernel's
   `scores` output. Writes a kv_tier per token into tiers[tokens]. */
void kv_diffkv_prefill_tiers(const float *score_sum, int tokens, float alpha_high, float alpha_low, int window,
                             uint8_t *tiers);

typedef struct kv_diffkv_head kv_diffkv_head;

/* What one decode step changed; -1 where nothing. */
typedef struct kv_diffkv_change {
    int64_t demoted;      /* position of the token moved high -> low */
    int64_t pruned;       /* position of the token dropped (high or low) */
    int pruned_tier;      /* kv_tier it was dropped from (when pruned >= 0) */
} kv_diffkv_change;

/* A head with no tokens. Thresholds >= 0, alpha_low <= alpha_high, window >= 0.
   Returns NULL (with err) on bad arguments. Owned by the caller. */
kv_diffkv_head *kv_diffkv_head_create(float alpha_high, float alpha_low, int window, kv_error *err);
void kv_diffkv_head_destroy(kv_diffkv_head *h); /* NULL is fine */
/* Replaces the head's state by the prefill of `tokens` tokens (see
   kv_diffkv_prefill_tiers); pruned tokens are dropped, the others keep their
   score sum and query count tokens - i. */
void kv_diffkv_head_prefill(kv_diffkv_head *h, const float *score_sum, int tokens);
/* One decode step. probs[kv_diffkv_head_stored(h) + 1]: the probability the
   new query gives each stored token in position order, then itself (for a GQA
   group: the maximum over its query heads). The new token enters high; the
   token leaving the window (position L-1-W, L the context after the step) is
   classified by its running mean at L and kept, demoted or pruned. */
void kv_diffkv_head_step(kv_diffkv_head *h, const float *probs, kv_diffkv_change *out);
int kv_diffkv_head_stored(const kv_diffkv_head *h);  /* tokens stored (high + low) */
int kv_diffkv_head_context(const kv_diffkv_head *h); /* context length L (stored + pruned) */
int kv_diffkv_head_count(const kv_diffkv_head *h, kv_tier tier);
/* Stored token i (position order): its position, tier, running sum and query count. */
void kv_diffkv_head_token(const kv_diffkv_head *h, int i, int64_t *position, kv_tier *tier, float *sum,
                          uint32_t *queries);

/* ---- 2. The sequence process (counts per head, for the engine) ----------------------------- */

typedef enum kv_diffkv_scores {
    KV_DIFFKV_SCORES_LOGNORMAL = 0, /* ln z ~ N(-s_h^2/2, s_h): the policy's alphas decide the tiers */
    KV_DIFFKV_SCORES_FIXED = 1,     /* each token high / low / pruned with fixed probabilities */
    KV_DIFFKV_SCORES_MEASURED = 2,  /* z from quantile tables measured on the reference model */
} kv_diffkv_scores;

#define KV_DIFFKV_TABLE_POINTS 129 /* quantiles of z per head: u = 0, 1/128, ..., 1 */

/* Measured significance: for each (layer, KV head) of the measured model, the
   quantiles of z at the two moments the rule decides a token:
     - z_prefill: at the end of a prefill of N tokens, z = N x mean over the
       N - i queries at positions >= i, for the tokens outside the window;
     - z_exit: when the token leaves the window in decode, z = L x mean over
       the W + 1 queries it has received (its own and the W after it), with
       L = i + W + 1 the context at that step. */
typedef struct kv_diffkv_table {
    int layers, kv_heads;    /* the measured (reference) model's */
    const double *z_prefill; /* [layers * kv_heads][KV_DIFFKV_TABLE_POINTS], increasing per head (borrowed) */
    const double *z_exit;    /* likewise, at window exit */
} kv_diffkv_table;

/* P(z < x) for one head's quantile table q[KV_DIFFKV_TABLE_POINTS] (the
   empirical distribution, linear between quantiles). */
double kv_diffkv_table_cdf(const double *q, double x);
/* The table row (reference head) a head of a model with `layers` layers and
   `kv_heads` KV heads reads: the same relative depth and head position. */
int kv_diffkv_table_row(const kv_diffkv_table *t, int layer, int layers, int kv_head, int kv_heads);

struct kv_diffkv_curve; /* core/kv/curves.h */

/* Where significance comes from when no real attention is run. */
typedef struct kv_diffkv_score_model {
    kv_diffkv_scores kind;
    kv_diffkv_table table; /* measured (at the longest measured length when `curve` is set) */
    const struct kv_diffkv_curve *curve; /* measured at two or more lengths: the tables by length, read at
                                      each sequence's own length (borrowed; NULL: `table` at every length) */
    double sigma;         /* lognormal: s of a typical head (sd of ln z) */
    double head_spread;   /* lognormal: sd of ln(s_h / sigma) across (layer, KV head) */
    double high_fraction; /* fixed: share of tokens leaving the window that stay high */
    double low_fraction;  /* fixed: share demoted; the rest is pruned */
} kv_diffkv_score_model;

/* One head's parameters, from the policy's encoding. */
typedef struct kv_diffkv_head_params {
    double alpha_high, alpha_low; /* thresholds are alpha / L */
    int window;                   /* W */
    double head_factor;           /* s_h = sigma * head_factor (lognormal) */
    int table_row;                /* measured: the head's row of the table (kv_diffkv_table_row) */
} kv_diffkv_head_params;

/* The probabilities that a token leaving the window in decode is kept high,
   demoted, pruned, for one head (they sum to 1). */
void kv_diffkv_tier_probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, double *high,
                                  double *low, double *pruned);
/* Likewise for a prompt token outside the window at the end of a prefill
   (differs from decode only for the measured model: z_prefill). */
void kv_diffkv_prefill_probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, double *high,
                                     double *low, double *pruned);

/* The head factors of a model: exp(head_spread * g) with g ~ N(0, 1) drawn
   per (layer, KV head) from `seed` (a head's character is the same for every
   request). Writes heads values. */
void kv_diffkv_head_factors(const kv_diffkv_score_model *m, uint64_t seed, int heads, double *factors);

typedef struct kv_diffkv_seq kv_diffkv_seq;

/* A sequence with `heads` (layer, KV head) pairs, empty. Each token's fate is
   a function of (seed, head, position), so a sequence that is recomputed
   after preemption gets the same tiers. Owned by the caller. */
kv_diffkv_seq *kv_diffkv_seq_create(const kv_diffkv_score_model *m, const kv_diffkv_head_params *params, int heads,
                                    uint64_t seed);
void kv_diffkv_seq_destroy(kv_diffkv_seq *s); /* NULL is fine */
/* Classifies a prefill of `tokens` tokens (replaces the state) with the
   prefill probabilities. */
void kv_diffkv_seq_prefill(kv_diffkv_seq *s, int tokens);
/* One decode token appended: per head the token leaving the window is kept,
   demoted or pruned (see the file comment). */
void kv_diffkv_seq_step(kv_diffkv_seq *s);
int kv_diffkv_seq_heads(const kv_diffkv_seq *s);
int64_t kv_diffkv_seq_tokens(const kv_diffkv_seq *s);       /* context length L */
const uint32_t *kv_diffkv_seq_high(const kv_diffkv_seq *s); /* [heads] tokens stored high */
const uint32_t *kv_diffkv_seq_low(const kv_diffkv_seq *s);  /* [heads] tokens stored low */
/* Sums over heads. */
void kv_diffkv_seq_totals(const kv_diffkv_seq *s, uint64_t *high, uint64_t *low, uint64_t *pruned);

#endif
