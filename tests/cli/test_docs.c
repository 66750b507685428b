/* test_docs.c — the documents that mirror the code stay in step with it. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

/* docs/scenario-reference.md holds `kvsim help scenario` and `kvsim help cards` verbatim. */
Test(docs, scenario_reference_matches_the_loader)
{
    char *doc = kvt_read("docs/scenario-reference.md", NULL);
    cr_assert(doc, "docs/scenario-reference.md is missing");
    const char *topics[] = {"help scenario", "help cards"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL;
        cr_assert_eq(kvt_kvsim(topics[i], &out), 0, "%s", out);
        cr_expect(strstr(doc, out) != NULL,
                  "docs/scenario-reference.md does not contain the output of `kvsim %s`: run "
                  "scripts/gen-scenario-reference.sh",
                  topics[i]);
        free(out);
    }
    free(doc);
}

Test(docs, help_scenario_lists_every_section)
{
    char *out = NULL;
    cr_assert_eq(kvt_kvsim("help scenario", &out), 0);
    const char *keys[] = {"cluster:", "network:", "nic_bandwidth_gbps:", "workload:", "timing:", "policies:",
                          "lynx:", "diffkv:", "memory:", "outputs:", "accuracy:"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_expect(strstr(out, keys[i]) != NULL, "kvsim help scenario lacks %s", keys[i]);
    free(out);
    cr_expect_eq(kvt_kvsim("help nonsense", &out), 2);
    free(out);
}

/* README names the two set-up commands CI and new users rely on. */
Test(docs, readme_has_the_two_commands)
{
    char *readme = kvt_read("README.md", NULL);
    cr_assert(readme);
    cr_expect(strstr(readme, "make run") && strstr(readme, "make test"));
    free(readme);
    char *ci = kvt_read(".ci/run", NULL);
    cr_assert(ci);
    cr_expect(strstr(ci, "make test") != NULL);
    free(ci);
}
