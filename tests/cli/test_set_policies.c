/* test_set_policies.c — --set policies=[...] drops the policy.<name> settings of policies not listed,
   saying so once; a scenario file's own stray settings stay an error. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

static size_t count(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what))
        n++;
    return n;
}

Test(set_policies, readme_example_on_lynx_yaml)
{
    /* README: --set policies=[bf16,lynx]; scenarios/lynx.yaml configures lynx16 too. */
    char *out = NULL;
    int rc = kvt_kvsim("validate scenarios/lynx.yaml --set 'policies=[bf16,lynx]'", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect_eq(count(out, "policy.lynx16.*"), 1, "%s", out);
    cr_expect(strstr(out, "ignoring the settings of policies not listed") && strstr(out, "policies: bf16 lynx\n"),
              "%s", out);
    free(out);
    rc = kvt_kvsim("run scenarios/lynx.yaml --set 'policies=[bf16,lynx]' --set lynx.from=scenario "
                   "--set workload.requests=2 --set 'workload.prompt={dist: fixed, value: 8192}'", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect_eq(count(out, "policy.lynx16.*"), 1, "%s", out);
    cr_expect(strstr(out, "\nlynx ") && !strstr(out, "\nlynx16 "), "%s", out);
    free(out);
}

Test(set_policies, listed_settings_are_kept)
{
    /* lynx stays listed: its settings still reach it (a bad one is still refused) and nothing is said. */
    char *out = NULL;
    int rc = kvt_kvsim("validate scenarios/lynx.yaml --set 'policies=[lynx, lynx16]'", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(!strstr(out, "ignoring"), "%s", out);
    free(out);
    rc = kvt_kvsim("validate scenarios/lynx.yaml --set 'policies=[bf16,lynx]' --set policy.lynx.no_such_param=1",
                   &out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "no_such_param"), "%s", out);
    free(out);
}

Test(set_policies, stray_settings_in_the_file_stay_an_error)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml",
                           "name: stray\nmodel: llama-3-8b\nnetwork: {model: ideal}\n"
                           "workload: {requests: 2}\npolicies: [bf16]\npolicy:\n  int4x: {bits: 4}\n");
    char *args = NULL, *out = NULL;
    cr_assert(asprintf(&args, "validate '%s'", path) > 0);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "s.yaml:7:3: policy.int4x: 'int4x' is not in policies"), "%s", out);
    free(out);
    free(args);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
