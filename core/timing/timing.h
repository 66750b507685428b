/* timing.h — how long operations take: a roofline over a device profile and a model card, or a profiled table.
 *
 * Roofline (timing.source: model or measured): a step costs max(FLOPs /
 * (peak × compute_efficiency), bytes / (bandwidth × memory_efficiency)) over
 * a node of `tp` devices, plus the tensor-parallel all-reduces (two per layer,
 * ring: latency + 2(tp-1)/tp × activation bytes / interconnect bandwidth,
 * not overlapped with compute), plus a fixed per-step overhead.
 *
 * Profile (timing.source: profile, core/timing/profile.h): the prefill part of a step
 * is the table's prefill time for (prefill requests, mean prompt length), the
 * decode part the table's decode step time for (decode requests, mean
 * context), corrected for KV compression: the table was measured with bf16 KV,
 * so the roofline time of reading the bf16 KV is taken off and the time of
 * reading the step's real KV bytes is added. A verification of k tokens counts
 * as k decode requests whose KV is read once. Mixed steps (colocated prefill
 * inside a decode batch) add both parts.
 *
 * KV kernels (encode on the prefill node, merge on the decode node) are
 * memory-bound: bytes moved / (bandwidth × kernel efficiency), where the
 * kernel efficiency defaults to the device's memory efficiency and can be
 * replaced by measured or calibrated values (timing.source: measured).
 */
#ifndef KV_TIMING_H
#define KV_TIMING_H

#include <stddef.h>

#include "core/config/cards.h"
#include "core/timing/profile.h"

/* Kernel efficiencies measured on a backend (timing.source: measured) or
   read from a calibration file; 0 means "use the device profile's". */
typedef struct kv_kernel_costs {
    double encode_efficiency;  /* fraction of memory bandwidth the encode kernel reaches */
    double decode_efficiency;  /* likewise merge / dequantize */
    double encode_s_per_value; /* measured: seconds per KV value encoded (0: use the roofline) */
    double decode_s_per_value; /* measured: seconds per KV value merged/decoded (0: roofline) */
    char source[1024];         /* "model (...)", "measured on cpu (...)", "model, kernel efficiencies from FILE" */
} kv_kernel_costs;

typedef struct kv_timing {
    const kv_model_card *model;
    const kv_device_profile *device;
    int tp;                      /* devices per node */
    double encode_efficiency;    /* fraction of bandwidth KV encode kernels reach */
    double decode_efficiency;    /* likewise for merge/dequantize kernels */
    const kv_profile *profile;   /* step times from a profiled table; NULL: the roofline */
    /* Roofline calibration (timing.roofline.*, or a device profile's roofline entry for this tp), per phase
       [0] prefill (a step with prompts), [1] decode: a step costs
       max(floor, roofline / efficiency + token_s x tokens + knee_token_s x max(0, tokens - knee_tokens))
       + its known kernel time. Defaults 0, 1, 0 and knee_token_s 0 leave the roofline unchanged. */
    double step_floor_s[2];
    double step_efficiency[2];
    double step_token_s[2];
    double step_knee_tokens[2];  /* the knee: only a device profile's roofline entry sets it (prefill) */
    double step_knee_token_s[2];
} kv_timing;

/* A roofline timing (profile NULL); the knobs come from d's roofline entry for tp when it has one
   (kv_device_roofline_find), else the defaults. */
void kv_timing_init(kv_timing *t, const kv_model_card *m, const kv_device_profile *d, int tp);

/* FLOPs of the matrix products for one token (all layers, no LM head). */
double kv_timing_linear_flops_per_token(const kv_model_card *m);

/* One step of work on a node, accumulated before it is costed. */
typedef struct kv_step_work {
    double flops;          /* total floating point operations */
    double kv_bytes;       /* KV bytes read or written */
    double tokens;         /* tokens processed (for the LM head and the all-reduces) */
    double kernel_s;       /* extra kernel time already known (merge, compaction) */
    /* What the profile is looked up by: */
    double prefill_requests;   /* prompts prefilled in the step */
    double prefill_tokens;     /* their tokens */
    double decode_requests;    /* decode tokens in the step (a k-token verification counts k) */
    double decode_context;     /* sum of their context lengths, tokens */
    double decode_kv_bytes;    /* KV bytes the decode part reads */
    double decode_kv_bf16_bytes; /* what the same reads would be in bf16 (the profile's KV) */
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
/* The roofline's seconds for the step, whatever t->profile says (for comparisons). */
double kv_step_roofline_seconds(const kv_timing *t, const kv_step_work *w);
/* Fits timing.roofline's floor and efficiency of one phase (decode 0/1) to n profiled points: roofline[i]
   is the stock roofline's seconds (floor 0, efficiency 1) for point i, table[i] the table's. Minimises the
   sum of squared log ratios of max(floor, roofline / efficiency) to the table over a grid (floor in steps
   of 1% of the smallest table time up to 1.5x it, efficiency 0.01-10 in 0.5% steps). */
void kv_timing_fit_phase(const double *roofline, const double *table, size_t n, double *floor_s,
                         double *efficiency);

/* The calibration model fitted by `kvsim calibrate` (docs/timing.md, "Calibrating the roofline"): fits one
   phase's floor, efficiency and per-token overhead to n profiled points (roofline[i] the stock roofline's
   seconds, tokens[i] the step's tokens, table[i] the table's seconds), minimising the sum of squared log
   ratios of max(floor, roofline / efficiency + token_s x tokens) to the table. For each floor of the grid
   above, 1 / efficiency and token_s (both >= 0) are found by Gauss-Newton steps on the log error (weighted
   linear least squares, 40 iterations, token_s = 0 tried as well; a step leaving efficiency 1e-6 to 100 or
   token_s 0-1 s is not taken). */
void kv_timing_fit_phase_tokens(const double *roofline, const double *tokens, const double *table, size_t n,
                                double *floor_s, double *efficiency, double *token_s);
/* The fitted step time of a point: max(floor, roofline / efficiency + token_s x tokens). */
double kv_timing_fit_model(double roofline, double tokens, double floor_s, double efficiency, double token_s);

/* One phase's calibration knobs (docs/timing.md, "`kvsim calibrate`"): a step of `tokens` tokens whose stock
   roofline is `roofline` seconds costs max(floor_s, roofline / efficiency + token_s x tokens + knee_token_s x
   max(0, tokens - knee_tokens)). knee_token_s 0 is no knee (then the model is kv_timing_fit_model's). */
typedef struct kv_timing_knobs {
    double floor_s;
    double efficiency;
    double token_s;
    double knee_tokens;
    double knee_token_s;
} kv_timing_knobs;

/* The step time of a point under k (above). */
double kv_timing_knobs_seconds(const kv_timing_knobs *k, double roofline, double tokens);
/* kv_timing_fit_phase_tokens with a knee: starts from that fit (knee off), then for each knee candidate (each
   distinct token count of the points but the largest, and the rounded geometric mean of each pair of
   neighbours) and each floor of the grid, Gauss-Newton steps as above for 1 / efficiency and knee_token_s, with
   and without token_s; keeps the smallest sum of squared log errors (the knee-off fit unless a knee lowers
   it). Deterministic: no randomness, a fixed order. */
void kv_timing_fit_phase_knee(const double *roofline, const double *tokens, const double *table, size_t n,
                              kv_timing_knobs *out);
/* kv_timing_fit_errors under k. */
void kv_timing_knobs_errors(const double *roofline, const double *tokens, const double *table, size_t n,
                            const kv_timing_knobs *k, double *median, double *worst, double *worst_ratio);

/* The stock roofline's seconds (floor 0, efficiency 1, no per-token term, whatever t's knobs) for a profiled
   point of the table (decode 0: `batch` prompts of x tokens; 1: `batch` decode tokens over x tokens of bf16
   KV, the table's KV); *tokens gets the step's tokens, *no_comm_s (may be NULL) the seconds without the
   all-reduces. */
double kv_timing_point_stock_seconds(const kv_timing *t, int decode, double batch, double x, double *tokens,
                                     double *no_comm_s);
/* The errors |fitted / table - 1| of n points under knobs (floor_s, efficiency, token_s): their median, the
   largest, and the ratio table / fitted of the point farthest from 1 in log. */
void kv_timing_fit_errors(const double *roofline, const double *tokens, const double *table, size_t n,
                          double floor_s, double efficiency, double token_s, double *median, double *worst, double *worst_ratio);

/* Seconds of the step's tensor-parallel all-reduces (0 when tp is 1). */
double kv_step_allreduce_seconds(const kv_timing *t, const kv_step_work *w);

/* Seconds a memory-bound KV kernel takes for `bytes` moved (read + written). */
double kv_timing_encode_seconds(const kv_timing *t, double bytes);
double kv_timing_decode_kernel_seconds(const kv_timing *t, double bytes);

#endif
