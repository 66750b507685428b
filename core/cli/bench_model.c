/* bench_model.c — `kvsim bench model`: prefill and decode tokens per second of the reference model,
 * each beside what this machine's BLAS and memory reach in the same run. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/alloc.h"
#include "core/cli/commands.h"
#include "core/accuracy/eval_config.h"
#include "core/refmodel/model.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Prompt tokens: a Debian licence text when present, else the vocabulary in order. */
static int32_t *prompt_tokens(const kv_model *m, int n)
{
    int32_t *out = kv_malloc((size_t)n * sizeof *out);
    FILE *f = fopen("/usr/share/common-licenses/GPL-3", "rb");
    size_t got = 0;
    if (f) {
        char *buf = kv_malloc(1 << 20);
        size_t len = fread(buf, 1, (1 << 20) - 1, f);
        fclose(f);
        int32_t *ids;
        kv_tokenizer_encode(kv_model_tokenizer(m), buf, len, false, &ids, &got, NULL);
        for (size_t i = 0; i < (size_t)n && i < got; i++)
            out[i] = ids[i];
        kv_free(ids);
        kv_free(buf);
    }
    for (size_t i = got; i < (size_t)n; i++)
        out[i] = (int32_t)(100 + i % 20000);
    return out;
}

/* GFLOP/s of one sgemm of the model's largest projection shape, best of 3. */
static double sgemm_gflops(int rows, int in, int out)
{
    float *x = kv_calloc((size_t)rows * in, sizeof *x), *w = kv_calloc((size_t)out * in, sizeof *w);
    float *y = kv_malloc((size_t)rows * out * sizeof *y);
    for (size_t i = 0; i < (size_t)rows * in; i++)
        x[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)out * in; i++)
        w[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    kv_free(x);
    kv_free(w);
    kv_free(y);
    return 2.0 * rows * in * out / best / 1e9;
}

/* GB/s of a large memcpy (read + write), best of 3. */
static double copy_gbps(void)
{
    size_t n = (size_t)256 << 20;
    char *a = kv_malloc(n), *b = kv_malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    volatile char sink = b[n / 2];
    (void)sink;
    kv_free(a);
    kv_free(b);
    return 2.0 * (double)n / best / 1e9;
}

int kv_cmd_bench_model(int argc, char **argv)
{
    const char *model_arg = "smollm2-135m";
    int n_prompt = 1024, n_decode = 32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model_arg = argv[++i];
        else if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc)
            n_prompt = atoi(argv[++i]);
        else if (strcmp(argv[i], "--decode") == 0 && i + 1 < argc)
            n_decode = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: kvsim bench model [--model PATH] [--prompt N] [--decode N]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    kv_error err;
    char path[4096];
    kv_model *m = NULL;
    int rc = kv_eval_model_path(model_arg, path, sizeof path, &err);
    double t0 = now_s();
    if (!rc)
        rc = kv_model_load(path, &m, &err);
    double t_load = now_s() - t0;
    if (rc) {
        fprintf(stderr, "kvsim bench model: %s\n", err.msg);
        return rc == KV_EINPUT ? 2 : 1;
    }
    const kv_model_config *c = kv_model_get_config(m);
    if (n_prompt < 1 || n_decode < 0 || n_prompt + n_decode > c->context_length) {
        fprintf(stderr, "kvsim bench model: --prompt %d + --decode %d must fit the context of %d tokens\n", n_prompt,
                n_decode, c->context_length);
        kv_model_destroy(m);
        return 2;
    }
    int32_t *tokens = prompt_tokens(m, n_prompt);
    int32_t *pos = kv_malloc((size_t)n_prompt * sizeof *pos), *seq = kv_calloc((size_t)n_prompt, sizeof *seq);
    uint8_t *want = kv_calloc((size_t)n_prompt, 1);
    for (int i = 0; i < n_prompt; i++)
        pos[i] = i;
    want[n_prompt - 1] = 1;
    float *logits = kv_malloc((size_t)c->vocab * sizeof *logits);
    kv_kvstore_shape sh = kv_model_kv_shape(m);
    kv_kvstore *s;
    kv_kvstore_create(&sh, NULL, 0, &s, &err);
    kv_batch b = {n_prompt, tokens, pos, seq, want};
    t0 = now_s();
    rc = kv_model_forward(m, &b, &s, logits, &err);
    double t_prefill = now_s() - t0;
    kv_kvstore_seal(s);
    int32_t tok = kv_argmax(logits, c->vocab), p = n_prompt;
    t0 = now_s();
    for (int i = 0; i < n_decode && !rc; i++, p++) {
        kv_batch d = {1, &tok, &p, seq, NULL};
        rc = kv_model_forward(m, &d, &s, logits, &err);
        tok = kv_argmax(logits, c->vocab);
    }
    double t_decode = now_s() - t0;
    if (rc) {
        fprintf(stderr, "kvsim bench model: %s\n", err.msg);
    } else {
        /* Work of the prefill: 2 flops per weight of the blocks per token, plus causal attention. */
        double block_weights = c->parameters - (double)c->vocab * c->dim * 1.0 - (double)c->dim * (2 * c->n_layers + 1);
        double flops = 2.0 * block_weights * n_prompt +
                       2.0 * 2.0 * c->n_layers * c->n_heads * c->head_dim * (double)n_prompt * (n_prompt + 1) / 2.0;
        double model_gflops = flops / t_prefill / 1e9;
        double blas = sgemm_gflops(n_prompt, c->dim, c->hidden);
        double weight_bytes = c->parameters * 4.0;
        double decode_gbps = n_decode ? weight_bytes * n_decode / t_decode / 1e9 : 0;
        double mem = copy_gbps();
        printf("kvsim bench model: %s (%.0fM parameters, fp32 weights), %s\n", c->name, c->parameters / 1e6, path);
        printf("  load                 %8.2f s\n", t_load);
        printf("  prefill %5d tokens  %8.2f s  %8.1f tokens/s  %6.1f GFLOP/s = %.2f x this machine's sgemm (%.1f GFLOP/s)\n",
               n_prompt, t_prefill, n_prompt / t_prefill, model_gflops, model_gflops / blas, blas);
        if (n_decode)
            printf("  decode  %5d tokens  %8.2f s  %8.1f tokens/s  %6.1f GB/s of weights = %.2f x memcpy bandwidth (%.1f GB/s)\n",
                   n_decode, t_decode, n_decode / t_decode, decode_gbps, decode_gbps / mem, mem);
        if (n_prompt == 1024)
            printf("  target: 1,024-token prefill under 5 s: %.2f s is %.2f x the target (%s)\n", t_prefill,
                   t_prefill / 5.0, t_prefill < 5.0 ? "met" : "not met");
    }
    kv_kvstore_destroy(s);
    kv_free(tokens);
    kv_free(pos);
    kv_free(seq);
    kv_free(want);
    kv_free(logits);
    kv_model_destroy(m);
    return rc == KV_OK ? 0 : 1;
}
