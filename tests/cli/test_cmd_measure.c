/* test_cmd_measure.c — `kvsim measure` on the tiny fixture model: the file it writes reads back with one Lynx
 * entry per speculating split and one DiffKV entry, each at every length; an existing file keeps the entries
 * not measured again; bad flags exit 2; a failed run leaves an existing --out as it was. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/accuracy/model_stats.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

typedef struct env {
    char *dir, *model, *scenario, *out;
} env;

/* A temp folder with the tiny model, its own feed cache, and a scenario of two Lynx splits (one twice, under
   another name), a plain policy and DiffKV with window 16, all measured on the tiny model. */
static env setup(void)
{
    env e;
    e.dir = kvt_tempdir();
    e.model = kvt_tiny_model_file(e.dir, 11);
    cr_assert(e.model);
    char text[4096];
    snprintf(text, sizeof text,
             "name: measure\nmodel: llama-3-8b\nseed: 1\n"
             "network: {model: ideal, nic_bandwidth_gbps: 100}\n"
             "workload: {requests: 1, prompt: {dist: fixed, value: 128}, output: {dist: fixed, value: 8}}\n"
             "accuracy: {model: %s}\n"
             "policies: [int8, a4, a2, a4copy, dkv]\n"
             "policy:\n"
             "  a4: {file: policies/lynx.lua, anchor_bits: 4, speculate: 3}\n"
             "  a2: {file: policies/lynx.lua, anchor_bits: 2, speculate: 3}\n"
             "  a4copy: {file: policies/lynx-ordered.lua, speculate: 3}\n"
             "  dkv: {file: policies/diffkv.lua, window: 16}\n",
             e.model);
    e.scenario = kvt_write(e.dir, "measure.yaml", text);
    e.out = kvt_path(e.dir, "stats.json");
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", e.dir);
    setenv("KVSIM_CACHE_DIR", cache, 1);
    return e;
}

static void teardown(env *e)
{
    kvt_rmtree(e->dir);
    free(e->dir);
    free(e->model);
    free(e->scenario);
    free(e->out);
    unsetenv("KVSIM_CACHE_DIR");
}

static int measure(const env *e, const char *more, char **output)
{
    char args[8192];
    snprintf(args, sizeof args, "measure %s --out %s --quiet %s", e->scenario, e->out, more);
    return kvt_kvsim(args, output);
}

Test(cmd_measure, writes_a_file_that_reads_back_one_entry_per_split_and_window, .timeout = 600)
{
    env e = setup();
    char *out = NULL;
    cr_assert_eq(measure(&e, "--lengths 64,128 --samples 4", &out), 0, "%s", out);
    kv_model_stats st;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(e.out, &st, &err), 0, "%s", err.msg);
    cr_expect_eq(st.model.layers, KVT_TINY_LAYERS);
    cr_expect_eq(st.model.kv_heads, KVT_TINY_KV_HEADS);
    cr_expect_eq(strlen(st.model.sha256), 64, "the model's SHA-256: '%s'", st.model.sha256);
    cr_expect(strstr(st.command, "kvsim measure") && strstr(st.command, "--lengths 64,128"), "%s", st.command);
    cr_expect(strncmp(st.tool, "kvsim ", 6) == 0, "%s", st.tool);
    cr_expect_eq(st.n_texts, 4, "the four licence texts");
    for (size_t i = 0; i < st.n_texts; i++)
        cr_expect(strlen(st.texts[i].sha256) == 64 && st.texts[i].tokens > 1000, "%s", st.texts[i].name);
    /* a4 and a4copy have the same encodings and k: one entry; int8 does not speculate. */
    cr_assert_eq(st.n_lynx, 2, "one Lynx entry per distinct split");
    for (size_t i = 0; i < st.n_lynx; i++) {
        const kv_accept_curve *c = &st.lynx[i].curve;
        cr_expect_eq(c->positions, 3);
        cr_assert_eq(c->n_lengths, 2);
        cr_expect(c->lengths[0] == 64 && c->lengths[1] == 128);
        for (int l = 0; l < 2; l++) {
            cr_expect_eq(c->samples[l], 4, "4 speculations per length");
            for (int j = 0; j < 3; j++)
                cr_expect(c->accept[l][j] >= 0 && c->accept[l][j] <= 1);
        }
    }
    cr_assert_eq(st.n_diffkv, 1);
    cr_expect_eq(st.diffkv[0].curve.window, 16);
    cr_expect_eq(st.diffkv[0].curve.n_lengths, 2);
    cr_expect(st.diffkv[0].curve.lengths[0] == 64 && st.diffkv[0].curve.lengths[1] == 128);
    kv_model_stats_free(&st);
    free(out);

    /* Again with a4 alone at one length: its entry is replaced, a2's and DiffKV's stay. */
    char *before = kvt_read(e.out, NULL);
    cr_assert_eq(measure(&e, "--lengths 96 --samples 4 --set 'policies=[a4]'", &out), 0, "%s", out);
    cr_assert_eq(kv_model_stats_read(e.out, &st, &err), 0, "%s", err.msg);
    cr_expect_eq(st.n_lynx, 2);
    cr_expect_eq(st.n_diffkv, 1);
    int one = 0, two = 0;
    for (size_t i = 0; i < st.n_lynx; i++) {
        one += st.lynx[i].curve.n_lengths == 1 && st.lynx[i].curve.lengths[0] == 96;
        two += st.lynx[i].curve.n_lengths == 2;
    }
    cr_expect(one == 1 && two == 1, "a4 measured again at 96 only, a2 kept at 64 and 128");
    cr_expect_eq(st.diffkv[0].curve.n_lengths, 2, "the DiffKV entry kept");
    kv_model_stats_free(&st);
    free(before);
    free(out);
    teardown(&e);
}

Test(cmd_measure, bad_flags_exit_2_and_write_nothing)
{
    env e = setup();
    const char *bad[] = {"--lengths 128,64", "--lengths 64,", "--lengths x", "--lengths ''", "--samples 5",
                         "--samples 0", "--samples 68", "--frobnicate"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        cr_expect_eq(measure(&e, bad[i], &out), 2, "%s: %s", bad[i], out);
        cr_expect(strstr(out, "kvsim measure") != NULL, "%s: the message names the command: %s", bad[i], out);
        free(out);
    }
    char *out = NULL, args[4200];
    snprintf(args, sizeof args, "measure %s --quiet", e.scenario);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "--out is needed: %s", out);
    cr_expect(strstr(out, "--out") != NULL, "%s", out);
    free(out);
    cr_expect_null(kvt_read(e.out, NULL), "no file written");
    teardown(&e);
}

Test(cmd_measure, a_failed_run_leaves_an_existing_out_as_it_was, .timeout = 600)
{
    env e = setup();
    char *out = NULL;
    /* Not a statistics file: exit 2, kept byte for byte. */
    free(kvt_write(e.dir, "stats.json", "{\"not\": \"stats\"}\n"));
    cr_expect_eq(measure(&e, "--lengths 64 --samples 4", &out), 2, "%s", out);
    cr_expect(strstr(out, "stats.json") != NULL, "the message names the file: %s", out);
    char *now = kvt_read(e.out, NULL);
    cr_expect(now && strcmp(now, "{\"not\": \"stats\"}\n") == 0, "left as it was: %s", now);
    free(now);
    free(out);
    /* A good file, then a run that fails (the model is gone): the file keeps its bytes, no temporary is left. */
    remove(e.out);
    cr_assert_eq(measure(&e, "--lengths 64 --samples 4 --set 'policies=[a2]'", &out), 0, "%s", out);
    free(out);
    size_t n0 = 0, n1 = 0;
    char *good = kvt_read(e.out, &n0);
    char args[8192];
    snprintf(args, sizeof args, "measure %s --out %s --quiet --lengths 64 --samples 4 --set accuracy.model=%s/gone.gguf",
             e.scenario, e.out, e.dir);
    cr_expect_neq(kvt_kvsim(args, &out), 0, "%s", out);
    char *after = kvt_read(e.out, &n1);
    cr_expect(after && n0 == n1 && memcmp(good, after, n0) == 0, "the existing file is unchanged");
    char *names = kvt_listing(e.dir);
    cr_expect_str_eq(names, "cache measure.yaml stats.json tiny.gguf", "nothing else was left");
    free(names);
    free(good);
    free(after);
    free(out);
    teardown(&e);
}
