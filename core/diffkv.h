/* diffkv.h — DiffKV's tiers: which tokens of each (layer, KV head) stay high (K8V4), go low (K4V2) or are pruned.
 *
 * Two implementations of the same rule (DESIGN.md, "DiffKV tiers"):
 *
 *  1. The exact process over real attention probabilities, one KV head at a
 *     time (kv_diffkv_prefill_tiers, kv_diffkv_head_*). It keeps a running sum
 *     and a query count per stored token, exactly as DiffKV's kernels keep
 *     them in the page, and is what the hand-worked tests and the reference
 *     model feed with the attention kernel's score output. Cost per decode
 *     step: O(stored tokens) per head.
 *
 *  2. The sequence process the engine runs for every request
 *     (kv_diffkv_seq_*), per (layer, KV head) counts only, cheap enough for
 *     batches of hundreds of sequences x hundreds of heads per step. It needs
 *     a model of the significance distribution (kv_diffkv_score_model): each
 *     token's normalised significance z = L x mean probability is stationary
 *     ("persistence of importance") and, for the lognormal model, ln z ~
 *     N(-s^2/2, s) with E[z] = 1, where s varies per head. Under that model
 *     the exact rule reduces to one decision per head per step: the token
 *     leaving the recent window is the minimum-significance candidate (every
 *     older token already passed its thresholds), so it stays high when z >=
 *     alpha_high, is demoted when alpha_low <= z < alpha_high, and is pruned
 *     below alpha_low. tests/test_diffkv.c checks that the exact process fed
 *     with such attention reaches the same tier fractions.
 *
 * The decode rule of the exact process is DiffKV's kernel rule
 * (compress_and_append_cache_decode_phase): the new token is stored high;
 * among the tokens outside the recent window let h be the high token with the
 * lowest mean and l the low one (ties: earlier position); with L the context
 * length after the new token, thresholds t_l = alpha_low / L and t_h =
 * alpha_high / L (fp32):
 *   - mean(h) < t_l and mean(h) < mean(l):  h is pruned;
 *   - else mean(h) < t_h:                   h is demoted to low, and if also
 *                                           mean(l) < t_l, l is pruned (the
 *                                           demoted token takes its slot);
 *   - else nothing changes.
 * So per head and step at most one token leaves the high tier and at most one
 * token is pruned; stored tokens per tier never shrink in decode (a pruned
 * token's slot is reused by the new or the demoted token).
 *
 * Significance (both phases) = running sum of the probabilities a token
 * received / the number of queries summed, where the sum is the attention
 * kernel's score output (sum over queries, then max over the GQA group).
 * Prefill sums the last KV_DIFFKV_PREFILL_QUERIES queries, so token i of T
 * has min(T - i, 64) of them. The W most recent tokens always stay high.
 * All comparisons are fp32, as on the device.
 */
#ifndef KV_DIFFKV_H
#define KV_DIFFKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define KV_DIFFKV_PREFILL_QUERIES 64 /* prefill scores come from the last 64 queries */

typedef enum kv_tier {
    KV_TIER_HIGH = 0,   /* K8V4 by default */
    KV_TIER_LOW = 1,    /* K4V2 by default */
    KV_TIER_PRUNED = 2, /* not stored, not sent */
} kv_tier;

/* ---- 1. The exact process (one KV head) --------------------------------------------------- */

/* Prefill tiers of `tokens` tokens. score_sum[i]: probability token i received,
   summed over the last `scored_queries` queries (positions tokens-scored_queries
   .. tokens-1, causal) and maximised over the GQA group, i.e. the attention
   kernel's `scores` output. Writes a kv_tier per token into tiers[tokens]. */
void kv_diffkv_prefill_tiers(const float *score_sum, int tokens, int scored_queries, float alpha_high,
                             float alpha_low, int window, uint8_t *tiers);

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
   score sum and query count min(tokens - i, scored_queries). */
void kv_diffkv_head_prefill(kv_diffkv_head *h, const float *score_sum, int tokens, int scored_queries);
/* One decode step. probs[kv_diffkv_head_stored(h) + 1]: the probability the
   new query gives each stored token in position order, then itself (for a GQA
   group: the maximum over its query heads). */
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
} kv_diffkv_scores;

/* Where significance comes from when no real attention is run. */
typedef struct kv_diffkv_score_model {
    kv_diffkv_scores kind;
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
} kv_diffkv_head_params;

/* The probabilities that a token leaving the window is kept high, demoted,
   pruned, for one head (they sum to 1). */
void kv_diffkv_tier_probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, double *high,
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
/* Classifies a prefill of `tokens` tokens (replaces the state). */
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
