/* feed_lynx.h — Lynx acceptance per speculative position, measured on the reference model and cached on disk.
 *
 * `lynx.from: reference-model` (the default) replaces the scenario's fixed
 * lynx.acceptance of every speculative policy by what its own encodings do on
 * SmolLM2-135M (or accuracy.model): greedy speculation of k tokens on
 * anchor-only KV, verified on merged KV (core/accuracy/eval.c). So a thinner
 * anchor (2 + 6) measures a lower acceptance than a thicker one (4 + 4).
 *
 * The samples: the acceptance is a curve of the prompt length
 * (core/kv/curves.h). It is measured at up to 4 lengths that span the
 * workload's prompt lengths: n = lynx.samples / 4 (1..4) quantiles evenly
 * spaced from its shortest to its longest prompt (the median when n = 1),
 * clamped to lynx.max_prompt_tokens (the reference model is small
 * and slow on a CPU: about 1 s per 512 prefilled tokens) and to the model's
 * context; lynx.samples speculations are shared among the lengths (at least 4
 * each, a multiple of the FEED_TEXTS licence texts). At length L a text gives
 * its samples at prefixes L, L - L/8/P, ... (P per text, spread over the
 * eighth below L, so that no two samples of one text share a prefix). A text
 * shorter than the longest length continues with the next texts of the list,
 * in order (kv_eval_config.join_texts). One prefill per text serves every
 * length and every policy (the prefill of a prefix is the prefix of the
 * prefill). `kvsim measure` (kv_feed_lynx_curves) measures the same way at
 * the lengths it is given.
 *
 * Caching (core/accuracy/feedcache.h): each policy's figures are stored under a
 * key naming the model file (path, size, mtime), the texts, KV_FEED_LYNX_VERSION,
 * the policy's encodings of every (layer, KV head) — the bit split among them —,
 * k, the curve's lengths and the samples per length. A hit loads no model weights and
 * gives the same bytes as the measurement it stored; a sweep measures once.
 * Concurrent kvsim processes measure one at a time (a lock file in the cache
 * folder), so the second finds the first one's figures.
 */
#ifndef KV_FEED_LYNX_H
#define KV_FEED_LYNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/policy/policy.h"
#include "core/config/scenario.h"
#include "core/accuracy/eval.h"
#include "core/kv/curves.h"

/* Bump whenever the measurement changes (texts, sampling, eval.c's speculation):
   cached figures of another version are then measured again. */
#define KV_FEED_LYNX_VERSION 3 /* 3: a curve of the prompt length, texts joined when short; 2: row-independent forward */
#define KV_FEED_MAX_POSITIONS 64 /* speculative positions measured at most */

typedef struct kv_feed_acceptance {
    int positions;        /* speculative positions measured; 0: not measured (no speculation or no anchor split) */
    double accept_conditional[KV_FEED_MAX_POSITIONS]; /* P(position j accepted | j-1 accepted), [positions] */
    long speculations;    /* speculation samples behind the rates */
    kv_accept_curve curve; /* the same speculations per measured prompt length (accept_conditional pools them) */
    int prompt_tokens;    /* the longest prompt length measured (curve.lengths' last) */
    bool cached;          /* read from the feed cache instead of measured in this run */
    char source[512];     /* results.json's acceptance_source: model, samples, lengths, clamping */
} kv_feed_acceptance;

/* For every policy among policies[0..n) that speculates (k > 0) on an anchor
   split, fills out[i] from the cache or measures it (all misses in one model
   run); out[i].positions = 0 for the others. prompt_tokens[0..n_prompts) are
   the workload's prompt lengths (any order). One line per policy on log
   (NULL: quiet) says whether it was measured or found in the cache.
   KV_EINPUT when the reference model is not fetched (the message says how to
   fetch it and how to opt out with lynx.from: scenario) or is not a model. */
int kv_feed_acceptance_measure(const kv_scenario *s, kv_policy *const *policies, size_t n, const int *prompt_tokens,
                               size_t n_prompts, FILE *log, kv_feed_acceptance *out, kv_error *err);

/* The measured texts (the licence texts Debian ships, in the order they are used and joined). */
int kv_feed_lynx_texts(const char *const **texts);

/* kvsim measure's Lynx measurement: for each of pols[0..n) (encodings of
   every (layer, KV head) of the model at model_path, layer-major; k =
   pols[i].speculate, 1..KV_FEED_MAX_POSITIONS), its acceptance curve at
   lengths[0..n_lengths) (strictly increasing, each + k + 1 within the model's
   context; at most KV_CURVE_MAX_LENGTHS), with `samples` speculations per
   length (rounded up to a multiple of the texts, at most 64 per text and
   length) spread as in the header comment. From the feed cache when it has
   them (cached[i], may be NULL); the misses in one model run. log: one line
   per policy (NULL: quiet). KV_EINPUT for lengths out of range, KV_EFAIL when
   a policy could not be measured. */
int kv_feed_lynx_curves(const char *model_path, const kv_eval_policy *pols, int n, const int *lengths, int n_lengths,
                        int samples, FILE *log, kv_accept_curve *out, bool *cached, kv_error *err);

#endif
