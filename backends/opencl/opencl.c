/* opencl.c — the OpenCL backend: devices through the ICD loader, one in-order
 * queue per opened device, the kernels of kernels.cl built once per context.
 *
 * Design notes.
 *  - Devices: every device of every platform, GPUs first (in platform order),
 *    then the others; device 0 is therefore "the first GPU, else the first
 *    CPU or other device".
 *  - The kernel source is compiled into kvsim (embed.cmake); the program is
 *    built when a device is opened (and rebuilt with a smaller work-group if
 *    the device cannot run the barrier kernels at 64); kernels are created on first use,
 *    both cached in the context. PoCL also caches the compiled program on disk
 *    (~/.cache/pocl), which keeps repeated test processes fast.
 *  - Numerics: never -cl-fast-relaxed-math or -cl-mad-enable; the source turns
 *    FP_CONTRACT off. Quantization needs correctly rounded fp32 division: with
 *    CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT the program is built with
 *    -cl-fp32-correctly-rounded-divide-sqrt (KV_DIV_MODE 0); otherwise it
 *    divides in double when the device has cl_khr_fp64 (1), else in software
 *    (2). The environment variable KVSIM_OPENCL_DIV=native|double|soft forces
 *    a mode (tests use it to run the fallbacks on PoCL).
 *  - Work-groups: KV_WG = the largest power of two <= min(64, the device's
 *    maximum); KVSIM_OPENCL_WG_MAX=n caps it (tests check that results do not
 *    depend on it). Attention's shape: GPUs KV_LANES 1 and KV_ATTN_WG =
 *    KV_WG, CPU devices KV_LANES 16 in work-groups of 1 (choose_lanes);
 *    KVSIM_OPENCL_LANES=n forces the lanes. Its split over the context is
 *    kv_dev_attn_splits (kv_device.h), as on CUDA and HIP. The codec kernels
 *    on CPU devices (KV_LANES > 1) take whole groups per work-item
 *    (codec_items, encode_items).
 *  - Asynchrony: kernels are enqueued on one in-order queue and return at
 *    once; buffer writes and reads are blocking (the host's memory is free to
 *    reuse on return, and a read sees every kernel enqueued before it);
 *    synchronize is clFinish.
 *  - Arguments: the dispatcher (backend.c) checks sizes, bit widths and
 *    alignment; this file checks that every range lies inside its buffer.
 *    A context is used by one host thread at a time (kernel arguments are
 *    set on shared cl_kernel objects).
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_impl.h"
#include "backends/kernels/kv_device.h" /* kv_dev_attn_splits: the split every backend makes */
#include "core/base/alloc.h"
#include "kv_opencl_source.h" /* generated: kv_opencl_source[] */

/* ---- Devices -------------------------------------------------------------------- */

enum { MAX_DEVICES = 64, MAX_PLATFORMS = 16 };

static const char *cl_error_name(cl_int e)
{
    switch (e) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_PROGRAM: return "CL_INVALID_PROGRAM";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL: return "CL_INVALID_KERNEL";
    case CL_INVALID_ARG_INDEX: return "CL_INVALID_ARG_INDEX";
    case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error";
    }
}

static int cl_fail(kv_error *err, cl_int e, const char *what)
{
    return kv_error_set(err, KV_EFAIL, "opencl: %s failed: %s (%d)", what, cl_error_name(e), (int)e);
}

/* Every device of every platform, GPUs first. Returns the count (0 with err
   filled when there is none). */
static int list_devices(cl_device_id *out, kv_error *err)
{
    cl_platform_id platforms[MAX_PLATFORMS];
    cl_uint np = 0;
    cl_int e = clGetPlatformIDs(MAX_PLATFORMS, platforms, &np);
    if (e != CL_SUCCESS || np == 0) {
        kv_error_set(err, KV_EFAIL, "no device: the OpenCL ICD loader found no platform (%s)",
                     e == CL_SUCCESS ? "none installed" : cl_error_name(e));
        return 0;
    }
    if (np > MAX_PLATFORMS)
        np = MAX_PLATFORMS;
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        cl_device_type type = pass == 0 ? CL_DEVICE_TYPE_GPU : (CL_DEVICE_TYPE_ALL & ~(cl_device_type)CL_DEVICE_TYPE_GPU);
        for (cl_uint p = 0; p < np; p++) {
            cl_device_id ids[MAX_DEVICES];
            cl_uint nd = 0;
            if (clGetDeviceIDs(platforms[p], type, MAX_DEVICES, ids, &nd) != CL_SUCCESS)
                continue;
            for (cl_uint d = 0; d < nd && d < MAX_DEVICES && n < MAX_DEVICES; d++) {
                cl_device_type t = 0;
                clGetDeviceInfo(ids[d], CL_DEVICE_TYPE, sizeof t, &t, NULL);
                if (pass == 1 && (t & CL_DEVICE_TYPE_GPU))
                    continue; /* CL_DEVICE_TYPE_ALL & ~GPU is not honoured by every ICD */
                out[n++] = ids[d];
            }
        }
    }
    if (n == 0)
        kv_error_set(err, KV_EFAIL, "no device: %u OpenCL platform(s) but no device", (unsigned)np);
    return n;
}

static int opencl_device_count(kv_error *err)
{
    cl_device_id ids[MAX_DEVICES];
    return list_devices(ids, err);
}

/* ---- Context ---------------------------------------------------------------------- */

typedef enum kernel_id {
    K_QUANTIZE,
    K_DEQUANTIZE,
    K_PACK,
    K_UNPACK,
    K_SPLIT,
    K_MERGE,
    K_ENCODE,
    K_DECODE,
    K_BF16,
    K_ATTENTION,
    K_ATTN_MERGE,
    K_SCORES,
    K_COMPACT,
    K_COUNT
} kernel_id;

static const char *const kernel_names[K_COUNT] = {
    "kv_quantize", "kv_dequantize", "kv_pack",      "kv_unpack",           "kv_split",  "kv_merge",
    "kv_encode",   "kv_decode",     "kv_bf16_round", "kv_attention", "kv_attention_merge", "kv_attention_scores", "kv_compact",
};

typedef struct cl_ctx {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue; /* in-order */
    cl_program program;
    cl_kernel kernels[K_COUNT]; /* created on first use */
    size_t wg;                  /* KV_WG: work-group size of every launch but attention's (power of two) */
    size_t attn_wg;             /* KV_ATTN_WG: attention's work-group size (<= wg) */
    int lanes;                  /* KV_LANES: tokens per attention work-item (1 on GPUs) */
    int div_mode;               /* KV_DIV_MODE the program was built with */
    int fp64;                   /* KV_FP64: the device has cl_khr_fp64 (CPU attention's dot products) */
    kv_backend_props props;
} cl_ctx;

struct kv_buffer {
    cl_mem mem;
    size_t bytes; /* as asked for (the cl_mem has at least 1 byte) */
};

static void opencl_destroy(void *vctx)
{
    cl_ctx *c = vctx;
    if (!c)
        return;
    for (int k = 0; k < K_COUNT; k++)
        if (c->kernels[k])
            clReleaseKernel(c->kernels[k]);
    if (c->program)
        clReleaseProgram(c->program);
    if (c->queue)
        clReleaseCommandQueue(c->queue);
    if (c->context)
        clReleaseContext(c->context);
    kv_free(c);
}

static cl_kernel get_kernel(cl_ctx *c, kernel_id k, kv_error *err)
{
    if (!c->kernels[k]) {
        cl_int e = CL_SUCCESS;
        c->kernels[k] = clCreateKernel(c->program, kernel_names[k], &e);
        if (e != CL_SUCCESS) {
            c->kernels[k] = NULL;
            cl_fail(err, e, kernel_names[k]);
            return NULL;
        }
    }
    return c->kernels[k];
}

/* Chooses the division mode (see the file comment). */
static int choose_div_mode(cl_device_id dev, int *mode, kv_error *err)
{
    cl_device_fp_config fp = 0;
    clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    char ext[4096] = "";
    clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
    int native = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    int fp64 = strstr(ext, "cl_khr_fp64") != NULL;
    const char *force = getenv("KVSIM_OPENCL_DIV");
    if (force && *force) {
        if (strcmp(force, "native") == 0 && native)
            *mode = 0;
        else if (strcmp(force, "double") == 0 && fp64)
            *mode = 1;
        else if (strcmp(force, "soft") == 0)
            *mode = 2;
        else
            return kv_error_set(err, KV_EINPUT,
                                "KVSIM_OPENCL_DIV=%s: not available on this device (native: %s, double: %s, soft: yes)",
                                force, native ? "yes" : "no", fp64 ? "yes" : "no");
        return KV_OK;
    }
    *mode = native ? 0 : fp64 ? 1 : 2;
    return KV_OK;
}

/* Attention's shape on a CPU device (kernels.cl, kv_attention with
   KV_CPU_ATTENTION): work-groups of one work-item, each serving a batch of a
   GQA group's query heads, rows read 16 values at a time in vector types
   (KV_LANES > 1 selects it; the lane count itself no longer matters there). */
enum { CPU_LANES = 16, CPU_ATTN_WG = 1 };

/* Token groups per work-item of encode and quantize on CPU devices with the
   native division (kernels.cl's KV_CPU_GROUPS; the build passes this value). */
enum { CPU_CODEC_GROUPS = 16 };

/* KV_LANES for a device: CPU devices CPU_LANES, others 1 (the GPU shape);
   KVSIM_OPENCL_LANES=n forces n (1, 2, 4, 8 or 16: tests run the GPU shape on PoCL). */
static int choose_lanes(cl_device_id dev, int *lanes, kv_error *err)
{
    cl_device_type t = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof t, &t, NULL);
    *lanes = (t & CL_DEVICE_TYPE_CPU) ? CPU_LANES : 1;
    const char *force = getenv("KVSIM_OPENCL_LANES");
    if (force && *force) {
        int n = atoi(force);
        if (n != 1 && n != 2 && n != 4 && n != 8 && n != 16)
            return kv_error_set(err, KV_EINPUT, "KVSIM_OPENCL_LANES=%s: want 1, 2, 4, 8 or 16", force);
        *lanes = n;
    }
    return KV_OK;
}

/* KV_FP64: 1 when the device has cl_khr_fp64 (the CPU shape's attention then
   sums its dot products in double, else in float-float); KVSIM_OPENCL_FP64=0
   turns it off (tests run both on PoCL). */
static int choose_fp64(cl_device_id dev, int *fp64, kv_error *err)
{
    char ext[4096] = "";
    clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
    *fp64 = strstr(ext, "cl_khr_fp64") != NULL;
    const char *force = getenv("KVSIM_OPENCL_FP64");
    if (force && *force) {
        if (strcmp(force, "0") != 0 && strcmp(force, "1") != 0)
            return kv_error_set(err, KV_EINPUT, "KVSIM_OPENCL_FP64=%s: want 0 or 1", force);
        if (strcmp(force, "1") == 0 && !*fp64)
            return kv_error_set(err, KV_EINPUT, "KVSIM_OPENCL_FP64=1: the device has no cl_khr_fp64");
        *fp64 = force[0] == '1';
    }
    return KV_OK;
}

static int build_program(cl_ctx *c, kv_error *err)
{
    const char *src = kv_opencl_source;
    cl_int e = CL_SUCCESS;
    c->program = clCreateProgramWithSource(c->context, 1, &src, NULL, &e);
    if (e != CL_SUCCESS)
        return cl_fail(err, e, "clCreateProgramWithSource");
    char options[256];
    c->attn_wg = c->lanes > 1 && c->wg > CPU_ATTN_WG ? CPU_ATTN_WG : c->wg;
    snprintf(options, sizeof options,
             "-cl-std=CL1.2 -DKV_WG=%zu -DKV_ATTN_WG=%zu -DKV_LANES=%d -DKV_DIV_MODE=%d -DKV_FP64=%d -DKV_CPU_GROUPS=%d%s",
             c->wg, c->attn_wg, c->lanes, c->div_mode, c->fp64, (int)CPU_CODEC_GROUPS,
             c->div_mode == 0 ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    e = clBuildProgram(c->program, 1, &c->device, options, NULL, NULL);
    if (e != CL_SUCCESS) {
        size_t len = 0;
        clGetProgramBuildInfo(c->program, c->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
        char *log = kv_calloc(len + 1, 1);
        clGetProgramBuildInfo(c->program, c->device, CL_PROGRAM_BUILD_LOG, len, log, NULL);
        int rc = kv_error_set(err, KV_EFAIL, "opencl: building the kernels failed (%s, options %s): %.700s",
                              cl_error_name(e), options, log);
        kv_free(log);
        return rc;
    }
    return KV_OK;
}

static const kv_backend_i opencl_iface; /* below */

static int opencl_open(int index, const kv_backend_i **iface, void **out, kv_error *err)
{
    cl_device_id ids[MAX_DEVICES];
    int n = list_devices(ids, err);
    if (index < 0 || index >= n)
        return n == 0 ? KV_EFAIL : kv_error_set(err, KV_EINPUT, "opencl: no device %d (%d found)", index, n);
    cl_ctx *c = kv_calloc(1, sizeof *c);
    c->device = ids[index];
    cl_int e = CL_SUCCESS;
    int rc = KV_OK;
    c->context = clCreateContext(NULL, 1, &c->device, NULL, NULL, &e);
    if (e != CL_SUCCESS) {
        rc = cl_fail(err, e, "clCreateContext");
        goto fail;
    }
    c->queue = clCreateCommandQueue(c->context, c->device, 0, &e);
    if (e != CL_SUCCESS) {
        rc = cl_fail(err, e, "clCreateCommandQueue");
        goto fail;
    }
    size_t max_wg = 1;
    clGetDeviceInfo(c->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
    c->wg = 1;
    const char *wg_env = getenv("KVSIM_OPENCL_WG_MAX"); /* tests: results must not depend on it */
    size_t wg_cap = wg_env && atoi(wg_env) > 0 ? (size_t)atoi(wg_env) : 64;
    while (c->wg * 2 <= max_wg && c->wg * 2 <= wg_cap)
        c->wg *= 2;
    rc = choose_div_mode(c->device, &c->div_mode, err);
    if (!rc)
        rc = choose_lanes(c->device, &c->lanes, err);
    if (!rc)
        rc = choose_fp64(c->device, &c->fp64, err);
    if (rc)
        goto fail;
    rc = build_program(c, err);
    if (rc)
        goto fail;
    /* A device may allow fewer work-items for the kernels with local arrays
       and barriers than its maximum (registers): then rebuild with that. */
    for (int k = K_ATTENTION; k <= K_COMPACT; k++) {
        size_t kwg = 0;
        cl_kernel kern = get_kernel(c, (kernel_id)k, err);
        if (!kern) {
            rc = KV_EFAIL;
            goto fail;
        }
        clGetKernelWorkGroupInfo(kern, c->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL);
        if (kwg >= 1 && kwg < c->wg) {
            size_t wg = 1;
            while (wg * 2 <= kwg)
                wg *= 2;
            for (int j = 0; j < K_COUNT; j++)
                if (c->kernels[j]) {
                    clReleaseKernel(c->kernels[j]);
                    c->kernels[j] = NULL;
                }
            clReleaseProgram(c->program);
            c->program = NULL;
            c->wg = wg;
            rc = build_program(c, err);
            if (rc)
                goto fail;
            k = K_ATTENTION - 1; /* check again with the smaller size */
        }
    }

    c->props.backend = "opencl";
    clGetDeviceInfo(c->device, CL_DEVICE_NAME, sizeof c->props.device - 1, c->props.device, NULL);
    cl_ulong mem = 0;
    clGetDeviceInfo(c->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
    c->props.memory_bytes = mem;
    cl_uint cu = 0;
    clGetDeviceInfo(c->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    c->props.compute_units = (int)cu;
    c->props.mem_bandwidth_gbps = 0.0; /* OpenCL does not report it; the benchmark measures */
    *iface = &opencl_iface;
    *out = c;
    return KV_OK;
fail:
    opencl_destroy(c);
    return rc;
}

static int opencl_get_props(void *vctx, kv_backend_props *props)
{
    *props = ((cl_ctx *)vctx)->props;
    return KV_OK;
}

/* ---- Buffers ----------------------------------------------------------------------- */

static int opencl_buffer_alloc(void *vctx, size_t bytes, kv_buffer **out, kv_error *err)
{
    cl_ctx *c = vctx;
    cl_int e = CL_SUCCESS;
    cl_mem m = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &e);
    if (e != CL_SUCCESS)
        return kv_error_set(err, KV_EFAIL, "opencl: allocating %zu bytes failed: %s (%d)", bytes, cl_error_name(e),
                            (int)e);
    kv_buffer *b = kv_calloc(1, sizeof *b);
    b->mem = m;
    b->bytes = bytes;
    *out = b;
    return KV_OK;
}

static void opencl_buffer_free(void *vctx, kv_buffer *buf)
{
    (void)vctx;
    if (!buf)
        return;
    clReleaseMemObject(buf->mem);
    kv_free(buf);
}

/* The range [offset, offset + bytes) of buf, or an error naming the argument. */
static int check_range(const char *kernel, const char *name, const kv_buffer *buf, size_t offset, size_t bytes,
                       kv_error *err)
{
    if (!buf)
        return kv_error_set(err, KV_EINPUT, "opencl: %s: argument '%s' has no buffer", kernel, name);
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return kv_error_set(err, KV_EINPUT,
                            "opencl: %s: argument '%s' needs %zu bytes at offset %zu, but its buffer holds %zu",
                            kernel, name, bytes, offset, buf->bytes);
    return KV_OK;
}

static int opencl_buffer_write(void *vctx, kv_buffer *dst, size_t offset, const void *src, size_t bytes,
                               kv_error *err)
{
    cl_ctx *c = vctx;
    int rc = check_range("buffer_write", "dst", dst, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    cl_int e = clEnqueueWriteBuffer(c->queue, dst->mem, CL_TRUE, offset, bytes, src, 0, NULL, NULL);
    return e == CL_SUCCESS ? KV_OK : cl_fail(err, e, "clEnqueueWriteBuffer");
}

static int opencl_buffer_read(void *vctx, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err)
{
    cl_ctx *c = vctx;
    int rc = check_range("buffer_read", "src", src, offset, bytes, err);
    if (rc || bytes == 0)
        return rc;
    cl_int e = clEnqueueReadBuffer(c->queue, src->mem, CL_TRUE, offset, bytes, dst, 0, NULL, NULL);
    return e == CL_SUCCESS ? KV_OK : cl_fail(err, e, "clEnqueueReadBuffer");
}

static int opencl_synchronize(void *vctx, kv_error *err)
{
    cl_int e = clFinish(((cl_ctx *)vctx)->queue);
    return e == CL_SUCCESS ? KV_OK : cl_fail(err, e, "clFinish");
}

/* ---- Launching ---------------------------------------------------------------------- */

/* Collects kernel arguments; the first failure sticks. */
typedef struct args {
    cl_kernel k;
    cl_uint next;
    cl_int e;
} args;

static void arg_raw(args *a, size_t size, const void *value)
{
    if (a->e == CL_SUCCESS)
        a->e = clSetKernelArg(a->k, a->next, size, value);
    a->next++;
}

/* A buffer reference: two arguments, the cl_mem (NULL when absent) and the byte offset. */
static void arg_ref(args *a, kv_bref r)
{
    cl_mem m = r.buf ? r.buf->mem : NULL;
    cl_ulong off = r.buf ? (cl_ulong)r.offset : 0;
    arg_raw(a, sizeof m, r.buf ? (const void *)&m : NULL);
    arg_raw(a, sizeof off, &off);
}

static void arg_mem(args *a, cl_mem m)
{
    arg_raw(a, sizeof m, m ? (const void *)&m : NULL);
}

static void arg_u32(args *a, uint32_t v)
{
    cl_uint x = v;
    arg_raw(a, sizeof x, &x);
}

static void arg_u64(args *a, uint64_t v)
{
    cl_ulong x = v;
    arg_raw(a, sizeof x, &x);
}

static void arg_f32(args *a, float v)
{
    cl_float x = v;
    arg_raw(a, sizeof x, &x);
}

static void arg_layout(args *a, const kv_quant_layout *l)
{
    arg_u32(a, l->rows);
    arg_u32(a, l->cols);
    arg_u32(a, l->group_size);
    arg_u32(a, (uint32_t)l->grouping);
}

static int begin(cl_ctx *c, kernel_id id, args *a, kv_error *err)
{
    a->k = get_kernel(c, id, err);
    a->next = 0;
    a->e = CL_SUCCESS;
    return a->k ? KV_OK : KV_EFAIL;
}

/* Enqueues `items` work-items in work-groups of `local` (global rounded up). */
static int launch(cl_ctx *c, kernel_id id, args *a, uint64_t items, size_t local, kv_error *err)
{
    if (a->e != CL_SUCCESS)
        return cl_fail(err, a->e, kernel_names[id]);
    if (items == 0)
        return KV_OK;
    size_t global = (size_t)((items + local - 1) / local * local);
    cl_int e = clEnqueueNDRangeKernel(c->queue, a->k, 1, NULL, &global, &local, 0, NULL, NULL);
    return e == CL_SUCCESS ? KV_OK : cl_fail(err, e, kernel_names[id]);
}

static uint64_t layout_count(const kv_quant_layout *l)
{
    return (uint64_t)l->rows * l->cols;
}

/* Work-items of decode, dequantize, pack and unpack: on CPU devices
   (KV_LANES > 1: kernels.cl's KV_CPU_CODEC) TOKEN groups take one work-item
   per group, everything else one per element (pack: per packed byte). */
static uint64_t codec_items(const cl_ctx *c, const kv_quant_layout *l, uint64_t per_item)
{
    return c->lanes > 1 && l->grouping == KV_GROUP_TOKEN ? kv_layout_groups(l) : per_item;
}

/* Work-items of encode and quantize: on CPU devices with the native division
   (kernels.cl's KV_CPU_ENCODE) one per CPU_CODEC_GROUPS TOKEN groups, and
   for encode (channels 1) one per group_size rows x 16 columns of CHANNEL
   groups; else one per group. */
static uint64_t encode_items(const cl_ctx *c, const kv_quant_layout *l, int channels)
{
    uint64_t groups = kv_layout_groups(l);
    if (c->lanes == 1 || c->div_mode != 0 || (l->grouping == KV_GROUP_CHANNEL && !channels))
        return groups;
    if (l->grouping == KV_GROUP_TOKEN)
        return (groups + CPU_CODEC_GROUPS - 1) / CPU_CODEC_GROUPS;
    return (((uint64_t)l->rows + l->group_size - 1) / l->group_size) * ((l->cols + 15u) / 16u);
}

/* ---- Kernels ------------------------------------------------------------------------- */

static int opencl_quantize(void *vctx, const kv_quantize_args *q, kv_error *err)
{
    cl_ctx *c = vctx;
    uint64_t n = layout_count(&q->layout);
    size_t groups = kv_layout_groups(&q->layout);
    int rc = check_range("quantize", "x", q->x.buf, q->x.offset, n * 4, err);
    if (!rc)
        rc = check_range("quantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = check_range("quantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = check_range("quantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    args a;
    if (!rc)
        rc = begin(c, K_QUANTIZE, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, q->x);
    arg_ref(&a, q->codes);
    arg_ref(&a, q->scale);
    arg_ref(&a, q->zero);
    arg_layout(&a, &q->layout);
    arg_u32(&a, q->bits);
    return launch(c, K_QUANTIZE, &a, encode_items(c, &q->layout, 0), c->wg, err);
}

static int opencl_dequantize(void *vctx, const kv_dequantize_args *q, kv_error *err)
{
    cl_ctx *c = vctx;
    uint64_t n = layout_count(&q->layout);
    size_t groups = kv_layout_groups(&q->layout);
    int rc = check_range("dequantize", "codes", q->codes.buf, q->codes.offset, n * 2, err);
    if (!rc)
        rc = check_range("dequantize", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = check_range("dequantize", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (!rc)
        rc = check_range("dequantize", "out", q->out.buf, q->out.offset, n * 4, err);
    args a;
    if (!rc)
        rc = begin(c, K_DEQUANTIZE, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, q->codes);
    arg_ref(&a, q->scale);
    arg_ref(&a, q->zero);
    arg_ref(&a, q->out);
    arg_layout(&a, &q->layout);
    arg_u32(&a, q->bits);
    arg_u32(&a, q->anchor_bits);
    return launch(c, K_DEQUANTIZE, &a, codec_items(c, &q->layout, n), c->wg, err);
}

static int pack_common(cl_ctx *c, const kv_pack_args *p, int unpack, kv_error *err)
{
    const char *name = unpack ? "unpack" : "pack";
    uint64_t n = layout_count(&p->layout);
    size_t bytes = kv_layout_packed_bytes(&p->layout, p->bits);
    int rc = check_range(name, "codes", p->codes.buf, p->codes.offset, n * 2, err);
    if (!rc)
        rc = check_range(name, "packed", p->packed.buf, p->packed.offset, bytes, err);
    args a;
    kernel_id id = unpack ? K_UNPACK : K_PACK;
    if (!rc)
        rc = begin(c, id, &a, err);
    if (rc)
        return rc;
    if (unpack) {
        arg_ref(&a, p->packed);
        arg_ref(&a, p->codes);
    } else {
        arg_ref(&a, p->codes);
        arg_ref(&a, p->packed);
        arg_u64(&a, bytes);
    }
    arg_layout(&a, &p->layout);
    arg_u32(&a, p->bits);
    return launch(c, id, &a, codec_items(c, &p->layout, unpack ? n : bytes), c->wg, err);
}

static int opencl_pack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return pack_common(vctx, p, 0, err);
}

static int opencl_unpack(void *vctx, const kv_pack_args *p, kv_error *err)
{
    return pack_common(vctx, p, 1, err);
}

static int split_common(cl_ctx *c, const kv_split_args *s, int merge, kv_error *err)
{
    const char *name = merge ? "merge" : "split";
    size_t bytes = s->count * 2;
    if (s->count > SIZE_MAX / 2)
        return kv_error_set(err, KV_EINPUT, "opencl: %s: count %zu is too large", name, s->count);
    int rc = check_range(name, "codes", s->codes.buf, s->codes.offset, bytes, err);
    if (!rc)
        rc = check_range(name, "anchor", s->anchor.buf, s->anchor.offset, bytes, err);
    if (!rc)
        rc = check_range(name, "residual", s->residual.buf, s->residual.offset, bytes, err);
    args a;
    kernel_id id = merge ? K_MERGE : K_SPLIT;
    if (!rc)
        rc = begin(c, id, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, s->codes);
    arg_ref(&a, s->anchor);
    arg_ref(&a, s->residual);
    arg_u64(&a, s->count);
    arg_u32(&a, s->bits);
    arg_u32(&a, s->anchor_bits);
    return launch(c, id, &a, s->count, c->wg, err);
}

static int opencl_split(void *vctx, const kv_split_args *s, kv_error *err)
{
    return split_common(vctx, s, 0, err);
}

static int opencl_merge(void *vctx, const kv_split_args *s, kv_error *err)
{
    return split_common(vctx, s, 1, err);
}

static int opencl_encode(void *vctx, const kv_encode_args *q, kv_error *err)
{
    cl_ctx *c = vctx;
    uint64_t n = layout_count(&q->layout);
    size_t groups = kv_layout_groups(&q->layout);
    unsigned abits = q->anchor_bits ? q->anchor_bits : q->bits;
    int rc = check_range("encode", "x", q->x.buf, q->x.offset, n * 4, err);
    if (!rc)
        rc = check_range("encode", "anchor_packed", q->anchor_packed.buf, q->anchor_packed.offset,
                         kv_layout_packed_bytes(&q->layout, abits), err);
    if (!rc && q->anchor_bits)
        rc = check_range("encode", "residual_packed", q->residual_packed.buf, q->residual_packed.offset,
                         kv_layout_packed_bytes(&q->layout, q->bits - q->anchor_bits), err);
    if (!rc)
        rc = check_range("encode", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = check_range("encode", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    args a;
    if (!rc)
        rc = begin(c, K_ENCODE, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, q->x);
    arg_ref(&a, q->anchor_packed);
    arg_ref(&a, q->anchor_bits ? q->residual_packed : (kv_bref){NULL, 0});
    arg_ref(&a, q->scale);
    arg_ref(&a, q->zero);
    arg_layout(&a, &q->layout);
    arg_u32(&a, q->bits);
    arg_u32(&a, q->anchor_bits);
    return launch(c, K_ENCODE, &a, encode_items(c, &q->layout, 1), c->wg, err);
}

static int opencl_decode(void *vctx, const kv_decode_args *q, kv_error *err)
{
    cl_ctx *c = vctx;
    uint64_t n = layout_count(&q->layout);
    size_t groups = kv_layout_groups(&q->layout);
    unsigned abits = q->anchor_bits ? q->anchor_bits : q->bits;
    int has_residual = q->anchor_bits && q->residual_packed.buf;
    int rc = check_range("decode", "anchor_packed", q->anchor_packed.buf, q->anchor_packed.offset,
                         kv_layout_packed_bytes(&q->layout, abits), err);
    if (!rc && has_residual)
        rc = check_range("decode", "residual_packed", q->residual_packed.buf, q->residual_packed.offset,
                         kv_layout_packed_bytes(&q->layout, q->bits - q->anchor_bits), err);
    if (!rc)
        rc = check_range("decode", "scale", q->scale.buf, q->scale.offset, groups * 2, err);
    if (!rc)
        rc = check_range("decode", "zero", q->zero.buf, q->zero.offset, groups * 2, err);
    if (!rc)
        rc = check_range("decode", "out", q->out.buf, q->out.offset, n * 4, err);
    args a;
    if (!rc)
        rc = begin(c, K_DECODE, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, q->anchor_packed);
    arg_ref(&a, has_residual ? q->residual_packed : (kv_bref){NULL, 0});
    arg_ref(&a, q->scale);
    arg_ref(&a, q->zero);
    arg_ref(&a, q->out);
    arg_layout(&a, &q->layout);
    arg_u32(&a, q->bits);
    arg_u32(&a, q->anchor_bits);
    arg_u32(&a, (uint32_t)has_residual);
    return launch(c, K_DECODE, &a, codec_items(c, &q->layout, n), c->wg, err);
}

static int opencl_bf16_round(void *vctx, const kv_bf16_args *b, kv_error *err)
{
    cl_ctx *c = vctx;
    if (b->count > SIZE_MAX / 4)
        return kv_error_set(err, KV_EINPUT, "opencl: bf16_round: count %zu is too large", b->count);
    int rc = check_range("bf16_round", "in", b->in.buf, b->in.offset, b->count * 4, err);
    if (!rc)
        rc = check_range("bf16_round", "out", b->out.buf, b->out.offset, b->count * 4, err);
    args a;
    if (!rc)
        rc = begin(c, K_BF16, &a, err);
    if (rc)
        return rc;
    arg_ref(&a, b->in);
    arg_ref(&a, b->out);
    arg_u64(&a, b->count);
    return launch(c, K_BF16, &a, b->count, c->wg, err);
}

/* The kernels read kv_page_desc as 14 u32 words; make sure the struct agrees. */
_Static_assert(sizeof(kv_page_desc) == 56, "kv_page_desc must be 56 bytes");
_Static_assert(offsetof(kv_page_desc, key) == 8 && offsetof(kv_page_desc, value) == 16, "kv_page_desc formats");
_Static_assert(offsetof(kv_page_desc, key_data) == 24 && offsetof(kv_page_desc, value_meta) == 48,
               "kv_page_desc offsets");
_Static_assert(offsetof(kv_store_format, group_size) == 4, "kv_store_format layout");

static int opencl_attention(void *vctx, const kv_attention_args *q, kv_error *err)
{
    cl_ctx *c = vctx;
    uint64_t qh = (uint64_t)q->n_queries * q->n_heads;
    if (q->head_dim > 256) /* KV_MAX_HEAD_DIM of kernels.cl */
        return kv_error_set(err, KV_EINPUT, "opencl: attention: head_dim %u is above the 256 this backend supports", q->head_dim);
    int rc = check_range("attention", "q", q->q.buf, q->q.offset, qh * q->head_dim * 4, err);
    if (!rc)
        rc = check_range("attention", "q_pos", q->q_pos.buf, q->q_pos.offset, (size_t)q->n_queries * 4, err);
    if (!rc && q->n_pages)
        rc = check_range("attention", "pages", q->pages.buf, q->pages.offset, (size_t)q->n_pages * sizeof(kv_page_desc),
                         err);
    if (!rc)
        rc = check_range("attention", "head_pages", q->head_pages.buf, q->head_pages.offset,
                         (size_t)q->n_kv_heads * 8, err);
    if (!rc && q->n_pages)
        rc = check_range("attention", "positions", q->positions.buf, q->positions.offset, 0, err);
    if (!rc && q->n_pages)
        rc = check_range("attention", "kv_data", q->kv_data.buf, q->kv_data.offset, 0, err);
    if (!rc)
        rc = check_range("attention", "out", q->out.buf, q->out.offset, qh * q->head_dim * 4, err);
    if (!rc && q->scores.buf)
        rc = check_range("attention", "scores", q->scores.buf, q->scores.offset,
                         (size_t)q->n_kv_heads * q->score_stride * 4, err);
    if (rc)
        return rc;
    kv_bref pages = q->n_pages ? q->pages : (kv_bref){NULL, 0};
    kv_bref positions = q->n_pages ? q->positions : (kv_bref){NULL, 0};
    kv_bref data = q->n_pages ? q->kv_data : (kv_bref){NULL, 0};
    uint64_t n_positions = positions.buf ? (positions.buf->bytes - positions.offset) / 4 : 0;
    uint64_t data_bytes = data.buf ? data.buf->bytes - data.offset : 0;

    cl_mem ml = NULL; /* (max logit hi, lo, normaliser) per (query, head), for the scores */
    if (q->scores.buf && qh) {
        cl_int e = CL_SUCCESS;
        ml = clCreateBuffer(c->context, CL_MEM_READ_WRITE, qh * 3 * sizeof(float), NULL, &e);
        if (e != CL_SUCCESS)
            return cl_fail(err, e, "attention scratch allocation");
    }
    uint32_t n_split = kv_dev_attn_splits(q->n_pages, q->n_kv_heads);
    cl_mem part = NULL; /* each chunk's (max hi, lo, normaliser, weighted V) when the context is split */
    if (n_split > 1 && qh) {
        cl_int e = CL_SUCCESS;
        part = clCreateBuffer(c->context, CL_MEM_READ_WRITE, qh * n_split * ((size_t)q->head_dim + 3) * sizeof(float),
                              NULL, &e);
        if (e != CL_SUCCESS) {
            if (ml)
                clReleaseMemObject(ml);
            return cl_fail(err, e, "attention split scratch allocation");
        }
    }
    args a;
    rc = begin(c, K_ATTENTION, &a, err);
    if (!rc) {
        arg_ref(&a, q->q);
        arg_ref(&a, q->q_pos);
        arg_ref(&a, pages);
        arg_ref(&a, q->head_pages);
        arg_ref(&a, positions);
        arg_u64(&a, n_positions);
        arg_ref(&a, data);
        arg_u64(&a, data_bytes);
        arg_ref(&a, q->out);
        arg_mem(&a, ml);
        arg_mem(&a, part);
        arg_u32(&a, q->n_queries);
        arg_u32(&a, q->n_heads);
        arg_u32(&a, q->n_kv_heads);
        arg_u32(&a, q->head_dim);
        arg_u32(&a, q->n_pages);
        arg_u32(&a, n_split);
        arg_f32(&a, q->scale);
        rc = launch(c, K_ATTENTION, &a, qh * n_split * c->attn_wg, c->attn_wg, err);
    }
    if (!rc && part)
        rc = begin(c, K_ATTN_MERGE, &a, err);
    if (!rc && part) {
        arg_mem(&a, part);
        arg_ref(&a, q->out);
        arg_mem(&a, ml);
        arg_u64(&a, qh);
        arg_u32(&a, q->head_dim);
        arg_u32(&a, n_split);
        rc = launch(c, K_ATTN_MERGE, &a, qh * c->wg, c->wg, err);
    }
    if (!rc && q->scores.buf)
        rc = begin(c, K_SCORES, &a, err);
    if (!rc && q->scores.buf) {
        arg_ref(&a, q->q);
        arg_ref(&a, q->q_pos);
        arg_ref(&a, pages);
        arg_ref(&a, q->head_pages);
        arg_ref(&a, positions);
        arg_u64(&a, n_positions);
        arg_ref(&a, data);
        arg_u64(&a, data_bytes);
        arg_mem(&a, ml);
        arg_ref(&a, q->scores);
        arg_u32(&a, q->score_stride);
        arg_u32(&a, q->n_queries);
        arg_u32(&a, q->n_heads);
        arg_u32(&a, q->n_kv_heads);
        arg_u32(&a, q->head_dim);
        arg_u32(&a, q->n_pages);
        arg_f32(&a, q->scale);
        rc = launch(c, K_SCORES, &a, (uint64_t)q->n_kv_heads * c->wg, c->wg, err);
    }
    if (ml)
        clReleaseMemObject(ml); /* freed once the enqueued kernels are done with it */
    if (part)
        clReleaseMemObject(part);
    return rc;
}

static int compact_common(cl_ctx *c, const kv_compact_args *q, int release, kv_error *err)
{
    const char *name = release ? "compact_release" : "compact_alloc";
    int rc = check_range(name, "demand", q->demand.buf, q->demand.offset, (size_t)q->n * 4, err);
    if (!rc)
        rc = check_range(name, "offsets", q->offsets.buf, q->offsets.offset, (size_t)q->n * 4, err);
    if (!rc && q->pages.buf)
        rc = check_range(name, "pages", q->pages.buf, q->pages.offset, 0, err);
    if (!rc)
        rc = check_range(name, "free_list", q->free_list.buf, q->free_list.offset, (size_t)q->capacity * 4, err);
    if (!rc)
        rc = check_range(name, "state", q->state.buf, q->state.offset, 16, err);
    args a;
    if (!rc)
        rc = begin(c, K_COMPACT, &a, err);
    if (rc)
        return rc;
    uint64_t pages_cap = q->pages.buf ? (q->pages.buf->bytes - q->pages.offset) / 4 : 0;
    arg_ref(&a, q->demand);
    arg_ref(&a, q->offsets);
    arg_ref(&a, q->pages);
    arg_u64(&a, pages_cap);
    arg_ref(&a, q->free_list);
    arg_ref(&a, q->state);
    arg_u32(&a, q->n);
    arg_u32(&a, q->capacity);
    arg_u32(&a, (uint32_t)release);
    return launch(c, K_COMPACT, &a, c->wg, c->wg, err);
}

static int opencl_compact_alloc(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return compact_common(vctx, q, 0, err);
}

static int opencl_compact_release(void *vctx, const kv_compact_args *q, kv_error *err)
{
    return compact_common(vctx, q, 1, err);
}

/* ---- Tables ------------------------------------------------------------------------- */

static const kv_backend_i opencl_iface = {
    .api_version = KV_BACKEND_API_VERSION,
    .destroy = opencl_destroy,
    .get_props = opencl_get_props,
    .buffer_alloc = opencl_buffer_alloc,
    .buffer_free = opencl_buffer_free,
    .buffer_write = opencl_buffer_write,
    .buffer_read = opencl_buffer_read,
    .synchronize = opencl_synchronize,
    .quantize = opencl_quantize,
    .dequantize = opencl_dequantize,
    .pack = opencl_pack,
    .unpack = opencl_unpack,
    .split = opencl_split,
    .merge = opencl_merge,
    .encode = opencl_encode,
    .decode = opencl_decode,
    .bf16_round = opencl_bf16_round,
    .attention = opencl_attention,
    .compact_alloc = opencl_compact_alloc,
    .compact_release = opencl_compact_release,
};

static const kv_backend_reg opencl_reg = {
    .name = "opencl",
    .device_count = opencl_device_count,
    .open = opencl_open,
};

const kv_backend_reg *kv_backend_opencl_reg(void)
{
    return &opencl_reg;
}
