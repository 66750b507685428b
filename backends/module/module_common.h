/* module_common.h — the helpers every backend module (CUDA, HIP, Ascend) shares: errors, host memory,
 * the device buffer, range checks and the packed-plane arithmetic.
 *
 * A module links nothing of kvsim (kv_module.h says why), so these are header-only, `static inline`,
 * and written in the C subset that nvcc, hipcc and the Ascend host compiler all accept. Define
 * KV_MODULE_NAME (the backend's name as it prefixes messages: "cuda", "hip", "ascend") before
 * including this. Include it once, from the module's one source file, after backend.h.
 */
#ifndef KV_MODULE_COMMON_H
#define KV_MODULE_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/backend.h"

#ifndef KV_MODULE_NAME
#error "define KV_MODULE_NAME before including backends/module/module_common.h"
#endif

/* A device allocation as the module hands it out (kv_buffer is opaque to kvsim). */
struct kv_buffer {
    void *ptr;    /* device memory */
    size_t bytes; /* as asked for */
};

/* Fills err (may be NULL) with code and the message; returns code. The module cannot call kv_error_set. */
static inline int kv_module_fail(kv_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int kv_module_fail(kv_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->key[0] = '\0';
    }
    return code;
}

/* calloc that aborts on host out-of-memory, as core/base/alloc.h does; never returns NULL. */
static inline void *kv_module_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "kvsim " KV_MODULE_NAME ": out of host memory\n");
        abort();
    }
    return p;
}

/* KV_EINPUT unless buf holds `bytes` bytes at `offset` (kernel and name say which argument). */
static inline int kv_module_check_range(const char *kernel, const char *name, const struct kv_buffer *buf,
                                        size_t offset, size_t bytes, kv_error *err)
{
    if (!buf)
        return kv_module_fail(err, KV_EINPUT, KV_MODULE_NAME ": %s: argument '%s' has no buffer", kernel, name);
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return kv_module_fail(err, KV_EINPUT,
                              KV_MODULE_NAME ": %s: argument '%s' needs %zu bytes at offset %zu, "
                                             "but its buffer holds %zu",
                              kernel, name, bytes, offset, buf->bytes);
    return KV_OK;
}

/* Quantization groups of a layout (backend.h's layout; kv_layout_groups in backend.c). */
static inline size_t kv_module_groups(const kv_quant_layout *l)
{
    if (!l->rows || !l->cols || !l->group_size)
        return 0;
    if (l->grouping == KV_GROUP_TOKEN)
        return (size_t)l->rows * ((l->cols + l->group_size - 1) / l->group_size);
    return (size_t)((l->rows + l->group_size - 1) / l->group_size) * l->cols;
}

/* Bytes of a packed plane of `bits`-bit codes (kv_layout_packed_bytes in backend.c). */
static inline size_t kv_module_plane_bytes(const kv_quant_layout *l, unsigned bits)
{
    if (!kv_module_groups(l))
        return 0;
    size_t g = l->group_size, full = (g * bits + 7) / 8;
    if (l->grouping == KV_GROUP_TOKEN) {
        size_t last = l->cols % g;
        return (size_t)l->rows * ((l->cols / g) * full + (last ? (last * bits + 7) / 8 : 0));
    }
    size_t last = l->rows % g;
    return (size_t)l->cols * ((l->rows / g) * full + (last ? (last * bits + 7) / 8 : 0));
}

#endif
