/* test_paths.c — where relative paths resolve (scenario folder, working folder, data folder; --set paths:
   the working folder), kvsim --version's list of places, and make install's tree working on its own. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/support.h"

/* Runs `cd DIR && [ENV] kvsim ARGS` through the shell; stdout+stderr in *out (free it). */
static int kvsim_in(const char *dir, const char *env, const char *args, char **out)
{
    const char *bin = getenv("KVSIM");
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "cd '%s' && %s '%s' %s", dir, env ? env : "", bin ? bin : KV_BINARY_DIR "/kvsim",
                       args) > 0);
    int rc = kvt_sh(cmd, out);
    cr_assert(*out, "%s", cmd);
    free(cmd);
    return rc;
}

/* cp -r SOURCE/what DEST/ */
static void copy_in(const char *what, const char *dest)
{
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "cp -r '%s/%s' '%s'/", KV_SOURCE_DIR, what, dest) > 0);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
}

/* A copy of the checkout's scenarios/ and policies/ in a fresh folder, whose policies/int4.lua prints
   EDITED-COPY from its encode hook (the checkout's does not). */
static char *edited_copy(void)
{
    char *t = kvt_tempdir();
    cr_assert(t);
    copy_in("scenarios", t);
    copy_in("policies", t);
    char *lua = kvt_path(t, "policies/int4.lua");
    char *text = kvt_read(lua, NULL);
    cr_assert(text);
    const char *hook = "encode = function(ctx)\n";
    char *at = strstr(text, hook);
    cr_assert(at, "policies/int4.lua has no encode hook");
    FILE *f = fopen(lua, "w");
    cr_assert(f);
    fprintf(f, "%.*sprint(\"EDITED-COPY\")\n%s", (int)(at - text + strlen(hook)), text, at + strlen(hook));
    cr_assert_eq(fclose(f), 0);
    free(text);
    free(lua);
    return t;
}

Test(paths, edited_policy_in_a_copy_is_used)
{
    char *t = edited_copy();
    char *out = NULL;
    int rc = kvsim_in(t, NULL, "run scenarios/quickstart.yaml --set workload.requests=3", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "EDITED-COPY"), "the checkout's policies/int4.lua was used, not the copy's:\n%s", out);
    free(out);
    rc = kvsim_in(t, NULL, "run scenarios/quickstart.yaml --set workload.requests=3 "
                  "--set policy.int4.file=./policies/int4.lua", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "EDITED-COPY"), "--set policy.int4.file=./policies/int4.lua did not use the copy:\n%s", out);
    free(out);
    kvt_rmtree(t);
    free(t);
}

Test(paths, set_path_is_relative_to_the_working_folder)
{
    /* From the copy's scenarios/ folder, policies/int4.lua on the command line names
       scenarios/policies/int4.lua, which does not exist: not the scenario folder's nor the checkout's. */
    char *t = edited_copy();
    char *dir = kvt_path(t, "scenarios");
    char *out = NULL;
    int rc = kvsim_in(dir, NULL, "validate quickstart.yaml --set policy.int4.file=policies/int4.lua", &out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "--set policy.int4.file") && strstr(out, "'policies/int4.lua' not found") &&
                  strstr(out, "working folder"), "%s", out);
    free(out);
    rc = kvsim_in(dir, NULL, "validate quickstart.yaml --set policy.int4.file=../policies/int4.lua", &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "EDITED-COPY"), "%s", out);
    free(out);
    free(dir);
    kvt_rmtree(t);
    free(t);
}

Test(paths, missing_policy_names_every_place_looked)
{
    char *t = edited_copy();
    char *out = NULL;
    int rc = kvsim_in(t, NULL, "validate scenarios/quickstart.yaml --set 'policies=[bf16, nosuch]'", &out);
    cr_expect_eq(rc, 2, "%s", out);
    char real[PATH_MAX];
    cr_assert(realpath(t, real));
    cr_expect(strstr(out, "policies/nosuch.lua") && strstr(out, "scenario's folder scenarios") &&
                  strstr(out, "working folder") && strstr(out, real) && strstr(out, "kvsim's data folder"),
              "%s", out);
    free(out);
    kvt_rmtree(t);
    free(t);
}

Test(paths, data_dir_from_the_environment)
{
    /* KVSIM_DATA_DIR: the copy is kvsim's data folder; run from an empty folder on a scenario of
       the copy given by absolute path, whose folder has no policies/. */
    char *t = edited_copy();
    char *empty = kvt_tempdir();
    char *env = NULL, *args = NULL, *out = NULL;
    cr_assert(asprintf(&env, "KVSIM_DATA_DIR='%s'", t) > 0);
    cr_assert(asprintf(&args, "validate '%s/scenarios/quickstart.yaml'", t) > 0);
    int rc = kvsim_in(empty, env, args, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "EDITED-COPY"), "%s", out);
    free(out);
    rc = kvsim_in(empty, env, "--version", &out);
    cr_expect_eq(rc, 0, "%s", out);
    char real[PATH_MAX];
    cr_assert(realpath(t, real));
    cr_expect(strstr(out, real) && strstr(out, "(KVSIM_DATA_DIR)") && !strstr(out, "(installed)"), "%s", out);
    free(out);
    free(env);
    free(args);
    kvt_rmtree(empty);
    free(empty);
    kvt_rmtree(t);
    free(t);
}

Test(paths, version_lists_the_places_in_order)
{
    char *out = NULL;
    int rc = kvsim_in("/tmp", "env -u KVSIM_DATA_DIR", "--version", &out);
    cr_expect_eq(rc, 0, "%s", out);
    char *inst = strstr(out, "(installed)"), *src = strstr(out, "(source tree)");
    cr_expect(strstr(out, "kvsim ") == out, "%s", out);
    cr_expect(inst && src && inst < src, "%s", out);
    char real[PATH_MAX];
    cr_assert(realpath(KV_SOURCE_DIR, real));
    /* the build tree's binary finds the source tree from its own location, not a compiled-in path */
    cr_expect(strstr(out, real), "%s", out);
    free(out);
}

Test(paths, installed_tree_works_alone, .timeout = 120)
{
    char *prefix = kvt_tempdir(), *elsewhere = kvt_tempdir();
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "cmake --install '%s' --prefix '%s' > /dev/null", KV_BINARY_DIR, prefix) > 0);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    const char *expect[] = {"bin/kvsim", "share/kvsim/policies/int4.lua", "share/kvsim/scenarios/quickstart.yaml",
                            "share/kvsim/scenarios/models/llama-3-8b.yaml", "share/kvsim/scenarios/devices/h100-sxm.yaml",
                            "share/kvsim/scripts/plot", "share/man/man1/kvsim.1"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        char *p = kvt_path(prefix, expect[i]);
        char *text = kvt_read(p, NULL);
        cr_expect(text, "make install did not install %s", expect[i]);
        if (text && strcmp(expect[i], "share/man/man1/kvsim.1") == 0)
            cr_expect(strstr(text, "validate"), "the man page lacks kvsim --help's commands");
        free(text);
        free(p);
    }
    /* The installed binary, from a folder that is neither the prefix nor the source tree, with no
       KVSIM_DATA_DIR and KVSIM pointing nowhere useful: everything comes from PREFIX/share/kvsim. */
    cr_assert(asprintf(&cmd, "cd '%s' && env -u KVSIM_DATA_DIR '%s/bin/kvsim' run '%s/share/kvsim/scenarios/quickstart.yaml' "
                       "--set workload.requests=3 --out run 2>&1", elsewhere, prefix, prefix) > 0);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    cr_expect_eq(pclose(p), 0, "%s\n%s", cmd, buf);
    free(cmd);
    char *results = kvt_path(elsewhere, "run/results.json");
    char *json = kvt_read(results, NULL);
    cr_assert(json, "no results.json: %s", buf);
    char *want = NULL;
    char real[PATH_MAX];
    cr_assert(realpath(prefix, real));
    cr_assert(asprintf(&want, "%s/share/kvsim/policies/int4.lua", real) > 0);
    cr_expect(strstr(json, want), "the installed run did not use %s: %s", want, json);
    cr_expect(!strstr(json, KV_SOURCE_DIR "/policies"), "the installed run used the source tree");
    free(want);
    free(json);
    free(results);
    cr_assert(asprintf(&cmd, "cd '%s' && env -u KVSIM_DATA_DIR '%s/bin/kvsim' --version", elsewhere, prefix) > 0);
    p = popen(cmd, "r");
    cr_assert(p);
    n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    pclose(p);
    free(cmd);
    cr_assert(asprintf(&want, "1. %s/share/kvsim (installed)\n", real) > 0);
    cr_expect(strstr(buf, want), "%s", buf);
    free(want);
    kvt_rmtree(elsewhere);
    kvt_rmtree(prefix);
    free(elsewhere);
    free(prefix);
}
