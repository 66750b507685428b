/* engine_net.c — the scenario's `network:` section as a kv_net_config, and a check that it builds. */
#include <stdio.h>
#include <string.h>

#include "core/sim/engine_config.h"

static kv_net_topology net_topology(kv_network_topology t)
{
    switch (t) {
    case KV_NETWORK_FAT_TREE: return KV_TOPO_FAT_TREE;
    case KV_NETWORK_TORUS: return KV_TOPO_TORUS;
    case KV_NETWORK_DRAGONFLY: return KV_TOPO_DRAGONFLY;
    case KV_NETWORK_PLATFORM: return KV_TOPO_PLATFORM;
    case KV_NETWORK_STAR: break;
    }
    return KV_TOPO_STAR;
}

int kv_engine_net_config(const kv_scenario *s, kv_net_config *cfg, char *platform_path, size_t size, kv_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model = s->network.model == KV_NETWORK_IDEAL ? KV_NET_IDEAL : KV_NET_SIMGRID;
    cfg->topology = net_topology(s->network.topology);
    cfg->hosts = s->cluster.prefill.nodes + s->cluster.decode.nodes;
    cfg->nic_bandwidth_gbps = s->network.nic_bandwidth_gbps;
    cfg->nic_latency_s = s->network.nic_latency_us * 1e-6;
    cfg->switch_bandwidth_gbps = s->network.switch_bandwidth_gbps;
    cfg->switch_latency_s = s->network.switch_latency_us * 1e-6;
    cfg->hosts_per_leaf = s->network.hosts_per_leaf;
    cfg->oversubscription = s->network.oversubscription;
    cfg->split_duplex = s->network.split_duplex;
    cfg->platform_file = s->network.platform_file[0] ? s->network.platform_file : NULL;
    cfg->source = s->path;
    cfg->priority = KV_PRIO_NONE; /* the engine sets the policy's mode */
    cfg->class_weight[0] = 1;
    cfg->class_weight[1] = 1;
    cfg->fat_tree_spines = s->network.fat_tree.spines;
    cfg->fat_tree_leaves = s->network.fat_tree.leaves;
    for (size_t i = 0; i < 3 && i < s->network.torus_dims.count; i++)
        cfg->torus_dims[i] = s->network.torus_dims.items[i];
    cfg->dragonfly_groups = s->network.dragonfly.groups;
    cfg->dragonfly_chassis = s->network.dragonfly.chassis;
    cfg->dragonfly_routers = s->network.dragonfly.routers;
    cfg->dragonfly_nodes = s->network.dragonfly.nodes;
    cfg->host_slot = s->network.host_slots.count ? s->network.host_slots.items : NULL;
    cfg->host_names = s->network.host_names.count ? (const char *const *)s->network.host_names.items : NULL;
    cfg->prefill_hosts = s->cluster.prefill.nodes;
    cfg->watchdog_s = s->network.watchdog_s;
    cfg->run_in_child = s->network.in_child; /* simgrid: a run's engine runs in the SimGrid child (kv_engine_run) */
    const kv_ynode *opts = s->network.simgrid;
    if (opts && opts->kind == KV_YMAP) {
        char w[512];
        if (opts->count > KV_NET_MAX_OPTIONS)
            return kv_error_set(err, KV_EINPUT, "%s: network.simgrid: at most %d options, got %zu",
                                kv_ytree_where(opts, w, sizeof w), KV_NET_MAX_OPTIONS, opts->count);
        for (size_t i = 0; i < opts->count; i++) {
            const kv_ynode *v = opts->items[i];
            if (v->kind != KV_YSCALAR)
                return kv_error_set(err, KV_EINPUT, "%s: network.simgrid.%s: expected a value, got a %s",
                                    kv_ytree_where(v, w, sizeof w), opts->keys[i],
                                    v->kind == KV_YMAP ? "mapping" : "list");
            int n = cfg->n_options++;
            cfg->option_key[n] = opts->keys[i];
            cfg->option_value[n] = v->value;
            cfg->option_file[n] = v->file;
            cfg->option_line[n] = v->line;
            cfg->option_col[n] = v->col;
        }
    }
    if (cfg->platform_file) {
        int rc = kv_scenario_find_file(s, cfg->platform_file, "network.platform_file", platform_path, size, err);
        if (rc)
            return rc;
        cfg->platform_file = platform_path;
    }
    return KV_OK;
}

static void ignore_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    (void)user, (void)id, (void)tag, (void)t;
}

/* The network names the key an error concerns in err->key, in its own config's names; the net config's
   fat_tree_spines and dragonfly_nodes are fat_tree.spines and dragonfly.nodes in the scenario. The
   scenario then puts the key's position in front (kv_scenario_locate). */
static void locate_network_key(const kv_scenario *s, kv_error *err)
{
    const char *prefixes[] = {"network.fat_tree_", "network.dragonfly_"};
    for (size_t i = 0; i < 2; i++)
        if (strncmp(err->key, prefixes[i], strlen(prefixes[i])) == 0)
            err->key[strlen(prefixes[i]) - 1] = '.';
    kv_scenario_locate(s, err);
}

int kv_engine_check_network(const kv_scenario *s, kv_error *err)
{
    if (s->cluster.colocated)
        return KV_OK;
    char path[4096];
    kv_net_config cfg;
    int rc = kv_engine_net_config(s, &cfg, path, sizeof path, err);
    kv_net *net = NULL;
    if (!rc)
        rc = kv_net_create(&cfg, ignore_done, NULL, &net, err);
    kv_net_destroy(net);
    if (rc == KV_EINPUT)
        locate_network_key(s, err);
    return rc;
}
