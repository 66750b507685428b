/* test_net_linkstate.c — kv_net_route and kv_net_link_state against closed forms (ideal) and max-min shares (SimGrid). */
#include <stdlib.h>

#include "tests/net_support.h"

#define GBPS 100.0
#define LAT 2e-6
#define BPS (GBPS * 1e9 / 8.0) /* bytes per second */

static kv_link_state state(kv_net *net, size_t link)
{
    kv_link_state s;
    kv_error err;
    cr_assert_eq(kv_net_link_state(net, link, &s, &err), KV_OK, "link_state: %s", err.msg);
    return s;
}

/* The route's links, checked to be src's sending and dst's receiving side. */
static void route2(kv_net *net, int src, int dst, size_t out[2])
{
    size_t links[8], n = 0;
    kv_error err;
    cr_assert_eq(kv_net_route(net, src, dst, links, 8, &n, &err), KV_OK, "route: %s", err.msg);
    cr_assert_eq(n, 2, "a star route crosses two NICs, got %zu links", n);
    out[0] = links[0];
    out[1] = links[1];
}

static void advance_to(kv_net *net, double t)
{
    double now;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, t, &now, &err), KV_OK, "advance: %s", err.msg);
    cr_assert_eq(now, t, "no completion before %g", t);
}

Test(net_linkstate, ideal_links_follow_the_closed_form)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 3, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    size_t a[2], b[2];
    route2(net, 0, 2, a);
    route2(net, 1, 2, b);
    cr_assert_eq(a[0], 0);
    cr_assert_eq(a[1], 5);
    cr_assert_eq(b[0], 2);
    cr_assert_eq(b[1], a[1], "both flows end on host 2's receiving link");
    kv_link_stats st;
    cr_assert_eq(kv_net_link_stats(net, a[1], &st), KV_OK);
    cr_assert_str_eq(st.name, "host2-down");
    const uint64_t s = 1000000000;
    nett_start(net, 0, 2, s, 0, 0, 0);
    nett_start(net, 1, 2, s / 2, 0, 0, 0);
    nett_start(net, 1, 2, 777, 0, 0, 1.0); /* scheduled: queued, not in flight */
    advance_to(net, 0.02);
    kv_link_state d = state(net, a[1]), u0 = state(net, a[0]), idle = state(net, 1);
    cr_assert_eq(d.flows, 2);
    cr_assert_eq(d.capacity_gbps, GBPS);
    cr_assert_eq(d.rate_gbps, 2 * GBPS, "contention-free: each flow at the full NIC rate");
    cr_assert_eq(d.utilisation, 1.0);
    /* Each flow's bytes leave at B during its last bytes / B seconds. */
    double left_a = ceil((2 * LAT + s / BPS - 0.02) * BPS), left_b = ceil((2 * LAT + s / 2 / BPS - 0.02) * BPS);
    cr_assert_eq(d.bytes_in_flight, (uint64_t)left_a + (uint64_t)left_b);
    cr_assert_eq(d.bytes_queued, 777);
    cr_assert_eq(u0.flows, 1);
    cr_assert_eq(u0.bytes_in_flight, (uint64_t)left_a);
    cr_assert_eq(u0.bytes_queued, 0);
    cr_assert_eq(idle.flows, 0);
    cr_assert_eq(idle.rate_gbps, 0.0);
    cr_assert_eq(idle.utilisation, 0.0);
    cr_assert_eq(idle.bytes_in_flight, 0);
    nett_drain(net);
    d = state(net, a[1]);
    cr_assert_eq(d.flows, 0);
    cr_assert_eq(d.bytes_in_flight + d.bytes_queued, 0);
    kv_net_destroy(net);
}

Test(net_linkstate, queries_out_of_range_fail_with_a_message)
{
    for (int m = 0; m < 2; m++) {
        nett_rec r = {0};
        kv_net_config cfg = nett_star(m ? KV_NET_SIMGRID : KV_NET_IDEAL, 3, GBPS, LAT);
        kv_net *net = nett_create(&cfg, &r);
        kv_link_state s;
        size_t links[1], n = 0;
        kv_error err;
        cr_assert_eq(kv_net_link_state(net, kv_net_link_count(net), &s, &err), KV_EFAIL);
        cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
        cr_assert_eq(kv_net_route(net, 0, 7, links, 1, &n, &err), KV_EFAIL);
        cr_assert_eq(kv_net_route(net, 0, 1, links, 1, &n, &err), KV_EFAIL, "room for 1 of 2 links");
        cr_assert_eq(n, 2, "the number needed");
        kv_net_destroy(net);
    }
}

/* SimGrid star: k flows into host k (from hosts 0..k-1) share its receiving NIC at B/k each. */
static void simgrid_shares(int k)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, k + 1, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 1000000000;
    for (int i = 0; i < k; i++)
        nett_start(net, i, k, s, 0, 0, 0);
    nett_start(net, 0, k, 4242, 0, 0, 0.5); /* scheduled */
    const double t = 0.01;
    advance_to(net, t);
    size_t rt[2];
    route2(net, 0, k, rt);
    kv_link_stats st;
    cr_assert_eq(kv_net_link_stats(net, rt[1], &st), KV_OK);
    cr_assert(strstr(st.name, "DOWN"), "the route ends on the receiver's down link, got %s", st.name);
    kv_link_state d = state(net, rt[1]), u = state(net, rt[0]);
    cr_assert_eq(d.flows, k);
    nett_close(d.capacity_gbps, GBPS, 1e-12, "capacity");
    nett_close(d.rate_gbps, GBPS, 1e-9, "the shared link is full");
    nett_close(d.utilisation, 1.0, 1e-9, "utilisation");
    nett_close(u.rate_gbps, GBPS / k, 1e-9, "one sender at B/k");
    nett_close(u.utilisation, 1.0 / k, 1e-9, "one sender at 1/k");
    double moved = (t - 2 * LAT) * BPS / k; /* each flow since its latency was paid */
    double want = k * ((double)s - moved);
    cr_assert(fabs((double)d.bytes_in_flight - want) <= 2.0 * k, "in flight %llu, want %.1f",
              (unsigned long long)d.bytes_in_flight, want);
    cr_assert(fabs((double)u.bytes_in_flight - ((double)s - moved)) <= 2.0, "sender in flight %llu",
              (unsigned long long)u.bytes_in_flight);
    cr_assert_eq(d.bytes_queued, 4242);
    cr_assert_eq(u.bytes_queued, 4242);
    /* Asking changes nothing: the flows finish at the max-min closed form. */
    nett_drain(net);
    for (int i = 0; i < r.n; i++)
        if (r.id[i] <= (kv_flow_id)k)
            nett_close(r.t[i], 2 * LAT + k * (double)s / BPS, 1e-12, "B/k each");
    kv_net_destroy(net);
}

Test(net_linkstate, simgrid_two_flows_share_a_nic_half_and_half)
{
    simgrid_shares(2);
}

Test(net_linkstate, simgrid_three_flows_share_a_nic_a_third_each)
{
    simgrid_shares(3);
}

Test(net_linkstate, simgrid_a_flow_paying_its_latency_counts_with_rate_zero)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 2, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000, 0, 0, 0);
    advance_to(net, LAT);
    size_t rt[2];
    route2(net, 0, 1, rt);
    kv_link_state u = state(net, rt[0]);
    cr_assert_eq(u.flows, 1);
    cr_assert_eq(u.rate_gbps, 0.0);
    cr_assert_eq(u.bytes_in_flight, 1000);
    nett_drain(net);
    kv_net_destroy(net);
}
