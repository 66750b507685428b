/* test_model_gguf.c — the GGUF reader: a tiny written file reads back exactly; hostile files fail cleanly. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/refmodel/gguf.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

/* Parses an image; returns the status and leaves the message in err. */
static int parse(const uint8_t *img, size_t len, kv_error *err)
{
    kv_gguf *g = NULL;
    kv_error_clear(err);
    int rc = kv_gguf_open_memory(img, len, "test.gguf", &g, err);
    if (rc == KV_OK)
        cr_assert_not_null(g);
    else
        cr_assert_null(g);
    kv_gguf_destroy(g);
    return rc;
}

static void expect_bad(kvt_gguf *w, const char *needle)
{
    size_t len;
    uint8_t *img = kvt_gguf_image(w, &len);
    kv_error err;
    int rc = parse(img, len, &err);
    cr_assert_eq(rc, KV_EINPUT, "expected KV_EINPUT for '%s', got %d (%s)", needle, rc, err.msg);
    cr_assert(strstr(err.msg, needle), "message '%s' should mention '%s'", err.msg, needle);
    cr_assert(strstr(err.msg, "test.gguf"), "message '%s' should name the file", err.msg);
    free(img);
    kvt_gguf_free(w);
}

Test(gguf, tiny_model_reads_back)
{
    size_t len;
    uint8_t *img = kvt_tiny_model_image(7, &len);
    kv_gguf *g = NULL;
    kv_error err;
    cr_assert_eq(kv_gguf_open_memory(img, len, "tiny", &g, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_gguf_version(g), 3);
    uint32_t u;
    float f;
    kv_gguf_str s;
    cr_assert_eq(kv_gguf_get_u32(g, "llama.block_count", &u, &err), KV_OK);
    cr_assert_eq(u, KVT_TINY_LAYERS);
    cr_assert_eq(kv_gguf_get_f32(g, "llama.rope.freq_base", &f, &err), KV_OK);
    cr_assert_eq(f, 10000.0f);
    cr_assert_eq(kv_gguf_get_string(g, "general.architecture", &s, &err), KV_OK);
    cr_assert(kv_gguf_str_eq(s, "llama"));
    /* Wrong type and missing key are errors naming the key. */
    cr_assert_eq(kv_gguf_get_u32(g, "general.architecture", &u, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "general.architecture") && strstr(err.msg, "string"), "%s", err.msg);
    cr_assert_eq(kv_gguf_get_u32(g, "no.such.key", &u, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "no.such.key") && strstr(err.msg, "missing"), "%s", err.msg);
    const kv_gguf_str *items;
    size_t n;
    cr_assert_eq(kv_gguf_get_string_array(g, "tokenizer.ggml.tokens", &items, &n, &err), KV_OK);
    cr_assert_eq(n, (size_t)KVT_TINY_VOCAB);
    cr_assert(kv_gguf_str_eq(items[1], "<|im_start|>"));
    int64_t *types;
    cr_assert_eq(kv_gguf_get_int_array(g, "tokenizer.ggml.token_type", &types, &n, &err), KV_OK);
    cr_assert_eq(types[0], 3);
    cr_assert_eq(types[100], 1);
    kv_free(types);
    cr_assert_eq(kv_gguf_tensor_count(g), 2 + 9 * KVT_TINY_LAYERS);
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, "blk.1.ffn_down.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->type, KV_GGML_Q4_1);
    cr_assert_eq(t->dims[0], KVT_TINY_HIDDEN);
    cr_assert_eq(t->dims[1], KVT_TINY_DIM);
    cr_assert_eq(t->bytes, (size_t)KVT_TINY_HIDDEN * KVT_TINY_DIM / 32 * 20);
    cr_assert_null(kv_gguf_find_tensor(g, "blk.9.ffn_down.weight"));
    kv_gguf_destroy(g);
    free(img);
}

/* Each supported type dequantizes to exactly what its block formula gives. */
Test(gguf, dequantize_types_exactly)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    float x[64];
    uint64_t seed = 3;
    for (int i = 0; i < 64; i++)
        x[i] = kvt_rand(&seed) * 3.0f;
    uint8_t q41[2 * 20], q80[2 * 34];
    uint16_t h[64], bf[64];
    kvt_quantize_q4_1(x, 64, q41);
    kvt_quantize_q8_0(x, 64, q80);
    for (int i = 0; i < 64; i++) {
        h[i] = kvt_half(x[i]);
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        bf[i] = (uint16_t)(bits >> 16);
    }
    uint64_t dims[2] = {32, 2};
    kvt_tensor(&w, "f32", 2, dims, 0, x, sizeof x);
    kvt_tensor(&w, "f16", 2, dims, 1, h, sizeof h);
    kvt_tensor(&w, "bf16", 2, dims, 30, bf, sizeof bf);
    kvt_tensor(&w, "q4_1", 2, dims, 3, q41, sizeof q41);
    kvt_tensor(&w, "q8_0", 2, dims, 8, q80, sizeof q80);
    size_t len;
    uint8_t *img = kvt_gguf_image(&w, &len);
    kvt_gguf_free(&w);
    kv_gguf *g;
    kv_error err;
    cr_assert_eq(kv_gguf_open_memory(img, len, "types", &g, &err), KV_OK, "%s", err.msg);
    float out[64];
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "f32"), 0, 2, out, &err), KV_OK);
    cr_assert_eq(memcmp(out, x, sizeof x), 0);
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "f16"), 0, 2, out, &err), KV_OK);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(out[i], kv_half_to_float(h[i]));
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "bf16"), 1, 1, out, &err), KV_OK);
    for (int i = 0; i < 32; i++) {
        uint32_t bits = (uint32_t)bf[32 + i] << 16;
        float v;
        memcpy(&v, &bits, 4);
        cr_assert_eq(out[i], v);
    }
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "q4_1"), 1, 1, out, &err), KV_OK);
    for (int j = 0; j < 32; j++) {
        const uint8_t *b = q41 + 20;
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        int code = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
        float want = (float)code * kv_half_to_float(dh) + kv_half_to_float(mh);
        cr_assert_eq(out[j], want, "q4_1 element %d", j);
        cr_assert(fabsf(out[j] - x[32 + j]) < 0.25f, "q4_1 element %d far from the input", j);
    }
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "q8_0"), 0, 2, out, &err), KV_OK);
    for (int j = 0; j < 64; j++) {
        const uint8_t *b = q80 + (j / 32) * 34;
        uint16_t dh;
        memcpy(&dh, b, 2);
        cr_assert_eq(out[j], (float)(int8_t)b[2 + j % 32] * kv_half_to_float(dh), "q8_0 element %d", j);
    }
    /* Rows out of range are refused. */
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "q8_0"), 1, 2, out, &err), KV_EINPUT);
    kv_gguf_destroy(g);
    free(img);
}

Test(gguf, half_conversion)
{
    cr_assert_eq(kv_half_to_float(0x3c00), 1.0f);
    cr_assert_eq(kv_half_to_float(0xc000), -2.0f);
    cr_assert_eq(kv_half_to_float(0x0001), ldexpf(1.0f, -24));
    cr_assert_eq(kv_half_to_float(0x7bff), 65504.0f);
    cr_assert(isinf(kv_half_to_float(0x7c00)));
    cr_assert(isnan(kv_half_to_float(0x7e00)));
    cr_assert_eq(kvt_half(1.0f), 0x3c00);
    cr_assert_eq(kvt_half(-2.0f), 0xc000);
}

Test(gguf, wrong_magic)
{
    size_t len;
    uint8_t *img = kvt_tiny_model_image(1, &len);
    img[0] = 'X';
    kv_error err;
    cr_assert_eq(parse(img, len, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "not a GGUF file"), "%s", err.msg);
    free(img);
}

Test(gguf, unsupported_version)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    w.version = 1;
    expect_bad(&w, "version 1");
}

/* Every prefix of a valid file (sampled) is refused without a crash. */
Test(gguf, truncated_anywhere)
{
    size_t len;
    uint8_t *img = kvt_tiny_model_image(2, &len);
    kv_error err;
    for (size_t cut = 0; cut < len; cut += (cut < 20000 ? 1 : 997)) {
        uint8_t *copy = malloc(cut + 1);
        memcpy(copy, img, cut);
        int rc = parse(copy, cut, &err);
        cr_assert_eq(rc, KV_EINPUT, "a file cut at %zu of %zu bytes was accepted", cut, len);
        cr_assert(err.msg[0], "no message at cut %zu", cut);
        free(copy);
    }
    cr_assert_eq(parse(img, len, &err), KV_OK, "%s", err.msg);
    free(img);
}

Test(gguf, huge_counts)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    w.n_tensors = UINT64_MAX / 2;
    expect_bad(&w, "tensor count");
    kvt_gguf_init(&w);
    w.n_kv = 1ull << 60;
    expect_bad(&w, "metadata count");

    /* An array that claims 2^61 strings. */
    kvt_gguf_init(&w);
    kvt_str(&w.meta, "tokenizer.ggml.tokens");
    kvt_u32(&w.meta, 9);
    kvt_u32(&w.meta, 8);
    kvt_u64(&w.meta, 1ull << 61);
    w.n_kv = 1;
    expect_bad(&w, "tokenizer.ggml.tokens");

    /* An array of 2^62 uint32 values. */
    kvt_gguf_init(&w);
    kvt_str(&w.meta, "x.values");
    kvt_u32(&w.meta, 9);
    kvt_u32(&w.meta, 4);
    kvt_u64(&w.meta, 1ull << 62);
    w.n_kv = 1;
    expect_bad(&w, "x.values");

    /* A string that claims 2^63 bytes. */
    kvt_gguf_init(&w);
    kvt_str(&w.meta, "general.name");
    kvt_u32(&w.meta, 8);
    kvt_u64(&w.meta, 1ull << 63);
    w.n_kv = 1;
    expect_bad(&w, "general.name");

    /* A key whose length runs past the end. */
    kvt_gguf_init(&w);
    kvt_u64(&w.meta, 1ull << 40);
    kvt_put(&w.meta, "0123456789abcdef", 16);
    w.n_kv = 1;
    expect_bad(&w, "runs past the end");

    /* A tensor whose element count overflows. */
    kvt_gguf_init(&w);
    uint64_t dims[4] = {1ull << 40, 1ull << 40, 1ull << 40, 1};
    kvt_tensor_info(&w, "big", 3, dims, 0, 0);
    expect_bad(&w, "big");
}

Test(gguf, tensor_data_past_the_end)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    float x[32] = {0};
    uint64_t dims[1] = {32};
    kvt_tensor(&w, "ok", 1, dims, 0, x, sizeof x);
    kvt_tensor_info(&w, "late", 1, dims, 0, 4096);
    expect_bad(&w, "'late'");

    kvt_gguf_init(&w);
    kvt_tensor_info(&w, "far", 1, dims, 0, UINT64_MAX - 31);
    kvt_put(&w.data, x, sizeof x);
    expect_bad(&w, "'far'");

    kvt_gguf_init(&w);
    kvt_tensor_info(&w, "odd", 1, dims, 0, 3);
    kvt_put(&w.data, x, sizeof x);
    kvt_put(&w.data, x, sizeof x);
    expect_bad(&w, "alignment");
}

Test(gguf, unknown_types)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    uint64_t dims[1] = {32};
    kvt_tensor_info(&w, "mystery", 1, dims, 77, 0);
    kvt_put(&w.data, dims, 8);
    expect_bad(&w, "unknown tensor type 77");

    kvt_gguf_init(&w);
    kvt_str(&w.meta, "weird");
    kvt_u32(&w.meta, 99);
    kvt_u32(&w.meta, 0);
    w.n_kv = 1;
    expect_bad(&w, "unknown value type 99");

    kvt_gguf_init(&w);
    kvt_str(&w.meta, "nested");
    kvt_u32(&w.meta, 9);
    kvt_u32(&w.meta, 9);
    kvt_u64(&w.meta, 1);
    w.n_kv = 1;
    expect_bad(&w, "arrays of arrays");

    /* A block type whose rows do not fill whole blocks. */
    kvt_gguf_init(&w);
    uint64_t d2[1] = {48};
    kvt_tensor_info(&w, "ragged", 1, d2, KV_GGML_Q4_1, 0);
    expect_bad(&w, "not a multiple");

    /* A known but unsupported type parses, and is refused when dequantized. */
    kvt_gguf_init(&w);
    uint64_t d3[1] = {256};
    uint8_t block[210] = {0};
    kvt_tensor(&w, "q6k", 1, d3, 14, block, sizeof block);
    size_t len;
    uint8_t *img = kvt_gguf_image(&w, &len);
    kvt_gguf_free(&w);
    kv_gguf *g;
    kv_error err;
    cr_assert_eq(kv_gguf_open_memory(img, len, "q6k.gguf", &g, &err), KV_OK, "%s", err.msg);
    float out[256];
    cr_assert_eq(kv_gguf_tensor_rows_f32(kv_gguf_find_tensor(g, "q6k"), 0, 1, out, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "Q6_K") && strstr(err.msg, "not supported"), "%s", err.msg);
    kv_gguf_destroy(g);
    free(img);
}

Test(gguf, bad_shapes_and_names)
{
    kvt_gguf w;
    kvt_gguf_init(&w);
    uint64_t dims[5] = {32, 1, 1, 1, 1};
    kvt_tensor_info(&w, "five", 5, dims, 0, 0);
    expect_bad(&w, "5 dimensions");

    kvt_gguf_init(&w);
    uint64_t z[2] = {32, 0};
    kvt_tensor_info(&w, "empty", 2, z, 0, 0);
    expect_bad(&w, "dimension 1 is 0");

    kvt_gguf_init(&w);
    float x[32] = {0};
    kvt_tensor(&w, "twice", 1, dims, 0, x, sizeof x);
    kvt_tensor(&w, "twice", 1, dims, 0, x, sizeof x);
    expect_bad(&w, "duplicate tensor name 'twice'");

    kvt_gguf_init(&w);
    kvt_kv_u32(&w, "a.key", 1);
    kvt_kv_u32(&w, "a.key", 2);
    expect_bad(&w, "duplicate metadata key 'a.key'");

    kvt_gguf_init(&w);
    kvt_kv_u32(&w, "general.alignment", 24);
    expect_bad(&w, "general.alignment");
}

/* Random byte flips in the header and tables: never a crash, and every
   failure comes with a message. */
Test(gguf, random_corruption_never_crashes)
{
    size_t len;
    uint8_t *img = kvt_tiny_model_image(4, &len);
    uint8_t *copy = malloc(len);
    uint64_t seed = 99;
    kv_error err;
    int accepted = 0;
    for (int trial = 0; trial < 3000; trial++) {
        memcpy(copy, img, len);
        int flips = 1 + trial % 4;
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)((kvt_rand(&seed) + 1.0f) * 0.5f * 16000.0f) % len;
            copy[at] ^= (uint8_t)(1u << (trial % 8));
        }
        int rc = parse(copy, len, &err);
        cr_assert(rc == KV_OK || rc == KV_EINPUT);
        if (rc)
            cr_assert(err.msg[0]);
        else
            accepted++;
    }
    cr_assert(accepted < 3000, "no corruption was ever detected");
    free(copy);
    free(img);
}

Test(gguf, missing_empty_and_directory)
{
    kv_gguf *g = NULL;
    kv_error err;
    cr_assert_eq(kv_gguf_open("/nonexistent/model.gguf", &g, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "/nonexistent/model.gguf") && strstr(err.msg, "No such file"), "%s", err.msg);
    char *dir = kvt_tempdir();
    char *empty = kvt_write(dir, "empty.gguf", "");
    cr_assert_eq(kv_gguf_open(empty, &g, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "empty"), "%s", err.msg);
    cr_assert_eq(kv_gguf_open(dir, &g, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "not a regular file"), "%s", err.msg);
    char *text = kvt_write(dir, "text.gguf", "hello, I am not a model");
    cr_assert_eq(kv_gguf_open(text, &g, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "not a GGUF file"), "%s", err.msg);
    cr_assert_null(g);
    free(empty);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

Test(gguf, real_model_table)
{
    char reason[4096];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    kv_gguf *g;
    kv_error err;
    cr_assert_eq(kv_gguf_open(path, &g, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_gguf_tensor_count(g), 272);
    const kv_gguf_tensor *emb = kv_gguf_find_tensor(g, "token_embd.weight");
    cr_assert_not_null(emb);
    cr_assert_eq(emb->type, KV_GGML_Q8_0);
    cr_assert_eq(emb->dims[0], 576);
    cr_assert_eq(emb->dims[1], 49152);
    cr_assert_eq(kv_gguf_find_tensor(g, "blk.29.attn_q.weight")->type, KV_GGML_Q4_1);
    kv_gguf_destroy(g);
    free(path);
}
