/* net.c — the network dispatcher: picks the implementation from its table, checks arguments. */
#include "net/net.h"

#include <math.h>

#include "core/base/alloc.h"

struct kv_net {
    const kv_net_i *iface; /* the implementation's table */
    void *ctx;             /* its context */
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

int kv_net_create(const kv_net_config *cfg, kv_net_done_fn done, void *user, kv_net **out, kv_error *err)
{
    *out = NULL;
    const char *src = cfg->source ? cfg->source : "network";
    if (cfg->hosts < 2)
        return kv_error_set(err, KV_EINPUT, "%s: network: needs at least 2 hosts, got %d", src, cfg->hosts);
    if (!(cfg->nic_bandwidth_gbps > 0) || !isfinite(cfg->nic_bandwidth_gbps))
        return kv_error_set_key(err, KV_EINPUT, "network.nic_bandwidth_gbps",
                                "%s: network.nic_bandwidth_gbps: must be a positive number", src);
    if (!(cfg->nic_latency_s >= 0) || !isfinite(cfg->nic_latency_s))
        return kv_error_set_key(err, KV_EINPUT, "network.nic_latency_us",
                                "%s: network.nic_latency_us: must be >= 0", src);

    const kv_net_i *iface = NULL;
    void *ctx = NULL;
    int rc;
    size_t m = 0;
    while (m < sizeof net_models / sizeof net_models[0] && net_models[m].model != cfg->model)
        m++;
    if (m == sizeof net_models / sizeof net_models[0])
        rc = kv_error_set_key(err, KV_EINPUT, "network.model",
                              "%s: network.model: unknown model %d", src, (int)cfg->model);
    else if (!net_models[m].create)
        rc = kv_error_set_key(err, KV_EINPUT, "network.model",
                              "%s: network.model: %s is not built into this kvsim", src, net_models[m].name);
    else
        rc = net_models[m].create(cfg, done, user, &iface, &ctx, err);
    if (rc != KV_OK)
        return rc;
    kv_net *net = kv_malloc(sizeof *net);
    net->iface = iface;
    net->ctx = ctx;
    *out = net;
    return KV_OK;
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
    return net->iface->flow_start(net->ctx, flow, now_s, out, err);
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
