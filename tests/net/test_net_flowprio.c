/* test_net_flowprio.c — per-flow priority levels and weights (kv_flow_spec.level/weight) on both network models. */
#include <stdlib.h>

#include "tests/net_support.h"

#define GBPS 100.0
#define LAT 2e-6
#define BPS (GBPS * 1e9 / 8.0) /* bytes per second */

static kv_net_config star(kv_net_model model, int hosts)
{
    return nett_star(model, hosts, GBPS, LAT);
}

/* Starts a flow with its own level and weight. */
static kv_flow_id start_lv(kv_net *net, int src, int dst, uint64_t bytes, int level, double weight, double now)
{
    kv_flow_spec f = {.src = src, .dst = dst, .bytes = bytes, .has_level = 1, .level = level, .weight = weight};
    kv_flow_id id = 0;
    kv_error err;
    int rc = kv_net_flow_start(net, &f, now, &id, &err);
    cr_assert_eq(rc, KV_OK, "flow_start: %s", err.msg);
    return id;
}

Test(net_flowprio, two_levels_on_one_bottleneck_the_low_one_waits_then_takes_all)
{
    for (int mode = 0; mode < 2; mode++) {
        nett_rec r = {0};
        kv_net_config cfg = star(KV_NET_SIMGRID, 3);
        cfg.priority = mode ? KV_PRIO_STRICT : KV_PRIO_NONE; /* levels work under any network.priority */
        kv_net *net = nett_create(&cfg, &r);
        const uint64_t hi = 800000000, lo = 1200000000;
        kv_flow_id low = start_lv(net, 1, 2, lo, 1, 1, 0); /* started first: no head start */
        kv_flow_id high = start_lv(net, 0, 2, hi, 0, 1, 0);
        double t;
        kv_error err;
        cr_assert_eq(kv_net_advance(net, 0.01, &t, &err), KV_OK, "%s", err.msg);
        size_t route[8], n = 0;
        cr_assert_eq(kv_net_route(net, 1, 2, route, 8, &n, &err), KV_OK, "%s", err.msg);
        kv_link_state up1;
        cr_assert_eq(kv_net_link_state(net, route[0], &up1, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(up1.flows, 1);
        cr_assert_eq(up1.rate_gbps, 0.0, "the low level gets nothing while the high one fills the link");
        cr_assert_eq(up1.bytes_in_flight, lo);
        nett_drain(net);
        nett_close(r.t[nett_find(&r, high)], 2 * LAT + (double)hi / BPS, 1e-12, "high level as if alone");
        nett_close(r.t[nett_find(&r, low)], 2 * LAT + (double)(hi + lo) / BPS, 1e-12, "low level takes all after");
        kv_net_destroy(net);
    }
}

/* 40 flows into host 0 on 4 levels of 10: each level's flows share the link equally and finish
   together, one level after the other. */
static void forty_flows(double t_out[40], const int level_of[4])
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 41);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 25000000;
    kv_flow_id ids[40];
    for (int i = 39; i >= 0; i--) /* lowest levels first */
        ids[i] = start_lv(net, 1 + i, 0, s, level_of[i / 10], 1, 0);
    nett_drain(net);
    cr_assert_eq(r.n, 40);
    for (int i = 0; i < 40; i++)
        t_out[i] = r.t[nett_find(&r, ids[i])];
    kv_net_destroy(net);
}

Test(net_flowprio, four_levels_of_ten_flows_run_one_level_after_the_other)
{
    const int levels[4] = {0, 1, 2, 3};
    double t[40];
    forty_flows(t, levels);
    for (int i = 0; i < 40; i++)
        nett_close(t[i], 2 * LAT + (i / 10 + 1) * 10 * 25000000.0 / BPS, 1e-9, "level k after levels < k");
}

Test(net_flowprio, forty_levels_far_apart_keep_their_order_exactly)
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 41);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 25000000;
    kv_flow_id ids[40];
    for (int i = 39; i >= 0; i--)
        ids[i] = start_lv(net, 1 + i, 0, s, i * 1000 + 7, 1, 0); /* request order as the level */
    nett_drain(net);
    cr_assert_eq(r.n, 40);
    for (int i = 0; i < 40; i++) {
        cr_assert_eq(r.id[i], ids[i], "level %d finishes %d-th", i * 1000 + 7, i + 1);
        nett_close(r.t[i], 2 * LAT + (i + 1) * (double)s / BPS, 1e-9, "one level at a time, at full rate");
    }
    kv_net_destroy(net);
}

Test(net_flowprio, weights_three_to_one_within_a_level_share_three_quarters_and_a_quarter)
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 3);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 600000000;
    kv_flow_id a = start_lv(net, 0, 2, s, 5, 3.0, 0);
    kv_flow_id b = start_lv(net, 1, 2, s, 5, 1.0, 0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.01, &t, &err), KV_OK, "%s", err.msg);
    kv_link_state up0, up1;
    cr_assert_eq(kv_net_link_state(net, 0, &up0, &err), KV_OK, "%s", err.msg);
    size_t route[8], n = 0;
    cr_assert_eq(kv_net_route(net, 1, 2, route, 8, &n, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_net_link_state(net, route[0], &up1, &err), KV_OK, "%s", err.msg);
    size_t ra[8];
    cr_assert_eq(kv_net_route(net, 0, 2, ra, 8, &n, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_net_link_state(net, ra[0], &up0, &err), KV_OK, "%s", err.msg);
    nett_close(up0.rate_gbps, 0.75 * GBPS, 1e-9, "weight 3 at 3/4");
    nett_close(up1.rate_gbps, 0.25 * GBPS, 1e-9, "weight 1 at 1/4");
    nett_drain(net);
    nett_close(r.t[nett_find(&r, a)], 2 * LAT + s / (0.75 * BPS), 1e-9, "weight 3");
    nett_close(r.t[nett_find(&r, b)], 2 * LAT + 2.0 * s / BPS, 1e-9, "weight 1");
    kv_net_destroy(net);
}

Test(net_flowprio, a_higher_level_bottlenecked_elsewhere_leaves_the_rest_to_the_lower)
{
    /* Two level-0 flows leave host 0 (B/2 each); one ends at host 2, whose NIC has B/2 left for
       the level-1 flow 3 -> 2. */
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 4);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 500000000;
    start_lv(net, 0, 1, s, 0, 1, 0);
    start_lv(net, 0, 2, s, 0, 1, 0);
    kv_flow_id low = start_lv(net, 3, 2, s / 2, 1, 1, 0);
    nett_drain(net);
    nett_close(r.t[nett_find(&r, low)], 2 * LAT + (double)s / BPS, 1e-12, "low level at B/2");
    kv_net_destroy(net);
}

Test(net_flowprio, two_runs_give_the_same_times_bit_for_bit)
{
    const int levels[4] = {3, 0, 2, 1};
    double a[40], b[40];
    forty_flows(a, levels);
    forty_flows(b, levels);
    for (int i = 0; i < 40; i++)
        cr_assert_eq(a[i], b[i], "flow %d: %.17g then %.17g", i, a[i], b[i]);
}

Test(net_flowprio, class_flows_keep_todays_times_next_to_levelled_ones)
{
    /* Without has_level a flow's class decides, as before: two class flows under strict, with
       no levelled flow in the run, finish exactly as the class test of test_net_simgrid.c. */
    nett_rec r = {0}, q = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 3);
    cfg.priority = KV_PRIO_WEIGHTED;
    cfg.class_weight[0] = 3.0;
    cfg.class_weight[1] = 1.0;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 600000000;
    kv_flow_id a = nett_start(net, 0, 2, s, 0, 0, 0);
    kv_flow_id b = nett_start(net, 1, 2, s, 1, 0, 0);
    nett_drain(net);
    /* The same weights given as levels. */
    kv_net_config cfg2 = star(KV_NET_SIMGRID, 3);
    kv_net *net2 = nett_create(&cfg2, &q);
    kv_flow_id a2 = start_lv(net2, 0, 2, s, 0, 3.0, 0);
    kv_flow_id b2 = start_lv(net2, 1, 2, s, 0, 1.0, 0);
    nett_drain(net2);
    nett_close(q.t[nett_find(&q, a2)], r.t[nett_find(&r, a)], 1e-9, "weight 3, as class 0 of weight 3");
    nett_close(q.t[nett_find(&q, b2)], r.t[nett_find(&r, b)], 1e-9, "weight 1, as class 1 of weight 1");
    kv_net_destroy(net);
    kv_net_destroy(net2);
}

Test(net_flowprio, on_the_ideal_network_levels_and_weights_change_nothing)
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_IDEAL, 3);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t hi = 800000000, lo = 1200000000;
    kv_flow_id low = start_lv(net, 1, 2, lo, 9, 0.5, 0);
    kv_flow_id high = start_lv(net, 0, 2, hi, 0, 7.0, 0);
    nett_drain(net);
    cr_assert_eq(r.t[nett_find(&r, high)], 2 * LAT + (double)hi * 8.0 / (GBPS * 1e9), "contention-free");
    cr_assert_eq(r.t[nett_find(&r, low)], 2 * LAT + (double)lo * 8.0 / (GBPS * 1e9), "contention-free");
    kv_net_destroy(net);
}

Test(net_flowprio, levels_and_weights_out_of_range_are_refused)
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_IDEAL, 3);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id id;
    kv_error err;
    const struct { int level; double weight; } bad[] = {{-1, 1}, {KV_NET_MAX_LEVEL + 1, 1}, {0, -1}, {0, 1e9}, {0, NAN}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_flow_spec f = {.src = 0, .dst = 1, .bytes = 10, .has_level = 1, .level = bad[i].level,
                          .weight = bad[i].weight};
        kv_error_clear(&err);
        cr_assert_eq(kv_net_flow_start(net, &f, 0, &id, &err), KV_EFAIL, "case %zu", i);
        cr_assert(strstr(err.msg, bad[i].level != 0 ? "level" : "weight"), "case %zu: %s", i, err.msg);
    }
    cr_assert_eq(kv_net_active_flows(net), 0);
    kv_flow_spec ok = {.src = 0, .dst = 1, .bytes = 10, .has_level = 1, .level = 65535, .weight = 0};
    cr_assert_eq(kv_net_flow_start(net, &ok, 0, &id, &err), KV_OK, "%s", err.msg);
    kv_net_destroy(net);
}

Test(net_flowprio, a_first_levelled_flow_takes_over_from_running_class_flows)
{
    nett_rec r = {0};
    kv_net_config cfg = star(KV_NET_SIMGRID, 3);
    cfg.priority = KV_PRIO_STRICT;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t hi = 400000000, lo = 1200000000;
    kv_flow_id low = nett_start(net, 1, 2, lo, 1, 0, 0); /* a class flow, level 1 under strict */
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.001, &t, &err), KV_OK, "%s", err.msg);
    kv_flow_id high = start_lv(net, 0, 2, hi, 0, 1, t);
    nett_drain(net);
    nett_close(r.t[nett_find(&r, high)], 0.001 + 2 * LAT + (double)hi / BPS, 1e-9, "the levelled flow as if alone");
    nett_close(r.t[nett_find(&r, low)], 2 * LAT + (double)(hi + lo) / BPS, 1e-9, "the class flow waits, then ends");
    kv_net_destroy(net);
}
