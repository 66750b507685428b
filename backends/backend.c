/* backend.c — the backend registry: the backends built in, opening and closing a device.
 * The layout arithmetic is backend_layout.c, the dispatcher backend_dispatch.c. */
#include "backends/backend.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/backend_impl.h"
#include "core/base/alloc.h"

/* ---- Registry ---------------------------------------------------------------- */

static const kv_backend_reg *registry_entry(size_t i)
{
    const kv_backend_reg *(*const getters[])(void) = {
        kv_backend_cpu_reg,
#ifdef KV_HAVE_OPENCL
        kv_backend_opencl_reg,
#endif
#ifdef KV_HAVE_CUDA
        kv_backend_cuda_reg,
#endif
#ifdef KV_HAVE_HIP
        kv_backend_hip_reg,
#endif
#ifdef KV_HAVE_ASCEND
        kv_backend_ascend_reg,
#endif
    };
    if (i >= sizeof getters / sizeof getters[0])
        return NULL;
    return getters[i]();
}

size_t kv_backend_reg_count(void)
{
    size_t n = 0;
    while (registry_entry(n))
        n++;
    return n;
}

const kv_backend_reg *kv_backend_reg_get(size_t i)
{
    return registry_entry(i);
}

const kv_backend_reg *kv_backend_reg_find(const char *name)
{
    for (size_t i = 0; registry_entry(i); i++)
        if (strcmp(registry_entry(i)->name, name) == 0)
            return registry_entry(i);
    return NULL;
}

const char *kv_backend_reg_names(void)
{
    return "cpu"
#ifdef KV_HAVE_OPENCL
           ", opencl"
#endif
#ifdef KV_HAVE_CUDA
           ", cuda"
#endif
#ifdef KV_HAVE_HIP
           ", hip"
#endif
#ifdef KV_HAVE_ASCEND
           ", ascend"
#endif
        ;
}

int kv_backend_open(const char *name, int index, kv_backend **out, kv_error *err)
{
    *out = NULL;
    const kv_backend_reg *reg = kv_backend_reg_find(name);
    if (!reg)
        return kv_error_set(err, KV_EINPUT, "backend '%s' is not built into this kvsim (built: %s)", name,
                            kv_backend_reg_names());
    kv_error why = {0};
    int count = reg->device_count(&why);
    if (count <= 0)
        return kv_error_set(err, KV_EINPUT, "backend '%s' has no usable device: %s (built: %s)", name,
                            why.msg[0] ? why.msg : "no device", kv_backend_reg_names());
    if (index < 0 || index >= count)
        return kv_error_set(err, KV_EINPUT, "backend '%s' has %d device(s); device %d does not exist", name,
                            count, index);
    const kv_backend_i *iface = NULL;
    void *ctx = NULL;
    int rc = reg->open(index, &iface, &ctx, err);
    if (rc != KV_OK)
        return rc;
    if (iface->api_version != KV_BACKEND_API_VERSION) {
        iface->destroy(ctx);
        return kv_error_set(err, KV_EFAIL, "backend '%s' speaks interface version %d, kvsim needs %d", name,
                            iface->api_version, KV_BACKEND_API_VERSION);
    }
    kv_backend *be = kv_calloc(1, sizeof *be);
    be->iface = iface;
    be->ctx = ctx;
    be->reg = reg;
    be->device = index;
    *out = be;
    return KV_OK;
}

void kv_backend_close(kv_backend *be)
{
    if (!be)
        return;
    be->iface->destroy(be->ctx);
    kv_free(be);
}

const char *kv_backend_name(const kv_backend *be)
{
    return be->reg->name;
}

int kv_backend_get_props(kv_backend *be, kv_backend_props *props)
{
    memset(props, 0, sizeof *props);
    props->backend = be->reg->name;
    return be->iface->get_props(be->ctx, props);
}
