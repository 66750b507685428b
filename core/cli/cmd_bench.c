/* cmd_bench.c — `kvsim bench WHAT`: a table of benchmarks, each living with the module it measures. */
#include <stdio.h>
#include <string.h>

#include "core/cli/commands.h"

static const kv_command benches[] = {
    /* Each module adds its row: {"name", "options", "what it prints", function}. */
    {"sim", "[--scenario FILE] [--requests N] [--network ideal|simgrid] [--repeats N] [--write DIR]",
     "simulated requests per wall- and CPU-second (Azure code trace, 8P+8D, or any scenario) against the ideal "
     "network; --write also times the outputs",
     kv_cmd_bench_sim},
    {"kernels", "[--backend NAME|all] [--json FILE] [--repeats N] [--quick]",
     "kernel GB/s and ratio to measured memory bandwidth, checked against the CPU reference",
     kv_cmd_bench_kernels},
    {"net", "[--flows N] [--inflight N] [--topology T] ... (--help)",
     "wall time and transfers/s of the SimGrid network on 10,000 KV transfers", kv_cmd_bench_net},
    {"policy", "[--policy FILE] [--calls N]", "Lua policy hook calls per second, cached and uncached",
     kv_cmd_bench_policy},
    {"model", "[--model PATH] [--prompt N] [--decode N]",
     "reference model (SmolLM2-135M) prefill and decode tokens/s, beside sgemm and memcpy rates", kv_cmd_bench_model},
    {"roofline", "--profile FILE --profile-model NAME --hardware NAME [--model CARD] [--device D] [--tp N]... [--calibrated FILE]",
     "the roofline's error against a profiled table (timing.source: profile), point by point",
     kv_cmd_bench_roofline},
    {NULL, NULL, NULL, NULL},
};

static void bench_usage(FILE *out)
{
    fprintf(out, "usage: kvsim bench WHAT [options]\n\nbenchmarks (they print ratios, never pass/fail):\n");
    for (size_t i = 0; benches[i].name; i++)
        fprintf(out, "  %-8s %s\n           %s\n", benches[i].name, benches[i].usage, benches[i].summary);
}

int kv_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; benches[i].name; i++)
        if (strcmp(argv[1], benches[i].name) == 0)
            return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvsim bench: unknown benchmark '%s'\n", argv[1]);
    bench_usage(stderr);
    return 2;
}
