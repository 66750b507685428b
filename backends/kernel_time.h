/* kernel_time.h — what the engine calls for `timing: measured` (run a kernel
 * on a backend at a given size and return its time) and for `timing: model`
 * calibration (per-kernel efficiency factors read from a
 * `kvsim bench kernels --json` file). */
#ifndef KV_KERNEL_TIME_H
#define KV_KERNEL_TIME_H

#include "backends/backend.h"
#include "backends/kernel_fixture.h"

typedef struct kv_kernel_timing {
    int repeats;   /* timed runs after one untimed warm-up; the median is returned (0 means 3) */
    double sample; /* run this fraction of the rows (tokens), (0, 1]; the time is scaled by 1 / sample;
                      0 means 1 (the real size) */
} kv_kernel_timing;

/* Seconds of one fused encode (quantize + split + pack; anchor_bits 0: quantize
   + pack) of layout l on be, measured as the wall time around enqueue +
   synchronize (the hook for device-event timing is in kernel_time.c). The
   input is synthetic K-like data. opts may be NULL. */
int kv_kernel_time_encode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                          const kv_kernel_timing *opts, double *seconds, kv_error *err);

/* Seconds of one fused decode; anchor_only (with anchor_bits > 0) decodes the
   anchor plane alone with midpoint reconstruction. */
int kv_kernel_time_decode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                          int anchor_only, const kv_kernel_timing *opts, double *seconds, kv_error *err);

/* Seconds of one attention pass over the problem `spec` describes (decode:
   n_queries = 1). Sampling scales spec->tokens. */
int kv_kernel_time_attention(kv_backend *be, const kv_attn_spec *spec, const kv_kernel_timing *opts,
                             double *seconds, kv_error *err);

/* Seconds of one compaction: an allocation of `pages_each` pages for each of
   n entries followed by their release (time of the pair, halved). */
int kv_kernel_time_compact(kv_backend *be, uint32_t n, uint32_t pages_each, const kv_kernel_timing *opts,
                           double *seconds, kv_error *err);

/* ---- Calibration for `timing: model` ---- */

/* Efficiency factors: for each kernel class, the fraction of the machine's
   memory bandwidth a `kvsim bench kernels --json` run reached. Classes:
   "encode", "decode", "quantize", "dequantize", "pack", "split", "bf16",
   "attention_decode", "attention_multi", "compact". */
typedef struct kv_kernel_calib kv_kernel_calib;

/* Reads the bench JSON and keeps the entries of `backend` (NULL: the first
   backend in the file). For each class the factor is the one measured at the
   largest context (the mean if several cases share it), by on-CPU time where
   the file has it ("ratio_oncpu"), else by wall time ("ratio"). Errors name the file
   and what is wrong (KV_EINPUT). */
int kv_kernel_calib_load(const char *path, const char *backend, kv_kernel_calib **out, kv_error *err);
void kv_kernel_calib_destroy(kv_kernel_calib *c); /* NULL is fine */
/* The factor of a class, or `fallback` when the file has none. */
double kv_kernel_calib_efficiency(const kv_kernel_calib *c, const char *kernel_class, double fallback);
/* The memory bandwidth the bench measured or used for that backend, GB/s (0 if absent). */
double kv_kernel_calib_bandwidth_gbps(const kv_kernel_calib *c);

/* Wall-clock seconds (CLOCK_MONOTONIC). */
double kv_kernel_now_s(void);

/* Times `enqueue` (which enqueues one kernel on be): one untimed warm-up,
   then `repeats` timed runs of enqueue + synchronize. Gives the best and the
   median seconds (either pointer may be NULL). This is where a backend's
   device-event timer would replace the wall clock. */
int kv_kernel_time_call(kv_backend *be, int (*enqueue)(void *arg, kv_error *err), void *arg, int repeats,
                        double *best_s, double *median_s, kv_error *err);

#endif
