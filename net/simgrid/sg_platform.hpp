/* sg_platform.hpp — builds the SimGrid platform a kv_net_config describes (child side). */
#ifndef KV_SG_PLATFORM_HPP
#define KV_SG_PLATFORM_HPP

#include <simgrid/s4u.hpp>

#include <string>
#include <vector>

extern "C" {
#include "net/net.h"
}

namespace kvsg {

/* What the driver needs from a built platform. */
struct Platform {
    std::vector<simgrid::s4u::Host*> hosts; /* [cfg->hosts] kvsim host i -> SimGrid host */
    std::vector<simgrid::s4u::Link*> links; /* every link, the order of link_stats indices */
};

/* Applies kvsim's default SimGrid options, then the scenario's (cfg->option_*),
   then builds the topology into the engine. Returns KV_OK, or KV_EINPUT with a
   message in *msg (SimGrid's exceptions are caught; the parent validated the
   plain numbers already, see sg_net.c). Must run before the engine runs. */
int build_platform(const kv_net_config* cfg, simgrid::s4u::Engine& engine, Platform* out, std::string* msg);

} // namespace kvsg

#endif
