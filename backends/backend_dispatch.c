/* backend_dispatch.c — the one dispatcher: checks kernel arguments and composes optional kernels. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_impl.h"
#include "core/base/alloc.h"

/* ---- Dispatch ----------------------------------------------------------------- */

int kv_buffer_alloc(kv_backend *be, size_t bytes, kv_buffer **out, kv_error *err)
{
    *out = NULL;
    return be->iface->buffer_alloc(be->ctx, bytes, out, err);
}

void kv_buffer_free(kv_backend *be, kv_buffer *buf)
{
    if (buf)
        be->iface->buffer_free(be->ctx, buf);
}

int kv_buffer_write(kv_backend *be, kv_buffer *dst, size_t offset, const void *src, size_t bytes, kv_error *err)
{
    return be->iface->buffer_write(be->ctx, dst, offset, src, bytes, err);
}

int kv_buffer_read(kv_backend *be, kv_buffer *src, size_t offset, void *dst, size_t bytes, kv_error *err)
{
    return be->iface->buffer_read(be->ctx, src, offset, dst, bytes, err);
}

int kv_backend_synchronize(kv_backend *be, kv_error *err)
{
    return be->iface->synchronize(be->ctx, err);
}

static int check_layout(const char *kernel, const kv_quant_layout *l, unsigned bits, kv_error *err)
{
    if (bits < 1 || bits > 16)
        return kv_error_set(err, KV_EINPUT, "%s: bits must be 1..16, got %u", kernel, bits);
    if (l->group_size == 0)
        return kv_error_set(err, KV_EINPUT, "%s: group_size must be >= 1", kernel);
    if (l->grouping != KV_GROUP_TOKEN && l->grouping != KV_GROUP_CHANNEL)
        return kv_error_set(err, KV_EINPUT, "%s: unknown grouping %d", kernel, (int)l->grouping);
    if ((uint64_t)l->rows * l->cols > SIZE_MAX / 8) /* keeps every byte count below SIZE_MAX */
        return kv_error_set(err, KV_EINPUT, "%s: %u x %u values is too large", kernel, l->rows, l->cols);
    return KV_OK;
}

static int check_split(const char *kernel, unsigned bits, unsigned anchor_bits, int allow_zero, kv_error *err)
{
    if (anchor_bits == 0 && allow_zero)
        return KV_OK;
    if (anchor_bits < 1 || anchor_bits >= bits)
        return kv_error_set(err, KV_EINPUT, "%s: anchor_bits must be 1..%u for %u-bit codes, got %u", kernel,
                            bits ? bits - 1 : 0, bits, anchor_bits);
    return KV_OK;
}

/* A required argument must name a buffer, at an offset aligned for its element
   type (4 for f32/u32, 2 for u16, 8 for kv_page_desc, 1 for bytes). */
static int need(const char *kernel, const char *name, kv_bref r, size_t align, kv_error *err)
{
    if (!r.buf)
        return kv_error_set(err, KV_EINPUT, "%s: argument '%s' has no buffer", kernel, name);
    if (r.offset % align != 0)
        return kv_error_set(err, KV_EINPUT, "%s: argument '%s' offset %zu is not a multiple of %zu", kernel, name,
                            r.offset, align);
    return KV_OK;
}

/* The same for an optional argument (buf == NULL passes). */
static int maybe(const char *kernel, const char *name, kv_bref r, size_t align, kv_error *err)
{
    return r.buf ? need(kernel, name, r, align, err) : KV_OK;
}

static int unsupported(const kv_backend *be, const char *kernel, kv_error *err)
{
    return kv_error_set(err, KV_EFAIL, "backend '%s' does not implement %s", be->reg->name, kernel);
}

#define DISPATCH(member, kernel, be, a, err)                                                         \
    ((be)->iface->member ? (be)->iface->member((be)->ctx, (a), (err)) : unsupported((be), (kernel), (err)))

int kv_backend_quantize(kv_backend *be, const kv_quantize_args *a, kv_error *err)
{
    int rc = check_layout("quantize", &a->layout, a->bits, err);
    if (!rc)
        rc = need("quantize", "x", a->x, 4, err);
    if (!rc)
        rc = need("quantize", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("quantize", "scale", a->scale, 2, err);
    if (!rc)
        rc = need("quantize", "zero", a->zero, 2, err);
    return rc ? rc : DISPATCH(quantize, "quantize", be, a, err);
}

int kv_backend_dequantize(kv_backend *be, const kv_dequantize_args *a, kv_error *err)
{
    int rc = check_layout("dequantize", &a->layout, a->bits, err);
    if (!rc)
        rc = check_split("dequantize", a->bits, a->anchor_bits, 1, err);
    if (!rc)
        rc = need("dequantize", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("dequantize", "scale", a->scale, 2, err);
    if (!rc)
        rc = need("dequantize", "zero", a->zero, 2, err);
    if (!rc)
        rc = need("dequantize", "out", a->out, 4, err);
    return rc ? rc : DISPATCH(dequantize, "dequantize", be, a, err);
}

int kv_backend_pack(kv_backend *be, const kv_pack_args *a, kv_error *err)
{
    int rc = check_layout("pack", &a->layout, a->bits, err);
    if (!rc)
        rc = need("pack", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("pack", "packed", a->packed, 1, err);
    return rc ? rc : DISPATCH(pack, "pack", be, a, err);
}

int kv_backend_unpack(kv_backend *be, const kv_pack_args *a, kv_error *err)
{
    int rc = check_layout("unpack", &a->layout, a->bits, err);
    if (!rc)
        rc = need("unpack", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("unpack", "packed", a->packed, 1, err);
    return rc ? rc : DISPATCH(unpack, "unpack", be, a, err);
}

int kv_backend_split(kv_backend *be, const kv_split_args *a, kv_error *err)
{
    int rc = a->bits < 2 || a->bits > 16
                 ? kv_error_set(err, KV_EINPUT, "split: bits must be 2..16, got %u", a->bits)
                 : check_split("split", a->bits, a->anchor_bits, 0, err);
    if (!rc)
        rc = need("split", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("split", "anchor", a->anchor, 2, err);
    if (!rc)
        rc = need("split", "residual", a->residual, 2, err);
    return rc ? rc : DISPATCH(split, "split", be, a, err);
}

int kv_backend_merge(kv_backend *be, const kv_split_args *a, kv_error *err)
{
    int rc = a->bits < 2 || a->bits > 16
                 ? kv_error_set(err, KV_EINPUT, "merge: bits must be 2..16, got %u", a->bits)
                 : check_split("merge", a->bits, a->anchor_bits, 0, err);
    if (!rc)
        rc = need("merge", "codes", a->codes, 2, err);
    if (!rc)
        rc = need("merge", "anchor", a->anchor, 2, err);
    if (!rc)
        rc = need("merge", "residual", a->residual, 2, err);
    return rc ? rc : DISPATCH(merge, "merge", be, a, err);
}

/* Temporary buffers for the composed (unfused) encode/decode. */
typedef struct scratch {
    kv_buffer *codes, *anchor, *residual;
} scratch;

static void scratch_free(kv_backend *be, scratch *s)
{
    kv_buffer_free(be, s->codes);
    kv_buffer_free(be, s->anchor);
    kv_buffer_free(be, s->residual);
}

static int scratch_alloc(kv_backend *be, size_t count, int split, scratch *s, kv_error *err)
{
    memset(s, 0, sizeof *s);
    size_t bytes = count * sizeof(uint16_t);
    int rc = kv_buffer_alloc(be, bytes, &s->codes, err);
    if (!rc && split)
        rc = kv_buffer_alloc(be, bytes, &s->anchor, err);
    if (!rc && split)
        rc = kv_buffer_alloc(be, bytes, &s->residual, err);
    if (rc)
        scratch_free(be, s);
    return rc;
}

int kv_backend_encode(kv_backend *be, const kv_encode_args *a, kv_error *err)
{
    int rc = check_layout("encode", &a->layout, a->bits, err);
    if (!rc)
        rc = check_split("encode", a->bits, a->anchor_bits, 1, err);
    if (!rc)
        rc = need("encode", "x", a->x, 4, err);
    if (!rc)
        rc = need("encode", "anchor_packed", a->anchor_packed, 1, err);
    if (!rc && a->anchor_bits)
        rc = need("encode", "residual_packed", a->residual_packed, 1, err);
    if (!rc)
        rc = need("encode", "scale", a->scale, 2, err);
    if (!rc)
        rc = need("encode", "zero", a->zero, 2, err);
    if (rc)
        return rc;
    if (be->iface->encode)
        return be->iface->encode(be->ctx, a, err);

    size_t count = (size_t)a->layout.rows * a->layout.cols;
    int split = a->anchor_bits > 0;
    scratch s;
    rc = scratch_alloc(be, count, split, &s, err);
    if (rc)
        return rc;
    kv_quantize_args q = {a->layout, a->bits, a->x, {s.codes, 0}, a->scale, a->zero};
    rc = kv_backend_quantize(be, &q, err);
    if (!rc && split) {
        kv_split_args sp = {count, a->bits, a->anchor_bits, {s.codes, 0}, {s.anchor, 0}, {s.residual, 0}};
        rc = kv_backend_split(be, &sp, err);
        kv_pack_args pa = {a->layout, a->anchor_bits, {s.anchor, 0}, a->anchor_packed};
        if (!rc)
            rc = kv_backend_pack(be, &pa, err);
        kv_pack_args pr = {a->layout, a->bits - a->anchor_bits, {s.residual, 0}, a->residual_packed};
        if (!rc)
            rc = kv_backend_pack(be, &pr, err);
    } else if (!rc) {
        kv_pack_args p = {a->layout, a->bits, {s.codes, 0}, a->anchor_packed};
        rc = kv_backend_pack(be, &p, err);
    }
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    scratch_free(be, &s);
    return rc;
}

int kv_backend_decode(kv_backend *be, const kv_decode_args *a, kv_error *err)
{
    int rc = check_layout("decode", &a->layout, a->bits, err);
    if (!rc)
        rc = check_split("decode", a->bits, a->anchor_bits, 1, err);
    if (!rc)
        rc = need("decode", "anchor_packed", a->anchor_packed, 1, err);
    if (!rc)
        rc = maybe("decode", "residual_packed", a->residual_packed, 1, err);
    if (!rc)
        rc = need("decode", "scale", a->scale, 2, err);
    if (!rc)
        rc = need("decode", "zero", a->zero, 2, err);
    if (!rc)
        rc = need("decode", "out", a->out, 4, err);
    if (rc)
        return rc;
    if (be->iface->decode)
        return be->iface->decode(be->ctx, a, err);

    size_t count = (size_t)a->layout.rows * a->layout.cols;
    int split = a->anchor_bits > 0;
    int anchor_only = split && a->residual_packed.buf == NULL;
    scratch s;
    rc = scratch_alloc(be, count, split, &s, err);
    if (rc)
        return rc;
    if (!split) {
        kv_pack_args p = {a->layout, a->bits, {s.codes, 0}, a->anchor_packed};
        rc = kv_backend_unpack(be, &p, err);
        kv_dequantize_args d = {a->layout, a->bits, 0, {s.codes, 0}, a->scale, a->zero, a->out};
        if (!rc)
            rc = kv_backend_dequantize(be, &d, err);
    } else {
        kv_pack_args pa = {a->layout, a->anchor_bits, {s.anchor, 0}, a->anchor_packed};
        rc = kv_backend_unpack(be, &pa, err);
        if (!rc && anchor_only) {
            kv_dequantize_args d = {a->layout, a->bits, a->anchor_bits, {s.anchor, 0}, a->scale, a->zero,
                                    a->out};
            rc = kv_backend_dequantize(be, &d, err);
        } else if (!rc) {
            kv_pack_args pr = {a->layout, a->bits - a->anchor_bits, {s.residual, 0}, a->residual_packed};
            rc = kv_backend_unpack(be, &pr, err);
            kv_split_args m = {count, a->bits, a->anchor_bits, {s.codes, 0}, {s.anchor, 0}, {s.residual, 0}};
            if (!rc)
                rc = kv_backend_merge(be, &m, err);
            kv_dequantize_args d = {a->layout, a->bits, 0, {s.codes, 0}, a->scale, a->zero, a->out};
            if (!rc)
                rc = kv_backend_dequantize(be, &d, err);
        }
    }
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    scratch_free(be, &s);
    return rc;
}

int kv_backend_bf16_round(kv_backend *be, const kv_bf16_args *a, kv_error *err)
{
    int rc = need("bf16_round", "in", a->in, 4, err);
    if (!rc)
        rc = need("bf16_round", "out", a->out, 4, err);
    return rc ? rc : DISPATCH(bf16_round, "bf16_round", be, a, err);
}

int kv_backend_attention(kv_backend *be, const kv_attention_args *a, kv_error *err)
{
    if (a->n_kv_heads == 0 || a->n_heads % a->n_kv_heads != 0)
        return kv_error_set(err, KV_EINPUT, "attention: %u query heads do not divide into %u KV heads",
                            a->n_heads, a->n_kv_heads);
    if (a->head_dim == 0)
        return kv_error_set(err, KV_EINPUT, "attention: head_dim must be >= 1");
    int rc = need("attention", "q", a->q, 4, err);
    if (!rc)
        rc = need("attention", "q_pos", a->q_pos, 4, err);
    if (!rc && a->n_pages)
        rc = need("attention", "pages", a->pages, 8, err);
    if (!rc)
        rc = need("attention", "head_pages", a->head_pages, 4, err);
    if (!rc && a->n_pages)
        rc = need("attention", "positions", a->positions, 4, err);
    if (!rc && a->n_pages)
        rc = need("attention", "kv_data", a->kv_data, 4, err);
    if (!rc)
        rc = need("attention", "out", a->out, 4, err);
    if (!rc)
        rc = maybe("attention", "scores", a->scores, 4, err);
    if (rc)
        return rc;
    return DISPATCH(attention, "attention", be, a, err);
}

int kv_backend_compact_alloc(kv_backend *be, const kv_compact_args *a, kv_error *err)
{
    if (a->capacity == 0)
        return kv_error_set(err, KV_EINPUT, "compact_alloc: free list capacity is 0");
    int rc = need("compact_alloc", "demand", a->demand, 4, err);
    if (!rc)
        rc = need("compact_alloc", "offsets", a->offsets, 4, err);
    if (!rc)
        rc = maybe("compact_alloc", "pages", a->pages, 4, err);
    if (!rc)
        rc = need("compact_alloc", "free_list", a->free_list, 4, err);
    if (!rc)
        rc = need("compact_alloc", "state", a->state, 4, err);
    if (rc)
        return rc;
    return DISPATCH(compact_alloc, "compact_alloc", be, a, err);
}

int kv_backend_compact_release(kv_backend *be, const kv_compact_args *a, kv_error *err)
{
    if (a->capacity == 0)
        return kv_error_set(err, KV_EINPUT, "compact_release: free list capacity is 0");
    int rc = need("compact_release", "demand", a->demand, 4, err);
    if (!rc)
        rc = need("compact_release", "offsets", a->offsets, 4, err);
    if (!rc)
        rc = maybe("compact_release", "pages", a->pages, 4, err);
    if (!rc)
        rc = need("compact_release", "free_list", a->free_list, 4, err);
    if (!rc)
        rc = need("compact_release", "state", a->state, 4, err);
    if (rc)
        return rc;
    return DISPATCH(compact_release, "compact_release", be, a, err);
}
