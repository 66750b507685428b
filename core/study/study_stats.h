/* study_stats.h — the study's reading of the model statistics file into each policy's curves (lynx.from: file,
 * diffkv.scores: file; docs/stats-format.md).
 *
 * The file named by the scenario's `stats` is read once per prepared study. A
 * speculative Lynx policy (its speculate hook gives k > 0 at 1,024 tokens or at
 * the workload's shortest, median or longest prompt) gets the acceptance curve
 * of the entry whose encodings equal the policy's, the encodings being those
 * its encode hook gives on the MEASURED model's shape (the file's layers x
 * kv_heads) for a request of the workload's median prompt; a DiffKV policy
 * gets the curve of its recent window W. No entry, or an entry measuring fewer
 * speculative positions than the policy speculates, is bad input (exit 2):
 * nothing falls back silently to another source.
 */
#ifndef KV_STUDY_STATS_H
#define KV_STUDY_STATS_H

#include <stddef.h>

#include "core/accuracy/model_stats.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"

typedef struct kv_stats_policy {
    kv_accept_curve accept;  /* n_lengths 0: none (lynx.from is not file, or the policy does not speculate) */
    long speculations;       /* samples behind accept, all lengths */
    kv_diffkv_curve diffkv;  /* n_lengths 0: none; its tables borrow from the kv_model_stats */
    char accept_source[512]; /* results.json's acceptance_source */
    char diffkv_source[512]; /* results.json's tiers_source */
} kv_stats_policy;

/* Reads the scenario's `stats:` file, found as scenario paths are (its folder, the working folder, the data
   folder), into *stats (the caller frees it with kv_model_stats_free). KV_EINPUT naming the file or key. */
int kv_study_stats_read(const kv_scenario *s, kv_model_stats *stats, kv_error *err);

/* Reads s->stats into *stats (the caller frees it with kv_model_stats_free, after the curves' last use) and
   fills out[0..n) for policies[0..n). prompts[0..n_prompts) are the workload's prompt lengths. KV_EINPUT
   naming the file (and line) or the scenario key and policy otherwise. */
int kv_study_stats_curves(const kv_scenario *s, kv_policy *const *policies, size_t n, const int *prompts,
                          size_t n_prompts, kv_model_stats *stats, kv_stats_policy *out, kv_error *err);

#endif
