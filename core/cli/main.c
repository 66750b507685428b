/* main.c — kvsim's command line: a table of subcommands. */
#include <stdio.h>
#include <string.h>

#include "core/base/datadir.h"
#include "core/cli/commands.h"
#include "core/refmodel/model.h"

static const kv_command commands[] = {
    {"run", "SCENARIO [--set key.path=value]... [--seed N] [--seeds N] [--out DIR] [--quiet] [--plot]",
     "simulate a scenario and print the comparison table", kv_cmd_run},
    {"capacity", "SCENARIO --slo ttft_ms=X,tpot_ms=Y [--attainment 0.9] [--precision 0.02] [--out DIR] [--plot]",
     "the highest request rate per policy at which the SLOs are met (goodput, DistServe)", kv_cmd_capacity},
    {"sweep", "SWEEP.yaml [-j N] [--plot] | SWEEP.yaml --emit slurm|parallel | --collect DIR",
     "run a parameter sweep in parallel, or write it as cluster jobs (docs/sweeps.md)", kv_cmd_sweep},
    {"validate", "SCENARIO [--set key.path=value]... [--strict]",
     "check a scenario without running or measuring anything: keys, files, and that it fits", kv_cmd_validate},
    {"eval", "SCENARIO [--set key.path=value]... [--seed N] [--out DIR] [--stats FILE] [--model PATH] [--quiet]",
     "accuracy (with 95% intervals) of each policy's KV on the reference model (SmolLM2-135M)", kv_cmd_eval},
    {"measure", "SCENARIO --out FILE [--set key.path=value]... [--lengths 1024,2048,4096,8192] [--samples N]",
     "measure Lynx acceptance and DiffKV significance by prompt length into a statistics file", kv_cmd_measure},
    {"calibrate", "--profile FILE --profile-model NAME --hardware NAME --out FILE [--model CARD] [--device D] [--tp N]...",
     "fit the roofline per tp and phase to a profiled table; write a device profile with the knobs", kv_cmd_calibrate},
    {"bench", "WHAT [options]", "benchmarks that print ratios (kvsim bench --help)", kv_cmd_bench},
    {"help", "scenario | cards", "print the scenario reference or the card/profile reference", kv_cmd_help},
};

static void usage(FILE *out)
{
    fprintf(out, "kvsim %s — disaggregated LLM inference simulator (KV compression and transfer)\n\n", KV_VERSION);
    fprintf(out, "usage: kvsim COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-9s %s\n            %s\n", commands[i].name, commands[i].usage, commands[i].summary);
    fprintf(out, "\n  kvsim --help | --version\n\n"
                 "Exit codes: 0 ok, 1 the run failed, 2 bad input.\n"
                 "Scenario reference: kvsim help scenario, or README.md.\n"
                 "Paths: relative paths in a scenario resolve against its folder, then the working folder,\n"
                 "then kvsim's data folder; on the command line, against the working folder.\n"
                 "KVSIM_DATA_DIR names the data folder; kvsim --version shows where it is looked for.\n");
}

/* The version, and where relative paths and kvsim's own data are looked for, in order. */
static void print_version(void)
{
    printf("kvsim %s\n", KV_VERSION);
    printf("relative paths in a scenario: the scenario's folder, the working folder, then kvsim's data folder\n"
           "relative paths on the command line (--set, --out, arguments): the working folder\n"
           "kvsim's data folder (policies/, scenarios/, scripts/plot), the first usable of:\n");
    kv_data_places p;
    kv_data_places_list(&p);
    for (int i = 0; i < p.count; i++)
        printf("  %d. %s (%s)%s\n", i + 1, p.path[i], p.what[i],
               p.usable[i] ? "" : ": not there (no scenarios/ and policies/)");
    if (p.count == 0)
        printf("  none (no /proc/self/exe; set KVSIM_DATA_DIR)\n");
    printf("KVSIM_DATA_DIR=FOLDER replaces this list\n");
}

int main(int argc, char **argv)
{
    kv_model_blas_park(); /* BLAS threads would spin idle for 0.1 CPU-s per core otherwise */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || (strcmp(argv[1], "help") == 0 && argc == 2)) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        print_version();
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvsim: unknown command '%s' (try kvsim --help)\n", argv[1]);
    return 2;
}
