/* engine.h — simulate one policy over one workload on one cluster: the request lifecycle. */
#ifndef KV_ENGINE_H
#define KV_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/kv/curves.h"
#include "core/kv/diffkv.h"
#include "core/sim/engine_config.h"
#include "core/base/error.h"
#include "core/base/histogram.h"
#include "core/policy/policy.h"
#include "core/timing/profile.h"
#include "core/timing/timing.h"
#include "core/base/progress.h"
#include "core/sim/timeline.h"
#include "core/workload/workload.h"
#include "backends/backend.h"
#include "net/net.h"

typedef struct kv_run_inputs {
    const kv_engine_config *config; /* built once from the scenario (core/sim/engine_config.h) */
    kv_policy *policy;
    const kv_workload *workload;
    const kv_kernel_costs *costs;  /* may be NULL */
    kv_timeline *timeline;         /* may be NULL */
    kv_progress *progress;         /* terminal progress line; may be NULL */
    const kv_accept_curve *accept_curve; /* measured per-position acceptance by prompt length (borrowed;
                                      NULL: the scenario's fixed acceptance) */
    const kv_diffkv_curve *diffkv_curve; /* diffkv.scores: measured: z per reference head by length (borrowed;
                                      NULL: none, a DiffKV policy then fails) */
    const char *diffkv_source;     /* what measured the curve, for results.json */
    const char *accept_source;     /* what measured accept_curve, for results.json (NULL: feed_source) */
    const char *feed_source;       /* what measured the acceptance, for results.json */
    kv_backend *backend;           /* runs the decode nodes' memory managers; NULL: the engine opens
                                      timing.backend (device 0) for the run */
    const kv_profile *prefill_profile, *decode_profile; /* timing.source: profile (NULL: the roofline) */
    int keep_policy_state;         /* 1: a later run of this policy continues this one's Lua state (capacity
                                      probes): the run stays in this process (a simgrid network then talks
                                      to its child over the socket; docs/network.md "How it runs") */
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
    double second_commit_s;    /* the commit event after the first token's (its ITL ends here) */
    double anchor_bytes, residual_bytes; /* on the wire */
    double kv_stored_bytes;    /* on the decode node once complete */
    double kept_tokens_fraction; /* DiffKV: tokens kept / tokens (1 otherwise) */
    double bits;               /* bits per KV value on the wire: 8 x (anchor + residual) / values of the prompt */
    int spec_tokens;           /* speculated in total */
    int accepted_tokens;       /* of those, accepted by verification */
    int verifications;
    /* DiffKV, at completion, over (layer, KV head, token): NaN for other policies. */
    double tier_high_fraction, tier_low_fraction, tier_pruned_fraction;
    int preemptions;           /* times evicted from the decode batch for memory */
} kv_request_result;

typedef struct kv_run_result {
    kv_request_result *requests; /* [n_requests] in id order */
    size_t n_requests;
    int requests_shared;         /* requests is a kv_calloc_shared mapping (the SimGrid child filled it) */
    kv_histogram itl_s;          /* inter-token latencies, one per commit event after the first (bounded memory) */
    kv_link_stats *links;        /* [n_links] */
    size_t n_links;
    char network[32];            /* "simgrid" or "ideal" */
    char timing_source[1024];
    char acceptance_source[512];   /* where Lynx acceptance came from */
    char tiers_source[640];        /* where DiffKV's significance came from */
    double makespan_s;           /* last completion */
    double kv_mem_peak_bytes;    /* max over decode nodes of KV bytes held */
    double kv_mem_capacity_bytes;/* per decode node, after weights */
    int max_decode_batch;        /* largest decode batch reached */
    /* Paged KV memory (core/sim/kvmem.h), per decode node. */
    double kv_page_bytes;        /* unified page size */
    int kv_tokens_per_page[2];   /* tokens of tier 0 / tier 1 (0: unused) one page holds */
    double kv_pages_capacity;    /* pages per decode node */
    double kv_pages_peak;        /* max over nodes of pages in use; kv_mem_peak_bytes = this x page */
    uint64_t kv_manager_calls;   /* compaction calls (allocation and release batches) */
    double kv_manager_s;         /* their modelled time (memory.manager_call_us + bytes / HBM) */
    double kv_manager_charged_s; /* of which added to decode steps (DiffKV: its manager runs on the device) */
    double kv_manager_measured_s;/* wall time of the real calls on the backend (memory.measure_manager; else NaN) */
    double decode_busy_s;        /* sum over decode nodes of step times */
    double mean_decode_batch;    /* requests per decode step, weighted by step time */
    uint64_t preemptions;        /* evictions for memory (recompute or swap) */
    double swap_bytes;           /* bytes copied between device and host by swap preemption */
    /* DiffKV: token-weighted over requests at completion; NaN for other policies. */
    double tier_high_fraction, tier_low_fraction, tier_pruned_fraction;
    uint64_t decode_steps;
    uint64_t events;             /* events processed (for bench sim) */
    uint64_t net_round_trips;    /* requests the network waited on its SimGrid child for (for bench sim) */
    /* Beyond what was measured (core/kv/curves.h): the figures are held at the longest measured
       length; the band is what the log-linear trend over the two longest lengths would give at the
       longest request beyond it (equal to the held figure when one length was measured). */
    int accept_longest_tokens;   /* Lynx: longest prompt length of the acceptance curve (0: no curve) */
    size_t accept_beyond_requests;/* requests whose prompt is longer */
    double accept_beyond_share;  /* of all requests (0 when none) */
    int accept_beyond_max_tokens;/* the longest such prompt (0: none) */
    double accept_held_mean;     /* mean over positions of the conditional acceptance held there (NaN: none beyond) */
    double accept_trend_mean;    /* the same on the trend at accept_beyond_max_tokens (NaN: none beyond) */
    int diffkv_longest_tokens;   /* DiffKV: longest length of the significance curve (0: no curve) */
    size_t diffkv_beyond_requests;/* requests whose context (prompt + output) is longer */
    double diffkv_beyond_share;
    int diffkv_beyond_max_tokens;/* the longest such context (0: none) */
    /* Mean over heads of the prompt tokens' tier probabilities at the end of prefill: held at
       diffkv_longest_tokens, and on the trend at diffkv_beyond_max_tokens (NaN: none beyond). */
    double diffkv_held_high, diffkv_held_low, diffkv_trend_high, diffkv_trend_low;
} kv_run_result;

/* Runs the simulation. KV_EINPUT for scenario problems found while running
   (a request that can never fit, a policy error), KV_EFAIL otherwise. */
int kv_engine_run(const kv_run_inputs *in, kv_run_result *out, kv_error *err);
void kv_run_result_free(kv_run_result *r);

#endif
