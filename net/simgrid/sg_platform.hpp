/* sg_platform.hpp — builds the SimGrid platform a kv_net_config describes (child side). */
#ifndef KV_SG_PLATFORM_HPP
#define KV_SG_PLATFORM_HPP

#include <simgrid/s4u.hpp>

#include <stdexcept>
#include <string>
#include <vector>

extern "C" {
#include "net/net.h"
}

namespace kvsg {

/* An error of the child for kvsim: the dotted scenario key it concerns ("network.platform_file",
   "" when none) and the message, which does not repeat the key. */
struct Error {
    std::string key;
    std::string msg;
};

/* Thrown while building a platform for an error that concerns one scenario key. */
struct KeyError : std::invalid_argument {
    std::string key;
    KeyError(const std::string& k, const std::string& msg) : std::invalid_argument(msg), key(k) {}
};

/* What the driver needs from a built platform. */
struct Platform {
    std::vector<simgrid::s4u::Host*> hosts; /* [cfg->hosts] kvsim host i -> SimGrid host */
    std::vector<simgrid::s4u::Link*> links; /* every link, the order of link_stats indices */
};

/* Applies kvsim's default SimGrid options, then the scenario's (cfg->option_*),
   then builds the topology into the engine. Returns KV_OK, or KV_EINPUT with the
   key and message in *err (SimGrid's exceptions are caught; the parent validated the
   plain numbers already, see sg_options.c). Must run before the engine runs. */
int build_platform(const kv_net_config* cfg, simgrid::s4u::Engine& engine, Platform* out, Error* err);

} // namespace kvsg

#endif
