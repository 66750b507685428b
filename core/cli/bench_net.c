/* bench_net.c — `kvsim bench net`: how fast the network models simulate many concurrent KV transfers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cli/commands.h"
#include "core/base/rng.h"
#include "net/net.h"

typedef struct bench_opts {
    int flows;          /* KV transfers in all */
    int inflight;       /* at most this many at once */
    kv_net_config cfg;
    uint64_t seed;
    int ideal;          /* also run the ideal model, for the ratio */
    const char *model;  /* network/model option, NULL: kvsim's default */
    const char *prio;
} bench_opts;

/* The closed loop: every completion starts the next transfer until `flows` have started. */
typedef struct bench_run {
    kv_net *net;
    kv_rng rng;
    const bench_opts *o;
    int started, done;
    double sum_transfer_s;   /* sum of completion - start */
    double *start_s;         /* [flows] start time of each tag */
    int failed;
    kv_error err;
} bench_run;

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One KV cache: 1k..8k tokens of a Llama-3-8B-like model in BF16 (128 KiB per token),
   from a prefill host (first half) to a decode host (second half). */
static void start_one(bench_run *b, double now_s)
{
    int half = b->o->cfg.hosts / 2;
    kv_flow_spec f = {
        .src = (int)kv_rng_below(&b->rng, (uint64_t)half),
        .dst = half + (int)kv_rng_below(&b->rng, (uint64_t)(b->o->cfg.hosts - half)),
        .bytes = (1024 + kv_rng_below(&b->rng, 7 * 1024 + 1)) * 131072u,
        .priority = (int)kv_rng_below(&b->rng, 2),
        .tag = (uint64_t)b->started,
    };
    kv_flow_id id;
    b->start_s[b->started] = now_s;
    if (kv_net_flow_start(b->net, &f, now_s, &id, &b->err) != KV_OK)
        b->failed = 1;
    b->started++;
}

static void on_done(void *user, kv_flow_id id, uint64_t tag, double t_done_s)
{
    (void)id;
    bench_run *b = user;
    b->done++;
    b->sum_transfer_s += t_done_s - b->start_s[tag];
    if (!b->failed && b->started < b->o->flows)
        start_one(b, t_done_s);
}

typedef struct bench_result {
    double wall_s, sim_s, mean_transfer_s;
    size_t links;
    double busiest_util;     /* busy time / simulated time of the busiest link */
} bench_result;

static int run_model(const bench_opts *o, kv_net_model model, bench_result *res, kv_error *err)
{
    bench_run b = {.o = o};
    kv_rng_seed(&b.rng, o->seed);
    b.start_s = calloc((size_t)o->flows, sizeof *b.start_s);
    if (!b.start_s)
        return kv_error_set(err, KV_EFAIL, "bench net: out of memory");
    kv_net_config cfg = o->cfg;
    cfg.model = model;
    double t0 = wall_s();
    int rc = kv_net_create(&cfg, on_done, &b, &b.net, err);
    if (rc != KV_OK) {
        free(b.start_s);
        return rc;
    }
    b.net = b.net;
    while (b.started < o->inflight && b.started < o->flows && !b.failed)
        start_one(&b, 0.0);
    double t = 0;
    while (!b.failed && b.done < b.started) {
        rc = kv_net_advance(b.net, INFINITY, &t, err);
        if (rc != KV_OK)
            break;
    }
    if (b.failed) {
        *err = b.err;
        rc = b.err.code;
    }
    res->wall_s = wall_s() - t0;
    res->sim_s = t;
    res->mean_transfer_s = b.done ? b.sum_transfer_s / b.done : 0;
    res->links = kv_net_link_count(b.net);
    res->busiest_util = 0;
    for (size_t i = 0; rc == KV_OK && i < res->links; i++) {
        kv_link_stats s;
        if (kv_net_link_stats(b.net, i, &s) == KV_OK && t > 0 && s.busy_s / t > res->busiest_util)
            res->busiest_util = s.busy_s / t;
    }
    kv_net_destroy(b.net);
    free(b.start_s);
    return rc;
}

static int parse_int(const char *flag, const char *v, int lo, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || end == v || x < lo || x > 100000000) {
        fprintf(stderr, "kvsim bench net: %s needs a whole number >= %d\n", flag, lo);
        return 2;
    }
    *out = (int)x;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvsim bench net [--flows N] [--inflight N] [--hosts N] [--topology T] [--hosts-per-leaf N]\n"
            "                       [--platform FILE] [--model CM02|LV08] [--priority none|strict|weighted]\n"
            "                       [--gbps X] [--seed N] [--no-ideal]\n"
            "Defaults: 10000 KV transfers (1k-8k tokens x 128 KiB) on a 1024-host fat-tree (32 hosts per leaf,\n"
            "100 Gb/s NICs, 2 us), at most 1000 in flight, prefill hosts -> decode hosts.\n");
}

int kv_cmd_bench_net(int argc, char **argv)
{
    bench_opts o = {.flows = 10000, .inflight = 1000, .seed = 1, .ideal = 1, .prio = "none"};
    kv_net_config *c = &o.cfg;
    c->topology = KV_TOPO_FAT_TREE;
    c->hosts = 1024;
    c->hosts_per_leaf = 32;
    c->nic_bandwidth_gbps = 100;
    c->nic_latency_s = 2e-6;
    c->split_duplex = 1;
    c->source = "bench net";
    int seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-ideal") == 0) {
            o.ideal = 0;
            continue;
        } else if (!v) {
            fprintf(stderr, "kvsim bench net: unknown option '%s' or missing value\n", a);
            usage(stderr);
            return 2;
        } else if (strcmp(a, "--flows") == 0) {
            rc = parse_int(a, v, 1, &o.flows);
        } else if (strcmp(a, "--inflight") == 0) {
            rc = parse_int(a, v, 1, &o.inflight);
        } else if (strcmp(a, "--hosts") == 0) {
            rc = parse_int(a, v, 2, &c->hosts);
        } else if (strcmp(a, "--hosts-per-leaf") == 0) {
            rc = parse_int(a, v, 1, &c->hosts_per_leaf);
        } else if (strcmp(a, "--seed") == 0) {
            rc = parse_int(a, v, 0, &seed);
        } else if (strcmp(a, "--topology") == 0) {
            int t = kv_net_topology_parse(v);
            if (t < 0) {
                fprintf(stderr, "kvsim bench net: --topology: unknown topology '%s' (star, fat-tree, torus, "
                                "dragonfly, platform)\n", v);
                return 2;
            }
            c->topology = (kv_net_topology)t;
        } else if (strcmp(a, "--platform") == 0) {
            c->topology = KV_TOPO_PLATFORM;
            c->platform_file = v;
        } else if (strcmp(a, "--model") == 0) {
            o.model = v;
        } else if (strcmp(a, "--priority") == 0) {
            o.prio = v;
            c->priority = strcmp(v, "strict") == 0 ? KV_PRIO_STRICT
                          : strcmp(v, "weighted") == 0 ? KV_PRIO_WEIGHTED : KV_PRIO_NONE;
            if (c->priority == KV_PRIO_NONE && strcmp(v, "none") != 0) {
                fprintf(stderr, "kvsim bench net: --priority: none, strict or weighted, not '%s'\n", v);
                return 2;
            }
            c->class_weight[0] = 3;
            c->class_weight[1] = 1;
        } else if (strcmp(a, "--gbps") == 0) {
            char *end;
            c->nic_bandwidth_gbps = strtod(v, &end);
            if (*end || end == v) {
                fprintf(stderr, "kvsim bench net: --gbps needs a number\n");
                return 2;
            }
        } else {
            fprintf(stderr, "kvsim bench net: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (rc)
            return rc;
        i++;
    }
    o.seed = (uint64_t)seed;
    if (c->topology == KV_TOPO_TORUS) { /* a near-cubic torus that holds the hosts */
        int x = (int)ceil(cbrt((double)c->hosts));
        c->torus_dims[0] = c->torus_dims[1] = x;
        c->torus_dims[2] = (c->hosts + x * x - 1) / (x * x);
    } else if (c->topology == KV_TOPO_DRAGONFLY) { /* 4 routers per chassis, 4 hosts per router */
        c->dragonfly_routers = 4;
        c->dragonfly_nodes = 4;
        c->dragonfly_groups = 4;
        c->dragonfly_chassis = (c->hosts + 63) / 64;
    }
    c->prefill_hosts = c->hosts / 2; /* flows go from the first half to the second (a platform is checked) */
    if (o.model) {
        c->option_key[0] = "network/model";
        c->option_value[0] = o.model;
        c->n_options = 1;
    }

    printf("kvsim bench net: %d KV transfers (1k-8k tokens x 128 KiB), at most %d in flight\n", o.flows, o.inflight);
    printf("  network: %d-host %s, %g Gb/s NICs, model %s, priority %s\n", c->hosts,
           kv_net_topology_name(c->topology), c->nic_bandwidth_gbps, o.model ? o.model : "CM02 (default)", o.prio);
    fflush(stdout);
    bench_result sim = {0}, ideal = {0};
    kv_error err;
    int rc = run_model(&o, KV_NET_SIMGRID, &sim, &err);
    if (rc != KV_OK) {
        fprintf(stderr, "kvsim bench net: %s\n", err.msg);
        return rc;
    }
    printf("  simgrid: wall %.2f s, %.0f transfers/s, %.2f simulated s (%.3g simulated s per wall s), "
           "%zu links, busiest link busy %.0f%%\n",
           sim.wall_s, o.flows / sim.wall_s, sim.sim_s, sim.sim_s / sim.wall_s, sim.links, 100 * sim.busiest_util);
    if (o.ideal) {
        o.cfg.priority = KV_PRIO_NONE;
        rc = run_model(&o, KV_NET_IDEAL, &ideal, &err);
        if (rc != KV_OK) {
            fprintf(stderr, "kvsim bench net: %s\n", err.msg);
            return rc;
        }
        printf("  ideal:   wall %.3f s, %.0f transfers/s, %.2f simulated s\n", ideal.wall_s, o.flows / ideal.wall_s,
               ideal.sim_s);
        printf("  simgrid / ideal: wall time %.0fx, mean transfer time %.2fx (contention)\n",
               sim.wall_s / ideal.wall_s, sim.mean_transfer_s / ideal.mean_transfer_s);
    }
    if (o.flows == 10000 && o.inflight == 1000 && c->hosts == 1024 && c->topology == KV_TOPO_FAT_TREE)
        printf("  target: 10,000 transfers on 1,024 hosts in under 60 s of wall time: %s (%.0f%% of the budget)\n",
               sim.wall_s < 60 ? "met" : "NOT met", 100 * sim.wall_s / 60);
    return 0;
}
