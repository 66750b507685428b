/* eval_config.h — the part of a scenario `kvsim eval` uses: its policies, `seed`, `policy_limits`, `accuracy`.
 *
 * The scenario is read once, by kv_scenario_load (core/config/scenario.h), as for `kvsim run` and
 * `sweep`; the `accuracy` mapping it keeps is checked here: unknown keys, wrong types and out-of-range
 * numbers are KV_EINPUT with file:line:col and a "did you mean" hint. See docs/accuracy.md.
 */
#ifndef KV_EVAL_CONFIG_H
#define KV_EVAL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/accuracy/eval.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"
#include "core/policy/policy_spec.h"

typedef struct kv_eval_scenario {
    char *path;                /* the scenario file */
    kv_policy_spec *policies;  /* as listed in `policies` (core/policy/policy_spec.h) */
    int n_policies;
    uint64_t seed;             /* top-level `seed` (default 1) */
    char *model;               /* accuracy.model: "smollm2-135m" or a .gguf path (resolved) */
    char **texts;              /* accuracy.texts, resolved paths */
    int n_texts;
    int context_tokens;        /* accuracy.context_tokens (default 1024) */
    int score_tokens;          /* accuracy.score_tokens (default 128) */
    int generate_tokens;       /* accuracy.generate_tokens (default 64) */
    int needle_count;          /* accuracy.needle.count (default 4) */
    int needle_context_tokens; /* accuracy.needle.context_tokens (default 1024) */
    int speculative_positions; /* accuracy.speculative_positions (default 0: the policy's) */
    int speculation_points;    /* accuracy.speculation_points (default 4): Lynx samples per prompt */
    char *backend;             /* accuracy.backend (default "cpu"): where decode attention runs; "none": the
                                  KV store's own loop */
    kv_policy_limits policy_limits; /* policy_limits.*, as kvsim run reads them */
    kv_eval_where where;       /* "file:line:col" of each length key (the scenario's path for a default); the
                                  strings are owned here */
} kv_eval_scenario;

/* Takes the eval settings from a loaded scenario, which must outlive *out (the policies' parameter
   strings point into it). A scenario without an `accuracy` section is KV_EINPUT. *out is the caller's. */
int kv_eval_scenario_from(const kv_scenario *s, kv_eval_scenario **out, kv_error *err);
void kv_eval_scenario_destroy(kv_eval_scenario *s); /* NULL is fine */

/* Where the named model lives: "smollm2-135m" is the cached file that
   scripts/fetch-model.sh writes (${KVSIM_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvsim/models});
   anything else is a path. KV_EINPUT with a hint when the file is absent. */
int kv_eval_model_path(const char *model, char *out, size_t size, kv_error *err);

#endif
