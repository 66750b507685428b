/* engine_config.c — the scenario, read once into what the engine needs (core/sim/engine_config.h). */
#include "core/sim/engine_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>


static kv_diffkv_scores score_kind(kv_diffkv_scores_from from)
{
    switch (from) {
    case KV_DIFFKV_FROM_FIXED: return KV_DIFFKV_SCORES_FIXED;
    case KV_DIFFKV_FROM_LOGNORMAL: return KV_DIFFKV_SCORES_LOGNORMAL;
    case KV_DIFFKV_FROM_MEASURED:
    case KV_DIFFKV_FROM_FILE: break;
    }
    return KV_DIFFKV_SCORES_MEASURED;
}

static kv_engine_pool pool(const kv_pool_config *p, const kv_device_profile *device, double weights)
{
    return (kv_engine_pool){.nodes = p->nodes, .tp = p->tp, .max_batch_tokens = p->max_batch_tokens,
                            .max_batch = p->max_batch, .device = device,
                            .kv_capacity_bytes = device->memory_gb * 1e9 * p->memory_fraction * p->tp - weights};
}

/* One pool: its devices must hold the weights at its TP degree with room left for KV. */
static int check_pool_weights(const kv_scenario *s, const char *pool, const kv_pool_config *p,
                              const kv_device_profile *d, kv_error *err)
{
    const kv_model_card *m = &s->model_card;
    double weights = kv_model_weight_bytes(m), usable = d->memory_gb * 1e9 * p->memory_fraction;
    double share = weights / p->tp;
    if (share < usable)
        return KV_OK;
    char k_tp[64], k_pool[64], k_dev[64], w[512];
    snprintf(k_tp, sizeof k_tp, "cluster.%s.tp", pool);
    snprintf(k_dev, sizeof k_dev, "cluster.%s.device", pool);
    snprintf(k_pool, sizeof k_pool, "cluster.%s", pool);
    const char *keys[] = {k_tp, k_dev, k_pool, "model"}, *key = NULL;
    kv_scenario_where_first(s, keys, 4, &key, w, sizeof w);
    int need = (int)floor(weights / usable) + 1; /* the smallest tp whose share is below usable */
    return kv_error_set(err, KV_EINPUT,
                        "%s: %s: %s's weights (%.1f GB, %.1f GB per device at tp %d) do not fit one %s "
                        "(%.1f GB usable: %.0f GB x memory_fraction %.2g); raise cluster.%s.tp to at least %d",
                        w, key, m->name, weights / 1e9, share / 1e9, p->tp, d->name, usable / 1e9, d->memory_gb,
                        p->memory_fraction, pool, need);
}

int kv_engine_check_weights(const kv_scenario *s, kv_error *err)
{
    int rc = check_pool_weights(s, "decode", &s->cluster.decode, &s->decode_device, err);
    if (!rc && !s->cluster.colocated)
        rc = check_pool_weights(s, "prefill", &s->cluster.prefill, &s->prefill_device, err);
    return rc;
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
    cfg->acceptance_measured = s->lynx.from != KV_LYNX_FROM_SCENARIO;
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
    int rc = kv_engine_check_weights(s, err);
    if (!rc && !cfg->colocated)
        rc = kv_engine_net_config(s, &cfg->net, cfg->platform_path, sizeof cfg->platform_path, err);
    return rc;
}
