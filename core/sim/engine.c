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
 * A request preempted in DECODE for memory goes back to the head of WAIT; its
 * KV is recomputed by a prefill step on the decode node or swapped back in.
 *
 * Token 1 of a disaggregated request comes from the prefill node's last
 * logits; it is committed (delivered by the decode node) when the request's
 * complete KV, every plane and layer, is at the decode node, so TTFT is
 * prefill + encode + transfer. Decode steps make tokens 2..N (N - 1 steps); a
 * request with one output token is done on arrival without decoding.
 *
 * Decode placement happens when the first flow starts (the flow needs a
 * destination); a node's load counts the requests placed on it whose KV is
 * still in flight (`incoming`, `kv_reserved_bytes` of the node table).
 *
 * Lynx (a policy whose encoding splits anchor and residual planes and whose
 * speculate hook returns k > 0) enters WAIT when its anchor plane has
 * arrived. In DECODE it then speculates on anchor-only KV, one token per step
 * (tokens 2, 3, ...), up to k tokens, stalling if the residual is still in
 * flight. When the residual has arrived, token 1 is committed and the next
 * step pays the merge kernel and verifies the speculated tokens (costed like
 * a k-token prefill over the context); the longest accepted prefix plus one
 * corrected token is committed, the rest is wasted, and the request continues
 * as a normal one. With concurrent flows the residual (b - a bits, no group
 * metadata) can arrive before the anchor: the KV is complete, and token 1
 * committed, only once both planes are in, and a request whose residual came
 * first has nothing to speculate on and queues as a normal one.
 *
 * Invariants (checked where they can break):
 *  1. The simulated clock never decreases (eventq.c aborts on a push into the past).
 *  2. A token is committed only by a normal decode step, a prefill step
 *     (colocated, or token 1 of a disaggregated request once its complete KV
 *     has arrived), or a verification; speculated tokens are never counted as
 *     committed unless a verification accepted them.
 *  3. A decode node's KV never exceeds its capacity: KV is held only in pages of
 *     the node's memory manager (core/sim/kvmem.h), which has capacity / page pages;
 *     a step that needs more preempts (see "Decode nodes' paged KV memory").
 *  4. Every request ends DONE, or the run fails saying which request is stuck.
 *
 * Determinism: events tie-break on push order; flows complete in the
 * network's deterministic order; every random draw comes from a stream forked
 * from the scenario seed by request id, so all policies see the same draws.
 */
#include "core/sim/engine.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/base/alloc.h"
#include "core/kv/diffkv.h"
#include "core/policy/encset.h"
#include "core/sim/eventq.h"
#include "core/kv/kvbytes.h"
#include "core/sim/kvcache.h"
#include "core/sim/kvmem.h"
#include "core/base/rng.h"
#include "core/timing/timing.h"

#include "core/sim/engine_internal.h"

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

static void span(engine *e, int track, const char *name, const char *cat, double t0, double t1, int64_t req)
{
    if (e->tl)
        kv_timeline_span(e->tl, e->tl_process, track, name, cat, t0, t1, req);
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
        if (res->second_commit_s < 0)
            res->second_commit_s = t;
        kv_histogram_add(&e->out->itl_s, t - r->last_commit_s);
    }
    if (r->committed < e->ttkt_k && r->committed + n >= e->ttkt_k)
        res->kth_token_s = t;
    r->committed += n;
    r->last_commit_s = t;
    if (r->committed >= r->spec.output_tokens)
        res->done_s = t;
}

/* Conditional acceptance of speculative position i (0-based) for request r: the measured curve at its
   prompt length, else the scenario's. */
static double accept_probability(const engine *e, const request *r, int i)
{
    if (e->accept_curve)
        return kv_accept_curve_at(e->accept_curve, i, r->spec.prompt_tokens);
    if (e->n_accept_pos > 0)
        return e->accept_pos[(size_t)i < e->n_accept_pos ? (size_t)i : e->n_accept_pos - 1];
    return e->accept_p;
}

/* Tokens that exist (committed, or token 1 held until its KV is complete); the next step's input is the last. */
static int generated(const request *r)
{
    return r->committed + (r->first_held ? 1 : 0);
}

/* ---- Decode nodes ---------------------------------------------------------------------------- */

static void start_step(engine *e, int d);

int kv_engine_node_state(engine *e, bool decode, kv_policy_node **out)
{
    int n = decode ? e->n_dnodes : e->n_pnodes;
    kv_policy_node *nodes = kv_calloc((size_t)n, sizeof *nodes);
    for (int i = 0; i < n; i++) {
        nodes[i].index = i;
        if (decode) {
            decode_node *dn = &e->dnodes[i];
            nodes[i].queued = (int)dn->wn;
            nodes[i].running = (int)dn->n_running;
            nodes[i].incoming = dn->incoming;
            nodes[i].kv_reserved_bytes = dn->kv_reserved_bytes;
            if (dn->mem) {
                double page = kv_mem_page_bytes(dn->mem);
                nodes[i].kv_used_bytes = kv_mem_used_pages(dn->mem) * page;
                nodes[i].kv_free_bytes = kv_mem_free_pages(dn->mem) * page;
            } else {
                nodes[i].kv_free_bytes = dn->kv_capacity_bytes;
            }
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
    int n = kv_engine_node_state(e, decode, &nodes);
    kv_policy_request pr = policy_request(r);
    int rc = decode ? kv_policy_decode_node(e->policy, &pr, nodes, n, node, e->err)
                    : kv_policy_prefill_node(e->policy, &pr, nodes, n, node, e->err);
    kv_free(nodes);
    return rc;
}

/* ---- Decode nodes' paged KV memory ------------------------------------------------------------
 *
 * Every decode node has a memory manager (core/sim/kvmem.h) whose free page ring
 * and compaction kernels run on the backend; every request's KV is counted in
 * tokens per tier and (layer, KV head) by its kv_cache (core/sim/kvcache.h).
 *  - Admission (try_admit) takes waiting requests while their pages fit (less
 *    a watermark for running requests to grow into), then allocates all of
 *    them in one compaction call.
 *  - Before each step (ensure_pages) every running request gets room for the
 *    token the step appends, in one call; when pages run out the latest
 *    admitted request is preempted: its pages are released and, as its
 *    policy's transfer answer says (`preempt`), its KV is dropped and
 *    recomputed by a prefill step later, or swapped to host memory and back.
 *  - After a step, DiffKV's prompt tiering hands surplus pages back
 *    (kv_cache_shrink) and finished requests release everything, together in
 *    one call.
 * The manager's calls are costed by a roofline (memory.manager_call_us plus
 * the bytes they touch) and, for DiffKV, charged to the step, as DiffKV runs
 * them on the device; their real wall time is measured on request.
 * Invariant 3 (KV memory never exceeds capacity) holds by construction: pages
 * are the only way to hold KV, and the ring has capacity pages. */

static void scratch_reserve(engine *e, size_t n)
{
    kv_grow((void **)&e->scratch, sizeof *e->scratch, &e->cap_scratch, n);
}

/* Accounts the manager calls made on a node since the last time. */
static void account_manager(engine *e, decode_node *dn)
{
    kv_mem_stats st;
    kv_mem_get_stats(dn->mem, &st);
    uint32_t used = kv_mem_used_pages(dn->mem);
    if (used > e->out->kv_pages_peak)
        e->out->kv_pages_peak = used;
    uint64_t calls = st.calls - dn->mgr_calls_seen;
    if (calls == 0)
        return;
    const kv_device_profile *dev = e->cfg->decode.device;
    double bytes = st.bytes_touched - dn->mgr_bytes_seen;
    double model = (double)calls * e->cfg->memory.manager_call_us * 1e-6 +
                   bytes / (dev->hbm_bandwidth_gbs * 1e9 * dev->memory_efficiency * e->cfg->decode.tp);
    e->out->kv_manager_calls += calls;
    e->out->kv_manager_s += model;
    e->out->kv_manager_measured_s += st.wall_s - dn->mgr_wall_seen;
    if (e->charge_manager) {
        dn->pending_kernel_s += model;
        e->out->kv_manager_charged_s += model;
    }
    dn->mgr_calls_seen = st.calls;
    dn->mgr_bytes_seen = st.bytes_touched;
    dn->mgr_wall_seen = st.wall_s;
}

/* Appends release entries for every page r holds; returns the new count. */
static size_t release_entries(engine *e, decode_node *dn, request *r, size_t k)
{
    scratch_reserve(e, k + (size_t)r->cache.tables * 2);
    for (int h = 0; h < r->cache.tables; h++)
        for (int t = 0; t < kv_mem_tiers(dn->mem); t++) {
            uint32_t pages = kv_mem_seq_pages(dn->mem, r->slot, h, t);
            if (pages)
                e->scratch[k++] = (kv_mem_demand){r->slot, h, t, pages};
        }
    return k;
}

static void fifo_push_front(int **items, size_t *head, size_t *n, size_t *cap, int v)
{
    if (*head == 0) {
        kv_grow((void **)items, sizeof **items, cap, *n + 1);
        memmove(*items + 1, *items, *n * sizeof **items);
        *head = 1;
    }
    (*items)[--*head] = v;
    (*n)++;
}

/* Evicts running request i of node d because memory ran out (see above). */
static int preempt(engine *e, int d, size_t i)
{
    decode_node *dn = &e->dnodes[d];
    request *r = &e->reqs[dn->running[i]];
    double bytes = (double)kv_mem_seq_total_pages(dn->mem, r->slot) * kv_mem_page_bytes(dn->mem);
    int rc = kv_mem_release_seqs(dn->mem, &r->slot, 1, e->err);
    if (rc)
        return rc;
    kv_mem_seq_close(dn->mem, r->slot);
    r->slot = -1;
    if (r->plan.preempt == KV_PREEMPT_SWAP && r->prefilled) {
        dn->pending_kernel_s += bytes / (e->cfg->memory.swap_bandwidth_gbs * 1e9); /* copy out */
        e->out->swap_bytes += bytes;
        r->swapped = true;
    } else {
        r->prefilled = false;
        r->prefill_tokens = r->spec.prompt_tokens + generated(r);
        kv_cache_set_tokens(&r->cache, r->prefill_tokens, true);
    }
    memmove(dn->running + i, dn->running + i + 1, (dn->n_running - i - 1) * sizeof *dn->running);
    dn->n_running--;
    r->running = false;
    r->in_wait = true;
    fifo_push_front(&dn->wait, &dn->whead, &dn->wn, &dn->wcap, (int)(r - e->reqs));
    r->res->preemptions++;
    e->out->preemptions++;
    if (e->tl) {
        char name[48];
        snprintf(name, sizeof name, "preempt r%llu (%s)", (unsigned long long)r->spec.id,
                 r->swapped ? "swap" : "recompute");
        span(e, dn->track, name, "memory", e->now_s, e->now_s, (int64_t)r->spec.id);
    }
    return KV_OK;
}

/* Before a step: room for every running request's next token, in one compaction call; preempts the
   latest admitted requests while the free pages fall short. False when the run failed. */
static bool ensure_pages(engine *e, int d)
{
    decode_node *dn = &e->dnodes[d];
    for (size_t i = 0; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        if (r->prefilled)
            kv_cache_grow_to(&r->cache, (int64_t)r->spec.prompt_tokens + generated(r) + r->speculated);
    }
    for (;;) {
        size_t k = 0, n_short = 0;
        uint64_t pages = 0;
        kv_grow((void **)&e->shorts, sizeof *e->shorts, &e->cap_shorts, dn->n_running + 1);
        kv_grow((void **)&e->short_from, sizeof *e->short_from, &e->cap_short_from, dn->n_running + 1);
        for (size_t i = 0; i < dn->n_running; i++) {
            request *r = &e->reqs[dn->running[i]];
            scratch_reserve(e, k + (size_t)r->cache.tables * 2);
            size_t n = kv_cache_demands(&r->cache, dn->mem, r->slot, e->scratch + k, &pages);
            if (n == 0)
                continue;
            e->short_from[n_short] = k;
            e->shorts[n_short++] = dn->running[i];
            k += n;
        }
        bool granted = true;
        if (k > 0) {
            int rc = kv_mem_alloc(dn->mem, e->scratch, k, &granted, e->err);
            if (rc) {
                fail(e, rc);
                return false;
            }
        }
        account_manager(e, dn);
        if (granted) {
            for (size_t i = 0; i < n_short; i++) {
                size_t end = i + 1 < n_short ? e->short_from[i + 1] : k;
                kv_cache_granted(&e->reqs[e->shorts[i]].cache, e->scratch + e->short_from[i], end - e->short_from[i]);
            }
            return true;
        }
        /* Out of pages: evict the latest admitted request that can be evicted (not a Lynx request
           still waiting for its residual). */
        size_t victim = dn->n_running;
        for (size_t i = 0; i < dn->n_running; i++) {
            request *r = &e->reqs[dn->running[i]];
            if (r->speculative && !r->residual_done)
                continue;
            if (victim == dn->n_running || r->admit_order > e->reqs[dn->running[victim]].admit_order)
                victim = i;
        }
        if (victim == dn->n_running || dn->n_running == 1) {
            request *r = &e->reqs[dn->running[victim == dn->n_running ? 0 : victim]];
            kv_error_set(e->err, KV_EINPUT,
                         "%s: decode node %d ran out of KV memory (%u pages of %u bytes) with request %llu "
                         "running alone or nothing it may preempt: %llu more pages needed (cluster.decode: more tp, "
                         "a larger device, or shorter requests)",
                         e->cfg->source, d, kv_mem_capacity_pages(dn->mem), kv_mem_page_bytes(dn->mem),
                         (unsigned long long)r->spec.id, (unsigned long long)pages);
            fail(e, KV_EINPUT);
            return false;
        }
        int rc = preempt(e, d, victim);
        if (rc) {
            fail(e, rc);
            return false;
        }
    }
}

/* Timeline: the decode node's KV memory in use, as a counter track. */
static void memory_sample(engine *e, int d, double now)
{
    if (!e->tl)
        return;
    char name[48];
    snprintf(name, sizeof name, "KV memory decode %d", d);
    kv_timeline_counter(e->tl, e->tl_process, name, "GB", now, (double)kv_mem_used_pages(e->dnodes[d].mem) * kv_mem_page_bytes(e->dnodes[d].mem) / 1e9);
}

/* Admits waiting requests in arrival order while pages and batch slots allow; one compaction call
   allocates every admitted request's pages. */
static void try_admit(engine *e, int d, double now)
{
    decode_node *dn = &e->dnodes[d];
    size_t max_batch = (size_t)e->cfg->decode.max_batch;
    kv_mem *mem = dn->mem;
    uint64_t capacity = kv_mem_capacity_pages(mem), free = kv_mem_free_pages(mem);
    double page = kv_mem_page_bytes(mem);
    size_t first = dn->n_running;
    while (dn->wn > 0 && dn->n_running < max_batch && !e->failed) {
        request *r = &e->reqs[dn->wait[dn->whead]];
        uint64_t need = kv_cache_pages_needed(&r->cache);
        if (need > capacity) {
            kv_error_set(e->err, KV_EINPUT,
                         "%s: request %llu needs %.3g GB of KV memory (%llu pages of %.0f bytes) but a decode node "
                         "has %.3g GB after the weights (cluster.decode: more tp, a larger device, or shorter "
                         "requests)",
                         e->cfg->source, (unsigned long long)r->spec.id, need * page / 1e9, (unsigned long long)need,
                         page, dn->kv_capacity_bytes / 1e9);
            fail(e, KV_EINPUT);
            return;
        }
        uint64_t keep = dn->n_running > 0 ? (uint64_t)ceil(e->cfg->memory.watermark * (double)capacity) : 0;
        if (need + keep > free)
            break; /* head of line waits for memory */
        kv_policy_node state = {d, (int)dn->wn, (int)dn->n_running, free * page, (capacity - free) * page,
                                dn->incoming, dn->kv_reserved_bytes};
        kv_policy_request pr = policy_request(r);
        bool admit = true;
        int rc = kv_policy_admit(e->policy, &pr, &state, need * page, &admit, e->err);
        if (rc) {
            fail(e, rc);
            return;
        }
        if (!admit)
            break;
        fifo_pop(dn->wait, &dn->whead, &dn->wn);
        r->in_wait = false;
        r->running = true;
        if (r->res->admitted_s < 0)
            r->res->admitted_s = now;
        r->admit_order = ++e->admit_counter;
        free -= need;
        kv_grow((void **)&dn->running, sizeof *dn->running, &dn->cap_running, dn->n_running + 1);
        dn->running[dn->n_running++] = (int)(r - e->reqs);
        if ((int)dn->n_running > e->out->max_decode_batch)
            e->out->max_decode_batch = (int)dn->n_running;
    }
    if (dn->n_running == first || e->failed)
        return;
    size_t k = 0;
    uint64_t pages = 0;
    for (size_t i = first; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        r->slot = kv_mem_seq_open_tables(mem, r->cache.tables);
        scratch_reserve(e, k + (size_t)r->cache.tables * 2);
        uint64_t before = pages;
        k += kv_cache_demands(&r->cache, mem, r->slot, e->scratch + k, &pages);
        if (r->swapped) {
            double bytes = (double)(pages - before) * page;
            dn->pending_kernel_s += bytes / (e->cfg->memory.swap_bandwidth_gbs * 1e9); /* copy back in */
            e->out->swap_bytes += bytes;
            r->swapped = false;
        }
    }
    bool granted = false;
    int rc = kv_mem_alloc(mem, e->scratch, k, &granted, e->err);
    if (!rc && !granted)
        rc = kv_error_set(e->err, KV_EFAIL, "internal: decode node %d refused %llu pages admission counted as free",
                          d, (unsigned long long)pages);
    if (rc) {
        fail(e, rc);
        return;
    }
    for (size_t i = first; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        kv_cache_sync(&r->cache, mem, r->slot);
    }
    account_manager(e, dn);
    memory_sample(e, d, now);
}

/* r's KV has reached its decode node (enough of it to queue): it no longer counts as incoming there. */
static void arrive_decode(engine *e, request *r)
{
    if (!r->incoming)
        return;
    decode_node *dn = &e->dnodes[r->res->decode_node];
    dn->incoming--;
    dn->kv_reserved_bytes -= r->reserved_bytes;
    if (dn->incoming == 0)
        dn->kv_reserved_bytes = 0; /* no rounding residue once nothing is in flight */
    r->incoming = false;
    r->reserved_bytes = 0;
}

/* A request is ready for its decode node: queue it and wake the node if idle. */
static void enqueue_decode(engine *e, request *r, double now)
{
    decode_node *dn = &e->dnodes[r->res->decode_node];
    arrive_decode(e, r);
    r->in_wait = true;
    r->enqueued_s = now;
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
    if (!ensure_pages(e, d) || dn->n_running == 0)
        return;
    kv_step_work w = {0};
    int acting = 0;
    double prefill_tokens = 0;
    for (size_t i = 0; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        double context = r->spec.prompt_tokens + generated(r) + r->speculated;
        r->action = ACT_NONE;
        if (!r->prefilled) {
            /* Prefill inside this step (colocated, or a recompute after preemption), within the token
               budget (the first always fits). */
            if (prefill_tokens > 0 && prefill_tokens + r->prefill_tokens > e->cfg->decode.max_batch_tokens)
                continue;
            prefill_tokens += r->prefill_tokens;
            kv_step_add_prefill(&e->decode_timing, &w, r->prefill_tokens);
            /* the policy's encode kernel runs where the KV is made */
            w.kernel_s += r->encode_s * r->prefill_tokens / r->spec.prompt_tokens;
            r->action = ACT_PREFILL;
        } else if (r->speculative && !r->residual_done) {
            int room = r->spec.output_tokens - generated(r) - r->speculated;
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
            /* The step reads what the request's KV holds now, tier by tier (DiffKV: codes, metadata,
               scores and positions of the kept tokens; KIVI: the quantized tokens and the bf16 window). */
            kv_step_add_decode(&e->decode_timing, &w, context, kv_cache_read_bytes(&r->cache));
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
    w.kernel_s += dn->pending_kernel_s; /* memory manager and swaps since the last step */
    dn->pending_kernel_s = 0;
    double now = e->now_s;
    double dt = kv_step_seconds(&e->decode_timing, &w);
    dn->stepping = true;
    dn->step_start_s = now;
    e->out->decode_steps++;
    e->out->decode_busy_s += dt;
    e->out->mean_decode_batch += dt * (double)dn->n_running; /* divided by decode_busy_s at the end */
    kv_eventq_push(&e->q, now + dt, EV_STEP_DONE, d, 0);
}

static void request_span(engine *e, request *r, const char *name, const char *cat, double t0, double t1)
{
    if (t0 >= 0 && t1 >= t0)
        kv_timeline_span(e->tl, e->tl_requests, r->track, name, cat, t0, t1, (int64_t)r->spec.id);
}

/* Timeline: a finished request's phases on its own track (Lynx: the paper's Figure 1, request by request). */
static void request_spans(engine *e, request *r)
{
    if (!e->tl)
        return;
    const kv_request_result *q = r->res;
    char name[64];
    if (!e->colocated) {
        if (q->prefill_start_s > q->arrival_s)
            request_span(e, r, "queue", "queue", q->arrival_s, q->prefill_start_s);
        request_span(e, r, "prefill", "prefill", q->prefill_start_s, q->prefill_end_s);
        if (q->encode_end_s > q->prefill_end_s)
            request_span(e, r, "encode", "encode", q->prefill_end_s, q->encode_end_s);
        request_span(e, r, r->split ? "anchor transfer" : "KV transfer", "transfer", r->plane_start_s[PLANE_ANCHOR],
                     q->anchor_arrived_s);
        if (r->split)
            request_span(e, r, "residual transfer", "transfer", r->plane_start_s[PLANE_RESIDUAL], q->kv_arrived_s);
    }
    if (q->admitted_s > r->enqueued_s)
        request_span(e, r, "wait (decode slot or memory)", "queue", r->enqueued_s, q->admitted_s);
    if (e->colocated)
        request_span(e, r, "prefill", "prefill", q->prefill_start_s, q->prefill_end_s);
    double decode_from = e->colocated ? q->prefill_end_s : q->admitted_s;
    if (r->verify_end_s >= 0) {
        snprintf(name, sizeof name, "speculative decode (%d tokens)", q->spec_tokens);
        request_span(e, r, name, "lynx", r->spec_start_s, r->verify_start_s);
        snprintf(name, sizeof name, "verify (%d of %d accepted)", q->accepted_tokens, q->spec_tokens);
        request_span(e, r, name, "lynx", r->verify_start_s, r->verify_end_s);
        decode_from = r->verify_end_s;
    }
    if (q->done_s > decode_from) {
        snprintf(name, sizeof name, "decode (%d tokens)", q->output_tokens);
        request_span(e, r, name, "decode", decode_from, q->done_s);
    }
}

/* Marks r done and records its tiers; its pages are released by the caller's batch. */
static void finish_request(engine *e, request *r)
{
    if (r->cache.kind == KV_CACHE_DIFFKV) {
        kv_cache_grow_to(&r->cache, (int64_t)r->spec.prompt_tokens + r->committed);
        double hi, lo, pr;
        kv_cache_totals(&r->cache, &hi, &lo, &pr);
        double all = hi + lo + pr;
        r->res->tier_high_fraction = hi / all;
        r->res->tier_low_fraction = lo / all;
        r->res->tier_pruned_fraction = pr / all;
        e->out->tier_high_fraction += hi; /* sums here; fractions at the end of the run */
        e->out->tier_low_fraction += lo;
        e->out->tier_pruned_fraction += pr;
    }
    request_spans(e, r);
    r->running = false;
    r->done = true;
    e->done_count++;
    if (kv_policy_has_hook(e->policy, "complete")) {
        /* The policy is told (hook complete) what the request measured. */
        const kv_request_result *q = r->res;
        kv_policy_finished o = {
            .ttft_s = q->first_token_s - q->arrival_s,
            .ttft_spec_s = q->first_spec_s - q->arrival_s,
            .ttkt_s = q->kth_token_s >= 0 ? q->kth_token_s - q->arrival_s : -1,
            .tpot_s = q->output_tokens > 1 ? (q->done_s - q->first_token_s) / (q->output_tokens - 1) : 0,
            .done_s = q->done_s,
            .anchor_bytes = q->anchor_bytes,
            .residual_bytes = q->residual_bytes,
            .bits = q->bits,
            .preemptions = q->preemptions,
        };
        kv_policy_request pr = policy_request(r);
        int rc = kv_policy_complete(e->policy, &pr, &o, e->err);
        if (rc)
            fail(e, rc);
    }
}

static void on_step_done(engine *e, int d, double now)
{
    decode_node *dn = &e->dnodes[d];
    dn->stepping = false;
    char name[48];
    int n_spec = 0, n_verify = 0;
    for (size_t i = 0; i < dn->n_running; i++) {
        n_spec += e->reqs[dn->running[i]].action == ACT_SPEC;
        n_verify += e->reqs[dn->running[i]].action == ACT_VERIFY;
    }
    if (e->tl) { /* names cost a printf per step: only for the timeline */
        if (n_spec || n_verify)
            snprintf(name, sizeof name, "step B=%zu spec=%d verify=%d", dn->n_running, n_spec, n_verify);
        else
            snprintf(name, sizeof name, "step B=%zu", dn->n_running);
        span(e, dn->track, name, "decode", dn->step_start_s, now, -1);
    }
    size_t kept = 0, k = 0, n_closing = 0;
    int *closing = kv_calloc(dn->n_running + 1, sizeof *closing);
    for (size_t i = 0; i < dn->n_running; i++) {
        request *r = &e->reqs[dn->running[i]];
        bool prefill_done = false;
        switch (r->action) {
        case ACT_PREFILL:
            r->prefilled = true;
            prefill_done = true;
            if (r->res->prefill_start_s < 0) {
                r->res->prefill_start_s = dn->step_start_s;
                r->res->prefill_end_s = now;
                r->res->encode_end_s = now;
            }
            commit_tokens(e, r, 1, now);
            break;
        case ACT_NORMAL:
            commit_tokens(e, r, 1, now);
            break;
        case ACT_SPEC:
            if (r->spec_start_s < 0)
                r->spec_start_s = dn->step_start_s;
            r->speculated++;
            r->res->spec_tokens++;
            if (r->res->first_spec_s < 0)
                r->res->first_spec_s = now;
            break;
        case ACT_VERIFY: {
            int accepted = 0;
            while (accepted < r->speculated && kv_rng_uniform(&r->rng) < accept_probability(e, r, accepted))
                accepted++;
            r->res->accepted_tokens += accepted;
            r->res->verifications++;
            r->verify_start_s = dn->step_start_s;
            r->verify_end_s = now;
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
        if (r->committed >= r->spec.output_tokens) {
            finish_request(e, r);
            k = release_entries(e, dn, r, k);
            closing[n_closing++] = r->slot;
            r->slot = -1;
            continue;
        }
        if (prefill_done && r->cache.kind == KV_CACHE_DIFFKV) {
            /* DiffKV's prompt tiering: keep what the tiers need, give back the rest. */
            kv_cache_set_tokens(&r->cache, r->prefill_tokens, false);
            scratch_reserve(e, k + (size_t)r->cache.tables * 2);
            k += kv_cache_shrink(&r->cache, dn->mem, r->slot, e->scratch + k);
        }
        dn->running[kept++] = dn->running[i];
    }
    dn->n_running = kept;
    if (k > 0) {
        int rc = kv_mem_release(dn->mem, e->scratch, k, e->err);
        if (rc) {
            kv_free(closing);
            fail(e, rc);
            return;
        }
    }
    for (size_t i = 0; i < n_closing; i++)
        kv_mem_seq_close(dn->mem, closing[i]);
    kv_free(closing);
    account_manager(e, dn);
    memory_sample(e, d, now);
    try_admit(e, d, now);
    start_step(e, d);
}

/* ---- Transfers ------------------------------------------------------------------------------- */

_Static_assert(KV_MAX_FLOW_LEVEL == KV_NET_MAX_LEVEL, "a policy's level range is the network's");

static uint64_t flow_tag(size_t req, int layer, int plane)
{
    return ((uint64_t)req << 20) | ((uint64_t)layer << 1) | (uint64_t)plane;
}

/* Bytes of one flow: the plane's whole-byte total split across its layers so that the parts sum to it
   exactly (the first total % layers layers carry one byte more); a flow carries at least 1 byte. */
static uint64_t flow_bytes(const request *r, int layer, int plane)
{
    double total_d = plane == PLANE_ANCHOR ? r->res->anchor_bytes : r->res->residual_bytes;
    uint64_t total = total_d > 0 ? (uint64_t)llround(total_d) : 0;
    uint64_t layers = (uint64_t)r->layers_total;
    uint64_t bytes = total / layers + ((uint64_t)layer < total % layers ? 1 : 0);
    return bytes > 0 ? bytes : 1;
}

static void start_flow(engine *e, request *r, int layer, int plane, double now)
{
    kv_flow_spec f = {
        .src = r->res->prefill_node,
        .dst = e->n_pnodes + r->res->decode_node,
        .bytes = flow_bytes(r, layer, plane),
        .priority = (r->plan.priority_mode != KV_PRIO_NONE && plane == PLANE_RESIDUAL) ? 1 : 0,
        .tag = flow_tag((size_t)(r - e->reqs), layer, plane),
    };
    if (r->plan.levels) { /* the policy's own per-flow priority (docs/policies.md, `transfer`) */
        f.has_level = 1;
        f.level = plane == PLANE_ANCHOR ? r->plan.anchor_level : r->plan.residual_level;
        double wa = r->plan.anchor_weight, wr = r->plan.residual_weight, top = wa > wr ? wa : wr;
        f.weight = (plane == PLANE_ANCHOR ? wa : wr) / top; /* in [1e-5, 1]: the ratio is checked at the answer */
    }
    kv_flow_id id;
    if (r->plane_start_s[plane] < 0)
        r->plane_start_s[plane] = now;
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
        /* Counted at its node from now until its KV arrives, so the next placements see it. */
        decode_node *dn = &e->dnodes[node];
        r->incoming = true;
        r->reserved_bytes = dn->mem ? (double)kv_cache_pages_needed(&r->cache) * kv_mem_page_bytes(dn->mem) : 0;
        dn->incoming++;
        dn->kv_reserved_bytes += r->reserved_bytes;
    }
    start_flow(e, r, layer, PLANE_ANCHOR, now);
    if (r->split && r->plan.order == KV_ORDER_CONCURRENT)
        start_flow(e, r, layer, PLANE_RESIDUAL, now);
}

/* Timeline: a whole plane's transfer (all its layers) on the sender's and the receiver's link tracks. */
static void plane_spans(engine *e, request *r, int plane, double t)
{
    if (!e->tl)
        return;
    char name[64];
    snprintf(name, sizeof name, "%s r%llu", plane == PLANE_ANCHOR ? (r->split ? "anchor" : "kv") : "residual",
             (unsigned long long)r->spec.id);
    span(e, e->host_tracks[r->res->prefill_node], name, "transfer", r->plane_start_s[plane], t, (int64_t)r->spec.id);
    span(e, e->host_tracks[e->n_pnodes + r->res->decode_node], name, "transfer", r->plane_start_s[plane], t,
         (int64_t)r->spec.id);
}

/* r's complete KV (every plane and layer) is at its decode node at t: token 1, which the prefill node's
   last logits produced, is committed now (the decode node streams it; it needs no decode step). A request
   with one output token is then done without decoding; others queue, unless already there on the anchor. */
static void kv_complete(engine *e, request *r, double t)
{
    r->res->kv_arrived_s = t;
    if (r->first_held) {
        r->first_held = false;
        commit_tokens(e, r, 1, t);
    }
    if (r->committed >= r->spec.output_tokens) {
        arrive_decode(e, r);
        finish_request(e, r);
    } else if (!r->in_wait && !r->running) {
        enqueue_decode(e, r, t);
    } else if (r->running) {
        start_step(e, r->res->decode_node); /* wakes a node whose batch was all stalled */
    }
}

void kv_engine_on_flow_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    (void)id;
    engine *e = user;
    if (e->failed)
        return;
    e->now_s = t; /* handlers below start steps and flows at the completion time */
    request *r = &e->reqs[tag >> 20];
    int layer = (int)((tag >> 1) & 0x7ffff);
    int plane = (int)(tag & 1);
    if (plane == PLANE_ANCHOR) {
        if (r->split && r->plan.order == KV_ORDER_ANCHOR_FIRST)
            start_flow(e, r, layer, PLANE_RESIDUAL, t);
        if (--r->anchor_pending == 0) {
            plane_spans(e, r, PLANE_ANCHOR, t);
            r->anchor_done = true;
            r->res->anchor_arrived_s = t;
            if (!r->split) {
                r->residual_done = true;
                kv_complete(e, r, t);
            } else if (r->residual_done) {
                kv_complete(e, r, t); /* the residual came first (concurrent flows): nothing to speculate on */
            } else if (r->spec.output_tokens > 1) {
                /* Decoding on the anchor alone could start now: the speculate hook says how far. */
                int rc = kv_engine_plan_speculation(e, r);
                if (rc) {
                    fail(e, rc);
                    return;
                }
                if (r->speculative)
                    enqueue_decode(e, r, t); /* speculates token 2 onwards on the anchor */
            }
        }
        return;
    }
    if (--r->residual_pending == 0) {
        plane_spans(e, r, PLANE_RESIDUAL, t);
        r->residual_done = true;
        r->merge_pending = true;
        /* Concurrent flows: the residual (b - a bits, no group metadata) can arrive before the anchor;
           the KV is complete only once both planes are in. */
        if (r->anchor_done)
            kv_complete(e, r, t);
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
    while (pn->n > 0 && (int)pn->n_batch < e->cfg->prefill.max_batch) {
        request *r = &e->reqs[pn->queue[pn->head]];
        if (pn->n_batch > 0 && tokens + r->spec.prompt_tokens > e->cfg->prefill.max_batch_tokens)
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
    if (e->tl) {
        char name[48];
        snprintf(name, sizeof name, "prefill B=%zu T=%ld", pn->n_batch, tokens);
        span(e, pn->track, name, "prefill", now, end, pn->n_batch == 1 ? (int64_t)e->reqs[pn->batch[0]].spec.id : -1);
    }
    /* The transfer hook answers now, at prefill start: whether a request streams layer by layer decides
       whether its flows start during prefill (docs/policies.md, "When each hook runs", exception 1). A
       layer-wise request's encodings are asked now too (exception 2): its first layer is encoded and sent
       before the prefill ends. The others are encoded at `end` (EV_PREFILL_END). */
    int layers = e->cfg->model->layers;
    bool later = false;
    for (size_t i = 0; i < pn->n_batch && !e->failed; i++) {
        request *r = &e->reqs[pn->batch[i]];
        r->res->prefill_start_s = now;
        int rc = kv_engine_plan_transfer(e, r);
        if (!rc && r->plan.layerwise)
            rc = kv_engine_plan_encoding(e, r);
        if (rc) {
            fail(e, rc);
            return;
        }
        r->res->prefill_end_s = end;
        r->first_held = true; /* its last logits give token 1 at `end`; committed when its KV is complete */
        if (r->plan.layerwise) {
            r->anchor_pending = r->layers_total;
            r->residual_pending = r->split ? r->layers_total : 0;
            for (int l = 0; l < layers; l++) {
                double ready = now + dt * (l + 1) / layers + r->encode_s * (l + 1) / layers;
                kv_eventq_push(&e->q, ready, EV_LAYER_READY, pn->batch[i], l);
            }
            r->res->encode_end_s = end + r->encode_s;
        } else {
            later = true;
        }
    }
    if (later)
        kv_eventq_push(&e->q, end, EV_PREFILL_END, p, 0);
    else
        kv_eventq_push(&e->q, end, EV_PREFILL_DONE, p, 0);
}

/* The prefill of node p's batch has ended: its requests' encodings are asked now, and their encodes run one
   after another; the node takes its next batch when the last has finished. */
static void on_prefill_end(engine *e, int p, double now)
{
    prefill_node *pn = &e->pnodes[p];
    double t_encode = now;
    for (size_t i = 0; i < pn->n_batch; i++) {
        request *r = &e->reqs[pn->batch[i]];
        if (r->plan.layerwise)
            continue;
        int rc = kv_engine_plan_encoding(e, r);
        if (rc) {
            fail(e, rc);
            return;
        }
        r->anchor_pending = r->layers_total;
        r->residual_pending = r->split ? r->layers_total : 0;
        double start = t_encode;
        t_encode += r->encode_s;
        r->res->encode_end_s = t_encode;
        if (e->tl) {
            char ename[48];
            snprintf(ename, sizeof ename, "encode r%llu", (unsigned long long)r->spec.id);
            span(e, pn->track, ename, "encode", start, t_encode, (int64_t)r->spec.id);
        }
        kv_eventq_push(&e->q, t_encode, EV_ENCODE_DONE, pn->batch[i], 0);
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
        /* Colocated: the KV is made inside the decode batch, whose admission needs its pages, so the
           transfer (its preemption mode) and encode hooks answer at arrival (exception 3). */
        rc = kv_engine_plan_transfer(e, r);
        if (!rc)
            rc = kv_engine_plan_encoding(e, r);
        if (rc) {
            fail(e, rc);
            return;
        }
        enqueue_decode(e, r, now);
        return;
    }
    r->res->prefill_node = node;
    prefill_node *pn = &e->pnodes[node];
    fifo_push(&pn->queue, &pn->head, &pn->n, &pn->cap, (int)(r - e->reqs));
    start_prefill(e, node, now);
}

/* ---- The loop ---------------------------------------------------------------------------------- */

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
        return kv_error_set(err, KV_EINPUT, "%s: request %llu never finished: %s", e->cfg->source,
                            (unsigned long long)r->spec.id, where);
    }
    return KV_OK;
}

/* The simulation; its network from host (NULL: kv_net_create). */
int kv_engine_run_loop(const kv_run_inputs *in, kv_run_result *out, kv_net_host *host, kv_error *err)
{
    engine e;
    memset(&e, 0, sizeof e);
    int rc = kv_engine_setup(&e, in, host, out, err);
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
        case EV_PREFILL_END:
            on_prefill_end(&e, ev.a, ev.t_s);
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
        kv_progress_update(in->progress, ev.t_s, e.done_count, out->events);
    }
    if (!rc && e.failed)
        rc = e.failed;
    if (!rc && e.done_count != e.n_reqs)
        rc = describe_stuck(&e, err);
    for (int i = 0; !rc && i < e.n_dnodes; i++) {
        /* Every request released its pages: the ring must hold all of them again (kvmem.h, invariant 1). */
        if (!e.dnodes[i].mem)
            continue;
        if (kv_mem_used_pages(e.dnodes[i].mem) != 0)
            rc = kv_error_set(err, KV_EFAIL, "internal: decode node %d still holds %u KV pages after the run", i,
                              kv_mem_used_pages(e.dnodes[i].mem));
        else
            rc = kv_mem_check(e.dnodes[i].mem, false, err);
    }
    if (!rc) {
        double tiers = out->tier_high_fraction + out->tier_low_fraction + out->tier_pruned_fraction;
        out->tier_high_fraction = tiers > 0 ? out->tier_high_fraction / tiers : NAN;
        out->tier_low_fraction = tiers > 0 ? out->tier_low_fraction / tiers : NAN;
        out->tier_pruned_fraction = tiers > 0 ? out->tier_pruned_fraction / tiers : NAN;
        out->kv_mem_peak_bytes = out->kv_pages_peak * out->kv_page_bytes;
        out->mean_decode_batch = out->decode_busy_s > 0 ? out->mean_decode_batch / out->decode_busy_s : 0;
        if (!e.cfg->memory.measure_manager)
            out->kv_manager_measured_s = NAN; /* wall time is only reported when asked for: it varies */
        for (size_t i = 0; i < out->n_requests; i++)
            if (out->requests[i].done_s > out->makespan_s)
                out->makespan_s = out->requests[i].done_s;
        if (e.net) {
            out->n_links = kv_net_link_count(e.net);
            out->links = kv_calloc(out->n_links ? out->n_links : 1, sizeof *out->links);
            for (size_t i = 0; i < out->n_links; i++)
                kv_net_link_stats(e.net, i, &out->links[i]);
            out->net_round_trips = kv_net_round_trips(e.net);
        }
    }
    kv_engine_free(&e);
    return rc;
}

void kv_run_result_free(kv_run_result *r)
{
    if (!r)
        return;
    if (r->requests_shared)
        kv_free_shared(r->requests, r->n_requests, sizeof *r->requests);
    else
        kv_free(r->requests);
    kv_histogram_free(&r->itl_s);
    kv_free(r->links);
    memset(r, 0, sizeof *r);
}
