/* fuzz_util.h — shared by the libFuzzer harnesses of tests/fuzz: the readers under
 * test take a path, so each input is written to one scratch file per process.
 *
 * Header-only (static functions); built only by the KV_FUZZ configuration.
 */
#ifndef KV_FUZZ_UTIL_H
#define KV_FUZZ_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A process-private scratch folder (made on first use, removed at exit). */
static char kvf_dir[256];
static char kvf_file[320];

static inline void kvf_cleanup(void)
{
    if (kvf_file[0])
        unlink(kvf_file);
    if (kvf_dir[0])
        rmdir(kvf_dir);
}

/* Writes data to <scratch>/<name> (same name every call) and returns its path;
   aborts if the scratch file cannot be written (not a finding). */
static inline const char *kvf_write_input(const char *name, const uint8_t *data, size_t size)
{
    if (!kvf_dir[0]) {
        /* Memory-backed if possible: tens of thousands of rewrites a second. */
        const char *tmp = getenv("KVSIM_FUZZ_TMP");
        if (!tmp || !tmp[0])
            tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(kvf_dir, sizeof kvf_dir, "%s/kvsim-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(kvf_dir)) {
            perror("kvsim fuzz: mkdtemp");
            abort();
        }
        snprintf(kvf_file, sizeof kvf_file, "%s/%s", kvf_dir, name);
        atexit(kvf_cleanup);
    }
    /* A new file each time, never a truncated one: ext4 flushes a file
       truncated and rewritten at close (auto_da_alloc), ~1 ms per input. */
    unlink(kvf_file);
    int fd = open(kvf_file, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        perror("kvsim fuzz: open");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror("kvsim fuzz: write");
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
    return kvf_file;
}

/* A broken promise of the code under test: report it as a crash. */
#define KVF_CHECK(cond, ...)                                                                                  \
    do {                                                                                                      \
        if (!(cond)) {                                                                                        \
            fprintf(stderr, "kvsim fuzz: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                                     \
            fputc('\n', stderr);                                                                              \
            abort();                                                                                          \
        }                                                                                                     \
    } while (0)

#endif
