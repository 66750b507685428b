/* alloc.c — host memory wrappers that abort on out-of-memory. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "core/base/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void kv_oom(size_t bytes)
{
    fprintf(stderr, "kvsim: out of memory allocating %zu bytes\n", bytes);
    abort();
}

void *kv_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        kv_oom(bytes);
    return p;
}

void *kv_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        kv_oom(count * size);
    return p;
}

void *kv_realloc(void *ptr, size_t bytes)
{
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p)
        kv_oom(bytes);
    return p;
}

char *kv_strdup(const char *s)
{
    return kv_strndup(s, strlen(s));
}

char *kv_strndup(const char *s, size_t n)
{
    char *p = kv_malloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void kv_free(void *ptr)
{
    free(ptr);
}

/* The bytes of a kv_calloc_shared mapping (count and size 0 count as 1, as in kv_calloc); -1 on overflow. */
static int shared_bytes(size_t count, size_t size, size_t *bytes)
{
    return kv_mul_size(count ? count : 1, size ? size : 1, bytes);
}

void *kv_calloc_shared(size_t count, size_t size)
{
    if (KV_ASAN)
        return NULL; /* ASan guards heap blocks only: keep them where a sanitizer looks */
    size_t bytes;
    if (shared_bytes(count, size, &bytes) != 0)
        return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p; /* the kernel's pages are zero */
}

void kv_free_shared(void *ptr, size_t count, size_t size)
{
    size_t bytes;
    if (ptr && shared_bytes(count, size, &bytes) == 0)
        munmap(ptr, bytes);
}

void kv_grow(void **items, size_t item_size, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t n = *cap ? *cap : 8;
    while (n < need)
        n *= 2;
    size_t bytes;
    if (kv_mul_size(n, item_size, &bytes) != 0)
        kv_oom((size_t)-1);
    *items = kv_realloc(*items, bytes);
    *cap = n;
}

int kv_mul_size(size_t a, size_t b, size_t *out)
{
    if (b && a > (size_t)-1 / b)
        return -1;
    *out = a * b;
    return 0;
}
