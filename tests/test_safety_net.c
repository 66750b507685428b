/* test_safety_net.c — the network under hostile load and input: priority classes under load, platform files, caps. */
#include <stdio.h>
#include <stdlib.h>

#include "core/rng.h"
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
                 "--set workload.trace.path=traces/azure-%s-2023-sample.csv --set workload.trace.time_scale=0.25 "
                 "--set workload.requests=300 --set 'policies=[lynx]' --set 'policy={}' --set lynx.from=scenario "
                 "--quiet --out %s/out%d",
                 scen, t ? "code" : "conv", dir, t);
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
