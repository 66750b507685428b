/* kernels.cl — kvsim's kernels in OpenCL C 1.2; the CUDA and HIP backends compile
 * this same file through kv_device.h's dialect macros.
 *
 * Conventions (backend.h has the data layouts):
 *  - Every buffer argument is (base pointer, byte offset); the kernel forms the
 *    typed pointer itself, so OpenCL needs no sub-buffers and CUDA/HIP take the
 *    same signature.
 *  - Element-wise kernels take a 1-D range rounded up to the work-group size and
 *    check their index against the count.
 *  - KV_WG (a power of two, set by the host at build time) is the work-group
 *    size of the kernels that use local memory and barriers: attention,
 *    attention_scores and compact.
 *  - Every result is computed by exactly one work-item, in a fixed order, so a
 *    run is deterministic; codes, metadata and packed bytes equal the CPU
 *    reference bit for bit (numerics in kv_device.h).
 */
#include "kv_device.h"

#ifndef KV_WG
#define KV_WG 64
#endif

/* Every index below n that this work-item handles (grid-stride, so any launch
   size works), and likewise every work-group index below n. */
#define KV_FOR_ITEMS(i, n) for (kv_u64 i = KV_GLOBAL_ID(); i < (kv_u64)(n); i += KV_GLOBAL_SIZE())
#define KV_FOR_GROUPS(g, n) for (kv_u64 g = KV_GROUP_ID(); g < (kv_u64)(n); g += KV_NUM_GROUPS())

#define KV_PTR(type, base, off) ((KV_GLOBAL type *)((KV_GLOBAL kv_u8 *)(base) + (off)))
#define KV_CPTR(type, base, off) ((KV_GLOBAL const type *)((KV_GLOBAL const kv_u8 *)(base) + (off)))

/* ---- Quantize: one work-item per group --------------------------------------------- */

KV_KERNEL kv_quantize(KV_GLOBAL const kv_u8 *xb, kv_u64 xo, KV_GLOBAL kv_u8 *cb, kv_u64 co,
                      KV_GLOBAL kv_u8 *sb, kv_u64 so, KV_GLOBAL kv_u8 *zb, kv_u64 zo, kv_u32 rows,
                      kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(g, kv_dev_groups(l)) {
        KV_GLOBAL const float *x = KV_CPTR(float, xb, xo);
        KV_GLOBAL kv_u16 *codes = KV_PTR(kv_u16, cb, co);
        kv_u32 n = kv_dev_group_len(l, g);
        float mn = 0.0f, mx = 0.0f;
        int have = 0;
        for (kv_u32 i = 0; i < n; i++) {
            float v = x[kv_dev_group_elem(l, g, i)];
            if (!KV_ISFINITE(v))
                continue;
            if (!have || v < mn)
                mn = v;
            if (!have || v > mx)
                mx = v;
            have = 1;
        }
        kv_u32 meta = kv_dev_quant_meta(mn, mx, have, bits);
        KV_PTR(kv_u16, sb, so)[g] = (kv_u16)(meta & 0xffffu);
        KV_PTR(kv_u16, zb, zo)[g] = (kv_u16)(meta >> 16);
        float s = kv_dev_f16_to_f32(meta & 0xffffu), z = kv_dev_f16_to_f32(meta >> 16);
        for (kv_u32 i = 0; i < n; i++) {
            kv_u64 e = kv_dev_group_elem(l, g, i);
            codes[e] = (kv_u16)kv_dev_quant_code(x[e], s, z, bits);
        }
    }
    KV_KERNEL_END();
}

/* ---- Dequantize: one work-item per element ------------------------------------------ */

/* anchor_bits == 0: codes are b-bit codes; else a-bit anchors, midpoint reconstruction. */
KV_KERNEL kv_dequantize(KV_GLOBAL const kv_u8 *cb, kv_u64 co, KV_GLOBAL const kv_u8 *sb, kv_u64 so,
                        KV_GLOBAL const kv_u8 *zb, kv_u64 zo, KV_GLOBAL kv_u8 *ob, kv_u64 oo, kv_u32 rows,
                        kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits, kv_u32 anchor_bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(e, (kv_u64)rows * cols) {
        kv_u32 i;
        kv_u64 g = kv_dev_elem_group(l, e / cols, e % cols, &i);
        float s = kv_dev_f16_to_f32(KV_CPTR(kv_u16, sb, so)[g]);
        float z = kv_dev_f16_to_f32(KV_CPTR(kv_u16, zb, zo)[g]);
        kv_u32 q = KV_CPTR(kv_u16, cb, co)[e];
        float v;
        if (anchor_bits)
            v = kv_dev_dequant_anchor(q & kv_dev_code_max(anchor_bits), bits - anchor_bits, s, z);
        else
            v = kv_dev_dequant(q & kv_dev_code_max(bits), s, z);
        KV_PTR(float, ob, oo)[e] = v;
    }
    KV_KERNEL_END();
}

/* ---- Pack: one work-item per packed byte; unpack: one per code ------------------------- */

/* Group and byte-within-group of byte `byte` of a packed plane; returns the group. */
KV_FN kv_u64 kv_dev_byte_group(kv_dev_layout l, kv_u32 bits, kv_u64 byte, kv_u64 *k)
{
    kv_u64 full = kv_dev_stream_bytes(l.group_size, bits);
    if (l.grouping == 0) {
        kv_u64 per_row = kv_dev_ceil_div(l.cols, l.group_size);
        kv_u64 last = l.cols % l.group_size;
        kv_u64 row_bytes = (l.cols / l.group_size) * full + (last ? kv_dev_stream_bytes(last, bits) : 0);
        kv_u64 row = byte / row_bytes, rem = byte % row_bytes;
        kv_u64 kg = rem / full;
        if (kg > per_row - 1)
            kg = per_row - 1;
        *k = rem - kg * full;
        return row * per_row + kg;
    }
    kv_u64 nfull = l.rows / l.group_size;
    kv_u64 block_bytes = (kv_u64)l.cols * full;
    if (byte < nfull * block_bytes) {
        kv_u64 block = byte / block_bytes, rem = byte % block_bytes;
        *k = rem % full;
        return block * l.cols + rem / full;
    }
    kv_u64 rem = byte - nfull * block_bytes;
    kv_u64 lb = kv_dev_stream_bytes(l.rows % l.group_size, bits);
    *k = rem % lb;
    return nfull * l.cols + rem / lb;
}

/* Byte k of group g's bit stream, gathered from the codes (masked to b bits). */
KV_FN kv_u32 kv_dev_pack_byte(KV_GLOBAL const kv_u16 *codes, kv_dev_layout l, kv_u32 bits, kv_u64 g, kv_u64 k)
{
    kv_u32 n = kv_dev_group_len(l, g);
    kv_u32 mask = kv_dev_code_max(bits);
    kv_u64 lo = 8 * k;
    kv_u32 first = (kv_u32)(lo / bits);
    kv_u32 last = (kv_u32)((lo + 7) / bits);
    if (last > n - 1)
        last = n - 1;
    kv_u32 byte = 0;
    for (kv_u32 i = first; i <= last; i++) {
        kv_u32 c = codes[kv_dev_group_elem(l, g, i)] & mask;
        kv_u64 pos = (kv_u64)i * bits;
        if (pos >= lo)
            byte |= c << (kv_u32)(pos - lo);
        else
            byte |= c >> (kv_u32)(lo - pos);
    }
    return byte & 0xffu;
}

KV_KERNEL kv_pack(KV_GLOBAL const kv_u8 *cb, kv_u64 co, KV_GLOBAL kv_u8 *pb, kv_u64 po, kv_u64 total_bytes,
                  kv_u32 rows, kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(byte, total_bytes) {
        kv_u64 k;
        kv_u64 g = kv_dev_byte_group(l, bits, byte, &k);
        KV_PTR(kv_u8, pb, po)[byte] = (kv_u8)kv_dev_pack_byte(KV_CPTR(kv_u16, cb, co), l, bits, g, k);
    }
    KV_KERNEL_END();
}

/* Code i (b bits) of the stream of `nbytes` bytes at s. */
KV_FN kv_u32 kv_dev_stream_code(KV_GLOBAL const kv_u8 *s, kv_u64 nbytes, kv_u32 bits, kv_u32 i)
{
    kv_u64 pos = (kv_u64)i * bits;
    kv_u64 b0 = pos / 8;
    kv_u32 sh = (kv_u32)(pos % 8);
    kv_u32 w = s[b0];
    if (b0 + 1 < nbytes)
        w |= (kv_u32)s[b0 + 1] << 8;
    if (b0 + 2 < nbytes)
        w |= (kv_u32)s[b0 + 2] << 16;
    return (w >> sh) & kv_dev_code_max(bits);
}

/* Code of element (row, col) in a packed plane of `bits`-bit codes. */
KV_FN kv_u32 kv_dev_plane_code(KV_GLOBAL const kv_u8 *plane, kv_dev_layout l, kv_u32 bits, kv_u64 row, kv_u64 col)
{
    kv_u32 i;
    kv_u64 g = kv_dev_elem_group(l, row, col, &i);
    kv_u64 off = kv_dev_group_offset(l, bits, g);
    return kv_dev_stream_code(plane + off, kv_dev_stream_bytes(kv_dev_group_len(l, g), bits), bits, i);
}

KV_KERNEL kv_unpack(KV_GLOBAL const kv_u8 *pb, kv_u64 po, KV_GLOBAL kv_u8 *cb, kv_u64 co, kv_u32 rows,
                    kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(e, (kv_u64)rows * cols) {
        KV_PTR(kv_u16, cb, co)[e] = (kv_u16)kv_dev_plane_code(KV_CPTR(kv_u8, pb, po), l, bits, e / cols, e % cols);
    }
    KV_KERNEL_END();
}

/* ---- Split and merge: one work-item per code --------------------------------------- */

KV_KERNEL kv_split(KV_GLOBAL const kv_u8 *cb, kv_u64 co, KV_GLOBAL kv_u8 *ab, kv_u64 ao, KV_GLOBAL kv_u8 *rb,
                   kv_u64 ro, kv_u64 count, kv_u32 bits, kv_u32 anchor_bits)
{
    KV_FOR_ITEMS(e, count) {
        kv_u32 q = KV_CPTR(kv_u16, cb, co)[e] & kv_dev_code_max(bits);
        kv_u32 r = bits - anchor_bits;
        KV_PTR(kv_u16, ab, ao)[e] = (kv_u16)(q >> r);
        KV_PTR(kv_u16, rb, ro)[e] = (kv_u16)(q & kv_dev_code_max(r));
    }
    KV_KERNEL_END();
}

KV_KERNEL kv_merge(KV_GLOBAL kv_u8 *cb, kv_u64 co, KV_GLOBAL const kv_u8 *ab, kv_u64 ao, KV_GLOBAL const kv_u8 *rb,
                   kv_u64 ro, kv_u64 count, kv_u32 bits, kv_u32 anchor_bits)
{
    KV_FOR_ITEMS(e, count) {
        kv_u32 r = bits - anchor_bits;
        kv_u32 a = KV_CPTR(kv_u16, ab, ao)[e] & kv_dev_code_max(anchor_bits);
        kv_u32 res = KV_CPTR(kv_u16, rb, ro)[e] & kv_dev_code_max(r);
        KV_PTR(kv_u16, cb, co)[e] = (kv_u16)((a << r) | res);
    }
    KV_KERNEL_END();
}

/* ---- Encode (quantize + split + pack): one work-item per group ----------------------- */

/* Appends `nbits` bits of v to the stream at out (bit accumulator in *acc / *have). */
KV_FN void kv_dev_put_bits(KV_GLOBAL kv_u8 *out, kv_u64 *pos, kv_u32 *acc, kv_u32 *have, kv_u32 v, kv_u32 nbits)
{
    *acc |= v << *have;
    *have += nbits;
    while (*have >= 8) {
        out[(*pos)++] = (kv_u8)(*acc & 0xffu);
        *acc >>= 8;
        *have -= 8;
    }
}

KV_FN void kv_dev_flush_bits(KV_GLOBAL kv_u8 *out, kv_u64 *pos, kv_u32 acc, kv_u32 have)
{
    if (have)
        out[*pos] = (kv_u8)(acc & 0xffu);
}

/* anchor_bits == 0: the whole b-bit code goes to the anchor plane, no residual. */
KV_KERNEL kv_encode(KV_GLOBAL const kv_u8 *xb, kv_u64 xo, KV_GLOBAL kv_u8 *apb, kv_u64 apo, KV_GLOBAL kv_u8 *rpb,
                    kv_u64 rpo, KV_GLOBAL kv_u8 *sb, kv_u64 so, KV_GLOBAL kv_u8 *zb, kv_u64 zo, kv_u32 rows,
                    kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits, kv_u32 anchor_bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(g, kv_dev_groups(l)) {
        KV_GLOBAL const float *x = KV_CPTR(float, xb, xo);
        kv_u32 n = kv_dev_group_len(l, g);
        float mn = 0.0f, mx = 0.0f;
        int have = 0;
        for (kv_u32 i = 0; i < n; i++) {
            float v = x[kv_dev_group_elem(l, g, i)];
            if (!KV_ISFINITE(v))
                continue;
            if (!have || v < mn)
                mn = v;
            if (!have || v > mx)
                mx = v;
            have = 1;
        }
        kv_u32 meta = kv_dev_quant_meta(mn, mx, have, bits);
        KV_PTR(kv_u16, sb, so)[g] = (kv_u16)(meta & 0xffffu);
        KV_PTR(kv_u16, zb, zo)[g] = (kv_u16)(meta >> 16);
        float s = kv_dev_f16_to_f32(meta & 0xffffu), z = kv_dev_f16_to_f32(meta >> 16);

        kv_u32 abits = anchor_bits ? anchor_bits : bits;
        kv_u32 r = anchor_bits ? bits - anchor_bits : 0;
        KV_GLOBAL kv_u8 *ap = KV_PTR(kv_u8, apb, apo) + kv_dev_group_offset(l, abits, g);
        KV_GLOBAL kv_u8 *rp = anchor_bits ? KV_PTR(kv_u8, rpb, rpo) + kv_dev_group_offset(l, r, g) : ap;
        kv_u64 apos = 0, rpos = 0;
        kv_u32 aacc = 0, ahave = 0, racc = 0, rhave = 0;
        for (kv_u32 i = 0; i < n; i++) {
            kv_u32 q = kv_dev_quant_code(x[kv_dev_group_elem(l, g, i)], s, z, bits);
            kv_dev_put_bits(ap, &apos, &aacc, &ahave, q >> r, abits);
            if (anchor_bits)
                kv_dev_put_bits(rp, &rpos, &racc, &rhave, q & kv_dev_code_max(r), r);
        }
        kv_dev_flush_bits(ap, &apos, aacc, ahave);
        if (anchor_bits)
            kv_dev_flush_bits(rp, &rpos, racc, rhave);
    }
    KV_KERNEL_END();
}

/* ---- Decode (unpack + merge + dequantize): one work-item per element ------------------- */

/* has_residual == 0 with anchor_bits > 0: anchor-only (midpoint) reconstruction. */
KV_KERNEL kv_decode(KV_GLOBAL const kv_u8 *apb, kv_u64 apo, KV_GLOBAL const kv_u8 *rpb, kv_u64 rpo,
                    KV_GLOBAL const kv_u8 *sb, kv_u64 so, KV_GLOBAL const kv_u8 *zb, kv_u64 zo, KV_GLOBAL kv_u8 *ob,
                    kv_u64 oo, kv_u32 rows, kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits,
                    kv_u32 anchor_bits, kv_u32 has_residual)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
    KV_FOR_ITEMS(e, (kv_u64)rows * cols) {
        kv_u64 row = e / cols, col = e % cols;
        kv_u32 i;
        kv_u64 g = kv_dev_elem_group(l, row, col, &i);
        float s = kv_dev_f16_to_f32(KV_CPTR(kv_u16, sb, so)[g]);
        float z = kv_dev_f16_to_f32(KV_CPTR(kv_u16, zb, zo)[g]);
        float v;
        if (!anchor_bits) {
            v = kv_dev_dequant(kv_dev_plane_code(KV_CPTR(kv_u8, apb, apo), l, bits, row, col), s, z);
        } else {
            kv_u32 r = bits - anchor_bits;
            kv_u32 a = kv_dev_plane_code(KV_CPTR(kv_u8, apb, apo), l, anchor_bits, row, col);
            if (has_residual) {
                kv_u32 res = kv_dev_plane_code(KV_CPTR(kv_u8, rpb, rpo), l, r, row, col);
                v = kv_dev_dequant((a << r) | res, s, z);
            } else {
                v = kv_dev_dequant_anchor(a, r, s, z);
            }
        }
        KV_PTR(float, ob, oo)[e] = v;
    }
    KV_KERNEL_END();
}

/* ---- BF16 rounding: one work-item per value ---------------------------------------- */

KV_KERNEL kv_bf16_round(KV_GLOBAL const kv_u8 *ib, kv_u64 io, KV_GLOBAL kv_u8 *ob, kv_u64 oo, kv_u64 count)
{
    KV_FOR_ITEMS(e, count) {
        KV_PTR(float, ob, oo)[e] = kv_dev_bf16_to_f32(kv_dev_bf16_from_f32(KV_CPTR(float, ib, io)[e]));
    }
    KV_KERNEL_END();
}

/* ---- Attention over paged, mixed-format KV ------------------------------------------- */

/* kv_page_desc as 14 little-endian u32 words (backend.h; the host checks the
   offsets): 0 ntokens, 1 pos_index, 2 key format {kind, bits, anchor_bits,
   grouping}, 3 key group_size, 4 value format, 5 value group_size, 6-7
   key_data, 8-9 key_meta, 10-11 value_data, 12-13 value_meta. */
#define KV_PAGE_WORDS 14u

/* How to read one page's K or V. */
typedef struct kv_dev_store {
    kv_u32 kind, bits, anchor_bits, plane_bits; /* plane_bits: a when anchor-only, else b */
    kv_dev_layout l;                            /* rows = page tokens, cols = head_dim */
    kv_u64 data, meta;                          /* byte offsets into kv_data */
    kv_u64 groups;                              /* QUANT: groups of the page's layout */
} kv_dev_store;

KV_FN kv_u64 kv_dev_word64(KV_GLOBAL const kv_u32 *w, kv_u32 i)
{
    return (kv_u64)w[i] | ((kv_u64)w[i + 1] << 32);
}

/* Reads format word `fw` of page p and the offsets at words `dw`, `mw`. Returns
   0 when the store is malformed or would read past kv_data (data_bytes). */
KV_FN int kv_dev_store_get(KV_GLOBAL const kv_u32 *pw, kv_u32 fw, kv_u32 dw, kv_u32 mw, kv_u32 ntok,
                           kv_u32 head_dim, kv_u64 data_bytes, kv_dev_store *st)
{
    kv_u32 f = pw[fw];
    st->kind = f & 0xffu;
    st->bits = (f >> 8) & 0xffu;
    st->anchor_bits = (f >> 16) & 0xffu;
    st->l.rows = ntok;
    st->l.cols = head_dim;
    st->l.grouping = (f >> 24) & 0xffu;
    st->l.group_size = pw[fw + 1];
    st->data = kv_dev_word64(pw, dw);
    st->meta = kv_dev_word64(pw, mw);
    st->groups = 0;
    st->plane_bits = 0;
    kv_u64 count = (kv_u64)ntok * head_dim;
    if (st->kind == 0)
        return (st->data % 4) == 0 && st->data <= data_bytes && count * 4 <= data_bytes - st->data;
    if (st->kind == 1)
        return (st->data % 2) == 0 && st->data <= data_bytes && count * 2 <= data_bytes - st->data;
    if (st->kind != 2 || st->bits < 1 || st->bits > 16 || st->anchor_bits >= st->bits ||
        st->l.group_size == 0 || st->l.grouping > 1)
        return 0;
    st->plane_bits = st->anchor_bits ? st->anchor_bits : st->bits;
    st->groups = kv_dev_groups(st->l);
    if (st->groups == 0)
        return 1;
    kv_u64 g = st->groups;
    kv_u64 plane = kv_dev_group_offset(st->l, st->plane_bits, g - 1) +
                   kv_dev_stream_bytes(kv_dev_group_len(st->l, g - 1), st->plane_bits);
    return (st->meta % 2) == 0 && st->data <= data_bytes && plane <= data_bytes - st->data &&
           st->meta <= data_bytes && st->groups * 4 <= data_bytes - st->meta;
}

/* Little-endian loads that do not assume alignment (kv_data may start at any
   byte offset of its buffer). */
KV_FN kv_u32 kv_dev_load_u16(KV_GLOBAL const kv_u8 *p)
{
    return (kv_u32)p[0] | ((kv_u32)p[1] << 8);
}

KV_FN float kv_dev_load_f32(KV_GLOBAL const kv_u8 *p)
{
    return KV_F32_FROM_BITS((kv_u32)p[0] | ((kv_u32)p[1] << 8) | ((kv_u32)p[2] << 16) | ((kv_u32)p[3] << 24));
}

/* Values d0 .. d0 + n - 1 (n <= KV_CHUNK) of token t of a page's K or V, as
   f32, into out. Quantized rows walk their groups incrementally: TOKEN groups
   run along the row (one group lookup per group_size values), CHANNEL groups
   share the row's block (one lookup per row). */
#define KV_CHUNK 16

KV_FN void kv_dev_row_chunk(KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *st, kv_u32 t, kv_u32 d0,
                            kv_u32 n, float *out)
{
    kv_u64 e0 = (kv_u64)t * st->l.cols + d0;
    if (st->kind == 0) {
        for (kv_u32 j = 0; j < n; j++)
            out[j] = aligned ? KV_CPTR(float, data, st->data)[e0 + j] : kv_dev_load_f32(data + st->data + 4 * (e0 + j));
        return;
    }
    if (st->kind == 1) {
        for (kv_u32 j = 0; j < n; j++)
            out[j] = kv_dev_bf16_to_f32(aligned ? KV_CPTR(kv_u16, data, st->data)[e0 + j]
                                                : kv_dev_load_u16(data + st->data + 2 * (e0 + j)));
        return;
    }
    kv_u32 pb = st->plane_bits, r = st->bits - st->anchor_bits;
    KV_GLOBAL const kv_u8 *meta = data + st->meta;
    if (st->l.grouping == 0) {
        kv_u32 i;
        kv_u64 g = kv_dev_elem_group(st->l, t, d0, &i);
        kv_u32 len = kv_dev_group_len(st->l, g);
        KV_GLOBAL const kv_u8 *stream = data + st->data + kv_dev_group_offset(st->l, pb, g);
        kv_u64 nbytes = kv_dev_stream_bytes(len, pb);
        float s = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * g));
        float z = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * (st->groups + g)));
        for (kv_u32 j = 0; j < n; j++) {
            if (i == len) { /* next group of the row */
                g++;
                i = 0;
                len = kv_dev_group_len(st->l, g);
                stream = data + st->data + kv_dev_group_offset(st->l, pb, g);
                nbytes = kv_dev_stream_bytes(len, pb);
                s = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * g));
                z = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * (st->groups + g)));
            }
            kv_u32 q = kv_dev_stream_code(stream, nbytes, pb, i);
            out[j] = st->anchor_bits ? kv_dev_dequant_anchor(q, r, s, z) : kv_dev_dequant(q, s, z);
            i++;
        }
        return;
    }
    /* CHANNEL: group (t / G) * head_dim + d, element t % G, every group of the
       block with the same length. */
    kv_u64 block = t / st->l.group_size;
    kv_u32 i = t % st->l.group_size;
    kv_u32 len = kv_dev_group_len(st->l, block * st->l.cols);
    kv_u64 sb = kv_dev_stream_bytes(len, pb);
    kv_u64 base = st->data + block * st->l.cols * kv_dev_stream_bytes(st->l.group_size, pb);
    for (kv_u32 j = 0; j < n; j++) {
        kv_u64 g = block * st->l.cols + d0 + j;
        kv_u32 q = kv_dev_stream_code(data + base + (d0 + j) * sb, sb, pb, i);
        float s = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * g));
        float z = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * (st->groups + g)));
        out[j] = st->anchor_bits ? kv_dev_dequant_anchor(q, r, s, z) : kv_dev_dequant(q, s, z);
    }
}

/* Everything attention needs to know about one page. */
typedef struct kv_dev_page {
    kv_u32 ntok, pos_index;
    kv_dev_store k, v;
    int ok; /* 0: malformed, skipped */
} kv_dev_page;

KV_FN kv_dev_page kv_dev_page_get(KV_GLOBAL const kv_u32 *pages, kv_u32 p, kv_u32 head_dim, kv_u64 data_bytes,
                                  kv_u64 n_positions)
{
    kv_dev_page pg;
    KV_GLOBAL const kv_u32 *pw = pages + (kv_u64)p * KV_PAGE_WORDS;
    pg.ntok = pw[0];
    pg.pos_index = pw[1];
    int ok = (kv_u64)pg.pos_index + pg.ntok <= n_positions;
    ok = kv_dev_store_get(pw, 2, 6, 8, pg.ntok, head_dim, data_bytes, &pg.k) && ok;
    ok = kv_dev_store_get(pw, 4, 10, 12, pg.ntok, head_dim, data_bytes, &pg.v) && ok;
    pg.ok = ok && pg.ntok > 0;
    return pg;
}

/* Logits carry about twice fp32's precision (an unevaluated sum hi + lo):
   with a peaked softmax the largest logits are large (tens), and fp32's
   rounding of them alone would move the probabilities by ~3e-6 relative —
   too close to the 1e-5 tolerance against the CPU reference, which works in
   double. Products are split exactly with fma (TwoProduct) and summed with
   TwoSum (no FMA contraction, so the error terms are exact), then e^(l - m) is
   taken of the float-float difference, exact for the dominant tokens. */
typedef struct kv_dev_ff {
    float hi, lo;
} kv_dev_ff;

/* s + e = a + b exactly (TwoSum). */
KV_FN kv_dev_ff kv_dev_two_sum(float a, float b)
{
    kv_dev_ff r;
    r.hi = a + b;
    float bb = r.hi - a;
    r.lo = (a - (r.hi - bb)) + (b - bb);
    return r;
}

/* a - b, rounded once to float from the (nearly) exact difference. */
KV_FN float kv_dev_ff_sub(kv_dev_ff a, kv_dev_ff b)
{
    return (a.hi - b.hi) + (a.lo - b.lo);
}

KV_FN int kv_dev_ff_gt(kv_dev_ff a, kv_dev_ff b)
{
    return a.hi > b.hi || (a.hi == b.hi && a.lo > b.lo);
}

/* scale * dot(q, K_t), as float-float. */
KV_FN kv_dev_ff kv_dev_logit(KV_GLOBAL const float *q, KV_GLOBAL const kv_u8 *data, int aligned,
                             const kv_dev_store *k, kv_u32 t, kv_u32 head_dim, float scale)
{
    float row[KV_CHUNK];
    float hi = 0.0f, lo = 0.0f;
    for (kv_u32 d0 = 0; d0 < head_dim; d0 += KV_CHUNK) {
        kv_u32 n = head_dim - d0 < KV_CHUNK ? head_dim - d0 : KV_CHUNK;
        kv_dev_row_chunk(data, aligned, k, t, d0, n, row);
        for (kv_u32 j = 0; j < n; j++) {
            float p = q[d0 + j] * row[j];
            float pe = KV_FMA(q[d0 + j], row[j], -p); /* p + pe = the exact product */
            kv_dev_ff s = kv_dev_two_sum(hi, p);
            hi = s.hi;
            lo += s.lo + pe;
        }
    }
    kv_dev_ff dot = kv_dev_two_sum(hi, lo);
    kv_dev_ff r;
    r.hi = dot.hi * scale;
    r.lo = KV_FMA(dot.hi, scale, -r.hi) + dot.lo * scale;
    return kv_dev_two_sum(r.hi, r.lo);
}

/* acc[d] += p * V_t[d] for every d < head_dim. */
KV_FN void kv_dev_axpy(float *acc, float p, KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *v, kv_u32 t,
                       kv_u32 head_dim)
{
    float row[KV_CHUNK];
    for (kv_u32 d0 = 0; d0 < head_dim; d0 += KV_CHUNK) {
        kv_u32 n = head_dim - d0 < KV_CHUNK ? head_dim - d0 : KV_CHUNK;
        kv_dev_row_chunk(data, aligned, v, t, d0, n, row);
        for (kv_u32 j = 0; j < n; j++)
            acc[d0 + j] += p * row[j];
    }
}

/* The first page and page count of KV head kh, clamped to [0, n_pages). */
KV_FN void kv_dev_head_range(KV_GLOBAL const kv_u32 *head_pages, kv_u32 kh, kv_u32 n_pages, kv_u32 *first,
                             kv_u32 *count)
{
    kv_u32 f = head_pages[2 * kh], c = head_pages[2 * kh + 1];
    if (f > n_pages)
        f = n_pages;
    if (c > n_pages - f)
        c = n_pages - f;
    *first = f;
    *count = c;
}

/* Attention, split-K inside a work-group. One work-group of KV_WG per (query,
   head) (grid-stride over them). Work-item w takes the head's pages w, w +
   KV_WG, ... and runs an online softmax over their visible tokens: running max
   m_w, normaliser l_w and a private output acc_w (rescaled when the max
   grows). The work-group then combines: M = max m_w, L = sum l_w e^(m_w - M),
   out = sum acc_w e^(m_w - M) / L, the sums over w taken in work-item order
   (KV_TILE dimensions at a time through local memory). Pages of 16..64 tokens
   keep every work-item busy, and the partial sums keep fp32 rounding far below
   the 1e-5 tolerance even at 32K tokens. head_dim <= KV_MAX_HEAD_DIM (the host
   checks). ml (optional) receives (M.hi, M.lo, L) per (query, head) for the scores. */
#ifndef KV_MAX_HEAD_DIM
#define KV_MAX_HEAD_DIM 256
#endif
#define KV_TILE KV_WG

KV_KERNEL kv_attention(KV_GLOBAL const kv_u8 *qb, kv_u64 qo, KV_GLOBAL const kv_u8 *qpb, kv_u64 qpo,
                       KV_GLOBAL const kv_u8 *pgb, kv_u64 pgo, KV_GLOBAL const kv_u8 *hpb, kv_u64 hpo,
                       KV_GLOBAL const kv_u8 *posb, kv_u64 poso, kv_u64 n_positions, KV_GLOBAL const kv_u8 *datab,
                       kv_u64 datao, kv_u64 data_bytes, KV_GLOBAL kv_u8 *ob, kv_u64 oo, KV_GLOBAL float *ml,
                       kv_u32 n_queries, kv_u32 n_heads, kv_u32 n_kv_heads, kv_u32 head_dim, kv_u32 n_pages,
                       float scale)
{
    KV_LOCAL float red[KV_WG];
    KV_LOCAL float red_lo[KV_WG];
    KV_LOCAL float tile[KV_WG * KV_TILE];
    KV_LOCAL kv_u32 seen_any[KV_WG];
    float acc[KV_MAX_HEAD_DIM];
    KV_GLOBAL const kv_u8 *data = datab + datao;
    int aligned = (datao % 4) == 0;
    kv_u32 lid = KV_LOCAL_ID();
    KV_GLOBAL const kv_u32 *pages = KV_CPTR(kv_u32, pgb, pgo);
    KV_GLOBAL const kv_u32 *positions = KV_CPTR(kv_u32, posb, poso);
    KV_FOR_GROUPS(wg, (kv_u64)n_queries * n_heads) {
        kv_u32 h = (kv_u32)(wg % n_heads);
        kv_u64 qi = wg / n_heads;
        kv_u32 kh = h / (n_heads / n_kv_heads);
        KV_GLOBAL const float *q = KV_CPTR(float, qb, qo) + (qi * n_heads + h) * head_dim;
        KV_GLOBAL float *out = KV_PTR(float, ob, oo) + (qi * n_heads + h) * head_dim;
        kv_u32 qpos = KV_CPTR(kv_u32, qpb, qpo)[qi];
        kv_u32 first, count;
        kv_dev_head_range(KV_CPTR(kv_u32, hpb, hpo), kh, n_pages, &first, &count);

        /* This work-item's pages: online softmax. */
        for (kv_u32 d = 0; d < head_dim; d++)
            acc[d] = 0.0f;
        kv_dev_ff m = {0.0f, 0.0f};
        float l = 0.0f;
        int seen = 0;
        for (kv_u32 p = first + lid; p < first + count; p += KV_WG) {
            kv_dev_page pg = kv_dev_page_get(pages, p, head_dim, data_bytes, n_positions);
            if (!pg.ok)
                continue;
            for (kv_u32 t = 0; t < pg.ntok; t++) {
                if (positions[pg.pos_index + t] > qpos)
                    continue;
                kv_dev_ff lg = kv_dev_logit(q, data, aligned, &pg.k, t, head_dim, scale);
                if (!seen) {
                    m = lg;
                    seen = 1;
                } else if (kv_dev_ff_gt(lg, m)) {
                    float f = KV_EXP(kv_dev_ff_sub(m, lg));
                    l *= f;
                    for (kv_u32 d = 0; d < head_dim; d++)
                        acc[d] *= f;
                    m = lg;
                }
                float pr = KV_EXP(kv_dev_ff_sub(lg, m));
                l += pr;
                kv_dev_axpy(acc, pr, data, aligned, &pg.v, t, head_dim);
            }
        }

        /* Combine the work-items: the common max, then the weighted sums. */
        red[lid] = m.hi;
        red_lo[lid] = m.lo;
        seen_any[lid] = (kv_u32)seen;
        KV_BARRIER();
        kv_dev_ff gm = {0.0f, 0.0f};
        int any = 0;
        for (kv_u32 w = 0; w < KV_WG; w++) {
            kv_dev_ff mw = {red[w], red_lo[w]};
            if (seen_any[w] && (!any || kv_dev_ff_gt(mw, gm))) {
                gm = mw;
                any = 1;
            }
        }
        float f = seen ? KV_EXP(kv_dev_ff_sub(m, gm)) : 0.0f;
        KV_BARRIER();
        red[lid] = l * f;
        KV_BARRIER();
        float gl = 0.0f;
        for (kv_u32 w = 0; w < KV_WG; w++)
            gl += red[w];
        for (kv_u32 d0 = 0; d0 < head_dim; d0 += KV_TILE) {
            for (kv_u32 j = 0; j < KV_TILE; j++)
                tile[lid * KV_TILE + j] = d0 + j < head_dim ? acc[d0 + j] * f : 0.0f;
            KV_BARRIER();
            for (kv_u32 j0 = 0; j0 < KV_TILE; j0 += KV_WG) { /* the same trip count for every work-item */
                kv_u32 j = j0 + lid;
                if (j < KV_TILE && d0 + j < head_dim) {
                    float sum = 0.0f;
                    for (kv_u32 w = 0; w < KV_WG; w++)
                        sum += tile[w * KV_TILE + j];
                    out[d0 + j] = any ? sum / gl : 0.0f;
                }
            }
            KV_BARRIER();
        }
        if (ml && lid == 0) {
            ml[3 * (qi * n_heads + h)] = any ? gm.hi : 0.0f;
            ml[3 * (qi * n_heads + h) + 1] = any ? gm.lo : 0.0f;
            ml[3 * (qi * n_heads + h) + 2] = any ? gl : 0.0f;
        }
        KV_BARRIER(); /* local memory is reused by the next (query, head) */
    }
    KV_KERNEL_END();
}

/* Scores: one work-group of KV_WG per KV head (grid-stride); work-item w takes
   the head's pages w, w + KV_WG, ... (every work-item walks the page list to
   know where each page's tokens start). For each token: per query head of the
   GQA group, the probability summed over the queries that see it; then the
   maximum over the group's heads. */
KV_KERNEL kv_attention_scores(KV_GLOBAL const kv_u8 *qb, kv_u64 qo, KV_GLOBAL const kv_u8 *qpb, kv_u64 qpo,
                              KV_GLOBAL const kv_u8 *pgb, kv_u64 pgo, KV_GLOBAL const kv_u8 *hpb, kv_u64 hpo,
                              KV_GLOBAL const kv_u8 *posb, kv_u64 poso, kv_u64 n_positions,
                              KV_GLOBAL const kv_u8 *datab, kv_u64 datao, kv_u64 data_bytes,
                              KV_GLOBAL const float *ml, KV_GLOBAL kv_u8 *scb, kv_u64 sco, kv_u32 score_stride,
                              kv_u32 n_queries, kv_u32 n_heads, kv_u32 n_kv_heads, kv_u32 head_dim, kv_u32 n_pages,
                              float scale)
{
    kv_u32 lid = KV_LOCAL_ID();
    kv_u32 group = n_heads / n_kv_heads;
    KV_GLOBAL const kv_u8 *data = datab + datao;
    int aligned = (datao % 4) == 0;
    KV_GLOBAL const float *qall = KV_CPTR(float, qb, qo);
    KV_GLOBAL const kv_u32 *qpos = KV_CPTR(kv_u32, qpb, qpo);
    KV_GLOBAL const kv_u32 *pages = KV_CPTR(kv_u32, pgb, pgo);
    KV_GLOBAL const kv_u32 *positions = KV_CPTR(kv_u32, posb, poso);
    KV_FOR_GROUPS(khg, n_kv_heads) {
        kv_u32 kh = (kv_u32)khg;
        KV_GLOBAL float *scores = KV_PTR(float, scb, sco) + (kv_u64)kh * score_stride;
        kv_u32 first, count;
        kv_dev_head_range(KV_CPTR(kv_u32, hpb, hpo), kh, n_pages, &first, &count);
        kv_u64 base = 0; /* index of the page's first token among the head's tokens */
        for (kv_u32 p = first; p < first + count; p++) {
            kv_u32 ntok = pages[(kv_u64)p * KV_PAGE_WORDS];
            if ((p - first) % KV_WG == lid) {
                kv_dev_page pg = kv_dev_page_get(pages, p, head_dim, data_bytes, n_positions);
                for (kv_u32 t = 0; t < ntok && base + t < score_stride; t++) {
                    float best = 0.0f;
                    if (pg.ok) {
                        kv_u32 pos = positions[pg.pos_index + t];
                        for (kv_u32 hh = 0; hh < group; hh++) {
                            kv_u32 h = kh * group + hh;
                            float sum = 0.0f;
                            for (kv_u32 qi = 0; qi < n_queries; qi++) {
                                kv_u64 at = 3 * ((kv_u64)qi * n_heads + h);
                                float lsum = ml[at + 2];
                                if (pos > qpos[qi] || lsum == 0.0f)
                                    continue;
                                KV_GLOBAL const float *q = qall + ((kv_u64)qi * n_heads + h) * head_dim;
                                kv_dev_ff lg = kv_dev_logit(q, data, aligned, &pg.k, t, head_dim, scale);
                                kv_dev_ff mq = {ml[at], ml[at + 1]};
                                sum += KV_EXP(kv_dev_ff_sub(lg, mq)) / lsum;
                            }
                            if (hh == 0 || sum > best)
                                best = sum;
                        }
                    }
                    scores[base + t] = best;
                }
            }
            base += ntok;
        }
    }
    KV_KERNEL_END();
}

/* ---- Compaction: exclusive prefix sum + circular free list (one work-group) ---------- */

/* release == 0: allocate; 1: release (backend.h, kv_compact_args). Launched as a
   single work-group of KV_WG work-items. pages_cap is the room in pages (u32s).
   Statuses 1 and 2 as backend.h says. Where the CPU backend returns KV_EINPUT
   synchronously — a state that breaks tail == (head + free_count) % capacity,
   or demands that add up to more than the pages buffer holds — the device
   cannot (the host would have to read the data back), so it changes nothing
   but offsets and sets status = 3. Entry i is always handled by work-item
   i % KV_WG, which wrote offsets[i] itself, so pass B reads back its own writes. */
KV_KERNEL kv_compact(KV_GLOBAL const kv_u8 *db, kv_u64 dof, KV_GLOBAL kv_u8 *ofb, kv_u64 ofo, KV_GLOBAL kv_u8 *pgb,
                     kv_u64 pgo, kv_u64 pages_cap, KV_GLOBAL kv_u8 *flb, kv_u64 flo, KV_GLOBAL kv_u8 *stb,
                     kv_u64 sto, kv_u32 n, kv_u32 capacity, kv_u32 release)
{
    KV_LOCAL kv_u64 scan[KV_WG];
    KV_LOCAL kv_u32 verdict[1];
    kv_u32 lid = KV_LOCAL_ID();
    KV_GLOBAL const kv_u32 *demand = KV_CPTR(kv_u32, db, dof);
    KV_GLOBAL kv_u32 *offsets = KV_PTR(kv_u32, ofb, ofo);
    KV_GLOBAL kv_u32 *pages = KV_PTR(kv_u32, pgb, pgo);
    KV_GLOBAL kv_u32 *free_list = KV_PTR(kv_u32, flb, flo);
    KV_GLOBAL kv_u32 *state = KV_PTR(kv_u32, stb, sto);

    /* Pass A: offsets = exclusive prefix sum of demand, KV_WG entries at a time
       (Hillis-Steele scan in local memory, a running carry between chunks). */
    kv_u64 carry = 0;
    for (kv_u32 base = 0; base < n; base += KV_WG) {
        kv_u64 v = base + lid < n ? demand[base + lid] : 0;
        scan[lid] = v;
        KV_BARRIER();
        for (kv_u32 s = 1; s < KV_WG; s <<= 1) {
            kv_u64 add = lid >= s ? scan[lid - s] : 0;
            KV_BARRIER();
            scan[lid] += add;
            KV_BARRIER();
        }
        if (base + lid < n) {
            kv_u64 off = carry + scan[lid] - v;
            offsets[base + lid] = off > 0xffffffffu ? 0xffffffffu : (kv_u32)off; /* saturates, as the CPU does */
        }
        carry += scan[KV_WG - 1];
        KV_BARRIER();
    }
    kv_u64 total = carry;

    if (lid == 0) {
        kv_u32 head = state[0], tail = state[1], free_count = state[2];
        kv_u32 v = 0;
        if (head >= capacity || tail >= capacity || free_count > capacity ||
            tail != (kv_u32)(((kv_u64)head + free_count) % capacity))
            v = 3u; /* inconsistent state (the CPU reports KV_EINPUT) */
        else if (!release && total > free_count)
            v = 1u;
        else if (release && total > (kv_u64)capacity - free_count)
            v = 2u;
        else if (total > pages_cap)
            v = 3u; /* the pages buffer is too small (the CPU reports KV_EINPUT) */
        verdict[0] = v;
        if (v)
            state[3] = v;
    }
    KV_BARRIER();
    if (verdict[0] == 0) {
        kv_u32 head = state[0], tail = state[1];
        for (kv_u32 i = lid; i < n; i += KV_WG) {
            kv_u32 off = offsets[i], dem = demand[i];
            for (kv_u32 j = 0; j < dem; j++) {
                if (!release)
                    pages[off + j] = free_list[((kv_u64)head + off + j) % capacity];
                else
                    free_list[((kv_u64)tail + off + j) % capacity] = pages[off + j];
            }
        }
        KV_BARRIER();
        if (lid == 0) {
            if (!release) {
                state[0] = (kv_u32)(((kv_u64)head + total) % capacity);
                state[2] = state[2] - (kv_u32)total;
            } else {
                state[1] = (kv_u32)(((kv_u64)tail + total) % capacity);
                state[2] = state[2] + (kv_u32)total;
            }
            state[3] = 0;
        }
    }
    KV_KERNEL_END();
}
