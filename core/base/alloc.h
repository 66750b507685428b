/* alloc.h — host memory: the one place where out-of-memory aborts. */
#ifndef KV_ALLOC_H
#define KV_ALLOC_H

#include <stddef.h>

/* These never return NULL for a non-zero size: on out-of-memory they print
   one line to stderr and abort. Free with kv_free (NULL is fine). */
void *kv_malloc(size_t bytes);
void *kv_calloc(size_t count, size_t size);
void *kv_realloc(void *ptr, size_t bytes);
char *kv_strdup(const char *s);
char *kv_strndup(const char *s, size_t n);
void kv_free(void *ptr);

/* KV_ASAN: 1 in an AddressSanitizer build (gcc's __SANITIZE_ADDRESS__, clang's __has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define KV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_ASAN 1
#endif
#endif
#ifndef KV_ASAN
#define KV_ASAN 0
#endif

/* Zeroed memory that a forked child fills for this process: a shared anonymous mapping made
   before the fork, so the child's writes land here and nothing is copied back (the SimGrid
   child's per-request results). NULL when the system refuses the mapping, and always under
   AddressSanitizer (which guards heap blocks only): the caller falls back to kv_calloc, so a
   sanitizer build tests that path. Free with kv_free_shared and the same count and size (NULL is
   fine). */
void *kv_calloc_shared(size_t count, size_t size);
void kv_free_shared(void *ptr, size_t count, size_t size);

/* Grows *items (of item_size bytes each, capacity *cap) to hold at least need items. */
void kv_grow(void **items, size_t item_size, size_t *cap, size_t need);

/* Overflow-checked multiplication: returns 0 and sets *out, or -1 on overflow. */
int kv_mul_size(size_t a, size_t b, size_t *out);

#endif
