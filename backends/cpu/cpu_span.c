/* cpu_span.c — a kernel argument's bytes inside a CPU buffer, bounds-checked: what the CPU backend's
   buffer calls, its attention (cpu_attention.c) and its compaction (cpu_compact.c) resolve pointers with. */
#include "backends/cpu/cpu_internal.h"

int kv_cpu_span(const kv_bref *r, size_t bytes, void **out, const char *kernel, const char *arg, kv_error *err)
{
    if (!r->buf)
        return kv_error_set(err, KV_EINPUT, "%s: argument '%s' has no buffer", kernel, arg);
    if (r->offset > r->buf->bytes || bytes > r->buf->bytes - r->offset)
        return kv_error_set(err, KV_EINPUT,
                            "%s: argument '%s' needs %zu bytes at offset %zu but its buffer holds %zu", kernel, arg,
                            bytes, r->offset, r->buf->bytes);
    *out = r->buf->data + r->offset;
    return KV_OK;
}
