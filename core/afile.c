/* afile.c — atomic file replacement and folder creation. */
#include "core/afile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"

int kv_afile_open(kv_afile *a, const char *path, kv_error *err)
{
    memset(a, 0, sizeof *a);
    size_t len = strlen(path) + 16;
    a->tmp_path = kv_malloc(len);
    snprintf(a->tmp_path, len, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(a->tmp_path);
    if (fd < 0) {
        int e = errno;
        kv_free(a->tmp_path);
        a->tmp_path = NULL;
        return kv_error_set(err, KV_EFAIL, "%s: cannot create: %s", path, strerror(e));
    }
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        int e = errno;
        close(fd);
        unlink(a->tmp_path);
        kv_free(a->tmp_path);
        a->tmp_path = NULL;
        return kv_error_set(err, KV_EFAIL, "%s: cannot open: %s", path, strerror(e));
    }
    fchmod(fd, 0644);
    a->path = kv_strdup(path);
    return KV_OK;
}

int kv_afile_commit(kv_afile *a, kv_error *err)
{
    int rc = KV_OK;
    int bad = ferror(a->f) || fflush(a->f) != 0;
    if (fclose(a->f) != 0)
        bad = 1;
    a->f = NULL;
    if (bad)
        rc = kv_error_set(err, KV_EFAIL, "%s: write failed: %s", a->path, strerror(errno));
    else if (rename(a->tmp_path, a->path) != 0)
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot rename into place: %s", a->path, strerror(errno));
    if (rc)
        unlink(a->tmp_path);
    kv_free(a->tmp_path);
    kv_free(a->path);
    a->tmp_path = a->path = NULL;
    return rc;
}

void kv_afile_abort(kv_afile *a)
{
    if (a->f)
        fclose(a->f);
    if (a->tmp_path)
        unlink(a->tmp_path);
    kv_free(a->tmp_path);
    kv_free(a->path);
    memset(a, 0, sizeof *a);
}

int kv_mkdirs(const char *dir, kv_error *err)
{
    char *p = kv_strdup(dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            kv_free(p);
            return kv_error_set(err, KV_EFAIL, "%s: cannot create folder: %s", dir, strerror(e));
        }
        *s = '/';
    }
    int rc = KV_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot create folder: %s", dir, strerror(errno));
    kv_free(p);
    return rc;
}
