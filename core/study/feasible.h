/* feasible.h — whether a scenario can run at all, from its cards, workload and policies, measuring nothing.
 *
 * kvsim validate's feasibility checks (README "Checking a scenario"). Errors (KV_EINPUT):
 *   - a pool's share of the weights (weights / tp) does not fit one device's usable memory
 *     (memory_gb x memory_fraction); the prefill pool is not checked when colocated;
 *   - no request fits the model's context (prompt + output > max_context for every request);
 *   - for some policy, not even the smallest request's KV (prompt + output tokens, the policy's
 *     encoding) fits a decode node's KV memory (usable memory less weights, less memory.watermark).
 * Warnings (one line each on `log`; errors with strict):
 *   - weights plus an activation estimate (one batch of max_batch_tokens: 2 bytes x
 *     (4 x hidden + 3 x ffn / tp) a token) do not fit a device;
 *   - some but not all requests exceed the context (their prompts are cut to it);
 *   - some but not all requests' KV does not fit a decode node.
 * DiffKV encodings are sized with the scenario's diffkv.high_fraction / low_fraction (an estimate).
 * Every message starts with the scenario's file:line:col of the key it is about and the key.
 */
#ifndef KV_FEASIBLE_H
#define KV_FEASIBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"
#include "core/workload/workload.h"

/* Runs the checks above on the built workload and the loaded policies ([n], scenario order). Returns
   KV_OK (warnings, if any, printed to log, which may be NULL) or KV_EINPUT at the first error. */
int kv_study_feasible(const kv_scenario *s, const kv_workload *wl, kv_policy *const *policies, size_t n,
                      bool strict, FILE *log, kv_error *err);

#endif
