/* profile.h — step times read from a profiled performance table (timing.source: profile).
 *
 * The table is a CSV in splitwise-sim's perf_model.csv layout: one row per
 * measured run, with at least the columns
 *
 *   model, hardware, tensor_parallel, prompt_size, batch_size, token_size,
 *   prompt_time, token_time
 *
 * (times in milliseconds; other columns are ignored). prompt_time is the
 * prefill of batch_size prompts of prompt_size tokens; token_time is one
 * decode step of batch_size requests, averaged over token_size generated
 * tokens, so its mean context is prompt_size + token_size / 2. Rows of the
 * same point are averaged.
 *
 * Two surfaces are built from the rows of one (model, hardware, tp): prefill
 * time over (batch, prompt tokens) and decode step time over (batch, context
 * tokens). Points may form a full grid (bilinear interpolation) or a cross —
 * one batch-size arm and one length arm through a common reference point, as
 * splitwise-sim measured them. On a cross, prefill follows total batch tokens:
 * t(B, P) = t_len(B P / B_ref) * r(B), r(B) = t_batch(B) / t_len(B x_ref / B_ref)
 * piecewise linear over the batch arm and held at its ends (1 at B_ref), so every
 * point is reproduced; decode keeps t(B, x) = t_len(x) * t_batch(B) / t_ref.
 * Along an axis, values are piecewise linear between knots and extrapolated
 * linearly from the end segments (never below zero). A point whose time falls
 * below an earlier point's on the same arm (a measurement artefact; e.g. batch
 * 64 prefilling faster than batch 32) is dropped and named in the description.
 */
#ifndef KV_PROFILE_H
#define KV_PROFILE_H

#include <stddef.h>

#include "core/base/error.h"

typedef struct kv_profile kv_profile;

/* Reads `path` and keeps the rows of (model, hardware, tp); names compare
   case-insensitively. KV_EINPUT with file:line:column for a malformed row, or
   with the (model, hardware, tp) combinations the file has when none match.
   `where` is the scenario position quoted in messages (may be NULL). */
int kv_profile_load(const char *path, const char *model, const char *hardware, int tp, const char *where,
                    kv_profile **out, kv_error *err);
void kv_profile_destroy(kv_profile *p); /* NULL is fine */

/* Seconds to prefill `batch` prompts of `prompt_tokens` tokens each. */
double kv_profile_prefill_s(const kv_profile *p, double batch, double prompt_tokens);
/* Seconds of one decode step of `batch` requests whose mean context is `context_tokens`. */
double kv_profile_decode_s(const kv_profile *p, double batch, double context_tokens);

/* The measured points, after averaging and dropping (decode = 0: prefill, x = prompt tokens; 1: decode,
   x = mean context tokens). */
size_t kv_profile_point_count(const kv_profile *p, int decode);
void kv_profile_point(const kv_profile *p, int decode, size_t i, double *batch, double *x, double *t_s);

/* "MODEL on HARDWARE, tp N (P prefill points: batch a-b, prompt c-d tokens; ...; dropped ...)". */
const char *kv_profile_describe(const kv_profile *p);

#endif
