/* test_didyoumean.c — the one "did you mean" rule (core/base/didyoumean.h) and that every reader of names uses it. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/base/didyoumean.h"
#include "core/base/error.h"
#include "core/study/sweep.h"
#include "tests/support.h"

static const char *const keys[] = {"seed", "matrix", "generate_tokens", "mode", "model"};
#define NKEYS (sizeof keys / sizeof keys[0])

Test(didyoumean, transpositions_cost_one)
{
    cr_expect_str_eq(kv_did_you_mean("sede", keys, NKEYS), "seed");
    cr_expect_str_eq(kv_did_you_mean("matirx", keys, NKEYS), "matrix");
    cr_expect_str_eq(kv_did_you_mean("mdoel", keys, NKEYS), "model");
}

Test(didyoumean, limit_grows_with_length)
{
    /* 4 characters: one edit at most. */
    cr_expect_null(kv_did_you_mean("sxdx", keys, NKEYS));
    /* 15 characters: three edits allowed. */
    cr_expect_str_eq(kv_did_you_mean("genrate_tokns", keys, NKEYS), "generate_tokens");
    cr_expect_null(kv_did_you_mean("zzzzzzzz", keys, NKEYS));
}

Test(didyoumean, ties_go_to_the_first_candidate)
{
    static const char *const ab[] = {"ab", "ac"};
    cr_expect_str_eq(kv_did_you_mean("aa", ab, 2), "ab");
    static const char *const ba[] = {"ac", "ab"};
    cr_expect_str_eq(kv_did_you_mean("aa", ba, 2), "ac");
}

Test(didyoumean, long_words_never_match)
{
    char w[80];
    memset(w, 'a', sizeof w - 1);
    w[sizeof w - 1] = '\0';
    const char *const c[] = {w};
    cr_expect_null(kv_did_you_mean(w, c, 1));
    cr_expect_null(kv_did_you_mean("x", NULL, 0));
}

/* A sweep file's keys are suggested by the same rule: a transposition is one edit
   (the sweep reader used to suggest only by a shared prefix or a substring). */
Test(didyoumean, sweep_keys_use_the_rule)
{
    char *dir = kvt_tempdir();
    char *base = kvt_write(dir, "base.yaml", "name: b\n");
    char *path = kvt_write(dir, "sweep.yaml", "base: base.yaml\nnmae: x\n");
    kv_sweep *sw = NULL;
    kv_error err = {0};
    int rc = kv_sweep_load(path, NULL, 0, NULL, "/bin/kvsim", &sw, &err);
    cr_expect_eq(rc, KV_EINPUT);
    cr_expect_null(sw);
    cr_expect(strstr(err.msg, "sweep.yaml:2:1: unknown key 'nmae' (did you mean 'name'?)") != NULL, "got: %s",
              err.msg);
    kv_sweep_destroy(sw);
    free(base);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
