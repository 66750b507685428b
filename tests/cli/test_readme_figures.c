/* test_readme_figures.c — README's quoted `make run` output is what the current binary prints. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

/* The fenced block after the first line holding `marker` (free it); fails the test when absent. */
static char *block_after(const char *text, const char *marker)
{
    const char *at = strstr(text, marker);
    cr_assert(at != NULL, "README.md has no \"%s\"", marker);
    const char *open = strstr(at, "\n```\n");
    cr_assert(open != NULL, "no fenced block after \"%s\"", marker);
    open += 5;
    const char *close = strstr(open, "\n```");
    cr_assert(close != NULL, "the block after \"%s\" is not closed", marker);
    size_t n = (size_t)(close - open) + 1;
    char *out = malloc(n + 1);
    memcpy(out, open, n);
    out[n] = '\0';
    return out;
}

/* README.md quotes make run's output whole (scenarios/quickstart.yaml: everything from the shipped
   statistics file, so the same bytes with or without the reference model). */
Test(readme_figures, make_run_output_is_the_current_binarys, .timeout = 120)
{
    char *readme_path = kvt_source("README.md"), *scenario = kvt_source("scenarios/quickstart.yaml");
    char *readme = kvt_read(readme_path, NULL);
    cr_assert(readme != NULL, "cannot read %s", readme_path);
    char *quoted = block_after(readme, "`make run` prints this");
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s", scenario);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    /* the run prints a blank line before its title; the quote starts at the title */
    const char *printed = out;
    while (*printed == '\n')
        printed++;
    cr_expect_str_eq(printed, quoted,
                     "README.md's make run block differs from `kvsim run scenarios/quickstart.yaml`; paste the new "
                     "output into README.md (and refresh the figures quoted around it)");
    free(out);
    free(quoted);
    free(readme);
    free(readme_path);
    free(scenario);
}
