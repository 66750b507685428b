/* feed_lynx.h — Lynx acceptance per speculative position, measured on the reference model and cached on disk.
 *
 * `lynx.from: reference-model` (the default) replaces the scenario's fixed
 * lynx.acceptance of every speculative policy by what its own encodings do on
 * SmolLM2-135M (or accuracy.model): greedy speculation of k tokens on
 * anchor-only KV, verified on merged KV (core/accuracy/eval.c). So a thinner
 * anchor (2 + 6) measures a lower acceptance than a thicker one (4 + 4).
 *
 * The samples: lynx.samples speculations, spread over FEED_TEXTS licence texts
 * and P = ceil(samples / texts) prompt lengths each. The lengths follow the
 * workload: its prompt lengths at the quantiles (i + 0.5) / P, clamped to
 * lynx.max_prompt_tokens (the reference model is small and slow on a CPU:
 * about 1 s per 512 prefilled tokens) and to the model's context; lengths that
 * clamping made equal are spread over the quarter below, so that no two
 * samples of one text share a prefix. One prefill per text serves every
 * length and every policy (the prefill of a prefix is the prefix of the
 * prefill).
 *
 * Caching (core/accuracy/feedcache.h): each policy's figures are stored under a
 * key naming the model file (path, size, mtime), the texts, KV_FEED_LYNX_VERSION,
 * the policy's encodings of every (layer, KV head) — the bit split among them —,
 * k, the prompt lengths and the sample count. A hit loads no model weights and
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

/* Bump whenever the measurement changes (texts, sampling, eval.c's speculation):
   cached figures of another version are then measured again. */
#define KV_FEED_LYNX_VERSION 2 /* 2: the forward pass rounds independently of the batch and BLAS threads */
#define KV_FEED_MAX_POSITIONS 64 /* speculative positions measured at most */

typedef struct kv_feed_acceptance {
    int positions;        /* speculative positions measured; 0: not measured (no speculation or no anchor split) */
    double accept_conditional[KV_FEED_MAX_POSITIONS]; /* P(position j accepted | j-1 accepted), [positions] */
    long speculations;    /* speculation samples behind the rates */
    int prompt_tokens;    /* the longest prompt length measured (the rates pool every length up to it) */
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

#endif
