/* hip_loader.c — kvsim's registry entry for the HIP backend: forwards to the
   module libkvsim_hip.so (backends/cuda/gpu_backend.cu built by hipcc), loaded on first use (kv_module.h). */
#include "backends/backend_impl.h"
#include "backends/module/module_loader.h"

static int hip_device_count(kv_error *err)
{
    return kv_module_device_count("libkvsim_hip.so", err);
}

static int hip_open(int index, const kv_backend_i **iface, void **ctx, kv_error *err)
{
    return kv_module_open("libkvsim_hip.so", index, iface, ctx, err);
}

static const kv_backend_reg hip_reg = {
    .name = "hip",
    .device_count = hip_device_count,
    .open = hip_open,
};

const kv_backend_reg *kv_backend_hip_reg(void)
{
    return &hip_reg;
}
