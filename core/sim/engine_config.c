/* engine_config.c — the scenario, read once into what the engine needs (core/sim/engine_config.h). */
#include "core/sim/engine_config.h"

#include <string.h>


static kv_diffkv_scores score_kind(kv_diffkv_scores_from from)
{
    switch (from) {
    case KV_DIFFKV_FROM_FIXED: return KV_DIFFKV_SCORES_FIXED;
    case KV_DIFFKV_FROM_LOGNORMAL: return KV_DIFFKV_SCORES_LOGNORMAL;
    case KV_DIFFKV_FROM_MEASURED: break;
    }
    return KV_DIFFKV_SCORES_MEASURED;
}

static kv_engine_pool pool(const kv_pool_config *p, const kv_device_profile *device, double weights)
{
    return (kv_engine_pool){.nodes = p->nodes, .tp = p->tp, .max_batch_tokens = p->max_batch_tokens,
                            .max_batch = p->max_batch, .device = device,
                            .kv_capacity_bytes = device->memory_gb * 1e9 * p->memory_fraction * p->tp - weights};
}

/* The model's weights must leave room for KV on the decode nodes, and fit on the prefill nodes. */
static int check_weights(const kv_scenario *s, const kv_engine_config *cfg, double weights, kv_error *err)
{
    char w[512];
    const kv_model_card *m = cfg->model;
    const kv_pool_config *d = &s->cluster.decode;
    if (cfg->decode.kv_capacity_bytes <= 0)
        return kv_error_set(err, KV_EINPUT,
                            "%s: cluster.decode: %s's weights (%.3g GB) do not fit in %d x %s (%.3g GB usable); "
                            "raise cluster.decode.tp",
                            kv_scenario_where(s, "cluster.decode", w, sizeof w), m->name, weights / 1e9, d->tp,
                            s->decode_device.name, s->decode_device.memory_gb * d->memory_fraction * d->tp);
    if (cfg->prefill.kv_capacity_bytes <= 0 && !cfg->colocated)
        return kv_error_set(err, KV_EINPUT, "%s: cluster.prefill: %s's weights (%.3g GB) do not fit; raise "
                            "cluster.prefill.tp", kv_scenario_where(s, "cluster.prefill", w, sizeof w), m->name,
                            weights / 1e9);
    return KV_OK;
}

int kv_engine_config_build(const kv_scenario *s, kv_engine_config *cfg, kv_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->source = s->path;
    cfg->model = &s->model_card;
    cfg->seed = (uint64_t)s->seed;
    double weights = kv_model_weight_bytes(cfg->model);
    cfg->prefill = pool(&s->cluster.prefill, &s->prefill_device, weights);
    cfg->decode = pool(&s->cluster.decode, &s->decode_device, weights);
    cfg->colocated = s->cluster.colocated;
    cfg->accept_p = s->lynx.acceptance;
    cfg->accept_pos = s->lynx.acceptance_per_position.items;
    cfg->n_accept_pos = s->lynx.acceptance_per_position.count;
    cfg->ttkt_k = s->lynx.ttkt_k;
    cfg->acceptance_measured = s->lynx.from == KV_LYNX_FROM_REFERENCE_MODEL;
    cfg->score_model = (kv_diffkv_score_model){
        .kind = score_kind(s->diffkv.scores), .sigma = s->diffkv.score_sigma,
        .head_spread = s->diffkv.head_spread, .high_fraction = s->diffkv.high_fraction,
        .low_fraction = s->diffkv.low_fraction};
    cfg->memory = s->memory;
    cfg->step_floor_s[0] = s->timing.roofline.prefill_floor_ms * 1e-3;
    cfg->step_floor_s[1] = s->timing.roofline.decode_floor_ms * 1e-3;
    cfg->step_efficiency[0] = s->timing.roofline.prefill_efficiency;
    cfg->step_efficiency[1] = s->timing.roofline.decode_efficiency;
    cfg->timing_backend = s->timing.backend;
    int rc = check_weights(s, cfg, weights, err);
    if (!rc && !cfg->colocated)
        rc = kv_engine_net_config(s, &cfg->net, cfg->platform_path, sizeof cfg->platform_path, err);
    return rc;
}
