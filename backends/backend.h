/* backend.h — the accelerator backend interface: registry → device → buffers + kernels.
 *
 * Shape (after ggml-backend): a registry lists the backends compiled in; each
 * backend reports its devices; opening a device gives a kv_backend, which is a
 * table of functions (kv_backend_i) plus a context. Kernels are enqueued on the
 * backend's single stream and run asynchronously; kv_backend_synchronize waits.
 * Buffers live in backend memory; the host moves bytes with buffer_write/read.
 *
 * Numerics are specified in docs/kernels.md ("Numerics"). Every backend must produce
 * the CPU reference's codes, metadata and packed bytes bit for bit, and
 * attention within relative 1e-5.
 *
 * Layout conventions used by every kernel:
 *  - A quantized tensor is a row-major matrix [rows][cols]: rows = tokens,
 *    cols = channels (head_dim). Unpacked codes are uint16 in the same
 *    row-major positions as the fp32 input.
 *  - Groups (kv_quant_layout): KV_GROUP_TOKEN puts groups of group_size
 *    consecutive channels of one row together (the last group of a row may be
 *    shorter); group index g = row * groups_per_row + col / group_size, element
 *    i of the group is col = (g % groups_per_row) * group_size + i.
 *    KV_GROUP_CHANNEL puts groups of group_size consecutive rows of one column
 *    together (KIVI keys); group index g = (row / group_size) * cols + col,
 *    element i is row = (g / cols) * group_size + i.
 *  - Metadata: scale and zero as IEEE fp16 bit patterns (uint16), one each per
 *    group, in group order.
 *  - Packed planes: groups in group order; each group's codes form a
 *    little-endian bit stream (element i at bits [b*i, b*i+b)) that starts on
 *    a byte boundary and occupies ceil(n*b/8) bytes (n = group length).
 *    Unused high bits of a group's last byte are 0.
 *  - Argument offsets are aligned to their element type: 4 bytes for f32 and
 *    u32, 2 for u16 (codes, fp16/bf16 bits), 8 for kv_page_desc, 1 for packed
 *    bytes. The dispatcher checks alignment and that required buffers are
 *    given (KV_EINPUT otherwise); backends check that every range lies inside
 *    its buffer.
 *  - The finer numerics rules (metadata that would overflow fp16
 *    saturates to ±65504; −0 is canonicalised to +0 before the metadata;
 *    +Inf codes as 2^b − 1 even when scale is 0; out-of-range codes are masked
 *    to their width) are written out in backends/numerics.h.
 */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"

/* Changes whenever any member of kv_backend_i or an argument struct changes. */
#define KV_BACKEND_API_VERSION 1

typedef struct kv_buffer kv_buffer;   /* backend memory; opaque, owned by the backend */
typedef struct kv_backend kv_backend; /* an opened device */

/* A place in backend memory: a buffer and a byte offset into it. */
typedef struct kv_bref {
    kv_buffer *buf; /* NULL means "absent" where an argument is optional */
    size_t offset;  /* bytes */
} kv_bref;

/* ---- Quantization layout --------------------------------------------------- */

typedef enum kv_grouping {
    KV_GROUP_TOKEN = 0,   /* groups along channels within one token (values; DiffKV keys) */
    KV_GROUP_CHANNEL = 1, /* groups along tokens within one channel (KIVI keys) */
} kv_grouping;

typedef struct kv_quant_layout {
    uint32_t rows;        /* tokens */
    uint32_t cols;        /* channels (head_dim) */
    uint32_t group_size;  /* G >= 1 */
    kv_grouping grouping; /* see the file comment */
} kv_quant_layout;

/* Pure layout arithmetic, identical for every backend (backend.c). */
size_t kv_layout_groups(const kv_quant_layout *l);
uint32_t kv_layout_group_len(const kv_quant_layout *l, size_t group);
size_t kv_layout_packed_bytes(const kv_quant_layout *l, unsigned bits);
size_t kv_layout_meta_bytes(const kv_quant_layout *l); /* scale + zero: 4 bytes a group */
/* Byte offset of group `group`'s stream within a packed plane of `bits`-bit codes. */
size_t kv_layout_group_offset(const kv_quant_layout *l, unsigned bits, size_t group);

/* ---- Kernel arguments -------------------------------------------------------- */

/* x (f32 [rows][cols]) → codes (u16 [rows][cols]), scale, zero (u16 fp16 [groups]). */
typedef struct kv_quantize_args {
    kv_quant_layout layout;
    unsigned bits; /* b, 1..16 */
    kv_bref x, codes, scale, zero;
} kv_quantize_args;

/* codes (b bits) or anchor codes (anchor_bits > 0: a bits, midpoint
   reconstruction) → out (f32 [rows][cols]). */
typedef struct kv_dequantize_args {
    kv_quant_layout layout;
    unsigned bits;        /* b */
    unsigned anchor_bits; /* 0: codes are full b-bit codes; a > 0: codes are a-bit anchors */
    kv_bref codes, scale, zero, out;
} kv_dequantize_args;

/* codes (u16 [rows][cols]) ↔ packed plane (bytes, kv_layout_packed_bytes). */
typedef struct kv_pack_args {
    kv_quant_layout layout;
    unsigned bits;
    kv_bref codes, packed;
} kv_pack_args;

/* codes (b bits) ↔ anchor (a MSBs) + residual (b − a LSBs), all u16 [rows*cols]. */
typedef struct kv_split_args {
    size_t count;         /* number of codes */
    unsigned bits;        /* b */
    unsigned anchor_bits; /* a, 1..b-1 */
    kv_bref codes, anchor, residual;
} kv_split_args;

/* Fused quantize + split + pack: x → anchor plane (a-bit, or b-bit when
   anchor_bits == 0), residual plane (b − a bits; absent when anchor_bits == 0),
   scale, zero. Equal, byte for byte, to quantize then split then pack. */
typedef struct kv_encode_args {
    kv_quant_layout layout;
    unsigned bits, anchor_bits;
    kv_bref x, anchor_packed, residual_packed, scale, zero;
} kv_encode_args;

/* Fused unpack + merge + dequantize: planes → out (f32). residual_packed.buf ==
   NULL with anchor_bits > 0 gives anchor-only (midpoint) reconstruction. */
typedef struct kv_decode_args {
    kv_quant_layout layout;
    unsigned bits, anchor_bits;
    kv_bref anchor_packed, residual_packed, scale, zero, out;
} kv_decode_args;

/* f32 → bf16 (round to nearest even) → f32, count values. */
typedef struct kv_bf16_args {
    size_t count;
    kv_bref in, out;
} kv_bf16_args;

/* How one page stores K or V. */
typedef enum kv_store_kind {
    KV_STORE_F32 = 0,   /* f32 [ntokens][head_dim] */
    KV_STORE_BF16 = 1,  /* bf16 bit patterns, u16 [ntokens][head_dim] */
    KV_STORE_QUANT = 2, /* packed plane + metadata (scale[groups], then zero[groups]) */
} kv_store_kind;

typedef struct kv_store_format {
    uint8_t kind;        /* kv_store_kind */
    uint8_t bits;        /* b (QUANT) */
    uint8_t anchor_bits; /* QUANT: 0, or a when only the a-bit anchor plane is stored */
    uint8_t grouping;    /* kv_grouping; CHANNEL groups run over the page's tokens */
    uint32_t group_size; /* G */
} kv_store_format;

/* One page: ntokens tokens of one (layer, KV head), all in one format. A QUANT
   page is quantized as the layout {rows = ntokens, cols = head_dim,
   group_size, grouping}: its packed plane (kv_layout_packed_bytes at `bits`, or
   at `anchor_bits` for an anchor-only page) at *_data, its metadata at *_meta
   (scale[groups] then zero[groups], fp16 bits). F32 data must be 4-byte
   aligned, BF16 data and metadata 2-byte aligned; a page of ntokens == 0 is
   skipped. */
typedef struct kv_page_desc {
    uint32_t ntokens;       /* tokens in the page */
    uint32_t pos_index;     /* positions[pos_index + i] is the position of token i */
    kv_store_format key, value;
    uint64_t key_data, key_meta;     /* byte offsets into kv_data (meta unused unless QUANT) */
    uint64_t value_data, value_meta; /* likewise */
} kv_page_desc;

/* Attention of n_queries query tokens over paged KV, causal by position.
   GQA: query head h uses KV head h / (n_heads / n_kv_heads).
   For query i and head h: logits l_t = scale * dot(q[i][h], K_t) over the
   tokens t of KV head h / group whose position <= q_pos[i]; p = softmax(l);
   out[i][h] = sum_t p_t V_t. A query that sees no token gets out = 0.
   The CPU reference (device 1) computes in double and rounds the result to
   f32; other backends must agree within relative 1e-5 (error measured against
   the largest |out| of the same (query, head), see docs/kernels.md). */
typedef struct kv_attention_args {
    uint32_t n_queries;   /* 1 for decode; k for verification; T for prefill */
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* n_heads % n_kv_heads == 0 */
    uint32_t head_dim;
    uint32_t n_pages;     /* entries in pages */
    uint32_t score_stride;/* floats per KV head in scores */
    float scale;          /* logit scale, usually 1/sqrt(head_dim) */
    kv_bref q;            /* f32 [n_queries][n_heads][head_dim] */
    kv_bref q_pos;        /* u32 [n_queries]: a query sees keys whose position <= its own */
    kv_bref pages;        /* kv_page_desc [n_pages] */
    kv_bref head_pages;   /* u32 [n_kv_heads][2]: first page and page count of each KV head */
    kv_bref positions;    /* u32: token positions, see kv_page_desc.pos_index */
    kv_bref kv_data;      /* bytes holding every page's data and metadata */
    kv_bref out;          /* f32 [n_queries][n_heads][head_dim] */
    kv_bref scores;       /* optional f32 [n_kv_heads][score_stride]: for each KV head's
                             tokens in page order, the softmax probability summed over
                             queries, then the maximum over the heads of the GQA group */
} kv_attention_args;

/* DiffKV page compaction over a circular free page list.
   state is u32[4] in backend memory: {head, tail, free_count, status}.
   alloc: offsets = exclusive prefix sum of demand; entry i takes pages
   free_list[(head + offsets[i] + j) % capacity], j < demand[i], written to
   pages[offsets[i] + j]; head and free_count advance by the total.
   release: entry i returns pages[offsets[i] + j] into
   free_list[(tail + offsets[i] + j) % capacity]; tail and free_count advance.
   If an alloc asks for more than free_count, nothing changes and status = 1;
   if a release would make free_count exceed capacity, nothing changes and
   status = 2; otherwise status = 0. Invariant: tail == (head + free_count) %
   capacity. pages may be absent when every demand is 0. */
typedef struct kv_compact_args {
    uint32_t n;        /* entries: one per (sequence, layer, KV head, tier) */
    uint32_t capacity; /* slots in free_list */
    kv_bref demand;    /* u32 [n] */
    kv_bref offsets;   /* u32 [n], out */
    kv_bref pages;     /* u32 [sum of demand]: out for alloc, in for release */
    kv_bref free_list; /* u32 [capacity] */
    kv_bref state;     /* u32 [4] */
} kv_compact_args;

/* ---- The interface a backend implements -------------------------------------- */

typedef struct kv_backend_props {
    const char *backend;        /* "cpu", "opencl", ... */
    char device[128];           /* device name as the vendor reports it */
    uint64_t memory_bytes;      /* device memory (host RAM for cpu) */
    double mem_bandwidth_gbps;  /* nominal peak, 0 if unknown (bench measures its own) */
    int compute_units;
} kv_backend_props;

/* Every function returns KV_OK or an error code with err filled.
   Members marked optional may be NULL; the dispatcher (backend.c) then
   composes them from the others. */
typedef struct kv_backend_i {
    int api_version; /* KV_BACKEND_API_VERSION */
    void (*destroy)(void *ctx);
    int (*get_props)(void *ctx, kv_backend_props *props);

    int (*buffer_alloc)(void *ctx, size_t bytes, kv_buffer **out, kv_error *err);
    void (*buffer_free)(void *ctx, kv_buffer *buf);
    int (*buffer_write)(void *ctx, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err);
    int (*buffer_read)(void *ctx, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err);
    int (*synchronize)(void *ctx, kv_error *err);

    int (*quantize)(void *ctx, const kv_quantize_args *a, kv_error *err);
    int (*dequantize)(void *ctx, const kv_dequantize_args *a, kv_error *err);
    int (*pack)(void *ctx, const kv_pack_args *a, kv_error *err);
    int (*unpack)(void *ctx, const kv_pack_args *a, kv_error *err);
    int (*split)(void *ctx, const kv_split_args *a, kv_error *err);
    int (*merge)(void *ctx, const kv_split_args *a, kv_error *err);
    int (*encode)(void *ctx, const kv_encode_args *a, kv_error *err); /* optional */
    int (*decode)(void *ctx, const kv_decode_args *a, kv_error *err); /* optional */
    int (*bf16_round)(void *ctx, const kv_bf16_args *a, kv_error *err);
    int (*attention)(void *ctx, const kv_attention_args *a, kv_error *err);
    int (*compact_alloc)(void *ctx, const kv_compact_args *a, kv_error *err);
    int (*compact_release)(void *ctx, const kv_compact_args *a, kv_error *err);
} kv_backend_i;

/* A registry entry: one per backend compiled in. */
typedef struct kv_backend_reg {
    const char *name; /* "cpu", "opencl", "cuda", "hip", "ascend" */
    /* Number of usable devices; 0 with a reason in err->msg when none (e.g.
       "no device"), never an abort. */
    int (*device_count)(kv_error *err);
    /* Opens device `index` and returns its table + context. */
    int (*open)(int index, const kv_backend_i **iface, void **ctx, kv_error *err);
} kv_backend_reg;

/* ---- Registry -----------------------------------------------------------------
   "cpu" has two devices: 0 is the fast one (all cores, SIMD; what a scenario
   uses), 1 the reference (one thread, plain loops, double-precision
   attention), the oracle of the conformance suite and of the bench. */

size_t kv_backend_reg_count(void);
const kv_backend_reg *kv_backend_reg_get(size_t i);
const kv_backend_reg *kv_backend_reg_find(const char *name); /* NULL if not compiled in */
/* Comma-separated names of the backends compiled in, e.g. "cpu, opencl". */
const char *kv_backend_reg_names(void);

/* Opens device `index` of backend `name`. Unknown or device-less backends give
   KV_EINPUT with a message that lists the backends that are built. */
int kv_backend_open(const char *name, int index, kv_backend **out, kv_error *err);
void kv_backend_close(kv_backend *be); /* NULL is fine */
const char *kv_backend_name(const kv_backend *be);
int kv_backend_get_props(kv_backend *be, kv_backend_props *props);

/* ---- Dispatch (argument checks, fallbacks) -------------------------------------- */

int kv_buffer_alloc(kv_backend *be, size_t bytes, kv_buffer **out, kv_error *err);
void kv_buffer_free(kv_backend *be, kv_buffer *buf); /* NULL is fine */
int kv_buffer_write(kv_backend *be, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err);
int kv_buffer_read(kv_backend *be, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err);
int kv_backend_synchronize(kv_backend *be, kv_error *err);

int kv_backend_quantize(kv_backend *be, const kv_quantize_args *a, kv_error *err);
int kv_backend_dequantize(kv_backend *be, const kv_dequantize_args *a, kv_error *err);
int kv_backend_pack(kv_backend *be, const kv_pack_args *a, kv_error *err);
int kv_backend_unpack(kv_backend *be, const kv_pack_args *a, kv_error *err);
int kv_backend_split(kv_backend *be, const kv_split_args *a, kv_error *err);
int kv_backend_merge(kv_backend *be, const kv_split_args *a, kv_error *err);
int kv_backend_encode(kv_backend *be, const kv_encode_args *a, kv_error *err);
int kv_backend_decode(kv_backend *be, const kv_decode_args *a, kv_error *err);
int kv_backend_bf16_round(kv_backend *be, const kv_bf16_args *a, kv_error *err);
int kv_backend_attention(kv_backend *be, const kv_attention_args *a, kv_error *err);
int kv_backend_compact_alloc(kv_backend *be, const kv_compact_args *a, kv_error *err);
int kv_backend_compact_release(kv_backend *be, const kv_compact_args *a, kv_error *err);

#endif
