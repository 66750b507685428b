/* test_model_forward.c — the forward pass: batched prefill equals step-by-step decode, sequences
 * in one batch do not interfere, runs repeat bit for bit, bad models and inputs fail cleanly,
 * and the real SmolLM2 model answers a short prompt with the recorded greedy tokens. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/refmodel/model.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

static kv_model *tiny_model(char **dir_out)
{
    char *dir = kvt_tempdir();
    char *path = kvt_tiny_model_file(dir, 11);
    cr_assert_not_null(path);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(path, &m, &err), KV_OK, "%s", err.msg);
    free(path);
    *dir_out = dir;
    return m;
}

static void tiny_done(kv_model *m, char *dir)
{
    kv_model_destroy(m);
    kvt_rmtree(dir);
    free(dir);
}

static kv_kvstore *exact_store(const kv_model *m)
{
    kv_kvstore_shape sh = kv_model_kv_shape(m);
    kv_kvstore *s;
    kv_error err;
    cr_assert_eq(kv_kvstore_create(&sh, NULL, 0, &s, &err), KV_OK, "%s", err.msg);
    return s;
}

static float max_rel_diff(const float *a, const float *b, size_t n)
{
    float scale = 0, diff = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmaxf(scale, fabsf(b[i]));
        diff = fmaxf(diff, fabsf(a[i] - b[i]));
    }
    return diff / (scale > 0 ? scale : 1);
}

Test(forward, tiny_config)
{
    char *dir;
    kv_model *m = tiny_model(&dir);
    const kv_model_config *c = kv_model_get_config(m);
    cr_assert_eq(c->n_layers, KVT_TINY_LAYERS);
    cr_assert_eq(c->dim, KVT_TINY_DIM);
    cr_assert_eq(c->n_kv_heads, KVT_TINY_KV_HEADS);
    cr_assert_eq(c->head_dim, KVT_TINY_DIM / KVT_TINY_HEADS);
    cr_assert_eq(c->vocab, KVT_TINY_VOCAB);
    cr_assert_eq(c->context_length, KVT_TINY_CTX);
    tiny_done(m, dir);
}

/* The prefill path (exact attention through sgemm, all rows at once) and the
   decode path (one row at a time over the stored KV) give the same logits. */
Test(forward, prefill_equals_stepwise_decode)
{
    char *dir;
    kv_model *m = tiny_model(&dir);
    int V = kv_model_get_config(m)->vocab, n = 40;
    int32_t tokens[40], pos[40], seq[40] = {0};
    uint64_t seed = 1;
    for (int i = 0; i < n; i++) {
        tokens[i] = (int32_t)((kvt_rand(&seed) + 1.0f) * 0.5f * (float)(V - 1));
        pos[i] = i;
    }
    float *all = malloc((size_t)n * V * sizeof *all), *one = malloc((size_t)V * sizeof *one);
    kv_kvstore *a = exact_store(m), *b = exact_store(m);
    kv_error err;
    kv_batch batch = {n, tokens, pos, seq, NULL};
    cr_assert_eq(kv_model_forward(m, &batch, &a, all, &err), KV_OK, "%s", err.msg);
    /* Step by step: first token as a prefill of one row, then sealed decode. */
    kv_batch first = {1, tokens, pos, seq, NULL};
    cr_assert_eq(kv_model_forward(m, &first, &b, one, &err), KV_OK);
    cr_assert_lt(max_rel_diff(one, all, (size_t)V), 1e-5);
    kv_kvstore_seal(b); /* exact store: sealing keeps fp32, attention takes the stored path */
    for (int i = 1; i < n; i++) {
        kv_batch step = {1, tokens + i, pos + i, seq, NULL};
        cr_assert_eq(kv_model_forward(m, &step, &b, one, &err), KV_OK, "%s", err.msg);
        float d = max_rel_diff(one, all + (size_t)i * V, (size_t)V);
        cr_assert_lt(d, 1e-4, "row %d differs by %g", i, (double)d);
        cr_assert_eq(kv_argmax(one, V), kv_argmax(all + (size_t)i * V, V));
    }
    cr_assert_eq(kv_kvstore_length(b), n);
    kv_kvstore_destroy(a);
    kv_kvstore_destroy(b);
    free(all);
    free(one);
    tiny_done(m, dir);
}

/* A decode row's logits are the same bit for bit alone and batched beside
   other sequences (rows of several sequences used to be one sgemm, whose
   rounding of a row varies with the matrix's height). */
Test(forward, decode_row_same_alone_and_batched)
{
    char *dir;
    kv_model *m = tiny_model(&dir);
    int V = kv_model_get_config(m)->vocab;
    enum { S = 5, P = 24 };
    int32_t prompt[P], pos[P], zeros[P] = {0};
    for (int i = 0; i < P; i++) {
        prompt[i] = (int32_t)(3 + 7 * i) % V;
        pos[i] = i;
    }
    float *alone = malloc((size_t)S * V * sizeof *alone), *batched = malloc((size_t)S * V * sizeof *batched);
    float *pre = malloc((size_t)P * V * sizeof *pre);
    int32_t tok[S], dpos[S], dseq[S];
    kv_error err;
    for (int rep = 0; rep < 2; rep++) {
        kv_kvstore *st[S];
        for (int s = 0; s < S; s++) { /* every sequence: the same prompt, then its own next token */
            st[s] = exact_store(m);
            kv_batch b = {P - s, prompt, pos, zeros, NULL};
            cr_assert_eq(kv_model_forward(m, &b, &st[s], pre, &err), KV_OK, "%s", err.msg);
            tok[s] = (int32_t)(11 + 13 * s) % V;
            dpos[s] = P - s;
            dseq[s] = s;
        }
        if (rep == 0) {
            for (int s = 0; s < S; s++) {
                int32_t zero = 0;
                kv_batch one = {1, &tok[s], &dpos[s], &zero, NULL};
                cr_assert_eq(kv_model_forward(m, &one, &st[s], alone + (size_t)s * V, &err), KV_OK, "%s", err.msg);
            }
        } else {
            kv_batch all = {S, tok, dpos, dseq, NULL};
            cr_assert_eq(kv_model_forward(m, &all, st, batched, &err), KV_OK, "%s", err.msg);
        }
        for (int s = 0; s < S; s++)
            kv_kvstore_destroy(st[s]);
    }
    for (int s = 0; s < S; s++)
        cr_assert_eq(memcmp(alone + (size_t)s * V, batched + (size_t)s * V, (size_t)V * sizeof *alone), 0,
                     "sequence %d: its logits alone differ from its logits batched with %d others", s, S - 1);
    free(alone);
    free(batched);
    free(pre);
    tiny_done(m, dir);
}

/* Two sequences in one batch give what each gives alone, and repeated runs are
   bit-for-bit identical. */
Test(forward, batched_sequences_and_determinism)
{
    char *dir;
    kv_model *m = tiny_model(&dir);
    int V = kv_model_get_config(m)->vocab;
    int32_t t1[5] = {10, 20, 30, 40, 50}, t2[3] = {7, 8, 9}, p[5] = {0, 1, 2, 3, 4};
    int32_t zeros[8] = {0};
    float *l1 = malloc((size_t)5 * V * 4), *l2 = malloc((size_t)3 * V * 4), *lb = malloc((size_t)8 * V * 4);
    float *lb2 = malloc((size_t)8 * V * 4);
    kv_error err;
    kv_kvstore *s1 = exact_store(m), *s2 = exact_store(m);
    kv_batch b1 = {5, t1, p, zeros, NULL}, b2 = {3, t2, p, zeros, NULL};
    cr_assert_eq(kv_model_forward(m, &b1, &s1, l1, &err), KV_OK);
    cr_assert_eq(kv_model_forward(m, &b2, &s2, l2, &err), KV_OK);
    for (int rep = 0; rep < 2; rep++) {
        kv_kvstore *st[2] = {exact_store(m), exact_store(m)};
        int32_t tok[8] = {10, 20, 30, 40, 50, 7, 8, 9}, pos[8] = {0, 1, 2, 3, 4, 0, 1, 2}, seq[8] = {0, 0, 0, 0, 0, 1, 1, 1};
        kv_batch bb = {8, tok, pos, seq, NULL};
        cr_assert_eq(kv_model_forward(m, &bb, st, rep ? lb2 : lb, &err), KV_OK, "%s", err.msg);
        kv_kvstore_destroy(st[0]);
        kv_kvstore_destroy(st[1]);
    }
    cr_assert_lt(max_rel_diff(lb, l1, (size_t)5 * V), 1e-5);
    cr_assert_lt(max_rel_diff(lb + (size_t)5 * V, l2, (size_t)3 * V), 1e-5);
    cr_assert_eq(memcmp(lb, lb2, (size_t)8 * V * 4), 0, "two identical runs differ");
    kv_kvstore_destroy(s1);
    kv_kvstore_destroy(s2);
    free(l1);
    free(l2);
    free(lb);
    free(lb2);
    tiny_done(m, dir);
}

Test(forward, bad_batches)
{
    char *dir;
    kv_model *m = tiny_model(&dir);
    int V = kv_model_get_config(m)->vocab;
    float *logits = malloc((size_t)4 * V * 4);
    kv_kvstore *st[2] = {exact_store(m), exact_store(m)};
    kv_error err;
    int32_t tok[2] = {5, 100000}, pos[2] = {0, 1}, seq[2] = {0, 0};
    kv_batch b = {2, tok, pos, seq, NULL};
    cr_assert_eq(kv_model_forward(m, &b, st, logits, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "100000"), "%s", err.msg);
    int32_t tok2[2] = {5, 6}, far[2] = {0, KVT_TINY_CTX};
    kv_batch b2 = {2, tok2, far, seq, NULL};
    cr_assert_eq(kv_model_forward(m, &b2, st, logits, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "context length"), "%s", err.msg);
    int32_t back[2] = {3, 2};
    kv_batch b3 = {2, tok2, back, seq, NULL};
    cr_assert_eq(kv_model_forward(m, &b3, st, logits, &err), KV_EINPUT);
    int32_t tok3[3] = {1, 2, 3}, pos3[3] = {0, 0, 1}, split[3] = {0, 1, 0};
    kv_batch b4 = {3, tok3, pos3, split, NULL};
    cr_assert_eq(kv_model_forward(m, &b4, st, logits, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "contiguous"), "%s", err.msg);
    /* Nothing was appended by the refused batches. */
    cr_assert_eq(kv_kvstore_length(st[0]), 0);
    kv_kvstore_destroy(st[0]);
    kv_kvstore_destroy(st[1]);
    free(logits);
    tiny_done(m, dir);
}

static void expect_bad_model(const kvt_tiny_faults *f, const char *arch, const char *needle)
{
    kvt_gguf g;
    kvt_gguf_init(&g);
    if (arch) {
        kvt_kv_str(&g, "general.architecture", arch);
        kvt_kv_u32(&g, "llama.block_count", 1);
    } else {
        kvt_tiny_hparams(&g);
    }
    kvt_tiny_tokenizer(&g);
    kvt_tiny_weights_faulty(&g, 3, f);
    size_t len;
    uint8_t *img = kvt_gguf_image(&g, &len);
    kvt_gguf_free(&g);
    char *dir = kvt_tempdir();
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    cr_assert_eq(kvt_write_file(path, img, len), 0);
    kv_model *m = NULL;
    kv_error err;
    cr_assert_eq(kv_model_load(path, &m, &err), KV_EINPUT, "a bad model loaded (%s)", needle);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, needle) && strstr(err.msg, "bad.gguf"), "'%s' should mention '%s'", err.msg, needle);
    free(img);
    kvt_rmtree(dir);
    free(dir);
}

Test(forward, bad_models)
{
    kvt_tiny_faults skip = {"blk.1.ffn_up.weight", NULL};
    expect_bad_model(&skip, NULL, "'blk.1.ffn_up.weight' is missing");
    kvt_tiny_faults widen = {NULL, "blk.0.attn_k.weight"};
    expect_bad_model(&widen, NULL, "blk.0.attn_k.weight' has shape");
    expect_bad_model(NULL, "gptj", "'gptj' is not supported");
    kv_model *m = NULL;
    kv_error err;
    cr_assert_eq(kv_model_load("/nonexistent/x.gguf", &m, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "cannot open"), "%s", err.msg);
}

/* The real model, chat prompt, greedy: "The capital of France is Paris." then
   <|im_end|>. Recorded from this implementation; llama.cpp's llama-simple
   prints the same text for the same prompt. Every recorded step's top-1
   logit leads the runner-up by more than 1.5. */
Test(forward, real_model_greedy_output, .timeout = 120)
{
    char reason[4096];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    kv_model *m;
    kv_error err;
    cr_assert_eq(kv_model_load(path, &m, &err), KV_OK, "%s", err.msg);
    free(path);
    const kv_model_config *c = kv_model_get_config(m);
    cr_assert_eq(c->n_layers, 30);
    cr_assert_eq(c->dim, 576);
    cr_assert_eq(c->n_heads, 9);
    cr_assert_eq(c->n_kv_heads, 3);
    cr_assert_eq(c->vocab, 49152);
    const char *prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    int32_t *ids;
    size_t n;
    cr_assert_eq(kv_tokenizer_encode(kv_model_tokenizer(m), prompt, strlen(prompt), true, &ids, &n, &err), KV_OK);
    const int32_t want[] = {504, 3575, 282, 4649, 314, 7042, 30, 2};
    int n_want = (int)(sizeof want / sizeof want[0]);
    kv_kvstore *s = exact_store(m);
    int32_t *pos = malloc(n * sizeof *pos), *seq = calloc(n, sizeof *seq);
    uint8_t *wanted = calloc(n, 1);
    for (size_t i = 0; i < n; i++)
        pos[i] = (int32_t)i;
    wanted[n - 1] = 1;
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    kv_batch b = {(int)n, ids, pos, seq, wanted};
    cr_assert_eq(kv_model_forward(m, &b, &s, logits, &err), KV_OK, "%s", err.msg);
    kv_kvstore_seal(s);
    int32_t got[8], p = (int32_t)n;
    for (int i = 0; i < n_want; i++) {
        got[i] = kv_argmax(logits, c->vocab);
        if (got[i] != want[i])
            break;
        kv_batch step = {1, &got[i], &p, seq, NULL};
        cr_assert_eq(kv_model_forward(m, &step, &s, logits, &err), KV_OK);
        p++;
    }
    char *text = kv_tokenizer_decode(kv_model_tokenizer(m), got, (size_t)n_want, NULL);
    for (int i = 0; i < n_want; i++)
        cr_assert_eq(got[i], want[i], "greedy token %d is %d, recorded %d (text so far: '%s')", i, got[i], want[i],
                     text);
    cr_assert_str_eq(text, "The capital of France is Paris.<|im_end|>");
    kv_free(text);
    kv_free(ids);
    free(pos);
    free(seq);
    free(wanted);
    free(logits);
    kv_kvstore_destroy(s);
    kv_model_destroy(m);
}
