/* cpu_backend.c — the CPU backend: host buffers, the registry entry, and the
 * kernel table of its two devices.
 *
 * Device 0 ("cpu") is the fast one: kernels run on all cores through a
 * thread pool, encode/decode/pack/unpack/attention use the fast paths.
 * Device 1 is the reference: one thread, the plain loops of cpu_ref.c and the
 * double-precision attention. Both execute each kernel to completion inside
 * the enqueue call, so synchronize has nothing left to wait for; callers
 * must still call it, as on any backend. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend_impl.h"
#include "backends/cpu/cpu_internal.h"
#include "core/base/alloc.h"

/* ---- Buffers ------------------------------------------------------------------- */

static int cpu_buffer_alloc(void *ctx, size_t bytes, kv_buffer **out, kv_error *err)
{
    (void)ctx;
    if (bytes > SIZE_MAX - 64)
        return kv_error_set(err, KV_EINPUT, "cpu: buffer of %zu bytes is too large", bytes);
    kv_buffer *b = kv_calloc(1, sizeof *b);
    size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    b->data = aligned_alloc(64, rounded ? rounded : 64);
    if (!b->data) {
        kv_free(b);
        return kv_error_set(err, KV_EFAIL, "cpu: out of memory allocating a %zu-byte buffer", bytes);
    }
    b->bytes = bytes;
    *out = b;
    return KV_OK;
}

static void cpu_buffer_free(void *ctx, kv_buffer *b)
{
    (void)ctx;
    if (!b)
        return;
    free(b->data);
    kv_free(b);
}

static int cpu_buffer_write(void *ctx, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err)
{
    (void)ctx;
    void *p;
    kv_bref r = {dst, offset};
    int rc = kv_cpu_span(&r, bytes, &p, "buffer_write", "dst", err);
    if (!rc && bytes)
        memcpy(p, src, bytes);
    return rc;
}

static int cpu_buffer_read(void *ctx, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err)
{
    (void)ctx;
    void *p;
    kv_bref r = {src, offset};
    int rc = kv_cpu_span(&r, bytes, &p, "buffer_read", "src", err);
    if (!rc && bytes)
        memcpy(dst, p, bytes);
    return rc;
}

static int cpu_synchronize(void *ctx, kv_error *err)
{
    (void)ctx;
    (void)err;
    return KV_OK; /* every kernel already ran to completion when it was enqueued */
}

/* ---- Parallel loops ------------------------------------------------------------- */

/* Items (groups or elements) per chunk so that a chunk moves about 64 KiB. */
static size_t grain_for(size_t items_per_unit, size_t unit_elems)
{
    size_t g = 16384 / (unit_elems ? unit_elems : 1);
    (void)items_per_unit;
    return g ? g : 1;
}

/* Everything a chunk of any quantization kernel needs. */
typedef struct qjob {
    const cpu_ctx *c;
    const kv_quant_layout *l;
    unsigned bits, anchor_bits;
    const float *x;
    float *out;
    uint16_t *codes, *anchor, *residual, *scale, *zero;
    uint8_t *packed, *packed2;
} qjob;

static void run_groups(const cpu_ctx *c, const qjob *j, kv_cpu_range_fn fn)
{
    size_t groups = kv_layout_groups(j->l);
    kv_cpu_pool_run(c->pool, groups, grain_for(groups, j->l->group_size), fn, (void *)j);
}

static void job_quantize(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    if (j->c->reference)
        kv_cpu_ref_quantize(j->l, j->bits, j->x, j->codes, j->scale, j->zero, g0, g1);
    else
        kv_cpu_fast_quantize(j->c->isa, j->c->divide, j->l, j->bits, j->x, j->codes, j->scale, j->zero, g0, g1);
}

static void job_dequantize(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    if (j->c->reference)
        kv_cpu_ref_dequantize(j->l, j->bits, j->anchor_bits, j->codes, j->scale, j->zero, j->out, g0, g1);
    else
        kv_cpu_fast_dequantize(j->c->isa, j->l, j->bits, j->anchor_bits, j->codes, j->scale, j->zero, j->out, g0,
                               g1);
}

static void job_pack(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    if (j->c->reference)
        kv_cpu_ref_pack(j->l, j->bits, j->codes, j->packed, g0, g1);
    else
        kv_cpu_fast_pack(j->c->isa, j->l, j->bits, j->codes, j->packed, g0, g1);
}

static void job_unpack(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    if (j->c->reference)
        kv_cpu_ref_unpack(j->l, j->bits, j->packed, j->codes, g0, g1);
    else
        kv_cpu_fast_unpack(j->c->isa, j->l, j->bits, j->packed, j->codes, g0, g1);
}

static void job_split(void *arg, size_t i0, size_t i1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    kv_cpu_ref_split(j->bits, j->anchor_bits, j->codes, j->anchor, j->residual, i0, i1);
}

static void job_merge(void *arg, size_t i0, size_t i1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    kv_cpu_ref_merge(j->bits, j->anchor_bits, j->anchor, j->residual, j->codes, i0, i1);
}

static void job_bf16(void *arg, size_t i0, size_t i1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    kv_cpu_ref_bf16_round(j->x, j->out, i0, i1);
}

static void job_encode(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    kv_cpu_fast_encode(j->c->isa, j->c->divide, j->l, j->bits, j->anchor_bits, j->x, j->packed, j->packed2, j->scale,
                       j->zero, g0, g1, NULL);
}

static void job_decode(void *arg, size_t g0, size_t g1, int worker)
{
    const qjob *j = arg;
    (void)worker;
    kv_cpu_fast_decode(j->c->isa, j->l, j->bits, j->anchor_bits, j->packed, j->packed2, j->scale, j->zero, j->out,
                       g0, g1, NULL);
}

/* ---- Kernels ---------------------------------------------------------------------- */

static size_t elems(const kv_quant_layout *l)
{
    return (size_t)l->rows * l->cols;
}

/* Resolves the metadata arrays of a layout. */
static int meta_spans(const kv_quant_layout *l, const kv_bref *scale, const kv_bref *zero, uint16_t **s,
                      uint16_t **z, const char *kernel, kv_error *err)
{
    size_t bytes = kv_layout_groups(l) * sizeof(uint16_t);
    int rc = kv_cpu_span(scale, bytes, (void **)s, kernel, "scale", err);
    return rc ? rc : kv_cpu_span(zero, bytes, (void **)z, kernel, "zero", err);
}

static int cpu_quantize(void *ctx, const kv_quantize_args *a, kv_error *err)
{
    cpu_ctx *c = ctx;
    qjob j = {.c = c, .l = &a->layout, .bits = a->bits};
    size_t n = elems(&a->layout);
    int rc = kv_cpu_span(&a->x, n * 4, (void **)&j.x, "quantize", "x", err);
    if (!rc)
        rc = kv_cpu_span(&a->codes, n * 2, (void **)&j.codes, "quantize", "codes", err);
    if (!rc)
        rc = meta_spans(&a->layout, &a->scale, &a->zero, &j.scale, &j.zero, "quantize", err);
    if (!rc)
        run_groups(c, &j, job_quantize);
    return rc;
}

static int cpu_dequantize(void *ctx, const kv_dequantize_args *a, kv_error *err)
{
    cpu_ctx *c = ctx;
    qjob j = {.c = c, .l = &a->layout, .bits = a->bits, .anchor_bits = a->anchor_bits};
    size_t n = elems(&a->layout);
    int rc = kv_cpu_span(&a->codes, n * 2, (void **)&j.codes, "dequantize", "codes", err);
    if (!rc)
        rc = kv_cpu_span(&a->out, n * 4, (void **)&j.out, "dequantize", "out", err);
    if (!rc)
        rc = meta_spans(&a->layout, &a->scale, &a->zero, &j.scale, &j.zero, "dequantize", err);
    if (!rc)
        run_groups(c, &j, job_dequantize);
    return rc;
}

static int pack_common(cpu_ctx *c, const kv_pack_args *a, int unpack, kv_error *err)
{
    const char *kernel = unpack ? "unpack" : "pack";
    qjob j = {.c = c, .l = &a->layout, .bits = a->bits};
    int rc = kv_cpu_span(&a->codes, elems(&a->layout) * 2, (void **)&j.codes, kernel, "codes", err);
    if (!rc)
        rc = kv_cpu_span(&a->packed, kv_layout_packed_bytes(&a->layout, a->bits), (void **)&j.packed, kernel,
                         "packed", err);
    if (!rc)
        run_groups(c, &j, unpack ? job_unpack : job_pack);
    return rc;
}

static int cpu_pack(void *ctx, const kv_pack_args *a, kv_error *err)
{
    return pack_common(ctx, a, 0, err);
}

static int cpu_unpack(void *ctx, const kv_pack_args *a, kv_error *err)
{
    return pack_common(ctx, a, 1, err);
}

static int split_common(cpu_ctx *c, const kv_split_args *a, int merge, kv_error *err)
{
    const char *kernel = merge ? "merge" : "split";
    qjob j = {.c = c, .bits = a->bits, .anchor_bits = a->anchor_bits};
    size_t bytes;
    if (kv_mul_size(a->count, 2, &bytes))
        return kv_error_set(err, KV_EINPUT, "%s: count %zu is too large", kernel, a->count);
    int rc = kv_cpu_span(&a->codes, bytes, (void **)&j.codes, kernel, "codes", err);
    if (!rc)
        rc = kv_cpu_span(&a->anchor, bytes, (void **)&j.anchor, kernel, "anchor", err);
    if (!rc)
        rc = kv_cpu_span(&a->residual, bytes, (void **)&j.residual, kernel, "residual", err);
    if (!rc)
        kv_cpu_pool_run(c->pool, a->count, 32768, merge ? job_merge : job_split, &j);
    return rc;
}

static int cpu_split(void *ctx, const kv_split_args *a, kv_error *err)
{
    return split_common(ctx, a, 0, err);
}

static int cpu_merge(void *ctx, const kv_split_args *a, kv_error *err)
{
    return split_common(ctx, a, 1, err);
}

static int cpu_encode(void *ctx, const kv_encode_args *a, kv_error *err)
{
    cpu_ctx *c = ctx;
    const kv_quant_layout *l = &a->layout;
    unsigned first = a->anchor_bits ? a->anchor_bits : a->bits;
    qjob j = {.c = c, .l = l, .bits = a->bits, .anchor_bits = a->anchor_bits};
    int rc = kv_cpu_span(&a->x, elems(l) * 4, (void **)&j.x, "encode", "x", err);
    if (!rc)
        rc = kv_cpu_span(&a->anchor_packed, kv_layout_packed_bytes(l, first), (void **)&j.packed, "encode",
                         "anchor_packed", err);
    if (!rc && a->anchor_bits)
        rc = kv_cpu_span(&a->residual_packed, kv_layout_packed_bytes(l, a->bits - a->anchor_bits),
                         (void **)&j.packed2, "encode", "residual_packed", err);
    if (!rc)
        rc = meta_spans(l, &a->scale, &a->zero, &j.scale, &j.zero, "encode", err);
    if (!rc)
        run_groups(c, &j, job_encode);
    return rc;
}

static int cpu_decode(void *ctx, const kv_decode_args *a, kv_error *err)
{
    cpu_ctx *c = ctx;
    const kv_quant_layout *l = &a->layout;
    unsigned first = a->anchor_bits ? a->anchor_bits : a->bits;
    qjob j = {.c = c, .l = l, .bits = a->bits, .anchor_bits = a->anchor_bits};
    int rc = kv_cpu_span(&a->out, elems(l) * 4, (void **)&j.out, "decode", "out", err);
    if (!rc)
        rc = kv_cpu_span(&a->anchor_packed, kv_layout_packed_bytes(l, first), (void **)&j.packed, "decode",
                         "anchor_packed", err);
    if (!rc && a->anchor_bits && a->residual_packed.buf)
        rc = kv_cpu_span(&a->residual_packed, kv_layout_packed_bytes(l, a->bits - a->anchor_bits),
                         (void **)&j.packed2, "decode", "residual_packed", err);
    if (!rc)
        rc = meta_spans(l, &a->scale, &a->zero, &j.scale, &j.zero, "decode", err);
    if (!rc)
        run_groups(c, &j, job_decode);
    return rc;
}

static int cpu_bf16_round(void *ctx, const kv_bf16_args *a, kv_error *err)
{
    cpu_ctx *c = ctx;
    qjob j = {.c = c};
    size_t bytes;
    if (kv_mul_size(a->count, 4, &bytes))
        return kv_error_set(err, KV_EINPUT, "bf16_round: count %zu is too large", a->count);
    int rc = kv_cpu_span(&a->in, bytes, (void **)&j.x, "bf16_round", "in", err);
    if (!rc)
        rc = kv_cpu_span(&a->out, bytes, (void **)&j.out, "bf16_round", "out", err);
    if (!rc)
        kv_cpu_pool_run(c->pool, a->count, 16384, job_bf16, &j);
    return rc;
}

static int cpu_attention(void *ctx, const kv_attention_args *a, kv_error *err)
{
    return kv_cpu_attention(ctx, a, err);
}

static int cpu_compact_alloc(void *ctx, const kv_compact_args *a, kv_error *err)
{
    return kv_cpu_compact_alloc(ctx, a, err);
}

static int cpu_compact_release(void *ctx, const kv_compact_args *a, kv_error *err)
{
    return kv_cpu_compact_release(ctx, a, err);
}

/* ---- Devices and the registry entry ------------------------------------------- */

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c)
        return;
    kv_cpu_pool_destroy(c->pool);
    kv_free(c);
}

static int cpu_get_props(void *ctx, kv_backend_props *p)
{
    cpu_ctx *c = ctx;
    if (c->reference)
        snprintf(p->device, sizeof p->device, "CPU reference (1 thread, scalar, double-precision attention)");
    else
        snprintf(p->device, sizeof p->device, "CPU (%d threads, %s%s)", c->threads,
                 strcmp(c->isa, "avx512") != 0 ? ""
                 : c->divide                   ? "quotients by division, "
                                               : "quotients by reciprocal, ",
                 c->isa);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    p->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    p->mem_bandwidth_gbps = 0; /* unknown: `kvsim bench kernels` measures it */
    p->compute_units = c->threads;
    return KV_OK;
}

static const kv_backend_i cpu_iface = {
    .api_version = KV_BACKEND_API_VERSION,
    .destroy = cpu_destroy,
    .get_props = cpu_get_props,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .synchronize = cpu_synchronize,
    .quantize = cpu_quantize,
    .dequantize = cpu_dequantize,
    .pack = cpu_pack,
    .unpack = cpu_unpack,
    .split = cpu_split,
    .merge = cpu_merge,
    .encode = cpu_encode,
    .decode = cpu_decode,
    .bf16_round = cpu_bf16_round,
    .attention = cpu_attention,
    .compact_alloc = cpu_compact_alloc,
    .compact_release = cpu_compact_release,
};

/* The reference device leaves encode and decode to the dispatcher, which
   composes them from quantize, split, pack (and unpack, merge, dequantize). */
static const kv_backend_i cpu_ref_iface = {
    .api_version = KV_BACKEND_API_VERSION,
    .destroy = cpu_destroy,
    .get_props = cpu_get_props,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .synchronize = cpu_synchronize,
    .quantize = cpu_quantize,
    .dequantize = cpu_dequantize,
    .pack = cpu_pack,
    .unpack = cpu_unpack,
    .split = cpu_split,
    .merge = cpu_merge,
    .bf16_round = cpu_bf16_round,
    .attention = cpu_attention,
    .compact_alloc = cpu_compact_alloc,
    .compact_release = cpu_compact_release,
};

static int cpu_device_count(kv_error *err)
{
    (void)err;
    return 2; /* 0: fast, 1: reference */
}

/* Threads for device 0: KVSIM_CPU_THREADS if set (1..256), else the online cores.
   (KVSIM_CPU_ISA=generic, read at open, forces the portable code paths.) */
static int cpu_thread_count(void)
{
    const char *env = getenv("KVSIM_CPU_THREADS");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1 && n <= 256)
            return (int)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

static int cpu_open(int index, const kv_backend_i **iface, void **ctx, kv_error *err)
{
    if (index < 0 || index > 1)
        return kv_error_set(err, KV_EINPUT, "cpu: device %d does not exist (0: fast, 1: reference)", index);
    cpu_ctx *c = kv_calloc(1, sizeof *c);
    c->reference = index == 1;
    if (c->reference) {
        c->threads = 1;
        c->isa = "scalar";
        *iface = &cpu_ref_iface;
    } else {
        c->threads = cpu_thread_count();
        c->pool = c->threads > 1 ? kv_cpu_pool_create(c->threads) : NULL;
        c->threads = kv_cpu_pool_threads(c->pool);
        c->isa = kv_cpu_fast_isa();
        /* KVSIM_CPU_ISA=generic forces the portable fast paths, =avx2 the AVX2
           ones on an AVX-512 CPU (tests run each); never a wider set than the CPU's */
        const char *force = getenv("KVSIM_CPU_ISA");
        if (force && strcmp(force, "generic") == 0)
            c->isa = "generic";
        else if (force && strcmp(force, "avx2") == 0 && strcmp(c->isa, "avx512") == 0)
            c->isa = "avx2";
        /* KVSIM_CPU_DIVIDE=1 or 0 forces the AVX-512 encode's quotients by vdivps or by the
           reciprocal (tests run each; the bytes are the same) */
        const char *divide = getenv("KVSIM_CPU_DIVIDE");
        c->divide = divide && strcmp(divide, "1") == 0   ? 1
                    : divide && strcmp(divide, "0") == 0 ? 0
                                                         : kv_cpu_fast_divides();
        *iface = &cpu_iface;
    }
    *ctx = c;
    return KV_OK;
}

static const kv_backend_reg cpu_reg = {
    .name = "cpu",
    .device_count = cpu_device_count,
    .open = cpu_open,
};

kv_cpu_pool *kv_cpu_backend_pool(kv_backend *be)
{
    if (!be || be->reg != &cpu_reg)
        return NULL;
    return ((cpu_ctx *)be->ctx)->pool;
}

const kv_backend_reg *kv_backend_cpu_reg(void)
{
    return &cpu_reg;
}
