/* timing.h — how long operations take: a roofline over a device profile and a model card.
 *
 * Every cost is max(FLOPs / (peak × compute_efficiency), bytes / (bandwidth ×
 * memory_efficiency)) over a node of `tp` devices, plus a fixed per-step
 * overhead. KV kernels (encode on the prefill node, merge on the decode node)
 * are memory-bound: bytes moved / (bandwidth × kernel efficiency), where the
 * kernel efficiency defaults to the device's memory efficiency and can be
 * replaced by measured or calibrated values (timing.source: measured).
 */
#ifndef KV_TIMING_H
#define KV_TIMING_H

#include "core/cards.h"

typedef struct kv_timing {
    const kv_model_card *model;
    const kv_device_profile *device;
    int tp;                      /* devices per node */
    double encode_efficiency;    /* fraction of bandwidth KV encode kernels reach */
    double decode_efficiency;    /* likewise for merge/dequantize kernels */
} kv_timing;

void kv_timing_init(kv_timing *t, const kv_model_card *m, const kv_device_profile *d, int tp);

/* FLOPs of the matrix products for one token (all layers, no LM head). */
double kv_timing_linear_flops_per_token(const kv_model_card *m);

/* One step of work on a node, accumulated before it is costed. */
typedef struct kv_step_work {
    double flops;       /* total floating point operations */
    double kv_bytes;    /* KV bytes read or written */
    double tokens;      /* tokens processed (for the LM head) */
    double kernel_s;    /* extra kernel time already known (merge, compaction) */
} kv_step_work;

/* Adds the prefill of one prompt of `tokens` tokens (causal attention). */
void kv_step_add_prefill(const kv_timing *t, kv_step_work *w, double tokens);
/* Adds one decode token of a request whose context is `context` tokens and
   whose KV reads cost kv_bytes. */
void kv_step_add_decode(const kv_timing *t, kv_step_work *w, double context, double kv_bytes);
/* Adds a verification pass of k tokens over `context` tokens of KV (kv_bytes). */
void kv_step_add_verify(const kv_timing *t, kv_step_work *w, double k, double context, double kv_bytes);
/* Seconds the step takes: weights are read once per step. */
double kv_step_seconds(const kv_timing *t, const kv_step_work *w);

/* Seconds a memory-bound KV kernel takes for `bytes` moved (read + written). */
double kv_timing_encode_seconds(const kv_timing *t, double bytes);
double kv_timing_decode_kernel_seconds(const kv_timing *t, double bytes);

#endif
