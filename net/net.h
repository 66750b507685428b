/* net.h — the cluster network interface: start flows, learn when they finish.
 *
 * The engine owns simulated time. It drives a network with kv_net_advance:
 * "advance to t_limit, or to the first flow completion before it". Completions
 * are reported through the callback given at creation, at their exact
 * simulated time; a flow started from inside the callback starts at that time.
 *
 * Invariants every implementation keeps:
 *  1. Time never goes backwards: t_now after advance >= t_now before.
 *  2. advance never passes t_limit, and stops at the first completion time
 *     (all flows completing at that same time are reported in that call).
 *  3. A flow is reported exactly once, unless cancelled first (then never).
 *  4. Same inputs → same completion times and order, bit for bit.
 */
#ifndef KV_NET_H
#define KV_NET_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/base/stream.h"

#define KV_NET_API_VERSION 2 /* 2: per-flow levels and weights, kv_net_route, kv_net_link_state */

typedef struct kv_net kv_net;
typedef uint64_t kv_flow_id; /* unique per network, never 0 */

typedef enum kv_net_model {
    KV_NET_IDEAL = 0,   /* contention-free: latency + bytes / bandwidth */
    KV_NET_SIMGRID = 1, /* SimGrid flow-level model */
} kv_net_model;

typedef enum kv_net_topology {
    KV_TOPO_STAR = 0,     /* every host on one switch */
    KV_TOPO_FAT_TREE = 1, /* two-level fat-tree */
    KV_TOPO_TORUS = 2,
    KV_TOPO_DRAGONFLY = 3,
    KV_TOPO_PLATFORM = 4, /* a SimGrid platform XML file */
} kv_net_topology;

typedef enum kv_priority_mode {
    KV_PRIO_NONE = 0,     /* classes ignored: plain max-min sharing */
    KV_PRIO_STRICT = 1,   /* a lower class only gets what higher classes leave */
    KV_PRIO_WEIGHTED = 2, /* classes share in the ratio of their weights */
} kv_priority_mode;

#define KV_NET_MAX_CLASSES 4
#define KV_NET_MAX_OPTIONS 16

/* Everything a network needs to build itself; filled from the scenario's
   `network:` section. Units are in the field names. */
typedef struct kv_net_config {
    kv_net_model model;
    kv_net_topology topology;
    int hosts;                    /* prefill nodes first, then decode nodes */
    double nic_bandwidth_gbps;    /* per host, each direction (gigabits/s) */
    double nic_latency_s;         /* per host link */
    double switch_bandwidth_gbps; /* fat-tree uplinks / core links (0: same as NIC) */
    double switch_latency_s;
    int hosts_per_leaf;           /* fat-tree: hosts under one leaf switch */
    double oversubscription;      /* fat-tree: leaf downlink / uplink bandwidth ratio */
    int split_duplex;             /* 1: separate up and down links per NIC */
    const char *platform_file;    /* KV_TOPO_PLATFORM: path of the XML */
    const char *source;           /* scenario file, for error messages */
    kv_priority_mode priority;
    double class_weight[KV_NET_MAX_CLASSES]; /* KV_PRIO_WEIGHTED: share of class c */
    int n_options;                /* SimGrid options passed through, e.g. network/model=CM02 */
    const char *option_key[KV_NET_MAX_OPTIONS];
    const char *option_value[KV_NET_MAX_OPTIONS];
    /* Topology details (docs/network.md); fields a topology does not use are ignored. */
    int fat_tree_spines;          /* fat-tree: spine switches (0: from oversubscription) */
    int fat_tree_leaves;          /* fat-tree: leaf switches (0: enough for `hosts`) */
    int torus_dims[3];            /* torus: nodes along x, y, z (0: dimension unused) */
    int dragonfly_groups;         /* dragonfly: groups (<= dragonfly_routers) */
    int dragonfly_chassis;        /* dragonfly: chassis per group */
    int dragonfly_routers;        /* dragonfly: routers (blades) per chassis */
    int dragonfly_nodes;          /* dragonfly: hosts per router */
    const int *host_slot;         /* [hosts] topology position of host i (NULL: i); caller owns */
    const char *const *host_names; /* platform: [hosts] SimGrid host of host i (NULL: hosts sorted
                                      by name); caller owns */
    int prefill_hosts;            /* platform: hosts [0, prefill_hosts) send to [prefill_hosts, hosts);
                                     each such pair must have a route (0: no route check) */
    double watchdog_s;            /* simgrid: a child silent this long on one request is killed (s; 0: 60) */
    int ask_always;               /* simgrid: 1 sends every advance with flows in flight to the child (no
                                     answer given without it): the reference the shortcuts are tested
                                     against (tests/net/test_simgrid_pace.c); scenarios leave it 0 */
    const char *option_file[KV_NET_MAX_OPTIONS]; /* where option i was written: the scenario file or
                                                    "--set KEY" (NULL: unknown); for error messages */
    int option_line[KV_NET_MAX_OPTIONS];         /* 1-based line of option i in option_file (0: unknown) */
    int option_col[KV_NET_MAX_OPTIONS];          /* 1-based column of option i */
    int run_in_child;             /* simgrid, kv_net_run_body: 1 runs the body in the SimGrid child, its
                                     network a function call away (no round trip); 0 runs it here, SimGrid
                                     over its socket (the reference; kv_net_create ignores this field) */
} kv_net_config;

#define KV_NET_WATCHDOG_DEFAULT_S 60.0

/* One KV transfer. */
typedef struct kv_flow_spec {
    int src, dst;        /* host indices, 0 <= host < hosts, src != dst */
    uint64_t bytes;      /* payload bytes, > 0 */
    int priority;        /* class: 0 is the highest, < KV_NET_MAX_CLASSES (used when has_level is 0) */
    uint64_t tag;        /* opaque to the network, handed back on completion */
    int has_level;       /* 1: level and weight are this flow's own priority (e.g. a policy's);
                            0: they follow from its class under network.priority (kv_net_flow_start):
                            strict: level = class, weight 1; weighted: level 0, weight class_weight[class];
                            none: level 0, weight 1 */
    int level;           /* 0 is the highest, <= KV_NET_MAX_LEVEL; strict between levels */
    double weight;       /* share within its level, in [KV_NET_MIN_WEIGHT, KV_NET_MAX_WEIGHT]; 0 means 1 */
} kv_flow_spec;

/* Per-flow priority (docs/network.md "Per-flow priority"): a flow of a lower level only gets what
   higher levels leave on each link it shares with them (work-conserving); flows of one level share
   in proportion to their weights. The ideal network is contention-free: levels change nothing there. */
#define KV_NET_MAX_LEVEL (1 << 30)
#define KV_NET_MIN_WEIGHT 1e-6
#define KV_NET_MAX_WEIGHT 1e6

/* Called once per completed flow, at simulated time t_done_s. */
typedef void (*kv_net_done_fn)(void *user, kv_flow_id id, uint64_t tag, double t_done_s);

/* Per-link utilisation, for results.json. */
typedef struct kv_link_stats {
    char name[64];
    uint64_t bytes;      /* payload bytes that crossed the link */
    double busy_s;       /* time with at least one flow on the link */
    double bandwidth_gbps;
} kv_link_stats;

/* One link at the network's current time, for policies (kv_net_link_state). */
typedef struct kv_link_state {
    double capacity_gbps;     /* the link's bandwidth */
    double rate_gbps;         /* sum of the current rates of the flows crossing it */
    double utilisation;       /* rate_gbps / capacity_gbps, in 0..1 */
    int flows;                /* flows active on it (started, not completed or cancelled) */
    uint64_t bytes_in_flight; /* bytes still to send of those flows */
    uint64_t bytes_queued;    /* bytes of flows crossing it that are scheduled to start later */
} kv_link_state;

/* The table an implementation provides (ideal.c, simgrid/). */
typedef struct kv_net_i {
    int api_version;
    const char *name;
    void (*destroy)(void *ctx);
    int (*flow_start)(void *ctx, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err);
    int (*flow_cancel)(void *ctx, kv_flow_id id, kv_error *err);
    int (*advance)(void *ctx, double t_limit_s, double *t_now_s, kv_error *err);
    size_t (*active_flows)(void *ctx);
    size_t (*link_count)(void *ctx);
    int (*link_stats)(void *ctx, size_t link, kv_link_stats *out);
    int (*route)(void *ctx, int src, int dst, size_t *links, size_t max, size_t *n, kv_error *err);
    int (*link_state)(void *ctx, size_t link, kv_link_state *out, kv_error *err);
    size_t (*round_trips)(void *ctx); /* optional (NULL: 0): requests answered by another process */
} kv_net_i;

/* Builds the network the config asks for. Bad configs give KV_EINPUT with a
   message naming cfg->source and the key. done(user, ...) reports completions. */
int kv_net_create(const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out, kv_error *err);
void kv_net_destroy(kv_net *net); /* NULL is fine */
const char *kv_net_name(const kv_net *net);

/* Starts a flow at now_s (at the network's time if now_s is earlier; a later now_s
   schedules it: it starts when an advance reaches now_s). */
int kv_net_flow_start(kv_net *net, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err);
int kv_net_flow_cancel(kv_net *net, kv_flow_id id, kv_error *err);
/* Advances to min(t_limit_s, first completion); *t_now_s is where it stopped. */
int kv_net_advance(kv_net *net, double t_limit_s, double *t_now_s, kv_error *err);
size_t kv_net_active_flows(const kv_net *net);
size_t kv_net_link_count(const kv_net *net);
/* Requests the model sent to another process and waited for (the SimGrid child; 0 for the ideal
   network): what a network costs beyond its own CPU (kvsim bench sim reports it per request). */
size_t kv_net_round_trips(const kv_net *net);
int kv_net_link_stats(const kv_net *net, size_t link, kv_link_stats *out);

/* Read-only views of the network at its current time (what kv_net_advance last reached), for
   policies. kv_net_route: the links a src -> dst flow crosses (indices of kv_net_link_stats), in
   path order; writes at most max of them to links and their number to *n (more than max: KV_EFAIL
   with *n the number needed). kv_net_link_state: link `link` now (docs/network.md "Link state").
   Neither changes what the network computes. Errors: KV_EFAIL with a message. */
int kv_net_route(const kv_net *net, int src, int dst, size_t *links, size_t max, size_t *n, kv_error *err);
int kv_net_link_state(kv_net *net, size_t link, kv_link_state *out, kv_error *err);

/* ---- A whole run with its network (docs/network.md "How it runs") ----
   The caller's simulation is a body: run() simulates, taking its network from `host`; where run()
   happened in another process, save() (there, after run succeeded) writes what the caller keeps of the
   run and load() (here) reads it back. */
typedef struct kv_net_host kv_net_host;
typedef struct kv_net_body {
    int (*run)(void *arg, kv_net_host *host, kv_error *err);
    int (*save)(void *arg, kv_stream *out, kv_error *err);
    int (*load)(void *arg, kv_stream *in, kv_error *err);
    void *arg;
} kv_net_body;

/* Runs body with the network cfg asks for. In this process (host NULL: kv_net_host_create is then
   kv_net_create), unless cfg is simgrid with run_in_child: then a forked child builds cfg's platform
   (bad input is KV_EINPUT here, as from kv_net_create, before anything runs), runs body->run inside
   its SimGrid driver, body->save there, and this process body->load. The result is body's: its code
   and error (a KV_EINPUT with its key as run() set it), or KV_EFAIL when the child died, stalled
   (network.watchdog_s, SimGrid's step cap) or its results came back short. The child is reaped. */
int kv_net_run_body(const kv_net_config *cfg, const kv_net_body *body, kv_error *err);
/* The run's network: at most one per host; cfg may differ from kv_net_run_body's only in its
   priority mode and class weights (the policy's). */
int kv_net_host_create(kv_net_host *host, const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out,
                       kv_error *err);

/* What a host provides (net.c and simgrid/ only). */
struct kv_net_host {
    int (*create)(void *ctx, const kv_net_config *cfg, kv_net_done_fn done, void *user, const kv_net_i **iface,
                  void **impl, kv_error *err);
    void *ctx;
};

/* Constructors of the implementations (net.c calls them only through its table of models). */
int kv_net_ideal_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                        const kv_net_i **iface, void **ctx, kv_error *err);
int kv_net_simgrid_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                          const kv_net_i **iface, void **ctx, kv_error *err);
/* kv_net_run_body's child for simgrid with run_in_child (cfg checked by net.c). */
int kv_net_simgrid_run_body(const kv_net_config *cfg, const kv_net_body *body, kv_error *err);

/* Parses "star", "fat-tree", ...; returns -1 when unknown. */
int kv_net_topology_parse(const char *s);
const char *kv_net_topology_name(kv_net_topology t);

#endif
