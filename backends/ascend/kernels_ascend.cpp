// kernels_ascend.cpp — the Ascend C kernels: backends/kernels/kernels.cl compiled
// in the Ascend dialect of kv_device.h (scalar code, one AI Core, integer
// division/fma/rint; kv_device.h explains why). CANN's ascendc_library()
// builds this file and generates the ACLRT_LAUNCH_KERNEL launchers that
// ascend_backend.cpp calls.
//
// NEVER COMPILED HERE: no CANN toolkit exists on the machines kvsim is
// developed on (docs/backends.md). Only a syntax check against stand-in
// headers was possible.
#define KV_ASCEND_KERNEL 1
#include "backends/kernels/kernels.cl"
