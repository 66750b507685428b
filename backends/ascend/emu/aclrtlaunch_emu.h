/* emu/aclrtlaunch_emu.h — stands in for the aclrtlaunch_<kernel>.h launchers
 * that CANN's ascendc_library() generates: ACLRT_LAUNCH_KERNEL(k)(blocks,
 * stream, args...) calls the kernel directly on the host (one block). Device
 * pointers arrive as void * and convert to the kernel's pointer types. */
#ifndef KV_ASCEND_EMU_LAUNCH_H
#define KV_ASCEND_EMU_LAUNCH_H

#define KV_ASCEND_KERNEL 1
#include "backends/kernels/kernels.cl"

struct kv_emu_ptr {
    void *p;
    template <class T> operator T *() const { return (T *)p; }
};
template <class T> static inline T kv_emu_arg(T x) { return x; }
static inline kv_emu_ptr kv_emu_arg(void *p) { return {p}; }

#define ACLRT_LAUNCH_KERNEL(kernel)                                                                              \
    [](uint32_t, void *, auto... args) -> uint32_t {                                                             \
        kernel(kv_emu_arg(args)...);                                                                             \
        return 0u;                                                                                               \
    }

#endif
