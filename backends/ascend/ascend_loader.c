/* ascend_loader.c — kvsim's registry entry for the Ascend backend: forwards to
   the module libkvsim_ascend.so (ascend_backend.cpp + kernels_ascend.cpp),
   loaded on first use (backends/module/kv_module.h). */
#include "backends/backend_impl.h"
#include "backends/module/module_loader.h"

static int ascend_device_count(kv_error *err)
{
    return kv_module_device_count("libkvsim_ascend.so", err);
}

static int ascend_open(int index, const kv_backend_i **iface, void **ctx, kv_error *err)
{
    return kv_module_open("libkvsim_ascend.so", index, iface, ctx, err);
}

static const kv_backend_reg ascend_reg = {
    .name = "ascend",
    .device_count = ascend_device_count,
    .open = ascend_open,
};

const kv_backend_reg *kv_backend_ascend_reg(void)
{
    return &ascend_reg;
}
