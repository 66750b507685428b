/* fuzz_gguf.c — libFuzzer harness of the GGUF reader (core/refmodel/gguf.c) and of the
 * tokenizer built from its metadata (core/refmodel/tokenizer.c). The input is the file
 * image, parsed in place (kv_gguf_open_memory).
 *
 * Beyond "no crash, no UB, no leak" it checks the reader's promises: a failure is
 * KV_EINPUT naming the file; every tensor's data lies inside the image; getters on
 * any key either succeed or fail with KV_EINPUT; the first and last rows of every
 * supported tensor dequantize; a tokenizer, if one can be made, round-trips text.
 */
#include <math.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/refmodel/gguf.h"
#include "core/refmodel/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Keys the model and tokenizer read, plus the reader's own. */
static const char *const keys[] = {
    "general.architecture", "general.alignment", "general.name", "llama.block_count", "llama.context_length",
    "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
    "llama.attention.head_count_kv", "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
    "llama.vocab_size", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "a",
};

/* The image under test, for "points inside it" checks. */
static const uint8_t *data_lo, *data_hi;

static bool inside(const void *p, size_t len)
{
    return len == 0 || ((const uint8_t *)p >= data_lo && len <= (size_t)(data_hi - (const uint8_t *)p));
}

static void check_err(int rc, const kv_error *err, const char *what)
{
    KVF_CHECK(rc == KV_EINPUT && err->code == KV_EINPUT && err->msg[0], "%s: rc %d: %s", what, rc, err->msg);
}

static void exercise_metadata(const kv_gguf *g)
{
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        kv_error err = {0};
        const char *key = keys[k];
        int type = kv_gguf_key_type(g, key);
        KVF_CHECK((type == -1) == !kv_gguf_has(g, key), "%s: has and key_type disagree", key);
        uint32_t u;
        float f;
        bool b;
        kv_gguf_str s;
        const kv_gguf_str *items;
        int64_t *ints;
        size_t count;
        int rc;
        if ((rc = kv_gguf_get_u32(g, key, &u, &err)))
            check_err(rc, &err, key);
        if ((rc = kv_gguf_get_f32(g, key, &f, &err)))
            check_err(rc, &err, key);
        if ((rc = kv_gguf_get_bool(g, key, &b, &err)))
            check_err(rc, &err, key);
        if ((rc = kv_gguf_get_string(g, key, &s, &err)))
            check_err(rc, &err, key);
        else
            KVF_CHECK(inside(s.ptr, s.len), "%s: string outside the image", key);
        if ((rc = kv_gguf_get_string_array(g, key, &items, &count, &err)))
            check_err(rc, &err, key);
        else
            for (size_t i = 0; i < count; i++)
                KVF_CHECK(inside(items[i].ptr, items[i].len), "%s[%zu]: string outside the image", key, i);
        ints = NULL;
        if ((rc = kv_gguf_get_int_array(g, key, &ints, &count, &err)))
            check_err(rc, &err, key);
        kv_free(ints);
    }
}

/* Rows past this many elements are not dequantized (time, not memory, bound). */
#define MAX_ROW_ELEMENTS (1u << 16)

static void exercise_tensors(const kv_gguf *g)
{
    size_t n = kv_gguf_tensor_count(g);
    float *row = NULL;
    for (size_t i = 0; i < n; i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        KVF_CHECK(t && t->name, "tensor %zu missing", i);
        KVF_CHECK(kv_gguf_find_tensor(g, t->name) != NULL, "tensor '%s' not found by name", t->name);
        KVF_CHECK(t->n_dims >= 1 && t->n_dims <= KV_GGUF_MAX_DIMS, "tensor '%s': %u dims", t->name, t->n_dims);
        KVF_CHECK(inside(t->data, t->bytes), "tensor '%s': data outside the image", t->name);
        uint64_t elements = 1;
        for (uint32_t d = 0; d < KV_GGUF_MAX_DIMS; d++)
            elements *= t->dims[d];
        KVF_CHECK(elements == t->n_elements, "tensor '%s': n_elements", t->name);
        (void)kv_ggml_type_name(t->type);
        if (!kv_ggml_type_supported(t->type) || t->dims[0] == 0 || t->dims[0] > MAX_ROW_ELEMENTS)
            continue;
        uint64_t rows = t->n_elements / t->dims[0];
        if (rows == 0)
            continue;
        kv_free(row);
        row = kv_calloc((size_t)t->dims[0], sizeof *row);
        kv_error err = {0};
        int rc = kv_gguf_tensor_rows_f32(t, 0, 1, row, &err);
        KVF_CHECK(rc == KV_OK, "tensor '%s': row 0: %s", t->name, err.msg);
        rc = kv_gguf_tensor_rows_f32(t, rows - 1, 1, row, &err);
        KVF_CHECK(rc == KV_OK, "tensor '%s': last row: %s", t->name, err.msg);
        rc = kv_gguf_tensor_rows_f32(t, rows, 1, row, &err); /* one past the end */
        check_err(rc, &err, t->name);
    }
    kv_free(row);
}

static void exercise_tokenizer(const kv_gguf *g)
{
    kv_tokenizer *t = NULL;
    kv_error err = {0};
    int rc = kv_tokenizer_create(g, &t, &err);
    if (rc) {
        check_err(rc, &err, "tokenizer");
        KVF_CHECK(t == NULL, "tokenizer: partial result");
        return;
    }
    static const char text[] = "Hello world, the end\n\n  <|im_start|>x\xc3\xa9\xff";
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        rc = kv_tokenizer_encode(t, text, sizeof text - 1, special, &ids, &n, &err);
        if (rc) {
            check_err(rc, &err, "encode");
            continue;
        }
        int32_t vocab = kv_tokenizer_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            KVF_CHECK(ids[i] >= 0 && ids[i] < vocab, "encode gave id %d of %d", ids[i], vocab);
        size_t len = 0;
        char *back = kv_tokenizer_decode(t, ids, n, &len);
        KVF_CHECK(back != NULL, "decode gave NULL");
        kv_free(back);
        kv_free(ids);
    }
    size_t len;
    (void)kv_tokenizer_piece(t, -1, &len);
    (void)kv_tokenizer_piece(t, kv_tokenizer_vocab_size(t), &len);
    kv_tokenizer_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy: the reader must not depend on anything past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (size)
        memcpy(copy, data, size);
    data_lo = copy;
    data_hi = copy + size;
    kv_gguf *g = NULL;
    kv_error err = {0};
    int rc = kv_gguf_open_memory(copy, size, "fuzz.gguf", &g, &err);
    if (rc) {
        check_err(rc, &err, "open");
        KVF_CHECK(strncmp(err.msg, "fuzz.gguf", 9) == 0, "message does not name the file: %s", err.msg);
        KVF_CHECK(g == NULL, "partial result");
    } else {
        KVF_CHECK(kv_gguf_file_bytes(g) == size, "file_bytes %zu of %zu", kv_gguf_file_bytes(g), size);
        exercise_metadata(g);
        exercise_tensors(g);
        exercise_tokenizer(g);
        kv_gguf_destroy(g);
    }
    free(copy);
    return 0;
}
