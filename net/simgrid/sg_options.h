/* sg_options.h — the simgrid model's config checks (sg_options.c), used by sg_net.c before it forks. */
#ifndef KV_SG_OPTIONS_H
#define KV_SG_OPTIONS_H

#include <stddef.h>

#include "core/base/error.h"
#include "net/net.h"

/* KV_EINPUT naming cfg->source and the key (kv_error.key) for a config the simgrid model cannot run. */
int kv_sg_check_config(const kv_net_config *cfg, kv_error *err);
/* The value of SimGrid option `key` among cfg's options (the last one given), or NULL. */
const char *kv_sg_option_value(const kv_net_config *cfg, const char *key);
/* "file:line:col: network.simgrid.KEY" for option i, into buf; returns buf. */
const char *kv_sg_option_where(const kv_net_config *cfg, int i, char *buf, size_t size);

#endif
