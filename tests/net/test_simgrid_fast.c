/* test_simgrid_fast.c — the SimGrid driver's per-pair route cache against SimGrid's own routes and fresh networks. */
#include <stdlib.h>

#include "tests/net_support.h"

#define HOSTS 8
#define BYTES 10000000ull

/* A fat-tree of 4 leaves (2 hosts each): routes inside a leaf and across it differ in links and latency. */
static kv_net_config fat_tree(void)
{
    kv_net_config c = nett_star(KV_NET_SIMGRID, HOSTS, 100.0, 2e-6);
    c.topology = KV_TOPO_FAT_TREE;
    c.hosts_per_leaf = 2;
    c.switch_latency_s = 50e-6;
    c.switch_bandwidth_gbps = 40.0;
    c.oversubscription = 1;
    return c;
}

/* Every ordered pair, in an order that changes source and leaf at almost every step. */
static int pairs(int src[], int dst[])
{
    int n = 0;
    for (int k = 0; k < HOSTS * HOSTS; k++) {
        int i = (k * 5) % HOSTS, j = (k * 3 + k / HOSTS) % HOSTS;
        if (i == j)
            continue;
        int seen = 0;
        for (int m = 0; m < n; m++)
            seen = seen || (src[m] == i && dst[m] == j);
        if (!seen) {
            src[n] = i;
            dst[n] = j;
            n++;
        }
    }
    for (int i = 0; i < HOSTS; i++)
        for (int j = 0; j < HOSTS; j++) {
            int seen = i == j;
            for (int m = 0; m < n && !seen; m++)
                seen = src[m] == i && dst[m] == j;
            if (!seen) {
                src[n] = i;
                dst[n] = j;
                n++;
            }
        }
    return n;
}

static size_t route(kv_net *net, int src, int dst, size_t links[16])
{
    size_t n = 0;
    kv_error err;
    cr_assert_eq(kv_net_route(net, src, dst, links, 16, &n, &err), KV_OK, "route: %s", err.msg);
    cr_assert_gt(n, 0);
    return n;
}

static int on_route(const size_t *links, size_t n, size_t l)
{
    for (size_t k = 0; k < n; k++)
        if (links[k] == l)
            return 1;
    return 0;
}

/* The duration of one lone flow src -> dst on a network that routed nothing before. */
static double fresh_duration(int src, int dst)
{
    nett_rec r = {0};
    kv_net_config cfg = fat_tree();
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, src, dst, BYTES, 0, 0, 0);
    double t = nett_drain(net);
    cr_assert_eq(r.n, 1);
    kv_net_destroy(net);
    return t;
}

Test(simgrid_fast, lone_flows_over_every_pair_cross_their_own_route)
{
    int src[HOSTS * HOSTS], dst[HOSTS * HOSTS];
    int n = pairs(src, dst);
    cr_assert_eq(n, HOSTS * (HOSTS - 1));
    nett_rec r = {0};
    kv_net_config cfg = fat_tree();
    kv_net *net = nett_create(&cfg, &r);
    size_t n_links = kv_net_link_count(net);
    uint64_t *before = calloc(n_links, sizeof *before);
    cr_assert_not_null(before);
    double t = 0, inside = 0, across = 0;
    for (int p = 0; p < n; p++) {
        for (size_t l = 0; l < n_links; l++) {
            kv_link_stats st;
            cr_assert_eq(kv_net_link_stats(net, l, &st), KV_OK);
            before[l] = st.bytes;
        }
        nett_start(net, src[p], dst[p], BYTES, 0, (uint64_t)p, t);
        double end = nett_drain(net);
        cr_assert_eq(r.n, p + 1);
        double d = end - t, want = fresh_duration(src[p], dst[p]);
        nett_close(d, want, 1e-9, "a flow's duration after other pairs were routed");
        if (src[p] / 2 == dst[p] / 2)
            inside = d;
        else
            across = d;
        size_t links[16], k = route(net, src[p], dst[p], links);
        for (size_t l = 0; l < n_links; l++) {
            kv_link_stats st;
            cr_assert_eq(kv_net_link_stats(net, l, &st), KV_OK);
            uint64_t want_bytes = on_route(links, k, l) ? BYTES : 0;
            cr_assert_eq(st.bytes - before[l], want_bytes, "pair %d -> %d, link %zu (%s): %llu bytes, want %llu",
                         src[p], dst[p], l, st.name, (unsigned long long)(st.bytes - before[l]),
                         (unsigned long long)want_bytes);
        }
        t = end + 1e-3;
        double now;
        kv_error err;
        cr_assert_eq(kv_net_advance(net, t, &now, &err), KV_OK, "advance: %s", err.msg);
    }
    cr_assert(inside > 0 && across > inside, "the fixture must tell routes apart: inside %g s, across %g s", inside,
              across);
    free(before);
    kv_net_destroy(net);
}

Test(simgrid_fast, concurrent_flows_are_counted_on_their_own_links)
{
    int src[HOSTS * HOSTS], dst[HOSTS * HOSTS];
    int n = pairs(src, dst);
    nett_rec r = {0};
    kv_net_config cfg = fat_tree();
    kv_net *net = nett_create(&cfg, &r);
    size_t n_links = kv_net_link_count(net);
    int *want = calloc(n_links, sizeof *want);
    cr_assert_not_null(want);
    /* Each pair twice (the second start of a pair uses the kept route), all in flight at once. */
    for (int round = 0; round < 2; round++) {
        for (int p = 0; p < n; p += 3) {
            nett_start(net, src[p], dst[p], BYTES * (uint64_t)(1 + p % 4), 0, (uint64_t)p, 1e-5 * round);
            size_t links[16], k = route(net, src[p], dst[p], links);
            for (size_t m = 0; m < k; m++)
                want[links[m]]++;
        }
        double now;
        kv_error err;
        cr_assert_eq(kv_net_advance(net, 1e-5 * (round + 1), &now, &err), KV_OK, "advance: %s", err.msg);
        cr_assert_eq(r.n, 0, "no flow ends within 10 us");
        for (size_t l = 0; l < n_links; l++) {
            kv_link_state s;
            cr_assert_eq(kv_net_link_state(net, l, &s, &err), KV_OK, "link_state: %s", err.msg);
            cr_assert_eq((int)s.flows, want[l], "round %d, link %zu: %d flows, want %d", round, l, (int)s.flows,
                         want[l]);
        }
    }
    nett_drain(net);
    free(want);
    kv_net_destroy(net);
}
