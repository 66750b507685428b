/* ideal.c — a contention-free network: each flow takes latency + bytes / bandwidth.
 *
 * A flow from host s to host d crosses s's NIC and d's NIC, each with
 * latency nic_latency_s, so it completes at
 *     t_start + 2 * nic_latency_s + bytes * 8 / (nic_bandwidth_gbps * 1e9).
 * Flows never slow each other down, so priority classes, levels and weights
 * change nothing; this is the closed form the tests check against and the
 * model for teaching. Completions at the same time are reported in start order.
 * Link state (kv_net_link_state): every active flow (start <= now < done) counts
 * at the full NIC rate from its start to its completion, latency included, and
 * its bytes leave at that rate during the last bytes / bandwidth seconds.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/base/alloc.h"
#include "net/net.h"

typedef struct ideal_flow {
    double t_done_s; /* completion time */
    uint64_t seq;    /* start order, breaks ties */
    kv_flow_id id;
    uint64_t tag;
    double t_start_s; /* when it starts (may be after the network's time) */
    uint64_t bytes;
    int src, dst;
} ideal_flow;

typedef struct ideal_nic {
    uint64_t bytes_out, bytes_in; /* payload bytes sent / received */
    double busy_out_s, busy_in_s; /* union of the intervals with a flow on it */
    double until_out_s, until_in_s;
} ideal_nic;

typedef struct ideal_net {
    kv_net_done_fn done;
    void *user;
    double bandwidth_bps;  /* bits per second */
    double latency_s;      /* whole path */
    double now_s;
    int hosts;
    ideal_nic *nics;       /* [hosts] */
    ideal_flow *heap;      /* min-heap on (t_done_s, seq) */
    size_t n, cap;
    uint64_t next_id;
} ideal_net;

static int flow_before(const ideal_flow *a, const ideal_flow *b)
{
    if (a->t_done_s != b->t_done_s)
        return a->t_done_s < b->t_done_s;
    return a->seq < b->seq;
}

static void heap_push(ideal_net *net, ideal_flow f)
{
    kv_grow((void **)&net->heap, sizeof *net->heap, &net->cap, net->n + 1);
    size_t i = net->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!flow_before(&f, &net->heap[parent]))
            break;
        net->heap[i] = net->heap[parent];
        i = parent;
    }
    net->heap[i] = f;
}

static void heap_remove(ideal_net *net, size_t i)
{
    ideal_flow last = net->heap[--net->n];
    if (i == net->n)
        return;
    /* Sift up or down from i. */
    while (i > 0 && flow_before(&last, &net->heap[(i - 1) / 2])) {
        net->heap[i] = net->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const ideal_flow *best = &last;
        if (l < net->n && flow_before(&net->heap[l], best)) {
            m = l;
            best = &net->heap[l];
        }
        if (r < net->n && flow_before(&net->heap[r], best))
            m = r;
        if (m == i)
            break;
        net->heap[i] = net->heap[m];
        i = m;
    }
    net->heap[i] = last;
}

static void account(double *busy, double *until, double start, double end)
{
    double from = start > *until ? start : *until;
    if (end > from)
        *busy += end - from;
    if (end > *until)
        *until = end;
}

static int ideal_flow_start(void *ctx, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err)
{
    ideal_net *net = ctx;
    if (flow->src < 0 || flow->src >= net->hosts || flow->dst < 0 || flow->dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net ideal: host out of range (%d -> %d, %d hosts)",
                            flow->src, flow->dst, net->hosts);
    double t_start = now_s > net->now_s ? now_s : net->now_s;
    double t_wire = (double)flow->bytes * 8.0 / net->bandwidth_bps;
    ideal_flow f = {.t_done_s = t_start + net->latency_s + t_wire, .seq = net->next_id,
                    .id = net->next_id, .tag = flow->tag, .t_start_s = t_start, .bytes = flow->bytes,
                    .src = flow->src, .dst = flow->dst};
    net->next_id++;
    heap_push(net, f);
    ideal_nic *s = &net->nics[flow->src], *d = &net->nics[flow->dst];
    s->bytes_out += flow->bytes;
    d->bytes_in += flow->bytes;
    account(&s->busy_out_s, &s->until_out_s, t_start, f.t_done_s);
    account(&d->busy_in_s, &d->until_in_s, t_start, f.t_done_s);
    *out = f.id;
    return KV_OK;
}

static int ideal_flow_cancel(void *ctx, kv_flow_id id, kv_error *err)
{
    ideal_net *net = ctx;
    for (size_t i = 0; i < net->n; i++) {
        if (net->heap[i].id == id) {
            heap_remove(net, i);
            return KV_OK;
        }
    }
    return kv_error_set(err, KV_EFAIL, "net ideal: no active flow %llu", (unsigned long long)id);
}

static int ideal_advance(void *ctx, double t_limit_s, double *t_now_s, kv_error *err)
{
    (void)err;
    ideal_net *net = ctx;
    if (net->n == 0 || net->heap[0].t_done_s > t_limit_s) {
        if (t_limit_s > net->now_s && isfinite(t_limit_s))
            net->now_s = t_limit_s;
        *t_now_s = net->now_s;
        return KV_OK;
    }
    double t = net->heap[0].t_done_s;
    net->now_s = t > net->now_s ? t : net->now_s;
    while (net->n > 0 && net->heap[0].t_done_s == t) {
        ideal_flow f = net->heap[0];
        heap_remove(net, 0);
        net->done(net->user, f.id, f.tag, net->now_s);
    }
    *t_now_s = net->now_s;
    return KV_OK;
}

static size_t ideal_active_flows(void *ctx)
{
    return ((ideal_net *)ctx)->n;
}

static size_t ideal_link_count(void *ctx)
{
    return 2 * (size_t)((ideal_net *)ctx)->hosts;
}

static int ideal_link_stats(void *ctx, size_t link, kv_link_stats *out)
{
    ideal_net *net = ctx;
    if (link >= 2 * (size_t)net->hosts)
        return KV_EFAIL;
    const ideal_nic *nic = &net->nics[link / 2];
    int up = link % 2 == 0;
    snprintf(out->name, sizeof out->name, "host%zu-%s", link / 2, up ? "up" : "down");
    out->bytes = up ? nic->bytes_out : nic->bytes_in;
    out->busy_s = up ? nic->busy_out_s : nic->busy_in_s;
    out->bandwidth_gbps = net->bandwidth_bps / 1e9;
    return KV_OK;
}

/* Link 2h is host h's NIC up (sending), 2h + 1 its NIC down (receiving). */
static int ideal_route(void *ctx, int src, int dst, size_t *links, size_t max, size_t *n, kv_error *err)
{
    ideal_net *net = ctx;
    if (src < 0 || src >= net->hosts || dst < 0 || dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net ideal: host out of range (%d -> %d, %d hosts)", src, dst, net->hosts);
    *n = 2;
    if (max < 2)
        return kv_error_set(err, KV_EFAIL, "net ideal: a route has 2 links, room for %zu", max);
    links[0] = 2 * (size_t)src;
    links[1] = 2 * (size_t)dst + 1;
    return KV_OK;
}

static int ideal_link_state(void *ctx, size_t link, kv_link_state *out, kv_error *err)
{
    ideal_net *net = ctx;
    if (link >= 2 * (size_t)net->hosts)
        return kv_error_set(err, KV_EFAIL, "net ideal: link %zu out of range", link);
    memset(out, 0, sizeof *out);
    int host = (int)(link / 2), up = link % 2 == 0;
    double bytes_per_s = net->bandwidth_bps / 8.0;
    for (size_t i = 0; i < net->n; i++) {
        const ideal_flow *f = &net->heap[i];
        if ((up ? f->src : f->dst) != host)
            continue;
        if (f->t_start_s > net->now_s) {
            out->bytes_queued += f->bytes;
            continue;
        }
        out->flows++;
        double left = ceil((f->t_done_s - net->now_s) * bytes_per_s);
        out->bytes_in_flight += left < (double)f->bytes ? (uint64_t)left : f->bytes;
    }
    out->capacity_gbps = net->bandwidth_bps / 1e9;
    out->rate_gbps = out->flows * out->capacity_gbps;
    out->utilisation = out->flows > 0 ? 1.0 : 0.0;
    return KV_OK;
}

static void ideal_destroy(void *ctx)
{
    ideal_net *net = ctx;
    if (!net)
        return;
    kv_free(net->heap);
    kv_free(net->nics);
    kv_free(net);
}

static const kv_net_i ideal_iface = {
    .api_version = KV_NET_API_VERSION,
    .name = "ideal",
    .destroy = ideal_destroy,
    .flow_start = ideal_flow_start,
    .flow_cancel = ideal_flow_cancel,
    .advance = ideal_advance,
    .active_flows = ideal_active_flows,
    .link_count = ideal_link_count,
    .link_stats = ideal_link_stats,
    .route = ideal_route,
    .link_state = ideal_link_state,
};

int kv_net_ideal_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                        const kv_net_i **iface, void **ctx, kv_error *err)
{
    (void)err;
    ideal_net *net = kv_calloc(1, sizeof *net);
    net->done = done;
    net->user = user;
    net->bandwidth_bps = cfg->nic_bandwidth_gbps * 1e9;
    net->latency_s = 2.0 * cfg->nic_latency_s;
    net->hosts = cfg->hosts;
    net->nics = kv_calloc((size_t)cfg->hosts, sizeof *net->nics);
    net->next_id = 1;
    *iface = &ideal_iface;
    *ctx = net;
    return KV_OK;
}
