/* engine_view.c — what policy hooks see of the running engine (kv_policy_view): the clock, the nodes, a
   request's route, from what the engine itself knows of its transfers. */
#include <string.h>

#include "core/base/alloc.h"
#include "core/sim/engine_internal.h"

static double view_now(void *user)
{
    const engine *e = user;
    return e->now_s;
}

/* The pool's node states, into e->view_nodes (owned by the engine, replaced on the next read). */
static int view_nodes(void *user, int pool, const kv_policy_node **out)
{
    engine *e = user;
    kv_free(e->view_nodes);
    e->view_nodes = NULL;
    int n = kv_engine_node_state(e, pool == 1, &e->view_nodes);
    *out = e->view_nodes;
    return n;
}

static const request *find_request(const engine *e, uint64_t id)
{
    if (id < e->n_reqs && e->reqs[id].spec.id == id)
        return &e->reqs[id];
    for (size_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i].spec.id == id)
            return &e->reqs[i];
    return NULL;
}

/* One host NIC as a link: the scenario's NIC bandwidth, and the engine's own flows on it. Until the
   integrator switches this to the network's link query (net.h), the engine knows how many of its flows
   cross the NIC and their bytes, not their rates: a NIC with flows counts as busy at its full bandwidth. */
static void host_link(const engine *e, int host, kv_policy_link *l)
{
    double cap = e->cfg->net.nic_bandwidth_gbps;
    int flows = e->host_flows[host];
    *l = (kv_policy_link){
        .capacity_gbps = cap,
        .rate_gbps = flows > 0 ? cap : 0,
        .utilisation = flows > 0 ? 1.0 : 0.0,
        .flows = flows,
        .bytes_in_flight = e->host_bytes[host],
        .bytes_queued = 0, /* the engine starts every flow at once: nothing waits on its side */
    };
}

/* The request's route: its prefill node's NIC out, then (once it is placed) its decode node's NIC in.
   Empty before its prefill node is chosen, and when colocated. */
static int view_route(void *user, uint64_t id, kv_policy_link *links, int max)
{
    const engine *e = user;
    const request *r = find_request(e, id);
    if (!r || e->colocated || max < 2 || r->res->prefill_node < 0)
        return 0;
    int n = 0;
    host_link(e, r->res->prefill_node, &links[n++]);
    if (r->res->decode_node >= 0)
        host_link(e, e->n_pnodes + r->res->decode_node, &links[n++]);
    return n;
}

void kv_engine_view_install(engine *e)
{
    kv_policy_view v = {.user = e, .now = view_now, .nodes = view_nodes, .route = view_route};
    kv_policy_set_view(e->policy, &v);
}

void kv_engine_view_flow(engine *e, int src, int dst, double bytes, int sign)
{
    int ends[2] = {src, dst};
    for (int k = 0; k < 2; k++) {
        e->host_flows[ends[k]] += sign;
        e->host_bytes[ends[k]] += sign * bytes;
        if (e->host_flows[ends[k]] == 0)
            e->host_bytes[ends[k]] = 0; /* no rounding residue once idle */
    }
}
