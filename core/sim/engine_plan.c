/* engine_plan.c — one request's plan, asked of the policy when each decision takes effect: its transfer plan
   (at prefill start), its encodings, the bytes of each plane and the encode and merge kernel costs (at prefill
   end), and its speculation (when decoding on the anchor starts). docs/policies.md, "When each hook runs". */
#include <math.h>
#include <string.h>

#include "core/kv/kvbytes.h"
#include "core/policy/encset.h"
#include "core/sim/engine_internal.h"
#include "core/sim/kvcache.h"
#include "core/timing/timing.h"

/* ---- Encoding: bytes and kernel costs of one request ----------------------------------------- */

int kv_engine_plan_transfer(engine *e, request *r)
{
    kv_policy_request pr = policy_request(r);
    int rc = kv_policy_transfer(e->policy, &pr, &r->plan, e->err);
    if (rc)
        return rc;
    r->layers_total = r->plan.layerwise ? e->cfg->model->layers : 1;
    r->transfer_planned = true;
    return KV_OK;
}

int kv_engine_plan_speculation(engine *e, request *r)
{
    kv_policy_request pr = policy_request(r);
    int rc = kv_policy_speculation(e->policy, &pr, &r->spec_k, e->err);
    if (rc)
        return rc;
    r->speculative = r->split && r->spec_k > 0 && !e->colocated;
    if (r->speculative && e->cfg->acceptance_measured && !e->accept_from_run)
        /* No silent fallback to the fixed lynx.acceptance: say why and what to do. */
        return kv_error_set_key(e->err, KV_EINPUT, "lynx.from",
                                "lynx.from: %s: policy %s speculates %d tokens on request %llu (%d prompt tokens) "
                                "but has no measured acceptance: its speculate hook answered 0, or its encoding had "
                                "no anchor/residual split, on the probe requests its acceptance was %s. Make the "
                                "hook speculate there too, or use the fixed lynx.acceptance with --set "
                                "lynx.from=scenario (results.json then says so)",
                                e->cfg->acceptance_from, kv_policy_name(e->policy), r->spec_k,
                                (unsigned long long)r->spec.id,
                                r->spec.prompt_tokens,
                                strcmp(e->cfg->acceptance_from, "file") == 0
                                    ? "looked up with (the workload's median prompt, in the stats file)"
                                    : "measured with (the workload's prompt lengths)");
    return KV_OK;
}

int kv_engine_plan_encoding(engine *e, request *r)
{
    const kv_model_card *m = e->cfg->model;
    kv_policy_request pr = policy_request(r);
    double anchor = 0, residual = 0, kept = 0;
    int tokens = r->spec.prompt_tokens;
    int heads = m->layers * m->kv_heads;
    /* The encodings of every (layer, KV head): asked once per run when no answer reads the request. */
    if (!e->encs)
        e->encs = kv_encset_create(m->layers, m->kv_heads);
    const kv_encoding *enc = NULL;
    int rc = kv_encset_fill(e->encs, e->policy, &e->model, &pr, &enc, e->err);
    if (!rc) /* DiffKV's bytes come from its cache below */
        kv_encset_bytes(e->encs, tokens, m->head_dim, &anchor, &residual, &kept);
    if (!rc) {
        /* Its KV on the decode node; DiffKV's tiers are decided here, at the end of prefill. */
        uint64_t gen = kv_encset_generation(e->encs);
        if (e->cache_proto_gen != 0 && e->cache_proto_gen == gen) {
            kv_cache_init_like(&r->cache, &e->cache_proto); /* same encodings as the last request */
        } else {
            kv_rng seed_rng;
            kv_rng_fork(&e->base_rng, (r->spec.id + 1) ^ 0xd1ffc0de5eedULL, &seed_rng);
            rc = kv_cache_init(&r->cache, enc, heads, m->head_dim, &e->score_model, e->head_model,
                               kv_rng_u64(&seed_rng), e->err);
            if (!rc && kv_encset_fixed(e->encs) && r->cache.kind != KV_CACHE_DIFFKV) {
                kv_cache_free(&e->cache_proto);
                kv_cache_init_like(&e->cache_proto, &r->cache);
                e->cache_proto_gen = gen;
            }
        }
        if (rc)
            kv_error_prefix(e->err, "%s: policy %s, request %llu: ", e->cfg->source, kv_policy_name(e->policy),
                            (unsigned long long)r->spec.id);
    }
    if (!rc && r->cache.kind == KV_CACHE_DIFFKV && e->score_model.kind == KV_DIFFKV_SCORES_MEASURED &&
        !e->score_model.table.z_exit) {
        rc = kv_error_set_key(e->err, KV_EINPUT, "diffkv.scores", "diffkv.scores: measured: no significance table was "
                              "measured for policy %s (set diffkv.scores: lognormal for the lognormal stand-in)",
                              kv_policy_name(e->policy));
    }
    if (!rc && r->cache.kind == KV_CACHE_DIFFKV) {
        /* Only the kept tiers travel, each at its precision, with their scores and positions. */
        kv_cache_wire_bytes(&r->cache, enc, m->head_dim, tokens, &anchor, &kept);
        residual = 0;
    }
    if (rc)
        return rc;
    r->cache_made = true;
    kv_engine_diffkv_band(e, r);
    kv_cache_set_tokens(&r->cache, tokens, e->colocated);
    r->split = residual > 0;
    r->full_per_token = (anchor + residual) / tokens;
    r->anchor_per_token = anchor / tokens;
    /* Encode reads the bf16 KV and writes the planes; merge reads both planes and writes the codes. */
    double values = kv_model_kv_values_per_token(m) * tokens;
    if (e->costs.encode_s_per_value > 0)
        r->encode_s = values * e->costs.encode_s_per_value; /* measured on a backend */
    else
        r->encode_s = kv_timing_encode_seconds(&e->prefill_timing, values * 2.0 + anchor + residual);
    if (!r->split)
        r->merge_s = 0;
    else if (e->costs.decode_s_per_value > 0)
        r->merge_s = values * e->costs.decode_s_per_value;
    else
        r->merge_s = kv_timing_decode_kernel_seconds(&e->decode_timing, 2.0 * (anchor + residual));
    r->res->anchor_bytes = anchor;
    r->res->residual_bytes = residual;
    r->res->kv_stored_bytes = anchor + residual;
    r->res->kept_tokens_fraction = kept / ((double)tokens * m->layers * m->kv_heads);
    r->res->bits = 8.0 * (anchor + residual) / values;
    /* The decode nodes' memory and the network take their shape from the first request planned
       (engine_setup.c); every request's cache is then bound to that memory's pages. */
    if (!e->memory_ready) {
        rc = kv_engine_setup_memory(e, r);
        if (rc)
            return rc;
    }
    if (e->dnodes && e->dnodes[0].mem) {
        rc = kv_cache_bind(&r->cache, e->dnodes[0].mem, e->err);
        if (rc)
            return kv_error_prefix(e->err, "%s: policy %s, request %llu: ", e->cfg->source, kv_policy_name(e->policy),
                                   (unsigned long long)r->spec.id);
    }
    if (!e->net_ready) {
        rc = kv_engine_setup_network(e, r);
        if (rc)
            return rc;
    }
    return KV_OK;
}
