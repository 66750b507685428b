/* scenario.h — a scenario file, bound and checked: cluster, model, network, workload, policies, outputs. */
#ifndef KV_SCENARIO_H
#define KV_SCENARIO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/config/cards.h"
#include "core/base/error.h"
#include "core/config/schema.h"
#include "core/config/ytree.h"

/* Policies one scenario may compare (each is a Lua state and a whole simulation). */
#define KV_SCENARIO_MAX_POLICIES 256

/* The enum-valued keys, bound at load. Each value's name is kv_<enum>_names[value] (the same table
   the schema binds with and the reference prints; outputs that echo a name take it from there). */
typedef enum kv_network_model {
    KV_NETWORK_SIMGRID = 0, /* contention and topology (net/simgrid) */
    KV_NETWORK_IDEAL = 1,   /* latency + bytes / bandwidth */
} kv_network_model;
typedef enum kv_network_topology {
    KV_NETWORK_STAR = 0,
    KV_NETWORK_FAT_TREE = 1,
    KV_NETWORK_TORUS = 2,
    KV_NETWORK_DRAGONFLY = 3,
    KV_NETWORK_PLATFORM = 4, /* network.platform_file */
} kv_network_topology;
typedef enum kv_workload_arrival {
    KV_WORKLOAD_ARRIVAL_POISSON = 0,
    KV_WORKLOAD_ARRIVAL_GAMMA = 1,
    KV_WORKLOAD_ARRIVAL_FIXED = 2,
} kv_workload_arrival;
typedef enum kv_workload_length {
    KV_WORKLOAD_LENGTH_FIXED = 0,
    KV_WORKLOAD_LENGTH_UNIFORM = 1,
    KV_WORKLOAD_LENGTH_LOGNORMAL = 2,
    KV_WORKLOAD_LENGTH_EMPIRICAL = 3,
} kv_workload_length;
typedef enum kv_workload_trace_format {
    KV_WORKLOAD_TRACE_NONE = 0, /* synthetic arrivals */
    KV_WORKLOAD_TRACE_AZURE = 1,
    KV_WORKLOAD_TRACE_MOONCAKE = 2,
    KV_WORKLOAD_TRACE_BURSTGPT = 3,
} kv_workload_trace_format;
typedef enum kv_timing_source {
    KV_TIMING_MODEL = 0,    /* roofline over the device profiles */
    KV_TIMING_MEASURED = 1, /* kernels run on timing.backend */
    KV_TIMING_PROFILE = 2,  /* step times from timing.profile */
} kv_timing_source;
typedef enum kv_lynx_from {
    KV_LYNX_FROM_REFERENCE_MODEL = 0, /* acceptance measured per policy on the reference model */
    KV_LYNX_FROM_SCENARIO = 1,        /* lynx.acceptance(_per_position) */
    KV_LYNX_FROM_FILE = 2,            /* the model statistics file `stats` (docs/stats-format.md) */
} kv_lynx_from;
typedef enum kv_diffkv_scores_from {
    KV_DIFFKV_FROM_MEASURED = 0,  /* quantile tables measured on the reference model */
    KV_DIFFKV_FROM_LOGNORMAL = 1, /* diffkv.score_sigma, diffkv.head_spread */
    KV_DIFFKV_FROM_FIXED = 2,     /* diffkv.high_fraction, diffkv.low_fraction */
    KV_DIFFKV_FROM_FILE = 3,      /* quantile tables by length from the model statistics file `stats` */
} kv_diffkv_scores_from;

extern const char *const kv_network_model_names[];
extern const char *const kv_network_topology_names[];
extern const char *const kv_workload_arrival_names[];
extern const char *const kv_workload_length_names[];
extern const char *const kv_workload_trace_format_names[];
extern const char *const kv_timing_source_names[];
extern const char *const kv_lynx_from_names[];
extern const char *const kv_diffkv_scores_from_names[];

typedef struct kv_pool_config {
    int nodes;             /* nodes in the pool */
    char *device;          /* device profile name or path */
    int tp;                /* tensor-parallel degree: devices per node */
    int max_batch_tokens;  /* prefill: tokens per batch */
    int max_batch;         /* decode: requests per batch */
    double memory_fraction;/* share of device memory usable for weights + KV */
} kv_pool_config;

typedef struct kv_length_config {
    kv_workload_length dist;
    double value, sigma;
    int min, max;
    kv_intlist samples;
} kv_length_config;

/* One struct per section of the file; a field's path is its key's (network.fat_tree.spines). */
typedef struct kv_scenario_cluster {
    kv_pool_config prefill, decode;
    bool colocated;
} kv_scenario_cluster;

typedef struct kv_scenario_network {
    kv_network_model model;
    kv_network_topology topology;
    double nic_bandwidth_gbps, nic_latency_us, switch_bandwidth_gbps, switch_latency_us;
    int hosts_per_leaf;
    struct { int spines, leaves; } fat_tree;
    kv_intlist torus_dims;
    struct { int groups, chassis, routers, nodes; } dragonfly;
    kv_intlist host_slots;
    kv_strlist host_names;
    double oversubscription;
    bool split_duplex;
    char *platform_file;
    const kv_ynode *simgrid; /* SimGrid options, checked by net/ (borrowed from the tree) */
    double watchdog_s;       /* seconds a SimGrid child may go without answering before kvsim kills it */
    bool in_child;           /* simgrid: a policy's run happens in the SimGrid child (docs/network.md) */
} kv_scenario_network;

typedef struct kv_scenario_workload {
    int requests;
    kv_workload_arrival arrival;
    double rate_per_s, burstiness;
    bool fit_context; /* cut prompt + output to the model's context */
    kv_length_config prompt, output;
    struct {
        kv_workload_trace_format format;
        char *path;
        double time_scale;
        int repeat;
    } trace;
} kv_scenario_workload;

typedef struct kv_scenario_timing {
    kv_timing_source source;
    char *backend, *calibration;
    int samples;
    struct {
        char *file;                              /* timing.source: profile — the table (core/timing/profile.h) */
        char *model;                             /* its `model` column to use */
        char *prefill_hardware, *decode_hardware; /* its `hardware` column per pool */
    } profile;
    struct {
        double prefill_floor_ms, decode_floor_ms;     /* per-step floor of the roofline (docs/timing.md) */
        double prefill_efficiency, decode_efficiency; /* the roofline's step time is divided by these */
    } roofline;
} kv_scenario_timing;

typedef struct kv_scenario_limits {
    int instructions;  /* VM instructions per hook call */
    int memory_mib;    /* Lua heap per policy, MiB */
    int string_kib;    /* longest string, KiB */
    double hook_ms;    /* wall-clock per hook call, ms */
    double run_s;      /* wall-clock per policy over the run, s */
    int print_kib;     /* print() output per policy, KiB */
} kv_scenario_limits;

typedef struct kv_scenario_lynx {
    kv_lynx_from from;
    double acceptance;                   /* fixed conditional acceptance (lynx.from: scenario) */
    kv_doublelist acceptance_per_position;
    int samples;                         /* speculations measured per policy (lynx.from: reference-model) */
    int max_prompt_tokens;               /* longest measured prompt, tokens */
    int ttkt_k;
} kv_scenario_lynx;

typedef struct kv_scenario_diffkv {
    kv_diffkv_scores_from scores;
    int measure_tokens;                  /* measured: tokens prefilled on the reference model (0: auto) */
    double score_sigma, head_spread;
    double high_fraction, low_fraction;
} kv_scenario_diffkv;

typedef struct kv_scenario_memory {
    int page_tokens_min, page_tokens_max; /* unified page size search range */
    double watermark;                     /* share of pages admission leaves free */
    double swap_bandwidth_gbs;            /* device <-> host, for swap preemption */
    double manager_call_us;               /* modelled fixed cost of one compaction call */
    bool measure_manager;                 /* time the real manager calls (non-deterministic) */
} kv_scenario_memory;

typedef struct kv_scenario_outputs {
    char *dir;
    bool json, csv, trace;
    bool progress;
} kv_scenario_outputs;

typedef struct kv_scenario {
    /* Bound keys (see the table in scenario.c for docs and defaults). */
    char *name;
    char *description;
    int seed;
    int replicates;        /* kvsim run: seeds seed..seed+replicates-1 (core/report/replicates.h) */
    char *model;
    char *stats;           /* model statistics file (lynx.from: file, diffkv.scores: file), "" when none */
    kv_scenario_cluster cluster;
    kv_scenario_network network;
    kv_scenario_workload workload;
    kv_scenario_timing timing;
    kv_strlist policies;
    const kv_ynode *policy_settings; /* the `policy` mapping: policy.<name>.file, policy.<name>.<param> */
    kv_scenario_limits policy_limits;
    kv_scenario_lynx lynx;
    kv_scenario_diffkv diffkv;
    kv_scenario_memory memory;
    const kv_ynode *accuracy;  /* the accuracy: section, its keys checked by core/accuracy/eval_config.c */
    kv_scenario_outputs outputs;

    /* Derived at load time. */
    kv_ynode *tree;        /* the YAML with --set applied (owned) */
    char **overrides;      /* [n_overrides] the --set texts "key=value", in the order applied (owned) */
    int n_overrides;
    char *path;            /* scenario file as given */
    char *dir;             /* its folder */
    char *data_dir;        /* kvsim's data folder (core/base/datadir.h), "" when none was found */
    char *note;            /* a line for stderr, shown once by the command (--set policies dropped some
                              policy.<name> settings), or NULL */
    kv_model_card model_card;
    kv_device_profile prefill_device, decode_device;
} kv_scenario;

/* Loads, applies overrides ("a.b=value", YAML values), binds, checks and
   loads the cards. KV_EINPUT with file:line:col and key on bad input. */
int kv_scenario_load(const char *path, const char *const *overrides, int n_overrides, kv_scenario **out,
                     kv_error *err);
void kv_scenario_destroy(kv_scenario *s); /* NULL is fine */

/* kv_scenario_where of the first of keys[0..n) written in the scenario, else of keys[n - 1]; *key is
   the one used. */
const char *kv_scenario_where_first(const kv_scenario *s, const char *const *keys, size_t n, const char **key,
                                    char *buf, size_t size);
/* The one place an error's key becomes a position: when err->key names a scenario key, the message
   gets that key's "file:line:col: " in front ("--set KEY: " for a value from the command line; the
   nearest enclosing section, or the file, for a key left at its default), replacing a bare "PATH: "
   the reporting layer may have written. Layers that see only their own configuration (net/,
   core/workload) name the key with kv_error_set_key and leave positions to this. */
void kv_scenario_locate(const kv_scenario *s, kv_error *err);
/* Resolves a file named in the scenario (trace, policy, card, platform, profile, ...): an absolute
   path as it is; a relative one against the scenario's folder, then the working folder, then kvsim's
   data folder; one given on the command line (the value of `key` came from --set) against the working
   folder only. Writes into path; KV_EINPUT naming `key` and every place looked when it does not exist. */
int kv_scenario_find_file(const kv_scenario *s, const char *name, const char *key, char *path, size_t size,
                          kv_error *err);

/* "file:line:col" of a key in the scenario, or the file name if the key is absent. */
const char *kv_scenario_where(const kv_scenario *s, const char *dotted, char *buf, size_t size);

/* The scenario reference (every key, default, doc). */
void kv_scenario_print_reference(FILE *out);

#endif
