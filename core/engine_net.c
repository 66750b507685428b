/* engine_net.c — the scenario's `network:` section as a kv_net_config, and a check that it builds. */
#include <string.h>

#include "core/engine.h"

int kv_engine_net_config(const kv_scenario *s, int model, kv_net_config *cfg, char *platform_path, size_t size,
                         kv_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (kv_net_model)model;
    int topo = kv_net_topology_parse(s->topology);
    cfg->topology = topo < 0 ? KV_TOPO_STAR : (kv_net_topology)topo;
    cfg->hosts = s->prefill.nodes + s->decode.nodes;
    cfg->nic_bandwidth_gbps = s->nic_bandwidth_gbps;
    cfg->nic_latency_s = s->nic_latency_us * 1e-6;
    cfg->switch_bandwidth_gbps = s->switch_bandwidth_gbps;
    cfg->switch_latency_s = s->switch_latency_us * 1e-6;
    cfg->hosts_per_leaf = s->hosts_per_leaf;
    cfg->oversubscription = s->oversubscription;
    cfg->split_duplex = s->split_duplex;
    cfg->platform_file = s->platform_file[0] ? s->platform_file : NULL;
    cfg->source = s->path;
    cfg->priority = KV_PRIO_NONE; /* the engine sets the policy's mode */
    cfg->class_weight[0] = 1;
    cfg->class_weight[1] = 1;
    cfg->fat_tree_spines = s->fat_tree_spines;
    cfg->fat_tree_leaves = s->fat_tree_leaves;
    for (size_t i = 0; i < 3 && i < s->torus_dims.count; i++)
        cfg->torus_dims[i] = s->torus_dims.items[i];
    cfg->dragonfly_groups = s->dragonfly_groups;
    cfg->dragonfly_chassis = s->dragonfly_chassis;
    cfg->dragonfly_routers = s->dragonfly_routers;
    cfg->dragonfly_nodes = s->dragonfly_nodes;
    cfg->host_slot = s->host_slots.count ? s->host_slots.items : NULL;
    cfg->host_names = s->host_names.count ? (const char *const *)s->host_names.items : NULL;
    const kv_ynode *opts = s->simgrid_options;
    if (opts && opts->kind == KV_YMAP) {
        for (size_t i = 0; i < opts->count && cfg->n_options < KV_NET_MAX_OPTIONS; i++) {
            if (opts->items[i]->kind != KV_YSCALAR)
                continue;
            cfg->option_key[cfg->n_options] = opts->keys[i];
            cfg->option_value[cfg->n_options] = opts->items[i]->value;
            cfg->n_options++;
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

int kv_engine_check_network(const kv_scenario *s, int model, kv_error *err)
{
    if (s->colocated)
        return KV_OK;
    char path[4096];
    kv_net_config cfg;
    int rc = kv_engine_net_config(s, model, &cfg, path, sizeof path, err);
    kv_net *net = NULL;
    if (!rc)
        rc = kv_net_create(&cfg, ignore_done, NULL, &net, err);
    kv_net_destroy(net);
    return rc;
}
