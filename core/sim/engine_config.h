/* engine_config.h — what the engine needs from a scenario, built once before the policies run.
 *
 * The engine (core/sim/engine.h) reads no scenario: kv_engine_config_build takes the pools, the Lynx and
 * DiffKV settings, the paged memory and the network from the scenario, checks that the model's
 * weights fit, and resolves the places ("file:line:col") the engine's errors point at. Everything
 * per policy (its costs, its measured acceptance and significance tables) stays in kv_run_inputs.
 */
#ifndef KV_ENGINE_CONFIG_H
#define KV_ENGINE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config/cards.h"
#include "core/kv/diffkv.h"
#include "core/base/error.h"
#include "core/config/scenario.h"
#include "net/net.h"

/* One pool of nodes (cluster.prefill or cluster.decode). */
typedef struct kv_engine_pool {
    int nodes, tp;
    int max_batch_tokens, max_batch;
    const kv_device_profile *device; /* borrowed from the scenario */
    double kv_capacity_bytes;        /* per node: memory_fraction x tp devices, less the weights */
} kv_engine_pool;

typedef struct kv_engine_config {
    const char *source;          /* the scenario file, for messages (borrowed) */
    const kv_model_card *model;  /* borrowed from the scenario */
    uint64_t seed;
    kv_engine_pool prefill, decode;
    bool colocated;              /* prefill inside the decode batch, no network */
    double accept_p;             /* lynx.acceptance */
    const double *accept_pos;    /* lynx.acceptance_per_position (borrowed), or NULL */
    size_t n_accept_pos;
    bool acceptance_measured;    /* lynx.from: reference-model or file: a speculating request needs its policy's
                                    measured acceptance (kv_run_inputs); the fixed values are not used */
    const char *acceptance_from; /* lynx.from's value, for messages */
    int ttkt_k;                  /* lynx.ttkt_k */
    kv_diffkv_score_model score_model; /* diffkv.*; a run adds its measured table */
    kv_scenario_memory memory;   /* memory.* */
    double step_floor_s[2], step_efficiency[2]; /* timing.roofline.* (prefill, decode) */
    const char *timing_backend;  /* timing.backend: where the memory managers run (borrowed) */
    kv_net_config net;           /* network.* (not colocated); a run sets the policy's priority classes */
    char platform_path[4096];    /* network.platform_file resolved; net.platform_file points here */
} kv_engine_config;

/* Fills *cfg from the scenario, which must outlive it. KV_EINPUT naming the key when the weights do
   not fit a pool or the network section is bad. The config holds no allocation: drop it freely,
   but do not copy it (net.platform_file points into it). */
int kv_engine_config_build(const kv_scenario *s, kv_engine_config *cfg, kv_error *err);
/* The one check that the model's weights fit each pool's devices at its TP degree with room for KV
   (decode, then prefill unless colocated): KV_EINPUT at cluster.<pool>.tp (or .device, the pool, the
   model, the first written) saying the smallest tp that fits. kv_engine_config_build calls it. */
int kv_engine_check_weights(const kv_scenario *s, kv_error *err);

/* The scenario's network section (core/sim/engine_net.c). Fills a kv_net_config (hosts: prefill nodes,
   then decode nodes), resolving network.platform_file into platform_path. */
int kv_engine_net_config(const kv_scenario *s, kv_net_config *cfg, char *platform_path, size_t size, kv_error *err);
/* Builds and drops the scenario's network once, so its errors show at validation. */
int kv_engine_check_network(const kv_scenario *s, kv_error *err);

#endif
