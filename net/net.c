/* net.c — the network dispatcher: picks the implementation from its table, checks arguments. */
#include "net/net.h"

#include <math.h>

#include "core/base/alloc.h"

struct kv_net {
    const kv_net_i *iface; /* the implementation's table */
    void *ctx;             /* its context */
    kv_priority_mode priority;                /* network.priority: how a class maps to a level */
    double class_weight[KV_NET_MAX_CLASSES]; /* its class weights (0: 1) */
};

/* The implementations, one row per kv_net_model (the registry: kv_net_create calls a model only
   through this table). A model that is not built has no constructor. */
typedef int (*net_create_fn)(const kv_net_config *cfg, kv_net_done_fn done, void *user, const kv_net_i **iface,
                             void **ctx, kv_error *err);
static const struct {
    kv_net_model model;
    const char *name;
    net_create_fn create;
} net_models[] = {
    {KV_NET_IDEAL, "ideal", kv_net_ideal_create},
#ifdef KV_HAVE_SIMGRID
    {KV_NET_SIMGRID, "simgrid", kv_net_simgrid_create},
#else
    {KV_NET_SIMGRID, "simgrid", NULL},
#endif
};

/* The checks every model shares. */
static int net_check(const kv_net_config *cfg, kv_error *err)
{
    const char *src = cfg->source ? cfg->source : "network";
    if (cfg->hosts < 2)
        return kv_error_set(err, KV_EINPUT, "%s: network: needs at least 2 hosts, got %d", src, cfg->hosts);
    if (!(cfg->nic_bandwidth_gbps > 0) || !isfinite(cfg->nic_bandwidth_gbps))
        return kv_error_set_key(err, KV_EINPUT, "network.nic_bandwidth_gbps",
                                "%s: network.nic_bandwidth_gbps: must be a positive number", src);
    if (!(cfg->nic_latency_s >= 0) || !isfinite(cfg->nic_latency_s))
        return kv_error_set_key(err, KV_EINPUT, "network.nic_latency_us",
                                "%s: network.nic_latency_us: must be >= 0", src);
    return KV_OK;
}

/* The network from its model's constructor, or from host's when host is not NULL. */
static int net_make(kv_net_host *host, const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out,
                    kv_error *err)
{
    *out = NULL;
    const char *src = cfg->source ? cfg->source : "network";
    int rc = net_check(cfg, err);
    if (rc != KV_OK)
        return rc;
    const kv_net_i *iface = NULL;
    void *ctx = NULL;
    size_t m = 0;
    while (m < sizeof net_models / sizeof net_models[0] && net_models[m].model != cfg->model)
        m++;
    if (m == sizeof net_models / sizeof net_models[0])
        rc = kv_error_set_key(err, KV_EINPUT, "network.model",
                              "%s: network.model: unknown model %d", src, (int)cfg->model);
    else if (!net_models[m].create)
        rc = kv_error_set_key(err, KV_EINPUT, "network.model",
                              "%s: network.model: %s is not built into this kvsim", src, net_models[m].name);
    else if (host)
        rc = host->create(host->ctx, cfg, done, user, &iface, &ctx, err);
    else
        rc = net_models[m].create(cfg, done, user, &iface, &ctx, err);
    if (rc != KV_OK)
        return rc;
    kv_net *net = kv_malloc(sizeof *net);
    net->iface = iface;
    net->ctx = ctx;
    net->priority = cfg->priority;
    for (int c = 0; c < KV_NET_MAX_CLASSES; c++)
        net->class_weight[c] = cfg->class_weight[c] > 0 ? cfg->class_weight[c] : 1.0;
    *out = net;
    return KV_OK;
}

int kv_net_create(const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out, kv_error *err)
{
    return net_make(NULL, cfg, done, user, out, err);
}

int kv_net_host_create(kv_net_host *host, const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out,
                       kv_error *err)
{
    return net_make(host, cfg, done, user, out, err);
}

int kv_net_run_body(const kv_net_config *cfg, const kv_net_body *body, kv_error *err)
{
#ifdef KV_HAVE_SIMGRID
    if (cfg->model == KV_NET_SIMGRID && cfg->run_in_child) {
        int rc = net_check(cfg, err);
        return rc != KV_OK ? rc : kv_net_simgrid_run_body(cfg, body, err);
    }
#endif
    return body->run(body->arg, NULL, err); /* its network, if any, from kv_net_create */
}

void kv_net_destroy(kv_net *net)
{
    if (!net)
        return;
    net->iface->destroy(net->ctx);
    kv_free(net);
}

const char *kv_net_name(const kv_net *net)
{
    return net->iface->name;
}

int kv_net_flow_start(kv_net *net, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err)
{
    if (flow->src == flow->dst)
        return kv_error_set(err, KV_EFAIL, "net: flow from host %d to itself", flow->src);
    if (flow->bytes == 0)
        return kv_error_set(err, KV_EFAIL, "net: flow of 0 bytes");
    if (flow->priority < 0 || flow->priority >= KV_NET_MAX_CLASSES)
        return kv_error_set(err, KV_EFAIL, "net: priority class %d out of range", flow->priority);
    kv_flow_spec f = *flow;
    if (f.has_level) {
        if (f.level < 0 || f.level > KV_NET_MAX_LEVEL)
            return kv_error_set(err, KV_EFAIL, "net: priority level %d out of range 0..%d", f.level, KV_NET_MAX_LEVEL);
        if (f.weight == 0)
            f.weight = 1.0;
        if (!(f.weight >= KV_NET_MIN_WEIGHT && f.weight <= KV_NET_MAX_WEIGHT))
            return kv_error_set(err, KV_EFAIL, "net: flow weight %g out of range %g..%g", f.weight,
                                KV_NET_MIN_WEIGHT, KV_NET_MAX_WEIGHT);
        f.has_level = 1;
    } else {
        /* Today's class under network.priority, as a level and a weight. */
        f.level = net->priority == KV_PRIO_STRICT ? f.priority : 0;
        f.weight = net->priority == KV_PRIO_WEIGHTED ? net->class_weight[f.priority] : 1.0;
    }
    return net->iface->flow_start(net->ctx, &f, now_s, out, err);
}

int kv_net_flow_cancel(kv_net *net, kv_flow_id id, kv_error *err)
{
    return net->iface->flow_cancel(net->ctx, id, err);
}

int kv_net_advance(kv_net *net, double t_limit_s, double *t_now_s, kv_error *err)
{
    return net->iface->advance(net->ctx, t_limit_s, t_now_s, err);
}

size_t kv_net_active_flows(const kv_net *net)
{
    return net->iface->active_flows(net->ctx);
}

size_t kv_net_round_trips(const kv_net *net)
{
    return net->iface->round_trips ? net->iface->round_trips(net->ctx) : 0;
}

size_t kv_net_link_count(const kv_net *net)
{
    return net->iface->link_count ? net->iface->link_count(net->ctx) : 0;
}

int kv_net_link_stats(const kv_net *net, size_t link, kv_link_stats *out)
{
    if (!net->iface->link_stats)
        return KV_EFAIL;
    return net->iface->link_stats(net->ctx, link, out);
}

int kv_net_route(const kv_net *net, int src, int dst, size_t *links, size_t max, size_t *n, kv_error *err)
{
    *n = 0;
    if (!net->iface->route)
        return kv_error_set(err, KV_EFAIL, "net %s: no route query", net->iface->name);
    if (src == dst)
        return kv_error_set(err, KV_EFAIL, "net: route from host %d to itself", src);
    return net->iface->route(net->ctx, src, dst, links, max, n, err);
}

int kv_net_link_state(kv_net *net, size_t link, kv_link_state *out, kv_error *err)
{
    if (!net->iface->link_state)
        return kv_error_set(err, KV_EFAIL, "net %s: no link state query", net->iface->name);
    if (link >= kv_net_link_count(net))
        return kv_error_set(err, KV_EFAIL, "net: link %zu out of range (%zu links)", link, kv_net_link_count(net));
    return net->iface->link_state(net->ctx, link, out, err);
}
