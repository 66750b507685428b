/* kv_module.h — how kvsim loads a backend built as a separate shared module
 * (CUDA, HIP, Ascend), so that kvsim itself never links a vendor runtime.
 *
 * Why modules: libamdhip64 and libascendcl are shared libraries that pull in
 * their whole runtime stack at start-up; linking them into kvsim would make
 * kvsim (and every test) fail to start on a machine without them, and load a
 * GPU runtime into processes that never use it. Instead each such backend is
 * a module (libkvsim_<name>.so, next to the kvsim binary) exporting one C
 * symbol, KV_MODULE_SYMBOL, that returns a kv_module_entry. kvsim's registry
 * holds a small loader per backend (compiled in when the toolkit was found);
 * it dlopens the module the first time the backend is asked for devices, and
 * reports "no device: module ... not loadable: <why>" if that fails.
 *
 * A module brings everything it needs (no kvsim symbols are visible to it):
 * it fills kv_error itself and uses only backend.h's types.
 */
#ifndef KV_MODULE_H
#define KV_MODULE_H

#include "backends/backend.h"

/* Bumped when kv_module_entry changes. */
#define KV_MODULE_ABI 1
#define KV_MODULE_SYMBOL "kv_module_entry_get"

typedef struct kv_module_entry {
    int abi;         /* KV_MODULE_ABI */
    int api_version; /* KV_BACKEND_API_VERSION the module was built against */
    const char *name;    /* "cuda", "hip", "ascend" */
    const char *built;   /* one line: toolkit version and targets, e.g. "CUDA 13.0, sm_80 sm_90" */
    int (*device_count)(kv_error *err);
    int (*open)(int index, const kv_backend_i **iface, void **ctx, kv_error *err);
} kv_module_entry;

typedef const kv_module_entry *(*kv_module_entry_fn)(void);

#endif
