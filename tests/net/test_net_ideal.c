/* test_net_ideal.c — the ideal network follows its closed form and keeps net.h's invariants. */
#include "tests/net_support.h"

#define GBPS 100.0
#define LAT 2e-6

static double closed_form(double t_start, uint64_t bytes)
{
    return t_start + 2.0 * LAT + (double)bytes * 8.0 / (GBPS * 1e9);
}

Test(net_ideal, single_flow_is_latency_plus_bytes_over_bandwidth)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 4, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    cr_assert_str_eq(kv_net_name(net), "ideal");
    nett_start(net, 0, 1, 1000000000, 0, 7, 0.5);
    nett_drain(net);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.tag[0], 7);
    cr_assert_eq(r.t[0], closed_form(0.5, 1000000000), "got %.17g", r.t[0]);
    kv_net_destroy(net);
}

Test(net_ideal, flows_never_slow_each_other)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 3, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id a = nett_start(net, 0, 2, 1 << 30, 0, 1, 0);
    kv_flow_id b = nett_start(net, 1, 2, 1 << 29, 1, 2, 0);
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    cr_assert_eq(r.id[0], b, "the smaller flow finishes first");
    cr_assert_eq(r.t[nett_find(&r, a)], closed_form(0, 1 << 30));
    cr_assert_eq(r.t[nett_find(&r, b)], closed_form(0, 1 << 29));
    kv_net_destroy(net);
}

Test(net_ideal, same_time_completions_come_in_start_order_in_one_advance)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 4, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id ids[3];
    for (int i = 0; i < 3; i++)
        ids[i] = nett_start(net, i, 3, 4096, 0, (uint64_t)i, 1.0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, INFINITY, &t, &err), KV_OK);
    cr_assert_eq(r.n, 3, "all three in the same call");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r.id[i], ids[i]);
    cr_assert_eq(t, closed_form(1.0, 4096));
    kv_net_destroy(net);
}

Test(net_ideal, advance_stops_at_the_limit_and_never_goes_back)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 2, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000000, 0, 0, 0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.01, &t, &err), KV_OK);
    cr_assert_eq(t, 0.01);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(kv_net_advance(net, 0.005, &t, &err), KV_OK);
    cr_assert_eq(t, 0.01, "time does not go back");
    cr_assert_eq(kv_net_advance(net, 1.0, &t, &err), KV_OK);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(t, closed_form(0, 1000000000));
    kv_net_destroy(net);
}

Test(net_ideal, cancelled_flows_are_never_reported)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 2, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id a = nett_start(net, 0, 1, 1000, 0, 0, 0);
    kv_flow_id b = nett_start(net, 1, 0, 1000, 0, 1, 0);
    kv_error err;
    cr_assert_eq(kv_net_flow_cancel(net, a, &err), KV_OK);
    cr_assert_neq(kv_net_flow_cancel(net, a, &err), KV_OK, "twice is an error");
    nett_drain(net);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.id[0], b);
    kv_net_destroy(net);
}

Test(net_ideal, link_stats_count_bytes_and_busy_time)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 2, GBPS, LAT);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000, 0, 0, 0);
    double end = nett_drain(net);
    cr_assert_eq(kv_net_link_count(net), 4);
    kv_link_stats s;
    cr_assert_eq(kv_net_link_stats(net, 0, &s), KV_OK);
    cr_assert_str_eq(s.name, "host0-up");
    cr_assert_eq(s.bytes, 1000000);
    cr_assert_eq(s.busy_s, end);
    cr_assert_eq(kv_net_link_stats(net, 3, &s), KV_OK);
    cr_assert_eq(s.bytes, 1000000);
    cr_assert_eq(kv_net_link_stats(net, 1, &s), KV_OK);
    cr_assert_eq(s.bytes, 0);
    kv_net_destroy(net);
}

Test(net_ideal, bad_config_is_bad_input)
{
    nett_rec r = {0};
    kv_net *net = NULL;
    kv_error err;
    kv_net_config cfg = nett_star(KV_NET_IDEAL, 2, 0.0, LAT);
    cr_assert_eq(kv_net_create(&cfg, nett_done, &r, &net, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "test.yaml") && strstr(err.msg, "nic_bandwidth_gbps"), "got: %s", err.msg);
    cfg = nett_star(KV_NET_IDEAL, 1, GBPS, LAT);
    cr_assert_eq(kv_net_create(&cfg, nett_done, &r, &net, &err), KV_EINPUT);
    cr_assert_null(net);
}

Test(net_ideal, topology_names_round_trip)
{
    const char *names[] = {"star", "fat-tree", "torus", "dragonfly", "platform"};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(kv_net_topology_parse(names[i]), i);
        cr_assert_str_eq(kv_net_topology_name((kv_net_topology)i), names[i]);
    }
    cr_assert_eq(kv_net_topology_parse("hypercube"), -1);
}
