/* trace.h — public LLM-inference traces (trace.c): their formats, the ranges every row is checked
 * against, and the reader that turns a trace file into requests (kv_request_spec, the unit of a
 * workload: workload.h). */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"

typedef struct kv_request_spec {
    uint64_t id;        /* 0, 1, 2, ... in arrival order */
    double arrival_s;   /* simulated seconds from the start, non-decreasing */
    int prompt_tokens;  /* >= 1 */
    int output_tokens;  /* >= 1 */
} kv_request_spec;

/* Ranges every trace row is checked against (docs/design-notes.md, "What kvsim guarantees about
   its inputs"). A double holds times up to 1e9 s to about 0.12 us. */
#define KV_TRACE_MAX_TIME_S 1e9            /* arrival after the first row, seconds (after time_scale) */
#define KV_TRACE_MAX_TOKENS (1 << 24)      /* prompt or output tokens of one row (the cards' max_context) */
#define KV_WORKLOAD_MAX_REQUESTS 100000000 /* requests in one list (workload.requests' maximum) */

typedef enum kv_trace_format {
    KV_TRACE_NONE = 0,
    KV_TRACE_AZURE = 1,    /* CSV: TIMESTAMP,ContextTokens,GeneratedTokens */
    KV_TRACE_MOONCAKE = 2, /* JSONL: timestamp (ms), input_length, output_length, hash_ids */
    KV_TRACE_BURSTGPT = 3, /* CSV: Timestamp,Model,Request tokens,Response tokens,... */
} kv_trace_format;

/* Reads a trace file into a list (used by kv_workload_create and the tests):
   at most max_rows requests (0 = all), times relative to the first row and
   multiplied by time_scale (0 = 1), ids 0, 1, 2, ... On success *out (free with
   kv_free) holds *count >= 1 requests; on failure *out is NULL, *count 0 and
   err says "path:line:col: field: what is wrong" (KV_EINPUT, also for a file
   that cannot be opened; KV_EFAIL for a read error). BurstGPT rows whose
   response tokens are 0 (failed requests) are skipped. */
int kv_trace_read(kv_trace_format fmt, const char *path, int max_rows, double time_scale,
                  kv_request_spec **out, size_t *count, kv_error *err);

#endif
