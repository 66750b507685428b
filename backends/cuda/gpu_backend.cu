// gpu_backend.cu — the CUDA backend module; the HIP backend is this same file
// compiled by hipcc through backends/hip/hip_compat.h (CUDA runtime names
// mapped to HIP ones). The kernels are backends/kernels/kernels.cl, compiled in
// the CUDA/HIP dialect of kv_device.h: one kernel source for OpenCL, CUDA and
// HIP, so the OpenCL runs on PoCL exercise the same algorithms bit for bit.
//
// Built as libkvsim_cuda.so / libkvsim_hip.so and loaded by kvsim with dlopen
// (kv_module.h says why). The module needs nothing from kvsim: it fills
// kv_error itself and uses only backend.h's types.
//
// Numerics: nvcc -fmad=false -prec-div=true -ftz=false, hipcc -ffp-contract=off
// -fhip-fp32-correctly-rounded-divide-sqrt -fno-gpu-flush-denormals-to-zero;
// never fast-math. Division in quantization is __fdiv_rn (kv_device.h).
//
// Streams: one stream per opened device; kernels are enqueued and return at
// once; buffer writes and reads wait for the stream (the host memory is free
// to reuse on return and a read sees every kernel enqueued before it).
#if defined(__HIPCC__)
#include "backends/hip/hip_compat.h"
#define KV_MODULE_NAME "hip"
#define KV_GPU_TOOLKIT "HIP"
#else
#include <cuda_runtime.h>
#define KV_MODULE_NAME "cuda"
#define KV_GPU_TOOLKIT "CUDA"
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backends/backend.h"
#include "backends/module/kv_module.h"
}
#include "backends/module/module_common.h"

#include "backends/kernels/kernels.cl"

#ifndef KV_GPU_ARCHS
#define KV_GPU_ARCHS "unknown targets"
#endif

// ---- Errors (the module cannot call kvsim's; module_common.h has the shared helpers) ----

static int gpu_fail(kv_error *err, cudaError_t e, const char *what)
{
    return kv_module_fail(err, KV_EFAIL, KV_MODULE_NAME ": %s failed: %s (%s, %d)", what, cudaGetErrorString(e),
                          cudaGetErrorName(e), (int)e);
}

// ---- Devices and contexts ---------------------------------------------------------

static int gpu_device_count(kv_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error
        kv_module_fail(err, KV_EFAIL, "no device: " KV_GPU_TOOLKIT " runtime: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        kv_module_fail(err, KV_EFAIL, "no device: the " KV_GPU_TOOLKIT " runtime reports none");
    return n;
}

struct gpu_ctx {
    int device;
    cudaStream_t stream;
    void *scratch; // attention's (max hi, max lo, normaliser) per (query, head); grown on demand
    size_t scratch_bytes;
    kv_backend_props props;
};

static void gpu_destroy(void *vctx)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->stream) {
        cudaStreamSynchronize(c->stream);
        cudaStreamDestroy(c->stream);
    }
    if (c->scratch)
        cudaFree(c->scratch);
    free(c);
}

static const kv_backend_i *gpu_iface(void);

static int gpu_open(int index, const kv_backend_i **iface, void **out, kv_error *err)
{
    int n = gpu_device_count(err);
    if (n == 0)
        return KV_EFAIL;
    if (index < 0 || index >= n)
        return kv_module_fail(err, KV_EINPUT, KV_MODULE_NAME ": no device %d (%d found)", index, n);
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess)
        return gpu_fail(err, e, "cudaSetDevice");
    gpu_ctx *c = (gpu_ctx *)kv_module_calloc(1, sizeof *c);
    c->device = index;
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        gpu_destroy(c);
        return gpu_fail(err, e, "cudaStreamCreate");
    }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) {
        gpu_destroy(c);
        return gpu_fail(err, e, "cudaGetDeviceProperties");
    }
    c->props.backend = KV_MODULE_NAME;
    snprintf(c->props.device, sizeof c->props.device, "%.127s", p.name);
    c->props.memory_bytes = p.totalGlobalMem;
    c->props.compute_units = p.multiProcessorCount;
    int clock_khz = 0, bus_bits = 0; // nominal peak: 2 transfers a clock (DDR) x bus width
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess)
        c->props.mem_bandwidth_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    cudaGetLastError();
    *iface = gpu_iface();
    *out = c;
    return KV_OK;
}

static int gpu_get_props(void *vctx, kv_backend_props *props)
{
    *props = ((gpu_ctx *)vctx)->props;
    return KV_OK;
}

// ---- Buffers -------------------------------------------------------------------------

static int gpu_buffer_alloc(void *vctx, size_t bytes, kv_buffer **out, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    cudaSetDevice(c->device);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return kv_module_fail(err, KV_EFAIL, KV_MODULE_NAME ": allocating %zu bytes failed: %s", bytes,
                              cudaGetErrorString(e));
    }
    kv_buffer *b = (kv_buffer *)kv_module_calloc(1, sizeof *b);
    b->ptr = p;
    b->bytes = bytes;
    *out = b;
    return KV_OK;
}

static void gpu_buffer_free(void *vctx, kv_buffer *buf)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    if (!buf)
        return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream); // kernels still using it finish first
    cudaFree(buf->ptr);
    free(buf);
}

static int gpu_buffer_write(void *vctx, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    int rc = kv_module_check_range("buffer_write", "dst", dst, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    cudaSetDevice(c->device);
    cudaError_t e = cudaMemcpyAsync((char *)dst->ptr + offset, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? KV_OK : gpu_fail(err, e, "buffer_write");
}

static int gpu_buffer_read(void *vctx, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    int rc = kv_module_check_range("buffer_read", "src", src, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    cudaSetDevice(c->device);
    cudaError_t e = cudaMemcpyAsync(dst, (const char *)src->ptr + offset, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? KV_OK : gpu_fail(err, e, "buffer_read");
}

static int gpu_synchronize(void *vctx, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    cudaSetDevice(c->device);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? KV_OK : gpu_fail(err, e, "cudaStreamSynchronize");
}

// ---- Launching -------------------------------------------------------------------------

// A buffer reference as the kernels take it: base pointer and byte offset.
#define REF(r) (const kv_u8 *)((r).buf ? (r).buf->ptr : NULL), (kv_u64)((r).buf ? (r).offset : 0)
#define WREF(r) (kv_u8 *)((r).buf ? (r).buf->ptr : NULL), (kv_u64)((r).buf ? (r).offset : 0)

// Runs body(blocks) for `items` work-items in blocks of KV_WG (capped: the kernels
// loop grid-stride), then checks the launch.
template <typename F>
static int launch(gpu_ctx *c, const char *name, kv_u64 items, F body, kv_error *err)
{
    if (items == 0)
        return KV_OK;
    kv_u64 blocks = (items + KV_WG - 1) / KV_WG;
    if (blocks > (1ull << 24)) // the kernels loop grid-stride, so a capped grid covers any size
        blocks = 1ull << 24;
    cudaSetDevice(c->device);
    body((unsigned)blocks);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KV_OK : gpu_fail(err, e, name);
}

#define LAYOUT(l) (l).rows, (l).cols, (l).group_size, (kv_u32)(l).grouping

// ---- Kernels ----------------------------------------------------------------------------

static int gpu_quantize(void *vctx, const kv_quantize_args *q, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    int rc = kv_module_check_range("quantize", "x", q->x.buf, q->x.offset, n * 4, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("quantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (rc)
        return rc;
    return launch(c, "quantize", groups, [&](unsigned grid) {
        kv_quantize<<<grid, KV_WG, 0, c->stream>>>(REF(q->x), WREF(q->codes), WREF(q->scale), WREF(q->zero),
                                                    LAYOUT(q->layout), q->bits);
    }, err);
}

static int gpu_dequantize(void *vctx, const kv_dequantize_args *q, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    int rc = kv_module_check_range("dequantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (!rc)
        rc = kv_module_check_range("dequantize", "out", q->out.buf, q->out.offset, n * 4, err);
    if (rc)
        return rc;
    return launch(c, "dequantize", n, [&](unsigned grid) {
        kv_dequantize<<<grid, KV_WG, 0, c->stream>>>(REF(q->codes), REF(q->scale), REF(q->zero), WREF(q->out),
                                                      LAYOUT(q->layout), q->bits, q->anchor_bits);
    }, err);
}

static int gpu_pack_common(gpu_ctx *c, const kv_pack_args *p, int unpack, kv_error *err)
{
    const char *name = unpack ? "unpack" : "pack";
    size_t n = (size_t)p->layout.rows * p->layout.cols, bytes = kv_module_plane_bytes(&p->layout, p->bits);
    int rc = kv_module_check_range(name, "codes", p->codes.buf, p->codes.offset, n * 2, err);
    if (!rc)
        rc = kv_module_check_range(name, "packed", p->packed.buf, p->packed.offset, bytes, err);
    if (rc)
        return rc;
    if (unpack)
        return launch(c, name, n, [&](unsigned grid) {
            kv_unpack<<<grid, KV_WG, 0, c->stream>>>(REF(p->packed), WREF(p->codes), LAYOUT(p->layout), p->bits);
        }, err);
    return launch(c, name, bytes, [&](unsigned grid) {
        kv_pack<<<grid, KV_WG, 0, c->stream>>>(REF(p->codes), WREF(p->packed), (kv_u64)bytes, LAYOUT(p->layout),
                                                p->bits);
    }, err);
}

static int gpu_pack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return gpu_pack_common((gpu_ctx *)vctx, p, 0, err);
}

static int gpu_unpack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return gpu_pack_common((gpu_ctx *)vctx, p, 1, err);
}

static int gpu_split_common(gpu_ctx *c, const kv_split_args *s, int merge, kv_error *err)
{
    const char *name = merge ? "merge" : "split";
    if (s->count > SIZE_MAX / 2)
        return kv_module_fail(err, KV_EINPUT, KV_MODULE_NAME ": %s: count %zu is too large", name, s->count);
    size_t bytes = s->count * 2;
    int rc = kv_module_check_range(name, "codes", s->codes.buf, s->codes.offset, bytes, err);
    if (!rc)
        rc = kv_module_check_range(name, "anchor", s->anchor.buf, s->anchor.offset, bytes, err);
    if (!rc)
        rc = kv_module_check_range(name, "residual", s->residual.buf, s->residual.offset, bytes, err);
    if (rc)
        return rc;
    if (merge)
        return launch(c, name, s->count, [&](unsigned grid) {
            kv_merge<<<grid, KV_WG, 0, c->stream>>>(WREF(s->codes), REF(s->anchor), REF(s->residual),
                                                     (kv_u64)s->count, s->bits, s->anchor_bits);
        }, err);
    return launch(c, name, s->count, [&](unsigned grid) {
        kv_split<<<grid, KV_WG, 0, c->stream>>>(REF(s->codes), WREF(s->anchor), WREF(s->residual), (kv_u64)s->count,
                                                 s->bits, s->anchor_bits);
    }, err);
}

static int gpu_split(void *vctx, const kv_split_args *s, kv_error *err)
{
    return gpu_split_common((gpu_ctx *)vctx, s, 0, err);
}

static int gpu_merge(void *vctx, const kv_split_args *s, kv_error *err)
{
    return gpu_split_common((gpu_ctx *)vctx, s, 1, err);
}

static int gpu_encode(void *vctx, const kv_encode_args *q, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
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
    if (rc)
        return rc;
    kv_bref res = q->anchor_bits ? q->residual_packed : kv_bref{NULL, 0};
    return launch(c, "encode", groups, [&](unsigned grid) {
        kv_encode<<<grid, KV_WG, 0, c->stream>>>(REF(q->x), WREF(q->anchor_packed), WREF(res), WREF(q->scale),
                                                  WREF(q->zero), LAYOUT(q->layout), q->bits, q->anchor_bits);
    }, err);
}

static int gpu_decode(void *vctx, const kv_decode_args *q, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    size_t n = (size_t)q->layout.rows * q->layout.cols, groups = kv_module_groups(&q->layout);
    unsigned abits = q->anchor_bits ? q->anchor_bits : q->bits;
    kv_u32 has_residual = q->anchor_bits && q->residual_packed.buf;
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
    if (rc)
        return rc;
    kv_bref res = has_residual ? q->residual_packed : kv_bref{NULL, 0};
    return launch(c, "decode", n, [&](unsigned grid) {
        kv_decode<<<grid, KV_WG, 0, c->stream>>>(REF(q->anchor_packed), REF(res), REF(q->scale), REF(q->zero),
                                                  WREF(q->out), LAYOUT(q->layout), q->bits, q->anchor_bits,
                                                  has_residual);
    }, err);
}

static int gpu_bf16_round(void *vctx, const kv_bf16_args *b, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    if (b->count > SIZE_MAX / 4)
        return kv_module_fail(err, KV_EINPUT, KV_MODULE_NAME ": bf16_round: count %zu is too large", b->count);
    int rc = kv_module_check_range("bf16_round", "in", b->in.buf, b->in.offset, b->count * 4, err);
    if (!rc)
        rc = kv_module_check_range("bf16_round", "out", b->out.buf, b->out.offset, b->count * 4, err);
    if (rc)
        return rc;
    return launch(c, "bf16_round", b->count, [&](unsigned grid) {
        kv_bf16_round<<<grid, KV_WG, 0, c->stream>>>(REF(b->in), WREF(b->out), (kv_u64)b->count);
    }, err);
}

static_assert(sizeof(kv_page_desc) == 4 * KV_PAGE_WORDS, "kv_page_desc must be 56 bytes");
static_assert(offsetof(kv_page_desc, key_data) == 24 && offsetof(kv_page_desc, value_meta) == 48,
              "kv_page_desc offsets");

static int gpu_attention(void *vctx, const kv_attention_args *q, kv_error *err)
{
    gpu_ctx *c = (gpu_ctx *)vctx;
    kv_u64 qh = (kv_u64)q->n_queries * q->n_heads;
    if (q->head_dim > 256) /* KV_MAX_HEAD_DIM of kernels.cl */
        return kv_module_fail(err, KV_EINPUT,
                              KV_MODULE_NAME ": attention: head_dim %u is above the 256 this backend supports",
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
    if (rc)
        return rc;
    kv_bref none = {NULL, 0};
    kv_bref pages = q->n_pages ? q->pages : none, positions = q->n_pages ? q->positions : none;
    kv_bref data = q->n_pages ? q->kv_data : none;
    kv_u64 n_positions = positions.buf ? (positions.buf->bytes - positions.offset) / 4 : 0;
    kv_u64 data_bytes = data.buf ? data.buf->bytes - data.offset : 0;
    // One scratch area: the scores' (max hi, max lo, normaliser) per (query, head), then the split
    // chunks' partials (kernels.cl, kv_attention) when the context is split.
    kv_u32 n_split = kv_dev_attn_splits(q->n_pages, q->n_kv_heads);
    size_t ml_floats = q->scores.buf ? qh * 3 : 0;
    size_t part_floats = n_split > 1 ? qh * n_split * ((size_t)q->head_dim + 3) : 0;
    float *ml = NULL, *part = NULL;
    if (qh && ml_floats + part_floats) {
        size_t need = (ml_floats + part_floats) * sizeof(float);
        if (c->scratch_bytes < need) {
            cudaSetDevice(c->device);
            cudaStreamSynchronize(c->stream);
            if (c->scratch)
                cudaFree(c->scratch);
            c->scratch = NULL;
            c->scratch_bytes = 0;
            cudaError_t e = cudaMalloc(&c->scratch, need);
            if (e != cudaSuccess) {
                c->scratch = NULL;
                return gpu_fail(err, e, "attention scratch allocation");
            }
            c->scratch_bytes = need;
        }
        ml = ml_floats ? (float *)c->scratch : NULL;
        part = part_floats ? (float *)c->scratch + ml_floats : NULL;
    }
    rc = launch(c, "attention", qh * n_split * KV_WG, [&](unsigned grid) {
        kv_attention<<<grid, KV_ATTN_WG, 0, c->stream>>>(REF(q->q), REF(q->q_pos), REF(pages), REF(q->head_pages),
                                                     REF(positions), n_positions, REF(data), data_bytes,
                                                     WREF(q->out), ml, part, q->n_queries, q->n_heads, q->n_kv_heads,
                                                     q->head_dim, q->n_pages, n_split, q->scale);
    }, err);
    if (!rc && part)
        rc = launch(c, "attention_merge", qh * KV_WG, [&](unsigned grid) {
            kv_attention_merge<<<grid, KV_WG, 0, c->stream>>>(part, WREF(q->out), ml, qh, q->head_dim, n_split);
        }, err);
    if (rc || !q->scores.buf)
        return rc;
    return launch(c, "attention_scores", (kv_u64)q->n_kv_heads * KV_WG, [&](unsigned grid) {
        kv_attention_scores<<<grid, KV_WG, 0, c->stream>>>(
            REF(q->q), REF(q->q_pos), REF(pages), REF(q->head_pages), REF(positions), n_positions, REF(data),
            data_bytes, ml, WREF(q->scores), q->score_stride, q->n_queries, q->n_heads, q->n_kv_heads, q->head_dim,
            q->n_pages, q->scale);
    }, err);
}

static int gpu_compact_common(gpu_ctx *c, const kv_compact_args *q, int release, kv_error *err)
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
    kv_u64 pages_cap = q->pages.buf ? (q->pages.buf->bytes - q->pages.offset) / 4 : 0;
    return launch(c, name, KV_WG, [&](unsigned grid) {
        kv_compact<<<grid, KV_WG, 0, c->stream>>>(REF(q->demand), WREF(q->offsets), WREF(q->pages), pages_cap,
                                                   WREF(q->free_list), WREF(q->state), q->n, q->capacity,
                                                   (kv_u32)release);
    }, err);
}

static int gpu_compact_alloc(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return gpu_compact_common((gpu_ctx *)vctx, q, 0, err);
}

static int gpu_compact_release(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return gpu_compact_common((gpu_ctx *)vctx, q, 1, err);
}

// ---- Tables ------------------------------------------------------------------------------

static const kv_backend_i *gpu_iface(void)
{
    static const kv_backend_i iface = {
        KV_BACKEND_API_VERSION,
        gpu_destroy,
        gpu_get_props,
        gpu_buffer_alloc,
        gpu_buffer_free,
        gpu_buffer_write,
        gpu_buffer_read,
        gpu_synchronize,
        gpu_quantize,
        gpu_dequantize,
        gpu_pack,
        gpu_unpack,
        gpu_split,
        gpu_merge,
        gpu_encode,
        gpu_decode,
        gpu_bf16_round,
        gpu_attention,
        gpu_compact_alloc,
        gpu_compact_release,
    };
    return &iface;
}

extern "C" __attribute__((visibility("default"))) const kv_module_entry *kv_module_entry_get(void)
{
    static const kv_module_entry entry = {
        KV_MODULE_ABI, KV_BACKEND_API_VERSION, KV_MODULE_NAME, KV_GPU_TOOLKIT ", " KV_GPU_ARCHS,
        gpu_device_count, gpu_open,
    };
    return &entry;
}
