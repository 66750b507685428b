/* cards.h — model cards and device profiles: the YAML files under scenarios/models and scenarios/devices. */
#ifndef KV_CARDS_H
#define KV_CARDS_H

#include <stdbool.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/config/schema.h"

/* A transformer's shape. */
typedef struct kv_model_card {
    char *name;
    int layers;
    int hidden;         /* model width */
    int heads;          /* query heads */
    int kv_heads;       /* key/value heads (GQA) */
    int head_dim;
    int ffn;            /* MLP intermediate size */
    int vocab;
    double params;      /* parameter count */
    double weight_bytes_per_param; /* 2 for bf16 weights */
    int max_context;    /* tokens */
    char *source;       /* where the figures come from */
} kv_model_card;

/* A device profile's roofline calibration for one tensor-parallel degree (written by `kvsim calibrate`;
   docs/timing.md): per phase [0] prefill, [1] decode, a step costs
   max(floor, roofline / efficiency + token x tokens + knee_token x max(0, tokens - knee_tokens)); the knee
   is a prefill knob (knee_token_s[1] is always 0), and knee_token_s 0 turns it off. */
typedef struct kv_device_roofline {
    int tp;
    double floor_s[2];
    double efficiency[2];
    double token_s[2];
    double knee_tokens[2];  /* step tokens above which knee_token_s is added per token */
    double knee_token_s[2];
} kv_device_roofline;

/* The lists of the `roofline` section as read: per phase floor_ms, efficiency, token_us, then
   prefill_knee_tokens and prefill_knee_token_us (these two may be absent: the knee is off). */
#define KV_DEVICE_ROOFLINE_LISTS 8

/* An accelerator, as the roofline sees it. */
typedef struct kv_device_profile {
    char *name;
    char *vendor;
    double memory_gb;         /* device memory, GB (1e9 bytes) */
    double hbm_bandwidth_gbs; /* GB/s */
    double bf16_tflops;       /* dense, no sparsity */
    double fp32_tflops;
    double int8_tops;
    double compute_efficiency; /* fraction of peak FLOP/s reached by large GEMMs */
    double memory_efficiency;  /* fraction of peak bandwidth reached by streaming kernels */
    double kernel_overhead_s;  /* fixed cost per launched step (launch + sync) */
    double nic_bandwidth_gbps; /* typical NIC for this part (informative) */
    double interconnect_gbs;   /* scale-up link (NVLink, Infinity Fabric, HCCS) per device and direction, GB/s */
    double allreduce_latency_s;/* fixed cost of one tensor-parallel all-reduce */
    char *source;              /* datasheet */
    kv_intlist roofline_tp;    /* the `roofline` section as read (parallel lists) */
    kv_doublelist roofline_lists[KV_DEVICE_ROOFLINE_LISTS];
    kv_device_roofline *roofline; /* one entry per roofline_tp item (owned; NULL when none) */
    size_t n_roofline;
} kv_device_profile;

/* Loads a card/profile by name (looked up under <dir>/models or <dir>/devices
   for each search dir) or by path (if it contains '/' or ends in .yaml).
   `where` is the scenario position of the key, for messages. */
int kv_model_card_load(const char *name_or_path, const char *const *search_dirs, int n_dirs, const char *where,
                       kv_model_card *out, kv_error *err);
void kv_model_card_free(kv_model_card *m);
int kv_device_profile_load(const char *name_or_path, const char *const *search_dirs, int n_dirs, const char *where,
                           kv_device_profile *out, kv_error *err);
void kv_device_profile_free(kv_device_profile *d);
/* d's roofline entry for tp, or NULL. */
const kv_device_roofline *kv_device_roofline_find(const kv_device_profile *d, int tp);

/* The references, for kvsim help cards. */
void kv_cards_print_reference(FILE *out);

/* Derived figures. */
double kv_model_kv_values_per_token(const kv_model_card *m); /* 2 * layers * kv_heads * head_dim */
double kv_model_weight_bytes(const kv_model_card *m);

#endif
