// ascend_backend.cpp — the Ascend backend module (libkvsim_ascend.so): AscendCL
// host side for the kernels of kernels_ascend.cpp (Ascend C, which compiles
// backends/kernels/kernels.cl in the Ascend dialect of kv_device.h).
//
// NEVER COMPILED OR RUN HERE: no CANN toolkit exists on the machines kvsim is
// developed on. It is written against the documented AscendCL API (aclInit,
// aclrtSetDevice, aclrtCreateStream, aclrtMalloc, aclrtMemcpy,
// aclrtSynchronizeStream) and the launch functions that CANN's
// ascendc_library() generates (ACLRT_LAUNCH_KERNEL), and is built only when
// backends/ascend/CMakeLists.txt finds a CANN toolkit. Expect to fix small
// things on the first build with a real toolkit; docs/backends.md says so.
//
// Kernels run as scalar code on a single AI Core (kv_device.h explains why),
// so this backend is a functional, bit-exact port, not a fast one.
//
// Ordering: kernels go to one stream; aclrtMemcpy is synchronous but not
// ordered with that stream, so buffer reads and writes first wait for it.
// aclInit is called once per process (a repeated call is not an error);
// aclFinalize is left to process exit.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"

extern "C" {
#include "backends/backend.h"
#include "backends/module/kv_module.h"
}
#define KV_MODULE_NAME "ascend"
#include "backends/module/module_common.h"

// The launchers ascendc_library() generates, one per kernel of kernels.cl.
#include "aclrtlaunch_kv_attention.h"
#include "aclrtlaunch_kv_attention_scores.h"
#include "aclrtlaunch_kv_bf16_round.h"
#include "aclrtlaunch_kv_compact.h"
#include "aclrtlaunch_kv_decode.h"
#include "aclrtlaunch_kv_dequantize.h"
#include "aclrtlaunch_kv_encode.h"
#include "aclrtlaunch_kv_merge.h"
#include "aclrtlaunch_kv_pack.h"
#include "aclrtlaunch_kv_quantize.h"
#include "aclrtlaunch_kv_split.h"
#include "aclrtlaunch_kv_unpack.h"

#ifndef KV_ASCEND_SOC
#define KV_ASCEND_SOC "unknown SoC"
#endif

static int acl_fail(kv_error *err, aclError e, const char *what)
{
    const char *why = aclGetRecentErrMsg();
    return kv_module_fail(err, KV_EFAIL, "ascend: %s failed: error %d%s%s", what, (int)e, why ? ": " : "",
                          why ? why : "");
}

// aclInit once per process; a repeated initialisation is fine.
static aclError acl_init(void)
{
    aclError e = aclInit(NULL);
    return e == ACL_ERROR_REPEAT_INITIALIZE ? ACL_SUCCESS : e;
}

static int ascend_device_count(kv_error *err)
{
    aclError e = acl_init();
    if (e != ACL_SUCCESS) {
        kv_module_fail(err, KV_EFAIL, "no device: aclInit failed (error %d)", (int)e);
        return 0;
    }
    uint32_t n = 0;
    e = aclrtGetDeviceCount(&n);
    if (e != ACL_SUCCESS || n == 0) {
        kv_module_fail(err, KV_EFAIL, "no device: aclrtGetDeviceCount: %s", e == ACL_SUCCESS ? "none" : "failed");
        return 0;
    }
    return (int)n;
}

struct npu_ctx {
    int32_t device;
    aclrtStream stream;
    void *scratch; // attention's (max hi, max lo, normaliser) per (query, head)
    size_t scratch_bytes;
    kv_backend_props props;
};

static void npu_destroy(void *vctx)
{
    npu_ctx *c = (npu_ctx *)vctx;
    if (!c)
        return;
    aclrtSetDevice(c->device);
    if (c->stream) {
        aclrtSynchronizeStream(c->stream);
        aclrtDestroyStream(c->stream);
    }
    if (c->scratch)
        aclrtFree(c->scratch);
    free(c);
}

static const kv_backend_i *npu_iface(void);

static int npu_open(int index, const kv_backend_i **iface, void **out, kv_error *err)
{
    int n = ascend_device_count(err);
    if (n == 0)
        return KV_EFAIL;
    if (index < 0 || index >= n)
        return kv_module_fail(err, KV_EINPUT, "ascend: no device %d (%d found)", index, n);
    aclError e = aclrtSetDevice(index);
    if (e != ACL_SUCCESS)
        return acl_fail(err, e, "aclrtSetDevice");
    npu_ctx *c = (npu_ctx *)kv_module_calloc(1, sizeof *c);
    c->device = index;
    e = aclrtCreateStream(&c->stream);
    if (e != ACL_SUCCESS) {
        c->stream = NULL;
        npu_destroy(c);
        return acl_fail(err, e, "aclrtCreateStream");
    }
    c->props.backend = "ascend";
    const char *soc = aclrtGetSocName();
    snprintf(c->props.device, sizeof c->props.device, "%s", soc ? soc : KV_ASCEND_SOC);
    size_t free_bytes = 0, total_bytes = 0;
    if (aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total_bytes) == ACL_SUCCESS)
        c->props.memory_bytes = total_bytes;
    int64_t cores = 0;
    if (aclGetDeviceCapability((uint32_t)index, ACL_DEVICE_INFO_AI_CORE_NUM, &cores) == ACL_SUCCESS)
        c->props.compute_units = (int)cores;
    c->props.mem_bandwidth_gbps = 0.0; // not reported by AscendCL; the benchmark measures
    *iface = npu_iface();
    *out = c;
    return KV_OK;
}

static int npu_get_props(void *vctx, kv_backend_props *props)
{
    *props = ((npu_ctx *)vctx)->props;
    return KV_OK;
}

static int npu_buffer_alloc(void *vctx, size_t bytes, kv_buffer **out, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    aclrtSetDevice(c->device);
    void *p = NULL;
    aclError e = aclrtMalloc(&p, bytes ? bytes : 1, ACL_MEM_MALLOC_HUGE_FIRST);
    if (e != ACL_SUCCESS)
        return acl_fail(err, e, "aclrtMalloc");
    kv_buffer *b = (kv_buffer *)kv_module_calloc(1, sizeof *b);
    b->ptr = p;
    b->bytes = bytes;
    *out = b;
    return KV_OK;
}

static void npu_buffer_free(void *vctx, kv_buffer *buf)
{
    npu_ctx *c = (npu_ctx *)vctx;
    if (!buf)
        return;
    aclrtSetDevice(c->device);
    aclrtSynchronizeStream(c->stream);
    aclrtFree(buf->ptr);
    free(buf);
}

static int npu_buffer_write(void *vctx, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    int rc = kv_module_check_range("buffer_write", "dst", dst, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    aclrtSetDevice(c->device);
    aclError e = aclrtSynchronizeStream(c->stream); // kernels still reading dst finish first
    if (e == ACL_SUCCESS)
        e = aclrtMemcpy((char *)dst->ptr + offset, dst->bytes - offset, src, bytes, ACL_MEMCPY_HOST_TO_DEVICE);
    return e == ACL_SUCCESS ? KV_OK : acl_fail(err, e, "buffer_write");
}

static int npu_buffer_read(void *vctx, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    int rc = kv_module_check_range("buffer_read", "src", src, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    aclrtSetDevice(c->device);
    aclError e = aclrtSynchronizeStream(c->stream);
    if (e == ACL_SUCCESS)
        e = aclrtMemcpy(dst, bytes, (const char *)src->ptr + offset, bytes, ACL_MEMCPY_DEVICE_TO_HOST);
    return e == ACL_SUCCESS ? KV_OK : acl_fail(err, e, "buffer_read");
}

static int npu_synchronize(void *vctx, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    aclrtSetDevice(c->device);
    aclError e = aclrtSynchronizeStream(c->stream);
    return e == ACL_SUCCESS ? KV_OK : acl_fail(err, e, "aclrtSynchronizeStream");
}

// ---- Launching: one block (one AI Core), see kv_device.h -----------------------------------

#define PTR(r) (void *)((r).buf ? (r).buf->ptr : NULL), (uint64_t)((r).buf ? (r).offset : 0)
#define LAYOUT(l) (uint32_t)(l).rows, (uint32_t)(l).cols, (uint32_t)(l).group_size, (uint32_t)(l).grouping

static int launched(npu_ctx *c, const char *name, uint32_t rc, kv_error *err)
{
    (void)c;
    return rc == 0 ? KV_OK : kv_module_fail(err, KV_EFAIL, "ascend: launching %s failed (%u)", name, rc);
}

static int npu_quantize(void *vctx, const kv_quantize_args *q, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    int rc = kv_module_check_range("quantize", "x", q->x.buf, q->x.offset, n * 4, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (rc || groups == 0)
        return rc;
    aclrtSetDevice(c->device);
    return launched(c, "quantize",
                    ACLRT_LAUNCH_KERNEL(kv_quantize)(1, c->stream, PTR(q->x), PTR(q->codes), PTR(q->scale),
                                                     PTR(q->zero), LAYOUT(q->layout), (uint32_t)q->bits),
                    err);
}

static int npu_dequantize(void *vctx, const kv_dequantize_args *q, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    int rc = kv_module_check_range("dequantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "out", q->out.buf, q->out.offset, n * 4, err);
    if (rc || n == 0)
        return rc;
    aclrtSetDevice(c->device);
    return launched(c, "dequantize",
                    ACLRT_LAUNCH_KERNEL(kv_dequantize)(1, c->stream, PTR(q->codes), PTR(q->scale), PTR(q->zero),
                                                       PTR(q->out), LAYOUT(q->layout), (uint32_t)q->bits,
                                                       (uint32_t)q->anchor_bits),
                    err);
}

static int npu_pack_common(npu_ctx *c, const kv_pack_args *p, int unpack, kv_error *err)
{
    const char *name = unpack ? "unpack" : "pack";
    size_t n = (size_t)p->layout.rows * p->layout.cols, bytes = kv_module_plane_bytes(&p->layout, p->bits);
    int rc = kv_module_check_range(name, "codes", p->codes.buf, p->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range(name, "packed", p->packed.buf, p->packed.offset, bytes, err);
    if (rc || n == 0)
        return rc;
    aclrtSetDevice(c->device);
    if (unpack)
        return launched(c, name,
                        ACLRT_LAUNCH_KERNEL(kv_unpack)(1, c->stream, PTR(p->packed), PTR(p->codes), LAYOUT(p->layout),
                                                       (uint32_t)p->bits),
                        err);
    return launched(c, name,
                    ACLRT_LAUNCH_KERNEL(kv_pack)(1, c->stream, PTR(p->codes), PTR(p->packed), (uint64_t)bytes,
                                                 LAYOUT(p->layout), (uint32_t)p->bits),
                    err);
}

static int npu_pack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return npu_pack_common((npu_ctx *)vctx, p, 0, err);
}

static int npu_unpack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return npu_pack_common((npu_ctx *)vctx, p, 1, err);
}

static int npu_split_common(npu_ctx *c, const kv_split_args *s, int merge, kv_error *err)
{
    const char *name = merge ? "merge" : "split";
    if (s->count > SIZE_MAX / 2)
        return kv_module_fail(err, KV_EINPUT, "ascend: %s: count %zu is too large", name, s->count);
    size_t bytes = s->count * 2;
    int rc = kv_module_check_range(name, "codes", s->codes.buf, s->codes.offset, bytes, err);
    if (!rc)
        rc = kv_module_check_range(name, "anchor", s->anchor.buf, s->anchor.offset, bytes, err);
    if (!rc)
        rc = kv_module_check_range(name, "residual", s->residual.buf, s->residual.offset, bytes, err);
    if (rc || s->count == 0)
        return rc;
    aclrtSetDevice(c->device);
    if (merge)
        return launched(c, name,
                        ACLRT_LAUNCH_KERNEL(kv_merge)(1, c->stream, PTR(s->codes), PTR(s->anchor), PTR(s->residual),
                                                      (uint64_t)s->count, (uint32_t)s->bits,
                                                      (uint32_t)s->anchor_bits),
                        err);
    return launched(c, name,
                    ACLRT_LAUNCH_KERNEL(kv_split)(1, c->stream, PTR(s->codes), PTR(s->anchor), PTR(s->residual),
                                                  (uint64_t)s->count, (uint32_t)s->bits, (uint32_t)s->anchor_bits),
                    err);
}

static int npu_split(void *vctx, const kv_split_args *s, kv_error *err)
{
    return npu_split_common((npu_ctx *)vctx, s, 0, err);
}

static int npu_merge(void *vctx, const kv_split_args *s, kv_error *err)
{
    return npu_split_common((npu_ctx *)vctx, s, 1, err);
}

static int npu_encode(void *vctx, const kv_encode_args *q, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    unsigned abits = q->anchor_bits ? q->anchor_bits : q->bits;
    int rc = kv_module_check_range("encode", "x", q->x.buf, q->x.offset, n * 4, err);
    if (!rc)
        rc = kv_module_check_range("encode", "anchor_packed", q->anchor_packed.buf, q->anchor_packed.offset,
                                   kv_module_plane_bytes(&q->layout, abits), err);
    if (!rc && q->anchor_bits)
        rc = kv_module_check_range("encode", "residual_packed", q->residual_packed.buf, q->residual_packed.offset,
                                   kv_module_plane_bytes(&q->layout, q->bits - q->anchor_bits), err);
    if (!rc)
        rc = kv_module_check_range("encode", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("encode", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (rc || groups == 0)
        return rc;
    kv_bref none = {NULL, 0};
    kv_bref res = q->anchor_bits ? q->residual_packed : none;
    aclrtSetDevice(c->device);
    return launched(c, "encode",
                    ACLRT_LAUNCH_KERNEL(kv_encode)(1, c->stream, PTR(q->x), PTR(q->anchor_packed), PTR(res),
                                                   PTR(q->scale), PTR(q->zero), LAYOUT(q->layout), (uint32_t)q->bits,
                                                   (uint32_t)q->anchor_bits),
                    err);
}

static int npu_decode(void *vctx, const kv_decode_args *q, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    unsigned abits = q->anchor_bits ? q->anchor_bits : q->bits;
    uint32_t has_residual = q->anchor_bits && q->residual_packed.buf;
    int rc = kv_module_check_range("decode", "anchor_packed", q->anchor_packed.buf, q->anchor_packed.offset,
                                   kv_module_plane_bytes(&q->layout, abits), err);
    if (!rc && has_residual)
        rc = kv_module_check_range("decode", "residual_packed", q->residual_packed.buf, q->residual_packed.offset,
                                   kv_module_plane_bytes(&q->layout, q->bits - q->anchor_bits), err);
    if (!rc)
        rc = kv_module_check_range("decode", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("decode", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("decode", "out", q->out.buf, q->out.offset, n * 4, err);
    if (rc || n == 0)
        return rc;
    kv_bref none = {NULL, 0};
    kv_bref res = has_residual ? q->residual_packed : none;
    aclrtSetDevice(c->device);
    return launched(c, "decode",
                    ACLRT_LAUNCH_KERNEL(kv_decode)(1, c->stream, PTR(q->anchor_packed), PTR(res), PTR(q->scale),
                                                   PTR(q->zero), PTR(q->out), LAYOUT(q->layout), (uint32_t)q->bits,
                                                   (uint32_t)q->anchor_bits, has_residual),
                    err);
}

static int npu_bf16_round(void *vctx, const kv_bf16_args *b, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    if (b->count > SIZE_MAX / 4)
        return kv_module_fail(err, KV_EINPUT, "ascend: bf16_round: count %zu is too large", b->count);
    int rc = kv_module_check_range("bf16_round", "in", b->in.buf, b->in.offset, b->count * 4, err);
    if (!rc)
        rc = kv_module_check_range("bf16_round", "out", b->out.buf, b->out.offset, b->count * 4, err);
    if (rc || b->count == 0)
        return rc;
    aclrtSetDevice(c->device);
    return launched(c, "bf16_round",
                    ACLRT_LAUNCH_KERNEL(kv_bf16_round)(1, c->stream, PTR(b->in), PTR(b->out), (uint64_t)b->count),
                    err);
}

static int npu_attention(void *vctx, const kv_attention_args *q, kv_error *err)
{
    npu_ctx *c = (npu_ctx *)vctx;
    uint64_t qh = (uint64_t)q->n_queries * q->n_heads;
    if (q->head_dim > 256) /* KV_MAX_HEAD_DIM of kernels.cl */
        return kv_module_fail(err, KV_EINPUT, "ascend: attention: head_dim %u is above the 256 this backend supports",
                              q->head_dim);
    int rc = kv_module_check_range("attention", "q", q->q.buf, q->q.offset, qh * q->head_dim * 4, err);
    if (!rc)
        rc = kv_module_check_range("attention", "q_pos", q->q_pos.buf, q->q_pos.offset, (size_t)q->n_queries * 4, err);
    if (!rc && q->n_pages)
        rc = kv_module_check_range("attention", "pages", q->pages.buf, q->pages.offset,
                                   (size_t)q->n_pages * sizeof(kv_page_desc), err);
    if (!rc)
        rc = kv_module_check_range("attention", "head_pages", q->head_pages.buf, q->head_pages.offset,
                                   (size_t)q->n_kv_heads * 8, err);
    if (!rc && q->n_pages)
        rc = kv_module_check_range("attention", "positions", q->positions.buf, q->positions.offset, 0, err);
    if (!rc && q->n_pages)
        rc = kv_module_check_range("attention", "kv_data", q->kv_data.buf, q->kv_data.offset, 0, err);
    if (!rc)
        rc = kv_module_check_range("attention", "out", q->out.buf, q->out.offset, qh * q->head_dim * 4, err);
    if (!rc && q->scores.buf)
        rc = kv_module_check_range("attention", "scores", q->scores.buf, q->scores.offset,
                                   (size_t)q->n_kv_heads * q->score_stride * 4, err);
    if (rc || qh == 0)
        return rc;
    kv_bref none = {NULL, 0};
    kv_bref pages = q->n_pages ? q->pages : none, positions = q->n_pages ? q->positions : none;
    kv_bref data = q->n_pages ? q->kv_data : none;
    uint64_t n_positions = positions.buf ? (positions.buf->bytes - positions.offset) / 4 : 0;
    uint64_t data_bytes = data.buf ? data.buf->bytes - data.offset : 0;
    aclrtSetDevice(c->device);
    void *ml = NULL;
    if (q->scores.buf) {
        size_t need = qh * 3 * sizeof(float);
        if (c->scratch_bytes < need) {
            aclrtSynchronizeStream(c->stream);
            if (c->scratch)
                aclrtFree(c->scratch);
            c->scratch = NULL;
            c->scratch_bytes = 0;
            aclError e = aclrtMalloc(&c->scratch, need, ACL_MEM_MALLOC_HUGE_FIRST);
            if (e != ACL_SUCCESS) {
                c->scratch = NULL;
                return acl_fail(err, e, "attention scratch allocation");
            }
            c->scratch_bytes = need;
        }
        ml = c->scratch;
    }
    rc = launched(c, "attention",
                  ACLRT_LAUNCH_KERNEL(kv_attention)(1, c->stream, PTR(q->q), PTR(q->q_pos), PTR(pages),
                                                    PTR(q->head_pages), PTR(positions), n_positions, PTR(data),
                                                    data_bytes, PTR(q->out), ml, (void *)NULL, q->n_queries,
                                                    q->n_heads, q->n_kv_heads, q->head_dim, q->n_pages,
                                                    1u /* one chunk: one AI Core */, q->scale),
                  err);
    if (rc || !q->scores.buf)
        return rc;
    return launched(c, "attention_scores",
                    ACLRT_LAUNCH_KERNEL(kv_attention_scores)(1, c->stream, PTR(q->q), PTR(q->q_pos), PTR(pages),
                                                             PTR(q->head_pages), PTR(positions), n_positions,
                                                             PTR(data), data_bytes, ml, PTR(q->scores),
                                                             q->score_stride, q->n_queries, q->n_heads,
                                                             q->n_kv_heads, q->head_dim, q->n_pages, q->scale),
                    err);
}

static int npu_compact_common(npu_ctx *c, const kv_compact_args *q, int release, kv_error *err)
{
    const char *name = release ? "compact_release" : "compact_alloc";
    int rc = kv_module_check_range(name, "demand", q->demand.buf, q->demand.offset, (size_t)q->n * 4, err);
    if (!rc)
        rc = kv_module_check_range(name, "offsets", q->offsets.buf, q->offsets.offset, (size_t)q->n * 4, err);
    if (!rc && q->pages.buf)
        rc = kv_module_check_range(name, "pages", q->pages.buf, q->pages.offset, 0, err);
    if (!rc)
        rc = kv_module_check_range(name, "free_list", q->free_list.buf, q->free_list.offset, (size_t)q->capacity * 4,
                                   err);
    if (!rc)
        rc = kv_module_check_range(name, "state", q->state.buf, q->state.offset, 16, err);
    if (rc)
        return rc;
    uint64_t pages_cap = q->pages.buf ? (q->pages.buf->bytes - q->pages.offset) / 4 : 0;
    aclrtSetDevice(c->device);
    return launched(c, name,
                    ACLRT_LAUNCH_KERNEL(kv_compact)(1, c->stream, PTR(q->demand), PTR(q->offsets), PTR(q->pages),
                                                    pages_cap, PTR(q->free_list), PTR(q->state), q->n, q->capacity,
                                                    (uint32_t)release),
                    err);
}

static int npu_compact_alloc(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return npu_compact_common((npu_ctx *)vctx, q, 0, err);
}

static int npu_compact_release(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return npu_compact_common((npu_ctx *)vctx, q, 1, err);
}

static const kv_backend_i *npu_iface(void)
{
    static const kv_backend_i iface = {
        KV_BACKEND_API_VERSION, npu_destroy,    npu_get_props,  npu_buffer_alloc, npu_buffer_free,
        npu_buffer_write,       npu_buffer_read, npu_synchronize, npu_quantize,     npu_dequantize,
        npu_pack,               npu_unpack,     npu_split,      npu_merge,        npu_encode,
        npu_decode,             npu_bf16_round, npu_attention,  npu_compact_alloc, npu_compact_release,
    };
    return &iface;
}

extern "C" __attribute__((visibility("default"))) const kv_module_entry *kv_module_entry_get(void)
{
    static const kv_module_entry entry = {
        KV_MODULE_ABI, KV_BACKEND_API_VERSION, "ascend", "CANN, Ascend C, " KV_ASCEND_SOC " (single AI Core, scalar)",
        ascend_device_count, npu_open,
    };
    return &entry;
}
