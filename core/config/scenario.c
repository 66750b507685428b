/* scenario.c — the scenario's keys (one documented table), loading, overrides and checks. */
#include "core/config/scenario.h"

#include <libgen.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/datadir.h"
#include "core/base/didyoumean.h"

/* The names of the enum keys' values, in enum order (scenario.h). */
const char *const kv_network_model_names[] = {"simgrid", "ideal", NULL};
const char *const kv_network_topology_names[] = {"star", "fat-tree", "torus", "dragonfly", "platform", NULL};
const char *const kv_workload_arrival_names[] = {"poisson", "gamma", "fixed", NULL};
const char *const kv_workload_length_names[] = {"fixed", "uniform", "lognormal", "empirical", NULL};
const char *const kv_workload_trace_format_names[] = {"none", "azure", "mooncake", "burstgpt", NULL};
const char *const kv_timing_source_names[] = {"model", "measured", "profile", NULL};
const char *const kv_lynx_from_names[] = {"reference-model", "scenario", "file", NULL};
const char *const kv_diffkv_scores_from_names[] = {"measured", "lognormal", "fixed", "file", NULL};

/* The schema stores an enum key as an int. */
_Static_assert(sizeof(kv_network_model) == sizeof(int) && sizeof(kv_network_topology) == sizeof(int) &&
                   sizeof(kv_workload_arrival) == sizeof(int) && sizeof(kv_workload_length) == sizeof(int) &&
                   sizeof(kv_workload_trace_format) == sizeof(int) && sizeof(kv_timing_source) == sizeof(int) &&
                   sizeof(kv_lynx_from) == sizeof(int) && sizeof(kv_diffkv_scores_from) == sizeof(int),
               "enum keys are int-sized");

#define S(f) offsetof(kv_scenario, f)
#define BIG 1e18
/* Every scenario key. Order is the order of the printed reference. */
static const kv_key_spec scenario_keys[] = {
    {"name", KV_KEY_STRING, S(name), "scenario", 0, 0, NULL, "name shown in outputs"},
    {"description", KV_KEY_STRING, S(description), "\"\"", 0, 0, NULL, "what the scenario asks"},
    {"seed", KV_KEY_INT, S(seed), "1", 0, 2147483647, NULL, "random seed; same seed, same results"},
    {"replicates", KV_KEY_INT, S(replicates), "1", 1, 1000, NULL,
     "kvsim run: run seeds seed..seed+N-1, report mean and 95% CI per metric (--seeds overrides)"},
    {"model", KV_KEY_STRING, S(model), NULL, 0, 0, NULL, "model card: a name under scenarios/models or a path"},
    {"stats", KV_KEY_STRING, S(stats), "\"\"", 0, 0, NULL,
     "model statistics file (docs/stats-format.md) read by lynx.from: file and diffkv.scores: file; a relative "
     "path as workload.trace.path"},

    {"cluster", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "prefill and decode pools"},
    {"cluster.prefill", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "the nodes that run prefill"},
    {"cluster.prefill.nodes", KV_KEY_INT, S(cluster.prefill.nodes), "1", 1, 2048, NULL, "nodes (at most 2048)"},
    {"cluster.prefill.device", KV_KEY_STRING, S(cluster.prefill.device), "h100-sxm", 0, 0, NULL,
     "device profile: a name under scenarios/devices or a path"},
    {"cluster.prefill.tp", KV_KEY_INT, S(cluster.prefill.tp), "1", 1, 1024, NULL,
     "tensor-parallel degree (devices per node)"},
    {"cluster.prefill.max_batch_tokens", KV_KEY_INT, S(cluster.prefill.max_batch_tokens), "16384", 1, 1 << 30, NULL,
     "prompt tokens one prefill batch may hold (a longer prompt runs alone)"},
    {"cluster.prefill.max_batch", KV_KEY_INT, S(cluster.prefill.max_batch), "64", 1, 1 << 20, NULL,
     "requests one prefill batch may hold"},
    {"cluster.prefill.memory_fraction", KV_KEY_POSITIVE, S(cluster.prefill.memory_fraction), "0.9", 0, 1, NULL,
     "share of device memory usable for weights and KV"},
    {"cluster.decode", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "the nodes that run decode"},
    {"cluster.decode.nodes", KV_KEY_INT, S(cluster.decode.nodes), "1", 1, 2048, NULL, "nodes (at most 2048)"},
    {"cluster.decode.device", KV_KEY_STRING, S(cluster.decode.device), "h100-sxm", 0, 0, NULL, "device profile"},
    {"cluster.decode.tp", KV_KEY_INT, S(cluster.decode.tp), "1", 1, 1024, NULL, "tensor-parallel degree"},
    {"cluster.decode.max_batch_tokens", KV_KEY_INT, S(cluster.decode.max_batch_tokens), "16384", 1, 1 << 30, NULL,
     "tokens a verification/prefill chunk may hold on a decode node"},
    {"cluster.decode.max_batch", KV_KEY_INT, S(cluster.decode.max_batch), "256", 1, 1 << 20, NULL,
     "requests in one continuous decode batch"},
    {"cluster.decode.memory_fraction", KV_KEY_POSITIVE, S(cluster.decode.memory_fraction), "0.9", 0, 1, NULL,
     "share of device memory usable for weights and KV"},
    {"cluster.colocated", KV_KEY_BOOL, S(cluster.colocated), "false", 0, 0, NULL,
     "prefill and decode on the same nodes (the decode pool), no KV transfer"},

    {"network", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "the cluster network (docs/network.md)"},
    {"network.model", KV_KEY_ENUM, S(network.model), "simgrid", 0, 0, kv_network_model_names,
     "simgrid (contention, topology) or ideal (latency + bytes/bandwidth)"},
    {"network.topology", KV_KEY_ENUM, S(network.topology), "star", 0, 0, kv_network_topology_names,
     "how hosts connect"},
    {"network.nic_bandwidth_gbps", KV_KEY_POSITIVE, S(network.nic_bandwidth_gbps), "100", 0, 1e7, NULL,
     "per-node NIC bandwidth, Gbit/s, each direction"},
    {"network.nic_latency_us", KV_KEY_DOUBLE, S(network.nic_latency_us), "2", 0, 1e9, NULL, "per-NIC link latency, us"},
    {"network.switch_bandwidth_gbps", KV_KEY_DOUBLE, S(network.switch_bandwidth_gbps), "0", 0, 1e9, NULL,
     "switch/uplink bandwidth, Gbit/s (0: not limiting)"},
    {"network.switch_latency_us", KV_KEY_DOUBLE, S(network.switch_latency_us), "0", 0, 1e9, NULL, "switch latency, us"},
    {"network.hosts_per_leaf", KV_KEY_INT, S(network.hosts_per_leaf), "8", 1, 8192, NULL, "fat-tree: hosts per leaf"},
    {"network.fat_tree", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "two-level fat-tree shape"},
    {"network.fat_tree.spines", KV_KEY_INT, S(network.fat_tree.spines), "0", 0, 65536, NULL,
     "spine switches (0: from oversubscription; leaves x spines at most 65536)"},
    {"network.fat_tree.leaves", KV_KEY_INT, S(network.fat_tree.leaves), "0", 0, 8192, NULL,
     "leaf switches (0: enough for the hosts; leaves x hosts_per_leaf at most 8192)"},
    {"network.torus_dims", KV_KEY_INTLIST, S(network.torus_dims), "[]", 1, 2048, NULL,
     "torus: nodes along each dimension, e.g. [4, 4, 2] (product at most 2048)"},
    {"network.dragonfly", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "dragonfly shape (groups x chassis x routers x nodes at most 2048)"},
    {"network.dragonfly.groups", KV_KEY_INT, S(network.dragonfly.groups), "0", 0, 2048, NULL, "groups"},
    {"network.dragonfly.chassis", KV_KEY_INT, S(network.dragonfly.chassis), "0", 0, 2048, NULL, "chassis per group"},
    {"network.dragonfly.routers", KV_KEY_INT, S(network.dragonfly.routers), "0", 0, 2048, NULL,
     "routers per chassis"},
    {"network.dragonfly.nodes", KV_KEY_INT, S(network.dragonfly.nodes), "0", 0, 2048, NULL, "hosts per router"},
    {"network.host_slots", KV_KEY_INTLIST, S(network.host_slots), "[]", 0, 8191, NULL,
     "topology position of each node, prefill nodes first (empty: in order)"},
    {"network.host_names", KV_KEY_STRLIST, S(network.host_names), "[]", 0, 0, NULL,
     "platform: the SimGrid host of each node, prefill first (empty: hosts sorted by name)"},
    {"network.oversubscription", KV_KEY_POSITIVE, S(network.oversubscription), "1", 0, 1e6, NULL,
     "fat-tree: leaf down/up bandwidth ratio"},
    {"network.split_duplex", KV_KEY_BOOL, S(network.split_duplex), "true", 0, 0, NULL,
     "separate up and down links per NIC (no cross-traffic penalty)"},
    {"network.platform_file", KV_KEY_STRING, S(network.platform_file), "\"\"", 0, 0, NULL,
     "topology: platform — a SimGrid platform XML"},
    {"network.simgrid", KV_KEY_FREEMAP, S(network.simgrid), NULL, 0, 0, NULL,
     "SimGrid options, checked then passed through, e.g. {network/model: CM02} (docs/network.md)"},
    {"network.watchdog_s", KV_KEY_POSITIVE, S(network.watchdog_s), "60", 0, 86400, NULL,
     "simgrid: seconds SimGrid may go without answering one request before kvsim stops the run"},
    {"network.in_child", KV_KEY_BOOL, S(network.in_child), "true", 0, 0, NULL,
     "simgrid: run each policy's whole simulation in the SimGrid child (false: over its socket; same bytes)"},

    {"workload", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "the requests"},
    {"workload.requests", KV_KEY_INT, S(workload.requests), "100", 0, 100000000, NULL,
     "requests to simulate (trace: cap on rows, 0 = all)"},
    {"workload.arrival", KV_KEY_ENUM, S(workload.arrival), "poisson", 0, 0, kv_workload_arrival_names,
     "arrival process"},
    {"workload.rate_per_s", KV_KEY_DOUBLE, S(workload.rate_per_s), "1", 0, 1e9, NULL,
     "mean arrivals per second (fixed with 0: all at time 0)"},
    {"workload.burstiness", KV_KEY_POSITIVE, S(workload.burstiness), "1", 0, 1e6, NULL,
     "gamma shape: < 1 is burstier than Poisson"},
    {"workload.fit_context", KV_KEY_BOOL, S(workload.fit_context), "false", 0, 0, NULL,
     "cut each request to the model's context: the prompt to at most context - 1, the output to what remains "
     "(false: only prompts are cut, and validate warns)"},
    {"workload.prompt", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "prompt length distribution"},
    {"workload.prompt.dist", KV_KEY_ENUM, S(workload.prompt.dist), "fixed", 0, 0, kv_workload_length_names,
     "distribution"},
    {"workload.prompt.value", KV_KEY_POSITIVE, S(workload.prompt.value), "1024", 0, 1e9, NULL,
     "fixed: the length; lognormal: the median"},
    {"workload.prompt.sigma", KV_KEY_DOUBLE, S(workload.prompt.sigma), "0.5", 0, 100, NULL, "lognormal sigma"},
    {"workload.prompt.min", KV_KEY_INT, S(workload.prompt.min), "1", 1, 1 << 30, NULL, "smallest length"},
    {"workload.prompt.max", KV_KEY_INT, S(workload.prompt.max), "1048576", 1, 1 << 30, NULL, "largest length"},
    {"workload.prompt.samples", KV_KEY_INTLIST, S(workload.prompt.samples), "[]", 1, 1 << 30, NULL,
     "empirical: lengths drawn with equal weight"},
    {"workload.output", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "output length distribution"},
    {"workload.output.dist", KV_KEY_ENUM, S(workload.output.dist), "fixed", 0, 0, kv_workload_length_names,
     "distribution"},
    {"workload.output.value", KV_KEY_POSITIVE, S(workload.output.value), "128", 0, 1e9, NULL, "as for prompt"},
    {"workload.output.sigma", KV_KEY_DOUBLE, S(workload.output.sigma), "0.5", 0, 100, NULL, "lognormal sigma"},
    {"workload.output.min", KV_KEY_INT, S(workload.output.min), "1", 1, 1 << 30, NULL, "smallest length"},
    {"workload.output.max", KV_KEY_INT, S(workload.output.max), "1048576", 1, 1 << 30, NULL, "largest length"},
    {"workload.output.samples", KV_KEY_INTLIST, S(workload.output.samples), "[]", 1, 1 << 30, NULL,
     "empirical samples"},
    {"workload.trace", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "replay a trace instead of synthetic arrivals"},
    {"workload.trace.format", KV_KEY_ENUM, S(workload.trace.format), "none", 0, 0, kv_workload_trace_format_names,
     "trace format"},
    {"workload.trace.path", KV_KEY_STRING, S(workload.trace.path), "\"\"", 0, 0, NULL,
     "trace file (relative: the scenario's folder, the working folder, kvsim's data folder)"},
    {"workload.trace.time_scale", KV_KEY_POSITIVE, S(workload.trace.time_scale), "1", 0, 1e9, NULL,
     "multiply trace times by this (0.5 = twice the rate)"},
    {"workload.trace.repeat", KV_KEY_INT, S(workload.trace.repeat), "1", 1, 1000000, NULL,
     "tile the trace this many times end to end (each copy one mean gap after the last; workload.requests "
     "caps the rows of all copies)"},

    {"timing", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "where operation times come from"},
    {"timing.source", KV_KEY_ENUM, S(timing.source), "model", 0, 0, kv_timing_source_names,
     "model: roofline over device profiles; measured: run the kernels on a backend; profile: step times from a "
     "profiled table (timing.profile)"},
    {"timing.backend", KV_KEY_STRING, S(timing.backend), "cpu", 0, 0, NULL, "backend for measured kernels"},
    {"timing.calibration", KV_KEY_STRING, S(timing.calibration), "\"\"", 0, 0, NULL,
     "a kvsim bench kernels --json file whose efficiencies scale kernel costs"},
    {"timing.samples", KV_KEY_INT, S(timing.samples), "3", 1, 1000, NULL, "measured: runs per kernel size"},
    {"timing.profile", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "profile: a CSV in splitwise-sim's perf_model.csv layout (docs/timing.md)"},
    {"timing.profile.file", KV_KEY_STRING, S(timing.profile.file), "\"\"", 0, 0, NULL,
     "the table (relative: as workload.trace.path)"},
    {"timing.profile.model", KV_KEY_STRING, S(timing.profile.model), "\"\"", 0, 0, NULL,
     "the table's model column to use (e.g. llama2-70b)"},
    {"timing.profile.prefill_hardware", KV_KEY_STRING, S(timing.profile.prefill_hardware), "\"\"", 0, 0, NULL,
     "its hardware column for the prefill pool (e.g. h100-80gb); rows must match cluster.prefill.tp"},
    {"timing.profile.decode_hardware", KV_KEY_STRING, S(timing.profile.decode_hardware), "\"\"", 0, 0, NULL,
     "likewise for the decode pool (\"\": the prefill pool's)"},
    {"timing.roofline", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "calibration of the roofline's step times (kvsim bench roofline fits them to a profiled table)"},
    {"timing.roofline.prefill_floor_ms", KV_KEY_DOUBLE, S(timing.roofline.prefill_floor_ms), "0", 0, 1e6, NULL,
     "least time of a step with prompts, ms"},
    {"timing.roofline.decode_floor_ms", KV_KEY_DOUBLE, S(timing.roofline.decode_floor_ms), "0", 0, 1e6, NULL,
     "least time of a decode step, ms"},
    {"timing.roofline.prefill_efficiency", KV_KEY_POSITIVE, S(timing.roofline.prefill_efficiency), "1", 0, 100,
     NULL, "a step with prompts costs its roofline time / this"},
    {"timing.roofline.decode_efficiency", KV_KEY_POSITIVE, S(timing.roofline.decode_efficiency), "1", 0, 100, NULL,
     "a decode step costs its roofline time / this"},

    {"policies", KV_KEY_STRLIST, S(policies), "[bf16, int8, int4]", 0, 0, NULL,
     "policies to compare, one table row each (policies/<name>.lua)"},
    {"policy", KV_KEY_FREEMAP, S(policy_settings), NULL, 0, 0, NULL,
     "per-policy settings: policy.<name>.file and policy.<name>.<param>"},
    {"policy_limits", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "what each Lua policy may use; past a limit the run stops with exit 2 (docs/policies.md)"},
    {"policy_limits.instructions", KV_KEY_INT, S(policy_limits.instructions), "1000000", 1000, 2147483647, NULL,
     "Lua VM instructions per hook call (loading the file: 10x); pattern matching and sorting are charged too"},
    {"policy_limits.memory_mib", KV_KEY_INT, S(policy_limits.memory_mib), "32", 1, 65536, NULL,
     "Lua heap per policy, MiB"},
    {"policy_limits.string_kib", KV_KEY_INT, S(policy_limits.string_kib), "1024", 1, 1 << 26, NULL,
     "longest string a policy may make, KiB (also the most source load() reads)"},
    {"policy_limits.hook_ms", KV_KEY_DOUBLE, S(policy_limits.hook_ms), "1000", 10, 1e9, NULL,
     "wall-clock time per hook call, ms (loading the file: 10x); a run that stays under it is unchanged"},
    {"policy_limits.run_s", KV_KEY_DOUBLE, S(policy_limits.run_s), "600", 0.01, 1e9, NULL,
     "wall-clock time one policy may spend in Lua over the whole run, s"},
    {"policy_limits.print_kib", KV_KEY_INT, S(policy_limits.print_kib), "64", 1, 1 << 20, NULL,
     "print() output per policy per run, KiB, on stderr; past it one line says further output is suppressed"},

    {"lynx", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "speculative decoding on anchor-only KV"},
    {"lynx.from", KV_KEY_ENUM, S(lynx.from), "reference-model", 0, 0, kv_lynx_from_names,
     "where acceptance rates come from: measured per policy (its own bit split) on the reference model, "
     "cached on disk (needs scripts/fetch-model.sh); scenario: the fixed lynx.acceptance; file: measured by "
     "prompt length, from the file `stats` (each policy's encodings must be in it)"},
    {"lynx.acceptance", KV_KEY_DOUBLE, S(lynx.acceptance), "0.9", 0, 1, NULL,
     "with lynx.from: scenario: probability a speculated token is accepted (each position)"},
    {"lynx.acceptance_per_position", KV_KEY_DOUBLELIST, S(lynx.acceptance_per_position), "[]", 0, 1, NULL,
     "with lynx.from: scenario: per-position acceptance, overrides lynx.acceptance"},
    {"lynx.samples", KV_KEY_INT, S(lynx.samples), "32", 1, 256, NULL,
     "with lynx.from: reference-model: speculations measured per policy (over 4 texts, rounded up to a multiple of 4)"},
    {"lynx.max_prompt_tokens", KV_KEY_INT, S(lynx.max_prompt_tokens), "1024", 64, 4096, NULL,
     "with lynx.from: reference-model: longest measured prompt; the workload's prompt lengths are clamped to it "
     "(the reference model prefills about 512 tokens a second on a CPU)"},
    {"lynx.ttkt_k", KV_KEY_INT, S(lynx.ttkt_k), "10", 1, 1 << 30, NULL,
     "K of ttkt_ms (time to the K-th committed token)"},

    {"diffkv", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "where DiffKV's token significance comes from in the engine, which runs no attention (docs/diffkv.md)"},
    {"diffkv.scores", KV_KEY_ENUM, S(diffkv.scores), "measured", 0, 0, kv_diffkv_scores_from_names,
     "measured: significance x context length drawn from its distribution per (layer, KV head) measured on "
     "the reference model (accuracy.model, cached; needs scripts/fetch-model.sh once); lognormal: drawn "
     "from a lognormal with mean 1 (score_sigma, head_spread); both: the policy's alphas decide by DiffKV's "
     "rule; fixed: high_fraction / low_fraction, alphas ignored; file: measured tables by prompt length from the "
     "file `stats` (each DiffKV policy's window must be in it)"},
    {"diffkv.measure_tokens", KV_KEY_INT, S(diffkv.measure_tokens), "0", 0, 2048, NULL,
     "measured: prompt tokens the reference model prefills (0: the workload's mean prompt, rounded to 64, "
     "128..2048)"},
    {"diffkv.score_sigma", KV_KEY_DOUBLE, S(diffkv.score_sigma), "2", 0, 10, NULL,
     "lognormal: sd of ln(significance x L) for a typical head (larger = sparser attention)"},
    {"diffkv.head_spread", KV_KEY_DOUBLE, S(diffkv.head_spread), "0.3", 0, 5, NULL,
     "lognormal: sd of ln(head sigma / score_sigma) across (layer, KV head)"},
    {"diffkv.high_fraction", KV_KEY_DOUBLE, S(diffkv.high_fraction), "0.3", 0, 1, NULL,
     "fixed: share of tokens kept in the high tier (outside the recent window)"},
    {"diffkv.low_fraction", KV_KEY_DOUBLE, S(diffkv.low_fraction), "0.5", 0, 1, NULL,
     "fixed: share in the low tier; the rest is pruned"},

    {"memory", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "the decode nodes' paged KV memory (docs/diffkv.md)"},
    {"memory.page_tokens_min", KV_KEY_INT, S(memory.page_tokens_min), "16", 1, 65536, NULL,
     "smallest page, in tokens of the policy's largest tier (16 = vLLM's block)"},
    {"memory.page_tokens_max", KV_KEY_INT, S(memory.page_tokens_max), "64", 1, 65536, NULL,
     "largest page; the size with the least waste across tiers wins (DiffKV)"},
    {"memory.watermark", KV_KEY_DOUBLE, S(memory.watermark), "0.01", 0, 0.5, NULL,
     "share of pages admission keeps free for running requests to grow into"},
    {"memory.swap_bandwidth_gbs", KV_KEY_POSITIVE, S(memory.swap_bandwidth_gbs), "25", 0, 1e6, NULL,
     "GB/s between device and host when a policy preempts by swapping"},
    {"memory.manager_call_us", KV_KEY_DOUBLE, S(memory.manager_call_us), "5", 0, 1e6, NULL,
     "modelled fixed cost of one compaction call (launches), added to DiffKV's steps"},
    {"memory.measure_manager", KV_KEY_BOOL, S(memory.measure_manager), "false", 0, 0, NULL,
     "also time the real manager calls on timing.backend (results then vary run to run)"},

    {"accuracy", KV_KEY_FREEMAP, S(accuracy), NULL, 0, 0, NULL,
     "the reference model's accuracy study (kvsim eval; keys in docs/accuracy.md)"},

    {"outputs", KV_KEY_SECTION, 0, NULL, 0, 0, NULL, "what a run writes"},
    {"outputs.dir", KV_KEY_STRING, S(outputs.dir), "\"\"", 0, 0, NULL, "output folder (--out overrides; empty: none)"},
    {"outputs.json", KV_KEY_BOOL, S(outputs.json), "true", 0, 0, NULL, "results.json"},
    {"outputs.csv", KV_KEY_BOOL, S(outputs.csv), "true", 0, 0, NULL, "requests.csv"},
    {"outputs.trace", KV_KEY_BOOL, S(outputs.trace), "true", 0, 0, NULL, "trace.json (Perfetto timeline)"},
    {"outputs.progress", KV_KEY_BOOL, S(outputs.progress), "true", 0, 0, NULL,
     "progress line when stderr is a terminal"},
};
#undef S

static const kv_schema scenario_schema = {"scenario", scenario_keys, sizeof scenario_keys / sizeof scenario_keys[0]};

void kv_scenario_print_reference(FILE *out)
{
    fprintf(out, "# kvsim scenario reference: every key, its default, what it means.\n");
    kv_schema_print(&scenario_schema, out);
}

const char *kv_scenario_where(const kv_scenario *s, const char *dotted, char *buf, size_t size)
{
    const kv_ynode *n = kv_ytree_path(s->tree, dotted);
    if (n)
        return kv_ytree_where(n, buf, size);
    snprintf(buf, size, "%s", s->path);
    return buf;
}

const char *kv_scenario_where_first(const kv_scenario *s, const char *const *keys, size_t n, const char **key,
                                    char *buf, size_t size)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (kv_ytree_path(s->tree, keys[i])) {
            *key = keys[i];
            return kv_scenario_where(s, keys[i], buf, size);
        }
    *key = keys[n - 1];
    return kv_scenario_where(s, keys[n - 1], buf, size);
}

void kv_scenario_locate(const kv_scenario *s, kv_error *err)
{
    if (!err || err->code == KV_OK || !err->key[0])
        return;
    char dotted[sizeof err->key];
    snprintf(dotted, sizeof dotted, "%s", err->key);
    const kv_ynode *node = kv_ytree_path(s->tree, dotted);
    while (!node) { /* a default: the nearest section written in the file, else the file itself */
        char *dot = strrchr(dotted, '.');
        if (!dot)
            break;
        *dot = '\0';
        node = kv_ytree_path(s->tree, dotted);
    }
    const char *rest = err->msg;
    size_t n = strlen(s->path);
    if (strncmp(rest, s->path, n) == 0 && strncmp(rest + n, ": ", 2) == 0)
        rest += n + 2; /* the layer named only the file */
    char w[512], msg[sizeof err->msg], key[sizeof err->key];
    snprintf(msg, sizeof msg, "%s", rest);
    snprintf(key, sizeof key, "%s", err->key);
    kv_error_set_key(err, err->code, key, "%s: %s", node ? kv_ytree_where(node, w, sizeof w) : s->path, msg);
}

/* Whether the value of `key` is `name` as given on the command line (--set): such a path is the user's
   own, relative to the working folder only. */
static int from_command_line(const kv_scenario *s, const char *key, const char *name)
{
    const kv_ynode *n = key ? kv_ytree_path(s->tree, key) : NULL;
    return n && n->kind == KV_YSCALAR && strcmp(n->value, name) == 0 && strncmp(n->file, "--set", 5) == 0;
}

int kv_scenario_find_file(const kv_scenario *s, const char *name, const char *key, char *path, size_t size,
                          kv_error *err)
{
    char w[512];
    if (name[0] == '/') {
        snprintf(path, size, "%s", name);
        if (access(path, R_OK) == 0)
            return KV_OK;
        return kv_error_set(err, KV_EINPUT, "%s: %s: file '%s' not found", kv_scenario_where(s, key, w, sizeof w),
                            key, name);
    }
    /* The scenario's folder, the working folder, kvsim's data folder; a --set path: the working folder. */
    int cli = from_command_line(s, key, name);
    const char *bases[3];
    int n = 0;
    if (!cli)
        bases[n++] = s->dir;
    bases[n++] = ".";
    if (!cli && s->data_dir && s->data_dir[0])
        bases[n++] = s->data_dir;
    for (int i = 0; i < n; i++) {
        if (strcmp(bases[i], ".") == 0)
            snprintf(path, size, "%s", name);
        else
            snprintf(path, size, "%s/%s", bases[i], name);
        if (access(path, R_OK) == 0)
            return KV_OK;
    }
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, ".");
    if (cli)
        return kv_error_set(err, KV_EINPUT, "--set %s: file '%s' not found (a path given with --set is relative to "
                            "the working folder, %s)", key, name, cwd);
    if (s->data_dir && s->data_dir[0])
        return kv_error_set(err, KV_EINPUT, "%s: %s: file '%s' not found (looked in the scenario's folder %s, the "
                            "working folder %s and kvsim's data folder %s)", kv_scenario_where(s, key, w, sizeof w),
                            key, name, s->dir, cwd, s->data_dir);
    return kv_error_set(err, KV_EINPUT, "%s: %s: file '%s' not found (looked in the scenario's folder %s and the "
                        "working folder %s; no kvsim data folder was found: kvsim --version lists where it looks)",
                        kv_scenario_where(s, key, w, sizeof w), key, name, s->dir, cwd);
}

/* Applies one "a.b.c=value" override to the tree. */
static int apply_override(kv_ynode *tree, const char *text, kv_error *err)
{
    const char *eq = strchr(text, '=');
    if (!eq || eq == text)
        return kv_error_set(err, KV_EINPUT, "--set %s: expected key.path=value", text);
    char *key = kv_strndup(text, (size_t)(eq - text));
    char origin[600];
    snprintf(origin, sizeof origin, "--set %s", key);
    kv_ynode *value = NULL;
    int rc = kv_ytree_load_string(eq + 1, origin, &value, err);
    if (!rc && value->kind == KV_YMAP && value->count == 0 && eq[1] != '{') {
        /* An empty value ("key=") is the empty string, not an empty mapping. */
        kv_ytree_free(value);
        rc = kv_ytree_load_string("\"\"", origin, &value, err);
    }
    if (!rc)
        rc = kv_ytree_set(tree, key, value, err);
    kv_free(key);
    return rc;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The policy names, sorted (for the duplicate check and the policy.<name> lookups): kv_free it. */
static const char **sorted_policies(const kv_scenario *s)
{
    const char **sorted = kv_calloc(s->policies.count + 1, sizeof *sorted);
    for (size_t i = 0; i < s->policies.count; i++)
        sorted[i] = s->policies.items[i];
    qsort(sorted, s->policies.count, sizeof *sorted, compare_names);
    return sorted;
}

static int check_policy_settings(const kv_scenario *s, const char **sorted, kv_error *err);

static int check(kv_scenario *s, kv_error *err)
{
    char w[512];
    if (s->policies.count == 0)
        return kv_error_set(err, KV_EINPUT, "%s: policies: name at least one policy to compare",
                            kv_scenario_where(s, "policies", w, sizeof w));
    if (s->policies.count > KV_SCENARIO_MAX_POLICIES)
        return kv_error_set(err, KV_EINPUT, "%s: policies: %zu policies, at most %d can be compared in one run",
                            kv_scenario_where(s, "policies", w, sizeof w), s->policies.count,
                            KV_SCENARIO_MAX_POLICIES);
    if (s->lynx.from == KV_LYNX_FROM_FILE && s->stats[0] == '\0')
        return kv_error_set(err, KV_EINPUT, "%s: lynx.from: file needs `stats: PATH`, the model statistics file "
                            "(docs/stats-format.md)", kv_scenario_where(s, "lynx.from", w, sizeof w));
    if (s->diffkv.scores == KV_DIFFKV_FROM_FILE && s->stats[0] == '\0')
        return kv_error_set(err, KV_EINPUT, "%s: diffkv.scores: file needs `stats: PATH`, the model statistics "
                            "file (docs/stats-format.md)", kv_scenario_where(s, "diffkv.scores", w, sizeof w));
    const char **sorted = sorted_policies(s);
    int rc = KV_OK;
    for (size_t i = 1; !rc && i < s->policies.count; i++)
        if (strcmp(sorted[i], sorted[i - 1]) == 0)
            rc = kv_error_set(err, KV_EINPUT, "%s: policies: '%s' is listed twice",
                              kv_scenario_where(s, "policies", w, sizeof w), sorted[i]);
    if (!rc)
        rc = check_policy_settings(s, sorted, err);
    kv_free(sorted);
    if (rc)
        return rc;
    const kv_scenario_workload *wl = &s->workload;
    if (wl->prompt.min > wl->prompt.max)
        return kv_error_set(err, KV_EINPUT, "%s: workload.prompt: min (%d) is larger than max (%d)",
                            kv_scenario_where(s, "workload.prompt", w, sizeof w), wl->prompt.min, wl->prompt.max);
    if (wl->output.min > wl->output.max)
        return kv_error_set(err, KV_EINPUT, "%s: workload.output: min (%d) is larger than max (%d)",
                            kv_scenario_where(s, "workload.output", w, sizeof w), wl->output.min, wl->output.max);
    if (wl->prompt.dist == KV_WORKLOAD_LENGTH_EMPIRICAL && wl->prompt.samples.count == 0)
        return kv_error_set(err, KV_EINPUT, "%s: workload.prompt.samples: empirical needs at least one sample",
                            kv_scenario_where(s, "workload.prompt", w, sizeof w));
    if (wl->output.dist == KV_WORKLOAD_LENGTH_EMPIRICAL && wl->output.samples.count == 0)
        return kv_error_set(err, KV_EINPUT, "%s: workload.output.samples: empirical needs at least one sample",
                            kv_scenario_where(s, "workload.output", w, sizeof w));
    if (wl->trace.format != KV_WORKLOAD_TRACE_NONE && wl->trace.path[0] == '\0')
        return kv_error_set(err, KV_EINPUT, "%s: workload.trace.path: a trace format needs a path",
                            kv_scenario_where(s, "workload.trace.format", w, sizeof w));
    if (wl->trace.format == KV_WORKLOAD_TRACE_NONE && wl->trace.path[0] != '\0')
        return kv_error_set(err, KV_EINPUT, "%s: workload.trace.format: say which format the trace is in "
                            "(azure, mooncake, burstgpt)", kv_scenario_where(s, "workload.trace.path", w, sizeof w));
    if (wl->trace.format == KV_WORKLOAD_TRACE_NONE && wl->requests == 0)
        return kv_error_set(err, KV_EINPUT, "%s: workload.requests: a synthetic workload needs at least 1 request",
                            kv_scenario_where(s, "workload.requests", w, sizeof w));
    if (wl->arrival != KV_WORKLOAD_ARRIVAL_FIXED && !(wl->rate_per_s > 0) &&
        wl->trace.format == KV_WORKLOAD_TRACE_NONE)
        return kv_error_set(err, KV_EINPUT, "%s: workload.rate_per_s: %s arrivals need a rate > 0",
                            kv_scenario_where(s, "workload.rate_per_s", w, sizeof w),
                            kv_workload_arrival_names[wl->arrival]);
    if (s->memory.page_tokens_min > s->memory.page_tokens_max)
        return kv_error_set(err, KV_EINPUT, "%s: memory: page_tokens_min (%d) is larger than page_tokens_max (%d)",
                            kv_scenario_where(s, "memory", w, sizeof w), s->memory.page_tokens_min,
                            s->memory.page_tokens_max);
    if (s->diffkv.high_fraction + s->diffkv.low_fraction > 1.0 + 1e-12)
        return kv_error_set(err, KV_EINPUT, "%s: diffkv: high_fraction + low_fraction must not exceed 1",
                            kv_scenario_where(s, "diffkv", w, sizeof w));
    if (s->network.topology == KV_NETWORK_PLATFORM && s->network.platform_file[0] == '\0')
        return kv_error_set(err, KV_EINPUT, "%s: network.platform_file: topology 'platform' needs a file",
                            kv_scenario_where(s, "network.topology", w, sizeof w));
    const kv_scenario_network *net = &s->network;
    int hosts = s->cluster.prefill.nodes + s->cluster.decode.nodes;
    if (net->host_slots.count && net->host_slots.count != (size_t)hosts)
        return kv_error_set(err, KV_EINPUT, "%s: network.host_slots: lists %zu positions for %d nodes",
                            kv_scenario_where(s, "network.host_slots", w, sizeof w), net->host_slots.count, hosts);
    if (net->host_names.count && net->host_names.count != (size_t)hosts)
        return kv_error_set(err, KV_EINPUT, "%s: network.host_names: lists %zu hosts for %d nodes",
                            kv_scenario_where(s, "network.host_names", w, sizeof w), net->host_names.count, hosts);
    if (net->torus_dims.count > 3)
        return kv_error_set(err, KV_EINPUT, "%s: network.torus_dims: at most 3 dimensions",
                            kv_scenario_where(s, "network.torus_dims", w, sizeof w));
    return KV_OK;
}

/* policy.<name> must name a compared policy and hold a mapping; sorted: the policy names, sorted. */
static int check_policy_settings(const kv_scenario *s, const char **sorted, kv_error *err)
{
    if (!s->policy_settings || s->policy_settings->kind != KV_YMAP)
        return KV_OK;
    /* Settings for a policy that is not compared are almost always a typo. */
    const kv_ynode *ps = s->policy_settings;
    for (size_t i = 0; i < ps->count; i++) {
        const char *key = ps->keys[i];
        if (!bsearch(&key, sorted, s->policies.count, sizeof *sorted, compare_names)) {
            const char *hint = kv_did_you_mean(ps->keys[i], (const char *const *)s->policies.items,
                                               s->policies.count);
            return kv_error_set(err, KV_EINPUT, "%s:%d:%d: policy.%s: '%s' is not in policies [...]%s%s%s",
                                ps->file, ps->key_lines[i], ps->key_cols[i], ps->keys[i], ps->keys[i],
                                hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
        }
        if (ps->items[i]->kind != KV_YMAP)
            return kv_error_set(err, KV_EINPUT, "%s:%d:%d: policy.%s: expected a mapping of settings",
                                ps->file, ps->key_lines[i], ps->key_cols[i], ps->keys[i]);
    }
    return KV_OK;
}

/* After --set policies=[...]: the policy.<name> settings of the policies no longer listed are dropped
   (a scenario that configures lynx16 can be run with policies=[bf16, lynx]); s->note says which. */
static void drop_unlisted_settings(kv_scenario *s)
{
    const kv_ynode *list = kv_ytree_get(s->tree, "policies", NULL);
    kv_ynode *settings = kv_ytree_get(s->tree, "policy", NULL);
    if (!list || list->kind != KV_YSEQ || !settings || settings->kind != KV_YMAP)
        return; /* binding reports a malformed list or section */
    char dropped[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < settings->count;) {
        int listed = 0;
        for (size_t k = 0; k < list->count && !listed; k++)
            listed = list->items[k]->kind == KV_YSCALAR && strcmp(list->items[k]->value, settings->keys[i]) == 0;
        if (listed) {
            i++;
            continue;
        }
        if (used < sizeof dropped) {
            int n = snprintf(dropped + used, sizeof dropped - used, "%spolicy.%s.*", used ? ", " : "",
                             settings->keys[i]);
            used += n > 0 ? (size_t)n : 0;
        }
        kv_ytree_remove(settings, settings->keys[i]);
    }
    if (!dropped[0])
        return;
    size_t len = strlen(dropped) + 128;
    s->note = kv_malloc(len);
    snprintf(s->note, len, "--set policies: ignoring the settings of policies not listed (%s)", dropped);
}

int kv_scenario_load(const char *path, const char *const *overrides, int n_overrides, kv_scenario **out,
                     kv_error *err)
{
    *out = NULL;
    kv_scenario *s = kv_calloc(1, sizeof *s);
    s->path = kv_strdup(path);
    char *tmp = kv_strdup(path);
    s->dir = kv_strdup(dirname(tmp));
    kv_free(tmp);
    char data[KV_DATA_PATH_MAX];
    s->data_dir = kv_strdup(kv_data_dir(data, sizeof data) ? data : "");

    int rc = kv_ytree_load_file(path, &s->tree, err);
    if (!rc && s->tree->kind != KV_YMAP)
        rc = kv_error_set(err, KV_EINPUT, "%s:%d:%d: a scenario is a mapping of keys (name:, model:, ...)", path,
                          s->tree->line, s->tree->col);
    s->overrides = kv_calloc((size_t)n_overrides + 1, sizeof *s->overrides);
    int sets_policies = 0;
    for (int i = 0; !rc && i < n_overrides; i++) {
        rc = apply_override(s->tree, overrides[i], err);
        s->overrides[s->n_overrides++] = kv_strdup(overrides[i]);
        sets_policies |= strncmp(overrides[i], "policies=", 9) == 0;
    }
    if (!rc && sets_policies)
        drop_unlisted_settings(s);
    if (!rc)
        rc = kv_schema_bind(&scenario_schema, s->tree, s, err);
    if (!rc)
        rc = check(s, err);

    /* Cards by name: <dir>/models/<name>.yaml (devices/...) for dir the scenario's folder, its parent (for
       scenarios/tutorial/...), the working folder's scenarios/, kvsim's data folder's scenarios/. A card
       given as a path resolves like every other path (kv_scenario_find_file). */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s/..", s->dir);
    char data_scen[4096];
    snprintf(data_scen, sizeof data_scen, "%s/scenarios", s->data_dir);
    const char *dirs[] = {s->dir, parent, "scenarios", data_scen};
    int n_dirs = s->data_dir[0] ? 4 : 3;
    const char *card_keys[] = {"model", "cluster.prefill.device", "cluster.decode.device"};
    const char *card_names[] = {s->model, s->cluster.prefill.device, s->cluster.decode.device};
    char card_paths[3][4096];
    int card_dirs[3]; /* a resolved path goes with no search folders: cards.c then takes it as it is */
    for (int i = 0; !rc && i < 3; i++) {
        const char *name = card_names[i];
        size_t len = strlen(name);
        card_dirs[i] = n_dirs;
        snprintf(card_paths[i], sizeof card_paths[i], "%s", name);
        if (strchr(name, '/') || (len > 5 && strcmp(name + len - 5, ".yaml") == 0)) {
            card_dirs[i] = 0;
            rc = kv_scenario_find_file(s, name, card_keys[i], card_paths[i], sizeof card_paths[i], err);
        }
    }
    char w[512];
    if (!rc)
        rc = kv_model_card_load(card_paths[0], dirs, card_dirs[0], kv_scenario_where(s, "model", w, sizeof w),
                                &s->model_card, err);
    if (!rc)
        rc = kv_device_profile_load(card_paths[1], dirs, card_dirs[1],
                                    kv_scenario_where(s, "cluster.prefill.device", w, sizeof w), &s->prefill_device,
                                    err);
    if (!rc)
        rc = kv_device_profile_load(card_paths[2], dirs, card_dirs[2],
                                    kv_scenario_where(s, "cluster.decode.device", w, sizeof w), &s->decode_device,
                                    err);
    if (rc) {
        kv_scenario_destroy(s);
        return rc;
    }
    *out = s;
    return KV_OK;
}

void kv_scenario_destroy(kv_scenario *s)
{
    if (!s)
        return;
    kv_schema_free(&scenario_schema, s);
    kv_model_card_free(&s->model_card);
    kv_device_profile_free(&s->prefill_device);
    kv_device_profile_free(&s->decode_device);
    kv_ytree_free(s->tree);
    for (int i = 0; i < s->n_overrides; i++)
        kv_free(s->overrides[i]);
    kv_free(s->overrides);
    kv_free(s->path);
    kv_free(s->dir);
    kv_free(s->data_dir);
    kv_free(s->note);
    kv_free(s);
}
