/* diffkv_scores.h — DiffKV significance measured on the reference model: the engine's default score model.
 *
 * The engine does not run attention; it draws each token's normalised
 * significance z = N x (mean probability the token received from every later
 * query) from a distribution and applies DiffKV's rule to it (core/kv/diffkv.h).
 * By default that distribution is measured here: the reference model
 * (SmolLM2-135M) runs N tokens of a real text exactly, one query at a time,
 * the KV store gathers every token's significance per (layer, KV head) (max
 * over the GQA group), and the quantiles of z at u = 0, 1/128, ..., 1 become
 * one row per (layer, KV head) of each of the kv_diffkv_table's two tables:
 * z at the end of the N-token prefill for the tokens outside the policy's
 * recent window W, and z of each token at the step it leaves the window
 * (W + 1 queries, context i + W + 1; the tokens whose exit context is at
 * least about N/2) — the two moments the rule decides.
 *
 * The table is cached (core/accuracy/feedcache.h) under a key naming the model
 * file's identity, the text file's identity, N, W and KV_DIFFKV_SCORES_VERSION,
 * so a second run needs no model at all.
 */
#ifndef KV_DIFFKV_SCORES_H
#define KV_DIFFKV_SCORES_H

#include <stdbool.h>
#include <stddef.h>

#include "core/kv/diffkv.h"
#include "core/base/error.h"
#include "core/policy/policy.h"
#include "core/config/scenario.h"

#define KV_DIFFKV_SCORES_VERSION 3 /* bump when the measurement changes what it stores (3: row-independent forward) */
#define KV_DIFFKV_SCORES_TEXT "/usr/share/common-licenses/GPL-3" /* a licence text Debian ships */

typedef struct kv_diffkv_measured {
    kv_diffkv_table table; /* its z points into the owned array below */
    double *z;             /* [2][table.layers * table.kv_heads][KV_DIFFKV_TABLE_POINTS], owned:
                              prefill then exit */
    int tokens;            /* N: prompt tokens measured */
    int window;            /* W: tokens excluded at the end */
    bool cached;           /* came from the cache, the model was not loaded */
    char source[512];      /* for results.json's tiers_source */
} kv_diffkv_measured;

/* The cache key of a measurement with model file `model_path`, N tokens of
   `text_path` and window W into key[len]. KV_EINPUT when a file cannot be
   stat'ed. */
int kv_diffkv_scores_key(const char *model_path, const char *text_path, int tokens, int window, char *key,
                         size_t len, kv_error *err);

/* Looks the table up in the cache (*found). */
int kv_diffkv_scores_load(const char *key, kv_diffkv_measured *out, bool *found, kv_error *err);
/* Stores m's table under key (split over several cache entries when large). */
int kv_diffkv_scores_store(const char *key, const kv_diffkv_measured *m, kv_error *err);

/* Measures (or loads from the cache) the table for model `model_name`
   (smollm2-135m or a GGUF path, as accuracy.model), N = tokens of the text,
   window W. KV_EINPUT when the model is missing (the message names
   scripts/fetch-model.sh) or the text is too short. */
int kv_diffkv_scores_measure(const char *model_name, const char *text_path, int tokens, int window,
                             kv_diffkv_measured *out, kv_error *err);

/* What a scenario's DiffKV policy needs: *needed = false when `diffkv.scores`
   is not `measured` or the policy does not encode with DiffKV; otherwise the
   table for the policy's window W and N = diffkv.measure_tokens (0: the mean
   prompt length `mean_prompt` rounded to 64, within 128..2048). Errors say
   which key to set (diffkv.scores: lognormal opts out of the model). */
int kv_diffkv_scores_for_policy(const kv_scenario *s, kv_policy *p, double mean_prompt, kv_diffkv_measured *out,
                                bool *needed, kv_error *err);

void kv_diffkv_measured_free(kv_diffkv_measured *m); /* frees z; m itself is the caller's */

#endif
