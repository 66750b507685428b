/* test_error_key.c — errors carry the dotted key they concern (kv_error.key): the network names its
 * config's key, the engine resolves it to the scenario's file:line:col; one check per rule. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/config/scenario.h"
#include "core/workload/workload.h"
#include "tests/net_support.h"
#include "tests/support.h"

Test(error_key, set_clears_and_set_key_records)
{
    kv_error err;
    kv_error_clear(&err);
    cr_expect_str_eq(err.key, "");
    cr_expect_eq(kv_error_set_key(&err, KV_EINPUT, "network.model", "%s: bad", "x"), KV_EINPUT);
    cr_expect_str_eq(err.key, "network.model");
    cr_expect_str_eq(err.msg, "x: bad");
    kv_error_prefix(&err, "while: ");
    cr_expect_str_eq(err.key, "network.model", "a prefix keeps the key");
    kv_error_set(&err, KV_EFAIL, "other");
    cr_expect_str_eq(err.key, "", "a new error without a key clears the old one");
    cr_expect_eq(kv_error_set_key(NULL, KV_EINPUT, "k", "m"), KV_EINPUT);
}

/* The dispatcher checks the rules every model shares, once, and names the key. */
Test(error_key, net_names_the_key)
{
    const kv_net_model models[] = {KV_NET_IDEAL, KV_NET_SIMGRID};
    for (size_t m = 0; m < 2; m++) {
        kv_net_config cfg = nett_star(models[m], 4, 0, 1e-6);
        kv_net *net = NULL;
        kv_error err;
        kv_error_clear(&err);
        cr_expect_eq(kv_net_create(&cfg, nett_done, NULL, &net, &err), KV_EINPUT);
        cr_expect_null(net);
        cr_expect_str_eq(err.msg, "test.yaml: network.nic_bandwidth_gbps: must be a positive number");
        cr_expect_str_eq(err.key, "network.nic_bandwidth_gbps");
        cfg = nett_star(models[m], 4, 10, -1);
        cr_expect_eq(kv_net_create(&cfg, nett_done, NULL, &net, &err), KV_EINPUT);
        cr_expect_str_eq(err.key, "network.nic_latency_us");
    }
}

/* A rule only the network knows (a fat-tree's spine count) comes back at the scenario's line and column. */
Test(error_key, engine_resolves_the_key_to_the_scenario_position)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml",
                           "name: t\n"
                           "model: llama-3.1-8b\n"
                           "cluster:\n"
                           "  prefill: {nodes: 2, device: h100-sxm}\n"
                           "  decode: {nodes: 2, device: h100-sxm}\n"
                           "network:\n"
                           "  model: simgrid\n"
                           "  nic_bandwidth_gbps: 25\n"
                           "  topology: fat-tree\n"
                           "  hosts_per_leaf: 2\n"
                           "  oversubscription: 3\n"
                           "workload: {requests: 4, rate_per_s: 2}\n"
                           "policies: [bf16]\n");
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "validate %s", path);
    int rc = kvt_kvsim(args, &out);
    if (out && strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_expect_eq(rc, 2, "got: %s", out);
    char want[1200];
    snprintf(want, sizeof want, "%s:11:21: network.oversubscription: does not give a whole number", path);
    cr_expect(out && strstr(out, want), "want '%s' in: %s", want, out);
    free(out);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* The workload names its key; kv_scenario_locate, the one place keys become positions, puts it at its
   line and column, at "--set KEY" for a command-line value, or at the nearest section written when the
   key is a default (#18: no message is parsed back). */
Test(error_key, workload_keys_are_located_by_the_scenario)
{
    kv_workload_config cfg = {.requests = 4, .rate_per_s = -1, .arrival = KV_ARRIVAL_POISSON};
    kv_workload *w = NULL;
    kv_error err;
    kv_error_clear(&err);
    cr_assert_eq(kv_workload_create(&cfg, NULL, &w, &err), KV_EINPUT);
    cr_expect_str_eq(err.key, "workload.rate_per_s");
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "w.yaml",
                           "name: t\n"
                           "model: llama-3.1-8b\n"
                           "workload:\n"
                           "  requests: 4\n"
                           "  rate_per_s: 2\n"
                           "  output: {dist: fixed}\n"
                           "policies: [bf16]\n");
    const char *sets[] = {"workload.burstiness=2"};
    kv_scenario *s = NULL;
    cr_assert_eq(kv_scenario_load(path, sets, 1, &s, &err), KV_OK, "%s", err.msg);
    char want[1200];
    kv_error_set_key(&err, KV_EINPUT, "workload.rate_per_s", "%s: workload.rate_per_s: bad", path);
    kv_scenario_locate(s, &err);
    snprintf(want, sizeof want, "%s:5:15: workload.rate_per_s: bad", path);
    cr_expect_str_eq(err.msg, want, "the file named only by the layer is replaced by the key's position");
    cr_expect_str_eq(err.key, "workload.rate_per_s");
    kv_error_set_key(&err, KV_EINPUT, "workload.output.samples", "workload.output.samples: none");
    kv_scenario_locate(s, &err);
    snprintf(want, sizeof want, "%s:6:11: workload.output.samples: none", path);
    cr_expect_str_eq(err.msg, want, "a default is shown at its section");
    kv_error_set_key(&err, KV_EINPUT, "cluster.decode.tp", "cluster.decode.tp: too big");
    kv_scenario_locate(s, &err);
    snprintf(want, sizeof want, "%s: cluster.decode.tp: too big", path);
    cr_expect_str_eq(err.msg, want, "no section written: the file");
    kv_error_set_key(&err, KV_EINPUT, "workload.burstiness", "workload.burstiness: odd");
    kv_scenario_locate(s, &err);
    cr_expect_str_eq(err.msg, "--set workload.burstiness: workload.burstiness: odd");
    kv_error_set(&err, KV_EINPUT, "no key");
    kv_scenario_locate(s, &err);
    cr_expect_str_eq(err.msg, "no key", "an error without a key is left as it is");
    kv_scenario_destroy(s);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
