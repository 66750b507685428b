/* gen_gguf_corpus.c — writes the small GGUF seed files of tests/fuzz/corpus/gguf
 * with the test GGUF writer of tests/model_fixture.h. Not part of the build; rerun
 * it by hand if the writer changes:
 *   cc -std=c11 -D_POSIX_C_SOURCE=200809L -DKV_SOURCE_DIR='"."' -I. tests/fuzz/gen_gguf_corpus.c -lm \
 *      -o /tmp/gen_gguf && /tmp/gen_gguf tests/fuzz/corpus/gguf
 */
#include "tests/model_fixture.h"

static void save(const char *dir, const char *name, kvt_gguf *g)
{
    size_t len;
    uint8_t *img = kvt_gguf_image(g, &len);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (kvt_write_file(path, img, len)) {
        perror(path);
        exit(1);
    }
    printf("%s: %zu bytes\n", path, len);
    free(img);
    kvt_gguf_free(g);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    kvt_gguf g;
    uint64_t seed = 7;

    kvt_gguf_init(&g); /* header only */
    save(dir, "empty-v3.gguf", &g);

    kvt_gguf_init(&g);
    g.version = 2;
    kvt_kv_str(&g, "general.architecture", "llama");
    save(dir, "one-key-v2.gguf", &g);

    kvt_gguf_init(&g); /* the llama hyper-parameters, every scalar type the writer has */
    kvt_tiny_hparams(&g);
    kvt_kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    kvt_kv_u32(&g, "general.alignment", 64);
    g.alignment = 64;
    save(dir, "hparams.gguf", &g);

    kvt_gguf_init(&g); /* the tiny tokenizer alone (a valid byte-level BPE) */
    kvt_tiny_tokenizer(&g);
    save(dir, "tokenizer.gguf", &g);

    kvt_gguf_init(&g); /* one small tensor of each supported type */
    kvt_kv_str(&g, "general.architecture", "llama");
    kvt_random_tensor(&g, "f32.weight", 32, 2, 0, 1.0f, 0.0f, &seed);
    kvt_random_tensor(&g, "f16.weight", 32, 2, 1, 1.0f, 0.0f, &seed);
    kvt_random_tensor(&g, "q4_1.weight", 32, 2, 3, 1.0f, 0.0f, &seed);
    kvt_random_tensor(&g, "q8_0.weight", 32, 2, 8, 1.0f, 0.0f, &seed);
    uint64_t dims[2] = {32, 1};
    uint8_t q4_0[18] = {0x00, 0x3c};
    kvt_tensor(&g, "q4_0.weight", 1, dims, 2, q4_0, sizeof q4_0);
    uint16_t bf16[32];
    for (int i = 0; i < 32; i++)
        bf16[i] = (uint16_t)(0x3f80 + i);
    kvt_tensor(&g, "bf16.weight", 1, dims, 30, bf16, sizeof bf16);
    save(dir, "tensors.gguf", &g);

    kvt_gguf_init(&g); /* int arrays and a tensor of a type the reader refuses */
    int32_t ints[4] = {1, -2, 3, 1 << 30};
    kvt_kv_i32s(&g, "tokenizer.ggml.token_type", ints, 4);
    const char *strs[3] = {"a", "", "b c"};
    kvt_kv_strs(&g, "tokenizer.ggml.merges", strs, 3);
    uint8_t q2k[84] = {0};
    uint64_t d256[1] = {256};
    kvt_tensor(&g, "q2_k.weight", 1, d256, 10, q2k, sizeof q2k);
    save(dir, "arrays-unsupported.gguf", &g);
    return 0;
}
