/* gguf.h — a read-only, bounds-checked reader of GGUF (v2, v3) model files.
 *
 * A GGUF file is: magic "GGUF", version (u32), tensor count (u64), metadata
 * count (u64), the metadata key/value pairs, the tensor table (name, dims,
 * type, offset), padding to the alignment (general.alignment, default 32),
 * then the tensor data. All integers are little-endian.
 *
 * Everything that comes from the file is checked before use: every count
 * against the bytes left, every string and array length, every tensor's
 * offset + size against the end of the file, every multiplication for
 * overflow. A bad file gives KV_EINPUT and a message that names the file, the
 * byte offset and the key or tensor; it never crashes or allocates more than
 * a small multiple of the file size.
 *
 * Ownership: kv_gguf owns the mapping (or borrows the caller's buffer, see
 * kv_gguf_open_memory); every pointer it hands out (strings, tensor data)
 * points into that mapping and lives until kv_gguf_destroy.
 */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base/error.h"

typedef struct kv_gguf kv_gguf;

/* Metadata value types, as numbered in the GGUF specification. */
typedef enum kv_gguf_type {
    KV_GGUF_UINT8 = 0,
    KV_GGUF_INT8 = 1,
    KV_GGUF_UINT16 = 2,
    KV_GGUF_INT16 = 3,
    KV_GGUF_UINT32 = 4,
    KV_GGUF_INT32 = 5,
    KV_GGUF_FLOAT32 = 6,
    KV_GGUF_BOOL = 7,
    KV_GGUF_STRING = 8,
    KV_GGUF_ARRAY = 9,
    KV_GGUF_UINT64 = 10,
    KV_GGUF_INT64 = 11,
    KV_GGUF_FLOAT64 = 12,
} kv_gguf_type;

/* Tensor types (ggml numbering) that this reader can dequantize. Other ggml
   types are recognised by name and refused with a clear message. */
enum {
    KV_GGML_F32 = 0,
    KV_GGML_F16 = 1,
    KV_GGML_Q4_0 = 2,
    KV_GGML_Q4_1 = 3,
    KV_GGML_Q8_0 = 8,
    KV_GGML_BF16 = 30,
};

/* A string inside the file: not NUL-terminated. */
typedef struct kv_gguf_str {
    const char *ptr; /* into the mapping */
    size_t len;      /* bytes */
} kv_gguf_str;

#define KV_GGUF_MAX_DIMS 4

typedef struct kv_gguf_tensor {
    const char *name;                /* NUL-terminated copy, owned by kv_gguf */
    uint32_t n_dims;                 /* 1..KV_GGUF_MAX_DIMS */
    uint64_t dims[KV_GGUF_MAX_DIMS]; /* dims[0] is the row length (fastest varying); unused dims are 1 */
    uint32_t type;                   /* KV_GGML_* */
    uint64_t n_elements;             /* product of dims */
    size_t bytes;                    /* size of the data */
    const uint8_t *data;             /* into the mapping; bytes long, inside the file */
} kv_gguf_tensor;

/* Maps the file read-only and parses it. A missing or unreadable file and a
   malformed one are KV_EINPUT. *out is the caller's to kv_gguf_destroy. */
int kv_gguf_open(const char *path, kv_gguf **out, kv_error *err);

/* Parses a GGUF image already in memory. The buffer is borrowed: it must
   outlive the returned kv_gguf. name is used in messages. */
int kv_gguf_open_memory(const void *data, size_t bytes, const char *name, kv_gguf **out, kv_error *err);

void kv_gguf_destroy(kv_gguf *g); /* NULL is fine */

const char *kv_gguf_name(const kv_gguf *g); /* the path or name given at open */
uint32_t kv_gguf_version(const kv_gguf *g);
size_t kv_gguf_file_bytes(const kv_gguf *g);

/* ---- Metadata -------------------------------------------------------------------- */

bool kv_gguf_has(const kv_gguf *g, const char *key);
/* The value's type (KV_GGUF_*), or -1 if the key is absent. */
int kv_gguf_key_type(const kv_gguf *g, const char *key);

/* Typed getters: KV_EINPUT with "file: key 'k': ..." if the key is missing or
   holds another type. Integer getters accept any integer type whose value fits. */
int kv_gguf_get_u32(const kv_gguf *g, const char *key, uint32_t *out, kv_error *err);
int kv_gguf_get_f32(const kv_gguf *g, const char *key, float *out, kv_error *err);
int kv_gguf_get_bool(const kv_gguf *g, const char *key, bool *out, kv_error *err);
int kv_gguf_get_string(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_error *err);
/* An array of strings: *items points at count entries owned by g. */
int kv_gguf_get_string_array(const kv_gguf *g, const char *key, const kv_gguf_str **items, size_t *count,
                             kv_error *err);
/* An array of any integer type, converted to int64: *out is the caller's (kv_free). */
int kv_gguf_get_int_array(const kv_gguf *g, const char *key, int64_t **out, size_t *count, kv_error *err);

/* True if s equals the NUL-terminated text. */
bool kv_gguf_str_eq(kv_gguf_str s, const char *text);

/* ---- Tensors ----------------------------------------------------------------------- */

size_t kv_gguf_tensor_count(const kv_gguf *g);
const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, size_t i);
const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name); /* NULL if absent */

/* "F32", "Q4_1", ...; "unknown" for numbers ggml does not define. */
const char *kv_ggml_type_name(uint32_t type);
/* True for the types kv_gguf_dequantize handles. */
bool kv_ggml_type_supported(uint32_t type);

/* Dequantizes rows [row0, row0 + nrows) of t (a row is dims[0] elements) into
   out (f32 [nrows][dims[0]]). KV_EINPUT if the rows are out of range. */
int kv_gguf_tensor_rows_f32(const kv_gguf_tensor *t, uint64_t row0, uint64_t nrows, float *out, kv_error *err);

/* IEEE half → float, exact (also used by the tests). */
float kv_half_to_float(uint16_t h);

#endif
