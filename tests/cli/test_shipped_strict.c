/* test_shipped_strict.c — every shipped scenario (scenarios/ and scenarios/tutorial/, each .yaml) passes
 * `kvsim validate --strict`: no warning (a request past the model's context, weights plus activations
 * past a device, a request whose KV cannot fit) in what users run first. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

/* splitwise-llama2-70b replays the whole Azure conversation trace on Llama-2-70B, as splitwise-sim
   does: 1612 of its 19366 requests need more than the card's 4096-token context (their prompts are cut).
   That is the trace, not a mistake in the scenario; it is left out here and validates without --strict. */
static int known_over_context(const char *path)
{
    return strstr(path, "/splitwise-llama2-70b.yaml") != NULL;
}

Test(shipped, every_scenario_validates_strict, .timeout = 240)
{
    char *root = kvt_source("scenarios");
    const char *patterns[] = {"*.yaml", "tutorial/*.yaml"};
    size_t checked = 0;
    for (size_t k = 0; k < 2; k++) {
        char *pat = NULL;
        cr_assert(asprintf(&pat, "%s/%s", root, patterns[k]) > 0);
        glob_t g;
        cr_assert_eq(glob(pat, 0, NULL, &g), 0, "no scenarios match %s", pat);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *path = g.gl_pathv[i];
            char *args = NULL, *out = NULL;
            cr_assert(asprintf(&args, "validate '%s' --strict", path) > 0);
            int rc = kvt_kvsim(args, &out);
            if (known_over_context(path)) {
                cr_expect_neq(rc, 0, "%s now passes --strict: drop it from known_over_context", path);
                free(args);
                cr_assert(asprintf(&args, "validate '%s'", path) > 0);
                free(out);
                rc = kvt_kvsim(args, &out);
            }
            cr_expect_eq(rc, 0, "kvsim %s: exit %d:\n%s", args, rc, out);
            checked++;
            free(out);
            free(args);
        }
        globfree(&g);
        free(pat);
    }
    cr_expect_geq(checked, 13, "only %zu shipped scenarios found under %s", checked, root);
    free(root);
}
