/* test_net_topology.c — the SimGrid topologies: fat-tree oversubscription, torus and dragonfly routes, platform files. */
#include <stdlib.h>

#include "tests/net_support.h"
#include "tests/support.h"

#define GBPS 100.0
#define LAT 1e-6
#define BPS (GBPS * 1e9 / 8.0)

static kv_net_config fat_tree(int hosts, int per_leaf)
{
    kv_net_config c = nett_star(KV_NET_SIMGRID, hosts, GBPS, LAT);
    c.topology = KV_TOPO_FAT_TREE;
    c.hosts_per_leaf = per_leaf;
    return c;
}

/* Two flows leave leaf 0 for leaf 1 at once; returns the later completion time. */
static double two_cross_leaf_flows(const kv_net_config *cfg, uint64_t bytes)
{
    nett_rec r = {0};
    kv_net *net = nett_create(cfg, &r);
    nett_start(net, 0, 2, bytes, 0, 0, 0);
    nett_start(net, 1, 3, bytes, 0, 0, 0);
    double end = nett_drain(net);
    cr_assert_eq(r.n, 2);
    kv_net_destroy(net);
    return end;
}

Test(net_topology, fat_tree_with_full_bisection_does_not_slow_cross_leaf_flows)
{
    kv_net_config cfg = fat_tree(4, 2); /* 2 leaves x 2 hosts, 2 spines: 1:1 */
    const uint64_t s = 500000000;
    /* Route: NIC, leaf-spine, spine-leaf, NIC; switch latency 0. */
    nett_close(two_cross_leaf_flows(&cfg, s), 2 * LAT + s / BPS, 1e-12, "1:1");
}

Test(net_topology, oversubscribed_fat_tree_shares_the_uplink)
{
    kv_net_config cfg = fat_tree(4, 2);
    cfg.oversubscription = 2.0; /* one spine: both flows share one uplink */
    const uint64_t s = 500000000;
    nett_close(two_cross_leaf_flows(&cfg, s), 2 * LAT + 2.0 * s / BPS, 1e-12, "2:1");
    /* The same ratio from explicit spines and a slower switch link. */
    cfg = fat_tree(4, 2);
    cfg.fat_tree_spines = 2;
    cfg.switch_bandwidth_gbps = GBPS / 2;
    nett_close(two_cross_leaf_flows(&cfg, s), 2 * LAT + 2.0 * s / BPS, 1e-12, "2 spines at half speed");
}

Test(net_topology, fat_tree_switch_latency_adds_two_hops_across_leaves)
{
    nett_rec r = {0};
    kv_net_config cfg = fat_tree(4, 2);
    cfg.switch_latency_s = 5e-6;
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_id same = nett_start(net, 0, 1, 1000, 0, 0, 0);
    kv_flow_id cross = nett_start(net, 0, 3, 1000, 0, 0, 0);
    nett_drain(net);
    double wire = 1000 / BPS;
    nett_close(r.t[nett_find(&r, same)], 2 * LAT + wire, 1e-9, "same leaf");
    nett_close(r.t[nett_find(&r, cross)], 2 * LAT + 2 * 5e-6 + wire, 1e-9, "across leaves");
    kv_net_destroy(net);
}

Test(net_topology, host_slots_place_hosts_in_the_topology)
{
    /* Hosts 0 and 1 on different leaves: their cross-leaf flows no longer share an
       uplink of the oversubscribed tree. */
    kv_net_config cfg = fat_tree(4, 2);
    cfg.oversubscription = 2.0;
    const int slots[4] = {0, 2, 1, 3};
    cfg.host_slot = slots;
    nett_rec r = {0};
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 500000000;
    nett_start(net, 0, 2, s, 0, 0, 0); /* slot 0 -> slot 1: same leaf */
    nett_start(net, 1, 3, s, 0, 0, 0); /* slot 2 -> slot 3: same leaf */
    nett_close(nett_drain(net), 2 * LAT + s / BPS, 1e-12, "no shared uplink");
    kv_net_destroy(net);
}

Test(net_topology, torus_routes_share_ring_links)
{
    /* A ring of 4: 0->2 and 1->3 both cross the link 1-2 (dimension-order routing goes
       right for a distance of half the ring). */
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, GBPS, LAT);
    cfg.topology = KV_TOPO_TORUS;
    cfg.torus_dims[0] = 4;
    nett_rec r = {0};
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 400000000;
    nett_start(net, 0, 2, s, 0, 0, 0);
    nett_start(net, 1, 3, s, 0, 0, 0);
    nett_close(nett_drain(net), 2 * LAT + 2.0 * s / BPS, 1e-12, "shared ring link");
    kv_net_destroy(net);
    /* Neighbours do not share. */
    nett_rec r2 = {0};
    net = nett_create(&cfg, &r2);
    nett_start(net, 0, 1, s, 0, 0, 0);
    nett_start(net, 2, 3, s, 0, 0, 0);
    nett_close(nett_drain(net), 2 * LAT + s / BPS, 1e-12, "disjoint ring links");
    kv_net_destroy(net);
}

Test(net_topology, dragonfly_groups_meet_on_one_global_link)
{
    /* 2 groups x 1 chassis x 2 routers x 1 host: hosts 0,1 in group 0, hosts 2,3 in
       group 1; both flows take the single global (blue) link between the groups. */
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, GBPS, LAT);
    cfg.topology = KV_TOPO_DRAGONFLY;
    cfg.dragonfly_groups = 2;
    cfg.dragonfly_chassis = 1;
    cfg.dragonfly_routers = 2;
    cfg.dragonfly_nodes = 1;
    nett_rec r = {0};
    kv_net *net = nett_create(&cfg, &r);
    const uint64_t s = 400000000;
    nett_start(net, 0, 2, s, 0, 0, 0);
    nett_start(net, 1, 3, s, 0, 0, 0);
    nett_close(nett_drain(net), 2 * LAT + 2.0 * s / BPS, 1e-12, "one blue link");
    kv_net_destroy(net);
}

static const char platform_xml[] =
    "<?xml version='1.0'?>\n"
    "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
    "<platform version=\"4.1\">\n"
    "  <zone id=\"lab\" routing=\"Full\">\n"
    "    <host id=\"gpu-b\" speed=\"1Gf\"/>\n"
    "    <host id=\"gpu-a\" speed=\"1Gf\"/>\n"
    "    <host id=\"gpu-c\" speed=\"1Gf\"/>\n"
    "    <link id=\"ab\" bandwidth=\"10GBps\" latency=\"3us\"/>\n"
    "    <link id=\"slow\" bandwidth=\"1GBps\" latency=\"7us\"/>\n"
    "    <route src=\"gpu-a\" dst=\"gpu-b\"><link_ctn id=\"ab\"/></route>\n"
    "    <route src=\"gpu-a\" dst=\"gpu-c\"><link_ctn id=\"slow\"/></route>\n"
    "  </zone>\n"
    "</platform>\n";

Test(net_topology, platform_files_give_their_hosts_in_name_order)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "lab.xml", platform_xml);
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 3, GBPS, LAT);
    cfg.topology = KV_TOPO_PLATFORM;
    cfg.platform_file = path;
    nett_rec r = {0};
    kv_net *net = nett_create(&cfg, &r);
    cr_assert_eq(kv_net_link_count(net), 2);
    kv_flow_id ab = nett_start(net, 0, 1, 1000000, 0, 0, 0); /* gpu-a -> gpu-b */
    kv_flow_id ca = nett_start(net, 2, 0, 1000000, 0, 0, 0); /* gpu-c -> gpu-a (symmetric route) */
    nett_drain(net);
    nett_close(r.t[nett_find(&r, ab)], 3e-6 + 1e6 / 10e9, 1e-12, "ab");
    nett_close(r.t[nett_find(&r, ca)], 7e-6 + 1e6 / 1e9, 1e-12, "slow");
    kv_net_destroy(net);
    /* host_names picks and orders them. */
    const char *names[2] = {"gpu-c", "gpu-a"};
    cfg.hosts = 2;
    cfg.host_names = names;
    nett_rec r2 = {0};
    net = nett_create(&cfg, &r2);
    nett_start(net, 1, 0, 1000000, 0, 0, 0);
    nett_drain(net);
    nett_close(r2.t[0], 7e-6 + 1e6 / 1e9, 1e-12, "named hosts");
    kv_net_destroy(net);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(net_topology, every_topology_reports_its_links)
{
    const kv_net_topology topos[] = {KV_TOPO_STAR, KV_TOPO_FAT_TREE, KV_TOPO_TORUS, KV_TOPO_DRAGONFLY};
    for (int split = 0; split < 2; split++) {
        for (size_t k = 0; k < 4; k++) {
            kv_net_config cfg = nett_star(KV_NET_SIMGRID, 8, GBPS, LAT);
            cfg.topology = topos[k];
            cfg.split_duplex = split;
            cfg.hosts_per_leaf = 4;
            cfg.torus_dims[0] = cfg.torus_dims[1] = cfg.torus_dims[2] = 2;
            cfg.dragonfly_groups = cfg.dragonfly_chassis = cfg.dragonfly_routers = cfg.dragonfly_nodes = 2;
            cfg.dragonfly_chassis = 1;
            nett_rec r = {0};
            kv_net *net = nett_create(&cfg, &r);
            nett_start(net, 0, 7, 1000000, 0, 0, 0);
            nett_drain(net);
            uint64_t carried = 0;
            for (size_t i = 0; i < kv_net_link_count(net); i++) {
                kv_link_stats s;
                cr_assert_eq(kv_net_link_stats(net, i, &s), KV_OK);
                cr_assert(s.name[0]);
                cr_assert_gt(s.bandwidth_gbps, 0);
                carried += s.bytes;
            }
            /* Star: 2 NICs; fat-tree: 2 NICs + 2 switch links; torus 2x2x2 from 0 to 7:
               2 NICs + 3 hops; dragonfly 2x1x2x2 from (g0,r0) to (g1,r1): 2 NICs,
               green to router 1, blue to group 1 (its router 0), green to router 1. */
            const uint64_t hops[] = {2, 4, 5, 5};
            cr_assert_eq(carried, hops[k] * 1000000, "%s split=%d: %llu bytes over all links",
                         kv_net_topology_name(topos[k]), split, (unsigned long long)carried);
            kv_net_destroy(net);
        }
    }
}
