/* stream.c — kv_stream's calls: one io per record, sticky failure. */
#include "core/base/stream.h"

static int stream_io(kv_stream *s, void *buf, size_t n)
{
    if (s->failed)
        return -1;
    if (n > 0 && s->io(s->ctx, buf, n) != 0)
        s->failed = 1;
    return s->failed ? -1 : 0;
}

int kv_stream_put(kv_stream *s, const void *buf, size_t n)
{
    return stream_io(s, (void *)buf, n); /* a writer's io only reads buf */
}

int kv_stream_get(kv_stream *s, void *buf, size_t n)
{
    return stream_io(s, buf, n);
}
