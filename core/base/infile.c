/* infile.c — user input files: regular files only, size-capped (infile.h). */
#include "core/base/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/alloc.h"

/* What a non-regular file is, for the message. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "it is a directory";
    if (S_ISFIFO(mode))
        return "it is a FIFO (named pipe)";
    if (S_ISCHR(mode))
        return "it is a character device";
    if (S_ISBLK(mode))
        return "it is a block device";
    if (S_ISSOCK(mode))
        return "it is a socket";
    return "it is not a plain file";
}

/* "16 MiB" or "4 GiB" for the cap in messages. */
static void format_cap(uint64_t bytes, char *buf, size_t size)
{
    if (bytes >= ((uint64_t)1 << 30) && bytes % ((uint64_t)1 << 30) == 0)
        snprintf(buf, size, "%llu GiB", (unsigned long long)(bytes >> 30));
    else if (bytes >= ((uint64_t)1 << 20) && bytes % ((uint64_t)1 << 20) == 0)
        snprintf(buf, size, "%llu MiB", (unsigned long long)(bytes >> 20));
    else
        snprintf(buf, size, "%llu bytes", (unsigned long long)bytes);
}

static int too_large(const char *path, const char *what, uint64_t max_bytes, kv_error *err)
{
    char cap[32];
    format_cap(max_bytes, cap, sizeof cap);
    return kv_error_set(err, KV_EINPUT, "%s: cannot open %s: larger than the %s kvsim reads for one", path, what,
                        cap);
}

int kv_input_open(const char *path, const char *what, uint64_t max_bytes, uint64_t *size_out, kv_error *err)
{
    if (size_out)
        *size_out = 0;
    if (!path || !path[0]) {
        kv_error_set(err, KV_EINPUT, "cannot open %s: no path given", what);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        kv_error_set(err, KV_EINPUT, "%s: cannot open %s: %s", path, what, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        kv_error_set(err, KV_EINPUT, "%s: cannot open %s: %s", path, what, strerror(e));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        kv_error_set(err, KV_EINPUT, "%s: cannot open %s: %s, not a regular file", path, what, file_kind(st.st_mode));
        return -1;
    }
    if (max_bytes && (uint64_t)st.st_size > max_bytes) {
        close(fd);
        too_large(path, what, max_bytes, err);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        kv_error_set(err, KV_EFAIL, "%s: cannot open %s: %s", path, what, strerror(e));
        return -1;
    }
    if (size_out)
        *size_out = (uint64_t)st.st_size;
    return fd;
}

FILE *kv_input_fopen(const char *path, const char *what, uint64_t max_bytes, kv_error *err)
{
    int fd = kv_input_open(path, what, max_bytes, NULL, err);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        kv_error_set(err, KV_EFAIL, "%s: cannot open %s: %s", path, what, strerror(errno));
        close(fd);
    }
    return f;
}

int kv_input_read_all(const char *path, const char *what, uint64_t max_bytes, char **out, size_t *len,
                      kv_error *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    uint64_t size = 0;
    int fd = kv_input_open(path, what, max_bytes, &size, err);
    if (fd < 0)
        return err ? err->code : KV_EINPUT;
    /* Sized from fstat, grown if the file grew, never past the cap (+1 byte to see that it grew). */
    size_t cap = (size_t)size + 1, n = 0;
    char *buf = kv_malloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (max_bytes && n > max_bytes)
                break;
            size_t grown = cap * 2;
            if (max_bytes && grown > max_bytes + 1)
                grown = (size_t)max_bytes + 1;
            buf = kv_realloc(buf, grown + 1);
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            kv_free(buf);
            return kv_error_set(err, KV_EFAIL, "%s: cannot read %s: %s", path, what, strerror(e));
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    if (max_bytes && n > max_bytes) {
        kv_free(buf);
        return too_large(path, what, max_bytes, err);
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return KV_OK;
}
