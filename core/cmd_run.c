/* cmd_run.c — `kvsim run` and `kvsim validate` (being written by the lead). */
#include <stdio.h>

#include "core/commands.h"

int kv_cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvsim run: the engine is being written in this commit series\n");
    return 1;
}

int kv_cmd_validate(int argc, char **argv)
{
    return kv_cmd_run(argc, argv);
}
