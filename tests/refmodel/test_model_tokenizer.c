/* test_model_tokenizer.c — byte-level BPE: exact round trips, merges by rank, special tokens,
 * and the real SmolLM2 vocabulary against ids recorded from llama.cpp's tokenizer. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/refmodel/gguf.h"
#include "core/refmodel/tokenizer.h"
#include "tests/model_fixture.h"
#include "tests/support.h"

typedef struct tiny {
    uint8_t *img;
    kv_gguf *g;
    kv_tokenizer *t;
} tiny;

static tiny tiny_open(void)
{
    tiny x;
    size_t len;
    kv_error err;
    x.img = kvt_tiny_model_image(1, &len);
    cr_assert_eq(kv_gguf_open_memory(x.img, len, "tiny", &x.g, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_tokenizer_create(x.g, &x.t, &err), KV_OK, "%s", err.msg);
    return x;
}

static void tiny_close(tiny *x)
{
    kv_tokenizer_destroy(x->t);
    kv_gguf_destroy(x->g);
    free(x->img);
}

static void expect_ids(const kv_tokenizer *t, const char *text, size_t len, bool special, const int32_t *want,
                       size_t n_want)
{
    int32_t *ids;
    size_t n;
    kv_error err;
    cr_assert_eq(kv_tokenizer_encode(t, text, len, special, &ids, &n, &err), KV_OK);
    cr_assert_eq(n, n_want, "'%.*s': %zu tokens, expected %zu", (int)len, text, n, n_want);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "'%.*s': token %zu is %d, expected %d", (int)len, text, i, ids[i], want[i]);
    kv_free(ids);
}

static void expect_round_trip(const kv_tokenizer *t, const char *text, size_t len)
{
    int32_t *ids;
    size_t n, back_len;
    kv_error err;
    cr_assert_eq(kv_tokenizer_encode(t, text, len, false, &ids, &n, &err), KV_OK);
    char *back = kv_tokenizer_decode(t, ids, n, &back_len);
    cr_assert_eq(back_len, len, "round trip changed the length (%zu → %zu)", len, back_len);
    cr_assert_eq(memcmp(back, text, len), 0, "round trip changed the bytes of '%.*s'", (int)len, text);
    kv_free(back);
    kv_free(ids);
}

/* Tiny vocabulary ids: 0..2 control, 3 + byte, 259 + merge rank. */
#define B(c) (3 + (int32_t)(unsigned char)(c))
#define M(rank) (259 + (rank))

Test(tokenizer, merges_apply_in_rank_order)
{
    tiny x = tiny_open();
    /* "the": (h,e) rank 1 merges; (t,he) is no merge. */
    expect_ids(x.t, "the", 3, false, (int32_t[]){B('t'), M(1)}, 2);
    /* " the": Ġt (0), he (1), then Ġt+he (2): one token. */
    expect_ids(x.t, " the", 4, false, (int32_t[]){M(2)}, 1);
    /* " thing": Ġt (0) and in (3), then in+g (13). */
    expect_ids(x.t, " thing", 6, false, (int32_t[]){M(0), B('h'), M(13)}, 3);
    /* " and": Ġa (4), then Ġa+n (19), then Ġan+d (20). */
    expect_ids(x.t, " and", 4, false, (int32_t[]){M(20)}, 1);
    /* Digits are split one by one (smollm pre-tokenizer); spaces before them stand alone. */
    expect_ids(x.t, "a 12", 4, false, (int32_t[]){B('a'), B(' '), B('1'), B('2')}, 4);
    /* Whitespace runs: "\n\n" merges (14); the last space of a run joins the next word. */
    expect_ids(x.t, "\n\n  the", 7, false, (int32_t[]){M(14), B(' '), M(2)}, 3);
    tiny_close(&x);
}

Test(tokenizer, special_tokens)
{
    tiny x = tiny_open();
    const char *s = "<|im_start|>the<|im_end|>";
    expect_ids(x.t, s, strlen(s), true, (int32_t[]){1, B('t'), M(1), 2}, 4);
    /* Without parse_special the markup is ordinary text. */
    int32_t *ids;
    size_t n;
    kv_error err;
    cr_assert_eq(kv_tokenizer_encode(x.t, s, strlen(s), false, &ids, &n, &err), KV_OK);
    for (size_t i = 0; i < n; i++)
        cr_assert(ids[i] != 1 && ids[i] != 2);
    kv_free(ids);
    size_t len;
    const char *piece = kv_tokenizer_piece(x.t, 1, &len);
    cr_assert(len == 12 && memcmp(piece, "<|im_start|>", 12) == 0);
    cr_assert_null(kv_tokenizer_piece(x.t, 100000, &len));
    cr_assert_eq(kv_tokenizer_find(x.t, "<|im_end|>"), 2);
    cr_assert_eq(kv_tokenizer_find(x.t, "nope"), -1);
    cr_assert_eq(kv_tokenizer_bos(x.t), 1);
    cr_assert_eq(kv_tokenizer_eos(x.t), 2);
    tiny_close(&x);
}

Test(tokenizer, round_trips_exactly)
{
    tiny x = tiny_open();
    const char *texts[] = {
        "", " ", "   ", "\n", "hello world", "  two  spaces  ", "tabs\t\tand\nnewlines\r\n",
        u8"Ünïcödé café 東京 🙂", "it's they'll I'M", "x = y[3] + 42;", "\xff\xfe invalid \xc3 utf-8 \xe2\x82",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        expect_round_trip(x.t, texts[i], strlen(texts[i]));
    /* Random byte strings, NUL bytes included. */
    uint64_t seed = 5;
    char buf[300];
    for (int trial = 0; trial < 300; trial++) {
        size_t len = (size_t)trial % 300;
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)(int)((kvt_rand(&seed) + 1.0f) * 128.0f);
        expect_round_trip(x.t, buf, len);
    }
    /* A long run (heap-based BPE: stays fast). */
    size_t big = 200000;
    char *run = malloc(big);
    memset(run, '-', big);
    expect_round_trip(x.t, run, big);
    free(run);
    tiny_close(&x);
}

Test(tokenizer, bad_metadata)
{
    kvt_gguf w;
    kv_error err;
    size_t len;
    kv_gguf *g;
    kv_tokenizer *t;
    /* Not a BPE tokenizer. */
    kvt_gguf_init(&w);
    kvt_kv_str(&w, "tokenizer.ggml.model", "llama");
    uint8_t *img = kvt_gguf_image(&w, &len);
    cr_assert_eq(kv_gguf_open_memory(img, len, "spm.gguf", &g, &err), KV_OK);
    cr_assert_eq(kv_tokenizer_create(g, &t, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "spm.gguf") && strstr(err.msg, "tokenizer.ggml.model"), "%s", err.msg);
    kv_gguf_destroy(g);
    free(img);
    kvt_gguf_free(&w);
    /* Missing tokens. */
    kvt_gguf_init(&w);
    kvt_kv_str(&w, "tokenizer.ggml.model", "gpt2");
    img = kvt_gguf_image(&w, &len);
    cr_assert_eq(kv_gguf_open_memory(img, len, "notok.gguf", &g, &err), KV_OK);
    cr_assert_eq(kv_tokenizer_create(g, &t, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "tokenizer.ggml.tokens") && strstr(err.msg, "missing"), "%s", err.msg);
    kv_gguf_destroy(g);
    free(img);
    kvt_gguf_free(&w);
    /* A bos id outside the vocabulary, and an unknown pre-tokenizer. */
    const char *const toks[] = {"a", "b"};
    for (int variant = 0; variant < 2; variant++) {
        kvt_gguf_init(&w);
        kvt_kv_str(&w, "tokenizer.ggml.model", "gpt2");
        kvt_kv_str(&w, "tokenizer.ggml.pre", variant ? "qwen9" : "gpt2");
        kvt_kv_strs(&w, "tokenizer.ggml.tokens", toks, 2);
        kvt_kv_strs(&w, "tokenizer.ggml.merges", toks, 0);
        kvt_kv_u32(&w, "tokenizer.ggml.bos_token_id", 7);
        kvt_kv_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
        img = kvt_gguf_image(&w, &len);
        cr_assert_eq(kv_gguf_open_memory(img, len, "bad.gguf", &g, &err), KV_OK);
        cr_assert_eq(kv_tokenizer_create(g, &t, &err), KV_EINPUT);
        cr_assert(strstr(err.msg, variant ? "qwen9" : "bos_token_id"), "%s", err.msg);
        kv_gguf_destroy(g);
        free(img);
        kvt_gguf_free(&w);
    }
}

/* Strings and the ids llama.cpp's llama-tokenize gave for them with the real
   SmolLM2-135M-Instruct vocabulary (special tokens parsed). */
static const struct {
    const char *text;
    int32_t ids[64];
} real_cases[] = {
    {u8"Hello world! It's 2024, and the year's 12345th day.",
     {19556, 905, 17, 657, 506, 216, 34, 32, 34, 36, 28, 284, 260, 713, 506, 216, 33, 34, 35, 36, 37, 373, 1194, 30}},
    {u8"  leading spaces and trailing   ",
     {216, 2899, 5600, 284, 35079, 333}},
    {u8"line one\nline two\n\n\nfour newlines\n\n",
     {1311, 582, 198, 1311, 827, 1116, 198, 13996, 725, 5110, 1116}},
    {u8"tabs\tand\t\tmixed \t whitespace",
     {100, 7366, 197, 397, 197, 197, 35781, 216, 197, 13938, 6525}},
    {u8"I'M SHOUTING, you'RE not. We've, they'll, he'd, she's",
     {57, 23, 61, 334, 21953, 4728, 28, 346, 23, 3256, 441, 30, 1046, 3543, 28, 502, 3060, 28, 384, 6737, 28, 1041, 506}},
    {u8"Ünïcödé: naïve café, Straße, 東京は晴れ, Москва, ελληνικά, 🙂👍🏽",
     {142, 246, 94, 25972, 83, 7466, 84, 2756, 42, 15486, 46494, 37366, 28, 19144, 34878, 85, 28, 17097, 247, 126, 16736, 122, 7365, 124, 177, 243, 129, 10391, 230, 28, 5470, 246, 6485, 39511, 16464, 6511, 28, 32524, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 28, 47526, 10813, 235, 231, 10813, 233, 138}},
    {u8"numbers: 3.14159, -42, 1,000,000 and ²³ ½ Ⅻ ٣",
     {28707, 42, 216, 35, 30, 33, 36, 33, 37, 41, 28, 731, 36, 34, 28, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 284, 216, 19133, 39050, 216, 16738, 216, 173, 223, 121, 216, 164, 113}},
    {u8"code: for (int i = 0; i < n; i++) { x[i] += y[i] * 2; } // done",
     {4635, 42, 327, 365, 591, 2056, 446, 216, 32, 43, 2056, 2067, 304, 43, 2056, 11444, 25, 1662, 1792, 75, 89, 77, 4519, 329, 75, 89, 77, 1672, 216, 34, 43, 4029, 13241, 2294}},
    {u8"email@example.com https://www.gnu.org/licenses/gpl-3.0.html",
     {10349, 48, 7434, 30, 824, 5141, 1742, 3065, 30, 3662, 101, 30, 2295, 31, 21571, 31, 87, 439, 29, 35, 30, 32, 30, 5699}},
    {u8"  GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007",
     {216, 28807, 35185, 49126, 35696, 45581, 41026, 16997, 13867, 216, 35, 28, 216, 34, 41, 4019, 216, 34, 32, 32, 39}},
    {u8"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     {1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198}},
    {u8"a\u00a0b\u2003c\u3000d \u200b e",
     {81, 15442, 82, 321, 221, 83, 12109, 218, 84, 459, 229, 297}},
    {u8"''''''''' '''s 's 't",
     {3816, 3816, 3816, 11193, 7855, 99, 637, 99, 637, 100}},
    {u8"--------------------------------------------------------",
     {18470, 916}},
};

static kv_tokenizer *real_tokenizer(kv_gguf **g)
{
    char reason[4096];
    char *path = kvt_real_model(reason, sizeof reason);
    if (!path)
        KVT_MODEL_MISSING(reason);
    kv_error err;
    kv_tokenizer *t;
    cr_assert_eq(kv_gguf_open(path, g, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_tokenizer_create(*g, &t, &err), KV_OK, "%s", err.msg);
    free(path);
    return t;
}

Test(tokenizer, real_vocabulary_matches_llama_cpp)
{
    kv_gguf *g;
    kv_tokenizer *t = real_tokenizer(&g);
    cr_assert_eq(kv_tokenizer_vocab_size(t), 49152);
    for (size_t c = 0; c < sizeof real_cases / sizeof real_cases[0]; c++) {
        size_t n_want = 0;
        while (n_want < 64 && (n_want == 0 || real_cases[c].ids[n_want] != 0))
            n_want++;
        const char *s = real_cases[c].text;
        expect_ids(t, s, strlen(s), true, real_cases[c].ids, n_want);
        expect_round_trip(t, s, strlen(s));
    }
    kv_tokenizer_destroy(t);
    kv_gguf_destroy(g);
}

/* A whole licence text that ships with Debian: 7,639 tokens whose FNV-1a hash
   equals that of llama.cpp's ids; and the text comes back byte for byte. */
Test(tokenizer, real_vocabulary_gpl3)
{
    const char *path = "/usr/share/common-licenses/GPL-3";
    size_t len;
    char *text = kvt_read(path, &len);
    if (!text) {
        fprintf(stderr, "skipped: %s is not installed\n", path);
        cr_skip_test("%s is not installed", path);
    }
    kv_gguf *g;
    kv_tokenizer *t = real_tokenizer(&g);
    int32_t *ids;
    size_t n;
    kv_error err;
    cr_assert_eq(kv_tokenizer_encode(t, text, len, false, &ids, &n, &err), KV_OK);
    cr_assert_eq(n, 7639);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint64_t)ids[i];
        h *= 1099511628211ull;
    }
    cr_assert_eq(h, 0xa801bc9c66587453ull, "hash of the ids: %llx", (unsigned long long)h);
    kv_free(ids);
    expect_round_trip(t, text, len);
    free(text);
    kv_tokenizer_destroy(t);
    kv_gguf_destroy(g);
}
