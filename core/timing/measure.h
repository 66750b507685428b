/* measure.h — kernel costs for the timing model: measured on a backend, or from a calibration file. */
#ifndef KV_MEASURE_H
#define KV_MEASURE_H

#include "core/timing/timing.h"
#include "core/policy/policy.h"
#include "core/timing/profile.h"
#include "core/config/scenario.h"

/* Fills costs for one policy per the scenario's timing section:
 *  - timing.source: model — the device profile's memory efficiency, or, when
 *    timing.calibration names a `kvsim bench kernels --json` file, the encode and
 *    decode efficiencies measured there;
 *  - timing.source: measured — runs the policy's encode and decode kernels on
 *    timing.backend at the tensor size of the scenario's first request (one KV
 *    head, K and V; rows sampled down to 4096 tokens and scaled back) and uses
 *    their measured seconds per value in the simulated timeline.
 * Bad backends and calibration files give KV_EINPUT naming the key. */
int kv_measure_costs(const kv_scenario *s, kv_policy *p, int prompt_tokens, kv_kernel_costs *costs, kv_error *err);

/* timing.source: profile — loads timing.profile.file for the prefill pool (prefill_hardware, cluster.prefill.tp)
   and the decode pool (decode_hardware or prefill_hardware, cluster.decode.tp). Otherwise sets both to NULL.
   A missing key, file or matching row is KV_EINPUT naming the key. The caller destroys both. */
int kv_measure_profiles(const kv_scenario *s, kv_profile **prefill, kv_profile **decode, kv_error *err);

#endif
