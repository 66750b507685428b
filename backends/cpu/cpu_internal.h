/* cpu_internal.h — what the CPU backend's files share: buffers, the context,
 * the reference kernels (cpu_ref.c), the fast paths (cpu_fast.c), attention
 * (cpu_attention.c) and compaction (cpu_compact.c). Not for use outside cpu/
 * except by tests that check the reference against hand-worked values. */
#ifndef KV_CPU_INTERNAL_H
#define KV_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/cpu/cpu_pool.h"

/* Host memory standing in for device memory. */
struct kv_buffer {
    size_t bytes;        /* usable size */
    unsigned char *data; /* 64-byte aligned, owned by the buffer */
};

/* One opened CPU device. Device 0 is the fast one (threads, SIMD, fused
   kernels); device 1 is the reference: one thread, the plain loops of
   cpu_ref.c and the double-precision attention. */
typedef struct cpu_ctx {
    int reference;     /* 1 for device 1 */
    kv_cpu_pool *pool; /* NULL for the reference device */
    int threads;       /* workers */
    const char *isa;   /* the fast path chosen at open: "avx512", "avx2", "generic" */
    int divide;        /* kv_cpu_fast_divides, or KVSIM_CPU_DIVIDE (0 or 1) read at open */
} cpu_ctx;

/* Where the elements of one group lie in the row-major [rows][cols] matrix. */
typedef struct cpu_group_view {
    size_t first;  /* element index of element 0 */
    size_t stride; /* elements between consecutive group elements */
    uint32_t len;  /* elements in the group */
} cpu_group_view;

cpu_group_view cpu_group_at(const kv_quant_layout *l, size_t group);

/* ---- Reference kernels (cpu_ref.c): plain loops over groups [g0, g1) ---- */

void kv_cpu_ref_quantize(const kv_quant_layout *l, unsigned bits, const float *x, uint16_t *codes,
                         uint16_t *scale, uint16_t *zero, size_t g0, size_t g1);
/* anchor_bits 0: full codes; > 0: codes are anchors, midpoint reconstruction. */
void kv_cpu_ref_dequantize(const kv_quant_layout *l, unsigned bits, unsigned anchor_bits, const uint16_t *codes,
                           const uint16_t *scale, const uint16_t *zero, float *out, size_t g0, size_t g1);
void kv_cpu_ref_pack(const kv_quant_layout *l, unsigned bits, const uint16_t *codes, uint8_t *packed, size_t g0,
                     size_t g1);
void kv_cpu_ref_unpack(const kv_quant_layout *l, unsigned bits, const uint8_t *packed, uint16_t *codes, size_t g0,
                       size_t g1);
/* Elements [i0, i1). */
void kv_cpu_ref_split(unsigned bits, unsigned anchor_bits, const uint16_t *codes, uint16_t *anchor,
                      uint16_t *residual, size_t i0, size_t i1);
void kv_cpu_ref_merge(unsigned bits, unsigned anchor_bits, const uint16_t *anchor, const uint16_t *residual,
                      uint16_t *codes, size_t i0, size_t i1);
void kv_cpu_ref_bf16_round(const float *in, float *out, size_t i0, size_t i1);

/* ---- Fast paths (cpu_fast.c) ---- */

/* Per-thread scratch of the fast paths: one group's values and codes. */
typedef struct kv_cpu_scratch {
    float *x;        /* [cap] */
    uint16_t *a, *r; /* [cap] anchor (or full) codes, residual codes */
    size_t cap;      /* elements: group size rounded up to 16, plus 32 */
} kv_cpu_scratch;

void kv_cpu_scratch_init(kv_cpu_scratch *s, uint32_t group_size);
void kv_cpu_scratch_free(kv_cpu_scratch *s); /* NULL is fine */

/* Picks the widest instruction set this CPU runs ("avx512", "avx2", "generic"). */
const char *kv_cpu_fast_isa(void);
/* 1 where the AVX-512 encode should divide every vector (vdivps) rather than multiply by the
   reciprocal and divide only vectors with a risky lane: on AMD CPUs, whose division is cheaper than
   that test (Zen 5: 1.25x the encode, docs/kernels.md). Both give the same bytes. */
int kv_cpu_fast_divides(void);
/* Fused quantize + split + pack of groups [g0, g1); residual NULL when
   anchor_bits == 0. scratch may be NULL (then one is allocated). divide: as
   kv_cpu_fast_divides (the AVX-512 token-group path only). */
void kv_cpu_fast_encode(const char *isa, int divide, const kv_quant_layout *l, unsigned bits,
                        unsigned anchor_bits, const float *x, uint8_t *anchor, uint8_t *residual, uint16_t *scale,
                        uint16_t *zero, size_t g0, size_t g1, kv_cpu_scratch *scratch);
/* Fused unpack (+ merge) + dequantize; residual NULL with anchor_bits > 0: midpoint. */
void kv_cpu_fast_decode(const char *isa, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                        const uint8_t *anchor, const uint8_t *residual, const uint16_t *scale,
                        const uint16_t *zero, float *out, size_t g0, size_t g1, kv_cpu_scratch *scratch);
/* The unfused kernels, equal to their cpu_ref.c counterparts. */
void kv_cpu_fast_quantize(const char *isa, int divide, const kv_quant_layout *l, unsigned bits, const float *x,
                          uint16_t *codes, uint16_t *scale, uint16_t *zero, size_t g0, size_t g1);
void kv_cpu_fast_dequantize(const char *isa, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                            const uint16_t *codes, const uint16_t *scale, const uint16_t *zero, float *out, size_t g0,
                            size_t g1);
void kv_cpu_fast_pack(const char *isa, const kv_quant_layout *l, unsigned bits, const uint16_t *codes,
                      uint8_t *packed, size_t g0, size_t g1);
void kv_cpu_fast_unpack(const char *isa, const kv_quant_layout *l, unsigned bits, const uint8_t *packed,
                        uint16_t *codes, size_t g0, size_t g1);

/* ---- Attention (cpu_attention.c) and compaction (cpu_compact.c) ---- */

int kv_cpu_attention(cpu_ctx *c, const kv_attention_args *a, kv_error *err);
int kv_cpu_compact_alloc(cpu_ctx *c, const kv_compact_args *a, kv_error *err);
int kv_cpu_compact_release(cpu_ctx *c, const kv_compact_args *a, kv_error *err);

/* The worker pool of an opened CPU device (NULL for other backends, the
   reference device, or one thread): `kvsim bench kernels` reads its on-CPU times. */
kv_cpu_pool *kv_cpu_backend_pool(kv_backend *be);

/* Resolves a[offset, offset + bytes) of a buffer, or fails with KV_EINPUT
   naming the kernel and the argument. */
int kv_cpu_span(const kv_bref *r, size_t bytes, void **out, const char *kernel, const char *arg, kv_error *err);

#endif
