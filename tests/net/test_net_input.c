/* test_net_input.c — bad network input gives a clear message and bad-input status, never a crash. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/net_support.h"
#include "tests/support.h"

/* Creates cfg and expects KV_EINPUT with every word of `want` (|-separated) in the message. */
static void expect_bad(const kv_net_config *cfg, const char *want)
{
    nett_rec r = {0};
    kv_net *net = NULL;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_create(cfg, nett_done, &r, &net, &err);
    if (rc != KV_OK && cfg->model == KV_NET_SIMGRID && strstr(err.msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, KV_EINPUT, "want bad input (%s), got %d: %s", want, rc, err.msg);
    cr_assert_null(net);
    char words[256];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        cr_assert(strstr(err.msg, w), "'%s' not in: %s", w, err.msg);
}

static kv_net_config base(void)
{
    return nett_star(KV_NET_SIMGRID, 4, 100.0, 1e-6);
}

Test(net_input, unknown_topology)
{
    kv_net_config cfg = base();
    cfg.topology = (kv_net_topology)42;
    expect_bad(&cfg, "test.yaml|network.topology|unknown topology");
}

Test(net_input, zero_or_negative_bandwidth)
{
    kv_net_config cfg = base();
    cfg.nic_bandwidth_gbps = 0;
    expect_bad(&cfg, "network.nic_bandwidth_gbps|positive");
    cfg.nic_bandwidth_gbps = -100;
    expect_bad(&cfg, "network.nic_bandwidth_gbps");
    cfg = base();
    cfg.switch_bandwidth_gbps = -1;
    expect_bad(&cfg, "network.switch_bandwidth_gbps");
    cfg = base();
    cfg.nic_latency_s = -1e-6;
    expect_bad(&cfg, "network.nic_latency");
    cfg = base();
    cfg.oversubscription = -2;
    expect_bad(&cfg, "network.oversubscription");
}

Test(net_input, host_counts_that_do_not_fit_the_topology)
{
    kv_net_config cfg = base();
    cfg.hosts = 5;
    cfg.topology = KV_TOPO_TORUS;
    cfg.torus_dims[0] = 2;
    cfg.torus_dims[1] = 2;
    expect_bad(&cfg, "network.torus_dims|too small|4 positions < 5 hosts");
    cfg.torus_dims[0] = cfg.torus_dims[1] = 0;
    expect_bad(&cfg, "network.torus_dims|at least one dimension");
    cfg = base();
    cfg.topology = KV_TOPO_FAT_TREE;
    expect_bad(&cfg, "network.hosts_per_leaf|>= 1");
    cfg.hosts_per_leaf = 2;
    cfg.fat_tree_leaves = 1;
    expect_bad(&cfg, "network.fat_tree_leaves|too small");
    cfg.fat_tree_leaves = 0;
    cfg.oversubscription = 3;
    expect_bad(&cfg, "network.oversubscription|whole number of spine");
    cfg.oversubscription = 2;
    cfg.fat_tree_spines = 2;
    expect_bad(&cfg, "network.oversubscription|disagrees with fat_tree_spines");
    cfg = base();
    cfg.topology = KV_TOPO_DRAGONFLY;
    cfg.dragonfly_groups = 3;
    cfg.dragonfly_chassis = 1;
    cfg.dragonfly_routers = 2;
    cfg.dragonfly_nodes = 1;
    expect_bad(&cfg, "network.dragonfly_groups|<= dragonfly_routers");
    cfg.dragonfly_groups = 1;
    expect_bad(&cfg, "network.dragonfly_nodes|too small");
    cfg.dragonfly_chassis = 0;
    expect_bad(&cfg, "network.dragonfly_chassis|>= 1");
    cfg = base();
    const int slots[4] = {0, 1, 1, 3};
    cfg.host_slot = slots;
    expect_bad(&cfg, "network.host_slot[2]|taken twice");
    const int far[4] = {0, 1, 2, 4};
    cfg.host_slot = far;
    expect_bad(&cfg, "network.host_slot[3]|out of range");
}

static const char bogus_routing[] =
    "<?xml version='1.0'?>\n"
    "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
    "<platform version=\"4.1\">\n"
    "  <zone id=\"z\" routing=\"Bogus\">\n"
    "    <host id=\"a\" speed=\"1Gf\"/>\n"
    "    <host id=\"b\" speed=\"1Gf\"/>\n"
    "  </zone>\n"
    "</platform>\n";

Test(net_input, platform_files)
{
    kv_net_config cfg = base();
    cfg.topology = KV_TOPO_PLATFORM;
    expect_bad(&cfg, "network.platform_file|needs a SimGrid XML file");
    cfg.platform_file = "/nonexistent/cluster.xml";
    expect_bad(&cfg, "network.platform_file|cannot read|/nonexistent/cluster.xml");
    char *dir = kvt_tempdir();
    char *broken = kvt_write(dir, "broken.xml", "<platform version=\"4.1\"><zone id=\"z\"");
    cfg.platform_file = broken;
    expect_bad(&cfg, "test.yaml|broken.xml");
    /* SimGrid aborts on this one (xbt_die in the child): a message, not a crash. */
    char *bogus = kvt_write(dir, "bogus.xml", bogus_routing);
    cfg.platform_file = bogus;
    expect_bad(&cfg, "SimGrid|abort|Not a valid model");
    /* Fine file, too few hosts. */
    char *small = kvt_write(dir, "small.xml", "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM "
                                              "\"https://simgrid.org/simgrid.dtd\">\n<platform version=\"4.1\">"
                                              "<zone id=\"z\" routing=\"Full\"><host id=\"a\" speed=\"1f\"/>"
                                              "<host id=\"b\" speed=\"1f\"/></zone></platform>\n");
    cfg.platform_file = small;
    expect_bad(&cfg, "has 2 hosts, the scenario needs 4");
    const char *names[4] = {"a", "b", "c", "d"};
    cfg.host_names = names;
    expect_bad(&cfg, "network.host_names|no host 'c'");
    free(broken);
    free(bogus);
    free(small);
    kvt_rmtree(dir);
    free(dir);
}

Test(net_input, simgrid_options)
{
    kv_net_config cfg = base();
    cfg.n_options = 1;
    cfg.option_key[0] = "network/model";
    cfg.option_value[0] = "FOO";
    expect_bad(&cfg, "network.simgrid.network/model|unknown value 'FOO'");
    cfg.option_key[0] = "network/bogus";
    cfg.option_value[0] = "1";
    expect_bad(&cfg, "test.yaml: network.simgrid.network/bogus|not a SimGrid option kvsim passes through");
    cfg.option_key[0] = "network/TCP-gamma";
    cfg.option_value[0] = "0";
    expect_bad(&cfg, "network.simgrid.network/TCP-gamma|must be > 0");
    cfg.option_key[0] = "maxmin/precision";
    cfg.option_value[0] = "fast";
    expect_bad(&cfg, "network.simgrid.maxmin/precision|expected a finite number, got 'fast'");
    /* Where the option is written, when the caller knows. */
    cfg.option_file[0] = "s.yaml";
    cfg.option_line[0] = 12;
    cfg.option_col[0] = 7;
    expect_bad(&cfg, "s.yaml:12:7: network.simgrid.maxmin/precision");
    cfg.option_file[0] = "--set network.simgrid";
    expect_bad(&cfg, "test.yaml: network.simgrid.maxmin/precision (from --set network.simgrid)");
    cfg.option_file[0] = NULL;
    cfg.option_key[0] = "surf/precision";
    cfg.option_value[0] = "0"; /* SimGrid spins forever on it */
    expect_bad(&cfg, "network.simgrid.surf/precision|must be > 0");
    cfg.option_key[0] = "network/model";
    cfg.option_value[0] = "Constant"; /* SimGrid aborts building kvsim's links */
    expect_bad(&cfg, "network.simgrid.network/model|unknown value 'Constant'");
    cfg.option_value[0] = "IB";
    cfg.priority = KV_PRIO_STRICT;
    expect_bad(&cfg, "network.priority|CM02, LV08 or SMPI");
    cfg.option_key[0] = "network/optim";
    cfg.option_value[0] = "Full";
    expect_bad(&cfg, "network.priority|Lazy");
    cfg = base();
    cfg.priority = KV_PRIO_WEIGHTED;
    cfg.class_weight[0] = 1e7;
    expect_bad(&cfg, "network.class_weights|1e6");
    cfg.class_weight[0] = -1;
    expect_bad(&cfg, "network.class_weights[0]");
}

Test(net_input, flow_arguments)
{
    nett_rec r = {0};
    kv_net_config cfg = base();
    kv_net *net = nett_create(&cfg, &r);
    kv_flow_spec f = {.src = 0, .dst = 9, .bytes = 10};
    kv_flow_id id;
    kv_error err;
    cr_assert_eq(kv_net_flow_start(net, &f, 0, &id, &err), KV_EFAIL);
    cr_assert(strstr(err.msg, "out of range"), "got: %s", err.msg);
    f.dst = 0;
    cr_assert_eq(kv_net_flow_start(net, &f, 0, &id, &err), KV_EFAIL);
    f.dst = 1;
    f.priority = KV_NET_MAX_CLASSES;
    cr_assert_eq(kv_net_flow_start(net, &f, 0, &id, &err), KV_EFAIL);
    cr_assert_eq(kv_net_flow_cancel(net, 77, &err), KV_EFAIL);
    cr_assert_eq(kv_net_active_flows(net), 0);
    kv_net_destroy(net);
}

Test(net_input, bench_command_exit_codes)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("bench net --topology hypercube", &out), 2);
    cr_assert(strstr(out, "unknown topology 'hypercube'"), "got: %s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("bench net --flows 2 --platform /nonexistent/p.xml", &out), 2);
    cr_assert(strstr(out, "cannot read") && strstr(out, "/nonexistent/p.xml"), "got: %s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("bench net --flows 2 --gbps 0", &out), 2);
    cr_assert(strstr(out, "nic_bandwidth_gbps"), "got: %s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("bench net --flows 2 --hosts 8 --hosts-per-leaf 3 --model LV07", &out), 2);
    cr_assert(strstr(out, "unknown value 'LV07'"), "got: %s", out);
    free(out);
    cr_assert_eq(kvt_kvsim("bench net --frobnicate 1", &out), 2);
    free(out);
}

Test(net_input, bench_command_prints_its_figures)
{
    char *out = NULL;
    int rc = kvt_kvsim("bench net --flows 40 --inflight 8 --hosts 16 --hosts-per-leaf 4", &out);
    if (rc == 2 && strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, 0, "got: %s", out);
    cr_assert(strstr(out, "simgrid: wall") && strstr(out, "transfers/s") && strstr(out, "simgrid / ideal"),
              "got: %s", out);
    free(out);
}
