/* backend_impl.h — what backend implementations and the dispatcher share (not for core/). */
#ifndef KV_BACKEND_IMPL_H
#define KV_BACKEND_IMPL_H

#include "backends/backend.h"

struct kv_backend {
    const kv_backend_i *iface; /* the implementation's function table */
    void *ctx;                 /* its context */
    const kv_backend_reg *reg; /* the registry entry it was opened from */
    int device;                /* device index within that backend */
};

/* Registry entries; each lives in its backend's folder. */
const kv_backend_reg *kv_backend_cpu_reg(void);
const kv_backend_reg *kv_backend_opencl_reg(void);
const kv_backend_reg *kv_backend_cuda_reg(void);
const kv_backend_reg *kv_backend_hip_reg(void);
const kv_backend_reg *kv_backend_ascend_reg(void);

#endif
