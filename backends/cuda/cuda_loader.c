/* cuda_loader.c — kvsim's registry entry for the CUDA backend: forwards to the
   module libkvsim_cuda.so (gpu_backend.cu), loaded on first use (kv_module.h). */
#include "backends/backend_impl.h"
#include "backends/module/module_loader.h"

static int cuda_device_count(kv_error *err)
{
    return kv_module_device_count("libkvsim_cuda.so", err);
}

static int cuda_open(int index, const kv_backend_i **iface, void **ctx, kv_error *err)
{
    return kv_module_open("libkvsim_cuda.so", index, iface, ctx, err);
}

static const kv_backend_reg cuda_reg = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .open = cuda_open,
};

const kv_backend_reg *kv_backend_cuda_reg(void)
{
    return &cuda_reg;
}
