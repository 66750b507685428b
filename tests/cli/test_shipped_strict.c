/* test_shipped_strict.c — every shipped scenario (scenarios/ and scenarios/tutorial/, each .yaml) passes
 * `kvsim validate --strict`: no warning (a request past the model's context, weights plus activations
 * past a device, a request whose KV cannot fit) in what users run first. splitwise-llama2-70b, whose
 * Azure conversations outgrow Llama-2-70B's context, says workload.fit_context: true. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

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
