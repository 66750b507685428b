/* engine.c — the discrete-event simulation of disaggregated serving, one policy at a time.
 *
 * Design notes.
 *
 * A request moves through these states (colocated runs skip 2-4 and prefill
 * inside the decode batch):
 *
 *   1 ARRIVED ──► 2 PREFILL (batched on a prefill node) ──► 3 ENCODE (policy's
 *   kernels, on the prefill node) ──► 4 TRANSFER (one flow per plane, or per
 *   plane and layer when layer-wise) ──► 5 WAIT (at the decode node, for
 *   memory and a batch slot) ──► 6 DECODE (continuous batching) ──► 7 DONE
 *
 * Lynx (a policy whose encoding splits anchor and residual planes and whose
 * speculate hook returns k > 0) enters WAIT when its anchor plane has
 * arrived. In DECODE it then speculates on anchor-only KV, one token per step,
 * up to k tokens, stalling if the residual is still in flight. When the
 * residual has arrived, its next step pays the merge kernel and verifies the
 * speculated tokens (costed like a k-token prefill over the context); the
 * longest accepted prefix plus one corrected token is committed, the rest is
 * wasted, and the request continues as a normal one.
 *
 * Invariants (checked where they can break):
 *  1. The simulated clock never decreases (eventq.c aborts on a push into the past).
 *  2. A token is committed only by a normal decode step, a prefill step
 *     (colocated), or a verification; speculated tokens are never counted as
 *     committed unless a verification accepted them.
 *  3. A decode node's KV bytes in use never exceed its capacity.
 *  4. Every request ends DONE, or the run fails saying which request is stuck.
 *
 * Determinism: events tie-break on push order; flows complete in the
 * network's deterministic order; every random draw comes from a stream forked
 * from the scenario seed by request id, so all policies see the same draws.
 */
#include "core/engine.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/eventq.h"
#include "core/kvbytes.h"
#include "core/rng.h"
#include "core/timing.h"

enum event_type {
    EV_ARRIVAL = 1,     /* a = request */
    EV_PREFILL_DONE,    /* a = prefill node: its batch (and encodes) finished */
    EV_ENCODE_DONE,     /* a = request: KV encoded, start the transfer */
    EV_LAYER_READY,     /* a = request, b = layer: layer-wise streaming */
    EV_STEP_DONE,       /* a = decode node */
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
    double reserved_bytes;  /* KV memory held on the decode node */
    int layers_total;       /* flows per plane: layers when layer-wise, else 1 */
    int anchor_pending, residual_pending;
    bool anchor_done, residual_done, merge_pending;
    bool prefilled;         /* colocated: prefill step done */
    int committed, speculated;
    int action;             /* enum step_action of the step in progress */
    double last_commit_s;
    double transfer_start_s;
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
    double kv_used_bytes, kv_capacity_bytes;
    int track;
} decode_node;

typedef struct engine {
    const kv_scenario *s;
    kv_policy *policy;
    kv_policy_model model;
    kv_timing prefill_timing, decode_timing;
    kv_eventq q;
    double now_s;           /* the simulated clock: last event or flow completion handled */
    kv_net *net;
    kv_rng base_rng;
    request *reqs;
    size_t n_reqs;
    prefill_node *pnodes;
    decode_node *dnodes;
    int n_pnodes, n_dnodes;
    bool colocated;
    double accept_p;        /* lynx.acceptance */
    const kv_doublelist *accept_pos;
    int ttkt_k;
    kv_tier_split tiers;
    kv_kernel_costs costs;  /* zeroes: roofline */
    kv_run_result *out;
    kv_timeline *tl;
    int tl_process;
    int *host_tracks;       /* timeline track per host NIC (transfers) */
    kv_error *err;
    int failed;             /* first error code; stops the run */
    size_t done_count;
} engine;

/* ---- Small helpers ------------------------------------------------------------------------ */

static void fifo_push(int **items, size_t *head, size_t *n, size_t *cap, int v)
{
    if (*head + *n == *cap && *head > 0) {
        memmove(*items, *items + *head, *n * sizeof **items);
        *head = 0;
    }
    kv_grow((void **)items, sizeof **items, cap, *head + *n + 1);
    (*items)[*head + (*n)++] = v;
}

static int fifo_pop(int *items, size_t *head, size_t *n)
{
    int v = items[*head];
    (*head)++;
    (*n)--;
    if (*n == 0)
        *head = 0;
    return v;
}

static void fail(engine *e, int rc)
{
    if (!e->failed)
        e->failed = rc ? rc : KV_EFAIL;
}

static kv_policy_request policy_request(const request *r)
{
    return (kv_policy_request){r->spec.id, r->spec.prompt_tokens, r->spec.output_tokens, r->spec.arrival_s};
}

static void span(engine *e, int track, const char *name, const char *cat, double t0, double t1, int64_t req)
{
    if (e->tl)
        kv_timeline_span(e->tl, e->tl_process, track, name, cat, t0, t1, req);
}

/* ---- Encoding: bytes and kernel costs of one request ----------------------------------------- */

static int plan_request(engine *e, request *r)
{
    const kv_model_card *m = &e->s->model_card;
    kv_policy_request pr = policy_request(r);
    double anchor = 0, residual = 0, kept = 0;
    int tokens = r->spec.prompt_tokens;
    for (int layer = 0; layer < m->layers; layer++) {
        for (int head = 0; head < m->kv_heads; head++) {
            kv_encoding enc;
            int rc = kv_policy_encoding(e->policy, &e->model, &pr, layer, head, &enc, e->err);
            if (rc)
                return rc;
            kv_head_bytes hb;
            kv_encoding_bytes(&enc, tokens, m->head_dim, &e->tiers, &hb);
            anchor += hb.anchor;
            residual += hb.residual;
            kept += hb.kept_tokens;
        }
    }
    int rc = kv_policy_transfer(e->policy, &pr, &r->plan, e->err);
    if (!rc)
        rc = kv_policy_speculation(e->policy, &pr, &r->spec_k, e->err);
    if (rc)
        return rc;
    r->split = residual > 0;
    r->speculative = r->split && r->spec_k > 0 && !e->colocated;
    r->full_per_token = (anchor + residual) / tokens;
    r->anchor_per_token = anchor / tokens;
    r->reserved_bytes = r->full_per_token * (double)(r->spec.prompt_tokens + r->spec.output_tokens);
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
    r->layers_total = r->plan.layerwise ? m->layers : 1;
    r->res->anchor_bytes = anchor;
    r->res->residual_bytes = residual;
    r->res->kv_stored_bytes = anchor + residual;
    r->res->kept_tokens_fraction = kept / ((double)tokens * m->layers * m->kv_heads);
    return KV_OK;
}

/* ---- Token accounting ------------------------------------------------------------------------ */

static void commit_tokens(engine *e, request *r, int n, double t)
{
    kv_request_result *res = r->res;
    int remaining = r->spec.output_tokens - r->committed;
    if (n > remaining)
        n = remaining;
    if (n <= 0)
        return;
    if (r->committed == 0) {
        res->first_token_s = t;
        if (res->first_spec_s < 0)
            res->first_spec_s = t;
    } else {
        kv_run_result *o = e->out;
        kv_grow((void **)&o->itl_s, sizeof *o->itl_s, &o->cap_itl, o->n_itl + 1);
        o->itl_s[o->n_itl++] = (float)(t - r->last_commit_s);
    }
    if (r->committed < e->ttkt_k && r->committed + n >= e->ttkt_k)
        res->kth_token_s = t;
    r->committed += n;
    r->last_commit_s = t;
    if (r->committed >= r->spec.output_tokens)
        res->done_s = t;
}

/* Conditional acceptance of speculative position i (0-based). */
static double accept_probability(const engine *e, int i)
{
    const kv_doublelist *l = e->accept_pos;
    if (l && l->count > 0)
        return l->items[(size_t)i < l->count ? (size_t)i : l->count - 1];
    return e->accept_p;
}

/* ---- Decode nodes ---------------------------------------------------------------------------- */

static void start_step(engine *e, int d);

static int node_state(engine *e, bool decode, kv_policy_node **out)
{
    int n = decode ? e->n_dnodes : e->n_pnodes;
    kv_policy_node *nodes = kv_calloc((size_t)n, sizeof *nodes);
    for (int i = 0; i < n; i++) {
        nodes[i].index = i;
        if (decode) {
            decode_node *dn = &e->dnodes[i];
            nodes[i].queued = (int)dn->wn;
            nodes[i].running = (int)dn->n_running;
            nodes[i].kv_used_bytes = dn->kv_used_bytes;
            nodes[i].kv_free_bytes = dn->kv_capacity_bytes - dn->kv_used_bytes;
        } else {
            prefill_node *pn = &e->pnodes[i];
            nodes[i].queued = (int)pn->n;
            nodes[i].running = (int)pn->n_batch;
        }
    }
    *out = nodes;
    return n;
}

static int choose_node(engine *e, request *r, bool decode, int *node)
{
    kv_policy_node *nodes = NULL;
    int n = node_state(e, decode, &nodes);
    kv_policy_request pr = policy_request(r);
    int rc = decode ? kv_policy_decode_node(e->policy, &pr, nodes, n, node, e->err)
                    : kv_policy_prefill_node(e->policy, &pr, nodes, n, node, e->err);
    kv_free(nodes);
    return rc;
}

/* Admits waiting requests in arrival order while memory and batch slots allow. */
static void try_admit(engine *e, int d, double now)
{
    decode_node *dn = &e->dnodes[d];
    size_t max_batch = (size_t)e->s->decode.max_batch;
    while (dn->wn > 0 && dn->n_running < max_batch && !e->failed) {
        request *r = &e->reqs[dn->wait[dn->whead]];
        if (r->reserved_bytes > dn->kv_capacity_bytes) {
            kv_error_set(e->err, KV_EINPUT,
                         "%s: request %llu needs %.3g GB of KV memory but a decode node has %.3g GB after the "
                         "weights (cluster.decode: more tp, a larger device, or shorter requests)",
                         e->s->path, (unsigned long long)r->spec.id, r->reserved_bytes / 1e9,
                         dn->kv_capacity_bytes / 1e9);
            fail(e, KV_EINPUT);
            return;
        }
        if (dn->kv_used_bytes + r->reserved_bytes > dn->kv_capacity_bytes)
            break; /* head of line waits for memory */
        kv_policy_node state = {d, (int)dn->wn, (int)dn->n_running, dn->kv_capacity_bytes - dn->kv_used_bytes,
                                dn->kv_used_bytes};
        kv_policy_request pr = policy_request(r);
        bool admit = true;
        int rc = kv_policy_admit(e->policy, &pr, &state, r->reserved_bytes, &admit, e->err);
        if (rc) {
            fail(e, rc);
            return;
        }
        if (!admit)
            break;
        fifo_pop(dn->wait, &dn->whead, &dn->wn);
        r->in_wait = false;
        r->running = true;
        r->res->admitted_s = now;
        dn->kv_used_bytes += r->reserved_bytes;
        if (dn->kv_used_bytes > e->out->kv_mem_peak_bytes)
            e->out->kv_mem_peak_bytes = dn->kv_used_bytes;
        kv_grow((void **)&dn->running, sizeof *dn->running, &dn->cap_running, dn->n_running + 1);
        dn->running[dn->n_running++] = (int)(r - e->reqs);
        if ((int)dn->n_running > e->out->max_decode_batch)
            e->out->max_decode_batch = (int)dn->n_running;
    }
}

/* A request is ready for its decode node: queue it and wake the node if idle. */
static void enqueue_decode(engine *e, request *r, double now)
{
    decode_node *dn = &e->dnodes[r->res->decode_node];
    r->in_wait = true;
    fifo_push(&dn->wait, &dn->whead, &dn->wn, &dn->wcap, (int)(r - e->reqs));
    if (!dn->stepping) {
        try_admit(e, r->res->decode_node, now);
        start_step(e, r->res->decode_node);
    }
}

/* Decides what each running request does this step and costs the step. */
static void start_step(engine *e, int d)
{
    decode_node *dn = &e->dnodes[d];
    if (dn->stepping || dn->n_running == 0 || e->failed)
        return;
    kv_step_work w = {0};
    int acting = 0;
    double prefill_tokens = 0;
    for (size_t i = 0; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        double context = r->spec.prompt_tokens + r->committed + r->speculated;
        r->action = ACT_NONE;
        if (e->colocated && !r->prefilled) {
            /* Prefill the prompt inside this step, within the token budget (the first always fits). */
            if (prefill_tokens > 0 && prefill_tokens + r->spec.prompt_tokens > e->s->decode.max_batch_tokens)
                continue;
            prefill_tokens += r->spec.prompt_tokens;
            kv_step_add_prefill(&e->decode_timing, &w, r->spec.prompt_tokens);
            w.kernel_s += r->encode_s; /* the policy's encode kernel runs where the KV is made */
            r->action = ACT_PREFILL;
        } else if (r->speculative && !r->residual_done) {
            int room = r->spec.output_tokens - r->committed - r->speculated;
            if (r->speculated < r->spec_k && room > 0) {
                kv_step_add_decode(&e->decode_timing, &w, context, r->anchor_per_token * context);
                r->action = ACT_SPEC;
            }
        } else if (r->speculative && r->speculated > 0) {
            double base = r->spec.prompt_tokens + r->committed;
            kv_step_add_verify(&e->decode_timing, &w, r->speculated, base,
                               r->full_per_token * (base + r->speculated));
            r->action = ACT_VERIFY;
        } else {
            kv_step_add_decode(&e->decode_timing, &w, context, r->full_per_token * context);
            r->action = ACT_NORMAL;
        }
        if (r->action != ACT_NONE && r->merge_pending) {
            w.kernel_s += r->merge_s;
            r->merge_pending = false;
        }
        acting += r->action != ACT_NONE;
    }
    if (acting == 0)
        return; /* every request is stalled waiting for its residual */
    double now = e->now_s;
    double dt = kv_step_seconds(&e->decode_timing, &w);
    dn->stepping = true;
    dn->step_start_s = now;
    e->out->decode_steps++;
    kv_eventq_push(&e->q, now + dt, EV_STEP_DONE, d, 0);
}

static void finish_request(engine *e, int d, request *r)
{
    decode_node *dn = &e->dnodes[d];
    dn->kv_used_bytes -= r->reserved_bytes;
    if (dn->kv_used_bytes < 0)
        dn->kv_used_bytes = 0; /* rounding only */
    r->running = false;
    r->done = true;
    e->done_count++;
}

static void on_step_done(engine *e, int d, double now)
{
    decode_node *dn = &e->dnodes[d];
    dn->stepping = false;
    char name[48];
    snprintf(name, sizeof name, "step B=%zu", dn->n_running);
    span(e, dn->track, name, "decode", dn->step_start_s, now, -1);
    size_t kept = 0;
    for (size_t i = 0; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        switch (r->action) {
        case ACT_PREFILL:
            r->prefilled = true;
            r->res->prefill_start_s = dn->step_start_s;
            r->res->prefill_end_s = now;
            r->res->encode_end_s = now;
            commit_tokens(e, r, 1, now);
            break;
        case ACT_NORMAL:
            commit_tokens(e, r, 1, now);
            break;
        case ACT_SPEC:
            r->speculated++;
            r->res->spec_tokens++;
            if (r->res->first_spec_s < 0)
                r->res->first_spec_s = now;
            break;
        case ACT_VERIFY: {
            int accepted = 0;
            while (accepted < r->speculated && kv_rng_uniform(&r->rng) < accept_probability(e, accepted))
                accepted++;
            r->res->accepted_tokens += accepted;
            r->res->verifications++;
            r->speculated = 0;
            /* The accepted prefix plus the token the verification pass itself produces. */
            commit_tokens(e, r, accepted + 1, now);
            span(e, dn->track, "verify", "lynx", dn->step_start_s, now, (int64_t)r->spec.id);
            break;
        }
        default:
            break;
        }
        r->action = ACT_NONE;
        if (r->committed >= r->spec.output_tokens)
            finish_request(e, d, r);
        else
            dn->running[kept++] = dn->running[i];
    }
    dn->n_running = kept;
    try_admit(e, d, now);
    start_step(e, d);
}

/* ---- Transfers ------------------------------------------------------------------------------- */

static uint64_t flow_tag(size_t req, int layer, int plane)
{
    return ((uint64_t)req << 20) | ((uint64_t)layer << 1) | (uint64_t)plane;
}

static void start_flow(engine *e, request *r, int layer, int plane, double now)
{
    double total = plane == PLANE_ANCHOR ? r->res->anchor_bytes : r->res->residual_bytes;
    double bytes = ceil(total / r->layers_total);
    kv_flow_spec f = {
        .src = r->res->prefill_node,
        .dst = e->n_pnodes + r->res->decode_node,
        .bytes = bytes > 0 ? (uint64_t)bytes : 1,
        .priority = (r->plan.priority_mode != KV_PRIO_NONE && plane == PLANE_RESIDUAL) ? 1 : 0,
        .tag = flow_tag((size_t)(r - e->reqs), layer, plane),
    };
    kv_flow_id id;
    int rc = kv_net_flow_start(e->net, &f, now, &id, e->err);
    if (rc)
        fail(e, rc);
}

static void start_transfer(engine *e, request *r, int layer, double now)
{
    if (r->res->decode_node < 0) {
        int node = 0;
        int rc = choose_node(e, r, true, &node);
        if (rc) {
            fail(e, rc);
            return;
        }
        r->res->decode_node = node;
        r->transfer_start_s = now;
    }
    start_flow(e, r, layer, PLANE_ANCHOR, now);
    if (r->split && r->plan.order == KV_ORDER_CONCURRENT)
        start_flow(e, r, layer, PLANE_RESIDUAL, now);
}

static void on_flow_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    (void)id;
    engine *e = user;
    if (e->failed)
        return;
    e->now_s = t; /* handlers below start steps and flows at the completion time */
    request *r = &e->reqs[tag >> 20];
    int layer = (int)((tag >> 1) & 0x7ffff);
    int plane = (int)(tag & 1);
    if (e->tl) {
        char name[64];
        snprintf(name, sizeof name, "%s r%llu", plane == PLANE_ANCHOR ? (r->split ? "anchor" : "kv") : "residual",
                 (unsigned long long)r->spec.id);
        span(e, e->host_tracks[r->res->prefill_node], name, "transfer", r->transfer_start_s, t, (int64_t)r->spec.id);
    }
    if (plane == PLANE_ANCHOR) {
        if (r->split && r->plan.order == KV_ORDER_ANCHOR_FIRST)
            start_flow(e, r, layer, PLANE_RESIDUAL, t);
        if (--r->anchor_pending == 0) {
            r->anchor_done = true;
            r->res->anchor_arrived_s = t;
            if (!r->split) {
                r->residual_done = true;
                r->res->kv_arrived_s = t;
                enqueue_decode(e, r, t);
            } else if (r->speculative) {
                enqueue_decode(e, r, t);
            }
        }
        return;
    }
    if (--r->residual_pending == 0) {
        r->residual_done = true;
        r->merge_pending = true;
        r->res->kv_arrived_s = t;
        if (!r->speculative) {
            enqueue_decode(e, r, t);
        } else if (r->running) {
            start_step(e, r->res->decode_node); /* wakes a node whose batch was all stalled */
        }
    }
}

/* ---- Prefill nodes --------------------------------------------------------------------------- */

static void start_prefill(engine *e, int p, double now)
{
    prefill_node *pn = &e->pnodes[p];
    if (pn->busy || pn->n == 0)
        return;
    pn->n_batch = 0;
    long tokens = 0;
    kv_step_work w = {0};
    while (pn->n > 0 && (int)pn->n_batch < e->s->prefill.max_batch) {
        request *r = &e->reqs[pn->queue[pn->head]];
        if (pn->n_batch > 0 && tokens + r->spec.prompt_tokens > e->s->prefill.max_batch_tokens)
            break;
        fifo_pop(pn->queue, &pn->head, &pn->n);
        tokens += r->spec.prompt_tokens;
        kv_step_add_prefill(&e->prefill_timing, &w, r->spec.prompt_tokens);
        kv_grow((void **)&pn->batch, sizeof *pn->batch, &pn->cap_batch, pn->n_batch + 1);
        pn->batch[pn->n_batch++] = (int)(r - e->reqs);
    }
    double dt = kv_step_seconds(&e->prefill_timing, &w);
    double end = now + dt;
    pn->busy = true;
    char name[48];
    snprintf(name, sizeof name, "prefill B=%zu T=%ld", pn->n_batch, tokens);
    span(e, pn->track, name, "prefill", now, end, pn->n_batch == 1 ? (int64_t)e->reqs[pn->batch[0]].spec.id : -1);
    /* Encodes run one after another once the batch's KV exists (layer-wise: as layers finish). */
    double t_encode = end;
    int layers = e->s->model_card.layers;
    for (size_t i = 0; i < pn->n_batch; i++) {
        request *r = &e->reqs[pn->batch[i]];
        r->res->prefill_start_s = now;
        r->res->prefill_end_s = end;
        r->anchor_pending = r->layers_total;
        r->residual_pending = r->split ? r->layers_total : 0;
        if (r->plan.layerwise) {
            for (int l = 0; l < layers; l++) {
                double ready = now + dt * (l + 1) / layers + r->encode_s * (l + 1) / layers;
                kv_eventq_push(&e->q, ready, EV_LAYER_READY, pn->batch[i], l);
            }
            r->res->encode_end_s = end + r->encode_s;
        } else {
            double start = t_encode;
            t_encode += r->encode_s;
            r->res->encode_end_s = t_encode;
            char ename[48];
            snprintf(ename, sizeof ename, "encode r%llu", (unsigned long long)r->spec.id);
            span(e, pn->track, ename, "encode", start, t_encode, (int64_t)r->spec.id);
            kv_eventq_push(&e->q, t_encode, EV_ENCODE_DONE, pn->batch[i], 0);
        }
    }
    kv_eventq_push(&e->q, t_encode, EV_PREFILL_DONE, p, 0);
}

static void on_arrival(engine *e, request *r, double now)
{
    int node = 0;
    int rc = choose_node(e, r, e->colocated, &node);
    if (rc) {
        fail(e, rc);
        return;
    }
    if (e->colocated) {
        r->res->decode_node = node;
        r->res->prefill_node = node;
        enqueue_decode(e, r, now);
        return;
    }
    r->res->prefill_node = node;
    prefill_node *pn = &e->pnodes[node];
    fifo_push(&pn->queue, &pn->head, &pn->n, &pn->cap, (int)(r - e->reqs));
    start_prefill(e, node, now);
}

/* ---- Set-up and the loop --------------------------------------------------------------------- */

void kv_engine_net_config(const kv_scenario *s, int model, kv_net_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (kv_net_model)model;
    int topo = kv_net_topology_parse(s->topology);
    cfg->topology = topo < 0 ? KV_TOPO_STAR : (kv_net_topology)topo;
    cfg->hosts = s->prefill.nodes + s->decode.nodes;
    cfg->nic_bandwidth_gbps = s->nic_bandwidth_gbps;
    cfg->nic_latency_s = s->nic_latency_us * 1e-6;
    cfg->switch_bandwidth_gbps = s->switch_bandwidth_gbps;
    cfg->switch_latency_s = s->switch_latency_us * 1e-6;
    cfg->hosts_per_leaf = s->hosts_per_leaf;
    cfg->oversubscription = s->oversubscription;
    cfg->split_duplex = s->split_duplex;
    cfg->platform_file = s->platform_file[0] ? s->platform_file : NULL;
    cfg->source = s->path;
    cfg->priority = KV_PRIO_STRICT;
    cfg->class_weight[0] = 1;
    cfg->class_weight[1] = 1;
    const kv_ynode *opts = s->simgrid_options;
    if (opts && opts->kind == KV_YMAP) {
        for (size_t i = 0; i < opts->count && cfg->n_options < KV_NET_MAX_OPTIONS; i++) {
            if (opts->items[i]->kind != KV_YSCALAR)
                continue;
            cfg->option_key[cfg->n_options] = opts->keys[i];
            cfg->option_value[cfg->n_options] = opts->items[i]->value;
            cfg->n_options++;
        }
    }
}

static void engine_free(engine *e)
{
    for (int i = 0; i < e->n_pnodes; i++) {
        kv_free(e->pnodes[i].queue);
        kv_free(e->pnodes[i].batch);
    }
    for (int i = 0; i < e->n_dnodes; i++) {
        kv_free(e->dnodes[i].wait);
        kv_free(e->dnodes[i].running);
    }
    kv_free(e->pnodes);
    kv_free(e->dnodes);
    kv_free(e->reqs);
    kv_free(e->host_tracks);
    kv_net_destroy(e->net);
    kv_eventq_free(&e->q);
}

static int setup(engine *e, const kv_run_inputs *in, kv_run_result *out, kv_error *err)
{
    const kv_scenario *s = in->scenario;
    e->s = s;
    e->policy = in->policy;
    e->err = err;
    e->out = out;
    e->tl = in->timeline;
    e->colocated = s->colocated;
    e->accept_p = s->lynx_acceptance;
    e->accept_pos = &s->lynx_acceptance_per_position;
    e->ttkt_k = s->ttkt_k;
    e->tiers = (kv_tier_split){s->diffkv_high_fraction, s->diffkv_low_fraction};
    const kv_model_card *m = &s->model_card;
    e->model = (kv_policy_model){m->name, m->layers, m->heads, m->kv_heads, m->head_dim};
    kv_timing_init(&e->prefill_timing, m, &s->prefill_device, s->prefill.tp);
    kv_timing_init(&e->decode_timing, m, &s->decode_device, s->decode.tp);
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
    kv_eventq_init(&e->q);
    kv_rng_seed(&e->base_rng, (uint64_t)s->seed);

    e->n_pnodes = s->prefill.nodes;
    e->n_dnodes = s->decode.nodes;
    e->pnodes = kv_calloc((size_t)e->n_pnodes, sizeof *e->pnodes);
    e->dnodes = kv_calloc((size_t)e->n_dnodes, sizeof *e->dnodes);
    double weights = kv_model_weight_bytes(m);
    double capacity = s->decode_device.memory_gb * 1e9 * s->decode.memory_fraction * s->decode.tp - weights;
    char w[512];
    if (capacity <= 0)
        return kv_error_set(err, KV_EINPUT,
                            "%s: cluster.decode: %s's weights (%.3g GB) do not fit in %d x %s (%.3g GB usable); "
                            "raise cluster.decode.tp",
                            kv_scenario_where(s, "cluster.decode", w, sizeof w), m->name, weights / 1e9,
                            s->decode.tp, s->decode_device.name,
                            s->decode_device.memory_gb * s->decode.memory_fraction * s->decode.tp);
    double pcap = s->prefill_device.memory_gb * 1e9 * s->prefill.memory_fraction * s->prefill.tp - weights;
    if (pcap <= 0 && !s->colocated)
        return kv_error_set(err, KV_EINPUT, "%s: cluster.prefill: %s's weights (%.3g GB) do not fit; raise "
                            "cluster.prefill.tp", kv_scenario_where(s, "cluster.prefill", w, sizeof w), m->name,
                            weights / 1e9);
    out->kv_mem_capacity_bytes = capacity;
    for (int i = 0; i < e->n_dnodes; i++)
        e->dnodes[i].kv_capacity_bytes = capacity;

    e->tl_process = e->tl ? kv_timeline_process(e->tl, kv_policy_name(e->policy)) : 0;
    int hosts = e->n_pnodes + e->n_dnodes;
    e->host_tracks = kv_calloc((size_t)hosts, sizeof *e->host_tracks);
    if (e->tl) {
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
    }

    size_t n = kv_workload_count(in->workload);
    e->n_reqs = n;
    e->reqs = kv_calloc(n ? n : 1, sizeof *e->reqs);
    out->requests = kv_calloc(n ? n : 1, sizeof *out->requests);
    out->n_requests = n;
    for (size_t i = 0; i < n; i++) {
        request *r = &e->reqs[i];
        r->spec = *kv_workload_get(in->workload, i);
        r->res = &out->requests[i];
        kv_request_result *res = r->res;
        *res = (kv_request_result){.id = r->spec.id, .prompt_tokens = r->spec.prompt_tokens,
                                   .output_tokens = r->spec.output_tokens, .prefill_node = -1, .decode_node = -1,
                                   .arrival_s = r->spec.arrival_s, .prefill_start_s = -1, .prefill_end_s = -1,
                                   .encode_end_s = -1, .anchor_arrived_s = -1, .kv_arrived_s = -1,
                                   .admitted_s = -1, .first_spec_s = -1, .first_token_s = -1, .kth_token_s = -1,
                                   .done_s = -1, .kept_tokens_fraction = 1};
        kv_rng_fork(&e->base_rng, r->spec.id + 1, &r->rng);
        int rc = plan_request(e, r);
        if (rc)
            return rc;
        kv_eventq_push(&e->q, r->spec.arrival_s, EV_ARRIVAL, (int)i, 0);
    }

    if (!e->colocated) {
        kv_net_config cfg;
        kv_engine_net_config(s, in->network_model, &cfg);
        int rc = kv_net_create(&cfg, on_flow_done, e, &e->net, err);
        if (rc)
            return rc;
        snprintf(out->network, sizeof out->network, "%s", kv_net_name(e->net));
    } else {
        snprintf(out->network, sizeof out->network, "none (colocated)");
    }
    return KV_OK;
}

static int describe_stuck(engine *e, kv_error *err)
{
    for (size_t i = 0; i < e->n_reqs; i++) {
        request *r = &e->reqs[i];
        if (r->done)
            continue;
        const char *where = r->in_wait ? "waiting for admission at its decode node (the policy's admit hook "
                                         "never admitted it, or memory never freed)"
                          : r->running ? "in a decode batch that stopped stepping"
                                       : "before decode (its KV never arrived)";
        return kv_error_set(err, KV_EINPUT, "%s: request %llu never finished: %s", e->s->path,
                            (unsigned long long)r->spec.id, where);
    }
    return KV_OK;
}

int kv_engine_run(const kv_run_inputs *in, kv_run_result *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    engine e;
    memset(&e, 0, sizeof e);
    int rc = setup(&e, in, out, err);
    while (!rc && !e.failed) {
        double t_next = kv_eventq_peek_time(&e.q);
        if (e.net && kv_net_active_flows(e.net) > 0) {
            double t_now = 0;
            rc = kv_net_advance(e.net, t_next, &t_now, err);
            if (rc)
                break;
            if (t_now < t_next)
                continue; /* a completion happened first; its handler may have queued events */
        }
        kv_event ev;
        if (!kv_eventq_pop(&e.q, &ev))
            break;
        e.now_s = ev.t_s;
        out->events++;
        switch (ev.type) {
        case EV_ARRIVAL:
            on_arrival(&e, &e.reqs[ev.a], ev.t_s);
            break;
        case EV_PREFILL_DONE:
            e.pnodes[ev.a].busy = false;
            start_prefill(&e, ev.a, ev.t_s);
            break;
        case EV_ENCODE_DONE:
            start_transfer(&e, &e.reqs[ev.a], 0, ev.t_s);
            break;
        case EV_LAYER_READY:
            start_transfer(&e, &e.reqs[ev.a], ev.b, ev.t_s);
            break;
        case EV_STEP_DONE:
            on_step_done(&e, ev.a, ev.t_s);
            break;
        default:
            rc = kv_error_set(err, KV_EFAIL, "internal: unknown event %d", ev.type);
        }
    }
    if (!rc && e.failed)
        rc = e.failed;
    if (!rc && e.done_count != e.n_reqs)
        rc = describe_stuck(&e, err);
    if (!rc) {
        for (size_t i = 0; i < out->n_requests; i++)
            if (out->requests[i].done_s > out->makespan_s)
                out->makespan_s = out->requests[i].done_s;
        if (e.net) {
            out->n_links = kv_net_link_count(e.net);
            out->links = kv_calloc(out->n_links ? out->n_links : 1, sizeof *out->links);
            for (size_t i = 0; i < out->n_links; i++)
                kv_net_link_stats(e.net, i, &out->links[i]);
        }
    }
    engine_free(&e);
    return rc;
}

void kv_run_result_free(kv_run_result *r)
{
    if (!r)
        return;
    kv_free(r->requests);
    kv_free(r->itl_s);
    kv_free(r->links);
    memset(r, 0, sizeof *r);
}
