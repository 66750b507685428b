/* sg_net.c — the simgrid network model, kvsim side: the flows and the requests that carry them to the
 * SimGrid child (the config is checked first by sg_options.c; the child is started, watched, read and
 * reaped by sg_supervise.c).
 *
 * Design notes (docs/network.md has the user's view).
 * - SimGrid 3.32 cannot give a second, fresh engine in one process, and it aborts
 *   on some bad input. Each network therefore runs SimGrid in its own forked child
 *   (sg_child.cpp): creating a network forks, destroying it kills the child. A
 *   crash or abort in SimGrid ends the child, never kvsim; the parent reports it
 *   with SimGrid's last words, which the child writes to a temporary file.
 * - Requests go over a socket (sg_proto.h). Flow ids are assigned here, so a START
 *   needs no answer and is buffered until the next request that needs one (then
 *   both go in one write). An ADVANCE that cannot find a completion (below the
 *   horizon the child gave, t_next_s in sg_proto.h; to the network's own time; with
 *   no flow in the child) is answered here with no round trip; the child's clock then
 *   lags (sync_s) until the next START or SYNC. A run costs about one round trip per
 *   completion date, plus one per flow start whose completion is not the next event
 *   (docs/network.md "Performance").
 * - Completions come back in batches (all flows completing at one date, in start
 *   order) and are handed to the callback one by one. The callback may start
 *   flows (they start at that date: the child has not moved) or cancel flows,
 *   including ones of the same batch not yet handed over (they are then dropped
 *   here, never reported: net.h invariant 3).
 * - A flow started later than the network's time waits in a heap here; advance
 *   stops the child at its start time, starts it there, and goes on.
 * - After any failure of the child the network is broken: every later call
 *   returns the same error.
 * - In-child mode (kv_net_run_body, the bottom of this file): a whole run happens in the child and its
 *   network is an sg_net whose "socket" is the driver in the same process (net->local): every request
 *   above is a function call, the same code computes the same bytes, no round trip is counted.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "net/net.h"
#include "net/simgrid/sg_options.h"
#include "net/simgrid/sg_proto.h"
#include "net/simgrid/sg_supervise.h"

/* Topology sizes SimGrid builds in a few seconds and bounded memory (measured, docs/network.md):
   its torus and dragonfly zones cost about quadratic time / ~100 KB per position. */

/* ---- talking to the child ---- */

static void push_out(sg_net *net, kv_sg_request rq)
{
    kv_grow((void **)&net->out, sizeof *net->out, &net->cap_out, net->n_out + 1);
    net->out[net->n_out++] = rq;
}

static int flush_out(sg_net *net, kv_error *err)
{
    if (net->n_out == 0)
        return KV_OK;
    size_t n = net->n_out;
    net->n_out = 0;
    if (kv_sg_write_full(net, net->out, n * sizeof *net->out) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "while starting flows", err);
    return KV_OK;
}

/* Sends rq (after the buffered STARTs) and reads the answer's head; items and
   message stay to be read by the caller. */
static int request(sg_net *net, const kv_sg_request *rq, kv_sg_reply *head, kv_error *err)
{
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    /* The child's clock lags (ADVANCEs answered here): bring it to sync_s before anything that reads
       or changes its state; buffered STARTs carry a later t_s, an ADVANCE past sync_s gets there. */
    if (net->n_out == 0 && net->sync_s > -INFINITY && !(rq->op == KV_SG_ADVANCE && rq->t_s >= net->sync_s))
        push_out(net, (kv_sg_request){.op = KV_SG_SYNC, .t_s = net->sync_s});
    net->sync_s = -INFINITY;
    push_out(net, *rq);
    size_t n = net->n_out;
    net->n_out = 0;
    if (!net->local)
        net->round_trips++; /* in-child mode: a function call */
    if (kv_sg_write_full(net, net->out, n * sizeof *net->out) != 0 || kv_sg_read_full(net, head, sizeof *head) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    return KV_OK;
}

/* ---- flows that start in the future ---- */

static int later_before(const kv_sg_request *a, const kv_sg_request *b)
{
    return a->t_s != b->t_s ? a->t_s < b->t_s : a->id < b->id;
}

static void later_push(sg_net *net, kv_sg_request rq)
{
    kv_grow((void **)&net->later, sizeof *net->later, &net->cap_later, net->n_later + 1);
    size_t i = net->n_later++;
    while (i > 0 && later_before(&rq, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    net->later[i] = rq;
}

static void later_remove(sg_net *net, size_t i)
{
    kv_sg_request last = net->later[--net->n_later];
    if (i == net->n_later)
        return;
    while (i > 0 && later_before(&last, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const kv_sg_request *best = &last;
        if (l < net->n_later && later_before(&net->later[l], best))
            best = &net->later[m = l];
        if (r < net->n_later && later_before(&net->later[r], best))
            m = r;
        if (m == i)
            break;
        net->later[i] = net->later[m];
        i = m;
    }
    net->later[i] = last;
}

/* ---- the interface ---- */

static int sg_flow_start(void *ctx, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (flow->src < 0 || flow->src >= net->hosts || flow->dst < 0 || flow->dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net simgrid: host out of range (%d -> %d, %d hosts)", flow->src,
                            flow->dst, net->hosts);
    if (!isfinite(now_s))
        return kv_error_set(err, KV_EFAIL, "net simgrid: flow start time %g", now_s);
    kv_sg_request rq = {.op = KV_SG_START, .src = flow->src, .dst = flow->dst, .priority = flow->priority,
                        .has_level = flow->has_level, .level = flow->level, .weight = flow->weight, .id = net->next_id, .bytes = flow->bytes, .tag = flow->tag,
                        .t_s = now_s > net->now_s ? now_s : net->now_s};
    if (rq.t_s > net->now_s) {
        later_push(net, rq); /* started by sg_advance when the network gets there */
    } else {
        push_out(net, rq); /* carries the child to t_s (sync_s <= t_s) */
        net->horizon_s = net->sync_s = -INFINITY;
        if (net->n_out >= 256) {
            int rc = flush_out(net, err);
            if (rc != KV_OK)
                return rc;
        }
    }
    net->links_fresh = net->states_fresh = 0;
    net->active++;
    *out = net->next_id++;
    return KV_OK;
}

static int sg_flow_cancel(void *ctx, kv_flow_id id, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    /* A flow of the batch being handed over is done in the child: drop it here. */
    for (size_t i = net->i_batch + 1; net->delivering && i < net->n_batch; i++) {
        if (net->batch[i].id == id) {
            net->batch[i].id = 0;
            net->active--;
            return KV_OK;
        }
    }
    if (id == 0 || id >= net->next_id)
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    for (size_t i = 0; i < net->n_later; i++) {
        if (net->later[i].id == id) {
            later_remove(net, i);
            net->active--;
            return KV_OK;
        }
    }
    kv_sg_request rq = {.op = KV_SG_CANCEL, .id = id};
    kv_sg_reply head;
    net->horizon_s = -INFINITY;
    int rc = request(net, &rq, &head, err);
    if (rc != KV_OK)
        return rc;
    rc = kv_sg_finish_reply(net, &head, err);
    if (rc != KV_OK)
        return rc;
    if (head.count == 1) /* not active: already reported or cancelled, the caller's error */
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    net->links_fresh = net->states_fresh = 0;
    net->active--;
    return KV_OK;
}

/* One ADVANCE to t_s; the completions it finds are left in net->batch. Answered here, with no
   completion and no round trip (unless ask_always), in three cases:
   - at or before the network's time: the child reported every completion at that date when it got
     there, and a flow started since cannot complete before SimGrid steps, which it does only for a
     later date (the STARTs stay buffered);
   - no flow in the child (the scheduled ones wait here): nothing can complete;
   - below the horizon, with nothing sent since it was given (sg_proto.h).
   In the last two the child's clock lags (sync_s) until the next request. */
static int advance_once(sg_net *net, double t_s, kv_sg_reply *head, kv_error *err)
{
    if (net->ask_always) {
        /* the reference: every advance with flows in flight goes to the child */
    } else if (t_s <= net->now_s) {
        *head = (kv_sg_reply){.code = KV_OK, .t_now_s = net->now_s, .t_next_s = -INFINITY};
        net->n_batch = 0;
        return KV_OK;
    } else if (net->n_out == 0 && (net->active == net->n_later || t_s < net->horizon_s)) {
        /* No flow in the child (those scheduled wait here): nothing can complete; the child catches
           up with the next START. Below the horizon, with nothing sent since it was given: the same. */
        net->now_s = t_s;
        net->sync_s = t_s;
        net->links_fresh = net->states_fresh = 0;
        *head = (kv_sg_reply){.code = KV_OK, .t_now_s = net->now_s, .t_next_s = net->horizon_s};
        net->n_batch = 0;
        return KV_OK;
    }
    kv_sg_request rq = {.op = KV_SG_ADVANCE, .t_s = t_s};
    net->horizon_s = -INFINITY;
    int rc = request(net, &rq, head, err);
    if (rc != KV_OK)
        return rc;
    kv_grow((void **)&net->batch, sizeof *net->batch, &net->cap_batch, head->count + 1);
    if (head->count && kv_sg_read_full(net, net->batch, head->count * sizeof *net->batch) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    rc = kv_sg_finish_reply(net, head, err);
    if (rc != KV_OK)
        return rc;
    if (head->t_now_s < net->now_s) {
        /* Completions before a time answered here: a horizon was wrong. Never silent. */
        net->broken = 1;
        kv_error_set(&net->failure, KV_EFAIL,
                     "net simgrid: flows completed at %.9g s, before %.9g s, where kvsim had moved without asking "
                     "(t_next_s was wrong)", head->t_now_s, net->now_s);
        *err = net->failure;
        return KV_EFAIL;
    }
    net->links_fresh = net->states_fresh = 0;
    net->now_s = head->t_now_s;
    net->n_batch = head->count;
    if (head->count == 0)
        net->horizon_s = head->t_next_s;
    return KV_OK;
}

static int sg_advance(void *ctx, double t_limit_s, double *t_now_s, kv_error *err)
{
    sg_net *net = ctx;
    if (net->delivering)
        return kv_error_set(err, KV_EFAIL, "net simgrid: kv_net_advance called from a completion callback");
    if (t_limit_s != t_limit_s)
        return kv_error_set(err, KV_EFAIL, "net simgrid: advance to NaN");
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (net->active == 0) {
        /* Nothing in flight or scheduled: no need to ask. The child catches up with
           the next START, which carries this time. */
        if (t_limit_s > net->now_s && isfinite(t_limit_s))
            net->now_s = t_limit_s;
        *t_now_s = net->now_s;
        return KV_OK;
    }
    kv_sg_reply head;
    for (;;) {
        /* Stop first where scheduled flows start, and start them there. */
        int start_due = net->n_later > 0 && net->later[0].t_s <= t_limit_s;
        int rc = advance_once(net, start_due ? net->later[0].t_s : t_limit_s, &head, err);
        if (rc != KV_OK)
            return rc;
        if (head.count > 0 || !start_due)
            break;
        while (net->n_later > 0 && net->later[0].t_s <= net->now_s) {
            kv_sg_request rq = net->later[0];
            rq.t_s = net->now_s;
            push_out(net, rq);
            net->horizon_s = net->sync_s = -INFINITY;
            later_remove(net, 0);
        }
    }
    net->delivering = 1;
    for (net->i_batch = 0; net->i_batch < net->n_batch; net->i_batch++) {
        kv_sg_done d = net->batch[net->i_batch];
        if (d.id == 0)
            continue; /* cancelled by an earlier callback of this batch */
        net->active--;
        net->done(net->user, d.id, d.tag, d.t_done_s);
    }
    net->delivering = 0;
    net->n_batch = 0;
    *t_now_s = net->now_s;
    return KV_OK;
}

static size_t sg_active_flows(void *ctx)
{
    return ((sg_net *)ctx)->active;
}

static size_t sg_round_trips(void *ctx)
{
    return ((sg_net *)ctx)->round_trips;
}

static size_t sg_link_count(void *ctx)
{
    return ((sg_net *)ctx)->n_links;
}

static int sg_link_stats(void *ctx, size_t link, kv_link_stats *out)
{
    sg_net *net = ctx;
    if (link >= net->n_links)
        return KV_EFAIL;
    if (!net->links_fresh) {
        kv_error err;
        kv_sg_request rq = {.op = KV_SG_STATS};
        kv_sg_reply head;
        if (request(net, &rq, &head, &err) != KV_OK)
            return KV_EFAIL;
        if (head.code != KV_OK) {
            kv_sg_finish_reply(net, &head, &err);
            return KV_EFAIL;
        }
        if (head.count != net->n_links ||
            kv_sg_read_full(net, net->links, net->n_links * sizeof *net->links) != 0) {
            kv_sg_child_failed(net, KV_EFAIL, "during the run", &err);
            return KV_EFAIL;
        }
        if (kv_sg_finish_reply(net, &head, &err) != KV_OK)
            return KV_EFAIL;
        net->links_fresh = 1;
    }
    *out = net->links[link];
    return KV_OK;
}

/* The route src -> dst, asked of the child once per pair and kept. */
static int route_of(sg_net *net, int src, int dst, const uint32_t **links, size_t *n, kv_error *err)
{
    if (src < 0 || src >= net->hosts || dst < 0 || dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net simgrid: host out of range (%d -> %d, %d hosts)", src, dst,
                            net->hosts);
    size_t k = (size_t)src * (size_t)net->hosts + (size_t)dst;
    if (net->route_n[k] < 0) {
        kv_sg_request rq = {.op = KV_SG_ROUTE, .src = src, .dst = dst};
        kv_sg_reply head;
        int rc = request(net, &rq, &head, err);
        if (rc != KV_OK)
            return rc;
        uint32_t *items = kv_calloc(head.count + 1, sizeof *items);
        if (head.count && kv_sg_read_full(net, items, head.count * sizeof *items) != 0) {
            kv_free(items);
            return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
        }
        rc = kv_sg_finish_reply(net, &head, err);
        if (rc != KV_OK) {
            kv_free(items);
            return rc;
        }
        net->route[k] = items;
        net->route_n[k] = (int32_t)head.count;
    }
    *links = net->route[k];
    *n = (size_t)net->route_n[k];
    return KV_OK;
}

static int sg_route(void *ctx, int src, int dst, size_t *links, size_t max, size_t *n, kv_error *err)
{
    sg_net *net = ctx;
    const uint32_t *r = NULL;
    int rc = route_of(net, src, dst, &r, n, err);
    if (rc != KV_OK)
        return rc;
    if (*n > max)
        return kv_error_set(err, KV_EFAIL, "net simgrid: the route %d -> %d has %zu links, room for %zu", src, dst,
                            *n, max);
    for (size_t i = 0; i < *n; i++)
        links[i] = r[i];
    return KV_OK;
}

/* One LINKSTATE round trip for all links (cached until the network moves), plus the bytes of the
   flows that wait here for their start time. */
static int sg_link_state(void *ctx, size_t link, kv_link_state *out, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (link >= net->n_links)
        return kv_error_set(err, KV_EFAIL, "net simgrid: link %zu out of range", link);
    if (!net->states_fresh) {
        /* Routes of the waiting flows first: their round trips cannot sit inside LINKSTATE's. */
        for (size_t i = 0; i < net->n_later; i++) {
            const uint32_t *r;
            size_t n;
            int rc = route_of(net, net->later[i].src, net->later[i].dst, &r, &n, err);
            if (rc != KV_OK)
                return rc;
        }
        kv_sg_request rq = {.op = KV_SG_LINKSTATE};
        kv_sg_reply head;
        int rc = request(net, &rq, &head, err);
        if (rc != KV_OK)
            return rc;
        if (head.code == KV_OK && head.count != net->n_links)
            return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
        if (head.count && kv_sg_read_full(net, net->states, head.count * sizeof *net->states) != 0)
            return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
        rc = kv_sg_finish_reply(net, &head, err);
        if (rc != KV_OK)
            return rc;
        for (size_t i = 0; i < net->n_later; i++) {
            size_t k = (size_t)net->later[i].src * (size_t)net->hosts + (size_t)net->later[i].dst;
            for (int32_t j = 0; j < net->route_n[k]; j++)
                net->states[net->route[k][j]].bytes_queued += net->later[i].bytes;
        }
        net->states_fresh = 1;
    }
    *out = net->states[link];
    return KV_OK;
}

static void sg_destroy(void *ctx)
{
    sg_net *net = ctx;
    if (!net)
        return;
    kv_sg_stop(net);
    for (size_t k = 0; net->route && k < (size_t)net->hosts * (size_t)net->hosts; k++)
        kv_free(net->route[k]);
    kv_free(net->route);
    kv_free(net->route_n);
    kv_free(net->states);
    kv_free(net->out);
    kv_free(net->in);
    kv_free(net->later);
    kv_free(net->batch);
    kv_free(net->links);
    kv_free(net->suspects);
    kv_free(net->source);
    kv_free(net);
}

static const kv_net_i sg_iface = {
    .api_version = KV_NET_API_VERSION,
    .name = "simgrid",
    .destroy = sg_destroy,
    .flow_start = sg_flow_start,
    .flow_cancel = sg_flow_cancel,
    .advance = sg_advance,
    .active_flows = sg_active_flows,
    .link_count = sg_link_count,
    .link_stats = sg_link_stats,
    .route = sg_route,
    .link_state = sg_link_state,
    .round_trips = sg_round_trips,
};

/* A network's state before its child (or its driver in this process) is there. */
static sg_net *sg_net_new(const kv_net_config *cfg, kv_net_done_fn done, void *user)
{
    sg_net *net = kv_calloc(1, sizeof *net);
    net->done = done;
    net->user = user;
    net->hosts = cfg->hosts;
    net->ask_always = cfg->ask_always != 0;
    net->next_id = 1;
    net->fd = -1;
    net->cpu_seen_s = -1;
    net->in = kv_malloc(KV_SG_IN_BYTES);
    net->horizon_s = net->sync_s = -INFINITY;
    net->watchdog_ms = (int)ceil(1e3 * (cfg->watchdog_s > 0 ? cfg->watchdog_s : KV_NET_WATCHDOG_DEFAULT_S));
    char suspects[2048] = "";
    for (int i = 0; i < cfg->n_options; i++) {
        if (strcmp(cfg->option_key[i], "log") == 0)
            continue;
        char w[700];
        size_t used = strlen(suspects);
        snprintf(suspects + used, sizeof suspects - used, "%s%s", net->n_suspects ? ", " : "",
                 kv_sg_option_where(cfg, i, w, sizeof w));
        net->n_suspects++;
    }
    if (net->n_suspects)
        net->suspects = kv_strdup(suspects);
    net->source = kv_strdup(cfg->source ? cfg->source : "network");
    return net;
}

/* The platform's links are known: the caches sized to them. */
static void sg_net_links(sg_net *net, uint32_t links)
{
    net->n_links = links;
    net->links = kv_calloc(net->n_links + 1, sizeof *net->links);
    net->states = kv_calloc(net->n_links + 1, sizeof *net->states);
    size_t pairs = (size_t)net->hosts * (size_t)net->hosts;
    net->route = kv_calloc(pairs, sizeof *net->route);
    net->route_n = kv_malloc(pairs * sizeof *net->route_n);
    for (size_t k = 0; k < pairs; k++)
        net->route_n[k] = -1;
}

int kv_net_simgrid_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                          const kv_net_i **iface, void **ctx, kv_error *err)
{
    int rc = kv_sg_check_config(cfg, err);
    if (rc != KV_OK)
        return rc;
    sg_net *net = sg_net_new(cfg, done, user);
    uint32_t links = 0;
    rc = kv_sg_spawn(net, cfg, &links, err);
    if (rc != KV_OK) {
        sg_destroy(net);
        return rc;
    }
    sg_net_links(net, links);
    *iface = &sg_iface;
    *ctx = net;
    return KV_OK;
}

/* ---- in-child mode: the whole run in the SimGrid child (kv_net_run_body) ----
   The parent forks the child as for a network (same platform checks, same READY), then waits for
   one answer: the run's end. In the child's main line (SimGrid's maestro) body->run runs; the run's network is an
   sg_net whose requests are function calls into the driver (net->local): the code above computes
   exactly what it computes over the socket. The child then writes a KV_SG_RESULT head, the run's
   kv_error and (on success) what body->save writes, and exits; SimGrid's step cap answers with a
   stuck head instead. The parent's wait fails when the child dies, or uses no CPU for
   network.watchdog_s (stopped, or asleep in SimGrid). */

#define SG_OUT_BYTES (256 * 1024)

/* What the child needs of the parent's call (its copy, made by fork). */
typedef struct sg_child_run {
    const kv_net_body *body;
    const kv_net_config *cfg; /* the platform's config */
    kv_sg_child_fds fds;      /* kvsim's stdout and stderr, kept by the child */
    kv_sg_local *local;       /* the driver, once body runs */
    int created;              /* the run's network was made */
    char *out;                /* bytes of results not yet written: [0, n_out) */
    size_t n_out;
} sg_child_run;

static int local_create(void *ctx, const kv_net_config *cfg, kv_net_done_fn done, void *user, const kv_net_i **iface,
                        void **impl, kv_error *err)
{
    sg_child_run *cr = ctx;
    if (cr->created)
        return kv_error_set(err, KV_EFAIL, "net simgrid: a run in the SimGrid child has one network");
    if (cfg->hosts != cr->cfg->hosts || cfg->topology != cr->cfg->topology || cfg->model != cr->cfg->model)
        return kv_error_set(err, KV_EFAIL, "net simgrid: the run's network is not the one its child built");
    int rc = kv_sg_check_config(cfg, err);
    if (rc != KV_OK)
        return rc;
    sg_net *net = sg_net_new(cfg, done, user);
    net->local = cr->local;
    uint32_t links = 0;
    char key[64], msg[900];
    rc = kv_sg_local_configure(cr->local, cfg, &links, key, sizeof key, msg, sizeof msg);
    if (rc != KV_OK) {
        sg_destroy(net);
        return kv_sg_ready_error(err, rc, cfg->source ? cfg->source : "network", key, msg);
    }
    sg_net_links(net, links);
    cr->created = 1;
    *iface = &sg_iface;
    *impl = net;
    return KV_OK;
}

static int write_fd(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The child's writer of results: SG_OUT_BYTES at a time. */
static int child_put(void *ctx, void *buf, size_t n)
{
    sg_child_run *cr = ctx;
    if (cr->n_out + n > SG_OUT_BYTES) {
        if (write_fd(cr->fds.sock, cr->out, cr->n_out) != 0)
            return -1;
        cr->n_out = 0;
    }
    if (n > SG_OUT_BYTES)
        return write_fd(cr->fds.sock, buf, n);
    memcpy(cr->out + cr->n_out, buf, n);
    cr->n_out += n;
    return 0;
}

/* The child, after READY, in SimGrid's maestro: the run, then its results; never returns. */
static void child_body(void *arg, kv_sg_local *local)
{
    sg_child_run *cr = arg;
    cr->local = local;
    if (dup2(cr->fds.out, STDOUT_FILENO) < 0 || dup2(cr->fds.err, STDERR_FILENO) < 0)
        _exit(0); /* the parent then reports a child that closed its connection */
    close(cr->fds.out);
    close(cr->fds.err);
    kv_net_host host = {.create = local_create, .ctx = cr};
    kv_error err;
    kv_error_clear(&err);
    int rc = cr->body->run(cr->body->arg, &host, &err);
    fflush(stdout); /* _exit below flushes nothing */
    fflush(stderr);
    cr->out = kv_malloc(SG_OUT_BYTES);
    kv_stream out = {.io = child_put, .ctx = cr};
    kv_sg_reply head = {.code = rc, .flags = KV_SG_RESULT, .msg_len = (uint32_t)sizeof err};
    kv_stream_put(&out, &head, sizeof head);
    kv_stream_put(&out, &err, sizeof err);
    if (rc == KV_OK)
        cr->body->save(cr->body->arg, &out, &err); /* fails only when the parent is gone */
    if (!out.failed)
        write_fd(cr->fds.sock, cr->out, cr->n_out);
    _exit(0);
}

/* The parent's reader of results. */
static int parent_get(void *ctx, void *buf, size_t n)
{
    return kv_sg_read_full(ctx, buf, n);
}

/* The parent's wait for the run's end and its results. */
static int read_result(sg_net *net, const kv_net_body *body, kv_error *err)
{
    net->watch_cpu = 1;
    kv_sg_reply head;
    if (kv_sg_read_full(net, &head, sizeof head) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    if (!(head.flags & KV_SG_RESULT)) { /* the step cap, or an exception the child could only report */
        int rc = kv_sg_finish_reply(net, &head, err);
        return rc != KV_OK ? rc : kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    }
    kv_error child_err;
    if (head.msg_len != sizeof child_err || kv_sg_read_full(net, &child_err, sizeof child_err) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    if (head.code != KV_OK) {
        child_err.msg[sizeof child_err.msg - 1] = 0;
        child_err.key[sizeof child_err.key - 1] = 0;
        *err = child_err;
        return head.code;
    }
    kv_stream in = {.io = parent_get, .ctx = net};
    int rc = body->load(body->arg, &in, err);
    if (in.failed)
        return kv_sg_child_failed(net, KV_EFAIL, "while sending the run's results", err);
    return rc;
}

int kv_net_simgrid_run_body(const kv_net_config *cfg, const kv_net_body *body, kv_error *err)
{
    int rc = kv_sg_check_config(cfg, err);
    if (rc != KV_OK)
        return rc;
    sg_net *net = sg_net_new(cfg, NULL, NULL);
    sg_child_run cr = {.body = body, .cfg = cfg};
    uint32_t links = 0;
    rc = kv_sg_spawn_run(net, cfg, child_body, &cr, &cr.fds, &links, err);
    if (rc == KV_OK)
        rc = read_result(net, body, err);
    sg_destroy(net); /* kills and reaps the child */
    return rc;
}
