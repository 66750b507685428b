/* feed.h — what the reference model measures for the simulator: Lynx acceptance.
 *
 * When a scenario says `lynx.from: reference-model`, each policy is evaluated
 * once on SmolLM2-135M (a short teacher-forced text and Lynx speculation at 8
 * prompt lengths, through core/model/eval.c) and the engine uses what was
 * measured: the conditional acceptance of each speculative position. (DiffKV's
 * significance distribution is measured by core/model/diffkv_scores.h.)
 */
#ifndef KV_FEED_H
#define KV_FEED_H

#include <stdbool.h>

#include "core/error.h"
#include "core/policy.h"
#include "core/scenario.h"

#define KV_FEED_MAX_POSITIONS 64

typedef struct kv_feed {
    int positions;                                 /* speculative positions measured (0: none) */
    double accept_conditional[KV_FEED_MAX_POSITIONS]; /* P(position j accepted | j-1 accepted) */
    long speculations;                             /* speculation samples behind the rates */
    char source[256];                              /* "reference model FILE, N tokens of TEXT" */
} kv_feed;

/* Evaluates one policy on the reference model (accuracy.model, or smollm2-135m).
   KV_EINPUT when the model file is missing (with the command that fetches it). */
int kv_feed_measure(const kv_scenario *s, kv_policy *p, kv_feed *out, kv_error *err);

#endif
