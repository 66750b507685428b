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
 * Several lengths N_1 < ... < N_n come from one pass over N_n tokens: the
 * prefill table of N_i is read after query N_i - 1 (the sums then cover
 * exactly the first N_i queries), the exit table from the exits at contexts
 * N_i/2..N_i; each is the very table a pass of N_i tokens would give. A text
 * shorter than N_n continues with the next texts of the list (in order, after
 * a blank line). `kvsim measure` and the reference-model mode both read a
 * curve of such tables (core/kv/curves.h).
 *
 * Each length's table is cached (core/accuracy/feedcache.h) under a key naming
 * the model file's identity, the texts' identities, N, W and
 * KV_DIFFKV_SCORES_VERSION, so a second run needs no model at all.
 */
#ifndef KV_DIFFKV_SCORES_H
#define KV_DIFFKV_SCORES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/kv/curves.h"
#include "core/kv/diffkv.h"
#include "core/base/error.h"
#include "core/policy/policy.h"
#include "core/config/scenario.h"

#define KV_DIFFKV_SCORES_VERSION 3 /* bump when the measurement changes what it stores (3: row-independent forward;
                                      a table of N tokens from a longer pass is the same table, so several lengths
                                      changed nothing) */
#define KV_DIFFKV_SCORES_TEXT "/usr/share/common-licenses/GPL-3" /* a licence text Debian ships */

typedef struct kv_diffkv_measured {
    kv_diffkv_table table; /* its z points into the owned array below */
    double *z;             /* [max(1, curve.n_lengths)][2][table.layers * table.kv_heads][KV_DIFFKV_TABLE_POINTS],
                              owned: per length, prefill then exit */
    int tokens;            /* N: prompt tokens measured */
    int window;            /* W: tokens excluded at the end */
    bool cached;           /* came from the cache, the model was not loaded */
    char source[512];      /* for results.json's tiers_source */
    kv_diffkv_curve curve; /* the tables at every measured length (table is one of them; their z point into z);
                              n_lengths 0 for a table read by kv_diffkv_scores_load */
} kv_diffkv_measured;

/* The cache key of a measurement with model file `model_path`, N tokens of
   `text_path`, window W into key[len] (a measurement on several texts adds
   the others' identities to it). KV_EINPUT when a file cannot be stat'ed. */
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
   of the workload's prompt lengths prompts[0..n_prompts) rounded to 64,
   within 128..2048), and out->curve: the tables at N and, without
   diffkv.measure_tokens, at the workload's shortest, median and longest
   prompt (rounded and clamped alike; up to 4 distinct lengths). Errors say
   which key to set (diffkv.scores: lognormal opts out of the model). */
int kv_diffkv_scores_for_policy(const kv_scenario *s, kv_policy *p, const int *prompts, size_t n_prompts,
                                kv_diffkv_measured *out, bool *needed, kv_error *err);

/* The tables at lengths[0..n_lengths) (strictly increasing, each above W,
   within the model's context; at most KV_CURVE_MAX_LENGTHS) for window W
   into out->curve (out->table is the last length's), from the cache or one
   pass over texts[0..n_texts) (see above). *cached_out (may be NULL): every
   length came from the cache. KV_EINPUT for lengths out of range or texts
   too short even joined; progress: a line every 1,024 tokens (NULL: quiet). */
int kv_diffkv_scores_curve(const char *model_path, const char *const *texts, int n_texts, const int *lengths,
                           int n_lengths, int window, FILE *progress, kv_diffkv_measured *out, bool *cached_out,
                           kv_error *err);

void kv_diffkv_measured_free(kv_diffkv_measured *m); /* frees z; m itself is the caller's */

#endif
