/* test_scenario_typed.c — enum keys bind to C enums through their name tables; sections bind to their structs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/scenario.h"
#include "tests/support.h"

/* Loads scenarios/quickstart.yaml with the given overrides; asserts it loads. */
static kv_scenario *load_with(const char *const *sets, int n)
{
    kv_error err = {0};
    kv_scenario *s = NULL;
    cr_assert_eq(kv_scenario_load("scenarios/quickstart.yaml", sets, n, &s, &err), 0, "%s", err.msg);
    return s;
}

/* Every name of an enum key's table binds to its position in the table. */
static void expect_each_name_binds(const char *key, const char *const *names, const char *extra,
                                   int (*get)(const kv_scenario *))
{
    for (int i = 0; names[i]; i++) {
        char set[256];
        snprintf(set, sizeof set, "%s=%s", key, names[i]);
        const char *sets[] = {set, extra};
        kv_scenario *s = load_with(sets, extra ? 2 : 1);
        cr_expect_eq(get(s), i, "%s: bound %d, expected %d", set, get(s), i);
        kv_scenario_destroy(s);
    }
}

static int get_net_model(const kv_scenario *s) { return (int)s->network.model; }
static int get_arrival(const kv_scenario *s) { return (int)s->workload.arrival; }
static int get_prompt_dist(const kv_scenario *s) { return (int)s->workload.prompt.dist; }
static int get_lynx_from(const kv_scenario *s) { return (int)s->lynx.from; }
static int get_diffkv_scores(const kv_scenario *s) { return (int)s->diffkv.scores; }
static int get_timing_source(const kv_scenario *s) { return (int)s->timing.source; }

Test(scenario_typed, enum_keys_bind_to_their_table_positions)
{
    expect_each_name_binds("network.model", kv_network_model_names, NULL, get_net_model);
    expect_each_name_binds("workload.arrival", kv_workload_arrival_names, NULL, get_arrival);
    expect_each_name_binds("workload.prompt.dist", kv_workload_length_names, "workload.prompt.samples=[64]",
                           get_prompt_dist);
    /* `file` needs the statistics file's name (it is read by the study, not at load) */
    expect_each_name_binds("lynx.from", kv_lynx_from_names, "stats=stats.json", get_lynx_from);
    expect_each_name_binds("diffkv.scores", kv_diffkv_scores_from_names, "stats=stats.json", get_diffkv_scores);
    expect_each_name_binds("timing.source", kv_timing_source_names, NULL, get_timing_source);
}

Test(scenario_typed, enum_values_are_the_documented_names)
{
    cr_expect_eq(KV_NETWORK_IDEAL, 1);
    cr_expect_str_eq(kv_network_model_names[KV_NETWORK_IDEAL], "ideal");
    cr_expect_str_eq(kv_network_topology_names[KV_NETWORK_FAT_TREE], "fat-tree");
    cr_expect_str_eq(kv_network_topology_names[KV_NETWORK_PLATFORM], "platform");
    cr_expect_str_eq(kv_workload_trace_format_names[KV_WORKLOAD_TRACE_BURSTGPT], "burstgpt");
    cr_expect_str_eq(kv_lynx_from_names[KV_LYNX_FROM_SCENARIO], "scenario");
    cr_expect_str_eq(kv_diffkv_scores_from_names[KV_DIFFKV_FROM_FIXED], "fixed");
    cr_expect_str_eq(kv_timing_source_names[KV_TIMING_PROFILE], "profile");
    cr_expect_str_eq(kv_workload_length_names[KV_WORKLOAD_LENGTH_EMPIRICAL], "empirical");
}

Test(scenario_typed, defaults_bind_to_the_first_documented_value)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml", "name: t\nmodel: llama-3-8b\npolicies: [bf16]\n");
    kv_error err = {0};
    kv_scenario *s = NULL;
    cr_assert_eq(kv_scenario_load(path, NULL, 0, &s, &err), 0, "%s", err.msg);
    cr_expect_eq(s->network.model, KV_NETWORK_SIMGRID);
    cr_expect_eq(s->network.topology, KV_NETWORK_STAR);
    cr_expect_eq(s->workload.arrival, KV_WORKLOAD_ARRIVAL_POISSON);
    cr_expect_eq(s->workload.output.dist, KV_WORKLOAD_LENGTH_FIXED);
    cr_expect_eq(s->workload.trace.format, KV_WORKLOAD_TRACE_NONE);
    cr_expect_eq(s->timing.source, KV_TIMING_MODEL);
    cr_expect_eq(s->lynx.from, KV_LYNX_FROM_REFERENCE_MODEL);
    cr_expect_eq(s->diffkv.scores, KV_DIFFKV_FROM_MEASURED);
    kv_scenario_destroy(s);
    kvt_rmtree(dir);
    free(dir);
    free(path);
}

Test(scenario_typed, a_bad_enum_value_names_its_place_and_the_allowed_names)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml", "name: t\nmodel: llama-3-8b\nnetwork:\n  topology: hypercube\n");
    kv_error err = {0};
    kv_scenario *s = NULL;
    cr_assert_eq(kv_scenario_load(path, NULL, 0, &s, &err), KV_EINPUT);
    cr_expect_null(s);
    char want[4200];
    snprintf(want, sizeof want,
             "%s:4:13: network.topology: 'hypercube' is not one of star|fat-tree|torus|dragonfly|platform", path);
    cr_expect_str_eq(err.msg, want);
    /* From the command line: the override names itself. */
    const char *sets[] = {"workload.arrival=bursty"};
    cr_assert_eq(kv_scenario_load("scenarios/quickstart.yaml", sets, 1, &s, &err), KV_EINPUT);
    cr_expect_str_eq(err.msg, "--set workload.arrival: workload.arrival: 'bursty' is not one of poisson|gamma|fixed");
    kvt_rmtree(dir);
    free(dir);
    free(path);
}

Test(scenario_typed, sections_bind_to_their_structs)
{
    const char *sets[] = {"network.fat_tree.spines=3", "network.dragonfly.routers=5", "workload.trace.repeat=7",
                          "timing.profile.model=m", "policy_limits.hook_ms=250", "memory.watermark=0.25",
                          "outputs.csv=false", "cluster.decode.tp=2", "lynx.ttkt_k=4", "diffkv.head_spread=0.5"};
    kv_scenario *s = load_with(sets, (int)(sizeof sets / sizeof sets[0]));
    cr_expect_eq(s->network.fat_tree.spines, 3);
    cr_expect_eq(s->network.dragonfly.routers, 5);
    cr_expect_eq(s->workload.trace.repeat, 7);
    cr_expect_str_eq(s->timing.profile.model, "m");
    cr_expect_eq(s->policy_limits.hook_ms, 250.0);
    cr_expect_eq(s->memory.watermark, 0.25);
    cr_expect_not(s->outputs.csv);
    cr_expect_eq(s->cluster.decode.tp, 2);
    cr_expect_eq(s->lynx.ttkt_k, 4);
    cr_expect_eq(s->diffkv.head_spread, 0.5);
    kv_scenario_destroy(s);
}
