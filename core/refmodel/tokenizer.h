/* tokenizer.h — the byte-level BPE tokenizer (GPT-2 style) described by a GGUF file's metadata.
 *
 * Reads tokenizer.ggml.model ("gpt2"), .tokens, .merges, .token_type,
 * .pre (the pre-tokenizer: "smollm" splits every digit on its own, then the
 * GPT-2 regex; "gpt2" and "default" use the GPT-2 regex alone), and the bos,
 * eos and unknown token ids. Encoding: optionally split out special tokens
 * written literally in the text, pre-tokenize, map each byte to its GPT-2
 * "byte-level" character, apply the merges in rank order, look the pieces up.
 * Decoding maps the characters back to bytes, so decode(encode(s)) == s for
 * every byte string s (invalid UTF-8 included).
 *
 * The tokenizer copies what it needs: it does not keep the kv_gguf alive.
 */
#ifndef KV_TOKENIZER_H
#define KV_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/refmodel/gguf.h"

typedef struct kv_tokenizer kv_tokenizer;

/* KV_EINPUT with a message naming the file and key if the metadata is
   missing, inconsistent or not a byte-level BPE. *out is the caller's. */
int kv_tokenizer_create(const kv_gguf *g, kv_tokenizer **out, kv_error *err);
void kv_tokenizer_destroy(kv_tokenizer *t); /* NULL is fine */

int32_t kv_tokenizer_vocab_size(const kv_tokenizer *t);
int32_t kv_tokenizer_bos(const kv_tokenizer *t); /* -1 if none */
int32_t kv_tokenizer_eos(const kv_tokenizer *t); /* -1 if none */
bool kv_tokenizer_add_bos(const kv_tokenizer *t); /* tokenizer.ggml.add_bos_token */

/* Encodes text[0..len). With parse_special, control tokens written in the
   text (e.g. "<|im_start|>") become their ids; user-defined tokens always do.
   *tokens (caller frees with kv_free) receives *n ids; no BOS is added. */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, bool parse_special, int32_t **tokens,
                        size_t *n, kv_error *err);

/* The bytes of one token (not NUL-terminated, owned by t); NULL with *len 0
   for an id out of range. */
const char *kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, size_t *len);

/* Concatenated bytes of n tokens as a NUL-terminated string the caller frees
   (kv_free); ids out of range contribute nothing. *len may be NULL. */
char *kv_tokenizer_decode(const kv_tokenizer *t, const int32_t *tokens, size_t n, size_t *len);

/* The id of the token whose vocabulary text is exactly text, or -1. */
int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text);

#endif
