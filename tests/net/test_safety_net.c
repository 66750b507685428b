/* test_safety_net.c — the network under hostile load and input: priority classes under load, platform files, caps. */
#include <stdio.h>
#include <stdlib.h>

#include "core/base/rng.h"
#include "tests/net_support.h"
#include "tests/support.h"

/* Runs kvsim with args; expects exit status `want` and every |-separated word of `words` in its output. */
static void expect_kvsim(const char *args, int want, const char *words)
{
    char *out = NULL;
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, want, "kvsim %s: exit %d, want %d:\n%s", args, rc, want, out ? out : "");
    cr_assert(!strstr(out, "died of signal") && !strstr(out, "Impossible"), "kvsim %s crashed SimGrid:\n%s", args,
              out);
    char w[512];
    snprintf(w, sizeof w, "%s", words ? words : "");
    for (char *p = strtok(w, "|"); p; p = strtok(NULL, "|"))
        cr_assert(strstr(out, p), "'%s' not in the output of kvsim %s:\n%s", p, args, out);
    free(out);
}

/* ---- 1. priority classes under load ---- */

/* The measured reproduction: SimGrid 3.32's solver gave a low-class flow rate 0 and aborted. */
Test(safety_net, bench_net_2000_strict_flows_do_not_abort_simgrid, .timeout = 120)
{
    expect_kvsim("bench net --flows 2000 --priority strict --no-ideal", 0, "simgrid: wall");
}

/* The same, shrunk (64 hosts, 300 flows): seeds 1, 4, 5 and 6 aborted before. */
Test(safety_net, small_strict_and_weighted_benches_do_not_abort_simgrid, .timeout = 120)
{
    for (int seed = 1; seed <= 6; seed++) {
        char args[200];
        snprintf(args, sizeof args, "bench net --flows 300 --inflight 100 --hosts 64 --seed %d --priority strict "
                 "--no-ideal", seed);
        expect_kvsim(args, 0, "simgrid: wall");
        snprintf(args, sizeof args, "bench net --flows 300 --inflight 100 --hosts 64 --seed %d --priority weighted "
                 "--no-ideal", seed);
        expect_kvsim(args, 0, "simgrid: wall");
    }
}

/* The measured scenario: 70B, fat-tree 2:1 at 25 Gbit/s, an Azure trace 4x faster, lynx (strict classes). */
Test(safety_net, lynx_70b_on_an_oversubscribed_fat_tree_runs, .timeout = 120)
{
    char *dir = kvt_tempdir();
    char *scen = kvt_source("scenarios/lynx.yaml");
    for (int t = 0; t < 2; t++) {
        char args[2048];
        snprintf(args, sizeof args,
                 "run %s --set model=llama-3-70b --set cluster.prefill.tp=4 --set cluster.decode.tp=4 "
                 "--set network.topology=fat-tree --set network.oversubscription=2 "
                 "--set network.nic_bandwidth_gbps=25 --set workload.trace.format=azure "
                 "--set workload.trace.path=%s/scenarios/traces/azure-%s-2023-sample.csv --set workload.trace.time_scale=0.25 "
                 "--set workload.requests=300 --set 'policies=[lynx]' --set 'policy={}' --set lynx.from=scenario "
                 "--quiet --out %s/out%d",
                 scen, KV_SOURCE_DIR, t ? "code" : "conv", dir, t); /* a --set path is the user's own */
        expect_kvsim(args, 0, NULL);
    }
    free(scen);
    kvt_rmtree(dir);
    free(dir);
}

static void count_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    (void)id, (void)tag, (void)t;
    (*(int *)user)++;
}

/* With classes, more flows on one link than the solver can keep apart fail the run at that
   flow's start with a message naming the cap, instead of SimGrid aborting or misranking. */
Test(safety_net, more_flows_on_one_link_than_the_class_cap_fail_cleanly, .timeout = 60)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, 100.0, 2e-6);
    cfg.priority = KV_PRIO_STRICT;
    kv_net *net = NULL;
    kv_error err;
    int done = 0;
    cr_assert_eq(kv_net_create(&cfg, count_done, &done, &net, &err), KV_OK, "%s", err.msg);
    int rc = KV_OK;
    for (int i = 0; i < 2049 && rc == KV_OK; i++) {
        kv_flow_spec f = {.src = i % 3, .dst = 3, .bytes = 100000000, .priority = i % 2, .tag = (uint64_t)i};
        kv_flow_id id;
        rc = kv_net_flow_start(net, &f, 0, &id, &err);
    }
    double t = 0;
    if (rc == KV_OK)
        rc = kv_net_advance(net, INFINITY, &t, &err);
    cr_assert_eq(rc, KV_EFAIL, "flow 2049 on one link: %s", rc ? err.msg : "accepted");
    cr_assert(strstr(err.msg, "at most 2048") && strstr(err.msg, "nic3"), "%s", err.msg);
    cr_assert_eq(done, 0);
    kv_net_destroy(net);
}

/* ---- 2. platform files: their SimGrid options and link values ---- */

/* A two-host platform; `config` goes before the zone, `ab` is the link's bandwidth and latency attributes. */
static char *platform(const char *dir, const char *config, const char *ab)
{
    char xml[2048];
    snprintf(xml, sizeof xml,
             "<?xml version='1.0'?>\n"
             "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
             "<platform version=\"4.1\">\n"
             "%s"
             "  <zone id=\"lab\" routing=\"Full\">\n"
             "    <host id=\"gpu-a\" speed=\"1Gf\"/>\n"
             "    <host id=\"gpu-b\" speed=\"1Gf\"/>\n"
             "    <!-- <link id=\"ab\" bandwidth=\"0Bps\" latency=\"1s\"/> -->\n"
             "    <link id=\"ab\" %s/>\n"
             "    <route src=\"gpu-a\" dst=\"gpu-b\"><link_ctn id=\"ab\"/></route>\n"
             "  </zone>\n"
             "</platform>\n",
             config, ab);
    return kvt_write(dir, "lab.xml", xml);
}

/* Creating a network on the platform must fail with bad input, naming every |-separated word. */
static void expect_bad_platform(const char *config, const char *ab, const char *want)
{
    char *dir = kvt_tempdir();
    char *path = platform(dir, config, ab);
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 2, 100.0, 1e-6);
    cfg.topology = KV_TOPO_PLATFORM;
    cfg.platform_file = path;
    nett_rec r = {0};
    kv_net *net = NULL;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_create(&cfg, nett_done, &r, &net, &err);
    if (rc != KV_OK && strstr(err.msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    if (rc == KV_OK) { /* the old code: show what the run gives */
        kv_flow_id id = nett_start(net, 0, 1, 1000000, 0, 0, 0);
        (void)id;
        double t = 0;
        rc = kv_net_advance(net, INFINITY, &t, &err);
        kv_net_destroy(net);
        cr_assert_fail("%s / %s: accepted; the run gave %d at t = %g: %s", config, ab, rc, t, rc ? err.msg : "");
    }
    cr_assert_eq(rc, KV_EINPUT, "%s / %s: got %d: %s", config, ab, rc, err.msg);
    char words[512];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        cr_assert(strstr(err.msg, w), "'%s' not in: %s", w, err.msg);
    cr_assert(strstr(err.msg, path), "no platform path in: %s", err.msg);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

#define GOOD_LINK "bandwidth=\"10GBps\" latency=\"3us\""

Test(safety_net, platform_config_props_go_through_the_option_table, .timeout = 60)
{
    /* Ran to exit 0 with absurd times. */
    expect_bad_platform("  <config>\n    <prop id=\"network/latency-factor\" value=\"1e300\"/>\n  </config>\n",
                        GOOD_LINK, "lab.xml:5:|network/latency-factor|<= 1000");
    expect_bad_platform("  <config>\n    <prop id=\"network/TCP-gamma\" value=\"0\"/>\n  </config>\n", GOOD_LINK,
                        "lab.xml:5:|network/TCP-gamma|> 0");
    /* Made SimGrid abort. */
    expect_bad_platform("  <config>\n\n    <prop id=\"maxmin/precision\" value=\"1\"/>\n  </config>\n", GOOD_LINK,
                        "lab.xml:6:|maxmin/precision");
    expect_bad_platform("  <config>\n    <prop id=\"network/bandwidth-factor\" value='0'/>\n  </config>\n",
                        GOOD_LINK, "lab.xml:5:|network/bandwidth-factor");
    expect_bad_platform("  <config>\n    <prop id=\"contexts/stack-size\" value=\"1\"/>\n  </config>\n", GOOD_LINK,
                        "lab.xml:5:|contexts/stack-size|not a SimGrid option kvsim passes through");
}

Test(safety_net, platform_props_in_range_still_apply, .timeout = 60)
{
    char *dir = kvt_tempdir();
    char *path = platform(dir, "  <config>\n    <prop id=\"network/latency-factor\" value=\"2\"/>\n  </config>\n",
                          "bandwidth=\"1GBps\" latency=\"10us\"");
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 2, 100.0, 1e-6);
    cfg.topology = KV_TOPO_PLATFORM;
    cfg.platform_file = path;
    nett_rec r = {0};
    kv_net *net = nett_create(&cfg, &r);
    nett_start(net, 0, 1, 1000, 0, 0, 0);
    double t = nett_drain(net);
    cr_assert(t > 19e-6 && t < 30e-6, "latency-factor 2 on 10 us: %g s", t);
    kv_net_destroy(net);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(safety_net, platform_links_with_absurd_values_are_refused_at_load, .timeout = 60)
{
    expect_bad_platform("", "bandwidth=\"infGbps\" latency=\"3us\"", "lab.xml:8:|link 'ab'|bandwidth");
    expect_bad_platform("", "bandwidth=\"1e-300Bps\" latency=\"3us\"", "lab.xml:8:|link 'ab'|bandwidth");
    expect_bad_platform("", "bandwidth=\"10GBps\" latency=\"infs\"", "lab.xml:8:|link 'ab'|latency");
    expect_bad_platform("", "bandwidth=\"10GBps\" latency=\"nans\"", "lab.xml:8:|link 'ab'|latency");
    expect_bad_platform("", "bandwidth=\"10GBps\" latency=\"1e6s\"", "lab.xml:8:|link 'ab'|latency");
}

/* ---- 3. caps: every size the schema accepts builds in seconds ---- */

static void run_lynx(const char *sets, int want, const char *words)
{
    char *dir = kvt_tempdir();
    char *scen = kvt_source("scenarios/lynx.yaml");
    char args[2048];
    snprintf(args, sizeof args, "run %s %s --set 'policies=[int8]' --set 'policy={}' --set workload.requests=2 "
             "--quiet --out %s/out", scen, sets, dir);
    expect_kvsim(args, want, words);
    free(scen);
    kvt_rmtree(dir);
    free(dir);
}

/* [1000, 1000] was exactly the documented cap and stalled SimGrid while building. */
Test(safety_net, a_torus_beyond_the_cap_is_refused_at_once, .timeout = 30)
{
    run_lynx("--set network.topology=torus --set 'network.torus_dims=[1000, 1000]'", 2,
             "network.torus_dims|at most 2048");
    run_lynx("--set network.topology=torus --set 'network.torus_dims=[2049]'", 2, "network.torus_dims");
    run_lynx("--set network.topology=dragonfly --set network.dragonfly.groups=46 --set network.dragonfly.chassis=1 "
             "--set network.dragonfly.routers=46 --set network.dragonfly.nodes=1", 2, "network.dragonfly|at most 2048");
    run_lynx("--set network.topology=fat-tree --set network.hosts_per_leaf=1 --set network.fat_tree.leaves=256 "
             "--set network.fat_tree.spines=512 --set network.oversubscription=0.001953125", 2,
             "network.fat_tree|at most 65536");
}

/* 100,000 + 100,000 nodes (the old maximum) held 3.5 GB after 60 s. */
Test(safety_net, node_counts_beyond_the_cap_are_refused, .timeout = 30)
{
    run_lynx("--set cluster.prefill.nodes=100000 --set cluster.decode.nodes=100000", 2, "cluster.prefill.nodes|2048");
    run_lynx("--set cluster.decode.nodes=2049", 2, "cluster.decode.nodes|2048");
}

/* The largest shapes the caps allow build and run (about 1-3 s each here). */
Test(safety_net, the_largest_allowed_shapes_run, .timeout = 240)
{
    run_lynx("--set network.topology=torus --set 'network.torus_dims=[32, 64]'", 0, NULL);
    run_lynx("--set network.topology=dragonfly --set network.dragonfly.groups=45 --set network.dragonfly.chassis=1 "
             "--set network.dragonfly.routers=45 --set network.dragonfly.nodes=1", 0, NULL);
    run_lynx("--set network.topology=fat-tree --set network.hosts_per_leaf=1 --set network.fat_tree.leaves=256 "
             "--set network.fat_tree.spines=256 --set network.oversubscription=0.00390625", 0, NULL);
    run_lynx("--set cluster.prefill.nodes=2048 --set cluster.decode.nodes=2048", 0, NULL);
}
