/* support.c — test helpers (see support.h). */
#define _GNU_SOURCE
#include "tests/support.h"

#include "core/config/scenario.h"
#include "core/policy/policy.h"
#include "core/study/study.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *kvt_tempdir(void)
{
    char tmpl[] = "/tmp/kvsim-test-XXXXXX";
    char *dir = mkdtemp(tmpl);
    return dir ? strdup(dir) : NULL;
}

char *kvt_write(const char *dir, const char *name, const char *text)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", dir, name) < 0)
        return NULL;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(path);
        return NULL;
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* The rest of stream f, NUL-terminated (free it); its length in *len where len is not NULL. */
static char *read_stream(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

char *kvt_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = read_stream(f, len);
    fclose(f);
    return buf;
}

int kvt_sh(const char *cmd, char **output)
{
    if (output)
        *output = NULL;
    char *full = NULL;
    if (asprintf(&full, "%s 2>&1", cmd) < 0)
        return -1;
    FILE *p = popen(full, "r");
    free(full);
    if (!p)
        return -1;
    char *buf = read_stream(p, NULL);
    int status = pclose(p);
    if (output)
        *output = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int kvt_kvsim(const char *args, char **output)
{
    const char *bin = getenv("KVSIM");
    char *cmd = NULL;
    if (asprintf(&cmd, "%s %s", bin ? bin : KV_BINARY_DIR "/kvsim", args) < 0)
        return -1;
    int rc = kvt_sh(cmd, output);
    free(cmd);
    return rc;
}

void kvt_rmtree(const char *dir)
{
    char *cmd = NULL;
    if (dir && strncmp(dir, "/tmp/kvsim-test-", 16) == 0 && asprintf(&cmd, "rm -rf '%s'", dir) >= 0) {
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        free(cmd);
    }
}

char *kvt_source(const char *relative)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", KV_SOURCE_DIR, relative) < 0)
        return NULL;
    return path;
}

char *kvt_path(const char *dir, const char *name)
{
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
    return p;
}

char *kvt_listing(const char *dir)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, ".."))
            fprintf(f, "%s%s", len ? " " : "", names[i]->d_name);
        fflush(f);
        free(names[i]);
    }
    free(names);
    fclose(f);
    return buf;
}

pid_t kvt_dead_pid(void)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0)
        _exit(0);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return pid;
}

char *kvt_fixture_copy(const char *fixture, const char *dir, const char *name)
{
    char *src = NULL;
    cr_assert(asprintf(&src, "%s/tests/fixtures/%s", KV_SOURCE_DIR, fixture) > 0);
    char *text = kvt_read(src, NULL);
    cr_assert_not_null(text, "missing fixture %s", src);
    char *path = kvt_write(dir, name, text);
    cr_assert_not_null(path, "could not write %s/%s", dir, name);
    free(text);
    free(src);
    return path;
}

kv_policy *kvt_policy_load(const char *path, const kv_policy_param *params, int n)
{
    kv_policy *p = NULL;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_policy_load(NULL, path, params, n, NULL, &p, &err);
    cr_assert_eq(rc, KV_OK, "loading %s failed: %s", path, err.msg);
    cr_assert_not_null(p);
    return p;
}

kv_study *kvt_study_run(const char *path, const char **sets, int n_sets, kv_scenario **s)
{
    kv_error err = {0};
    kv_study *st = NULL;
    cr_assert_eq(kv_scenario_load(path, sets, n_sets, s, &err), 0, "%s: %s", path, err.msg);
    cr_assert_eq(kv_study_prepare(*s, &st, &err), 0, "%s: %s", path, err.msg);
    cr_assert_eq(kv_study_run(st, &err), 0, "%s: %s", path, err.msg);
    return st;
}

void kvt_expect_same_files(const char *dir_a, const char *dir_b, const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        char *pa = kvt_path(dir_a, names[i]), *pb = kvt_path(dir_b, names[i]);
        size_t la = 0, lb = 0;
        char *ta = kvt_read(pa, &la), *tb = kvt_read(pb, &lb);
        cr_assert(ta && tb, "%s missing", names[i]);
        cr_expect(la == lb && memcmp(ta, tb, la) == 0, "%s differs between %s and %s", names[i], dir_a, dir_b);
        free(ta);
        free(tb);
        free(pa);
        free(pb);
    }
}
