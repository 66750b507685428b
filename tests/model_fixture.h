/* model_fixture.h — test-only helpers for the reference model: a GGUF writer, a tiny
 * random-weight llama model with a small byte-level BPE vocabulary, and finding the
 * real SmolLM2 model through scripts/fetch-model.sh.
 *
 * Header-only (static functions) so that each tests/test_model_*.c can include it.
 */
#ifndef KV_TEST_MODEL_FIXTURE_H
#define KV_TEST_MODEL_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/kv/encoding.h"
#include "core/refmodel/model.h"

/* ---- A growable byte buffer ----------------------------------------------------------- */

typedef struct kvt_bytes {
    uint8_t *p;
    size_t n, cap;
} kvt_bytes;

static inline void kvt_put(kvt_bytes *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void kvt_u32(kvt_bytes *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    kvt_put(b, x, 4);
}

static inline void kvt_u64(kvt_bytes *b, uint64_t v)
{
    kvt_u32(b, (uint32_t)v);
    kvt_u32(b, (uint32_t)(v >> 32));
}

static inline void kvt_str(kvt_bytes *b, const char *s)
{
    kvt_u64(b, strlen(s));
    kvt_put(b, s, strlen(s));
}

/* ---- GGUF writer ---------------------------------------------------------------------- */

typedef struct kvt_gguf {
    kvt_bytes meta, info, data;
    uint64_t n_kv, n_tensors;
    uint32_t version;   /* 3 unless a test changes it */
    uint32_t alignment; /* 32 */
} kvt_gguf;

static inline void kvt_gguf_init(kvt_gguf *g)
{
    memset(g, 0, sizeof *g);
    g->version = 3;
    g->alignment = 32;
}

static inline void kvt_gguf_free(kvt_gguf *g)
{
    free(g->meta.p);
    free(g->info.p);
    free(g->data.p);
}

static inline void kvt_kv_u32(kvt_gguf *g, const char *key, uint32_t v)
{
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 4);
    kvt_u32(&g->meta, v);
    g->n_kv++;
}

static inline void kvt_kv_f32(kvt_gguf *g, const char *key, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 6);
    kvt_u32(&g->meta, bits);
    g->n_kv++;
}

static inline void kvt_kv_bool(kvt_gguf *g, const char *key, int v)
{
    uint8_t x = v != 0;
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 7);
    kvt_put(&g->meta, &x, 1);
    g->n_kv++;
}

static inline void kvt_kv_str(kvt_gguf *g, const char *key, const char *v)
{
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 8);
    kvt_str(&g->meta, v);
    g->n_kv++;
}

static inline void kvt_kv_strs(kvt_gguf *g, const char *key, const char *const *items, size_t n)
{
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 9);
    kvt_u32(&g->meta, 8);
    kvt_u64(&g->meta, n);
    for (size_t i = 0; i < n; i++)
        kvt_str(&g->meta, items[i]);
    g->n_kv++;
}

static inline void kvt_kv_i32s(kvt_gguf *g, const char *key, const int32_t *v, size_t n)
{
    kvt_str(&g->meta, key);
    kvt_u32(&g->meta, 9);
    kvt_u32(&g->meta, 5);
    kvt_u64(&g->meta, n);
    for (size_t i = 0; i < n; i++)
        kvt_u32(&g->meta, (uint32_t)v[i]);
    g->n_kv++;
}

/* A tensor table entry only (offset as given): for hostile files. */
static inline void kvt_tensor_info(kvt_gguf *g, const char *name, uint32_t n_dims, const uint64_t *dims, uint32_t type,
                            uint64_t offset)
{
    kvt_str(&g->info, name);
    kvt_u32(&g->info, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        kvt_u64(&g->info, dims[d]);
    kvt_u32(&g->info, type);
    kvt_u64(&g->info, offset);
    g->n_tensors++;
}

/* A tensor with its data, placed at the next aligned offset. */
static inline void kvt_tensor(kvt_gguf *g, const char *name, uint32_t n_dims, const uint64_t *dims, uint32_t type,
                       const void *data, size_t bytes)
{
    static const uint8_t zero[64] = {0};
    while (g->data.n % g->alignment)
        kvt_put(&g->data, zero, 1);
    kvt_tensor_info(g, name, n_dims, dims, type, g->data.n);
    kvt_put(&g->data, data, bytes);
}

/* The whole file image (malloc'd, caller frees). */
static inline uint8_t *kvt_gguf_image(const kvt_gguf *g, size_t *len)
{
    kvt_bytes out = {0};
    kvt_put(&out, "GGUF", 4);
    kvt_u32(&out, g->version);
    kvt_u64(&out, g->n_tensors);
    kvt_u64(&out, g->n_kv);
    kvt_put(&out, g->meta.p, g->meta.n);
    kvt_put(&out, g->info.p, g->info.n);
    static const uint8_t zero[64] = {0};
    while (out.n % g->alignment)
        kvt_put(&out, zero, 1);
    kvt_put(&out, g->data.p, g->data.n);
    *len = out.n;
    return out.p;
}

static inline int kvt_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

/* ---- Numbers ----------------------------------------------------------------------------- */

/* float → IEEE half, round to nearest even (finite inputs in half range). */
static inline uint16_t kvt_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    float a = fabsf(f);
    if (a == 0.0f)
        return (uint16_t)sign;
    if (a < 6.103515625e-05f) { /* subnormal half: units of 2^-24 */
        float q = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)q);
    }
    int e;
    float m = frexpf(a, &e);                 /* a = m 2^e, m in [0.5, 1) */
    float q = nearbyintf(m * 2048.0f);       /* 11 significant bits */
    if (q == 2048.0f) {
        q = 1024.0f;
        e++;
    }
    uint32_t exp = (uint32_t)(e - 1 + 15);
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | (exp << 10) | ((uint32_t)q - 1024u));
}

/* xorshift64*: deterministic pseudo-random numbers for the fixtures. */
static inline float kvt_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 2685821657736338717ull;
    return (float)((r >> 40) / 16777216.0) * 2.0f - 1.0f; /* [-1, 1) */
}

/* Q4_1 blocks of 32 values: {f16 d, f16 m, u8 qs[16]}. */
static inline void kvt_quantize_q4_1(const float *x, size_t n, uint8_t *out)
{
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 20) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < 32; j++) {
            mn = x[j] < mn ? x[j] : mn;
            mx = x[j] > mx ? x[j] : mx;
        }
        float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kvt_half(d), mh = kvt_half(mn);
        memcpy(out, &dh, 2);
        memcpy(out + 2, &mh, 2);
        for (int j = 0; j < 16; j++) {
            int lo = (int)fminf(15.0f, nearbyintf((x[j] - mn) * id));
            int hi = (int)fminf(15.0f, nearbyintf((x[j + 16] - mn) * id));
            out[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* Q8_0 blocks of 32 values: {f16 d, i8 qs[32]}. */
static inline void kvt_quantize_q8_0(const float *x, size_t n, uint8_t *out)
{
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kvt_half(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < 32; j++)
            out[2 + j] = (uint8_t)(int8_t)nearbyintf(x[j] * id);
    }
}

/* ---- The tiny model ------------------------------------------------------------------------ */

/* GPT-2 byte alphabet: the code point byte b is written as. */
static inline uint32_t kvt_byte_cp(int b)
{
    int direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (direct)
        return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        n += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF));
    return 256u + (uint32_t)n;
}

static inline char *kvt_byte_token(int b)
{
    uint32_t cp = kvt_byte_cp(b);
    char *s = calloc(1, 4);
    if (cp < 0x80) {
        s[0] = (char)cp;
    } else {
        s[0] = (char)(0xC0 | (cp >> 6));
        s[1] = (char)(0x80 | (cp & 0x3F));
    }
    return s;
}

#define KVT_TINY_LAYERS 2
#define KVT_TINY_DIM 64
#define KVT_TINY_HIDDEN 96
#define KVT_TINY_HEADS 4
#define KVT_TINY_KV_HEADS 2
#define KVT_TINY_CTX 512

/* Merges of the tiny vocabulary, in rank order ("Ġ" is the space). */
static const char *const kvt_tiny_merges[] = {
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ w", "a t", "e n", "Ġ o", "in g", "Ċ Ċ",
    "Ġ Ġ", "Ġ i", "o r", "e s", "Ġa n", "Ġan d", "Ġ c", "Ġ f", "i s", "l l",
};
#define KVT_TINY_SPECIALS 3
#define KVT_TINY_VOCAB (KVT_TINY_SPECIALS + 256 + (int)(sizeof kvt_tiny_merges / sizeof kvt_tiny_merges[0]))

/* Adds the tokenizer metadata of the tiny vocabulary: 3 control tokens, the 256
   byte tokens, one token per merge. */
static inline void kvt_tiny_tokenizer(kvt_gguf *g)
{
    size_t n_merges = sizeof kvt_tiny_merges / sizeof kvt_tiny_merges[0];
    int n = KVT_TINY_VOCAB;
    char **tokens = calloc((size_t)n, sizeof *tokens);
    int32_t *types = calloc((size_t)n, sizeof *types);
    tokens[0] = strdup("<|endoftext|>");
    tokens[1] = strdup("<|im_start|>");
    tokens[2] = strdup("<|im_end|>");
    for (int i = 0; i < 3; i++)
        types[i] = 3;
    for (int b = 0; b < 256; b++) {
        tokens[3 + b] = kvt_byte_token(b);
        types[3 + b] = 1;
    }
    for (size_t m = 0; m < n_merges; m++) {
        const char *s = kvt_tiny_merges[m], *sp = strchr(s, ' ');
        char *t = calloc(1, strlen(s));
        memcpy(t, s, (size_t)(sp - s));
        strcat(t, sp + 1);
        tokens[3 + 256 + m] = t;
        types[3 + 256 + m] = 1;
    }
    kvt_kv_str(g, "tokenizer.ggml.model", "gpt2");
    kvt_kv_str(g, "tokenizer.ggml.pre", "smollm");
    kvt_kv_strs(g, "tokenizer.ggml.tokens", (const char *const *)tokens, (size_t)n);
    kvt_kv_i32s(g, "tokenizer.ggml.token_type", types, (size_t)n);
    kvt_kv_strs(g, "tokenizer.ggml.merges", kvt_tiny_merges, n_merges);
    kvt_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    kvt_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
    kvt_kv_bool(g, "tokenizer.ggml.add_bos_token", 0);
    for (int i = 0; i < n; i++)
        free(tokens[i]);
    free(tokens);
    free(types);
}

/* A random tensor of the given type (0 F32, 1 F16, 3 Q4_1, 8 Q8_0), values in
   [-scale, scale) (plus offset). */
static inline void kvt_random_tensor(kvt_gguf *g, const char *name, uint64_t d0, uint64_t d1, uint32_t type, float scale,
                              float offset, uint64_t *seed)
{
    size_t n = (size_t)(d0 * d1);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = offset + scale * kvt_rand(seed);
    uint64_t dims[2] = {d0, d1};
    uint32_t nd = d1 > 1 ? 2 : 1;
    if (type == 0) {
        kvt_tensor(g, name, nd, dims, 0, x, n * 4);
    } else if (type == 1) {
        uint16_t *h = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = kvt_half(x[i]);
        kvt_tensor(g, name, nd, dims, 1, h, n * 2);
        free(h);
    } else if (type == 3) {
        uint8_t *q = malloc(n / 32 * 20);
        kvt_quantize_q4_1(x, n, q);
        kvt_tensor(g, name, nd, dims, 3, q, n / 32 * 20);
        free(q);
    } else {
        uint8_t *q = malloc(n / 32 * 34);
        kvt_quantize_q8_0(x, n, q);
        kvt_tensor(g, name, nd, dims, 8, q, n / 32 * 34);
        free(q);
    }
    free(x);
}

/* The llama hyper-parameters of the tiny model. */
static inline void kvt_tiny_hparams(kvt_gguf *g)
{
    kvt_kv_str(g, "general.architecture", "llama");
    kvt_kv_str(g, "general.name", "kvsim tiny random llama");
    kvt_kv_u32(g, "llama.block_count", KVT_TINY_LAYERS);
    kvt_kv_u32(g, "llama.context_length", KVT_TINY_CTX);
    kvt_kv_u32(g, "llama.embedding_length", KVT_TINY_DIM);
    kvt_kv_u32(g, "llama.feed_forward_length", KVT_TINY_HIDDEN);
    kvt_kv_u32(g, "llama.attention.head_count", KVT_TINY_HEADS);
    kvt_kv_u32(g, "llama.attention.head_count_kv", KVT_TINY_KV_HEADS);
    kvt_kv_f32(g, "llama.rope.freq_base", 10000.0f);
    kvt_kv_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kvt_kv_u32(g, "llama.vocab_size", KVT_TINY_VOCAB);
}

/* Faults to build into the tiny model's tensors (tests of bad models). */
typedef struct kvt_tiny_faults {
    const char *skip;   /* leave this tensor out */
    const char *widen;  /* give this tensor 32 more columns */
} kvt_tiny_faults;

/* The weights, with the real model's tensor types: Q8_0 embedding (tied
   output), Q4_1 matrices, F32 norms; one F16 matrix to cover that path. */
static inline void kvt_tiny_weights_faulty(kvt_gguf *g, uint64_t seed, const kvt_tiny_faults *f)
{
    const uint64_t D = KVT_TINY_DIM, H = KVT_TINY_HIDDEN, KV = KVT_TINY_DIM / KVT_TINY_HEADS * KVT_TINY_KV_HEADS;
    kvt_random_tensor(g, "token_embd.weight", D, KVT_TINY_VOCAB, 8, 1.0f, 0.0f, &seed);
    for (int l = 0; l < KVT_TINY_LAYERS; l++) {
        char name[64];
#define KVT_T(suffix, d0, d1, type, scale, off)                                                                  \
    snprintf(name, sizeof name, "blk.%d." suffix, l);                                                           \
    if (!(f && f->skip && strcmp(f->skip, name) == 0))                                                          \
        kvt_random_tensor(g, name, (f && f->widen && strcmp(f->widen, name) == 0) ? (d0) + 32 : (d0), d1, type,  \
                          scale, off, &seed)
        KVT_T("attn_norm.weight", D, 1, 0, 0.1f, 1.0f);
        KVT_T("attn_q.weight", D, D, 3, 0.4f, 0.0f);
        KVT_T("attn_k.weight", D, KV, 3, 0.4f, 0.0f);
        KVT_T("attn_v.weight", D, KV, l == 0 ? 1 : 3, 0.3f, 0.0f);
        KVT_T("attn_output.weight", D, D, 3, 0.2f, 0.0f);
        KVT_T("ffn_norm.weight", D, 1, 0, 0.1f, 1.0f);
        KVT_T("ffn_gate.weight", D, H, 3, 0.3f, 0.0f);
        KVT_T("ffn_up.weight", D, H, 3, 0.3f, 0.0f);
        KVT_T("ffn_down.weight", H, D, 3, 0.2f, 0.0f);
#undef KVT_T
    }
    kvt_random_tensor(g, "output_norm.weight", D, 1, 0, 0.1f, 1.0f, &seed);
}

static inline void kvt_tiny_weights(kvt_gguf *g, uint64_t seed)
{
    kvt_tiny_weights_faulty(g, seed, NULL);
}

/* The whole tiny model as a file image (caller frees). */
static inline uint8_t *kvt_tiny_model_image(uint64_t seed, size_t *len)
{
    kvt_gguf g;
    kvt_gguf_init(&g);
    kvt_tiny_hparams(&g);
    kvt_tiny_tokenizer(&g);
    kvt_tiny_weights(&g, seed);
    uint8_t *img = kvt_gguf_image(&g, len);
    kvt_gguf_free(&g);
    return img;
}

/* Writes the tiny model to dir/tiny.gguf; returns the path (free it). */
static inline char *kvt_tiny_model_file(const char *dir, uint64_t seed)
{
    size_t len;
    uint8_t *img = kvt_tiny_model_image(seed, &len);
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    snprintf(path, n, "%s/tiny.gguf", dir);
    int rc = kvt_write_file(path, img, len);
    free(img);
    if (rc) {
        free(path);
        return NULL;
    }
    return path;
}

/* Writes dir/text.txt, an English text long enough for the tiny model's eval prompts (300
   lines of two kinds); returns its path (free it), NULL if it cannot be written. */
static inline char *kvt_tiny_model_text(const char *dir)
{
    char *text = calloc(1, 40000);
    if (!text)
        return NULL;
    for (int i = 0; i < 300; i++)
        strcat(text, i % 3 ? "the cat sat on the mat and then it ran to the tower. " : "in the evening, winds rose.\n");
    size_t n = strlen(dir) + 16;
    char *path = malloc(n);
    snprintf(path, n, "%s/text.txt", dir);
    int rc = kvt_write_file(path, text, strlen(text));
    free(text);
    if (rc) {
        free(path);
        return NULL;
    }
    return path;
}

/* One encoding e for every (layer, KV head) of m, as the eval takes them (free with kv_free). */
static inline kv_encoding *kvt_uniform_encodings(const kv_model *m, kv_encoding e)
{
    const kv_model_config *c = kv_model_get_config(m);
    size_t n = (size_t)c->n_layers * c->n_kv_heads;
    kv_encoding *out = kv_calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++)
        out[i] = e;
    return out;
}

/* ---- The real model ---------------------------------------------------------------------------- */

/* Path of the real SmolLM2-135M GGUF: runs scripts/fetch-model.sh (which finds
   the cached file or downloads it once). NULL with a reason if it cannot be had. */
static inline char *kvt_real_model(char *reason, size_t reason_len)
{
    FILE *p = popen("sh " KV_SOURCE_DIR "/scripts/fetch-model.sh 2>&1", "r");
    if (!p) {
        snprintf(reason, reason_len, "cannot run scripts/fetch-model.sh");
        return NULL;
    }
    char buf[4096], last[4096] = "";
    while (fgets(buf, sizeof buf, p)) {
        buf[strcspn(buf, "\n")] = '\0';
        if (buf[0])
            snprintf(last, sizeof last, "%s", buf);
    }
    int status = pclose(p);
    if (status != 0) {
        snprintf(reason, reason_len, "scripts/fetch-model.sh failed: %s", last);
        return NULL;
    }
    return strdup(last); /* the script's last line is the path */
}

/* True when a missing reference model must fail the test instead of skipping it:
   CI=true (CI sets it) or KVSIM_REQUIRE_MODEL=1 (make test sets it). */
static inline int kvt_model_required(void)
{
    const char *ci = getenv("CI"), *req = getenv("KVSIM_REQUIRE_MODEL");
    return (ci && (strcmp(ci, "true") == 0 || strcmp(ci, "1") == 0)) || (req && strcmp(req, "1") == 0);
}

/* The real model could not be had (reason from kvt_real_model): fails the test
   if the model is required, else skips it visibly (ctest shows "Skipped", see
   tests/criterion-run.sh). For use inside a Criterion test (needs criterion.h). */
#define KVT_MODEL_MISSING(reason)                                                                             \
    do {                                                                                                      \
        if (kvt_model_required())                                                                             \
            cr_assert_fail("reference model required (CI=true or KVSIM_REQUIRE_MODEL=1) but not available: %s", \
                           (reason));                                                                         \
        fprintf(stderr, "skipped: reference model not available (%s)\n", (reason));                          \
        cr_skip_test("reference model not available (%s)", (reason));                                         \
    } while (0)

#endif
