/* emu/kernel_operator.h — a stand-in for the part of CANN's Ascend C header
 * that kv_device.h's Ascend dialect uses, so that the Ascend port's kernels
 * compile as host C++ for the tests (one "AI Core": block 0 of 1). */
#ifndef KV_ASCEND_EMU_KERNEL_OPERATOR_H
#define KV_ASCEND_EMU_KERNEL_OPERATOR_H

#include <stdint.h>

#define __gm__
#define __aicore__
#define __global__

namespace AscendC {
inline int64_t GetBlockIdx() { return 0; }
inline int64_t GetBlockNum() { return 1; }
template <typename T> struct GlobalTensor {
    T *address = nullptr;
};
enum class CacheLine { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class DcciDst { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
template <typename T, CacheLine line, DcciDst dst> inline void DataCacheCleanAndInvalid(const GlobalTensor<T> &) {}
} // namespace AscendC

#endif
