/* kernels.cl — kvsim's kernels in OpenCL C 1.2; the CUDA and HIP backends compile
 * this same file through kv_device.h's dialect macros.
 *
 * Conventions (backend.h has the data layouts):
 *  - Every buffer argument is (base pointer, byte offset); the kernel forms the
 *    typed pointer itself, so OpenCL needs no sub-buffers and CUDA/HIP take the
 *    same signature.
 *  - Element-wise kernels take a 1-D range rounded up to the work-group size and
 *    check their index against the count (KV_FOR_ITEMS).
 *  - KV_WG (a power of two, set by the host at build time) is the work-group
 *    size of every launch but attention's: attention_merge, attention_scores
 *    and compact use it for local memory and barriers. Attention's shape is
 *    KV_ATTN_WG work-items of KV_LANES tokens each (kv_attention says why).
 *  - Every result is computed by exactly one work-item, in a fixed order, so a
 *    run is deterministic; codes, metadata and packed bytes equal the CPU
 *    reference bit for bit (numerics in kv_device.h); attention's sums depend
 *    on its shape and split only within the 1e-5 tolerance.
 */
#include "kv_device.h"

#ifndef KV_WG
#define KV_WG 64
#endif

/* Every index below n that this work-item handles, and likewise every
   work-group index below n. CUDA, HIP and Ascend cap their grids, so they loop
   grid-stride. The OpenCL host launches one work-item per index (launch() in
   opencl.c rounds up, never caps), so there it is a guard, not a loop: PoCL
   vectorises a work-group across its work-items only when the work-item loop
   it builds is the innermost loop, and a grid-stride loop inside every
   work-item kept all of these kernels scalar (objdump of its cache). */
#if defined(__OPENCL_VERSION__)
#define KV_FOR_ITEMS(i, n)                                                                                          \
    kv_u64 i = KV_GLOBAL_ID();                                                                                     \
    if (i < (kv_u64)(n))
#else
#define KV_FOR_ITEMS(i, n) for (kv_u64 i = KV_GLOBAL_ID(); i < (kv_u64)(n); i += KV_GLOBAL_SIZE())
#endif
#define KV_FOR_GROUPS(g, n) for (kv_u64 g = KV_GROUP_ID(); g < (kv_u64)(n); g += KV_NUM_GROUPS())

#define KV_PTR(type, base, off) ((KV_GLOBAL type *)((KV_GLOBAL kv_u8 *)(base) + (off)))
#define KV_CPTR(type, base, off) ((KV_GLOBAL const type *)((KV_GLOBAL const kv_u8 *)(base) + (off)))

/* ---- The codecs on CPU devices (OpenCL, KV_LANES > 1; token groups) --------------- */

/* The CPU shape of the codec kernels: one work-item per TOKEN group, which
   works on 16 values at a time with OpenCL vector types, so that PoCL emits
   SIMD instructions itself (its implicit vectoriser gives up on a kernel
   whose work-items run loops of their own length, as these do). Every 16
   codes of a group fill exactly 2w bytes of its w-bit stream (a stream
   starts on a byte boundary): they are packed and unpacked by swizzles and
   shifts for w = 1, 2, 4, 8, 16 and through a 64-bit shift-and-or or a byte
   gather for the other widths. The host launches decode, dequantize, pack
   and unpack one work-item per group when KV_LANES > 1 and the layout is
   TOKEN-grouped (opencl.c, codec_items), and encode and quantize one per
   KV_CPU_GROUPS groups (encode_items); CHANNEL groups keep the kernels below,
   but for KIVI's encode (kv_cpu_encode_channels: 16 columns a work-item).

   encode and quantize (KV_CPU_ENCODE): the group's min and max are taken over
   order-preserving integer keys of the floats (integer min/max vectorise;
   fp32 min/max with the N3 and NaN rules do not), and the codes are the
   vector transcription of kv_dev_quant_code. Bit for bit the scalar kernel's
   result: the keys order every finite value as `<` does but -0 before +0,
   which N3's `+ 0.0f` makes the same metadata. Only with the native division
   (KV_DIV_MODE 0): `/` on float16 is the correctly rounded vector division
   there; their fp16 metadata is worked out 16 groups at a time
   (kv_cpu_meta16). decode and dequantize: the same fma as kv_dev_dequant
   (and kv_dev_dequant_anchor) on 16 values, so bit for bit too. */
#if defined(__OPENCL_VERSION__)
#if KV_LANES > 1
#define KV_CPU_CODEC 1
#include "kernels_cpu_codec.cl"
#endif
#endif

/* ---- Quantize: one work-item per group --------------------------------------------- */

KV_KERNEL kv_quantize(KV_GLOBAL const kv_u8 *xb, kv_u64 xo, KV_GLOBAL kv_u8 *cb, kv_u64 co,
                      KV_GLOBAL kv_u8 *sb, kv_u64 so, KV_GLOBAL kv_u8 *zb, kv_u64 zo, kv_u32 rows,
                      kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
#if defined(KV_CPU_ENCODE)
    if (grouping == 0) { /* one work-item per KV_CPU_GROUPS groups (opencl.c launches that many) */
        kv_u64 item = KV_GLOBAL_ID();
        if (item < kv_dev_ceil_div(kv_dev_groups(l), KV_CPU_GROUPS))
            kv_cpu_quantize_groups(KV_CPTR(float, xb, xo), KV_PTR(kv_u16, cb, co), KV_PTR(kv_u16, sb, so),
                                   KV_PTR(kv_u16, zb, zo), l, item, bits);
        return;
    }
#endif
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

/* ---- Dequantize: one work-item per element (CPU devices: one per group) ---------- */

/* anchor_bits == 0: codes are b-bit codes; else a-bit anchors, midpoint reconstruction. */
KV_KERNEL kv_dequantize(KV_GLOBAL const kv_u8 *cb, kv_u64 co, KV_GLOBAL const kv_u8 *sb, kv_u64 so,
                        KV_GLOBAL const kv_u8 *zb, kv_u64 zo, KV_GLOBAL kv_u8 *ob, kv_u64 oo, kv_u32 rows,
                        kv_u32 cols, kv_u32 group_size, kv_u32 grouping, kv_u32 bits, kv_u32 anchor_bits)
{
    kv_dev_layout l = {rows, cols, group_size, grouping};
#if defined(KV_CPU_CODEC)
    if (grouping == 0) { /* one work-item per group (opencl.c launches that many) */
        kv_u64 g = KV_GLOBAL_ID();
        if (g < kv_dev_groups(l))
            kv_cpu_dequantize_group(KV_CPTR(kv_u16, cb, co), KV_CPTR(kv_u16, sb, so), KV_CPTR(kv_u16, zb, zo),
                                    KV_PTR(float, ob, oo), l, g, bits, anchor_bits);
        return;
    }
#endif
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
#if defined(KV_CPU_CODEC)
    if (grouping == 0) { /* one work-item per group (opencl.c launches that many) */
        kv_u64 g = KV_GLOBAL_ID();
        if (g < kv_dev_groups(l))
            kv_cpu_pack_group(KV_CPTR(kv_u16, cb, co), KV_PTR(kv_u8, pb, po), l, g, bits);
        return;
    }
#endif
    KV_FOR_ITEMS(byte, total_bytes) {
        kv_u64 k;
        kv_u64 g = kv_dev_byte_group(l, bits, byte, &k);
        KV_PTR(kv_u8, pb, po)[byte] = (kv_u8)kv_dev_pack_byte(KV_CPTR(kv_u16, cb, co), l, bits, g, k);
    }
    KV_KERNEL_END();
}

/* Code i (b bits) of the stream of `nbytes` bytes at s. */
KV_FN_INLINE kv_u32 kv_dev_stream_code(KV_GLOBAL const kv_u8 *s, kv_u64 nbytes, kv_u32 bits, kv_u32 i)
{
    kv_u64 pos = (kv_u64)i * bits;
    kv_u64 b0 = pos / 8;
    kv_u32 sh = (kv_u32)(pos % 8);
    /* The loads are unconditional (at a clamped index) so that a loop of
       these vectorises: a load under a condition does not. */
    kv_u64 b1 = b0 + 1 < nbytes ? b0 + 1 : b0, b2 = b0 + 2 < nbytes ? b0 + 2 : b0;
    kv_u32 w1 = s[b1], w2 = s[b2];
    kv_u32 w = (kv_u32)s[b0] | (b0 + 1 < nbytes ? w1 << 8 : 0u) | (b0 + 2 < nbytes ? w2 << 16 : 0u);
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
#if defined(KV_CPU_CODEC)
    if (grouping == 0) { /* one work-item per group (opencl.c launches that many) */
        kv_u64 g = KV_GLOBAL_ID();
        if (g < kv_dev_groups(l))
            kv_cpu_unpack_group(KV_CPTR(kv_u8, pb, po), KV_PTR(kv_u16, cb, co), l, g, bits);
        return;
    }
#endif
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
#if defined(KV_CPU_ENCODE)
    if (grouping == 0) { /* one work-item per KV_CPU_GROUPS groups (opencl.c launches that many) */
        kv_u64 item = KV_GLOBAL_ID();
        if (item < kv_dev_ceil_div(kv_dev_groups(l), KV_CPU_GROUPS))
            kv_cpu_encode_groups(KV_CPTR(float, xb, xo), KV_PTR(kv_u8, apb, apo),
                                 anchor_bits ? KV_PTR(kv_u8, rpb, rpo) : 0, KV_PTR(kv_u16, sb, so),
                                 KV_PTR(kv_u16, zb, zo), l, item, bits, anchor_bits);
        return;
    }
    { /* CHANNEL groups: one work-item per group_size rows x 16 columns (opencl.c launches that many) */
        kv_u64 item = KV_GLOBAL_ID();
        if (item < kv_dev_ceil_div(rows, group_size) * ((cols + 15) / 16))
            kv_cpu_encode_channels(KV_CPTR(float, xb, xo), KV_PTR(kv_u8, apb, apo),
                                   anchor_bits ? KV_PTR(kv_u8, rpb, rpo) : 0, KV_PTR(kv_u16, sb, so),
                                   KV_PTR(kv_u16, zb, zo), l, item, bits, anchor_bits);
        return;
    }
#endif
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
#if defined(KV_CPU_CODEC)
    if (grouping == 0) { /* one work-item per group (opencl.c launches that many) */
        kv_u64 g = KV_GLOBAL_ID();
        if (g < kv_dev_groups(l))
            kv_cpu_decode_group(KV_CPTR(kv_u8, apb, apo), has_residual ? KV_CPTR(kv_u8, rpb, rpo) : 0,
                                KV_CPTR(kv_u16, sb, so), KV_CPTR(kv_u16, zb, zo), KV_PTR(float, ob, oo), l, g, bits,
                                anchor_bits, has_residual);
        return;
    }
#endif
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

/* scale * (hi + lo), the float-float dot product of kv_dev_logit. */
KV_FN kv_dev_ff kv_dev_logit_end(float hi, float lo, float scale)
{
    kv_dev_ff dot = kv_dev_two_sum(hi, lo);
    kv_dev_ff r;
    r.hi = dot.hi * scale;
    r.lo = KV_FMA(dot.hi, scale, -r.hi) + dot.lo * scale;
    return kv_dev_two_sum(r.hi, r.lo);
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
    return kv_dev_logit_end(hi, lo, scale);
}

/* ---- Attention's row readers on CPU devices (OpenCL, KV_LANES > 1, KV_ATTN_WG 1) ----

   A row of K or V is read 16 values at a time in OpenCL vector types, so
   that PoCL emits SIMD code itself (its implicit vectoriser leaves a
   work-item's own loops alone). kv_cpu_rd_get works out a page's constants
   once; kv_cpu_row then reads f32 and bf16 rows with vector loads, and
   quantized TOKEN-grouped rows whose groups hold a multiple of 16 values with
   a 2-, 4- or 8-bit plane with one vector load per 16 bytes of codes
   (kv_cpu_row_tg), swizzles and shifts, and one vector fma per 16 values (the
   same fma as kv_dev_dequant, so the values are bit for bit the scalar
   reader's); the group's scale and zero are converted once per group. KIVI's
   CHANNEL-grouped K with such planes and groups of a multiple of 16 tokens is
   read 16 tokens of a channel at a time for full tiles (kv_cpu_ch_tile). Every
   other store (other CHANNEL groups and partial tiles, other widths, head_dims
   or groups not a multiple of 16, unaligned kv_data) goes through
   kv_dev_row_chunk (kv_cpu_row16_scalar). */
#if defined(__OPENCL_VERSION__)
#if KV_LANES > 1 && KV_ATTN_WG == 1
#define KV_CPU_ATTENTION 1
#ifndef KV_FP64
#define KV_FP64 0
#endif
#if KV_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
/* Its readers and kernel: kernels_cpu_attention.cl, included where kv_attention is below. */
#endif
#endif

/* Attention's shape (kv_attention below says what each means). */
#ifndef KV_MAX_HEAD_DIM
#define KV_MAX_HEAD_DIM 256
#endif
#ifndef KV_LANES
#define KV_LANES 1
#endif
#ifndef KV_ATTN_WG
#define KV_ATTN_WG KV_WG
#endif
#define KV_ATTN_TILE (KV_ATTN_WG * KV_LANES)
#define KV_DIMS_PER_ITEM ((KV_MAX_HEAD_DIM + KV_ATTN_WG - 1) / KV_ATTN_WG)
#if KV_LANES > 1
#define KV_ITEM_DIM(lid, j, per) ((lid) * (per) + (j)) /* a CPU thread's dimensions are contiguous */
#else
#define KV_ITEM_DIM(lid, j, per) ((lid) + (j) * KV_ATTN_WG) /* a warp's are */
#endif

/* One column of a page's K or V, read token by token: the per-page and
   per-column constants of element (t, d) worked out once (kv_dev_col_get),
   so that each element costs a few loads, shifts and one fma. */
typedef struct kv_dev_col {
    kv_u64 base;   /* TOKEN: byte offset of the column's group in row 0; CHANNEL: of the column's stream in block 0 */
    kv_u64 stride; /* TOKEN: bytes per row; CHANNEL: bytes per block of group_size rows */
    kv_u64 gbase;  /* metadata index of the column's group in row (TOKEN) or block (CHANNEL) 0 */
    kv_u64 gstep;  /* metadata indices per row (TOKEN) or per block (CHANNEL) */
    kv_u32 i;      /* TOKEN: the element's place in its group */
    kv_u32 sbytes; /* TOKEN: bytes of the column's group stream; CHANNEL: of a full block's streams */
    kv_u32 last_sbytes, last_block; /* CHANNEL: the stream bytes of the last (short) block, and its index */
} kv_dev_col;

KV_FN kv_dev_col kv_dev_col_get(const kv_dev_store *st, kv_u32 d)
{
    kv_dev_col c;
    kv_u32 pb = st->plane_bits;
    kv_dev_layout l = st->l;
    c.i = 0;
    c.sbytes = c.last_sbytes = c.last_block = 0;
    if (st->kind != 2) {
        c.base = c.stride = c.gbase = c.gstep = 0;
        return c;
    }
    if (l.grouping == 0) {
        kv_u64 gcol = d / l.group_size;
        c.i = d % l.group_size;
        c.gstep = kv_dev_ceil_div(l.cols, l.group_size);
        c.gbase = gcol;
        c.base = kv_dev_group_offset(l, pb, gcol);
        c.stride = l.rows > 1 ? kv_dev_group_offset(l, pb, c.gstep) : 0; /* bytes of one row */
        c.sbytes = (kv_u32)kv_dev_stream_bytes(kv_dev_group_len(l, gcol), pb);
        return c;
    }
    c.gstep = l.cols;
    c.gbase = d;
    c.sbytes = (kv_u32)kv_dev_stream_bytes(l.group_size, pb);
    c.stride = (kv_u64)l.cols * c.sbytes;
    c.base = (kv_u64)d * c.sbytes;
    c.last_block = (l.rows - 1) / l.group_size;
    c.last_sbytes = (kv_u32)kv_dev_stream_bytes(kv_dev_group_len(l, (kv_u64)c.last_block * l.cols), pb);
    return c;
}

/* Code q of a quantized element with its group's metadata index g, as f32. */
KV_FN_INLINE float kv_dev_quant_value(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, kv_u32 q, kv_u64 g)
{
    KV_GLOBAL const kv_u8 *meta = data + st->meta;
    float s = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * g));
    float z = kv_dev_f16_to_f32(kv_dev_load_u16(meta + 2 * (st->groups + g)));
    float va = kv_dev_dequant_anchor(q, st->bits - st->anchor_bits, s, z), vf = kv_dev_dequant(q, s, z);
    return st->anchor_bits ? va : vf;
}

/* Element (t, d) of a page's quantized K or V with TOKEN groups (c from kv_dev_col_get(st, d)). */
KV_FN_INLINE float kv_dev_quant_elem_token(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_dev_col *c,
                                           kv_u32 t)
{
    kv_u32 q = kv_dev_stream_code(data + st->data + c->base + (kv_u64)t * c->stride, c->sbytes, st->plane_bits, c->i);
    return kv_dev_quant_value(data, st, q, c->gbase + (kv_u64)t * c->gstep);
}

/* Likewise with CHANNEL groups. */
KV_FN_INLINE float kv_dev_quant_elem_channel(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st,
                                             const kv_dev_col *c, kv_u32 t, kv_u32 d)
{
    kv_u32 block = t / st->l.group_size, i = t % st->l.group_size;
    kv_u32 nbytes = block == c->last_block ? c->last_sbytes : c->sbytes;
    kv_u64 off = (kv_u64)block * c->stride + (kv_u64)d * nbytes;
    kv_u32 q = kv_dev_stream_code(data + st->data + off, nbytes, st->plane_bits, i);
    return kv_dev_quant_value(data, st, q, c->gbase + (kv_u64)block * c->gstep);
}

/* out[e] = element (tt[e], d) for e < KV_LANES (c from kv_dev_col_get(st, d)).
   One loop per storage kind, each with a branch-free body, so that a CPU
   compiler can vectorise it across the tokens. */
KV_FN_INLINE void kv_dev_lanes_elem(KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *st,
                                    const kv_dev_col *c, const kv_u32 *tt, kv_u32 d, float *out)
{
    kv_u64 cols = st->l.cols;
    if (st->kind == 0 && aligned) {
        KV_GLOBAL const float *x = KV_CPTR(float, data, st->data);
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = x[(kv_u64)tt[e] * cols + d];
    } else if (st->kind == 0) {
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = kv_dev_load_f32(data + st->data + 4 * ((kv_u64)tt[e] * cols + d));
    } else if (st->kind == 1 && aligned) {
        KV_GLOBAL const kv_u16 *x = KV_CPTR(kv_u16, data, st->data);
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = kv_dev_bf16_to_f32(x[(kv_u64)tt[e] * cols + d]);
    } else if (st->kind == 1) {
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = kv_dev_bf16_to_f32(kv_dev_load_u16(data + st->data + 2 * ((kv_u64)tt[e] * cols + d)));
    } else if (st->l.grouping == 0) {
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = kv_dev_quant_elem_token(data, st, c, tt[e]);
    } else {
        for (kv_u32 e = 0; e < KV_LANES; e++)
            out[e] = kv_dev_quant_elem_channel(data, st, c, tt[e], d);
    }
}

/* out[j] = element (t, dim j of this work-item) for j < per (cols[j] from
   kv_dev_col_get for that dimension, dims clamped to head_dim - 1). As
   kv_dev_lanes_elem, one branch-free loop per storage kind. */
KV_FN_INLINE void kv_dev_dims_elem(KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *st,
                                   const kv_dev_col *cols, kv_u32 lid, kv_u32 per, kv_u32 head_dim, kv_u32 t,
                                   float *out)
{
    kv_u64 e0 = (kv_u64)t * st->l.cols;
    if (st->kind == 0 && aligned) {
        KV_GLOBAL const float *x = KV_CPTR(float, data, st->data) + e0;
        for (kv_u32 j = 0; j < per; j++) {
            kv_u32 d = KV_ITEM_DIM(lid, j, per);
            out[j] = x[d < head_dim ? d : head_dim - 1];
        }
    } else if (st->kind == 0) {
        for (kv_u32 j = 0; j < per; j++) {
            kv_u32 d = KV_ITEM_DIM(lid, j, per);
            out[j] = kv_dev_load_f32(data + st->data + 4 * (e0 + (d < head_dim ? d : head_dim - 1)));
        }
    } else if (st->kind == 1 && aligned) {
        KV_GLOBAL const kv_u16 *x = KV_CPTR(kv_u16, data, st->data) + e0;
        for (kv_u32 j = 0; j < per; j++) {
            kv_u32 d = KV_ITEM_DIM(lid, j, per);
            out[j] = kv_dev_bf16_to_f32(x[d < head_dim ? d : head_dim - 1]);
        }
    } else if (st->kind == 1) {
        for (kv_u32 j = 0; j < per; j++) {
            kv_u32 d = KV_ITEM_DIM(lid, j, per);
            out[j] = kv_dev_bf16_to_f32(kv_dev_load_u16(data + st->data + 2 * (e0 + (d < head_dim ? d : head_dim - 1))));
        }
    } else if (st->l.grouping == 0) {
        for (kv_u32 j = 0; j < per; j++)
            out[j] = kv_dev_quant_elem_token(data, st, &cols[j], t);
    } else {
        for (kv_u32 j = 0; j < per; j++) {
            kv_u32 d = KV_ITEM_DIM(lid, j, per);
            out[j] = kv_dev_quant_elem_channel(data, st, &cols[j], t, d < head_dim ? d : head_dim - 1);
        }
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

/* The pages [*p0, *p1) that split `split` of n_split takes of KV head kh's pages (kv_dev_head_range):
   equal chunks of ceil(count / n_split) pages, the last ones short or empty. */
KV_FN void kv_dev_split_range(KV_GLOBAL const kv_u32 *head_pages, kv_u32 kh, kv_u32 n_pages, kv_u32 split,
                              kv_u32 n_split, kv_u32 *p0, kv_u32 *p1)
{
    kv_u32 first, count;
    kv_dev_head_range(head_pages, kh, n_pages, &first, &count);
    kv_u32 chunk = (kv_u32)kv_dev_ceil_div(count, n_split);
    *p0 = first + (split * chunk < count ? split * chunk : count);
    *p1 = first + ((split + 1) * chunk < count ? (split + 1) * chunk : count);
}

#if defined(KV_CPU_ATTENTION)
#include "kernels_cpu_attention.cl"
#else
/* Attention, split over the context as flash-decoding does. The host cuts
   each KV head's page list into n_split chunks of ceil(pages / n_split)
   pages (kv_dev_attn_splits); one work-group of KV_ATTN_WG per (query, head,
   chunk) (grid-stride over them). The work-group walks its chunk's pages a
   tile of KV_ATTN_WG * KV_LANES tokens at a time:
     1. work-item w takes the KV_LANES tokens from t0 + w * KV_LANES: their
        logits (float-float, above; tokens past the page's end compute the
        last token's and are masked, as are the causally hidden ones) into
        local memory;
     2. every work-item forms the tile's max in the same order; the running
        max M grows to it (the partial sums are rescaled by e^(M_old - M_new),
        exactly 1 when M does not move); p_t = e^(logit_t - M) into local
        memory; the running normaliser l = l f + sum p_t (t in order);
     3. work-item w owns ceil(head_dim / KV_ATTN_WG) dimensions of the output
        (KV_ITEM_DIM): acc[d] += p_t V_t[d] over the tile's tokens in order.
   (OpenCL CPU devices take the kernel above instead, KV_CPU_ATTENTION; the
   KV_LANES > 1 branches here remain for a build with work-groups of more
   than one work-item, which opencl.c no longer makes.)
   KV_LANES (host-chosen at build time) is 1 on GPUs: one token per thread,
   and a thread's dimensions interleaved, so that a warp reads consecutive
   bytes of a row. A CPU device gets KV_LANES 16 and a small work-group: a
   work-item's inner loops (its tokens for one dimension in 1., its
   dimensions for one token in 3.) then run across independent values, which
   the CPU compiler turns into SIMD instructions (fp32 sums are never
   reassociated, so only loops over independent values can be vectorised).
   n_split == 1: the work-group writes out = acc / l (and ml) itself. Else it
   writes its chunk's (M.hi, M.lo, l, acc[0..head_dim)) to part, and
   kv_attention_merge combines the chunks. Every sum runs in a fixed order,
   so a run is deterministic for given KV_ATTN_WG, KV_LANES and n_split; the
   partial sums keep fp32 rounding far below the 1e-5 tolerance even at 32K
   tokens. head_dim <= KV_MAX_HEAD_DIM (the host checks). ml (optional)
   receives (M.hi, M.lo, L) per (query, head) for the scores. */
KV_KERNEL kv_attention(KV_GLOBAL const kv_u8 *qb, kv_u64 qo, KV_GLOBAL const kv_u8 *qpb, kv_u64 qpo,
                       KV_GLOBAL const kv_u8 *pgb, kv_u64 pgo, KV_GLOBAL const kv_u8 *hpb, kv_u64 hpo,
                       KV_GLOBAL const kv_u8 *posb, kv_u64 poso, kv_u64 n_positions, KV_GLOBAL const kv_u8 *datab,
                       kv_u64 datao, kv_u64 data_bytes, KV_GLOBAL kv_u8 *ob, kv_u64 oo, KV_GLOBAL float *ml,
                       KV_GLOBAL float *part, kv_u32 n_queries, kv_u32 n_heads, kv_u32 n_kv_heads, kv_u32 head_dim,
                       kv_u32 n_pages, kv_u32 n_split, float scale)
{
    KV_LOCAL float lg_hi[KV_ATTN_TILE];
    KV_LOCAL float lg_lo[KV_ATTN_TILE];
    KV_LOCAL float pr[KV_ATTN_TILE];
    KV_LOCAL kv_u32 vis[KV_ATTN_TILE];
    float acc[KV_DIMS_PER_ITEM], tacc[KV_DIMS_PER_ITEM];
    kv_dev_col vcol[KV_DIMS_PER_ITEM];
    float hi[KV_LANES], lo[KV_LANES], kk[KV_LANES], vv[KV_DIMS_PER_ITEM];
    kv_u32 tt[KV_LANES];

    KV_GLOBAL const kv_u8 *data = datab + datao;
    int aligned = (datao % 4) == 0;
    kv_u32 lid = KV_LOCAL_ID();
    kv_u32 per = (kv_u32)kv_dev_ceil_div(head_dim, KV_ATTN_WG); /* dimensions per work-item */
    KV_GLOBAL const kv_u32 *pages = KV_CPTR(kv_u32, pgb, pgo);
    KV_GLOBAL const kv_u32 *positions = KV_CPTR(kv_u32, posb, poso);
    KV_FOR_GROUPS(wg, (kv_u64)n_queries * n_heads * n_split) {
        kv_u32 split = (kv_u32)(wg % n_split);
        kv_u64 row = wg / n_split; /* qi * n_heads + h */
        kv_u32 h = (kv_u32)(row % n_heads);
        kv_u64 qi = row / n_heads;
        kv_u32 kh = h / (n_heads / n_kv_heads);
        KV_GLOBAL const float *q = KV_CPTR(float, qb, qo) + row * head_dim;
        kv_u32 qpos = KV_CPTR(kv_u32, qpb, qpo)[qi];
        kv_u32 p0, p1;
        kv_dev_split_range(KV_CPTR(kv_u32, hpb, hpo), kh, n_pages, split, n_split, &p0, &p1);

        for (kv_u32 j = 0; j < per; j++)
            acc[j] = 0.0f;
        kv_dev_ff m = {0.0f, 0.0f};
        float l = 0.0f;
        int seen = 0;
        for (kv_u32 p = p0; p < p1; p++) {
            kv_dev_page pg = kv_dev_page_get(pages, p, head_dim, data_bytes, n_positions);
            if (!pg.ok)
                continue; /* the same for the whole work-group */
#if KV_LANES == 1 /* the GPU shape's V reader; the CPU shape reads whole chunks of a row */
            for (kv_u32 j = 0; j < per; j++) {
                kv_u32 d = KV_ITEM_DIM(lid, j, per);
                vcol[j] = kv_dev_col_get(&pg.v, d < head_dim ? d : head_dim - 1);
            }
#endif

            for (kv_u32 t0 = 0; t0 < pg.ntok; t0 += KV_ATTN_TILE) {
                /* 1. This work-item's tokens: their logits. */
                kv_u32 tb = t0 + lid * KV_LANES;
                for (kv_u32 e = 0; e < KV_LANES; e++) {
                    tt[e] = tb + e < pg.ntok ? tb + e : pg.ntok - 1;
                    hi[e] = 0.0f;
                    lo[e] = 0.0f;
                }
#if KV_LANES > 1
                /* CPU: each token's K row decoded a chunk at a time (one
                   metadata lookup per group), then its dot product. */
                for (kv_u32 e = 0; e < KV_LANES; e++) {
                    kv_dev_ff lg = kv_dev_logit(q, data, aligned, &pg.k, tt[e], head_dim, scale);
                    hi[e] = lg.hi;
                    lo[e] = lg.lo;
                }
#else
                /* GPU: one token per thread, a dimension at a time. */
                for (kv_u32 d = 0; d < head_dim; d++) {
                    kv_dev_col c = kv_dev_col_get(&pg.k, d);
                    float qd = q[d];
                    kv_dev_lanes_elem(data, aligned, &pg.k, &c, tt, d, kk);
                    for (kv_u32 e = 0; e < KV_LANES; e++) {
                        float k = kk[e];
                        float pp = qd * k;
                        float pe = KV_FMA(qd, k, -pp); /* pp + pe = the exact product */
                        kv_dev_ff sum = kv_dev_two_sum(hi[e], pp);
                        hi[e] = sum.hi;
                        lo[e] += sum.lo + pe;
                    }
                }
#endif
                for (kv_u32 e = 0; e < KV_LANES; e++) {
#if KV_LANES > 1
                    kv_dev_ff lg = {hi[e], lo[e]};
#else
                    kv_dev_ff lg = kv_dev_logit_end(hi[e], lo[e], scale);
#endif
                    lg_hi[lid * KV_LANES + e] = lg.hi;
                    lg_lo[lid * KV_LANES + e] = lg.lo;
                    vis[lid * KV_LANES + e] = tb + e < pg.ntok && positions[pg.pos_index + tt[e]] <= qpos;
                }
                KV_BARRIER();
                /* 2. The tile's max, the running max, the probabilities. */
                kv_dev_ff tm = m;
                int tseen = seen;
                for (kv_u32 w = 0; w < KV_ATTN_TILE; w++) {
                    kv_dev_ff x = {lg_hi[w], lg_lo[w]};
                    if (vis[w] && (!tseen || kv_dev_ff_gt(x, tm))) {
                        tm = x;
                        tseen = 1;
                    }
                }
                float f = seen ? KV_EXP(kv_dev_ff_sub(m, tm)) : 1.0f;
                m = tm;
                seen = tseen;
                for (kv_u32 e = 0; e < KV_LANES; e++) {
                    kv_u32 w = lid * KV_LANES + e;
                    kv_dev_ff x = {lg_hi[w], lg_lo[w]};
                    pr[w] = vis[w] ? KV_EXP(kv_dev_ff_sub(x, m)) : 0.0f;
                }
                KV_BARRIER();
                float tl = 0.0f;
                for (kv_u32 w = 0; w < KV_ATTN_TILE; w++)
                    tl += pr[w];
                l = l * f + tl;
                /* 3. The weighted V of this work-item's dimensions: the
                   tile's sum, then acc = acc f + it (short sums in fp32). */
                for (kv_u32 j = 0; j < per; j++)
                    tacc[j] = 0.0f;
                kv_u32 nt = pg.ntok - t0 < KV_ATTN_TILE ? pg.ntok - t0 : KV_ATTN_TILE;
                for (kv_u32 w = 0; w < nt; w++) {
                    if (!vis[w])
                        continue;
                    float pw = pr[w];
#if KV_LANES > 1
                    /* CPU: this work-item's contiguous dimensions, a chunk at a time. */
                    for (kv_u32 j0 = 0; j0 < per && lid * per + j0 < head_dim; j0 += KV_CHUNK) {
                        kv_u32 n = per - j0 < KV_CHUNK ? per - j0 : KV_CHUNK;
                        if (n > head_dim - (lid * per + j0))
                            n = head_dim - (lid * per + j0);
                        kv_dev_row_chunk(data, aligned, &pg.v, t0 + w, lid * per + j0, n, vv);
                        for (kv_u32 j = 0; j < n; j++)
                            tacc[j0 + j] += pw * vv[j];
                    }
#else
                    kv_dev_dims_elem(data, aligned, &pg.v, vcol, lid, per, head_dim, t0 + w, vv);
                    for (kv_u32 j = 0; j < per; j++)
                        tacc[j] += pw * vv[j];
#endif
                }
                for (kv_u32 j = 0; j < per; j++)
                    acc[j] = acc[j] * f + tacc[j];
                KV_BARRIER(); /* the tile's local memory is reused */
            }
        }

        if (n_split == 1) {
            KV_GLOBAL float *out = KV_PTR(float, ob, oo) + row * head_dim;
            for (kv_u32 j = 0; j < per; j++) {
                kv_u32 d = KV_ITEM_DIM(lid, j, per);
                if (d < head_dim)
                    out[d] = seen ? acc[j] / l : 0.0f;
            }
            if (ml && lid == 0) {
                ml[3 * row] = seen ? m.hi : 0.0f;
                ml[3 * row + 1] = seen ? m.lo : 0.0f;
                ml[3 * row + 2] = seen ? l : 0.0f;
            }
        } else {
            KV_GLOBAL float *pp = part + wg * ((kv_u64)head_dim + 3);
            for (kv_u32 j = 0; j < per; j++) {
                kv_u32 d = KV_ITEM_DIM(lid, j, per);
                if (d < head_dim)
                    pp[3 + d] = seen ? acc[j] : 0.0f;
            }
            if (lid == 0) {
                pp[0] = seen ? m.hi : 0.0f;
                pp[1] = seen ? m.lo : 0.0f;
                pp[2] = seen ? l : 0.0f; /* a chunk that saw a token has l >= 1 */
            }
        }
    }
    KV_KERNEL_END();
}

#endif /* KV_CPU_ATTENTION */

/* Merges the n_split chunks of kv_attention (flash-decoding's log-sum-exp
   merge): M = max M_s over the chunks that saw a token, L = sum l_s e^(M_s -
   M), out = sum acc_s e^(M_s - M) / L, s in order. One work-group per
   (query, head) (grid-stride), work-items over the dimensions. */
KV_KERNEL kv_attention_merge(KV_GLOBAL const float *part, KV_GLOBAL kv_u8 *ob, kv_u64 oo, KV_GLOBAL float *ml,
                             kv_u64 rows, kv_u32 head_dim, kv_u32 n_split)
{
    kv_u32 lid = KV_LOCAL_ID();
    KV_FOR_GROUPS(row, rows) {
        KV_GLOBAL const float *pr = part + row * n_split * ((kv_u64)head_dim + 3);
        kv_dev_ff gm = {0.0f, 0.0f};
        int any = 0;
        for (kv_u32 s = 0; s < n_split; s++) {
            KV_GLOBAL const float *ps = pr + (kv_u64)s * (head_dim + 3);
            kv_dev_ff ms = {ps[0], ps[1]};
            if (ps[2] > 0.0f && (!any || kv_dev_ff_gt(ms, gm))) {
                gm = ms;
                any = 1;
            }
        }
        float gl = 0.0f;
        for (kv_u32 s = 0; s < n_split; s++) {
            KV_GLOBAL const float *ps = pr + (kv_u64)s * (head_dim + 3);
            kv_dev_ff ms = {ps[0], ps[1]};
            if (ps[2] > 0.0f)
                gl += ps[2] * KV_EXP(kv_dev_ff_sub(ms, gm));
        }
        KV_GLOBAL float *out = KV_PTR(float, ob, oo) + row * head_dim;
        for (kv_u32 d = lid; d < head_dim; d += KV_WG) {
            float sum = 0.0f;
            for (kv_u32 s = 0; s < n_split; s++) {
                KV_GLOBAL const float *ps = pr + (kv_u64)s * (head_dim + 3);
                kv_dev_ff ms = {ps[0], ps[1]};
                if (ps[2] > 0.0f)
                    sum += ps[3 + d] * KV_EXP(kv_dev_ff_sub(ms, gm));
            }
            out[d] = any ? sum / gl : 0.0f;
        }
        if (ml && lid == 0) {
            ml[3 * row] = any ? gm.hi : 0.0f;
            ml[3 * row + 1] = any ? gm.lo : 0.0f;
            ml[3 * row + 2] = any ? gl : 0.0f;
        }
    }
    KV_KERNEL_END();
}

/* Scores: one work-group of KV_WG per KV head (grid-stride); work-item w takes
   the head's pages w, w + KV_WG, ... (every work-item walks the page list to
   know where each page's tokens start). For each token: per query head of the
   GQA group, the probability summed over the queries that see it; then the
   maximum over the group's heads. CPU devices with doubles take kv_cpu_scores_page
   (kernels_cpu_attention.cl) for a page whose slots fit in KV_CPU_HEADS. */
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
#if defined(KV_CPU_ATTENTION)
                kv_cpu_rd krd = kv_cpu_rd_get(aligned, &pg.k);
                float16 row[KV_CPU_CHUNKS], qc[KV_CPU_CHUNKS];
                float ks[KV_CPU_META], kz[KV_CPU_META];
#if KV_FP64
                if (pg.ok && group * n_queries <= KV_CPU_HEADS) {
                    kv_cpu_scores_page(qall, qpos, positions, data, aligned, &pg, &krd, ml, scores + base,
                                       base < score_stride ? score_stride - base : 0, kh, group, n_queries, n_heads,
                                       head_dim, scale, ks, kz);
                    base += ntok;
                    continue;
                }
#endif
#endif
                for (kv_u32 t = 0; t < ntok && base + t < score_stride; t++) {
                    float best = 0.0f;
                    if (pg.ok) {
                        kv_u32 pos = positions[pg.pos_index + t];
#if defined(KV_CPU_ATTENTION)
                        /* CPU: the K row decoded once for every (head, query) */
                        kv_u32 nch = (head_dim + 15) / 16;
                        kv_cpu_meta(data, &pg.k, &krd, t, 1, ks, kz);
                        kv_cpu_row(data, aligned, &pg.k, &krd, t, nch, ks, kz, row);
#endif
                        for (kv_u32 hh = 0; hh < group; hh++) {
                            kv_u32 h = kh * group + hh;
                            float sum = 0.0f;
                            for (kv_u32 qi = 0; qi < n_queries; qi++) {
                                kv_u64 at = 3 * ((kv_u64)qi * n_heads + h);
                                float lsum = ml[at + 2];
                                if (pos > qpos[qi] || lsum == 0.0f)
                                    continue;
                                KV_GLOBAL const float *q = qall + ((kv_u64)qi * n_heads + h) * head_dim;
#if defined(KV_CPU_ATTENTION)
                                kv_cpu_q16(q, head_dim, qc);
                                float16 dh, dl;
                                kv_cpu_dot16(qc, row, nch, &dh, &dl);
                                kv_dev_ff lg = kv_cpu_ff16_end(dh, dl, scale);
#else
                                kv_dev_ff lg = kv_dev_logit(q, data, aligned, &pg.k, t, head_dim, scale);
#endif
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
