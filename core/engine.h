/* engine.h — simulate one policy over one workload on one cluster: the request lifecycle. */
#ifndef KV_ENGINE_H
#define KV_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/policy.h"
#include "core/scenario.h"
#include "core/timeline.h"
#include "core/workload.h"
#include "net/net.h"

/* Kernel efficiencies measured on a backend (timing.source: measured) or
   read from a calibration file; 0 means "use the device profile's". */
typedef struct kv_kernel_costs {
    double encode_efficiency;  /* fraction of memory bandwidth the encode kernel reaches */
    double decode_efficiency;  /* likewise merge / dequantize */
    double encode_s_per_value; /* measured: seconds per KV value encoded (0: use the roofline) */
    double decode_s_per_value; /* measured: seconds per KV value merged/decoded (0: roofline) */
    char source[160];          /* "model (...)", "measured on cpu (...)", "model, kernel efficiencies from FILE" */
} kv_kernel_costs;

typedef struct kv_run_inputs {
    const kv_scenario *scenario;
    kv_policy *policy;
    const kv_workload *workload;
    const kv_kernel_costs *costs;  /* may be NULL */
    kv_timeline *timeline;         /* may be NULL */
    int network_model;             /* kv_net_model: scenario's unless overridden */
} kv_run_inputs;

/* What happened to one request; times are simulated seconds from the start,
   -1 where a phase did not happen. */
typedef struct kv_request_result {
    uint64_t id;
    int prompt_tokens, output_tokens;
    int prefill_node, decode_node;
    double arrival_s, prefill_start_s, prefill_end_s, encode_end_s;
    double anchor_arrived_s;   /* first plane fully at the decode node */
    double kv_arrived_s;       /* all planes at the decode node */
    double admitted_s;         /* joined the decode batch */
    double first_spec_s;       /* first speculative token (or first token) */
    double first_token_s;      /* first committed token */
    double kth_token_s;        /* K-th committed token (lynx.ttkt_k) */
    double done_s;             /* last token committed */
    double anchor_bytes, residual_bytes; /* on the wire */
    double kv_stored_bytes;    /* on the decode node once complete */
    double kept_tokens_fraction; /* DiffKV: tokens kept / tokens (1 otherwise) */
    int spec_tokens;           /* speculated in total */
    int accepted_tokens;       /* of those, accepted by verification */
    int verifications;
} kv_request_result;

typedef struct kv_run_result {
    kv_request_result *requests; /* [n_requests] in id order */
    size_t n_requests;
    float *itl_s;                /* inter-token latencies, one per commit event after the first */
    size_t n_itl, cap_itl;
    kv_link_stats *links;        /* [n_links] */
    size_t n_links;
    char network[32];            /* "simgrid" or "ideal" */
    char timing_source[160];
    double makespan_s;           /* last completion */
    double kv_mem_peak_bytes;    /* max over decode nodes of KV bytes held */
    double kv_mem_capacity_bytes;/* per decode node, after weights */
    int max_decode_batch;        /* largest decode batch reached */
    uint64_t decode_steps;
    uint64_t events;             /* events processed (for bench sim) */
} kv_run_result;

/* Runs the simulation. KV_EINPUT for scenario problems found while running
   (a request that can never fit, a policy error), KV_EFAIL otherwise. */
int kv_engine_run(const kv_run_inputs *in, kv_run_result *out, kv_error *err);
void kv_run_result_free(kv_run_result *r);

/* Fills a kv_net_config from the scenario (hosts: prefill nodes, then decode nodes). */
void kv_engine_net_config(const kv_scenario *s, int model, kv_net_config *cfg);

#endif
