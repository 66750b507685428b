/* unicode.h — the few Unicode facts the tokenizer needs: UTF-8 decoding and the L, N, White_Space classes. */
#ifndef KV_UNICODE_H
#define KV_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_unicode_range {
    uint32_t first, last; /* inclusive code points */
} kv_unicode_range;

/* Generated tables (unicode_tables.c), sorted and disjoint. */
extern const kv_unicode_range kv_unicode_letters[];
extern const size_t kv_unicode_letters_count;
extern const kv_unicode_range kv_unicode_numbers[];
extern const size_t kv_unicode_numbers_count;

bool kv_unicode_is_letter(uint32_t cp); /* general category L* (\p{L}) */
bool kv_unicode_is_number(uint32_t cp); /* general category N* (\p{N}) */
bool kv_unicode_is_space(uint32_t cp);  /* property White_Space (\s) */

/* Decodes one UTF-8 sequence at s[0..n), n >= 1. Returns its length in bytes
   (1..4) and the code point in *cp. A malformed or truncated sequence, an
   overlong form or a surrogate decodes as one byte with *cp = 0xFFFFFFFF
   (a value in no class), so every byte string splits into pieces exactly. */
size_t kv_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Writes cp (<= 0x10FFFF) as UTF-8 into out (4 bytes room); returns the length. */
size_t kv_utf8_encode(uint32_t cp, char *out);

#endif
