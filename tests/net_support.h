/* net_support.h — helpers for the network tests (test_net_*.c): configs, a completion recorder, a run loop. */
#ifndef KV_TEST_NET_SUPPORT_H
#define KV_TEST_NET_SUPPORT_H

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "net/net.h"

#define NETT_MAX 256

/* What the completion callback saw, in order. */
typedef struct nett_rec {
    int n;
    kv_flow_id id[NETT_MAX];
    uint64_t tag[NETT_MAX];
    double t[NETT_MAX];
    kv_net *net;                     /* for callbacks that start or cancel flows */
    void (*then)(struct nett_rec *r, kv_flow_id id, uint64_t tag, double t); /* optional reaction */
    void *extra;
} nett_rec;

static inline void nett_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    nett_rec *r = user;
    cr_assert_lt(r->n, NETT_MAX);
    r->id[r->n] = id;
    r->tag[r->n] = tag;
    r->t[r->n] = t;
    r->n++;
    if (r->then)
        r->then(r, id, tag, t);
}

/* A star of `hosts` with split-duplex NICs of gbps and latency_s, under `model`. */
static inline kv_net_config nett_star(kv_net_model model, int hosts, double gbps, double latency_s)
{
    kv_net_config c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.topology = KV_TOPO_STAR;
    c.hosts = hosts;
    c.nic_bandwidth_gbps = gbps;
    c.nic_latency_s = latency_s;
    c.split_duplex = 1;
    c.source = "test.yaml";
    return c;
}

/* Creates the network, or skips the test visibly when SimGrid is not built in. */
static inline kv_net *nett_create(const kv_net_config *cfg, nett_rec *r)
{
    kv_net *net = NULL;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_create(cfg, nett_done, r, &net, &err);
    if (rc != KV_OK && cfg->model == KV_NET_SIMGRID && strstr(err.msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim (%s)", err.msg);
    cr_assert_eq(rc, KV_OK, "create: %s", err.msg);
    r->net = net;
    return net;
}

static inline kv_flow_id nett_start(kv_net *net, int src, int dst, uint64_t bytes, int prio, uint64_t tag, double now)
{
    kv_flow_spec f = {.src = src, .dst = dst, .bytes = bytes, .priority = prio, .tag = tag};
    kv_flow_id id = 0;
    kv_error err;
    int rc = kv_net_flow_start(net, &f, now, &id, &err);
    cr_assert_eq(rc, KV_OK, "flow_start: %s", err.msg);
    return id;
}

/* Advances until no flow is left; returns the final time. */
static inline double nett_drain(kv_net *net)
{
    double t = 0;
    kv_error err;
    while (kv_net_active_flows(net) > 0) {
        int rc = kv_net_advance(net, INFINITY, &t, &err);
        cr_assert_eq(rc, KV_OK, "advance: %s", err.msg);
    }
    return t;
}

/* Index of flow id in the record, or -1. */
static inline int nett_find(const nett_rec *r, kv_flow_id id)
{
    for (int i = 0; i < r->n; i++)
        if (r->id[i] == id)
            return i;
    return -1;
}

static inline void nett_close(double got, double want, double rel, const char *what)
{
    cr_assert(fabs(got - want) <= rel * fabs(want), "%s: got %.17g, want %.17g (rel. error %.3g > %.3g)", what, got,
              want, fabs(got - want) / fabs(want), rel);
}

#endif
