/* emu/acl/acl.h — a stand-in for CANN's AscendCL, just enough of it for
 * ascend_backend.cpp, backed by host memory. It exists so that the tests can
 * run the Ascend port (host side and the Ascend dialect of the kernels) on a
 * machine without CANN; it is never registered as a backend. */
#ifndef KV_ASCEND_EMU_ACL_H
#define KV_ASCEND_EMU_ACL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int aclError;
typedef void *aclrtStream;
#define ACL_SUCCESS 0
#define ACL_ERROR_REPEAT_INITIALIZE 100002
typedef enum { ACL_MEM_MALLOC_HUGE_FIRST } aclrtMemMallocPolicy;
typedef enum { ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST } aclrtMemcpyKind;
typedef enum { ACL_HBM_MEM } aclrtMemAttr;
typedef enum { ACL_DEVICE_INFO_AI_CORE_NUM } aclDeviceInfo;

static inline aclError aclInit(const char *config) { (void)config; return ACL_SUCCESS; }
static inline aclError aclrtGetDeviceCount(uint32_t *n) { *n = 1; return ACL_SUCCESS; }
static inline aclError aclrtSetDevice(int32_t device) { (void)device; return ACL_SUCCESS; }
static inline aclError aclrtCreateStream(aclrtStream *s) { *s = (void *)s; return ACL_SUCCESS; }
static inline aclError aclrtDestroyStream(aclrtStream s) { (void)s; return ACL_SUCCESS; }
static inline aclError aclrtSynchronizeStream(aclrtStream s) { (void)s; return ACL_SUCCESS; }
static inline aclError aclrtMalloc(void **p, size_t n, aclrtMemMallocPolicy policy)
{
    (void)policy;
    *p = malloc(n);
    return *p ? ACL_SUCCESS : 207001;
}
static inline aclError aclrtFree(void *p) { free(p); return ACL_SUCCESS; }
static inline aclError aclrtMemcpy(void *dst, size_t cap, const void *src, size_t n, aclrtMemcpyKind kind)
{
    (void)kind;
    if (n > cap)
        return 107000;
    memcpy(dst, src, n);
    return ACL_SUCCESS;
}
static inline const char *aclrtGetSocName(void) { return "host emulation of the Ascend port"; }
static inline aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_bytes, size_t *total_bytes)
{
    (void)attr;
    *free_bytes = *total_bytes = (size_t)1 << 30;
    return ACL_SUCCESS;
}
static inline aclError aclGetDeviceCapability(uint32_t device, aclDeviceInfo info, int64_t *value)
{
    (void)device, (void)info;
    *value = 1;
    return ACL_SUCCESS;
}
static inline const char *aclGetRecentErrMsg(void) { return NULL; }

#endif
