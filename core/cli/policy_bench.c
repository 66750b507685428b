/* policy_bench.c — `kvsim bench policy`: how many hook calls per second the policy host answers, cached and not. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/datadir.h"
#include "core/cli/commands.h"
#include "core/policy/policy.h"

/* A placement and admission policy for the bench (the shipped ones use the defaults). */
static const char placement_policy[] =
    "-- written by kvsim bench policy\n"
    "return {\n"
    "  prefill_node = function(ctx)\n"
    "    local best = ctx.nodes[1]\n"
    "    for _, n in ipairs(ctx.nodes) do\n"
    "      if n.queued + n.running < best.queued + best.running then best = n end\n"
    "    end\n"
    "    return best.index\n"
    "  end,\n"
    "  admit = function(ctx) return ctx.kv_bytes_needed <= 0.9 * ctx.node.kv_free_bytes end,\n"
    "}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* policies/lynx.lua from the working directory, else from kvsim's data folder (core/base/datadir.h). */
static char *find_policy(const char *rel)
{
    if (access(rel, R_OK) == 0)
        return kv_strdup(rel);
    char data[KV_DATA_PATH_MAX], path[KV_DATA_PATH_MAX + 64];
    if (!kv_data_dir(data, sizeof data))
        return NULL;
    snprintf(path, sizeof path, "%s/%s", data, rel);
    return access(path, R_OK) == 0 ? kv_strdup(path) : NULL;
}

/* An adaptive policy (as tests/fixtures/policies/live_bits.lua): bits from the route and the decode nodes'
   incoming transfers, decided once per request and kept in ctx.state. Nothing of it can be cached. */
static const char adaptive_policy[] =
    "local function busy(ctx)\n"
    "  for _, l in ipairs(ctx.route) do if l.flows > 0 or l.utilisation > 0.5 then return true end end\n"
    "  for _, n in ipairs(ctx.decode_nodes) do if n.incoming > 2 then return true end end\n"
    "  return false\n"
    "end\n"
    "return { encode = function(ctx)\n"
    "  local s = ctx.state\n"
    "  if s.id ~= ctx.request.id then s.id = ctx.request.id; s.bits = busy(ctx) and 4 or 8 end\n"
    "  return { key = { bits = s.bits }, value = { bits = s.bits } }\n"
    "end }\n";

/* The running system the adaptive policy sees in the benchmark: 8 decode nodes, a 2-link route. */
typedef struct bench_view {
    kv_policy_node nodes[8];
} bench_view;

static double bench_now(void *u)
{
    (void)u;
    return 1.5;
}

static int bench_nodes(void *u, int pool, const kv_policy_node **out)
{
    (void)pool;
    *out = ((bench_view *)u)->nodes;
    return 8;
}

static int bench_route(void *u, uint64_t id, kv_policy_link *links, int max)
{
    (void)u;
    int n = max < 2 ? max : 2;
    for (int i = 0; i < n; i++)
        links[i] = (kv_policy_link){100, 50, 0.5, (int)(id % 3), 1e8, 0};
    return n;
}

typedef struct bench_row {
    const char *what;
    double calls_per_s;
} bench_row;

static void usage(FILE *out)
{
    fprintf(out, "usage: kvsim bench policy [--policy FILE] [--calls N]\n"
                 "  --policy FILE  policy whose encode/transfer/speculate hooks are timed (default policies/lynx.lua)\n"
                 "  --calls N      hook calls per uncached measurement (default 200000; cached ones run 10x)\n");
}

int kv_cmd_bench_policy(int argc, char **argv)
{
    const char *policy_arg = NULL;
    long calls = 200000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
            policy_arg = argv[++i];
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            char *end;
            calls = strtol(argv[++i], &end, 10);
            if (*end || calls < 1000 || calls > 100000000) {
                fprintf(stderr, "kvsim bench policy: --calls wants a number from 1000 to 100000000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvsim bench policy: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    char *path = policy_arg ? kv_strdup(policy_arg) : find_policy("policies/lynx.lua");
    if (!path) {
        fprintf(stderr, "kvsim bench policy: cannot find policies/lynx.lua (not in the working folder nor kvsim's data "
                        "folder; use --policy)\n");
        return 2;
    }
    kv_error err;
    kv_policy *p = NULL;
    if (kv_policy_load(NULL, path, NULL, 0, NULL, &p, &err) != KV_OK) {
        fprintf(stderr, "kvsim bench policy: %s\n", err.msg);
        kv_free(path);
        return err.code;
    }
    const kv_policy_model model = {"Llama-3-8B", 32, 32, 8, 128};
    const int cells = model.layers * model.kv_heads;
    kv_policy_request req = {1, 4096, 256, 0.0};
    bench_row rows[8];
    int n_rows = 0, rc = 0;
    kv_encoding e;
    volatile int sink = 0;

    /* encode: uncached first (the cache is off), then cached. */
    for (int cached = 0; cached <= 1 && rc == 0; cached++) {
        kv_policy_set_cache(p, cached);
        long n = cached ? calls * 10 : calls;
        double t0 = now_s();
        for (long i = 0; i < n && rc == 0; i++) {
            req.id = (uint64_t)(i / cells);
            rc = kv_policy_encoding(p, &model, &req, (int)(i % cells) / model.kv_heads, (int)(i % model.kv_heads), &e,
                                    &err);
            sink += e.key.bits;
        }
        double dt = now_s() - t0;
        rows[n_rows++] = (bench_row){cached ? "encode, cached (every (layer, head) after the first request)"
                                            : "encode, Lua on every call (cache off)",
                                     (double)n / dt};
    }
    kv_policy_set_cache(p, false);
    if (rc == 0 && kv_policy_has_hook(p, "transfer")) {
        kv_transfer_plan tp;
        double t0 = now_s();
        for (long i = 0; i < calls && rc == 0; i++)
            rc = kv_policy_transfer(p, &req, &tp, &err);
        rows[n_rows++] = (bench_row){"transfer, Lua on every call", (double)calls / (now_s() - t0)};
    }
    if (rc == 0 && kv_policy_has_hook(p, "speculate")) {
        int k;
        double t0 = now_s();
        for (long i = 0; i < calls && rc == 0; i++) {
            rc = kv_policy_speculation(p, &req, &k, &err);
            sink += k;
        }
        rows[n_rows++] = (bench_row){"speculate, Lua on every call", (double)calls / (now_s() - t0)};
    }
    char policy_name[256];
    snprintf(policy_name, sizeof policy_name, "%s", kv_policy_name(p));
    kv_policy_destroy(p);
    p = NULL;

    /* Placement and admission from a small policy written to a temporary file. */
    char tmpl[] = "/tmp/kvsim-bench-policy-XXXXXX";
    int fd = rc == 0 ? mkstemp(tmpl) : -1;
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w");
        fputs(placement_policy, f);
        fclose(f);
        if (kv_policy_load("placement", tmpl, NULL, 0, NULL, &p, &err) == KV_OK) {
            kv_policy_node nodes[8];
            for (int i = 0; i < 8; i++)
                nodes[i] = (kv_policy_node){i, (i * 7) % 5, i % 3, 40e9 - i * 1e9, i * 1e9};
            int node = 0;
            double t0 = now_s();
            for (long i = 0; i < calls && rc == 0; i++) {
                rc = kv_policy_prefill_node(p, &req, nodes, 8, &node, &err);
                sink += node;
            }
            rows[n_rows++] = (bench_row){"prefill_node over 8 nodes, Lua", (double)calls / (now_s() - t0)};
            bool ok = false;
            t0 = now_s();
            for (long i = 0; i < calls && rc == 0; i++) {
                rc = kv_policy_admit(p, &req, &nodes[i % 8], 1e9, &ok, &err);
                sink += ok;
            }
            rows[n_rows++] = (bench_row){"admit, Lua", (double)calls / (now_s() - t0)};
        } else {
            rc = err.code;
        }
        kv_policy_destroy(p);
        unlink(tmpl);
    }
    /* An adaptive policy: every (layer, head) of every request runs Lua and reads the live view. */
    double adaptive_us = 0;
    char tmpl2[] = "/tmp/kvsim-bench-policy-XXXXXX";
    fd = rc == 0 ? mkstemp(tmpl2) : -1;
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w");
        fputs(adaptive_policy, f);
        fclose(f);
        if (kv_policy_load("adaptive", tmpl2, NULL, 0, NULL, &p, &err) == KV_OK) {
            bench_view bv;
            for (int i = 0; i < 8; i++)
                bv.nodes[i] = (kv_policy_node){i, i % 3, i % 4, 40e9, 1e9, i % 5, 1e9};
            kv_policy_view v = {.user = &bv, .now = bench_now, .nodes = bench_nodes, .route = bench_route};
            kv_policy_set_view(p, &v);
            long requests = calls / cells > 0 ? calls / cells : 1;
            kv_policy_request ar = req;
            kv_encoding e;
            double t0 = now_s();
            for (long q = 0; q < requests && rc == 0; q++) {
                ar.id = (uint64_t)q;
                for (int c = 0; c < cells && rc == 0; c++) {
                    rc = kv_policy_encoding(p, &model, &ar, c / model.kv_heads, c % model.kv_heads, &e, &err);
                    sink += e.key.bits;
                }
            }
            adaptive_us = (now_s() - t0) / (double)requests * 1e6;
            rows[n_rows++] = (bench_row){"encode, adaptive (reads ctx.route, decode_nodes, state; never cached)",
                                         (double)(requests * cells) / (now_s() - t0)};
        } else {
            rc = err.code;
        }
        kv_policy_destroy(p);
        unlink(tmpl2);
    }
    if (rc != 0) {
        fprintf(stderr, "kvsim bench policy: %s\n", err.msg);
        kv_free(path);
        return rc;
    }

    double base = rows[0].calls_per_s;
    printf("kvsim bench policy: %s (%s), model %d layers x %d KV heads\n\n", policy_name, path, model.layers,
           model.kv_heads);
    printf("%-62s %14s %10s %12s\n", "hook", "calls/s", "ns/call", "x uncached");
    for (int i = 0; i < n_rows; i++)
        printf("%-62s %14.0f %10.1f %12.2f\n", rows[i].what, rows[i].calls_per_s, 1e9 / rows[i].calls_per_s,
               rows[i].calls_per_s / base);
    printf("\nencode for one request (%d calls): %.1f us from Lua, %.2f us cached\n", cells,
           cells / rows[0].calls_per_s * 1e6, cells / rows[1].calls_per_s * 1e6);
    printf("adaptive policy, cost per request (%d encode calls, each reading the live view): %.1f us\n", cells,
           adaptive_us);
    (void)sink;
    kv_free(path);
    return 0;
}
