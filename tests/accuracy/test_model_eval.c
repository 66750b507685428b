/* test_model_eval.c — `kvsim eval`: the evaluation on the tiny random model (C API and command
 * line, deterministic), every bad input exiting 2 with a clear message, and a short run of the
 * real SmolLM2 model with the repository's policy files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/accuracy/eval.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

static kv_eval_result *run_tiny(kv_model *m, const char *text)
{
    kv_tensor_enc bf = {KV_TENSOR_BF16, 16, 0, 0, 0};
    kv_encoding *e_bf = kvt_uniform_encodings(m, (kv_encoding){.key = bf, .value = bf});
    kv_encoding *e_i4 = kvt_uniform_encodings(m, (kv_encoding){.key = {KV_TENSOR_INT, 4, 0, 16, 0}, .value = {KV_TENSOR_INT, 4, 0, 16, 0}});
    kv_encoding *e_ly = kvt_uniform_encodings(m, (kv_encoding){.key = {KV_TENSOR_INT, 8, 4, 16, 0}, .value = {KV_TENSOR_INT, 8, 4, 16, 0}});
    kv_encoding *e_dk = kvt_uniform_encodings(m, (kv_encoding){.key = {KV_TENSOR_INT, 8, 0, 16, 0}, .value = {KV_TENSOR_INT, 4, 0, 16, 0},
                                                 .diffkv = true, .key_low = {KV_TENSOR_INT, 4, 0, 16, 0},
                                                 .value_low = {KV_TENSOR_INT, 2, 0, 16, 0}, .alpha_high = 1.0,
                                                 .alpha_low = 0.02, .window = 8});
    kv_eval_policy pols[] = {{"int4", e_i4, 0}, {"bf16", e_bf, 0}, {"lynx", e_ly, 4}, {"diffkv", e_dk, 0}};
    const char *texts[] = {text};
    kv_eval_config cfg = {texts, 1, 48, 12, 6, 1, 160, 0, 3, 7, NULL};
    kv_eval_result *r;
    kv_error err;
    cr_assert_eq(kv_eval_run(m, &cfg, pols, 4, &r, &err), KV_OK, "%s", err.msg);
    kv_free(e_bf);
    kv_free(e_i4);
    kv_free(e_ly);
    kv_free(e_dk);
    return r;
}

Test(eval, tiny_model_api)
{
    char *dir = kvt_tempdir();
    char *model_path = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(model_path, &m, &err), KV_OK, "%s", err.msg);
    kv_eval_result *r = run_tiny(m, text);
    /* Rows: the bf16 policy first (the reference), then int4, lynx, lynx:anchor, diffkv. */
    cr_assert_eq(r->n_rows, 5);
    cr_assert_str_eq(r->rows[0].name, "bf16");
    cr_assert(r->rows[0].reference);
    cr_assert_str_eq(r->rows[1].name, "int4");
    cr_assert_str_eq(r->rows[2].name, "lynx");
    cr_assert_str_eq(r->rows[3].name, "lynx:anchor");
    cr_assert(r->rows[3].anchor_view);
    cr_assert_eq(r->prompts_text, 1);
    cr_assert_eq(r->prompts_needle, 1);
    const kv_eval_row *ref = &r->rows[0], *i4 = &r->rows[1], *ly = &r->rows[2], *dk = &r->rows[4];
    cr_assert_eq(ref->nll_count, 12);
    cr_assert_eq(ref->top1_agree, ref->top1_total);
    cr_assert_eq(ref->greedy_agree, ref->greedy_total);
    cr_assert_eq(kv_eval_row_ratio(ref, 2), 1.0);
    /* int4 with groups of 16 along head_dim 16: 8 + 4 bytes for 32 bf16 bytes. */
    cr_assert_float_eq(kv_eval_row_ratio(i4, 2), 32.0 / 12.0, 1e-12);
    cr_assert(isfinite(kv_eval_row_ppl(i4)));
    cr_assert_gt(kv_eval_layer_att_err(&i4->layers[1]), 0.0);
    /* Lynx: acceptance measured at 3 prompt lengths of 2 prompts, 4 positions, non-increasing. */
    cr_assert_eq(ly->spec_k, 4);
    cr_assert_eq(ly->spec_samples, 6);
    for (int j = 2; j <= 4; j++)
        cr_assert_leq(kv_eval_row_accept(ly, j), kv_eval_row_accept(ly, j - 1));
    cr_assert_eq(r->rows[3].spec_k, 0);
    cr_assert_gt(kv_eval_layer_att_err(&r->rows[3].layers[0]), kv_eval_layer_att_err(&ly->layers[0]));
    /* DiffKV: the window of 8 stays high, older tokens got tiers. */
    double low = 0, pruned = 0;
    for (int l = 0; l < 2; l++) {
        low += dk->layers[l].tokens_low;
        pruned += dk->layers[l].tokens_pruned;
    }
    cr_assert_gt(low + pruned, 0);
    double th, tl, tp;
    kv_eval_row_tiers(dk, 2, &th, &tl, &tp);
    cr_assert_float_eq(th + tl + tp, 1.0, 1e-12);
    cr_assert_gt(tl + tp, 0.0);
    /* The whole evaluation repeats exactly. */
    kv_eval_result *r2 = run_tiny(m, text);
    for (int i = 0; i < r->n_rows; i++) {
        cr_assert_eq(r->rows[i].nll_sum, r2->rows[i].nll_sum);
        cr_assert_eq(r->rows[i].greedy_agree, r2->rows[i].greedy_agree);
        cr_assert_eq(memcmp(r->rows[i].layers, r2->rows[i].layers, 2 * sizeof *r->rows[i].layers), 0);
    }
    char json[600];
    snprintf(json, sizeof json, "%s/accuracy.json", dir);
    cr_assert_eq(kv_eval_write_json(r, json, &err), KV_OK, "%s", err.msg);
    char *body = kvt_read(json, NULL);
    cr_assert(strstr(body, "\"policy\": \"lynx:anchor\"") && strstr(body, "\"spec_accept_rate\": ["), "%s", body);
    free(body);
    kv_eval_result_destroy(r);
    kv_eval_result_destroy(r2);
    kv_model_destroy(m);
    free(model_path);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* A scenario for the tiny model in dir; `extra` is appended to the accuracy section. */
static char *tiny_scenario(const char *dir, const char *model, const char *text, const char *policies,
                           const char *extra)
{
    char body[4096];
    snprintf(body, sizeof body,
             "seed: 3\nmodel: smollm2-135m\npolicies: [%s]\naccuracy:\n  model: %s\n  texts: [%s]\n  context_tokens: 48\n"
             "  score_tokens: 8\n  generate_tokens: 4\n  needle: {count: 1, context_tokens: 160}\n"
             "  speculation_points: 2\n%s",
             policies, model, text, extra);
    return kvt_write(dir, "scenario.yaml", body);
}

Test(eval, command_line_tiny_model)
{
    char *dir = kvt_tempdir();
    char *model = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir);
    char *sc = tiny_scenario(dir, model, text, "bf16, int4, kivi2, lynx, diffkv", "");
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "eval %s --out %s/res --quiet", sc, dir);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "%s", out);
    const char *rows[] = {"\nbf16 ", "\nint4 ", "\nkivi2 ", "\nlynx ", "\nlynx:anchor ", "\ndiffkv "};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        cr_assert(strstr(out, rows[i]), "no row '%s' in:\n%s", rows[i] + 1, out);
    cr_assert(strstr(out, "Lynx acceptance per speculative position, lynx"), "%s", out);
    cr_assert(strstr(out, "Attention output error per layer"), "%s", out);
    char json[600];
    snprintf(json, sizeof json, "%s/res/accuracy.json", dir);
    char *body = kvt_read(json, NULL);
    cr_assert_not_null(body);
    cr_assert(strstr(body, "\"reference\": \"bf16\""), "%s", body);
    /* Same scenario, same table. */
    char *again = NULL;
    cr_assert_eq(kvt_kvsim(args, &again), 0);
    cr_assert_str_eq(out, again);
    free(again);
    free(body);
    free(out);
    free(sc);
    free(model);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

static void expect_exit2(const char *args, const char *needle)
{
    char *out = NULL;
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 2, "kvsim %s exited %d:\n%s", args, rc, out);
    cr_assert(strstr(out, needle), "kvsim %s: output should mention '%s':\n%s", args, needle, out);
    cr_assert_null(strstr(out, "AddressSanitizer"), "%s", out);
    free(out);
}

Test(eval, bad_inputs_exit_2)
{
    char *dir = kvt_tempdir();
    char *model = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir), args[2048], path[600];
    /* A missing model file. */
    char *sc = tiny_scenario(dir, "/nonexistent/model.gguf", text, "bf16", "");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "/nonexistent/model.gguf");
    free(sc);
    /* Not a GGUF, a truncated GGUF, a GGUF whose header claims a huge tensor count. */
    size_t len;
    uint8_t *img = kvt_tiny_model_image(5, &len);
    struct {
        const char *name;
        size_t keep;
        const char *needle;
    } cases[] = {{"text.gguf", 0, "not a GGUF file"}, {"cut.gguf", len / 2, "past the end"}, {"hostile.gguf", len, "tensor count"}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        if (i == 0) {
            cr_assert_eq(kvt_write_file(path, "just some text, not a model\n", 28), 0);
        } else {
            uint8_t *copy = malloc(len);
            memcpy(copy, img, len);
            if (i == 2)
                memset(copy + 8, 0x7f, 8); /* tensor count */
            cr_assert_eq(kvt_write_file(path, copy, cases[i].keep), 0);
            free(copy);
        }
        sc = tiny_scenario(dir, path, text, "bf16", "");
        snprintf(args, sizeof args, "eval %s --quiet", sc);
        expect_exit2(args, cases[i].needle);
        free(sc);
    }
    free(img);
    /* A tensor of a type ggml does not define. */
    kvt_gguf w;
    kvt_gguf_init(&w);
    kvt_tiny_hparams(&w);
    kvt_tiny_tokenizer(&w);
    uint64_t dims[2] = {KVT_TINY_DIM, KVT_TINY_VOCAB};
    static uint8_t blob[64];
    kvt_tensor_info(&w, "token_embd.weight", 2, dims, 77, 0);
    kvt_put(&w.data, blob, sizeof blob);
    uint8_t *odd = kvt_gguf_image(&w, &len);
    kvt_gguf_free(&w);
    snprintf(path, sizeof path, "%s/type77.gguf", dir);
    cr_assert_eq(kvt_write_file(path, odd, len), 0);
    free(odd);
    sc = tiny_scenario(dir, path, text, "bf16", "");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "unknown tensor type 77");
    free(sc);
    /* An empty text. */
    char *empty = kvt_write(dir, "empty.txt", "");
    sc = tiny_scenario(dir, model, empty, "bf16", "");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "is empty");
    free(sc);
    free(empty);
    /* A text too short for the prompt. */
    char *tiny_text = kvt_write(dir, "short.txt", "a few words");
    sc = tiny_scenario(dir, model, tiny_text, "bf16", "");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "are needed");
    free(sc);
    free(tiny_text);
    /* An unknown key, with a hint; a bad number; a missing section; a missing policy. */
    sc = tiny_scenario(dir, model, text, "bf16", "  genrate_tokens: 3\n");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "did you mean 'generate_tokens'");
    free(sc);
    sc = tiny_scenario(dir, model, text, "bf16", "  speculative_positions: -1\n");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "out of range");
    free(sc);
    /* eval reads the scenario as run does: --set reaches the accuracy section and the policies (#18). */
    sc = tiny_scenario(dir, model, text, "bf16", "");
    snprintf(args, sizeof args, "eval %s --quiet --set accuracy.speculative_positions=-1", sc);
    expect_exit2(args, "out of range");
    snprintf(args, sizeof args, "eval %s --quiet --set policies=[bf16,nosuchpolicy]", sc);
    expect_exit2(args, "policies/nosuchpolicy.lua");
    free(sc);
    sc = kvt_write(dir, "nomodel.yaml", "policies: [bf16]\naccuracy: {context_tokens: 48}\n");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "missing required key 'model'");
    free(sc);
    sc = kvt_write(dir, "noacc.yaml", "model: smollm2-135m\npolicies: [bf16]\n");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "accuracy: missing");
    free(sc);
    sc = tiny_scenario(dir, model, text, "bf16, nosuchpolicy", "");
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    expect_exit2(args, "policies/nosuchpolicy.lua");
    free(sc);
    snprintf(args, sizeof args, "eval %s/missing.yaml", dir);
    expect_exit2(args, "missing.yaml");
    expect_exit2("eval", "usage: kvsim eval");
    free(model);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* kvsim eval loads the policies under the scenario's policy_limits, as kvsim run does. */
Test(eval, scenario_policy_limits_apply)
{
    char *dir = kvt_tempdir();
    char *model = kvt_tiny_model_file(dir, 5), *text = kvt_tiny_model_text(dir), args[2048], extra[1024];
    /* About 60000 instructions at the top level: fine under the default budget (10 x 1e6 while loading). */
    char *lua = kvt_write(dir, "loopy.lua", "local n = 0\nfor i = 1, 20000 do n = n + i end\nreturn {}\n");
    snprintf(extra, sizeof extra, "policy:\n  loopy: {file: %s}\n", lua);
    const char *limits[] = {"", "policy_limits: {instructions: 1000}\n", "policy_limits: {hook_ms: 1}\n"};
    for (int i = 0; i < 3; i++) {
        char tail[1200];
        snprintf(tail, sizeof tail, "%s%s", extra, limits[i]);
        char *sc = tiny_scenario(dir, model, text, "bf16, loopy", tail);
        snprintf(args, sizeof args, "eval %s --quiet", sc);
        if (i == 0) {
            char *out = NULL;
            int rc = kvt_kvsim(args, &out);
            cr_expect_eq(rc, 0, "%s", out);
            free(out);
        } else if (i == 1) {
            expect_exit2(args, "loopy.lua:2: policy 'loopy' used up its instruction budget (10000) while loading");
        } else {
            expect_exit2(args, "policy_limits.hook_ms: 1 is out of range [10, 1e+09]");
        }
        free(sc);
    }
    free(lua);
    free(model);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

/* The real model with the repository's policy files, small sizes: the table
   has every row, bf16 is the reference, and int4 compresses 3.2x. */
Test(eval, real_model_short_run, .timeout = 300)
{
    char reason[4096];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    char *dir = kvt_tempdir();
    char body[4096];
    snprintf(body, sizeof body,
             "model: smollm2-135m\npolicies: [bf16, int4, lynx]\naccuracy:\n  model: %s\n"
             "  texts: [%s/tests/model_fixture.h]\n  context_tokens: 64\n  score_tokens: 8\n  generate_tokens: 4\n"
             "  needle: {count: 0, context_tokens: 64}\n  speculative_positions: 4\n  speculation_points: 1\n",
             path, KV_SOURCE_DIR);
    char *sc = kvt_write(dir, "real.yaml", body), args[2048], *out = NULL;
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\nbf16                1.00x"), "%s", out);
    cr_assert(strstr(out, "\nint4                3.20x"), "%s", out);
    cr_assert(strstr(out, "\nlynx:anchor"), "%s", out);
    cr_assert(strstr(out, "(1 speculations;"), "%s", out);
    free(out);
    free(sc);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

/* The table line of row `name` (from "\nname " to the end of the line), or "". */
static void row_line(const char *out, const char *name, char *line, size_t len)
{
    char key[64];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(out, key);
    line[0] = '\0';
    if (p) {
        p++;
        size_t n = strcspn(p, "\n");
        snprintf(line, len, "%.*s", (int)n, p);
    }
}

/* Runs `kvsim eval` on the real model with the policies given and OpenBLAS at
   `threads` threads; returns the output (free it). */
static char *real_eval(const char *dir, const char *model, const char *policies, int threads)
{
    char body[4096];
    snprintf(body, sizeof body,
             "seed: 1\nmodel: smollm2-135m\npolicies: [%s]\naccuracy:\n  model: %s\n  texts: [%s/tests/model_fixture.h]\n"
             "  context_tokens: 256\n  score_tokens: 16\n  generate_tokens: 8\n"
             "  needle: {count: 0, context_tokens: 64}\n  speculative_positions: 4\n  speculation_points: 2\n",
             policies, model, KV_SOURCE_DIR);
    char *sc = kvt_write(dir, "rows.yaml", body), args[4096], *out = NULL;
    snprintf(args, sizeof args, "eval %s --quiet", sc);
    char n[16];
    snprintf(n, sizeof n, "%d", threads);
    setenv("OPENBLAS_NUM_THREADS", n, 1);
    int rc = kvt_kvsim(args, &out);
    unsetenv("OPENBLAS_NUM_THREADS");
    cr_assert_eq(rc, 0, "%s", out);
    free(sc);
    return out;
}

/* A policy's row does not depend on the policies beside it nor on the BLAS
   thread count: the same table with 1 and 2 OpenBLAS threads, int4's row the
   same alone and among others, and lynx's merged row (its planes are int8's
   codes) equal to int8's but for the KV ratio. */
Test(eval, real_model_rows_independent, .timeout = 300)
{
    char reason[4096];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    char *dir = kvt_tempdir();
    char *one = real_eval(dir, path, "bf16, int8, int4, lynx, diffkv", 1);
    char *two = real_eval(dir, path, "bf16, int8, int4, lynx, diffkv", 2);
    char *alone = real_eval(dir, path, "bf16, int4", 2);
    const char *names[] = {"bf16", "int8", "int4", "lynx", "lynx:anchor", "diffkv"};
    char a[512], b[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        row_line(one, names[i], a, sizeof a);
        row_line(two, names[i], b, sizeof b);
        cr_assert(a[0], "no row %s in:\n%s", names[i], one);
        cr_assert_str_eq(a, b, "row %s differs with 1 and 2 OpenBLAS threads:\n%s\n%s", names[i], a, b);
    }
    cr_assert_str_eq(one, two, "the tables with 1 and 2 OpenBLAS threads differ");
    row_line(one, "int4", a, sizeof a);
    row_line(alone, "int4", b, sizeof b);
    cr_assert_str_eq(a, b, "int4's row alone differs from int4's row among five policies:\n%s\n%s", b, a);
    row_line(one, "int8", a, sizeof a);
    row_line(one, "lynx", b, sizeof b);
    /* %-16s name, " %8s" KV ratio, then ppl, delta, ...: compare from the ppl on */
    cr_assert(strlen(a) > 30 && strlen(b) > 30);
    cr_assert_str_eq(a + 25, b + 25, "int8 and lynx rows differ beyond the KV ratio:\n%s\n%s", a, b);
    free(one);
    free(two);
    free(alone);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
