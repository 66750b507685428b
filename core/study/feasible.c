/* feasible.c — kvsim validate's feasibility checks: weights, context, KV memory (core/study/feasible.h). */
#include "core/study/feasible.h"

#include <math.h>
#include <string.h>

#include "core/kv/kvbytes.h"
#include "core/sim/engine_config.h"

/* A warning: printed, or the error when strict. */
static int warn(bool strict, FILE *log, kv_error *err, const char *msg)
{
    if (strict)
        return kv_error_set(err, KV_EINPUT, "%s (an error with --strict)", msg);
    if (log)
        fprintf(log, "kvsim validate: warning: %s\n", msg);
    return KV_OK;
}

static double usable_bytes(const kv_device_profile *d, const kv_pool_config *p)
{
    return d->memory_gb * 1e9 * p->memory_fraction;
}

/* One pool's weights and activations against one device: a warning (the weights alone are
   kv_engine_check_weights's, core/sim/engine_config.h). */
static int check_pool(const kv_scenario *s, const char *pool, const kv_pool_config *p, const kv_device_profile *d,
                      bool strict, FILE *log, kv_error *err)
{
    const kv_model_card *m = &s->model_card;
    char k_tp[64], k_pool[64], k_dev[64], w[512], msg[1024];
    snprintf(k_tp, sizeof k_tp, "cluster.%s.tp", pool);
    snprintf(k_dev, sizeof k_dev, "cluster.%s.device", pool);
    snprintf(k_pool, sizeof k_pool, "cluster.%s", pool);
    const char *keys[] = {k_tp, k_dev, k_pool, "model"}, *key = NULL;
    kv_scenario_where_first(s, keys, 4, &key, w, sizeof w);
    double share = kv_model_weight_bytes(m) / p->tp, usable = usable_bytes(d, p);
    double tokens = p->max_batch_tokens;
    double act = tokens * 2.0 * (4.0 * m->hidden + 3.0 * m->ffn / p->tp);
    if (share + act > usable) {
        snprintf(msg, sizeof msg,
                 "%s: %s: %s's weights (%.1f GB per device at tp %d) and activations of a %d-token batch (about "
                 "%.1f GB) do not fit one %s (%.1f GB usable); raise cluster.%s.tp or lower cluster.%s."
                 "max_batch_tokens",
                 w, key, m->name, share / 1e9, p->tp, p->max_batch_tokens, act / 1e9, d->name, usable / 1e9, pool,
                 pool);
        return warn(strict, log, err, msg);
    }
    return KV_OK;
}

/* Requests whose prompt + output exceed the model's context. */
static int check_context(const kv_scenario *s, const kv_workload *wl, bool strict, FILE *log, kv_error *err)
{
    size_t n = kv_workload_count(wl), over = 0;
    long longest = 0;
    for (size_t i = 0; i < n; i++) {
        const kv_request_spec *r = kv_workload_get(wl, i);
        long need = (long)r->prompt_tokens + r->output_tokens;
        if (need > s->model_card.max_context)
            over++;
        if (need > longest)
            longest = need;
    }
    if (!over || s->workload.fit_context) /* fit_context: the requests are cut to the context, as asked */
        return KV_OK;
    const char *trace_keys[] = {"workload.trace.path", "workload"};
    const char *synth_keys[] = {"workload.prompt", "workload.output", "workload"};
    const char *key = NULL;
    char w[512], msg[1024];
    if (s->workload.trace.format != KV_WORKLOAD_TRACE_NONE)
        kv_scenario_where_first(s, trace_keys, 2, &key, w, sizeof w);
    else
        kv_scenario_where_first(s, synth_keys, 3, &key, w, sizeof w);
    snprintf(msg, sizeof msg,
             "%s: %s: %zu of %zu requests need more than %s's context of %d tokens (prompt + output, up to %ld; "
             "prompts longer than the context are cut to it; workload.fit_context: true cuts prompt + output)",
             w, key, over, n, s->model_card.name, s->model_card.max_context, longest);
    if (over == n)
        return kv_error_set(err, KV_EINPUT, "%s", msg);
    return warn(strict, log, err, msg);
}

/* Bytes of a request's KV at `tokens` tokens as the policy encodes it. */
static int request_kv_bytes(const kv_scenario *s, kv_policy *p, const kv_request_spec *r, int tokens, double *bytes,
                            kv_error *err)
{
    const kv_model_card *m = &s->model_card;
    const kv_policy_model pm = {m->name, m->layers, m->heads, m->kv_heads, m->head_dim};
    const kv_policy_request pr = {r->id, r->prompt_tokens, r->output_tokens, r->arrival_s};
    const kv_tier_split tiers = {s->diffkv.high_fraction, s->diffkv.low_fraction};
    *bytes = 0;
    for (int l = 0; l < m->layers; l++)
        for (int h = 0; h < m->kv_heads; h++) {
            kv_encoding e;
            int rc = kv_policy_encoding(p, &pm, &pr, l, h, &e, err);
            if (rc)
                return rc;
            kv_head_bytes hb;
            kv_encoding_bytes(&e, tokens, m->head_dim, e.diffkv ? &tiers : NULL, &hb);
            *bytes += hb.anchor + hb.residual;
        }
    return KV_OK;
}

/* The smallest and the largest request (by prompt + output) against a decode node's KV memory. */
static int check_kv(const kv_scenario *s, const kv_workload *wl, kv_policy *const *policies, size_t n_pol,
                    bool strict, FILE *log, kv_error *err)
{
    size_t n = kv_workload_count(wl);
    if (!n)
        return KV_OK;
    const kv_request_spec *small = kv_workload_get(wl, 0), *large = small;
    for (size_t i = 1; i < n; i++) {
        const kv_request_spec *r = kv_workload_get(wl, i);
        long need = (long)r->prompt_tokens + r->output_tokens;
        if (need < (long)small->prompt_tokens + small->output_tokens)
            small = r;
        if (need > (long)large->prompt_tokens + large->output_tokens)
            large = r;
    }
    const kv_pool_config *d = &s->cluster.decode;
    double capacity = (usable_bytes(&s->decode_device, d) * d->tp - kv_model_weight_bytes(&s->model_card)) *
                      (1.0 - s->memory.watermark);
    const char *keys[] = {"cluster.decode.tp", "cluster.decode.device", "cluster.decode", "model"}, *key = NULL;
    char w[512], msg[1024];
    kv_scenario_where_first(s, keys, 4, &key, w, sizeof w);
    for (size_t i = 0; i < n_pol; i++) {
        const char *name = s->policies.items[i];
        double b_small = 0, b_large = 0;
        int t_small = small->prompt_tokens + small->output_tokens, t_large = large->prompt_tokens + large->output_tokens;
        int rc = request_kv_bytes(s, policies[i], small, t_small, &b_small, err);
        if (!rc)
            rc = request_kv_bytes(s, policies[i], large, t_large, &b_large, err);
        if (rc)
            return rc;
        if (b_small > capacity)
            return kv_error_set(err, KV_EINPUT,
                                "%s: %s: policy %s: not even the smallest request's KV (%d tokens, %.2f GB) fits a "
                                "decode node's KV memory (%.2f GB: %d x %s less the weights and memory.watermark); "
                                "raise cluster.decode.tp or use shorter requests",
                                w, key, name, t_small, b_small / 1e9, capacity / 1e9, d->tp, s->decode_device.name);
        if (b_large > capacity) {
            snprintf(msg, sizeof msg,
                     "%s: %s: policy %s: the largest request's KV (%d tokens, %.2f GB) does not fit a decode node's "
                     "KV memory (%.2f GB)", w, key, name, t_large, b_large / 1e9, capacity / 1e9);
            rc = warn(strict, log, err, msg);
            if (rc)
                return rc;
        }
    }
    return KV_OK;
}

int kv_study_feasible(const kv_scenario *s, const kv_workload *wl, kv_policy *const *policies, size_t n,
                      bool strict, FILE *log, kv_error *err)
{
    int rc = kv_engine_check_weights(s, err);
    if (!rc && !s->cluster.colocated)
        rc = check_pool(s, "prefill", &s->cluster.prefill, &s->prefill_device, strict, log, err);
    if (!rc)
        rc = check_pool(s, "decode", &s->cluster.decode, &s->decode_device, strict, log, err);
    if (!rc)
        rc = check_context(s, wl, strict, log, err);
    if (!rc)
        rc = check_kv(s, wl, policies, n, strict, log, err);
    return rc;
}
