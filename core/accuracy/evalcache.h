/* evalcache.h — kvsim eval's figures per policy, kept for kvsim run to show beside latency.
 *
 * A policy's accuracy on the reference model depends on the model file, the eval settings (the
 * scenario's `accuracy:` section: texts, lengths, needles, speculation, seed, backend) and the
 * policy's encodings of the reference model's (layer, KV head)s. kvsim eval stores each policy row's
 * figures in the feed cache (core/accuracy/feedcache.h) under a key naming all of those
 * (kv_evalcache_store); kvsim run rebuilds the same key from its scenario and looks them up
 * (kv_evalcache_lookup), after a statistics file's accuracy[] entries (core/accuracy/model_stats.h),
 * which win. Nothing is ever made up: a policy that neither holds is "not measured", with the command
 * that would measure it and a time estimate.
 *
 * Ownership: kv_evalcache_prepare allocates the context; kv_evalcache_destroy frees it.
 */
#ifndef KV_EVALCACHE_H
#define KV_EVALCACHE_H

#include <stdbool.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/accuracy/eval.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/model_stats.h"
#include "core/config/scenario.h"

#define KV_EVALCACHE_VERSION 1 /* bump when the eval's figures change meaning */

/* One policy's figures against bf16 KV, each with its 95% interval (NaN: not measured / not applicable). */
typedef struct kv_acc_figures {
    bool measured;
    char source[48];                 /* "stats file" or "eval cache" ("" when not measured) */
    int context_tokens;
    long scored_tokens;
    double delta_ppl, delta_ppl_ci95[2];
    double top1, top1_ci95[2];       /* teacher-forced top-1 agreement, 0..1 */
    double needle, needle_ci95[2];   /* needle recall, 0..1 */
    double accept, accept_ci95[2];   /* Lynx: mean share of the k speculated tokens accepted */
    int spec_k;
} kv_acc_figures;

/* What determines each policy's figures, for one scenario. */
typedef struct kv_evalcache kv_evalcache;

/* From the scenario's `accuracy:` section and its policies. *out stays NULL, with KV_OK and *why set
   (a sentence, into why[why_len]), when accuracy cannot be looked up: no `accuracy:` section, or the
   reference model file is absent. KV_EINPUT for a bad `accuracy:` section or policy (as kvsim eval).
   model: a GGUF path instead of accuracy.model (kvsim eval --model), NULL for the scenario's.
   shape: when not NULL and the model file is absent, the measured model of a statistics file: the
   context is made from its shape alone (no feed-cache lookups: only that file's accuracy[] figures),
   so `kvsim run` shows shipped figures on a machine without the model. */
int kv_evalcache_prepare(const kv_scenario *s, const char *model, const kv_stats_model *shape, kv_evalcache **out,
                         char *why, size_t why_len, kv_error *err);
/* Whether c was made from a statistics file's shape (the model file is absent). */
bool kv_evalcache_shape_only(const kv_evalcache *c);
void kv_evalcache_destroy(kv_evalcache *c); /* NULL is fine */
/* The eval scenario, the reference model's path and shape (borrowed from c). */
const kv_eval_scenario *kv_evalcache_scenario(const kv_evalcache *c);
const char *kv_evalcache_model_path(const kv_evalcache *c);
const kv_model_config *kv_evalcache_model(const kv_evalcache *c);
/* Policy i's (scenario order) encodings of the reference model [layers * kv_heads] and speculation k. */
const kv_encoding *kv_evalcache_encodings(const kv_evalcache *c, int i, int *speculate);
/* Rough seconds a `kvsim eval` of this scenario takes on 2 cores (for the "not measured" line). */
double kv_evalcache_estimate_s(const kv_evalcache *c);

/* The figures of eval row `row` (a policy row, not an anchor view). */
void kv_evalcache_figures(const kv_eval_result *r, int row, int context_tokens, kv_acc_figures *out);
/* kvsim eval: stores every policy row's figures under its key. Cache problems never fail (feedcache.h). */
int kv_evalcache_store(const kv_evalcache *c, const kv_eval_result *r, kv_error *err);
/* kvsim run: policy i's figures: the statistics file's entry for its encodings when stats is given and has
   one, else the eval cache's; out->measured false when neither has them. */
int kv_evalcache_lookup(const kv_evalcache *c, int i, const kv_model_stats *stats, kv_acc_figures *out,
                        kv_error *err);
/* kvsim eval --stats: merges every policy row's figures (a bf16 policy's too: 0 against itself) into s->accuracy (an entry with the same encodings is
   replaced, others are appended). KV_EINPUT when s's model shape differs from the evaluated model's. */
int kv_evalcache_merge_stats(const kv_evalcache *c, const kv_eval_result *r, kv_model_stats *s, const char *path,
                             kv_error *err);

#endif
