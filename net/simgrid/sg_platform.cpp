/* sg_platform.cpp — builds the SimGrid platform of a kv_net_config: star, fat-tree, torus, dragonfly, XML file.
 *
 * Every built-in topology models a host's NIC as its own link (nic bandwidth and
 * latency, one shared link or a split-duplex pair) and the fabric behind it with
 * switch links (switch_bandwidth_gbps, 0: NIC speed; switch_latency_s):
 *   star      one StarZone; route = NIC(src) [+ "switch" backbone] + NIC(dst).
 *   fat-tree  SimGrid's FatTreeZone "2;H,L;1,S;1,1" (d-mod-k routing); its host-to-leaf
 *             links are turned into the NICs, its leaf-to-spine links are switch links.
 *   torus     SimGrid's TorusZone; each position is a small StarZone holding the host,
 *             its NIC and a gateway router (the pattern of SimGrid's clusters-multicpu).
 *   dragonfly SimGrid's DragonflyZone; its node-to-router links become the NICs.
 * SimGrid bandwidths are bytes/s: gbps * 1e9 / 8 (exact for the usual values).
 */
#include "net/simgrid/sg_platform.hpp"
#include "net/simgrid/sg_proto.h"

#include <xbt/log.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace sg4 = simgrid::s4u;
using simgrid::kernel::routing::NetPoint;

namespace kvsg {

namespace {

/* What a platform file's links may have (SimGrid units: bytes/s, s). */
constexpr double kMinLinkBandwidth = 125.0;  /* 1 kbit/s */
constexpr double kMaxLinkBandwidth = 1.25e17; /* 1e9 Gbit/s, network.switch_bandwidth_gbps's maximum */
constexpr double kMaxLinkLatency = 1000.0;    /* s, network.nic_latency_us's maximum */

double bytes_per_s(double gbps)
{
    return gbps * 1e9 / 8.0;
}

sg4::Link::SharingPolicy link_policy(const kv_net_config* cfg)
{
    return cfg->split_duplex ? sg4::Link::SharingPolicy::SPLITDUPLEX : sg4::Link::SharingPolicy::SHARED;
}

int slot_count(const kv_net_config* cfg)
{
    switch (cfg->topology) {
    case KV_TOPO_FAT_TREE: {
        int leaves = cfg->fat_tree_leaves > 0 ? cfg->fat_tree_leaves
                                              : (cfg->hosts + cfg->hosts_per_leaf - 1) / cfg->hosts_per_leaf;
        return leaves * cfg->hosts_per_leaf;
    }
    case KV_TOPO_TORUS: {
        int n = 1;
        for (int d : cfg->torus_dims)
            if (d > 0)
                n *= d;
        return n;
    }
    case KV_TOPO_DRAGONFLY:
        return cfg->dragonfly_groups * cfg->dragonfly_chassis * cfg->dragonfly_routers * cfg->dragonfly_nodes;
    default:
        return cfg->hosts;
    }
}

/* The spine count of a fat-tree: given, or H * nic / (oversubscription * switch bw). The
   parent checked that this is a whole number. */
unsigned fat_tree_spines(const kv_net_config* cfg)
{
    if (cfg->fat_tree_spines > 0)
        return (unsigned)cfg->fat_tree_spines;
    double sw = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
    double over = cfg->oversubscription > 0 ? cfg->oversubscription : 1.0;
    return (unsigned)(cfg->hosts_per_leaf * cfg->nic_bandwidth_gbps / (over * sw) + 0.5);
}

/* A NIC link for host `name`: one shared link, or a split-duplex pair. Returns the
   links of the route host -> switch (up) and switch -> host (down). */
void make_nic(sg4::NetZone* zone, const kv_net_config* cfg, const std::string& name,
              std::vector<sg4::LinkInRoute>* up, std::vector<sg4::LinkInRoute>* down)
{
    double bw = bytes_per_s(cfg->nic_bandwidth_gbps);
    if (cfg->split_duplex) {
        sg4::SplitDuplexLink* l = zone->create_split_duplex_link(name, bw);
        l->set_latency(cfg->nic_latency_s);
        l->seal();
        up->emplace_back(l, sg4::LinkInRoute::Direction::UP);
        down->emplace_back(l, sg4::LinkInRoute::Direction::DOWN);
    } else {
        sg4::Link* l = zone->create_link(name, bw)->set_latency(cfg->nic_latency_s)->seal();
        up->emplace_back(l);
        down->emplace_back(l);
    }
}

void build_star(const kv_net_config* cfg)
{
    sg4::NetZone* zone = sg4::create_star_zone("kvsim");
    const sg4::Link* backbone = nullptr;
    if (cfg->switch_bandwidth_gbps > 0 || cfg->switch_latency_s > 0) {
        /* The switch fabric: one shared link that every flow crosses once. Without a
           bandwidth it only adds latency (its capacity, all NICs at once, never binds). */
        double bw = cfg->switch_bandwidth_gbps > 0 ? bytes_per_s(cfg->switch_bandwidth_gbps)
                                                   : bytes_per_s(cfg->nic_bandwidth_gbps) * cfg->hosts * 2.0;
        backbone = zone->create_link("switch", bw)->set_latency(cfg->switch_latency_s)->seal();
    }
    for (int slot = 0; slot < cfg->hosts; slot++) {
        std::string id = std::to_string(slot);
        const sg4::Host* host = zone->create_host("host" + id, 1e9)->seal();
        std::vector<sg4::LinkInRoute> up, down;
        make_nic(zone, cfg, "nic" + id, &up, &down);
        if (backbone == nullptr) {
            zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr, up, true);
        } else {
            up.emplace_back(backbone);
            zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr, up, false);
            zone->add_route(nullptr, host->get_netpoint(), nullptr, nullptr, down, false);
        }
    }
    zone->seal();
}

/* Cluster zones create one link type; this turns each host's access link (the first
   link of every route leaving it, the last of every route reaching it) into its NIC. */
void access_links_to_nics(const kv_net_config* cfg, const std::vector<sg4::Host*>& hosts, size_t stride)
{
    size_t n = hosts.size();
    double bw = bytes_per_s(cfg->nic_bandwidth_gbps);
    for (size_t i = 0; i < n; i++) {
        size_t j = (i + stride) % n;
        if (j == i)
            j = (i + 1) % n;
        std::vector<sg4::Link*> route;
        double latency = 0;
        hosts[i]->route_to(hosts[j], route, &latency);
        if (route.size() < 2)
            throw std::runtime_error("unexpected route from " + hosts[i]->get_name() + " to " + hosts[j]->get_name());
        for (sg4::Link* l : {route.front(), route.back()}) {
            l->set_bandwidth(bw);
            l->set_latency(cfg->nic_latency_s);
        }
    }
}

std::pair<NetPoint*, NetPoint*> plain_host(const sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id)
{
    /* SimGrid hands the zone it is building as const; creating hosts in it is the intent. */
    sg4::Host* host = const_cast<sg4::NetZone*>(zone)->create_host("host" + std::to_string(id), 1e9)->seal();
    return {host->get_netpoint(), nullptr};
}

void build_fat_tree(const kv_net_config* cfg, std::vector<sg4::Host*>* slots)
{
    unsigned h = (unsigned)cfg->hosts_per_leaf;
    unsigned leaves = (unsigned)(slot_count(cfg) / cfg->hosts_per_leaf);
    unsigned spines = fat_tree_spines(cfg);
    double sw_gbps = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
    sg4::FatTreeParams params(2, {h, leaves}, {1, spines}, {1, 1});
    sg4::NetZone* zone = sg4::create_fatTree_zone("kvsim", nullptr, params, sg4::ClusterCallbacks(plain_host),
                                                  bytes_per_s(sw_gbps), cfg->switch_latency_s, link_policy(cfg));
    zone->seal();
    for (int i = 0; i < slot_count(cfg); i++)
        slots->push_back(sg4::Host::by_name("host" + std::to_string(i)));
    /* A route to a host h slots away leaves the leaf whenever there is more than one. */
    access_links_to_nics(cfg, *slots, leaves > 1 ? h : 1);
}

std::pair<NetPoint*, NetPoint*> host_with_nic(const kv_net_config* cfg, const sg4::NetZone* parent, unsigned long id)
{
    std::string name = std::to_string(id);
    sg4::NetZone* zone = sg4::create_star_zone("node" + name);
    zone->set_parent(parent);
    const sg4::Host* host = zone->create_host("host" + name, 1e9)->seal();
    std::vector<sg4::LinkInRoute> up, down;
    make_nic(zone, cfg, "nic" + name, &up, &down);
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr, up, true);
    NetPoint* gateway = zone->create_router("node" + name + "-gw");
    zone->add_route(gateway, nullptr, nullptr, nullptr, {}, true);
    zone->seal();
    return {zone->get_netpoint(), gateway};
}

void build_torus(const kv_net_config* cfg, std::vector<sg4::Host*>* slots)
{
    std::vector<unsigned long> dims;
    for (int d : cfg->torus_dims)
        if (d > 0)
            dims.push_back((unsigned long)d);
    double sw_gbps = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
    auto node = [cfg](const sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id) {
        return host_with_nic(cfg, zone, id);
    };
    sg4::NetZone* zone = sg4::create_torus_zone("kvsim", nullptr, dims, sg4::ClusterCallbacks(node),
                                                bytes_per_s(sw_gbps), cfg->switch_latency_s, link_policy(cfg));
    zone->seal();
    for (int i = 0; i < slot_count(cfg); i++)
        slots->push_back(sg4::Host::by_name("host" + std::to_string(i)));
}

void build_dragonfly(const kv_net_config* cfg, std::vector<sg4::Host*>* slots)
{
    double sw_gbps = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
    sg4::DragonflyParams params({(unsigned)cfg->dragonfly_groups, 1}, {(unsigned)cfg->dragonfly_chassis, 1},
                                {(unsigned)cfg->dragonfly_routers, 1}, (unsigned)cfg->dragonfly_nodes);
    sg4::NetZone* zone = sg4::create_dragonfly_zone("kvsim", nullptr, params, sg4::ClusterCallbacks(plain_host),
                                                    bytes_per_s(sw_gbps), cfg->switch_latency_s, link_policy(cfg));
    zone->seal();
    for (int i = 0; i < slot_count(cfg); i++)
        slots->push_back(sg4::Host::by_name("host" + std::to_string(i)));
    access_links_to_nics(cfg, *slots, (size_t)cfg->dragonfly_nodes);
}

bool by_name(const sg4::Host* a, const sg4::Host* b)
{
    return a->get_name() < b->get_name();
}

void build_from_file(const kv_net_config* cfg, sg4::Engine& engine, std::vector<sg4::Host*>* hosts)
{
    std::string file = cfg->platform_file;
    try {
        engine.load_platform(file);
    } catch (const std::exception& e) {
        std::string what = e.what();
        if (what.find(file) == std::string::npos && what.find(file.substr(file.rfind('/') + 1)) == std::string::npos)
            what = file + ": " + what;
        throw KeyError("network.platform_file", what);
    }
    /* SimGrid accepts these and dies later in the run (inf, 1e-300 B/s, NaN latencies...). */
    for (const sg4::Link* l : engine.get_all_links()) {
        if (l->get_name() == "__loopback__")
            continue;
        double bw = l->get_bandwidth(), lat = l->get_latency();
        const char* what = nullptr;
        if (!(bw >= kMinLinkBandwidth && bw <= kMaxLinkBandwidth))
            what = "bandwidth must be within 1 kbit/s (125 B/s) and 1e9 Gbit/s (1.25e17 B/s)";
        else if (!(lat >= 0 && lat <= kMaxLinkLatency))
            what = "latency must be within 0 and 1000 s";
        if (what == nullptr)
            continue;
        int line = kv_sg_platform_line(cfg->platform_file, l->get_cname());
        char msg[900];
        std::snprintf(msg, sizeof msg, "%s%s%s: link '%s': %s, got %g B/s and %g s",
                      cfg->platform_file, line > 0 ? ":" : "", line > 0 ? std::to_string(line).c_str() : "",
                      l->get_cname(), what, bw, lat);
        throw KeyError("network.platform_file", msg);
    }
    if (cfg->host_names) {
        for (int i = 0; i < cfg->hosts; i++) {
            sg4::Host* h = engine.host_by_name_or_null(cfg->host_names[i]);
            if (h == nullptr)
                throw KeyError("network.host_names",
                               std::string("no host '") + cfg->host_names[i] + "' in " + cfg->platform_file);
            hosts->push_back(h);
        }
        return;
    }
    std::vector<sg4::Host*> all = engine.get_all_hosts();
    std::sort(all.begin(), all.end(), by_name);
    if ((int)all.size() < cfg->hosts)
        throw std::invalid_argument(std::string(cfg->platform_file) + " has " + std::to_string(all.size()) +
                                    " hosts, the scenario needs " + std::to_string(cfg->hosts));
    hosts->assign(all.begin(), all.begin() + cfg->hosts);
}

void apply_options(const kv_net_config* cfg)
{
    /* kvsim's defaults (docs/network.md), then the scenario's, which win. */
    xbt_log_control_set("root.thres:critical");
    sg4::Engine::set_config("network/model:CM02");
    sg4::Engine::set_config("network/crosstraffic:0");
    if (cfg->priority != KV_PRIO_NONE)
        sg4::Engine::set_config("maxmin/precision:1e-10"); /* room for the classes (sg_child.cpp) */
    for (int i = 0; i < cfg->n_options; i++) {
        std::string key = cfg->option_key[i], value = cfg->option_value[i];
        if (key == "log")
            xbt_log_control_set(value.c_str());
        else
            sg4::Engine::set_config(key + ":" + value);
    }
}

} // namespace

int build_platform(const kv_net_config* cfg, sg4::Engine& engine, Platform* out, Error* err)
{
    try {
        apply_options(cfg);
    } catch (const std::exception& e) {
        std::string what = e.what();
        err->key = "network.simgrid"; /* an option of the network.simgrid mapping SimGrid refused */
        err->msg = what.substr(0, what.find('\n'));
        return KV_EINPUT;
    }
    try {
        std::vector<sg4::Host*> slots;
        switch (cfg->topology) {
        case KV_TOPO_STAR:
            build_star(cfg);
            for (int i = 0; i < cfg->hosts; i++)
                slots.push_back(sg4::Host::by_name("host" + std::to_string(i)));
            break;
        case KV_TOPO_FAT_TREE:
            build_fat_tree(cfg, &slots);
            break;
        case KV_TOPO_TORUS:
            build_torus(cfg, &slots);
            break;
        case KV_TOPO_DRAGONFLY:
            build_dragonfly(cfg, &slots);
            break;
        case KV_TOPO_PLATFORM:
            build_from_file(cfg, engine, &out->hosts);
            break;
        }
        if (cfg->topology != KV_TOPO_PLATFORM) {
            for (int i = 0; i < cfg->hosts; i++)
                out->hosts.push_back(slots[(size_t)(cfg->host_slot ? cfg->host_slot[i] : i)]);
        }
        /* Links in name order (stable across runs), without SimGrid's internal loopback. */
        for (sg4::Link* l : engine.get_all_links())
            if (l->get_name() != "__loopback__")
                out->links.push_back(l);
        std::sort(out->links.begin(), out->links.end(),
                  [](const sg4::Link* a, const sg4::Link* b) { return a->get_name() < b->get_name(); });
    } catch (const KeyError& e) {
        std::string what = e.what();
        err->key = e.key;
        err->msg = what.substr(0, what.find('\n'));
        return KV_EINPUT;
    } catch (const std::exception& e) {
        std::string what = e.what();
        err->msg = what.substr(0, what.find('\n'));
        return KV_EINPUT;
    }
    return KV_OK;
}

} // namespace kvsg
