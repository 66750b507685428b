/* test_net_simgrid.c — the SimGrid network: exact timing, max-min sharing, priority classes, invariants. */
#include <stdlib.h>

#include "tests/net_support.h"

#define GBPS 100.0
#define LAT 2e-6
#define BPS (GBPS * 1e9 / 8.0) /* bytes per second */

/* Closed form of an uncontended flow on a star: two NICs of latency LAT. */
static double alone(double t_start, uint64_t bytes)
{
    return t_start + 2.0 * LAT + (double)bytes * 8.0 / (GBPS * 1e9);
}

static kv_net_config star(int hosts)
{
    return nett_star(KV_NET_SIMGRID, hosts, GBPS, LAT);
}

static void set_option(kv_net_config *cfg, const char *key, const char *value)
{
    cfg->option_key[cfg->n_options] = key;
    cfg->option_value[cfg->n_options] = value;
    cfg->n_options++;
}

Test(net_simgrid, one_flow_is_latency_plus_bytes_over_bandwidth_cm02)
{
    for (int split = 0; split < 2; split++) {
        nett_rec r = {0};
        kv_net_config cfg = star(2);
        cfg.split_duplex = split;
        kv_net *net = nett_create(&cfg, &r);
        cr_assert_str_eq(kv_net_name(net), "simgrid");
        nett_start(net, 0, 1, 1000000000, 0, 42, 0);
        nett_drain(net);
        cr_assert_eq(r.n, 1);
        cr_assert_eq(r.tag[0], 42);
        nett_close(r.t[0], alone(0, 1000000000), 1e-12, split ? "split-duplex" : "shared link");
        kv_net_destroy(net);
    }
}

Test(net_simgrid, one_flow_under_lv08_pays_its_documented_factors)
{
    nett_rec r = {0};
    kv_net_config cfg = star(2);
    set_option(&cfg, "network/model", "LV08");
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000000, 0, 0, 0);
    nett_drain(net);
    /* LV08: latency x 13.01, bandwidth x 0.97 (docs/network.md). */
    double want = 13.01 * 2.0 * LAT + 1e9 / (0.97 * BPS);
    nett_close(r.t[0], want, 1e-12, "LV08");
    kv_net_destroy(net);
}

Test(net_simgrid, crosstraffic_on_a_shared_link_costs_five_percent)
{
    nett_rec r = {0};
    kv_net_config cfg = star(2);
    cfg.split_duplex = 0;
    set_option(&cfg, "network/crosstraffic", "1");
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000000, 0, 0, 0);
    nett_drain(net);
    nett_close(r.t[0], 2.0 * LAT + 1.05e9 / BPS, 1e-12, "crosstraffic");
    kv_net_destroy(net);
}

Test(net_simgrid, two_flows_share_a_bottleneck_fairly)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id a = nett_start(net, 0, 2, 1000000000, 0, 0, 0);
    kv_flow_id b = nett_start(net, 1, 2, 500000000, 0, 0, 0);
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    /* Each gets half of host 2's NIC until b is done; then a runs alone. */
    nett_close(r.t[nett_find(&r, b)], 2 * LAT + 1e9 / BPS, 1e-12, "b");
    nett_close(r.t[nett_find(&r, a)], 2 * LAT + 1.5e9 / BPS, 1e-12, "a");
    kv_net_destroy(net);
}

Test(net_simgrid, max_min_gives_the_leftover_to_the_less_constrained_flow)
{
    /* f1: 0->1 and f2..f4: 0->2, 3->2, 4->2. Host 2's NIC carries three flows (B/3
       each), so f1 gets the 2B/3 that f2 leaves on host 0's NIC. */
    nett_rec r = {0};
    kv_net_config cfg = star(5);
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 300000000;
    kv_flow_id f1 = nett_start(net, 0, 1, s, 0, 1, 0);
    nett_start(net, 0, 2, s, 0, 2, 0);
    nett_start(net, 3, 2, s, 0, 3, 0);
    nett_start(net, 4, 2, s, 0, 4, 0);
    nett_drain(net);
    cr_assert_eq(r.n, 4);
    cr_assert_eq(r.id[0], f1);
    nett_close(r.t[0], 2 * LAT + 1.5 * s / BPS, 1e-12, "f1 at 2B/3");
    for (int i = 1; i < 4; i++)
        nett_close(r.t[i], 2 * LAT + 3.0 * s / BPS, 1e-12, "f2..f4 at B/3");
    for (int i = 1; i < 3; i++)
        cr_assert_lt(r.id[i], r.id[i + 1], "same-time completions come in start order");
    kv_net_destroy(net);
}

Test(net_simgrid, strict_priority_keeps_the_high_flow_as_if_alone)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    cfg.priority = KV_PRIO_STRICT;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t hi = 800000000, lo = 1200000000;
    kv_flow_id low = nett_start(net, 1, 2, lo, 1, 0, 0); /* started first: no head start */
    kv_flow_id high = nett_start(net, 0, 2, hi, 0, 0, 0);
    nett_drain(net);
    double t_high = r.t[nett_find(&r, high)], t_low = r.t[nett_find(&r, low)];
    nett_close(t_high, alone(0, hi), 0.01, "high class, 1% target");
    nett_close(t_high, alone(0, hi), 1e-6, "high class, measured error of two strict classes");
    nett_close(t_low, 2 * LAT + (double)(hi + lo) / BPS, 1e-9, "low class uses all that is left");
    kv_net_destroy(net);
}

Test(net_simgrid, strict_priority_gives_the_lower_class_what_the_higher_leaves)
{
    /* Two class-0 flows leave host 0 (B/2 each); one of them ends at host 2, whose
       NIC has B/2 left for the class-1 flow 3->2. */
    nett_rec r = {0};
    kv_net_config cfg = star(4);
    cfg.priority = KV_PRIO_STRICT;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 500000000;
    nett_start(net, 0, 1, s, 0, 0, 0);
    nett_start(net, 0, 2, s, 0, 0, 0);
    kv_flow_id low = nett_start(net, 3, 2, s / 2, 1, 0, 0);
    nett_drain(net);
    nett_close(r.t[nett_find(&r, low)], 2 * LAT + (double)s / BPS, 1e-6, "low class at B/2");
    kv_net_destroy(net);
}

Test(net_simgrid, four_strict_classes_run_one_after_the_other)
{
    nett_rec r = {0};
    kv_net_config cfg = star(5);
    cfg.priority = KV_PRIO_STRICT;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 250000000;
    kv_flow_id ids[4];
    ids[1] = nett_start(net, 2, 0, s, 1, 0, 0);
    ids[0] = nett_start(net, 1, 0, s, 0, 0, 0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.001, &t, &err), KV_OK);
    /* Later, lower classes arrive: the classes are spread again over the range. */
    ids[3] = nett_start(net, 4, 0, s, 3, 0, t);
    ids[2] = nett_start(net, 3, 0, s, 2, 0, t);
    nett_drain(net);
    cr_assert_eq(r.n, 4);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(r.id[k], ids[k], "class %d finishes %d-th", k, k + 1);
        nett_close(r.t[k], 2 * LAT + (k + 1) * (double)s / BPS, 5e-3, "class k after classes < k");
    }
    kv_net_destroy(net);
}

Test(net_simgrid, weighted_classes_share_in_the_ratio_of_their_weights)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    cfg.priority = KV_PRIO_WEIGHTED;
    cfg.class_weight[0] = 3.0;
    cfg.class_weight[1] = 1.0;
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 600000000;
    kv_flow_id a = nett_start(net, 0, 2, s, 0, 0, 0);
    kv_flow_id b = nett_start(net, 1, 2, s, 1, 0, 0);
    nett_drain(net);
    /* a at 3B/4 until done (s / (3B/4)); b has moved s/3 by then and runs alone after. */
    double ta = 2 * LAT + s / (0.75 * BPS);
    nett_close(r.t[nett_find(&r, a)], ta, 1e-9, "weight 3");
    nett_close(r.t[nett_find(&r, b)], 2 * LAT + 2.0 * s / BPS, 1e-9, "weight 1");
    kv_net_destroy(net);
}

Test(net_simgrid, classes_are_ignored_without_a_priority_mode)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id a = nett_start(net, 0, 2, 1000, 0, 0, 0);
    kv_flow_id b = nett_start(net, 1, 2, 1000, 3, 0, 0);
    nett_drain(net);
    cr_assert_eq(r.t[nett_find(&r, a)], r.t[nett_find(&r, b)]);
    kv_net_destroy(net);
}

/* Starts one follow-up flow, from host 1 to 0, in the callback of the first completion. */
static void follow_up(nett_rec *r, kv_flow_id id, uint64_t tag, double t)
{
    (void)id;
    if (tag == 1) {
        kv_flow_id *next = r->extra;
        *next = nett_start(r->net, 1, 0, 250000000, 0, 2, t);
    }
}

Test(net_simgrid, a_flow_started_by_a_completion_handler_starts_at_the_completion_time)
{
    nett_rec r = {0};
    kv_flow_id second = 0;
    r.then = follow_up;
    r.extra = &second;
    kv_net_config cfg = star(2);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 123456789, 0, 1, 0.25);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 10.0, &t, &err), KV_OK);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(t, r.t[0], "advance stops at the completion");
    nett_close(r.t[0], alone(0.25, 123456789), 1e-12, "first");
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    nett_close(r.t[1], alone(r.t[0], 250000000), 1e-12, "second starts when the first ends");
    kv_net_destroy(net);
}

Test(net_simgrid, advance_stops_at_the_limit_and_never_goes_back)
{
    nett_rec r = {0};
    kv_net_config cfg = star(2);
    kv_net *net = nett_create(&cfg, &r);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.125, &t, &err), KV_OK);
    cr_assert_eq(t, 0.125, "no flow: straight to the limit");
    nett_start(net, 0, 1, 1000000000, 0, 0, t);
    cr_assert_eq(kv_net_advance(net, 0.1875, &t, &err), KV_OK);
    cr_assert_eq(t, 0.1875);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(kv_net_advance(net, 0.15, &t, &err), KV_OK);
    cr_assert_eq(t, 0.1875, "time does not go back");
    /* A limit equal to the completion time reports it in that call. */
    double done = alone(0.125, 1000000000);
    cr_assert_eq(kv_net_advance(net, done, &t, &err), KV_OK);
    cr_assert_eq(r.n, 1);
    cr_assert_leq(t, done);
    nett_close(t, done, 1e-12, "completion at the limit");
    kv_net_destroy(net);
}

Test(net_simgrid, a_flow_may_start_later_than_the_network_time)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000000, 0, 0, 0);
    nett_start(net, 2, 1, 1000, 0, 0, 0.01); /* the first is still in flight at 0.01 */
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    nett_close(r.t[1], alone(0, 1000000000) + 1000 / BPS, 1e-9, "shares host 1's NIC briefly");
    /* A start after the next completion: that completion is reported first, at its time. */
    nett_rec r2 = {0};
    kv_net *net2 = nett_create(&cfg, &r2);
    kv_flow_id a = nett_start(net2, 0, 1, 1000, 0, 0, 0);
    kv_flow_id b = nett_start(net2, 1, 2, 1000, 0, 0, 1.0);
    kv_flow_id c = nett_start(net2, 2, 0, 1000, 0, 0, 0.5);
    cr_assert_eq(kv_net_active_flows(net2), 3);
    kv_error err;
    cr_assert_eq(kv_net_flow_cancel(net2, c, &err), KV_OK, "a flow not started yet can be cancelled");
    double t;
    cr_assert_eq(kv_net_advance(net2, 2.0, &t, &err), KV_OK);
    cr_assert_eq(r2.n, 1);
    cr_assert_eq(r2.id[0], a);
    nett_close(t, alone(0, 1000), 1e-12, "first completion");
    cr_assert_eq(kv_net_advance(net2, 2.0, &t, &err), KV_OK);
    cr_assert_eq(r2.n, 2);
    cr_assert_eq(r2.id[1], b);
    nett_close(t, alone(1.0, 1000), 1e-12, "the scheduled flow started at 1.0");
    cr_assert_eq(kv_net_advance(net2, 2.0, &t, &err), KV_OK);
    cr_assert_eq(t, 2.0);
    cr_assert_eq(r2.n, 2);
    kv_net_destroy(net2);
    kv_net_destroy(net);
}

static void cancel_next(nett_rec *r, kv_flow_id id, uint64_t tag, double t)
{
    (void)tag;
    (void)t;
    kv_error err;
    if (r->n == 1) /* the first of the batch cancels the second, already complete in SimGrid */
        cr_assert_eq(kv_net_flow_cancel(r->net, id + 1, &err), KV_OK, "%s", err.msg);
}

Test(net_simgrid, cancelled_flows_are_never_reported)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id a = nett_start(net, 0, 1, 1000000000, 0, 0, 0);
    kv_flow_id b = nett_start(net, 2, 1, 1000000000, 0, 0, 0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.02, &t, &err), KV_OK);
    cr_assert_eq(kv_net_flow_cancel(net, a, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_net_flow_cancel(net, a, &err), KV_EFAIL, "twice is an error");
    cr_assert_eq(kv_net_active_flows(net), 1);
    nett_drain(net);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.id[0], b);
    /* b had half of host 1's NIC until 0.02, then all of it. */
    nett_close(r.t[0], 0.02 + (1e9 - (0.02 - 2 * LAT) * BPS / 2) / BPS, 1e-9, "b after the cancel");
    /* Cancelling a flow of the batch being reported drops it. */
    nett_rec r2 = {0};
    r2.then = cancel_next;
    kv_net *net2 = nett_create(&cfg, &r2);
    nett_start(net2, 0, 1, 1000, 0, 0, 0);
    nett_start(net2, 2, 0, 1000, 0, 0, 0);
    nett_drain(net2);
    cr_assert_eq(r2.n, 1);
    cr_assert_eq(kv_net_active_flows(net2), 0);
    kv_net_destroy(net2);
    kv_net_destroy(net);
}

/* Random uncontended traffic: one flow at a time between random hosts, each started
   when the previous one ends (from the callback) or after a gap. */
typedef struct chain {
    int left;
    unsigned seed;
    double gap_s;
} chain;

static void chain_next(nett_rec *r, kv_flow_id id, uint64_t tag, double t)
{
    (void)id;
    (void)tag;
    chain *c = r->extra;
    if (c->left-- <= 0)
        return;
    int hosts = 6;
    int src = (int)(rand_r(&c->seed) % hosts);
    int dst = (src + 1 + (int)(rand_r(&c->seed) % (hosts - 1))) % hosts;
    uint64_t bytes = 1 + (uint64_t)rand_r(&c->seed) * 97;
    nett_start(r->net, src, dst, bytes, rand_r(&c->seed) % 2, bytes, t + c->gap_s);
}

static void run_chain(kv_net_model model, kv_net_topology topo, nett_rec *r, double gap_s)
{
    chain c = {.left = 40, .seed = 12345, .gap_s = gap_s};
    r->then = chain_next;
    r->extra = &c;
    kv_net_config cfg = nett_star(model, 6, GBPS, LAT);
    cfg.topology = topo;
    cfg.hosts_per_leaf = 2;       /* fat-tree */
    cfg.torus_dims[0] = 3;        /* torus 3 x 2 */
    cfg.torus_dims[1] = 2;
    cfg.dragonfly_groups = 1;     /* dragonfly 1 x 2 x 1 x 3 */
    cfg.dragonfly_chassis = 2;
    cfg.dragonfly_routers = 1;
    cfg.dragonfly_nodes = 3;
    kv_net *net = nett_create(&cfg, r);
    chain_next(r, 0, 0, 0.0);
    nett_drain(net);
    kv_net_destroy(net);
}

Test(net_simgrid, ideal_and_simgrid_agree_without_contention)
{
    const kv_net_topology topos[] = {KV_TOPO_STAR, KV_TOPO_FAT_TREE, KV_TOPO_TORUS, KV_TOPO_DRAGONFLY};
    for (size_t k = 0; k < sizeof topos / sizeof topos[0]; k++) {
        nett_rec ideal = {0}, sim = {0};
        run_chain(KV_NET_IDEAL, topos[k], &ideal, 1e-3);
        run_chain(KV_NET_SIMGRID, topos[k], &sim, 1e-3);
        cr_assert_eq(ideal.n, 40);
        cr_assert_eq(sim.n, ideal.n, "%s", kv_net_topology_name(topos[k]));
        for (int i = 0; i < ideal.n; i++) {
            cr_assert_eq(sim.tag[i], ideal.tag[i]);
            nett_close(sim.t[i], ideal.t[i], 1e-12, kv_net_topology_name(topos[k]));
        }
    }
}

Test(net_simgrid, runs_are_deterministic_bit_for_bit)
{
    nett_rec a = {0}, b = {0};
    run_chain(KV_NET_SIMGRID, KV_TOPO_FAT_TREE, &a, 0.0);
    run_chain(KV_NET_SIMGRID, KV_TOPO_FAT_TREE, &b, 0.0);
    cr_assert_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) {
        cr_assert_eq(a.id[i], b.id[i]);
        cr_assert(memcmp(&a.t[i], &b.t[i], sizeof(double)) == 0, "flow %d: %.17g vs %.17g", i, a.t[i], b.t[i]);
    }
}

Test(net_simgrid, several_networks_live_side_by_side_and_in_sequence)
{
    nett_rec r1 = {0}, r2 = {0};
    kv_net_config cfg = star(2);
    kv_net *n1 = nett_create(&cfg, &r1);
    cfg.nic_bandwidth_gbps = 2 * GBPS;
    kv_net *n2 = nett_create(&cfg, &r2);
    nett_start(n1, 0, 1, 1000000, 0, 0, 0);
    nett_start(n2, 0, 1, 1000000, 0, 0, 0);
    nett_drain(n2);
    nett_drain(n1);
    nett_close(r1.t[0], alone(0, 1000000), 1e-12, "first network");
    nett_close(r2.t[0], 2 * LAT + 1e6 / (2 * BPS), 1e-12, "second network, its own time");
    kv_net_destroy(n1);
    kv_net_destroy(n2);
    for (int i = 0; i < 3; i++) {
        nett_rec r = {0};
        cfg = star(2);
        kv_net *n = nett_create(&cfg, &r);
        nett_start(n, 1, 0, 1000000, 0, 0, 0);
        nett_drain(n);
        nett_close(r.t[0], alone(0, 1000000), 1e-12, "a fresh network starts at time 0");
        kv_net_destroy(n);
    }
}

Test(net_simgrid, link_stats_report_bytes_and_busy_time)
{
    nett_rec r = {0};
    kv_net_config cfg = star(3);
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000000, 0, 0, 0);
    double t;
    kv_error err;
    cr_assert_eq(kv_net_advance(net, 0.5, &t, &err), KV_OK);
    cr_assert_eq(kv_net_advance(net, 0.5, &t, &err), KV_OK);
    cr_assert_eq(t, 0.5);
    nett_start(net, 2, 1, 3000000, 0, 0, 0.5);
    double end = nett_drain(net);
    size_t n = kv_net_link_count(net);
    cr_assert_eq(n, 6, "three split-duplex NICs");
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        kv_link_stats s;
        cr_assert_eq(kv_net_link_stats(net, i, &s), KV_OK);
        cr_assert_eq(s.bandwidth_gbps, GBPS, "%s", s.name);
        if (strcmp(s.name, "nic1_DOWN") == 0) {
            cr_assert_eq(s.bytes, 4000000);
            nett_close(s.busy_s, (alone(0, 1000000) - 0) + (end - 0.5), 1e-12, "nic1_DOWN busy");
            seen++;
        } else if (strcmp(s.name, "nic0_UP") == 0) {
            cr_assert_eq(s.bytes, 1000000);
            nett_close(s.busy_s, alone(0, 1000000), 1e-12, "nic0_UP busy");
            seen++;
        } else if (strcmp(s.name, "nic1_UP") == 0) {
            cr_assert_eq(s.bytes, 0);
            cr_assert_eq(s.busy_s, 0);
            seen++;
        }
    }
    cr_assert_eq(seen, 3);
    kv_link_stats s;
    cr_assert_neq(kv_net_link_stats(net, n, &s), KV_OK);
    kv_net_destroy(net);
}
