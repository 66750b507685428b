/* feedcache.c — measured reference-model figures cached on disk, keyed by what determines them. */
#include "core/accuracy/feedcache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/infile.h"

#define FEEDCACHE_MAGIC "kvsim feedcache 1\n"
#define FEEDCACHE_MAX_KEY (1u << 20) /* bytes; longer keys are misuse */

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

bool kv_feedcache_dir(char *buf, size_t len)
{
    const char *v;
    int n;
    if ((v = env_nonempty("KVSIM_CACHE_DIR")))
        n = snprintf(buf, len, "%s", v);
    else if ((v = env_nonempty("XDG_CACHE_HOME")))
        n = snprintf(buf, len, "%s/kvsim/feed", v);
    else if ((v = env_nonempty("HOME")))
        n = snprintf(buf, len, "%s/.cache/kvsim/feed", v);
    else
        return false;
    return n > 0 && (size_t)n < len;
}

int kv_feedcache_file_id(const char *path, char *buf, size_t len, kv_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return kv_error_set(err, KV_EINPUT, "%s: cannot stat: %s", path, strerror(errno));
    snprintf(buf, len, "%s size=%lld mtime=%lld.%09ld", path, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
             (long)st.st_mtim.tv_nsec);
    return KV_OK;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* The entry's file name into buf; false when there is no cache folder. */
static bool entry_path(const char *key, char *buf, size_t len)
{
    char dir[4096];
    if (!kv_feedcache_dir(dir, sizeof dir))
        return false;
    int n = snprintf(buf, len, "%s/%016" PRIx64 ".feed", dir, fnv1a64(key));
    return n > 0 && (size_t)n < len;
}

static int check_args(const char *key, int n, kv_error *err)
{
    if (!key || strlen(key) > FEEDCACHE_MAX_KEY)
        return kv_error_set(err, KV_EFAIL, "feed cache: missing or oversized key");
    if (n < 1 || n > KV_FEEDCACHE_MAX_VALUES)
        return kv_error_set(err, KV_EFAIL, "feed cache: %d values (1..%d)", n, KV_FEEDCACHE_MAX_VALUES);
    return KV_OK;
}

/* Reads the whole file (NUL-terminated); NULL when absent, unreadable or too large. */
static char *slurp(const char *path, size_t limit, size_t *len)
{
    char *buf = NULL;
    kv_error quiet = {0}; /* a regular file of at most `limit` bytes (infile.h), else NULL */
    return kv_input_read_all(path, "feed cache entry", limit, &buf, len, &quiet) == KV_OK ? buf : NULL;
}

/* Parses "WORD COUNT\n" at *p (COUNT a non-negative decimal); advances *p. */
static bool parse_count(const char **p, const char *word, unsigned long *count)
{
    size_t w = strlen(word);
    if (strncmp(*p, word, w) != 0 || (*p)[w] != ' ')
        return false;
    const char *s = *p + w + 1;
    if (*s < '0' || *s > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end != '\n')
        return false;
    *count = v;
    *p = end + 1;
    return true;
}

int kv_feedcache_load(const char *key, double *values, int n, bool *found, kv_error *err)
{
    *found = false;
    int rc = check_args(key, n, err);
    if (rc)
        return rc;
    char path[4200];
    if (!entry_path(key, path, sizeof path))
        return KV_OK;
    size_t len = 0, key_len = strlen(key);
    char *text = slurp(path, FEEDCACHE_MAX_KEY + (size_t)KV_FEEDCACHE_MAX_VALUES * 32 + 4096, &len);
    if (!text)
        return KV_OK;
    const char *p = text, *end = text + len;
    unsigned long stored_key_len = 0, stored_n = 0;
    double *got = kv_malloc((size_t)n * sizeof *got);
    bool ok = strncmp(p, FEEDCACHE_MAGIC, strlen(FEEDCACHE_MAGIC)) == 0;
    if (ok) {
        p += strlen(FEEDCACHE_MAGIC);
        ok = parse_count(&p, "key", &stored_key_len) && stored_key_len == key_len &&
             (size_t)(end - p) > key_len && memcmp(p, key, key_len) == 0 && p[key_len] == '\n';
    }
    if (ok) {
        p += key_len + 1;
        ok = parse_count(&p, "values", &stored_n) && stored_n == (unsigned long)n;
    }
    for (int i = 0; ok && i < n; i++) {
        char *e;
        errno = 0;
        got[i] = strtod(p, &e);
        ok = e != p && !errno && *e == '\n';
        p = e + 1;
    }
    ok = ok && (size_t)(end - p) == strlen("end\n") && strcmp(p, "end\n") == 0;
    if (ok) {
        memcpy(values, got, (size_t)n * sizeof *got);
        *found = true;
    }
    kv_free(got);
    kv_free(text);
    return KV_OK;
}

int kv_feedcache_store(const char *key, const double *values, int n, kv_error *err)
{
    int rc = check_args(key, n, err);
    if (rc)
        return rc;
    char dir[4096], path[4200];
    if (!kv_feedcache_dir(dir, sizeof dir) || !entry_path(key, path, sizeof path))
        return KV_OK;
    kv_error quiet = {0}; /* the cache is an optimisation: its failures are not the run's */
    if (kv_mkdirs(dir, &quiet))
        return KV_OK;
    kv_afile a;
    if (kv_afile_open(&a, path, &quiet))
        return KV_OK;
    fprintf(a.f, "%skey %zu\n%s\nvalues %d\n", FEEDCACHE_MAGIC, strlen(key), key, n);
    for (int i = 0; i < n; i++)
        fprintf(a.f, "%.17g\n", values[i]);
    fputs("end\n", a.f);
    (void)kv_afile_commit(&a, &quiet);
    return KV_OK;
}
