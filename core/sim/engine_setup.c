/* engine_setup.c — a run's engine made ready: acceptance, significance, timing, nodes, requests, memory, network. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/sim/engine_internal.h"

void kv_engine_free(engine *e)
{
    if (e->policy)
        kv_policy_set_view(e->policy, NULL); /* it points into this engine */
    for (int i = 0; i < e->n_pnodes; i++) {
        kv_free(e->pnodes[i].queue);
        kv_free(e->pnodes[i].batch);
    }
    for (int i = 0; i < e->n_dnodes; i++) {
        kv_free(e->dnodes[i].wait);
        kv_free(e->dnodes[i].running);
        kv_mem_destroy(e->dnodes[i].mem);
    }
    for (size_t i = 0; i < e->n_reqs; i++)
        kv_cache_free(&e->reqs[i].cache);
    kv_free(e->pnodes);
    kv_free(e->dnodes);
    kv_free(e->reqs);
    kv_free(e->head_model);
    kv_encset_destroy(e->encs);
    kv_cache_free(&e->cache_proto);
    kv_free(e->scratch);
    kv_free(e->shorts);
    kv_free(e->short_from);
    if (e->own_be)
        kv_backend_close(e->be);
    kv_free(e->host_tracks);
    kv_free(e->view_nodes);
    kv_net_destroy(e->net);
    kv_eventq_free(&e->q);
}

/* Lynx: the scenario's acceptance, or the one measured for this policy (read at each request's prompt
   length). KV_EINPUT on a curve that breaks its invariants. */
static int setup_acceptance(engine *e, const kv_run_inputs *in, kv_run_result *out)
{
    char why[256];
    if (in->accept_curve && !kv_accept_curve_valid(in->accept_curve, why, (int)sizeof why))
        return kv_error_set(e->err, KV_EINPUT, "measured Lynx acceptance (%s): %s",
                            in->accept_source ? in->accept_source : "no source", why);
    e->accept_p = e->cfg->accept_p;
    e->accept_pos = e->cfg->accept_pos;
    e->n_accept_pos = e->cfg->n_accept_pos;
    snprintf(out->acceptance_source, sizeof out->acceptance_source, "scenario (lynx.acceptance%s)",
             e->n_accept_pos ? "_per_position" : "");
    if (in->accept_curve) {
        e->accept_curve = in->accept_curve;
        e->accept_from_run = true;
        snprintf(out->acceptance_source, sizeof out->acceptance_source, "%s",
                 in->accept_source ? in->accept_source : in->feed_source ? in->feed_source : "reference model");
    }
    e->ttkt_k = e->cfg->ttkt_k;
    return KV_OK;
}

/* DiffKV: where significance comes from, and each (layer, KV head)'s factor and table row. KV_EINPUT on
   a curve that breaks its invariants. */
static int setup_significance(engine *e, const kv_run_inputs *in, kv_run_result *out)
{
    const kv_model_card *m = e->cfg->model;
    char why[256];
    if (in->diffkv_curve && !kv_diffkv_curve_valid(in->diffkv_curve, why, (int)sizeof why))
        return kv_error_set(e->err, KV_EINPUT, "measured DiffKV significance (%s): %s",
                            in->diffkv_source ? in->diffkv_source : "no source", why);
    e->score_model = e->cfg->score_model;
    if (e->score_model.kind == KV_DIFFKV_SCORES_MEASURED && in->diffkv_curve) {
        e->score_model.table = in->diffkv_curve->table[in->diffkv_curve->n_lengths - 1];
        e->score_model.curve = in->diffkv_curve->n_lengths > 1 ? in->diffkv_curve : NULL;
        e->diffkv_curve = in->diffkv_curve;
    }
    snprintf(out->tiers_source, sizeof out->tiers_source, "%s",
             e->score_model.kind == KV_DIFFKV_SCORES_FIXED
                 ? "scenario (diffkv.scores: fixed; diffkv.high_fraction, low_fraction)"
             : e->score_model.kind == KV_DIFFKV_SCORES_LOGNORMAL
                 ? "scenario (diffkv.scores: lognormal; diffkv.score_sigma, head_spread, the policy's alphas)"
             : in->diffkv_source ? in->diffkv_source
                                 : "diffkv.scores: measured (no table: not a DiffKV policy)");
    int n_heads = m->layers * m->kv_heads;
    double *factors = kv_calloc((size_t)n_heads, sizeof *factors);
    kv_diffkv_head_factors(&e->score_model, e->cfg->seed, n_heads, factors);
    e->head_model = kv_calloc((size_t)n_heads, sizeof *e->head_model);
    for (int l = 0; l < m->layers; l++)
        for (int h = 0; h < m->kv_heads; h++) {
            kv_diffkv_head_params *hp = &e->head_model[l * m->kv_heads + h];
            hp->head_factor = factors[l * m->kv_heads + h];
            hp->table_row = e->score_model.table.z_exit
                                ? kv_diffkv_table_row(&e->score_model.table, l, m->layers, h, m->kv_heads)
                                : 0;
        }
    kv_free(factors);
    return KV_OK;
}

/* Operation times: the roofline over each pool's device, scaled by the policy's measured kernel costs
   or replaced by profiled step times. */
static void setup_timing(engine *e, const kv_run_inputs *in, kv_run_result *out)
{
    const kv_model_card *m = e->cfg->model;
    kv_timing_init(&e->prefill_timing, m, e->cfg->prefill.device, e->cfg->prefill.tp);
    kv_timing_init(&e->decode_timing, m, e->cfg->decode.device, e->cfg->decode.tp);
    /* timing.roofline.* apply to a pool whose device profile has no roofline entry for its tp (kv_timing_init
       took the entry's knobs). */
    kv_timing *pools[2] = {&e->prefill_timing, &e->decode_timing};
    for (int p = 0; p < 2; p++)
        for (int ph = 0; ph < 2 && !kv_device_roofline_find(pools[p]->device, pools[p]->tp); ph++) {
            pools[p]->step_floor_s[ph] = e->cfg->step_floor_s[ph];
            pools[p]->step_efficiency[ph] = e->cfg->step_efficiency[ph];
        }
    e->prefill_timing.profile = in->prefill_profile;
    e->decode_timing.profile = in->decode_profile;
    if (in->costs) {
        e->costs = *in->costs;
        if (in->costs->encode_efficiency > 0)
            e->prefill_timing.encode_efficiency = e->decode_timing.encode_efficiency = in->costs->encode_efficiency;
        if (in->costs->decode_efficiency > 0)
            e->prefill_timing.decode_efficiency = e->decode_timing.decode_efficiency = in->costs->decode_efficiency;
        snprintf(out->timing_source, sizeof out->timing_source, "%s", in->costs->source);
    } else {
        snprintf(out->timing_source, sizeof out->timing_source, "model");
    }
}

/* One timeline track per node, per host link and per request. */
static void setup_tracks(engine *e)
{
    e->tl_process = e->tl ? kv_timeline_process(e->tl, kv_policy_name(e->policy)) : 0;
    int hosts = e->n_pnodes + e->n_dnodes;
    e->host_tracks = kv_calloc((size_t)hosts, sizeof *e->host_tracks);
    if (!e->tl)
        return;
    char name[64];
    for (int i = 0; i < e->n_pnodes && !e->colocated; i++) {
        snprintf(name, sizeof name, "prefill %d", i);
        e->pnodes[i].track = kv_timeline_track(e->tl, e->tl_process, name);
    }
    for (int i = 0; i < e->n_dnodes; i++) {
        snprintf(name, sizeof name, "decode %d", i);
        e->dnodes[i].track = kv_timeline_track(e->tl, e->tl_process, name);
    }
    for (int i = 0; i < e->n_pnodes && !e->colocated; i++) {
        snprintf(name, sizeof name, "link prefill %d out", i);
        e->host_tracks[i] = kv_timeline_track(e->tl, e->tl_process, name);
    }
    for (int i = 0; i < e->n_dnodes && !e->colocated; i++) {
        snprintf(name, sizeof name, "link decode %d in", i);
        e->host_tracks[e->n_pnodes + i] = kv_timeline_track(e->tl, e->tl_process, name);
    }
    snprintf(name, sizeof name, "%s requests", kv_policy_name(e->policy));
    e->tl_requests = kv_timeline_process(e->tl, name);
}

/* The requests beyond the longest measured lengths of the policy's curves, and Lynx's band
   (DiffKV's needs the request's encodings: kv_engine_diffkv_band, when its cache is made). */
static void count_beyond(engine *e, kv_run_result *out)
{
    out->accept_held_mean = out->accept_trend_mean = NAN;
    out->diffkv_held_high = out->diffkv_held_low = out->diffkv_trend_high = out->diffkv_trend_low = NAN;
    const kv_accept_curve *a = e->accept_curve;
    const kv_diffkv_curve *d = e->diffkv_curve;
    if (a)
        out->accept_longest_tokens = a->lengths[a->n_lengths - 1];
    if (d)
        out->diffkv_longest_tokens = d->lengths[d->n_lengths - 1];
    for (size_t i = 0; i < e->n_reqs; i++) {
        const kv_request_spec *sp = &e->reqs[i].spec;
        if (a && sp->prompt_tokens > out->accept_longest_tokens) {
            out->accept_beyond_requests++;
            if (sp->prompt_tokens > out->accept_beyond_max_tokens)
                out->accept_beyond_max_tokens = sp->prompt_tokens;
        }
        int64_t context = (int64_t)sp->prompt_tokens + sp->output_tokens;
        if (d && context > out->diffkv_longest_tokens) {
            out->diffkv_beyond_requests++;
            int ctx = context > INT32_MAX ? INT32_MAX : (int)context;
            if (ctx > out->diffkv_beyond_max_tokens)
                out->diffkv_beyond_max_tokens = ctx;
        }
    }
    if (e->n_reqs > 0) {
        out->accept_beyond_share = (double)out->accept_beyond_requests / (double)e->n_reqs;
        out->diffkv_beyond_share = (double)out->diffkv_beyond_requests / (double)e->n_reqs;
    }
    if (a) {
        double held = 0, trend = 0;
        for (int j = 0; j < a->positions; j++) {
            held += a->accept[a->n_lengths - 1][j] / a->positions;
            trend += kv_accept_curve_trend(a, j, out->accept_beyond_max_tokens) / a->positions;
        }
        if (out->accept_beyond_requests > 0) {
            out->accept_held_mean = held;
            out->accept_trend_mean = trend;
        }
    }
}

void kv_engine_diffkv_band(engine *e, const request *r)
{
    kv_run_result *out = e->out;
    int64_t context = (int64_t)r->spec.prompt_tokens + r->spec.output_tokens;
    if (!e->diffkv_curve || r->cache.kind != KV_CACHE_DIFFKV || !r->cache.dkv || !isnan(out->diffkv_held_high) ||
        context != out->diffkv_beyond_max_tokens)
        return; /* one request of the longest context gives the band */
    kv_diffkv_seq_prefill_shares(r->cache.dkv, out->diffkv_longest_tokens, false, &out->diffkv_held_high,
                                 &out->diffkv_held_low);
    kv_diffkv_seq_prefill_shares(r->cache.dkv, out->diffkv_beyond_max_tokens, true, &out->diffkv_trend_high,
                                 &out->diffkv_trend_low);
}

/* Every request of the workload, its arrival queued; the policy plans each as it runs (engine_plan.c). */
static int setup_requests(engine *e, const kv_workload *workload, kv_run_result *out)
{
    size_t n = kv_workload_count(workload);
    e->n_reqs = n;
    e->reqs = kv_calloc(n ? n : 1, sizeof *e->reqs);
    if (!out->requests_shared) /* else the caller's mapping, zeroed, for n (kv_engine_run) */
        out->requests = kv_calloc(n ? n : 1, sizeof *out->requests);
    out->n_requests = n;
    for (size_t i = 0; i < n; i++) {
        request *r = &e->reqs[i];
        r->spec = *kv_workload_get(workload, i);
        r->res = &out->requests[i];
        kv_request_result *res = r->res;
        *res = (kv_request_result){.id = r->spec.id, .prompt_tokens = r->spec.prompt_tokens,
                                   .output_tokens = r->spec.output_tokens, .prefill_node = -1, .decode_node = -1,
                                   .arrival_s = r->spec.arrival_s, .prefill_start_s = -1, .prefill_end_s = -1,
                                   .encode_end_s = -1, .anchor_arrived_s = -1, .kv_arrived_s = -1,
                                   .admitted_s = -1, .first_spec_s = -1, .first_token_s = -1, .kth_token_s = -1,
                                   .done_s = -1, .second_commit_s = -1, .kept_tokens_fraction = 1,
                                   .tier_high_fraction = NAN, .tier_low_fraction = NAN, .tier_pruned_fraction = NAN};
        kv_rng_fork(&e->base_rng, r->spec.id + 1, &r->rng);
        r->plane_start_s[0] = r->plane_start_s[1] = -1;
        r->enqueued_s = r->spec_start_s = r->verify_start_s = r->verify_end_s = -1;
        if (e->tl) {
            char name[48];
            snprintf(name, sizeof name, "request %llu", (unsigned long long)r->spec.id);
            r->track = kv_timeline_track(e->tl, e->tl_requests, name);
        }
        r->slot = -1;
        r->prefill_tokens = r->spec.prompt_tokens;
        r->prefilled = !e->colocated; /* disaggregated: the KV arrives computed */
        kv_eventq_push(&e->q, r->spec.arrival_s, EV_ARRIVAL, (int)i, 0);
    }
    count_beyond(e, out);
    return KV_OK;
}

/* Paged KV memory on every decode node, made when the first request is planned: the page size fits that
   request's tiers (kvmem.h), as it did when every request was planned before the run; later requests with
   other encodings bind their own tokens per page to it (kv_cache_bind), page tables per (layer, KV head)
   where a whole token does not fit a page. */
int kv_engine_setup_memory(engine *e, const request *first)
{
    kv_run_result *out = e->out;
    kv_error *err = e->err;
    e->memory_ready = true;
    out->kv_page_bytes = out->kv_pages_capacity = 0;
    const kv_cache *c0 = &first->cache;
    e->charge_manager = c0->kind == KV_CACHE_DIFFKV;
    kv_mem_config mc = {.capacity_bytes = e->cfg->decode.kv_capacity_bytes, .tiers = 2,
                        .token_bytes = {c0->token_bytes[0], c0->token_bytes[1]},
                        .heads = c0->tables, .min_page_tokens = e->cfg->memory.page_tokens_min,
                        .max_page_tokens = e->cfg->memory.page_tokens_max, .align_bytes = 32};
    for (int i = 0; i < e->n_dnodes; i++) {
        int rc = kv_mem_create(e->be, &mc, &e->dnodes[i].mem, err);
        if (rc) {
            kv_error_prefix(err, "memory: ");
            return kv_error_keyed(err, "memory"); /* the study puts memory's position in front */
        }
    }
    out->kv_page_bytes = kv_mem_page_bytes(e->dnodes[0].mem);
    out->kv_pages_capacity = kv_mem_capacity_pages(e->dnodes[0].mem);
    for (int t = 0; t < 2; t++)
        out->kv_tokens_per_page[t] = t < c0->tiers ? (int)kv_mem_tokens_per_page(e->dnodes[0].mem, t) : 0;
    return KV_OK;
}

/* The network between the pools, with the policy's priority classes (none when colocated), made when the
   first request is planned (first: NULL when the workload is empty). */
int kv_engine_setup_network(engine *e, const request *first)
{
    kv_run_result *out = e->out;
    e->net_ready = true;
    if (e->colocated) {
        snprintf(out->network, sizeof out->network, "none (colocated)");
        return KV_OK;
    }
    kv_net_config cfg = e->cfg->net;
    /* Priority classes are a property of the network: take the policy's (first request's) plan. */
    if (first && first->split) {
        cfg.priority = (kv_priority_mode)first->plan.priority_mode;
        cfg.class_weight[0] = first->plan.anchor_weight > 0 ? first->plan.anchor_weight : 1;
        cfg.class_weight[1] = first->plan.residual_weight > 0 ? first->plan.residual_weight : 1;
    }
    int rc = kv_net_host_create(e->host, &cfg, kv_engine_on_flow_done, e, &e->net, e->err);
    if (rc)
        return rc;
    snprintf(out->network, sizeof out->network, "%s", kv_net_name(e->net));
    return KV_OK;
}

int kv_engine_setup(engine *e, const kv_run_inputs *in, kv_net_host *host, kv_run_result *out, kv_error *err)
{
    const kv_engine_config *c = in->config;
    e->cfg = c;
    e->host = host;
    e->policy = in->policy;
    e->err = err;
    e->out = out;
    e->tl = in->timeline;
    e->colocated = c->colocated;
    int rc = setup_acceptance(e, in, out);
    if (!rc)
        rc = setup_significance(e, in, out);
    if (rc)
        return rc;
    if (in->backend) {
        e->be = in->backend;
    } else {
        int rc = kv_backend_open(c->timing_backend, 0, &e->be, err);
        if (rc) {
            kv_error_prefix(err, "timing.backend (the decode nodes' memory managers run there): ");
            return kv_error_keyed(err, "timing.backend");
        }
        e->own_be = true;
    }
    const kv_model_card *m = c->model;
    e->model = (kv_policy_model){m->name, m->layers, m->heads, m->kv_heads, m->head_dim};
    kv_policy_set_model(e->policy, &e->model); /* every hook, placement ones too, sees ctx.model */
    setup_timing(e, in, out);
    kv_eventq_init(&e->q);
    kv_rng_seed(&e->base_rng, c->seed);

    e->n_pnodes = c->prefill.nodes;
    e->n_dnodes = c->decode.nodes;
    e->pnodes = kv_calloc((size_t)e->n_pnodes, sizeof *e->pnodes);
    e->dnodes = kv_calloc((size_t)e->n_dnodes, sizeof *e->dnodes);
    out->kv_mem_capacity_bytes = c->decode.kv_capacity_bytes;
    for (int i = 0; i < e->n_dnodes; i++)
        e->dnodes[i].kv_capacity_bytes = c->decode.kv_capacity_bytes;
    setup_tracks(e);
    rc = setup_requests(e, in->workload, out);
    if (!rc && e->n_reqs == 0)
        rc = kv_engine_setup_network(e, NULL); /* nothing will be planned: the empty run's network */
    if (!rc)
        kv_engine_view_install(e);
    return rc;
}

