/* test_smoke.c — the command line answers --help and --version, and rejects unknown commands. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

Test(cli, version)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("--version", &out), 0);
    cr_assert(strstr(out, "kvsim ") == out, "got: %s", out);
    free(out);
}

Test(cli, help_lists_commands)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("--help", &out), 0);
    cr_assert(strstr(out, "run") && strstr(out, "validate") && strstr(out, "bench"), "got: %s", out);
    free(out);
}

Test(cli, unknown_command_is_bad_input)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("frobnicate", &out), 2);
    cr_assert(strstr(out, "unknown command 'frobnicate'"), "got: %s", out);
    free(out);
}
