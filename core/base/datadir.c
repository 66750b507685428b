/* datadir.c — kvsim's data folder, found at run time from $KVSIM_DATA_DIR or the executable (datadir.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "core/base/datadir.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_dir(const char *dir, const char *sub)
{
    char path[KV_DATA_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool holds_data(const char *dir)
{
    return is_dir(dir, "scenarios") && is_dir(dir, "policies");
}

/* Adds a place, shown as its canonical path when it exists. */
static void add(kv_data_places *out, const char *what, const char *path)
{
    if (out->count >= KV_DATA_MAX_PLACES)
        return;
    int i = out->count++;
    char real[PATH_MAX];
    snprintf(out->path[i], sizeof out->path[i], "%s", realpath(path, real) ? real : path);
    out->what[i] = what;
    out->usable[i] = holds_data(out->path[i]);
}

bool kv_self_exe(char *buf, size_t size)
{
    if (size < 2)
        return false;
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return true;
}

void kv_data_places_list(kv_data_places *out)
{
    memset(out, 0, sizeof *out);
    const char *env = getenv("KVSIM_DATA_DIR");
    if (env && env[0]) {
        add(out, "KVSIM_DATA_DIR", env);
        return;
    }
    char exe[PATH_MAX];
    if (!kv_self_exe(exe, sizeof exe))
        return; /* no /proc: only the scenario's and the working folder */
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = '\0'; /* the executable's folder */
    char path[KV_DATA_PATH_MAX];
    snprintf(path, sizeof path, "%s/../share/kvsim", exe);
    add(out, "installed", path);
    const char *ups[] = {"/..", "/../..", "/../../.."};
    for (size_t k = 0; k < sizeof ups / sizeof ups[0]; k++) {
        snprintf(path, sizeof path, "%s%s", exe, ups[k]);
        if (holds_data(path)) {
            add(out, "source tree", path);
            return;
        }
    }
    snprintf(path, sizeof path, "%s/..", exe);
    add(out, "source tree", path); /* shown as looked at, not usable */
}

bool kv_data_dir(char *path, size_t size)
{
    kv_data_places p;
    kv_data_places_list(&p);
    for (int i = 0; i < p.count; i++)
        if (p.usable[i]) {
            snprintf(path, size, "%s", p.path[i]);
            return true;
        }
    if (size)
        path[0] = '\0';
    return false;
}
