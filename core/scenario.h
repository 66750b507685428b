/* scenario.h — a scenario file, bound and checked: cluster, model, network, workload, policies, outputs. */
#ifndef KV_SCENARIO_H
#define KV_SCENARIO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/cards.h"
#include "core/error.h"
#include "core/schema.h"
#include "core/ytree.h"

/* Policies one scenario may compare (each is a Lua state and a whole simulation). */
#define KV_SCENARIO_MAX_POLICIES 256

typedef struct kv_pool_config {
    int nodes;             /* nodes in the pool */
    char *device;          /* device profile name or path */
    int tp;                /* tensor-parallel degree: devices per node */
    int max_batch_tokens;  /* prefill: tokens per batch */
    int max_batch;         /* decode: requests per batch */
    double memory_fraction;/* share of device memory usable for weights + KV */
} kv_pool_config;

typedef struct kv_length_config {
    char *dist;            /* fixed | uniform | lognormal | empirical */
    double value, sigma;
    int min, max;
    kv_intlist samples;
} kv_length_config;

typedef struct kv_scenario {
    /* Bound keys (see the table in scenario.c for docs and defaults). */
    char *name;
    char *description;
    int seed;
    char *model;
    kv_pool_config prefill, decode;
    bool colocated;

    char *net_model, *topology, *platform_file;
    double nic_bandwidth_gbps, nic_latency_us, switch_bandwidth_gbps, switch_latency_us, oversubscription;
    int hosts_per_leaf, fat_tree_spines, fat_tree_leaves;
    kv_intlist torus_dims;
    int dragonfly_groups, dragonfly_chassis, dragonfly_routers, dragonfly_nodes;
    kv_intlist host_slots;
    kv_strlist host_names;
    bool split_duplex;
    const kv_ynode *simgrid_options;
    double net_watchdog_s; /* seconds a SimGrid child may go without answering before kvsim kills it */

    int requests;
    char *arrival;
    double rate_per_s, burstiness;
    kv_length_config prompt, output;
    char *trace_format, *trace_path;
    double trace_time_scale;
    int trace_repeat;

    char *timing_source, *timing_backend, *timing_calibration;
    int timing_samples;
    char *timing_profile_file;     /* timing.source: profile — the table (core/profile.h) */
    char *timing_profile_model;    /* its `model` column to use */
    char *timing_profile_prefill_hardware, *timing_profile_decode_hardware; /* its `hardware` column per pool */

    kv_strlist policies;
    const kv_ynode *policy_settings;
    int policy_instructions;   /* policy_limits.instructions: VM instructions per hook call */
    int policy_memory_mib;     /* policy_limits.memory_mib: Lua heap per policy, MiB */
    int policy_string_kib;     /* policy_limits.string_kib: longest string, KiB */
    double policy_hook_ms;     /* policy_limits.hook_ms: wall-clock per hook call, ms */
    double policy_run_s;       /* policy_limits.run_s: wall-clock per policy over the run, s */
    int policy_print_kib;      /* policy_limits.print_kib: print() output per policy, KiB */

    char *lynx_from;                   /* reference-model | scenario */
    double lynx_acceptance;            /* fixed conditional acceptance (lynx.from: scenario) */
    kv_doublelist lynx_acceptance_per_position;
    int lynx_samples;                  /* speculations measured per policy (lynx.from: reference-model) */
    int lynx_max_prompt_tokens;        /* longest measured prompt, tokens */
    int ttkt_k;

    char *diffkv_scores;               /* measured | lognormal | fixed (core/diffkv.h) */
    int diffkv_measure_tokens;         /* measured: tokens prefilled on the reference model (0: auto) */
    double diffkv_score_sigma, diffkv_head_spread;
    double diffkv_high_fraction, diffkv_low_fraction;

    int page_tokens_min, page_tokens_max; /* memory: unified page size search range */
    double memory_watermark;           /* share of pages admission leaves free */
    double swap_bandwidth_gbs;         /* device <-> host, for swap preemption */
    double manager_call_us;            /* modelled fixed cost of one compaction call */
    bool measure_manager;              /* time the real manager calls (non-deterministic) */

    const kv_ynode *accuracy;  /* the accuracy: section, checked by core/model/eval_config.c */

    char *out_dir;
    bool out_json, out_csv, out_trace;
    bool progress;

    /* Derived at load time. */
    kv_ynode *tree;        /* the YAML with --set applied (owned) */
    char **overrides;      /* [n_overrides] the --set texts "key=value", in the order applied (owned) */
    int n_overrides;
    char *path;            /* scenario file as given */
    char *dir;             /* its folder */
    char *data_dir;        /* kvsim's own scenarios/ folder, for cards by name */
    kv_model_card model_card;
    kv_device_profile prefill_device, decode_device;
} kv_scenario;

/* Loads, applies overrides ("a.b=value", YAML values), binds, checks and
   loads the cards. KV_EINPUT with file:line:col and key on bad input. */
int kv_scenario_load(const char *path, const char *const *overrides, int n_overrides, kv_scenario **out,
                     kv_error *err);
void kv_scenario_destroy(kv_scenario *s); /* NULL is fine */

/* Resolves a file named in the scenario (trace, policy, platform): absolute,
   relative to the scenario's folder, or to kvsim's source tree. Writes into
   path; KV_EINPUT naming `key` when it does not exist. */
/* The limits the scenario's policy_limits.* keys give each policy (kv_policy_load's `limits`). */
struct kv_policy_limits;
void kv_scenario_policy_limits(const kv_scenario *s, struct kv_policy_limits *out);
/* Reads just the policy_limits section of a scenario's YAML tree, with the same defaults, ranges and
   messages as kv_scenario_load, for programs that read the rest of the scenario themselves (kvsim eval). */
int kv_scenario_read_policy_limits(const kv_ynode *root, struct kv_policy_limits *out, kv_error *err);
int kv_scenario_find_file(const kv_scenario *s, const char *name, const char *key, char *path, size_t size,
                          kv_error *err);

/* "file:line:col" of a key in the scenario, or the file name if the key is absent. */
const char *kv_scenario_where(const kv_scenario *s, const char *dotted, char *buf, size_t size);

/* The scenario reference (every key, default, doc). */
void kv_scenario_print_reference(FILE *out);

#endif
