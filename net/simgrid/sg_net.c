/* sg_net.c — the simgrid network model, kvsim side: checks the config, forks the SimGrid child, talks to it.
 *
 * Design notes (docs/network.md has the user's view).
 * - SimGrid 3.32 cannot give a second, fresh engine in one process, and it aborts
 *   on some bad input. Each network therefore runs SimGrid in its own forked child
 *   (sg_child.cpp): creating a network forks, destroying it kills the child. A
 *   crash or abort in SimGrid ends the child, never kvsim; the parent reports it
 *   with SimGrid's last words, which the child writes to a temporary file.
 * - Requests go over a socket (sg_proto.h). Flow ids are assigned here, so a START
 *   needs no answer and is buffered until the next request that needs one; a
 *   run costs about one round trip per ADVANCE.
 * - Completions come back in batches (all flows completing at one date, in start
 *   order) and are handed to the callback one by one. The callback may start
 *   flows (they start at that date: the child has not moved) or cancel flows,
 *   including ones of the same batch not yet handed over (they are then dropped
 *   here, never reported: net.h invariant 3).
 * - A flow started later than the network's time waits in a heap here; advance
 *   stops the child at its start time, starts it there, and goes on.
 * - After any failure of the child the network is broken: every later call
 *   returns the same error.
 */
#define _GNU_SOURCE /* close_range, prctl */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "net/net.h"
#include "net/simgrid/sg_proto.h"

#define SG_MAX_SLOTS 1000000 /* topology positions we agree to build */
#define SG_MAX_WEIGHT_RATIO 1e6

typedef struct sg_net {
    kv_net_done_fn done;
    void *user;
    int hosts;
    pid_t pid;             /* the child, 0 once reaped */
    int fd;                /* socket to the child */
    FILE *errlog;          /* the child's stderr (NULL when the scenario asked for SimGrid logs) */
    double now_s;          /* network time, as the child last reported it */
    uint64_t next_id;
    size_t active;         /* started, not yet reported or cancelled */
    kv_sg_request *out;    /* buffered START requests */
    size_t n_out, cap_out;
    kv_sg_request *later;  /* min-heap on (t_s, id): flows that start after now_s */
    size_t n_later, cap_later;
    kv_sg_done *batch;     /* completions being handed over */
    size_t n_batch, cap_batch, i_batch;
    int delivering;        /* inside the completion callbacks */
    kv_link_stats *links;  /* cached answer of STATS */
    size_t n_links;
    int links_fresh;
    int broken;            /* the child failed; `failure` says why */
    kv_error failure;
} sg_net;

/* ---- input checks, before anything is forked ---- */

static const char *const sg_models[] = {"CM02", "LV08", "SMPI", "IB", "Constant"};

static const char *option_value(const kv_net_config *cfg, const char *key)
{
    const char *v = NULL;
    for (int i = 0; i < cfg->n_options; i++)
        if (cfg->option_key[i] && strcmp(cfg->option_key[i], key) == 0)
            v = cfg->option_value[i];
    return v;
}

static int bad(kv_error *err, const char *src, const char *fmt, const char *key, const char *detail)
{
    return kv_error_set(err, KV_EINPUT, "%s: network.%s: %s%s", src, key, fmt, detail ? detail : "");
}

/* Number of host positions the topology offers, or -1 with *err set. */
static long topology_slots(const kv_net_config *cfg, const char *src, kv_error *err)
{
    char detail[160];
    switch (cfg->topology) {
    case KV_TOPO_STAR:
        return cfg->hosts;
    case KV_TOPO_FAT_TREE: {
        if (cfg->hosts_per_leaf < 1)
            return bad(err, src, "must be >= 1 for a fat-tree", "hosts_per_leaf", NULL), -1;
        if (cfg->fat_tree_leaves < 0)
            return bad(err, src, "must be >= 0 (0: as many as the hosts need)", "fat_tree_leaves", NULL), -1;
        long leaves = cfg->fat_tree_leaves > 0 ? cfg->fat_tree_leaves
                                               : (cfg->hosts + cfg->hosts_per_leaf - 1) / cfg->hosts_per_leaf;
        double sw = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
        if (cfg->fat_tree_spines < 0)
            return bad(err, src, "must be >= 0 (0: from oversubscription)", "fat_tree_spines", NULL), -1;
        double ideal = cfg->hosts_per_leaf * cfg->nic_bandwidth_gbps / sw; /* spines for 1:1 */
        if (cfg->fat_tree_spines > 0) {
            if (cfg->oversubscription > 0 &&
                fabs(ideal / cfg->fat_tree_spines - cfg->oversubscription) > 1e-9 * cfg->oversubscription) {
                snprintf(detail, sizeof detail,
                         " (%d spines of %g Gb/s under %d hosts of %g Gb/s give %g:1, not %g:1)",
                         cfg->fat_tree_spines, sw, cfg->hosts_per_leaf, cfg->nic_bandwidth_gbps,
                         ideal / cfg->fat_tree_spines, cfg->oversubscription);
                return bad(err, src, "disagrees with fat_tree_spines", "oversubscription", detail), -1;
            }
        } else {
            double over = cfg->oversubscription > 0 ? cfg->oversubscription : 1.0;
            double spines = ideal / over;
            if (spines < 1 - 1e-9 || fabs(spines - floor(spines + 0.5)) > 1e-9 * spines) {
                snprintf(detail, sizeof detail,
                         " (%d hosts x %g Gb/s / (%g x %g Gb/s uplinks) = %g spines; set fat_tree_spines)",
                         cfg->hosts_per_leaf, cfg->nic_bandwidth_gbps, over, sw, spines);
                return bad(err, src, "does not give a whole number of spine switches", "oversubscription",
                           detail), -1;
            }
        }
        if (leaves * cfg->hosts_per_leaf < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld leaves x %d hosts < %d hosts)", leaves, cfg->hosts_per_leaf,
                     cfg->hosts);
            return bad(err, src, "the fat-tree is too small for the hosts", "fat_tree_leaves", detail), -1;
        }
        if (leaves > SG_MAX_SLOTS / cfg->hosts_per_leaf)
            return bad(err, src, "more than 1,000,000 host positions", "fat_tree_leaves", NULL), -1;
        return leaves * cfg->hosts_per_leaf;
    }
    case KV_TOPO_TORUS: {
        long n = 1;
        int used = 0;
        for (int i = 0; i < 3; i++) {
            if (cfg->torus_dims[i] < 0)
                return bad(err, src, "dimensions must be >= 0 (0: unused)", "torus_dims", NULL), -1;
            if (cfg->torus_dims[i] > 0) {
                used++;
                if (n > SG_MAX_SLOTS / cfg->torus_dims[i])
                    return bad(err, src, "more than 1,000,000 host positions", "torus_dims", NULL), -1;
                n *= cfg->torus_dims[i];
            }
        }
        if (used == 0)
            return bad(err, src, "a torus needs at least one dimension > 0", "torus_dims", NULL), -1;
        if (n < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld positions < %d hosts)", n, cfg->hosts);
            return bad(err, src, "the torus is too small for the hosts", "torus_dims", detail), -1;
        }
        return n;
    }
    case KV_TOPO_DRAGONFLY: {
        const int v[4] = {cfg->dragonfly_groups, cfg->dragonfly_chassis, cfg->dragonfly_routers,
                          cfg->dragonfly_nodes};
        const char *k[4] = {"dragonfly_groups", "dragonfly_chassis", "dragonfly_routers", "dragonfly_nodes"};
        long n = 1;
        for (int i = 0; i < 4; i++) {
            if (v[i] < 1)
                return bad(err, src, "must be >= 1 for a dragonfly", k[i], NULL), -1;
            if (n > SG_MAX_SLOTS / v[i])
                return bad(err, src, "more than 1,000,000 host positions", k[i], NULL), -1;
            n *= v[i];
        }
        if (cfg->dragonfly_groups > cfg->dragonfly_routers)
            return bad(err, src, "must be <= dragonfly_routers (SimGrid links group g to router g of each group)",
                       "dragonfly_groups", NULL), -1;
        if (n < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld positions < %d hosts)", n, cfg->hosts);
            return bad(err, src, "the dragonfly is too small for the hosts", "dragonfly_nodes", detail), -1;
        }
        return n;
    }
    case KV_TOPO_PLATFORM: {
        if (!cfg->platform_file || !cfg->platform_file[0])
            return bad(err, src, "a platform topology needs a SimGrid XML file", "platform_file", NULL), -1;
        FILE *f = fopen(cfg->platform_file, "r");
        if (!f) {
            snprintf(detail, sizeof detail, "'%s': %s", cfg->platform_file, strerror(errno));
            return bad(err, src, "cannot read ", "platform_file", detail), -1;
        }
        fclose(f);
        return cfg->hosts;
    }
    }
    char n[32];
    snprintf(n, sizeof n, "%d", (int)cfg->topology);
    return bad(err, src, "unknown topology ", "topology", n), -1;
}

static int check_options(const kv_net_config *cfg, const char *src, kv_error *err)
{
    if (cfg->n_options < 0 || cfg->n_options > KV_NET_MAX_OPTIONS)
        return kv_error_set(err, KV_EINPUT, "%s: network.options: at most %d options", src, KV_NET_MAX_OPTIONS);
    for (int i = 0; i < cfg->n_options; i++)
        if (!cfg->option_key[i] || !cfg->option_key[i][0] || !cfg->option_value[i])
            return kv_error_set(err, KV_EINPUT, "%s: network.options: option %d has no name or value", src, i);
    const char *model = option_value(cfg, "network/model");
    if (model) {
        size_t i = 0;
        while (i < sizeof sg_models / sizeof sg_models[0] && strcmp(model, sg_models[i]) != 0)
            i++;
        if (i == sizeof sg_models / sizeof sg_models[0])
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.options: network/model: unknown model '%s' (CM02, LV08, SMPI, IB, "
                                "Constant)", src, model);
    }
    const char *gamma = option_value(cfg, "network/TCP-gamma");
    if (gamma) {
        char *end;
        double g = strtod(gamma, &end);
        if (end == gamma || *end || !(g > 0) || !isfinite(g))
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.options: network/TCP-gamma: must be a positive number of bytes, got '%s'",
                                src, gamma);
    }
    if (cfg->priority != KV_PRIO_NONE) {
        if (model && (strcmp(model, "IB") == 0 || strcmp(model, "Constant") == 0))
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.priority: priority classes need network/model CM02, LV08 or SMPI, "
                                "not %s", src, model);
        const char *optim = option_value(cfg, "network/optim");
        if (optim && strcmp(optim, "Lazy") != 0)
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.priority: priority classes need network/optim:Lazy, not %s", src, optim);
        const char *solver = option_value(cfg, "network/solver");
        if (solver && strcmp(solver, "maxmin") != 0)
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.priority: priority classes need network/solver:maxmin, not %s", src,
                                solver);
    }
    return KV_OK;
}

static int check_config(const kv_net_config *cfg, kv_error *err)
{
    const char *src = cfg->source ? cfg->source : "network";
    if (cfg->hosts < 2)
        return kv_error_set(err, KV_EINPUT, "%s: network: needs at least 2 hosts, got %d", src, cfg->hosts);
    if (!(cfg->nic_bandwidth_gbps > 0) || !isfinite(cfg->nic_bandwidth_gbps))
        return kv_error_set(err, KV_EINPUT, "%s: network.nic_bandwidth_gbps: must be a positive number", src);
    if (!(cfg->nic_latency_s >= 0) || !isfinite(cfg->nic_latency_s))
        return kv_error_set(err, KV_EINPUT, "%s: network.nic_latency_us: must be >= 0", src);
    if (!(cfg->switch_bandwidth_gbps >= 0) || !isfinite(cfg->switch_bandwidth_gbps))
        return kv_error_set(err, KV_EINPUT,
                            "%s: network.switch_bandwidth_gbps: must be a positive number (0: as fast as the NICs)",
                            src);
    if (!(cfg->switch_latency_s >= 0) || !isfinite(cfg->switch_latency_s))
        return kv_error_set(err, KV_EINPUT, "%s: network.switch_latency_us: must be >= 0", src);
    if (!(cfg->oversubscription >= 0) || !isfinite(cfg->oversubscription))
        return kv_error_set(err, KV_EINPUT, "%s: network.oversubscription: must be a positive ratio (0: 1:1)", src);
    long slots = topology_slots(cfg, src, err);
    if (slots < 0)
        return KV_EINPUT;
    if (cfg->host_slot && cfg->topology != KV_TOPO_PLATFORM) {
        unsigned char *seen = kv_calloc((size_t)slots, 1);
        for (int i = 0; i < cfg->hosts; i++) {
            int s = cfg->host_slot[i];
            if (s < 0 || s >= slots || seen[s]) {
                kv_free(seen);
                return kv_error_set(err, KV_EINPUT,
                                    "%s: network.host_slot[%d]: %d is %s (the topology has %ld positions)", src, i,
                                    s, s < 0 || s >= slots ? "out of range" : "taken twice", slots);
            }
            seen[s] = 1;
        }
        kv_free(seen);
    }
    if (cfg->host_names && cfg->topology == KV_TOPO_PLATFORM) {
        for (int i = 0; i < cfg->hosts; i++) {
            if (!cfg->host_names[i] || !cfg->host_names[i][0])
                return kv_error_set(err, KV_EINPUT, "%s: network.host_names[%d]: empty", src, i);
            for (int j = 0; j < i; j++)
                if (strcmp(cfg->host_names[i], cfg->host_names[j]) == 0)
                    return kv_error_set(err, KV_EINPUT, "%s: network.host_names[%d]: '%s' is taken twice", src, i,
                                        cfg->host_names[i]);
        }
    }
    if (cfg->priority < KV_PRIO_NONE || cfg->priority > KV_PRIO_WEIGHTED)
        return kv_error_set(err, KV_EINPUT, "%s: network.priority: unknown mode %d (none, strict, weighted)", src,
                            (int)cfg->priority);
    if (cfg->priority == KV_PRIO_WEIGHTED) {
        double lo = INFINITY, hi = 0;
        for (int c = 0; c < KV_NET_MAX_CLASSES; c++) {
            double w = cfg->class_weight[c];
            if (!(w >= 0) || !isfinite(w))
                return kv_error_set(err, KV_EINPUT, "%s: network.class_weights[%d]: must be > 0 (0: 1)", src, c);
            w = w > 0 ? w : 1.0;
            lo = w < lo ? w : lo;
            hi = w > hi ? w : hi;
        }
        if (hi / lo > SG_MAX_WEIGHT_RATIO)
            return kv_error_set(err, KV_EINPUT,
                                "%s: network.class_weights: largest / smallest must be <= 1e6 (SimGrid's solver "
                                "precision), got %g", src, hi / lo);
    }
    return check_options(cfg, src, err);
}

/* ---- talking to the child ---- */

static int write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The last non-empty line SimGrid wrote, without its "[time] file:line: [category]" prefix. */
static void last_words(FILE *log, char *out, size_t cap)
{
    out[0] = 0;
    if (!log || fflush(log) != 0)
        return;
    char buf[2048];
    long size = (fseek(log, 0, SEEK_END) == 0) ? ftell(log) : -1;
    if (size <= 0)
        return;
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    if (fseek(log, from, SEEK_SET) != 0)
        return;
    size_t n = fread(buf, 1, sizeof buf - 1, log);
    buf[n] = 0;
    /* Prefer the last CRITICAL line (xbt_die's message), else the last line. */
    char *pick = NULL, *line = buf;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (*line && (!pick || strstr(line, "CRITICAL") || !strstr(pick, "CRITICAL")))
            pick = line;
        line = nl ? nl + 1 : NULL;
    }
    if (!pick)
        return;
    /* "[0.000000] ./src/file.cpp:179: [root/CRITICAL] Model 'FOO' is invalid!" -> the message. */
    const char *msg = pick, *cat = strstr(pick, "/CRITICAL] ");
    if (cat)
        msg = cat + strlen("/CRITICAL] ");
    snprintf(out, cap, "%s", msg);
}

/* Reaps the child after it failed and records why; returns the error code. */
static int child_failed(sg_net *net, int code, const char *when, kv_error *err)
{
    char words[700];
    last_words(net->errlog, words, sizeof words);
    char how[64] = "closed its connection";
    if (net->pid > 0) {
        kill(net->pid, SIGKILL);
        int status = 0;
        while (waitpid(net->pid, &status, 0) < 0 && errno == EINTR)
            continue;
        if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)
            snprintf(how, sizeof how, "died of signal %d%s", WTERMSIG(status),
                     WTERMSIG(status) == SIGABRT ? " (abort)" : "");
        net->pid = 0;
    }
    kv_error_set(&net->failure, code, "net simgrid: SimGrid %s %s%s%s", how, when, words[0] ? ": " : "", words);
    net->broken = 1;
    if (err)
        *err = net->failure;
    return code;
}

static int flush_out(sg_net *net, kv_error *err)
{
    if (net->n_out == 0)
        return KV_OK;
    size_t n = net->n_out;
    net->n_out = 0;
    if (write_full(net->fd, net->out, n * sizeof *net->out) != 0)
        return child_failed(net, KV_EFAIL, "while starting flows", err);
    return KV_OK;
}

/* Sends rq (after the buffered STARTs) and reads the answer's head; items and
   message stay to be read by the caller. */
static int request(sg_net *net, const kv_sg_request *rq, kv_sg_reply *head, kv_error *err)
{
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    int rc = flush_out(net, err);
    if (rc != KV_OK)
        return rc;
    if (write_full(net->fd, rq, sizeof *rq) != 0 || read_full(net->fd, head, sizeof *head) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    return KV_OK;
}

/* Reads the message of an answer; a failed answer breaks the network. */
static int finish_reply(sg_net *net, const kv_sg_reply *head, kv_error *err)
{
    if (head->msg_len == 0 && head->code == KV_OK)
        return KV_OK;
    char msg[1000];
    size_t keep = head->msg_len < sizeof msg - 1 ? head->msg_len : sizeof msg - 1;
    if (read_full(net->fd, msg, keep) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    msg[keep] = 0;
    for (size_t left = head->msg_len - keep; left > 0;) {
        char skip[256];
        size_t n = left < sizeof skip ? left : sizeof skip;
        if (read_full(net->fd, skip, n) != 0)
            return child_failed(net, KV_EFAIL, "during the run", err);
        left -= n;
    }
    if (head->code == KV_OK)
        return KV_OK;
    kv_error_set(&net->failure, head->code, "%s", msg);
    net->broken = 1;
    *err = net->failure;
    return head->code;
}

/* ---- flows that start in the future ---- */

static int later_before(const kv_sg_request *a, const kv_sg_request *b)
{
    return a->t_s != b->t_s ? a->t_s < b->t_s : a->id < b->id;
}

static void later_push(sg_net *net, kv_sg_request rq)
{
    kv_grow((void **)&net->later, sizeof *net->later, &net->cap_later, net->n_later + 1);
    size_t i = net->n_later++;
    while (i > 0 && later_before(&rq, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    net->later[i] = rq;
}

static void later_remove(sg_net *net, size_t i)
{
    kv_sg_request last = net->later[--net->n_later];
    if (i == net->n_later)
        return;
    while (i > 0 && later_before(&last, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const kv_sg_request *best = &last;
        if (l < net->n_later && later_before(&net->later[l], best))
            best = &net->later[m = l];
        if (r < net->n_later && later_before(&net->later[r], best))
            m = r;
        if (m == i)
            break;
        net->later[i] = net->later[m];
        i = m;
    }
    net->later[i] = last;
}

/* ---- the interface ---- */

static int sg_flow_start(void *ctx, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (flow->src < 0 || flow->src >= net->hosts || flow->dst < 0 || flow->dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net simgrid: host out of range (%d -> %d, %d hosts)", flow->src,
                            flow->dst, net->hosts);
    if (!isfinite(now_s))
        return kv_error_set(err, KV_EFAIL, "net simgrid: flow start time %g", now_s);
    kv_sg_request rq = {.op = KV_SG_START, .src = flow->src, .dst = flow->dst, .priority = flow->priority,
                        .id = net->next_id, .bytes = flow->bytes, .tag = flow->tag,
                        .t_s = now_s > net->now_s ? now_s : net->now_s};
    if (rq.t_s > net->now_s) {
        later_push(net, rq); /* started by sg_advance when the network gets there */
    } else {
        kv_grow((void **)&net->out, sizeof *net->out, &net->cap_out, net->n_out + 1);
        net->out[net->n_out++] = rq;
        if (net->n_out >= 256) {
            int rc = flush_out(net, err);
            if (rc != KV_OK)
                return rc;
        }
    }
    net->links_fresh = 0;
    net->active++;
    *out = net->next_id++;
    return KV_OK;
}

static int sg_flow_cancel(void *ctx, kv_flow_id id, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    /* A flow of the batch being handed over is done in the child: drop it here. */
    for (size_t i = net->i_batch + 1; net->delivering && i < net->n_batch; i++) {
        if (net->batch[i].id == id) {
            net->batch[i].id = 0;
            net->active--;
            return KV_OK;
        }
    }
    if (id == 0 || id >= net->next_id)
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    for (size_t i = 0; i < net->n_later; i++) {
        if (net->later[i].id == id) {
            later_remove(net, i);
            net->active--;
            return KV_OK;
        }
    }
    kv_sg_request rq = {.op = KV_SG_CANCEL, .id = id};
    kv_sg_reply head;
    int rc = request(net, &rq, &head, err);
    if (rc != KV_OK)
        return rc;
    rc = finish_reply(net, &head, err);
    if (rc != KV_OK)
        return rc;
    if (head.count == 1) /* not active: already reported or cancelled, the caller's error */
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    net->links_fresh = 0;
    net->active--;
    return KV_OK;
}

/* One ADVANCE round trip to t_s; the completions it finds are left in net->batch. */
static int advance_once(sg_net *net, double t_s, kv_sg_reply *head, kv_error *err)
{
    kv_sg_request rq = {.op = KV_SG_ADVANCE, .t_s = t_s};
    int rc = request(net, &rq, head, err);
    if (rc != KV_OK)
        return rc;
    kv_grow((void **)&net->batch, sizeof *net->batch, &net->cap_batch, head->count + 1);
    if (head->count && read_full(net->fd, net->batch, head->count * sizeof *net->batch) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    rc = finish_reply(net, head, err);
    if (rc != KV_OK)
        return rc;
    net->links_fresh = 0;
    net->now_s = head->t_now_s;
    net->n_batch = head->count;
    return KV_OK;
}

static int sg_advance(void *ctx, double t_limit_s, double *t_now_s, kv_error *err)
{
    sg_net *net = ctx;
    if (net->delivering)
        return kv_error_set(err, KV_EFAIL, "net simgrid: kv_net_advance called from a completion callback");
    if (t_limit_s != t_limit_s)
        return kv_error_set(err, KV_EFAIL, "net simgrid: advance to NaN");
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (net->active == 0) {
        /* Nothing in flight or scheduled: no need to ask. The child catches up with
           the next START, which carries this time. */
        if (t_limit_s > net->now_s && isfinite(t_limit_s))
            net->now_s = t_limit_s;
        *t_now_s = net->now_s;
        return KV_OK;
    }
    kv_sg_reply head;
    for (;;) {
        /* Stop first where scheduled flows start, and start them there. */
        int start_due = net->n_later > 0 && net->later[0].t_s <= t_limit_s;
        int rc = advance_once(net, start_due ? net->later[0].t_s : t_limit_s, &head, err);
        if (rc != KV_OK)
            return rc;
        if (head.count > 0 || !start_due)
            break;
        while (net->n_later > 0 && net->later[0].t_s <= net->now_s) {
            kv_grow((void **)&net->out, sizeof *net->out, &net->cap_out, net->n_out + 1);
            net->out[net->n_out] = net->later[0];
            net->out[net->n_out++].t_s = net->now_s;
            later_remove(net, 0);
        }
    }
    net->delivering = 1;
    for (net->i_batch = 0; net->i_batch < net->n_batch; net->i_batch++) {
        kv_sg_done d = net->batch[net->i_batch];
        if (d.id == 0)
            continue; /* cancelled by an earlier callback of this batch */
        net->active--;
        net->done(net->user, d.id, d.tag, d.t_done_s);
    }
    net->delivering = 0;
    net->n_batch = 0;
    *t_now_s = net->now_s;
    return KV_OK;
}

static size_t sg_active_flows(void *ctx)
{
    return ((sg_net *)ctx)->active;
}

static size_t sg_link_count(void *ctx)
{
    return ((sg_net *)ctx)->n_links;
}

static int sg_link_stats(void *ctx, size_t link, kv_link_stats *out)
{
    sg_net *net = ctx;
    if (link >= net->n_links)
        return KV_EFAIL;
    if (!net->links_fresh) {
        kv_error err;
        kv_sg_request rq = {.op = KV_SG_STATS};
        kv_sg_reply head;
        if (request(net, &rq, &head, &err) != KV_OK)
            return KV_EFAIL;
        if (head.code != KV_OK) {
            finish_reply(net, &head, &err);
            return KV_EFAIL;
        }
        if (head.count != net->n_links ||
            read_full(net->fd, net->links, net->n_links * sizeof *net->links) != 0) {
            child_failed(net, KV_EFAIL, "during the run", &err);
            return KV_EFAIL;
        }
        if (finish_reply(net, &head, &err) != KV_OK)
            return KV_EFAIL;
        net->links_fresh = 1;
    }
    *out = net->links[link];
    return KV_OK;
}

static void sg_destroy(void *ctx)
{
    sg_net *net = ctx;
    if (!net)
        return;
    if (net->fd >= 0)
        close(net->fd);
    if (net->pid > 0) {
        /* The child keeps nothing worth flushing: stop it now rather than let it
           simulate the flows still in flight. */
        kill(net->pid, SIGKILL);
        while (waitpid(net->pid, NULL, 0) < 0 && errno == EINTR)
            continue;
    }
    if (net->errlog)
        fclose(net->errlog);
    kv_free(net->out);
    kv_free(net->later);
    kv_free(net->batch);
    kv_free(net->links);
    kv_free(net);
}

static const kv_net_i sg_iface = {
    .api_version = KV_NET_API_VERSION,
    .name = "simgrid",
    .destroy = sg_destroy,
    .flow_start = sg_flow_start,
    .flow_cancel = sg_flow_cancel,
    .advance = sg_advance,
    .active_flows = sg_active_flows,
    .link_count = sg_link_count,
    .link_stats = sg_link_stats,
};

/* In the child: closes every descriptor it inherited except 0-2 and `keep`. */
static void close_inherited(int keep)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        for (int fd = 3; fd < 1024; fd++)
            if (fd != keep)
                close(fd);
        return;
    }
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (fd > 2 && fd != keep && fd != self)
            close(fd);
    }
    closedir(d);
}

int kv_net_simgrid_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                          const kv_net_i **iface, void **ctx, kv_error *err)
{
    int rc = check_config(cfg, err);
    if (rc != KV_OK)
        return rc;
    const char *src = cfg->source ? cfg->source : "network";
    sg_net *net = kv_calloc(1, sizeof *net);
    net->done = done;
    net->user = user;
    net->hosts = cfg->hosts;
    net->next_id = 1;
    net->fd = -1;
    /* SimGrid's own messages go to a temporary file, read back when it fails;
       a scenario that sets the `log` option sees them on stderr instead. */
    if (!option_value(cfg, "log"))
        net->errlog = tmpfile();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: socketpair: %s", strerror(errno));
        sg_destroy(net);
        return rc;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        sg_destroy(net);
        return rc;
    }
    if (pid == 0) {
        /* The child: dies with kvsim, talks only on sv[1], writes only to the log. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct rlimit no_core = {0, 0}; /* a SimGrid abort must not leave core files behind */
        setrlimit(RLIMIT_CORE, &no_core);
        if (net->errlog)
            dup2(fileno(net->errlog), STDERR_FILENO);
        dup2(STDERR_FILENO, STDOUT_FILENO);
        close_inherited(sv[1]);
        kv_sg_child_main(cfg, sv[1]);
        _exit(0);
    }
    close(sv[1]);
    net->pid = pid;
    net->fd = sv[0];
    kv_sg_reply ready;
    if (read_full(net->fd, &ready, sizeof ready) != 0) {
        char when[600];
        if (cfg->topology == KV_TOPO_PLATFORM)
            snprintf(when, sizeof when, "while loading %s for %s", cfg->platform_file, src);
        else
            snprintf(when, sizeof when, "while building the %s network of %s", kv_net_topology_name(cfg->topology),
                     src);
        rc = child_failed(net, KV_EINPUT, when, err);
        sg_destroy(net);
        return rc;
    }
    if (ready.code != KV_OK) {
        char msg[900];
        size_t keep = ready.msg_len < sizeof msg - 1 ? ready.msg_len : sizeof msg - 1;
        if (read_full(net->fd, msg, keep) != 0)
            keep = 0;
        msg[keep] = 0;
        rc = kv_error_set(err, ready.code, "%s: %s%s", src, strncmp(msg, "network.", 8) == 0 ? "" : "network: ",
                          msg);
        sg_destroy(net);
        return rc;
    }
    net->n_links = ready.count;
    net->links = kv_calloc(net->n_links + 1, sizeof *net->links);
    *iface = &sg_iface;
    *ctx = net;
    return KV_OK;
}
