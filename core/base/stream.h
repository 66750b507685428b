/* stream.h — a byte stream through a caller's function: what a run's results travel on between processes.
 *
 * kv_stream carries no buffer of its own: `io` moves exactly the bytes asked (a write for a writer, a read
 * for a reader) and buffers as it likes. After the first failure every call fails at once, so a caller may
 * write or read a whole record and look at the result once. The caller owns ctx. */
#ifndef KV_STREAM_H
#define KV_STREAM_H

#include <stddef.h>

typedef struct kv_stream {
    int (*io)(void *ctx, void *buf, size_t n); /* moves exactly n bytes: 0, or -1 on failure */
    void *ctx;
    int failed;                                /* an io call failed */
} kv_stream;

/* Writes n bytes from buf (a writer's io); 0, or -1 once any call failed. */
int kv_stream_put(kv_stream *s, const void *buf, size_t n);
/* Reads n bytes into buf (a reader's io); 0, or -1 once any call failed. */
int kv_stream_get(kv_stream *s, void *buf, size_t n);

#endif
