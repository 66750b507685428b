/* test_skips.c — a test that cannot run shows as Skipped in ctest, never as Passed,
 * and a missing reference model fails where it is required (CI=true,
 * KVSIM_REQUIRE_MODEL=1) instead of skipping. The model is made unobtainable by
 * pointing its cache at a folder that cannot be created (no download is tried). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/base/jsonread.h"

/* Runs a shell command from the source folder; returns its exit status and output. */
static int run(const char *cmd, char **output)
{
    char full[4096];
    /* BXFI_MAP is this test's own Criterion worker state: a nested Criterion run must not see it */
    snprintf(full, sizeof full, "unset BXFI_MAP; cd '%s' && { %s; } 2>&1", KV_SOURCE_DIR, cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 == cap)
            out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    int status = pclose(p);
    *output = out;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define NO_MODEL "env -u CI -u KVSIM_REQUIRE_MODEL KVSIM_MODEL_DIR=/proc/kvsim-no-model "

Test(skips, missing_model_is_a_visible_skip)
{
    char *out;
    int rc = run(NO_MODEL "sh tests/criterion-run.sh " KV_BINARY_DIR "/tests/test_model_gguf --verbose=0 -j1 "
                          "--filter=gguf/real_model_table",
                 &out);
    cr_expect_eq(rc, 77, "exit %d (77 is ctest's Skipped):\n%s", rc, out);
    cr_expect(strstr(out, "kvsim skipped: gguf::real_model_table: reference model not available") != NULL, "%s",
              out);
    free(out);
    /* and ctest's summary says so, for the entry of its own */
    rc = run(NO_MODEL "ctest --test-dir " KV_BINARY_DIR " -R '^model_real_gguf$'", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "model_real_gguf") && strstr(out, "Skipped") && strstr(out, "1 tests failed") == NULL,
              "ctest does not show the entry as Skipped:\n%s", out);
    free(out);
}

Test(skips, missing_model_fails_where_required)
{
    static const char *const envs[] = {"CI=true", "KVSIM_REQUIRE_MODEL=1"};
    for (int i = 0; i < 2; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd,
                 NO_MODEL "%s sh tests/criterion-run.sh " KV_BINARY_DIR "/tests/test_model_gguf --verbose=0 -j1 "
                          "--filter=gguf/real_model_table",
                 envs[i]);
        int rc = run(cmd, &out);
        cr_expect(rc != 0 && rc != 77, "%s: exit %d, expected a failure:\n%s", envs[i], rc, out);
        cr_expect(strstr(out, "reference model required (CI=true or KVSIM_REQUIRE_MODEL=1) but not available") !=
                      NULL,
                  "%s: %s", envs[i], out);
        cr_expect(strstr(out, "kvsim skipped") == NULL, "%s: a failure must not read as a skip:\n%s", envs[i], out);
        free(out);
    }
}

/* A skip inside a run that also fails is a failure, not a skip. */
Test(skips, failure_is_never_hidden_by_a_skip)
{
    char *out;
    int rc = run("sh tests/criterion-run.sh sh -c 'echo \"[SKIP] a::b: why\"; exit 3'", &out);
    cr_expect_eq(rc, 3, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "kvsim skipped") == NULL, "%s", out);
    free(out);
    rc = run("sh tests/criterion-run.sh sh -c 'echo \"[SKIP] a::b: Test is disabled\"; exit 0'", &out);
    cr_expect_eq(rc, 0, "a test left out by --filter is not a skip: exit %d:\n%s", rc, out);
    free(out);
}

/* Every ctest entry can report a skip: the fuzz entries (echoing why when clang
   is missing) by SKIP_REGULAR_EXPRESSION, the others through criterion-run.sh
   and its exit code 77 (SKIP_RETURN_CODE). */
Test(skips, every_entry_can_report_a_skip)
{
    char *out;
    int rc = run("ctest --test-dir " KV_BINARY_DIR " --show-only=json-v1 2>/dev/null", &out);
    cr_assert_eq(rc, 0, "%s", out);
    kv_jvalue *root = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_jread_parse(out, strlen(out), "ctest --show-only=json-v1", &root, &err), KV_OK, "%s", err.msg);
    const kv_jvalue *tests = kv_jvalue_get(root, "tests");
    cr_assert(tests && tests->kind == KV_JARRAY);
    cr_expect(tests->count >= 40, "only %zu ctest entries", tests->count);
    for (size_t i = 0; i < tests->count; i++) {
        const kv_jvalue *name = kv_jvalue_get(tests->items[i], "name");
        const kv_jvalue *props = kv_jvalue_get(tests->items[i], "properties");
        int marked = 0;
        for (size_t k = 0; props && k < props->count; k++) {
            const kv_jvalue *pn = kv_jvalue_get(props->items[k], "name");
            if (pn && (strcmp(pn->text, "SKIP_RETURN_CODE") == 0 || strcmp(pn->text, "SKIP_REGULAR_EXPRESSION") == 0))
                marked = 1;
        }
        cr_expect(marked, "ctest entry %s cannot report a skip (it would show as Passed)", name ? name->text : "?");
    }
    kv_jvalue_free(root);
    free(out);
}

/* An entry whose --filter matches no test ran nothing: a failure, not a pass (nor a skip). */
Test(skips, an_entry_that_runs_no_test_fails)
{
    char *out;
    int rc = run("sh tests/criterion-run.sh " KV_BINARY_DIR "/tests/test_model_gguf --verbose=0 -j1 "
                 "--filter=gguf/no_such_test",
                 &out);
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "kvsim: no test ran") != NULL, "%s", out);
    free(out);
}
