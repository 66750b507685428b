/* net_topology.c — the names of the network topologies (kv_net_topology) and their parser. */
#include <string.h>

#include "net/net.h"

static const char *const topology_names[] = {"star", "fat-tree", "torus", "dragonfly", "platform"};

int kv_net_topology_parse(const char *s)
{
    for (size_t i = 0; i < sizeof topology_names / sizeof topology_names[0]; i++)
        if (strcmp(s, topology_names[i]) == 0)
            return (int)i;
    return -1;
}

const char *kv_net_topology_name(kv_net_topology t)
{
    if ((size_t)t < sizeof topology_names / sizeof topology_names[0])
        return topology_names[t];
    return "?";
}
