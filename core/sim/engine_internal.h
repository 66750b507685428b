/* engine_internal.h — the engine's state, shared by engine.c (the request lifecycle) and engine_setup.c.
 *
 * Private to the engine: nothing outside core/engine*.c includes it. The lifecycle and invariants are
 * described at the top of core/sim/engine.c.
 */
#ifndef KV_ENGINE_INTERNAL_H
#define KV_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/kv/diffkv.h"
#include "core/policy/encset.h"
#include "core/sim/engine.h"
#include "core/sim/eventq.h"
#include "core/sim/kvcache.h"
#include "core/sim/kvmem.h"
#include "core/base/rng.h"
#include "core/timing/timing.h"

enum event_type {
    EV_ARRIVAL = 1,     /* a = request */
    EV_PREFILL_DONE,    /* a = prefill node: its batch (and encodes) finished */
    EV_ENCODE_DONE,     /* a = request: KV encoded, start the transfer */
    EV_LAYER_READY,     /* a = request, b = layer: layer-wise streaming */
    EV_STEP_DONE,       /* a = decode node */
    EV_PREFILL_END,     /* a = prefill node: its batch's prefill computed; encodes are planned and start */
};

enum step_action {
    ACT_NONE = 0,
    ACT_PREFILL,  /* colocated: prefill in the decode batch, commits the first token */
    ACT_NORMAL,   /* one committed token */
    ACT_SPEC,     /* one speculative token on anchor-only KV */
    ACT_VERIFY,   /* verify the speculated tokens with full-precision KV */
};

enum plane { PLANE_ANCHOR = 0, PLANE_RESIDUAL = 1 };

typedef struct request {
    kv_request_spec spec;
    kv_request_result *res;
    kv_transfer_plan plan;
    kv_rng rng;             /* this request's random stream */
    int spec_k;             /* max speculative tokens (0: no speculation) */
    bool split;             /* encoding has a residual plane */
    bool speculative;       /* admitted on the anchor, verifies later */
    double full_per_token;  /* stored KV bytes per context token, complete */
    double anchor_per_token;/* stored KV bytes per context token, anchor only */
    double encode_s;        /* encode kernel time on the prefill node */
    double merge_s;         /* merge kernel time on the decode node */
    kv_cache cache;         /* its KV on the decode node: tokens per tier and head, pages (kvcache.h) */
    int slot;               /* its page tables on the decode node (kvmem.h), -1 while it holds no pages */
    int prefill_tokens;     /* tokens the next prefill step computes: the prompt, or prompt + generated
                               after a recompute preemption */
    bool swapped;           /* preempted by swapping: its KV waits in host memory */
    uint64_t admit_order;   /* admission sequence number: preemption evicts the latest */
    int layers_total;       /* flows per plane: layers when layer-wise, else 1 */
    int anchor_pending, residual_pending;
    bool anchor_done, residual_done, merge_pending;
    bool prefilled;         /* its KV exists (received, or computed by a prefill step on the decode node) */
    bool first_held;        /* disaggregated: token 1 (the prefill node's last logits) exists but is not committed
                               yet: that waits for its complete KV at the decode node */
    int committed, speculated;
    int action;             /* enum step_action of the step in progress */
    double last_commit_s;
    double transfer_start_s;
    double reserved_bytes;  /* KV page bytes counted in its decode node's kv_reserved_bytes while its KV is in
                               flight (placed, not yet queued); 0 otherwise */
    bool incoming;          /* counted in its decode node's incoming */
    /* Timeline only (-1: did not happen): */
    double plane_start_s[2];/* first flow of the anchor / residual plane started */
    double enqueued_s;      /* joined its decode node's wait queue */
    double spec_start_s;    /* first speculative step began */
    double verify_start_s, verify_end_s; /* the verification step */
    int track;              /* its track in the requests process */
    bool transfer_planned;  /* the transfer hook has answered (r->plan, layers_total) */
    bool cache_made;        /* the encode hook has answered: cache, bytes, kernel costs (kv_engine_plan_encoding) */
    bool in_wait, running, done;
} request;

typedef struct prefill_node {
    int *queue;             /* FIFO of request indices */
    size_t head, n, cap;
    int *batch;             /* requests of the batch in progress */
    size_t n_batch, cap_batch;
    bool busy;
    int track;
} prefill_node;

typedef struct decode_node {
    int *wait;              /* FIFO of requests waiting for admission */
    size_t whead, wn, wcap;
    int *running;           /* requests in the batch */
    size_t n_running, cap_running;
    bool stepping;
    double step_start_s;
    double kv_capacity_bytes;
    kv_mem *mem;            /* the node's paged KV memory: pages, free ring, page tables (kvmem.h) */
    double pending_kernel_s;/* memory-manager and swap work to charge to the next step */
    uint64_t mgr_calls_seen;/* manager calls already accounted */
    double mgr_bytes_seen, mgr_wall_seen;
    int incoming;           /* requests placed here whose KV is still in flight (not yet queued) */
    double kv_reserved_bytes; /* bytes of KV pages those requests will need on arrival */
    int track;
} decode_node;

typedef struct engine {
    const kv_engine_config *cfg; /* what the engine needs from the scenario (borrowed) */
    kv_policy *policy;
    kv_policy_model model;
    kv_encset *encs;        /* the policy's encodings per (layer, KV head), reused while fixed (plan_request) */
    kv_cache cache_proto;   /* a request's fresh cache for those encodings when fixed and not DiffKV */
    uint64_t cache_proto_gen; /* kv_encset_generation cache_proto was made for; 0: none */
    kv_timing prefill_timing, decode_timing;
    kv_eventq q;
    double now_s;           /* the simulated clock: last event or flow completion handled */
    kv_net *net;
    kv_net_host *host;      /* where the run's network comes from (NULL: kv_net_create; kv_net_run_body) */
    kv_rng base_rng;
    request *reqs;
    size_t n_reqs;
    prefill_node *pnodes;
    decode_node *dnodes;
    int n_pnodes, n_dnodes;
    bool colocated;
    double accept_p;        /* lynx.acceptance */
    const double *accept_pos; /* per-position conditional acceptance, or NULL */
    size_t n_accept_pos;
    const kv_accept_curve *accept_curve; /* this policy's measured acceptance by prompt length, or NULL */
    bool accept_from_run;   /* accept_curve is set (kv_run_inputs) */
    int ttkt_k;
    kv_kernel_costs costs;  /* zeroes: roofline */
    kv_backend *be;         /* where the memory managers' free lists and compaction kernels run */
    bool own_be;            /* opened here (timing.backend), closed at the end */
    kv_diffkv_score_model score_model;
    const kv_diffkv_curve *diffkv_curve; /* this policy's measured significance by length, or NULL */
    kv_diffkv_head_params *head_model; /* [layers * kv_heads] DiffKV per-head factor and table row */
    bool charge_manager;    /* DiffKV: its on-device compaction calls are part of the step */
    uint64_t admit_counter;
    kv_mem_demand *scratch; /* batch entries for manager calls */
    size_t cap_scratch;
    int *shorts;            /* requests in the current batch call */
    size_t cap_shorts;
    size_t *short_from;     /* [i]: their first entry in scratch */
    size_t cap_short_from;
    kv_run_result *out;
    kv_timeline *tl;
    int tl_process;
    int tl_requests;        /* timeline process holding one track per request */
    int *host_tracks;       /* timeline track per host NIC (transfers): prefill out, then decode in */
    char platform_path[4096]; /* network.platform_file resolved against the scenario */
    kv_error *err;
    int failed;             /* first error code; stops the run */
    size_t done_count;
    bool memory_ready, net_ready; /* made from the first request planned (engine_setup.c) */
    /* What the engine knows of its own transfers, per host NIC (prefill out, then decode in): for ctx.route. */
    kv_policy_node *view_nodes; /* ctx.prefill_nodes / ctx.decode_nodes, rebuilt on each read */
    size_t cap_view_nodes;
} engine;

/* engine_setup.c: fills a zeroed engine for one run (the steps in order); frees what it made. */
int kv_engine_setup(engine *e, const kv_run_inputs *in, kv_net_host *host, kv_run_result *out, kv_error *err);
void kv_engine_free(engine *e);

/* The simulation of one policy run in this process; its network from host (NULL: kv_net_create).
   kv_engine_run (engine_child.c) calls it here or inside the SimGrid child. */
int kv_engine_run_loop(const kv_run_inputs *in, kv_run_result *out, kv_net_host *host, kv_error *err);

/* What a policy hook sees of a request, its history included. */
static inline kv_policy_request policy_request(const request *r)
{
    return (kv_policy_request){r->spec.id, r->spec.prompt_tokens, r->spec.output_tokens, r->spec.arrival_s,
                               r->res->prefill_start_s, r->res->prefill_end_s};
}

/* engine_setup.c: DiffKV's band beyond the measured lengths (kv_run_result), from the first request of
   the longest context beyond them once its cache is made. */
void kv_engine_diffkv_band(engine *e, const request *r);
/* engine_plan.c: the policy's plan for one request, each part when it takes effect (docs/policies.md). */
int kv_engine_plan_transfer(engine *e, request *r);   /* transfer hook: r->plan, layers_total */
int kv_engine_plan_encoding(engine *e, request *r);   /* encode hook: its cache, bytes, kernel costs */
int kv_engine_plan_speculation(engine *e, request *r); /* speculate hook: spec_k, speculative */
/* engine_setup.c: the decode nodes' memory and the network, shaped by the first request planned. */
int kv_engine_setup_memory(engine *e, const request *first);
int kv_engine_setup_network(engine *e, const request *first);
/* engine_view.c: what hooks see of the running system (kv_policy_view), and the engine's flow counts. */
void kv_engine_view_install(engine *e);
int kv_engine_node_state(engine *e, bool decode, kv_policy_node **out);
/* engine.c: the network's completion callback. */
void kv_engine_on_flow_done(void *user, kv_flow_id id, uint64_t tag, double t);

#endif
