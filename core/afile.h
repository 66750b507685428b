/* afile.h — files written atomically: a temporary file in the same folder, renamed on success. */
#ifndef KV_AFILE_H
#define KV_AFILE_H

#include <stdio.h>

#include "core/error.h"

typedef struct kv_afile {
    FILE *f;        /* write here */
    char *path;     /* final name */
    char *tmp_path; /* temporary name; removed on abort */
} kv_afile;

/* Opens a temporary file beside `path`. */
int kv_afile_open(kv_afile *a, const char *path, kv_error *err);
/* Flushes, closes and renames onto the final path; on failure removes the temporary. */
int kv_afile_commit(kv_afile *a, kv_error *err);
/* Closes and removes the temporary file (safe after a failed commit or open). */
void kv_afile_abort(kv_afile *a);

/* mkdir -p. */
int kv_mkdirs(const char *dir, kv_error *err);

#endif
