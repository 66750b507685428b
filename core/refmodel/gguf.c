/* gguf.c — a bounds-checked GGUF reader: header, metadata, tensor table, dequantization.
 *
 * Parsing walks the file with a cursor (struct cursor) whose every read
 * checks the bytes left first; a failed read records the offset and what was
 * being read, and the caller turns it into one KV_EINPUT message. Counts
 * from the file are never trusted for allocation: before an array of N
 * entries is allocated, N is checked against the bytes left divided by the
 * smallest possible encoding of one entry, so a hostile count fails cleanly.
 */
#include "core/refmodel/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"

/* ---- ggml tensor types ---------------------------------------------------------- */

typedef struct ggml_type_info {
    uint32_t type;
    const char *name;
    uint32_t block_elems; /* elements per block */
    uint32_t block_bytes; /* bytes per block */
} ggml_type_info;

/* The ggml types whose block layout is certain; a file with any other type
   number is refused as "unknown tensor type". */
static const ggml_type_info ggml_types[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},      {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},   {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {24, "I8", 1, 1},       {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},     {28, "F64", 1, 8},      {30, "BF16", 1, 2},
};

static const ggml_type_info *ggml_type_find(uint32_t type)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].type == type)
            return &ggml_types[i];
    return NULL;
}

const char *kv_ggml_type_name(uint32_t type)
{
    const ggml_type_info *t = ggml_type_find(type);
    return t ? t->name : "unknown";
}

bool kv_ggml_type_supported(uint32_t type)
{
    return type == KV_GGML_F32 || type == KV_GGML_F16 || type == KV_GGML_BF16 || type == KV_GGML_Q4_0 ||
           type == KV_GGML_Q4_1 || type == KV_GGML_Q8_0;
}

/* ---- The parsed file -------------------------------------------------------------- */

typedef struct gguf_kv {
    kv_gguf_str key;
    uint32_t type; /* kv_gguf_type */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;                 /* integer, float and bool scalars */
    kv_gguf_str str;       /* STRING */
    uint32_t elem_type;    /* ARRAY: element type */
    uint64_t count;        /* ARRAY: element count */
    const uint8_t *elems;  /* ARRAY of numbers: count * size bytes in the file */
    kv_gguf_str *strings;  /* ARRAY of strings: count entries, owned */
} gguf_kv;

struct kv_gguf {
    char *name;            /* path or caller's name, owned */
    const uint8_t *base;   /* the file image */
    size_t size;           /* bytes */
    void *map;             /* mmap'd region, or NULL when borrowed */
    uint32_t version;
    gguf_kv *kvs;          /* [n_kvs] */
    size_t n_kvs;
    kv_gguf_tensor *tensors; /* [n_tensors] */
    size_t n_tensors;
    uint32_t alignment;    /* bytes */
    size_t data_offset;    /* start of the tensor data section */
};

/* A reading position in the image; fails once and stays failed. */
typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
    int failed;
    char what[160]; /* what was being read when it failed */
} cursor;

static int cur_need(cursor *c, size_t n, const char *what)
{
    if (c->failed)
        return -1;
    if (n > c->size - c->pos) {
        c->failed = 1;
        snprintf(c->what, sizeof c->what, "%s needs %zu bytes at offset %zu but the file ends at %zu", what, n,
                 c->pos, c->size);
        return -1;
    }
    return 0;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t cur_uint(cursor *c, int n, const char *what)
{
    if (cur_need(c, (size_t)n, what))
        return 0;
    uint64_t v = load_le(c->base + c->pos, n);
    c->pos += (size_t)n;
    return v;
}

static kv_gguf_str cur_str(cursor *c, const char *what)
{
    kv_gguf_str s = {"", 0};
    uint64_t len = cur_uint(c, 8, what);
    if (c->failed)
        return s;
    if (len > c->size - c->pos) {
        c->failed = 1;
        snprintf(c->what, sizeof c->what, "%s: string length %llu at offset %zu runs past the end of the file (%zu)",
                 what, (unsigned long long)len, c->pos - 8, c->size);
        return s;
    }
    s.ptr = (const char *)(c->base + c->pos);
    s.len = (size_t)len;
    c->pos += (size_t)len;
    return s;
}

/* Bytes of one scalar of a metadata type; 0 for STRING/ARRAY/unknown. */
static size_t scalar_bytes(uint32_t type)
{
    switch (type) {
    case KV_GGUF_UINT8:
    case KV_GGUF_INT8:
    case KV_GGUF_BOOL:
        return 1;
    case KV_GGUF_UINT16:
    case KV_GGUF_INT16:
        return 2;
    case KV_GGUF_UINT32:
    case KV_GGUF_INT32:
    case KV_GGUF_FLOAT32:
        return 4;
    case KV_GGUF_UINT64:
    case KV_GGUF_INT64:
    case KV_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static const char *type_name(uint32_t type)
{
    static const char *const names[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                        "bool",  "string", "array", "uint64", "int64", "float64"};
    return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

static void print_key(char *buf, size_t n, kv_gguf_str key)
{
    /* Keys come from the file: print at most 60 bytes, non-printables as '?'. */
    size_t len = key.len < 60 ? key.len : 60, j = 0;
    for (size_t i = 0; i < len && j + 1 < n; i++) {
        unsigned char ch = (unsigned char)key.ptr[i];
        buf[j++] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    if (key.len > 60 && j + 3 < n) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
}

/* Decodes a scalar value already bounds-checked at p. */
static void decode_scalar(gguf_kv *kv, uint32_t type, const uint8_t *p)
{
    size_t n = scalar_bytes(type);
    uint64_t raw = load_le(p, (int)n);
    switch (type) {
    case KV_GGUF_INT8:
        kv->num.i = (int8_t)raw;
        break;
    case KV_GGUF_INT16:
        kv->num.i = (int16_t)raw;
        break;
    case KV_GGUF_INT32:
        kv->num.i = (int32_t)raw;
        break;
    case KV_GGUF_INT64:
        kv->num.i = (int64_t)raw;
        break;
    case KV_GGUF_FLOAT32: {
        uint32_t b = (uint32_t)raw;
        float f;
        memcpy(&f, &b, 4);
        kv->num.f = f;
        break;
    }
    case KV_GGUF_FLOAT64: {
        double d;
        memcpy(&d, &raw, 8);
        kv->num.f = d;
        break;
    }
    default: /* unsigned and bool */
        kv->num.u = raw;
        break;
    }
}

static int parse_kv(cursor *c, gguf_kv *kv, const char *name, kv_error *err)
{
    size_t at = c->pos;
    kv->key = cur_str(c, "metadata key");
    uint32_t type = (uint32_t)cur_uint(c, 4, "metadata value type");
    if (c->failed)
        return kv_error_set(err, KV_EINPUT, "%s: truncated or corrupt metadata entry at offset %zu: %s", name, at,
                            c->what);
    char key[80];
    print_key(key, sizeof key, kv->key);
    kv->type = type;
    if (scalar_bytes(type)) {
        size_t n = scalar_bytes(type);
        if (cur_need(c, n, "metadata value"))
            return kv_error_set(err, KV_EINPUT, "%s: key '%s': %s", name, key, c->what);
        decode_scalar(kv, type, c->base + c->pos);
        c->pos += n;
        return KV_OK;
    }
    if (type == KV_GGUF_STRING) {
        kv->str = cur_str(c, "string value");
        if (c->failed)
            return kv_error_set(err, KV_EINPUT, "%s: key '%s': %s", name, key, c->what);
        return KV_OK;
    }
    if (type != KV_GGUF_ARRAY)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' at offset %zu: unknown value type %u", name, key, at,
                            type);
    uint32_t et = (uint32_t)cur_uint(c, 4, "array element type");
    uint64_t count = cur_uint(c, 8, "array length");
    if (c->failed)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s': %s", name, key, c->what);
    kv->elem_type = et;
    kv->count = count;
    size_t left = c->size - c->pos;
    if (scalar_bytes(et)) {
        size_t es = scalar_bytes(et);
        if (count > left / es)
            return kv_error_set(err, KV_EINPUT,
                                "%s: key '%s': array of %llu %s values needs more bytes than the %zu left in the file",
                                name, key, (unsigned long long)count, type_name(et), left);
        kv->elems = c->base + c->pos;
        c->pos += (size_t)count * es;
        return KV_OK;
    }
    if (et == KV_GGUF_STRING) {
        /* Each string takes at least its 8-byte length. */
        if (count > left / 8)
            return kv_error_set(err, KV_EINPUT,
                                "%s: key '%s': array of %llu strings cannot fit in the %zu bytes left in the file",
                                name, key, (unsigned long long)count, left);
        kv->strings = kv_malloc((size_t)(count ? count : 1) * sizeof *kv->strings);
        for (uint64_t i = 0; i < count; i++) {
            kv->strings[i] = cur_str(c, "array string");
            if (c->failed)
                return kv_error_set(err, KV_EINPUT, "%s: key '%s': element %llu: %s", name, key,
                                    (unsigned long long)i, c->what);
        }
        return KV_OK;
    }
    if (et == KV_GGUF_ARRAY)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s': arrays of arrays are not supported", name, key);
    return kv_error_set(err, KV_EINPUT, "%s: key '%s': unknown array element type %u", name, key, et);
}

static int cmp_str(const kv_gguf_str *a, const kv_gguf_str *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->ptr, b->ptr, n);
    if (r)
        return r;
    return a->len < b->len ? -1 : a->len > b->len;
}

static int cmp_kv_ptr(const void *a, const void *b)
{
    return cmp_str(*(kv_gguf_str *const *)a, *(kv_gguf_str *const *)b);
}

/* Refuses duplicate names (keys or tensors): sorted pointers, O(n log n). */
static int check_unique(kv_gguf_str **names, size_t n, const char *file, const char *what, kv_error *err)
{
    qsort(names, n, sizeof *names, cmp_kv_ptr);
    for (size_t i = 1; i < n; i++)
        if (cmp_str(names[i - 1], names[i]) == 0) {
            char k[80];
            print_key(k, sizeof k, *names[i]);
            return kv_error_set(err, KV_EINPUT, "%s: duplicate %s '%s'", file, what, k);
        }
    return KV_OK;
}

static const gguf_kv *find_kv(const kv_gguf *g, const char *key)
{
    for (size_t i = 0; i < g->n_kvs; i++)
        if (kv_gguf_str_eq(g->kvs[i].key, key))
            return &g->kvs[i];
    return NULL;
}

static int parse_tensor(cursor *c, kv_gguf *g, kv_gguf_tensor *t, kv_gguf_str *tname, uint64_t *offset,
                        kv_error *err)
{
    size_t at = c->pos;
    *tname = cur_str(c, "tensor name");
    uint32_t n_dims = (uint32_t)cur_uint(c, 4, "tensor dimension count");
    if (c->failed)
        return kv_error_set(err, KV_EINPUT, "%s: truncated or corrupt tensor entry at offset %zu: %s", g->name, at,
                            c->what);
    char name[80];
    print_key(name, sizeof name, *tname);
    if (tname->len == 0 || tname->len > 255)
        return kv_error_set(err, KV_EINPUT, "%s: tensor at offset %zu: name length %zu (must be 1..255)", g->name,
                            at, tname->len);
    if (n_dims < 1 || n_dims > KV_GGUF_MAX_DIMS)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': %u dimensions (must be 1..%d)", g->name, name, n_dims,
                            KV_GGUF_MAX_DIMS);
    t->n_dims = n_dims;
    uint64_t n = 1;
    for (int d = 0; d < KV_GGUF_MAX_DIMS; d++)
        t->dims[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        t->dims[d] = cur_uint(c, 8, "tensor dimension");
        if (c->failed)
            return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': %s", g->name, name, c->what);
        if (t->dims[d] == 0 || t->dims[d] > ((uint64_t)1 << 40))
            return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': dimension %u is %llu (must be 1..2^40)", g->name,
                                name, d, (unsigned long long)t->dims[d]);
        if (n > UINT64_MAX / t->dims[d] || n * t->dims[d] > ((uint64_t)1 << 50))
            return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': element count overflows", g->name, name);
        n *= t->dims[d];
    }
    t->n_elements = n;
    t->type = (uint32_t)cur_uint(c, 4, "tensor type");
    *offset = cur_uint(c, 8, "tensor offset");
    if (c->failed)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': %s", g->name, name, c->what);
    const ggml_type_info *ti = ggml_type_find(t->type);
    if (!ti)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': unknown tensor type %u", g->name, name, t->type);
    if (t->dims[0] % ti->block_elems)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': row length %llu is not a multiple of %s's block of %u",
                            g->name, name, (unsigned long long)t->dims[0], ti->name, ti->block_elems);
    /* n <= 2^50 and block_bytes <= 292, so this cannot overflow 64 bits. */
    uint64_t bytes = n / ti->block_elems * ti->block_bytes;
    if (bytes > SIZE_MAX)
        return kv_error_set(err, KV_EINPUT, "%s: tensor '%s': too large", g->name, name);
    t->bytes = (size_t)bytes;
    return KV_OK;
}

static int parse(kv_gguf *g, kv_error *err)
{
    cursor c = {.base = g->base, .size = g->size};
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0)
        return kv_error_set(err, KV_EINPUT, "%s: not a GGUF file (the first 4 bytes are not \"GGUF\")", g->name);
    c.pos = 4;
    g->version = (uint32_t)cur_uint(&c, 4, "version");
    uint64_t n_tensors = cur_uint(&c, 8, "tensor count");
    uint64_t n_kvs = cur_uint(&c, 8, "metadata count");
    if (c.failed)
        return kv_error_set(err, KV_EINPUT, "%s: truncated header: %s", g->name, c.what);
    if (g->version < 2 || g->version > 3)
        return kv_error_set(err, KV_EINPUT, "%s: GGUF version %u is not supported (2 and 3 are)", g->name,
                            g->version);
    size_t left = g->size - c.pos;
    /* A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a
       tensor entry at least 8 + 4 + 8 + 4 + 8. */
    if (n_kvs > left / 13)
        return kv_error_set(err, KV_EINPUT, "%s: metadata count %llu cannot fit in a file of %zu bytes", g->name,
                            (unsigned long long)n_kvs, g->size);
    if (n_tensors > left / 32)
        return kv_error_set(err, KV_EINPUT, "%s: tensor count %llu cannot fit in a file of %zu bytes", g->name,
                            (unsigned long long)n_tensors, g->size);
    g->kvs = kv_calloc((size_t)n_kvs + 1, sizeof *g->kvs);
    for (uint64_t i = 0; i < n_kvs; i++) {
        g->n_kvs = (size_t)i + 1; /* so destroy frees what was parsed */
        int rc = parse_kv(&c, &g->kvs[i], g->name, err);
        if (rc)
            return rc;
    }
    {
        kv_gguf_str **names = kv_malloc((g->n_kvs + 1) * sizeof *names);
        for (size_t i = 0; i < g->n_kvs; i++)
            names[i] = &g->kvs[i].key;
        int rc = check_unique(names, g->n_kvs, g->name, "metadata key", err);
        kv_free(names);
        if (rc)
            return rc;
    }
    g->alignment = 32;
    const gguf_kv *al = find_kv(g, "general.alignment");
    if (al) {
        if (al->type != KV_GGUF_UINT32 || al->num.u == 0 || (al->num.u & (al->num.u - 1)) || al->num.u > 65536)
            return kv_error_set(err, KV_EINPUT, "%s: key 'general.alignment' must be a uint32 power of two <= 65536",
                                g->name);
        g->alignment = (uint32_t)al->num.u;
    }

    g->tensors = kv_calloc((size_t)n_tensors + 1, sizeof *g->tensors);
    kv_gguf_str *tnames = kv_calloc((size_t)n_tensors + 1, sizeof *tnames);
    uint64_t *offsets = kv_calloc((size_t)n_tensors + 1, sizeof *offsets);
    int rc = KV_OK;
    for (uint64_t i = 0; i < n_tensors && rc == KV_OK; i++) {
        rc = parse_tensor(&c, g, &g->tensors[i], &tnames[i], &offsets[i], err);
        if (rc == KV_OK) {
            g->n_tensors = (size_t)i + 1;
            g->tensors[i].name = kv_strndup(tnames[i].ptr, tnames[i].len);
        }
    }
    if (rc == KV_OK) {
        kv_gguf_str **names = kv_malloc((g->n_tensors + 1) * sizeof *names);
        for (size_t i = 0; i < g->n_tensors; i++)
            names[i] = &tnames[i];
        rc = check_unique(names, g->n_tensors, g->name, "tensor name", err);
        kv_free(names);
    }
    if (rc == KV_OK) {
        size_t data = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
        if (data > g->size && g->n_tensors > 0)
            rc = kv_error_set(err, KV_EINPUT, "%s: the tensor data section (offset %zu) starts past the end of the file (%zu bytes)",
                              g->name, data, g->size);
        g->data_offset = data;
        for (size_t i = 0; i < g->n_tensors && rc == KV_OK; i++) {
            kv_gguf_tensor *t = &g->tensors[i];
            uint64_t off = offsets[i];
            if (off % g->alignment)
                rc = kv_error_set(err, KV_EINPUT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                                  g->name, t->name, (unsigned long long)off, g->alignment);
            else if (off > g->size - data || t->bytes > g->size - data - off)
                rc = kv_error_set(err, KV_EINPUT,
                                  "%s: tensor '%s': data at offset %llu + %zu bytes runs past the end of the file "
                                  "(%zu bytes of tensor data)",
                                  g->name, t->name, (unsigned long long)off, t->bytes, g->size - data);
            else
                t->data = g->base + data + off;
        }
    }
    kv_free(tnames);
    kv_free(offsets);
    return rc;
}

static int finish_open(kv_gguf *g, kv_gguf **out, kv_error *err)
{
    int rc = parse(g, err);
    if (rc) {
        kv_gguf_destroy(g);
        return rc;
    }
    *out = g;
    return KV_OK;
}

int kv_gguf_open_memory(const void *data, size_t bytes, const char *name, kv_gguf **out, kv_error *err)
{
    *out = NULL;
    kv_gguf *g = kv_calloc(1, sizeof *g);
    g->name = kv_strdup(name ? name : "<memory>");
    g->base = data;
    g->size = data ? bytes : 0;
    return finish_open(g, out, err);
}

int kv_gguf_open(const char *path, kv_gguf **out, kv_error *err)
{
    *out = NULL;
    /* Opened without blocking on a FIFO; anything but a regular file is refused (infile.h). */
    kv_error why = {0};
    uint64_t size = 0;
    int fd = kv_input_open(path, "model file", KV_INPUT_NO_CAP, &size, &why);
    if (fd < 0)
        return kv_error_set(err, why.code, "%s", why.msg);
    struct stat st = {.st_size = (off_t)size};
    if (st.st_size == 0) {
        close(fd);
        return kv_error_set(err, KV_EINPUT, "model file '%s' is empty", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED)
        return kv_error_set(err, KV_EFAIL, "cannot map model file '%s': %s", path, strerror(saved));
    kv_gguf *g = kv_calloc(1, sizeof *g);
    g->name = kv_strdup(path);
    g->base = map;
    g->size = (size_t)st.st_size;
    g->map = map;
    return finish_open(g, out, err);
}

void kv_gguf_destroy(kv_gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_kvs; i++)
        kv_free(g->kvs[i].strings);
    kv_free(g->kvs);
    for (size_t i = 0; i < g->n_tensors; i++)
        kv_free((char *)g->tensors[i].name);
    kv_free(g->tensors);
    if (g->map)
        munmap(g->map, g->size);
    kv_free(g->name);
    kv_free(g);
}

const char *kv_gguf_name(const kv_gguf *g) { return g->name; }
uint32_t kv_gguf_version(const kv_gguf *g) { return g->version; }
size_t kv_gguf_file_bytes(const kv_gguf *g) { return g->size; }

bool kv_gguf_str_eq(kv_gguf_str s, const char *text)
{
    size_t n = strlen(text);
    return s.len == n && memcmp(s.ptr, text, n) == 0;
}

/* ---- Metadata getters ----------------------------------------------------------------- */

bool kv_gguf_has(const kv_gguf *g, const char *key) { return find_kv(g, key) != NULL; }

int kv_gguf_key_type(const kv_gguf *g, const char *key)
{
    const gguf_kv *kv = find_kv(g, key);
    return kv ? (int)kv->type : -1;
}

static const gguf_kv *need_kv(const kv_gguf *g, const char *key, kv_error *err)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv)
        kv_error_set(err, KV_EINPUT, "%s: key '%s' is missing", g->name, key);
    return kv;
}

static int is_signed_int(uint32_t t)
{
    return t == KV_GGUF_INT8 || t == KV_GGUF_INT16 || t == KV_GGUF_INT32 || t == KV_GGUF_INT64;
}

static int is_unsigned_int(uint32_t t)
{
    return t == KV_GGUF_UINT8 || t == KV_GGUF_UINT16 || t == KV_GGUF_UINT32 || t == KV_GGUF_UINT64;
}

int kv_gguf_get_u32(const kv_gguf *g, const char *key, uint32_t *out, kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (is_unsigned_int(kv->type) && kv->num.u <= UINT32_MAX) {
        *out = (uint32_t)kv->num.u;
        return KV_OK;
    }
    if (is_signed_int(kv->type) && kv->num.i >= 0 && kv->num.i <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)kv->num.i;
        return KV_OK;
    }
    return kv_error_set(err, KV_EINPUT, "%s: key '%s' has type %s; expected an integer in 0..2^32-1", g->name, key,
                        type_name(kv->type));
}

int kv_gguf_get_f32(const kv_gguf *g, const char *key, float *out, kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (kv->type != KV_GGUF_FLOAT32 && kv->type != KV_GGUF_FLOAT64)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' has type %s; expected float32", g->name, key,
                            type_name(kv->type));
    *out = (float)kv->num.f;
    return KV_OK;
}

int kv_gguf_get_bool(const kv_gguf *g, const char *key, bool *out, kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (kv->type != KV_GGUF_BOOL)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' has type %s; expected bool", g->name, key,
                            type_name(kv->type));
    *out = kv->num.u != 0;
    return KV_OK;
}

int kv_gguf_get_string(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (kv->type != KV_GGUF_STRING)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' has type %s; expected string", g->name, key,
                            type_name(kv->type));
    *out = kv->str;
    return KV_OK;
}

int kv_gguf_get_string_array(const kv_gguf *g, const char *key, const kv_gguf_str **items, size_t *count,
                             kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (kv->type != KV_GGUF_ARRAY || kv->elem_type != KV_GGUF_STRING)
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' is not an array of strings", g->name, key);
    *items = kv->strings;
    *count = (size_t)kv->count;
    return KV_OK;
}

int kv_gguf_get_int_array(const kv_gguf *g, const char *key, int64_t **out, size_t *count, kv_error *err)
{
    const gguf_kv *kv = need_kv(g, key, err);
    if (!kv)
        return KV_EINPUT;
    if (kv->type != KV_GGUF_ARRAY || !(is_signed_int(kv->elem_type) || is_unsigned_int(kv->elem_type)))
        return kv_error_set(err, KV_EINPUT, "%s: key '%s' is not an array of integers", g->name, key);
    size_t es = scalar_bytes(kv->elem_type);
    int64_t *v = kv_malloc(((size_t)kv->count + 1) * sizeof *v);
    for (size_t i = 0; i < kv->count; i++) {
        gguf_kv tmp;
        decode_scalar(&tmp, kv->elem_type, kv->elems + i * es);
        if (is_unsigned_int(kv->elem_type) && tmp.num.u > INT64_MAX) {
            kv_free(v);
            return kv_error_set(err, KV_EINPUT, "%s: key '%s': element %zu is out of range", g->name, key, i);
        }
        v[i] = is_signed_int(kv->elem_type) ? tmp.num.i : (int64_t)tmp.num.u;
    }
    *out = v;
    *count = (size_t)kv->count;
    return KV_OK;
}

/* ---- Tensors -------------------------------------------------------------------------- */

size_t kv_gguf_tensor_count(const kv_gguf *g) { return g->n_tensors; }

const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name)
{
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

float kv_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf or nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        /* zero or subnormal: man * 2^-24, exact in float */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Dequantizes n elements (a multiple of the block size) starting at src. */
static void dequantize(uint32_t type, const uint8_t *src, size_t n, float *out)
{
    switch (type) {
    case KV_GGML_F32:
        memcpy(out, src, n * 4);
        break;
    case KV_GGML_F16:
        for (size_t i = 0; i < n; i++)
            out[i] = kv_half_to_float((uint16_t)load_le(src + 2 * i, 2));
        break;
    case KV_GGML_BF16:
        for (size_t i = 0; i < n; i++)
            out[i] = bf16_to_float((uint16_t)load_le(src + 2 * i, 2));
        break;
    case KV_GGML_Q4_0: /* {f16 d; u8 qs[16]}: x[j] = (lo4 - 8) d, x[j+16] = (hi4 - 8) d */
        for (size_t b = 0; b < n / 32; b++, src += 18, out += 32) {
            float d = kv_half_to_float((uint16_t)load_le(src, 2));
            for (int j = 0; j < 16; j++) {
                out[j] = (float)((src[2 + j] & 0x0f) - 8) * d;
                out[j + 16] = (float)((src[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case KV_GGML_Q4_1: /* {f16 d; f16 m; u8 qs[16]}: x[j] = lo4 d + m, x[j+16] = hi4 d + m */
        for (size_t b = 0; b < n / 32; b++, src += 20, out += 32) {
            float d = kv_half_to_float((uint16_t)load_le(src, 2));
            float m = kv_half_to_float((uint16_t)load_le(src + 2, 2));
            for (int j = 0; j < 16; j++) {
                out[j] = (float)(src[4 + j] & 0x0f) * d + m;
                out[j + 16] = (float)(src[4 + j] >> 4) * d + m;
            }
        }
        break;
    case KV_GGML_Q8_0: /* {f16 d; i8 qs[32]}: x[j] = qs[j] d */
        for (size_t b = 0; b < n / 32; b++, src += 34, out += 32) {
            float d = kv_half_to_float((uint16_t)load_le(src, 2));
            for (int j = 0; j < 32; j++)
                out[j] = (float)(int8_t)src[2 + j] * d;
        }
        break;
    default:
        break; /* refused by the caller */
    }
}

int kv_gguf_tensor_rows_f32(const kv_gguf_tensor *t, uint64_t row0, uint64_t nrows, float *out, kv_error *err)
{
    if (!kv_ggml_type_supported(t->type))
        return kv_error_set(err, KV_EINPUT, "tensor '%s': type %s (%u) is not supported (F32, F16, BF16, Q4_0, Q4_1, Q8_0 are)",
                            t->name, kv_ggml_type_name(t->type), t->type);
    uint64_t rows = t->n_elements / t->dims[0];
    if (row0 > rows || nrows > rows - row0)
        return kv_error_set(err, KV_EINPUT, "tensor '%s': rows %llu..%llu are out of range (%llu rows)", t->name,
                            (unsigned long long)row0, (unsigned long long)(row0 + nrows), (unsigned long long)rows);
    const ggml_type_info *ti = ggml_type_find(t->type);
    size_t row_bytes = (size_t)(t->dims[0] / ti->block_elems * ti->block_bytes);
    dequantize(t->type, t->data + row0 * row_bytes, (size_t)(nrows * t->dims[0]), out);
    return KV_OK;
}
