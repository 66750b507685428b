/* engine_view.c — what policy hooks see of the running engine (kv_policy_view): the clock, the nodes, and
   a request's route as the network reports it. */
#include <string.h>

#include "core/base/alloc.h"
#include "core/sim/engine_internal.h"
#include "net/net.h"

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

/* A link no flow has used yet: the network is built with the first transfer (engine_setup.c). */
static void idle_link(const engine *e, kv_policy_link *l)
{
    *l = (kv_policy_link){.capacity_gbps = e->cfg->net.nic_bandwidth_gbps};
}

/* The request's route, from the network's own link query (net.h kv_net_route, kv_net_link_state): once
   it is placed, every link from its prefill node to its decode node; before that, the first link of the
   route to decode node 0, the prefill node's own uplink on the built-in topologies. Empty before its
   prefill node is chosen, and when colocated. A failed query fails the run. */
static int view_route(void *user, uint64_t id, kv_policy_link *links, int max)
{
    engine *e = user;
    const request *r = find_request(e, id);
    if (!r || e->colocated || max < 2 || r->res->prefill_node < 0)
        return 0;
    bool placed = r->res->decode_node >= 0;
    if (!e->net) {
        idle_link(e, &links[0]);
        if (placed)
            idle_link(e, &links[1]);
        return placed ? 2 : 1;
    }
    size_t idx[KV_POLICY_MAX_ROUTE], n = 0;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_route(e->net, r->res->prefill_node, e->n_pnodes + (placed ? r->res->decode_node : 0), idx,
                          (size_t)(max < KV_POLICY_MAX_ROUTE ? max : KV_POLICY_MAX_ROUTE), &n, &err);
    if (!rc && !placed && n > 1)
        n = 1;
    for (size_t i = 0; !rc && i < n; i++) {
        kv_link_state st;
        rc = kv_net_link_state(e->net, idx[i], &st, &err);
        links[i] = (kv_policy_link){st.capacity_gbps, st.rate_gbps, st.utilisation, st.flows,
                                    (double)st.bytes_in_flight, (double)st.bytes_queued};
    }
    if (rc) {
        if (!e->failed) {
            *e->err = err;
            e->failed = rc;
        }
        return 0;
    }
    return (int)n;
}

void kv_engine_view_install(engine *e)
{
    kv_policy_view v = {.user = e, .now = view_now, .nodes = view_nodes, .route = view_route};
    kv_policy_set_view(e->policy, &v);
}
