/* commands.h — kvsim's subcommands. Each takes argc/argv after its own name
   (argv[0] is the subcommand) and returns the exit code: 0 ok, 1 run failed,
   2 bad input. */
#ifndef KV_COMMANDS_H
#define KV_COMMANDS_H

typedef struct kv_command {
    const char *name;    /* as typed: "run", "bench kernels" is "kernels" in the bench table */
    const char *usage;   /* one line: arguments */
    const char *summary; /* one line: what it does */
    int (*run)(int argc, char **argv);
} kv_command;

int kv_cmd_run(int argc, char **argv);      /* core/cli/cmd_run.c */
int kv_cmd_validate(int argc, char **argv); /* core/cli/cmd_run.c */
int kv_cmd_bench(int argc, char **argv);    /* core/cli/cmd_bench.c: dispatches to the table below */
int kv_cmd_help(int argc, char **argv);     /* core/cli/cmd_run.c */
int kv_cmd_eval(int argc, char **argv);     /* core/cli/cmd_eval.c */
int kv_cmd_sweep(int argc, char **argv);    /* core/cli/cmd_sweep.c */
int kv_cmd_capacity(int argc, char **argv); /* core/cli/cmd_capacity.c */
int kv_cmd_measure(int argc, char **argv);  /* core/cli/cmd_measure.c */
int kv_cmd_calibrate(int argc, char **argv); /* core/cli/cmd_calibrate.c */

struct kv_cleanup_slot; /* core/base/afile.h */
/* The one signal registry (core/cli/cmd_run.c): installs the SIGINT/SIGTERM/SIGHUP handler that removes
   the folder the slot names and exits 128 + the signal, and returns the slot for kv_outdir_begin. */
struct kv_cleanup_slot *kv_cmd_cleanup_slot(void);

/* `--seed V` of run, validate, eval and capacity (core/cli/cmd_run.c): the override "seed=V" (the caller
   frees it), or NULL after printing to stderr why V is not a seed 0..2147483647. */
char *kv_cmd_seed_override(const char *cmd, const char *value);

/* `kvsim bench <what>`: each lives with the module it measures. */
int kv_cmd_bench_sim(int argc, char **argv);     /* core/cli/bench_sim.c */
int kv_cmd_bench_kernels(int argc, char **argv); /* core/cli/bench_kernels.c */
int kv_cmd_bench_net(int argc, char **argv);     /* core/cli/bench_net.c */
int kv_cmd_bench_policy(int argc, char **argv);  /* core/cli/policy_bench.c */
int kv_cmd_bench_model(int argc, char **argv);   /* core/cli/bench_model.c */
int kv_cmd_bench_roofline(int argc, char **argv); /* core/cli/bench_roofline.c */

#endif
