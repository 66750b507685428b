/* module_loader.h — the registry side of a backend module (kv_module.h): finds
 * libkvsim_<name>.so, dlopens it and forwards device_count/open to it.
 * Header-only: each vendor's small loader .c includes it once.
 *
 * Search order: $KVSIM_MODULE_DIR, the directory of the running executable,
 * its parent (tests live in build/tests), then KV_MODULE_DIR (the build
 * directory, compiled in). The module is opened with RTLD_NODELETE: vendor
 * runtimes register exit handlers and must never be unmapped; every dlopen is
 * matched by a dlclose, which then only drops the reference count.
 */
#ifndef KV_MODULE_LOADER_H
#define KV_MODULE_LOADER_H

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/module/kv_module.h"

#ifndef KV_MODULE_DIR
#define KV_MODULE_DIR "."
#endif

/* Opens the module `file` and fetches its entry; 0 and *handle set, or an
   error in err (KV_EFAIL). */
static inline int kv_module_load(const char *file, void **handle, const kv_module_entry **entry, kv_error *err)
{
    char dirs[4][PATH_MAX];
    int nd = 0;
    const char *env = getenv("KVSIM_MODULE_DIR");
    if (env && *env)
        snprintf(dirs[nd++], PATH_MAX, "%s", env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(dirs[nd++], PATH_MAX, "%s", exe);
            slash = strrchr(exe, '/');
            if (slash) {
                *slash = '\0';
                snprintf(dirs[nd++], PATH_MAX, "%s", exe);
            }
        }
    }
    snprintf(dirs[nd++], PATH_MAX, "%s", KV_MODULE_DIR);
    char why[512] = "not found";
    for (int i = 0; i < nd; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s", dirs[i], file);
        if (access(path, F_OK) != 0)
            continue;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!h) {
            const char *e = dlerror();
            snprintf(why, sizeof why, "%s", e ? e : "dlopen failed");
            continue;
        }
        kv_module_entry_fn get = NULL;
        void *sym = dlsym(h, KV_MODULE_SYMBOL);
        memcpy(&get, &sym, sizeof get); /* object pointer to function pointer, as POSIX allows */
        const kv_module_entry *e = get ? get() : NULL;
        if (!e || e->abi != KV_MODULE_ABI || e->api_version != KV_BACKEND_API_VERSION) {
            snprintf(why, sizeof why, "%s: %s", path,
                     !e ? "no " KV_MODULE_SYMBOL : "built for another kvsim (module ABI/interface version)");
            dlclose(h);
            continue;
        }
        *handle = h;
        *entry = e;
        return KV_OK;
    }
    return kv_error_set(err, KV_EFAIL, "no device: module %s not loadable: %s (set KVSIM_MODULE_DIR)", file, why);
}

static inline int kv_module_device_count(const char *file, kv_error *err)
{
    void *h = NULL;
    const kv_module_entry *e = NULL;
    if (kv_module_load(file, &h, &e, err) != KV_OK)
        return 0;
    int n = e->device_count(err);
    dlclose(h);
    return n < 0 ? 0 : n;
}

static inline int kv_module_open(const char *file, int index, const kv_backend_i **iface, void **ctx, kv_error *err)
{
    void *h = NULL;
    const kv_module_entry *e = NULL;
    int rc = kv_module_load(file, &h, &e, err);
    if (rc != KV_OK)
        return rc;
    rc = e->open(index, iface, ctx, err);
    dlclose(h); /* RTLD_NODELETE: the code stays mapped for the opened context */
    return rc;
}

/* The module's one-line build description, or NULL. */
static inline const char *kv_module_built(const char *file)
{
    void *h = NULL;
    const kv_module_entry *e = NULL;
    kv_error err;
    if (kv_module_load(file, &h, &e, &err) != KV_OK)
        return NULL;
    const char *s = e->built;
    dlclose(h);
    return s;
}

#endif
