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

/* A float's order-preserving integer key (an involution: it is its own inverse). */
KV_FN_INLINE int16 kv_cpu_key16(int16 k)
{
    return k ^ ((k >> 31) & (int16)0x7fffffff);
}

KV_FN_INLINE int kv_cpu_min16(int16 v)
{
    int8 a = min(v.lo, v.hi);
    int4 b = min(a.lo, a.hi);
    int2 c = min(b.lo, b.hi);
    return min(c.x, c.y);
}

KV_FN_INLINE int kv_cpu_max16(int16 v)
{
    int8 a = max(v.lo, v.hi);
    int4 b = max(a.lo, a.hi);
    int2 c = max(b.lo, b.hi);
    return max(c.x, c.y);
}

/* Values c0 .. c0 + 15 of the group at x (n values); lanes at or past n repeat
   value n - 1 (valid is then -1 only for the lanes below n). */
KV_FN_INLINE float16 kv_cpu_load16(KV_GLOBAL const float *x, kv_u32 c0, kv_u32 n, int16 *valid)
{
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    *valid = lane < (int16)(int)(n - c0);
    if (n - c0 >= 16)
        return vload16(0, x + c0);
    float tmp[16];
    for (kv_u32 j = 0; j < 16; j++)
        tmp[j] = x[c0 + (j < n - c0 ? j : n - c0 - 1)];
    return vload16(0, tmp);
}

/* 16 codes of w bits (1 <= w <= 16, masked to w) as the 2w bytes of their
   little-endian bit stream, into out[0 .. 2w). */
KV_FN_INLINE void kv_cpu_pack16(uint16 c, kv_u32 w, kv_u8 *out)
{
    if (w == 8) {
        vstore16(convert_uchar16(c), 0, out);
    } else if (w == 4) {
        vstore8(convert_uchar8(c.even | (c.odd << 4)), 0, out);
    } else if (w == 2) {
        vstore4(convert_uchar4(c.even.even | (c.odd.even << 2) | (c.even.odd << 4) | (c.odd.odd << 6)), 0, out);
    } else if (w == 1) {
        uint8 p = c.even | (c.odd << 1);   /* bits of codes 2k, 2k + 1 */
        uint4 p2 = p.even | (p.odd << 2);  /* 4 codes */
        uint2 p4 = p2.even | (p2.odd << 4); /* 8 codes: one byte each */
        out[0] = (kv_u8)p4.x;
        out[1] = (kv_u8)p4.y;
    } else if (w == 16) { /* little-endian u16 each: low byte first */
        ushort16 h = convert_ushort16(c);
        uchar16 lo = convert_uchar16(h & (ushort)0xff), hi = convert_uchar16(h >> (ushort)8);
        uchar16 a = (uchar16)(lo.s0, hi.s0, lo.s1, hi.s1, lo.s2, hi.s2, lo.s3, hi.s3, lo.s4, hi.s4, lo.s5, hi.s5,
                              lo.s6, hi.s6, lo.s7, hi.s7);
        uchar16 b = (uchar16)(lo.s8, hi.s8, lo.s9, hi.s9, lo.sa, hi.sa, lo.sb, hi.sb, lo.sc, hi.sc, lo.sd, hi.sd,
                              lo.se, hi.se, lo.sf, hi.sf);
        vstore16(a, 0, out);
        vstore16(b, 0, out + 16);
    } else {
        /* Eight codes make exactly w bytes: two 64-bit words per half. */
        kv_u32 cc[16];
        vstore16(c, 0, cc);
        for (kv_u32 h = 0; h < 2; h++) {
            ulong lo = 0, hi = 0;
            for (kv_u32 j = 0; j < 8; j++) {
                kv_u32 pos = j * w;
                ulong v = (ulong)cc[8 * h + j];
                lo |= pos < 64 ? v << pos : 0ul;
                hi |= pos >= 64 ? v << (pos - 64) : (pos + w > 64 ? v >> (64 - pos) : 0ul);
            }
            for (kv_u32 k = 0; k < w; k++)
                out[h * w + k] = (kv_u8)((k < 8 ? lo >> (8 * k) : hi >> (8 * (k - 8))) & 0xffu);
        }
    }
}

/* Stores the first nb bytes of the 2w at p (nb == 2w but in a group's last, short chunk). */
KV_FN_INLINE void kv_cpu_store(KV_GLOBAL kv_u8 *out, const kv_u8 *p, kv_u32 nb)
{
    if (nb == 16) {
        vstore16(vload16(0, p), 0, out);
    } else if (nb == 8) {
        vstore8(vload8(0, p), 0, out);
    } else if (nb == 32) {
        vstore16(vload16(0, p), 0, out);
        vstore16(vload16(0, p + 16), 0, out + 16);
    } else {
        for (kv_u32 k = 0; k < nb; k++)
            out[k] = p[k];
    }
}

/* 16 codes of w bits (masked to w) stored as the nb bytes of their stream at
   out (nb == 2w but in a group's last, short chunk). For w = 1, 2, 4, 8, 16
   and a whole chunk, straight from vector registers: kv_cpu_pack16 into a
   private buffer and back cost a store-forwarding stall per chunk (perf:
   the narrow reloads of the buffer were the hottest instructions of pack). */
KV_FN_INLINE void kv_cpu_put16(KV_GLOBAL kv_u8 *out, uint16 c, kv_u32 w, kv_u32 nb)
{
    if (nb == 2 * w && w == 8) {
        vstore16(convert_uchar16(c), 0, out);
    } else if (nb == 2 * w && w == 4) {
        vstore8(convert_uchar8(c.even | (c.odd << 4)), 0, out);
    } else if (nb == 2 * w && w == 2) {
        vstore4(convert_uchar4(c.even.even | (c.odd.even << 2) | (c.even.odd << 4) | (c.odd.odd << 6)), 0, out);
    } else if (nb == 2 * w && w == 1) {
        uint8 p = c.even | (c.odd << 1);
        uint4 p2 = p.even | (p.odd << 2);
        vstore2(convert_uchar2(p2.even | (p2.odd << 4)), 0, out);
    } else {
        kv_u8 buf[32];
        kv_cpu_pack16(c, w, buf);
        kv_cpu_store(out, buf, nb);
    }
}

/* Token group g of layout l: its row, its index in the row and its length. */
typedef struct kv_cpu_tg {
    kv_u64 row;
    kv_u32 gc, n;
} kv_cpu_tg;

/* The layout arithmetic of kv_dev_group_elem / _len with one division (they
   take four 64-bit ones between them, which cost as much as a group's codes). */
KV_FN_INLINE kv_cpu_tg kv_cpu_tgroup(kv_dev_layout l, kv_u64 g)
{
    kv_cpu_tg t;
    kv_u32 per_row = (kv_u32)kv_dev_ceil_div(l.cols, l.group_size);
    t.row = g <= 0xffffffffu ? (kv_u64)((kv_u32)g / per_row) : g / per_row; /* 32-bit division: faster */
    t.gc = (kv_u32)(g - t.row * per_row);
    t.n = l.cols - t.gc * l.group_size < l.group_size ? l.cols - t.gc * l.group_size : l.group_size;
    return t;
}

/* kv_dev_group_offset of token group t in a plane of w-bit codes (w 0: 0). */
KV_FN_INLINE kv_u64 kv_cpu_tg_offset(kv_dev_layout l, kv_cpu_tg t, kv_u32 w)
{
    kv_u32 last = l.cols % l.group_size;
    kv_u64 full = kv_dev_stream_bytes(l.group_size, w);
    kv_u64 row_bytes = (l.cols / l.group_size) * full + (last ? kv_dev_stream_bytes(last, w) : 0);
    return t.row * row_bytes + t.gc * full;
}

/* Element offset of token group t's first value. */
KV_FN_INLINE kv_u64 kv_cpu_tg_elem(kv_dev_layout l, kv_cpu_tg t)
{
    return t.row * l.cols + (kv_u64)t.gc * l.group_size;
}

/* The nb bytes at p (nb <= 2w; nb < 2w only in a group's last, short chunk)
   as two uchar16 (lo: bytes 0-15, hi: 16-31; 0 past nb). */
KV_FN_INLINE void kv_cpu_load_bytes(KV_GLOBAL const kv_u8 *p, kv_u32 w, kv_u32 nb, uchar16 *lo, uchar16 *hi)
{
    *lo = (uchar16)0;
    *hi = (uchar16)0;
    if (nb == 2 * w && w == 8) {
        *lo = vload16(0, p);
    } else if (nb == 2 * w && w == 4) {
        (*lo).lo = vload8(0, p);
    } else if (nb == 2 * w && w == 2) {
        (*lo).lo.lo = vload4(0, p);
    } else if (nb == 2 * w && w == 16) {
        *lo = vload16(0, p);
        *hi = vload16(0, p + 16);
    } else {
        kv_u8 tmp[32];
        for (kv_u32 k = 0; k < 32; k++)
            tmp[k] = k < nb ? p[k] : 0;
        *lo = vload16(0, tmp);
        *hi = vload16(0, tmp + 16);
    }
}

/* The 16 codes of w bits (1 <= w <= 16) in the 2w bytes (lo, hi) of their
   little-endian bit stream: kv_cpu_pack16's inverse. */
KV_FN_INLINE uint16 kv_cpu_unpack16(uchar16 lo, uchar16 hi, kv_u32 w)
{
    uint16 c;
    if (w == 8) {
        c = convert_uint16(lo);
    } else if (w == 4) {
        uint8 b = convert_uint8(lo.lo);
        c.even = b & 0xfu;
        c.odd = b >> 4;
    } else if (w == 2) {
        uint4 b = convert_uint4(lo.lo.lo);
        c.even.even = b & 3u;
        c.odd.even = (b >> 2) & 3u;
        c.even.odd = (b >> 4) & 3u;
        c.odd.odd = b >> 6;
    } else if (w == 1) {
        uint x = (uint)lo.s0 | ((uint)lo.s1 << 8);
        c = ((uint16)x >> (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)) & 1u;
    } else if (w == 16) { /* little-endian u16 each */
        c.lo = convert_uint8(lo.even) | (convert_uint8(lo.odd) << 8);
        c.hi = convert_uint8(hi.even) | (convert_uint8(hi.odd) << 8);
    } else {
        /* Code j starts at bit j*w: three bytes hold it (bit 7 + 16 < 24). */
        kv_u8 b[34];
        vstore16(lo, 0, b);
        vstore16(hi, 0, b + 16);
        b[32] = b[33] = 0;
        kv_u32 cc[16];
        for (kv_u32 j = 0; j < 16; j++) {
            kv_u32 pos = j * w, k = pos >> 3;
            kv_u32 v = (kv_u32)b[k] | ((kv_u32)b[k + 1] << 8) | ((kv_u32)b[k + 2] << 16);
            cc[j] = (v >> (pos & 7u)) & kv_dev_code_max(w);
        }
        c = vload16(0, cc);
    }
    return c;
}

/* Codes c0 .. c0 + 15 (c0 < n) of the w-bit stream at p of a group of n codes. */
KV_FN_INLINE uint16 kv_cpu_stream16(KV_GLOBAL const kv_u8 *p, kv_u32 w, kv_u32 c0, kv_u32 n)
{
    uchar16 lo, hi;
    kv_u32 m = n - c0 < 16 ? n - c0 : 16;
    kv_cpu_load_bytes(p + 2 * (c0 / 16) * w, w, (kv_u32)kv_dev_stream_bytes(m, w), &lo, &hi);
    return kv_cpu_unpack16(lo, hi, w);
}

/* Stores the first m (<= 16) lanes of v at o. */
KV_FN_INLINE void kv_cpu_store_f16x(KV_GLOBAL float *o, float16 v, kv_u32 m)
{
    if (m == 16) {
        vstore16(v, 0, o);
        return;
    }
    float tmp[16];
    vstore16(v, 0, tmp);
    for (kv_u32 j = 0; j < m; j++)
        o[j] = tmp[j];
}

KV_FN_INLINE void kv_cpu_store_u16x(KV_GLOBAL kv_u16 *o, uint16 v, kv_u32 m)
{
    ushort16 h = convert_ushort16(v);
    if (m == 16) {
        vstore16(h, 0, o);
        return;
    }
    kv_u16 tmp[16];
    vstore16(h, 0, tmp);
    for (kv_u32 j = 0; j < m; j++)
        o[j] = tmp[j];
}

/* Codes c0 .. c0 + 15 of the group at codes (n of them; 0 past n). */
KV_FN_INLINE uint16 kv_cpu_codes_load16(KV_GLOBAL const kv_u16 *codes, kv_u32 c0, kv_u32 n)
{
    if (n - c0 >= 16)
        return convert_uint16(vload16(0, codes + c0));
    kv_u16 tmp[16];
    for (kv_u32 j = 0; j < 16; j++)
        tmp[j] = j < n - c0 ? codes[c0 + j] : 0;
    return convert_uint16(vload16(0, tmp));
}

/* kv_dev_dequant (r 0, anchor 0) or kv_dev_dequant_anchor (anchor 1) of 16
   codes: the same fma, lane by lane. */
KV_FN_INLINE float16 kv_cpu_dequant16(uint16 q, int anchor, kv_u32 r, float s, float z)
{
    float16 v = convert_float16(q << r);
    if (anchor)
        v = v + (float16)((float)((1u << r) - 1u) / 2.0f); /* exact, as there */
    return fma(v, (float16)s, (float16)z);
}

/* Group g of a TOKEN-grouped decode (the arguments of kv_decode). */
KV_FN void kv_cpu_decode_group(KV_GLOBAL const kv_u8 *apl, KV_GLOBAL const kv_u8 *rpl, KV_GLOBAL const kv_u16 *scale,
                               KV_GLOBAL const kv_u16 *zero, KV_GLOBAL float *out, kv_dev_layout l, kv_u64 g,
                               kv_u32 bits, kv_u32 anchor_bits, kv_u32 has_residual)
{
    kv_cpu_tg t = kv_cpu_tgroup(l, g);
    float s = kv_dev_f16_to_f32(scale[g]), z = kv_dev_f16_to_f32(zero[g]);
    kv_u32 abits = anchor_bits ? anchor_bits : bits;
    kv_u32 r = anchor_bits ? bits - anchor_bits : 0;
    KV_GLOBAL const kv_u8 *ap = apl + kv_cpu_tg_offset(l, t, abits);
    KV_GLOBAL float *o = out + kv_cpu_tg_elem(l, t);
    if (anchor_bits && has_residual) {
        KV_GLOBAL const kv_u8 *rp = rpl + kv_cpu_tg_offset(l, t, r);
        for (kv_u32 c0 = 0; c0 < t.n; c0 += 16) {
            uint16 q = (kv_cpu_stream16(ap, abits, c0, t.n) << r) | kv_cpu_stream16(rp, r, c0, t.n);
            kv_cpu_store_f16x(o + c0, kv_cpu_dequant16(q, 0, 0, s, z), t.n - c0 < 16 ? t.n - c0 : 16);
        }
        return;
    }
    for (kv_u32 c0 = 0; c0 < t.n; c0 += 16) {
        uint16 q = kv_cpu_stream16(ap, abits, c0, t.n);
        kv_cpu_store_f16x(o + c0, kv_cpu_dequant16(q, anchor_bits != 0, r, s, z), t.n - c0 < 16 ? t.n - c0 : 16);
    }
}

/* Group g of a TOKEN-grouped dequantize (the arguments of kv_dequantize). */
KV_FN void kv_cpu_dequantize_group(KV_GLOBAL const kv_u16 *codes, KV_GLOBAL const kv_u16 *scale,
                                   KV_GLOBAL const kv_u16 *zero, KV_GLOBAL float *out, kv_dev_layout l, kv_u64 g,
                                   kv_u32 bits, kv_u32 anchor_bits)
{
    kv_cpu_tg t = kv_cpu_tgroup(l, g);
    float s = kv_dev_f16_to_f32(scale[g]), z = kv_dev_f16_to_f32(zero[g]);
    kv_u32 r = anchor_bits ? bits - anchor_bits : 0;
    uint16 mask = (uint16)kv_dev_code_max(anchor_bits ? anchor_bits : bits);
    kv_u64 e0 = kv_cpu_tg_elem(l, t);
    for (kv_u32 c0 = 0; c0 < t.n; c0 += 16) {
        uint16 q = kv_cpu_codes_load16(codes + e0, c0, t.n) & mask;
        kv_cpu_store_f16x(out + e0 + c0, kv_cpu_dequant16(q, anchor_bits != 0, r, s, z), t.n - c0 < 16 ? t.n - c0 : 16);
    }
}

/* Group g of a TOKEN-grouped pack of w-bit codes (kv_pack). */
KV_FN void kv_cpu_pack_group(KV_GLOBAL const kv_u16 *codes, KV_GLOBAL kv_u8 *pl, kv_dev_layout l, kv_u64 g, kv_u32 w)
{
    kv_cpu_tg t = kv_cpu_tgroup(l, g);
    KV_GLOBAL const kv_u16 *c = codes + kv_cpu_tg_elem(l, t);
    KV_GLOBAL kv_u8 *p = pl + kv_cpu_tg_offset(l, t, w);
    uint16 mask = (uint16)kv_dev_code_max(w);
    for (kv_u32 c0 = 0; c0 < t.n; c0 += 16) {
        kv_u32 m = t.n - c0 < 16 ? t.n - c0 : 16;
        kv_cpu_put16(p + 2 * (c0 / 16) * w, kv_cpu_codes_load16(c, c0, t.n) & mask, w,
                     (kv_u32)kv_dev_stream_bytes(m, w));
    }
}

/* Group g of a TOKEN-grouped unpack of w-bit codes (kv_unpack). */
KV_FN void kv_cpu_unpack_group(KV_GLOBAL const kv_u8 *pl, KV_GLOBAL kv_u16 *codes, kv_dev_layout l, kv_u64 g, kv_u32 w)
{
    kv_cpu_tg t = kv_cpu_tgroup(l, g);
    KV_GLOBAL const kv_u8 *p = pl + kv_cpu_tg_offset(l, t, w);
    KV_GLOBAL kv_u16 *c = codes + kv_cpu_tg_elem(l, t);
    for (kv_u32 c0 = 0; c0 < t.n; c0 += 16)
        kv_cpu_store_u16x(c + c0, kv_cpu_stream16(p, w, c0, t.n), t.n - c0 < 16 ? t.n - c0 : 16);
}

#if KV_DIV_MODE == 0
#define KV_CPU_ENCODE 1
/* Token groups per work-item of encode and quantize: their metadata is
   worked out 16 at a time (kv_cpu_meta16). opencl.c passes its own count. */
#ifndef KV_CPU_GROUPS
#define KV_CPU_GROUPS 16
#endif
#if KV_CPU_GROUPS != 16
#error "KV_CPU_GROUPS must be 16 (kv_cpu_groups_meta)"
#endif

/* kv_dev_quant_code on 16 values (s, z, bits as there). */
KV_FN_INLINE uint16 kv_cpu_codes16(float16 x, float s, float z, kv_u32 bits)
{
    float maxq = (float)kv_dev_code_max(bits);
    float16 v = (x - (float16)z) / (float16)s;
    v = select(v, (float16)0.0f, v < (float16)0.0f);
    v = select(v, (float16)maxq, v > (float16)maxq);
    uint16 q = convert_uint16(rint(v));
    q = s == 0.0f ? (uint16)0u : q;
    q = select(q, select((uint16)0u, (uint16)kv_dev_code_max(bits), x > (float16)0.0f), isinf(x));
    return select(q, (uint16)0u, isnan(x));
}

/* The min and max keys of the finite values among the n at x (none:
   *kn = INT_MAX > *kx = INT_MIN). */
KV_FN_INLINE void kv_cpu_group_keys(KV_GLOBAL const float *x, kv_u32 n, int *kn, int *kx)
{
    int16 kmin = (int16)0x7fffffff, kmax = (int16)(-0x7fffffff - 1);
    for (kv_u32 c0 = 0; c0 < n; c0 += 16) {
        int16 valid;
        int16 u = as_int16(kv_cpu_load16(x, c0, n, &valid));
        int16 fin = (u & 0x7f800000) != (int16)0x7f800000; /* finite: -1 */
        int16 key = kv_cpu_key16(u);
        kmin = min(kmin, select((int16)0x7fffffff, key, fin));
        kmax = max(kmax, select((int16)(-0x7fffffff - 1), key, fin));
    }
    *kn = kv_cpu_min16(kmin);
    *kx = kv_cpu_max16(kmax);
}

/* kv_dev_f16_from_f32_sat on 16 values: every case of kv_dev_f16_from_f32
   computed, one selected (the subnormal shift clamped where unused). */
KV_FN_INLINE uint16 kv_cpu_f16_sat16(float16 f)
{
    uint16 x = as_uint16(f);
    uint16 sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    uint16 qnan = sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    uint16 e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint16 shift = clamp((uint16)126u - min(e, (uint16)126u), (uint16)1u, (uint16)31u);
    uint16 q = m >> shift, rem = m & (((uint16)1u << shift) - 1u), hw = (uint16)1u << (shift - 1u);
    q += select((uint16)0u, (uint16)1u, rem > hw || (rem == hw && (q & 1u) != 0u));
    uint16 r = ax - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    uint16 h = sign | (r >> 13);
    h = select(h, sign | q, ax < 0x38800000u);
    h = select(h, sign, ax < 0x33000000u);
    h = select(h, sign | 0x7c00u, ax >= 0x477ff000u);
    h = select(h, qnan, ax > 0x7f800000u);
    return select(h, (h & 0x8000u) | 0x7bffu, (h & 0x7fffu) == 0x7c00u); /* N2: saturate */
}

/* kv_dev_f16_to_f32 on 16 values (the same branch-free cases). */
KV_FN_INLINE float16 kv_cpu_f16_to_f32_16(uint16 h)
{
    uint16 sign = (h & 0x8000u) << 16;
    uint16 ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint16 sub = as_uint16(convert_float16(man) * 5.9604644775390625e-8f) | sign; /* 2^-24; exact */
    uint16 special = sign | 0x7f800000u | (man << 13);
    uint16 normal = sign | ((ex + 112u) << 23) | (man << 13);
    return as_float16(select(select(normal, special, ex == 31u), sub, ex == 0u));
}

/* kv_dev_quant_meta of 16 groups from their min and max keys (kx < kn: no
   finite value); scale_h in the low 16 bits, zero_h in the high 16. */
KV_FN_INLINE uint16 kv_cpu_meta16(int16 kn, int16 kx, kv_u32 bits)
{
    float16 mn = as_float16(kv_cpu_key16(kn)) + 0.0f, mx = as_float16(kv_cpu_key16(kx)) + 0.0f; /* N3: -0 -> +0 */
    uint16 sh = kv_cpu_f16_sat16((mx - mn) / (float16)(float)kv_dev_code_max(bits));
    uint16 zh = kv_cpu_f16_sat16(mn);
    return select((uint16)0u, sh | (zh << 16), kx >= kn);
}

/* The metadata of token groups g0 .. g0 + ng - 1 (ng <= 16): stored, and
   their scale and zero as floats in s[], z[]. */
KV_FN_INLINE void kv_cpu_groups_meta(KV_GLOBAL const float *xall, KV_GLOBAL kv_u16 *scale, KV_GLOBAL kv_u16 *zero,
                                     kv_dev_layout l, kv_u64 g0, kv_u32 ng, kv_u32 bits, float *s, float *z)
{
    int kn[16], kx[16];
    for (kv_u32 j = 0; j < 16; j++) {
        kn[j] = 0x7fffffff;
        kx[j] = -0x7fffffff - 1;
    }
    for (kv_u32 j = 0; j < ng; j++) {
        kv_cpu_tg t = kv_cpu_tgroup(l, g0 + j);
        kv_cpu_group_keys(xall + kv_cpu_tg_elem(l, t), t.n, &kn[j], &kx[j]);
    }
    uint16 meta = kv_cpu_meta16(vload16(0, kn), vload16(0, kx), bits);
    kv_u32 mv[16];
    vstore16(meta, 0, mv);
    for (kv_u32 j = 0; j < ng; j++) {
        scale[g0 + j] = (kv_u16)(mv[j] & 0xffffu);
        zero[g0 + j] = (kv_u16)(mv[j] >> 16);
    }
    vstore16(kv_cpu_f16_to_f32_16(meta & 0xffffu), 0, s);
    vstore16(kv_cpu_f16_to_f32_16(meta >> 16), 0, z);
}

/* Token groups KV_CPU_GROUPS * item on (KV_CPU_GROUPS of them, fewer at the
   end) of an encode (the arguments of kv_encode): their metadata 16 at a
   time, then each group's codes and streams. */
KV_FN void kv_cpu_encode_groups(KV_GLOBAL const float *xall, KV_GLOBAL kv_u8 *apl, KV_GLOBAL kv_u8 *rpl,
                                KV_GLOBAL kv_u16 *scale, KV_GLOBAL kv_u16 *zero, kv_dev_layout l, kv_u64 item,
                                kv_u32 bits, kv_u32 anchor_bits)
{
    kv_u64 g0 = item * KV_CPU_GROUPS, groups = kv_dev_groups(l);
    kv_u32 ng = groups - g0 < KV_CPU_GROUPS ? (kv_u32)(groups - g0) : KV_CPU_GROUPS;
    float sv[16], zv[16];
    kv_cpu_groups_meta(xall, scale, zero, l, g0, ng, bits, sv, zv);
    kv_u32 abits = anchor_bits ? anchor_bits : bits;
    kv_u32 r = anchor_bits ? bits - anchor_bits : 0;
    for (kv_u32 j = 0; j < ng; j++) {
        kv_cpu_tg t = kv_cpu_tgroup(l, g0 + j);
        kv_u32 n = t.n;
        KV_GLOBAL const float *x = xall + kv_cpu_tg_elem(l, t);
        KV_GLOBAL kv_u8 *ap = apl + kv_cpu_tg_offset(l, t, abits);
        KV_GLOBAL kv_u8 *rp = anchor_bits ? rpl + kv_cpu_tg_offset(l, t, r) : ap;
        float s = sv[j], z = zv[j];
        for (kv_u32 c0 = 0; c0 < n; c0 += 16) {
            int16 valid;
            float16 v = kv_cpu_load16(x, c0, n, &valid);
            uint16 q = select((uint16)0u, kv_cpu_codes16(v, s, z, bits), valid);
            kv_u32 m = n - c0 < 16 ? n - c0 : 16;
            kv_cpu_put16(ap + 2 * (c0 / 16) * abits, q >> r, abits, (kv_u32)kv_dev_stream_bytes(m, abits));
            if (anchor_bits)
                kv_cpu_put16(rp + 2 * (c0 / 16) * r, q & (uint16)kv_dev_code_max(r), r,
                             (kv_u32)kv_dev_stream_bytes(m, r));
        }
    }
}

/* Token groups KV_CPU_GROUPS * item on of a quantize (the arguments of kv_quantize). */
KV_FN void kv_cpu_quantize_groups(KV_GLOBAL const float *xall, KV_GLOBAL kv_u16 *codes, KV_GLOBAL kv_u16 *scale,
                                  KV_GLOBAL kv_u16 *zero, kv_dev_layout l, kv_u64 item, kv_u32 bits)
{
    kv_u64 g0 = item * KV_CPU_GROUPS, groups = kv_dev_groups(l);
    kv_u32 ng = groups - g0 < KV_CPU_GROUPS ? (kv_u32)(groups - g0) : KV_CPU_GROUPS;
    float sv[16], zv[16];
    kv_cpu_groups_meta(xall, scale, zero, l, g0, ng, bits, sv, zv);
    for (kv_u32 j = 0; j < ng; j++) {
        kv_cpu_tg t = kv_cpu_tgroup(l, g0 + j);
        kv_u64 e0 = kv_cpu_tg_elem(l, t);
        for (kv_u32 c0 = 0; c0 < t.n; c0 += 16) {
            int16 valid;
            float16 v = kv_cpu_load16(xall + e0, c0, t.n, &valid);
            kv_cpu_store_u16x(codes + e0 + c0, kv_cpu_codes16(v, sv[j], zv[j], bits), t.n - c0 < 16 ? t.n - c0 : 16);
        }
    }
}

/* ---- KIVI's CHANNEL groups: encode 16 columns at a time ---- */

/* A bit stream per lane (one group's, 16 groups side by side): the low
   `have` bits of acc are pending; pos bytes of each stream are written. */
typedef struct kv_cpu_bits16 {
    ulong16 acc;
    kv_u32 have, pos;
} kv_cpu_bits16;

/* Writes the low nb (<= 4) bytes of each valid lane's pending bits to its
   stream: lane j's at base + j * sb + pos. */
KV_FN_INLINE void kv_cpu_bits16_out(KV_GLOBAL kv_u8 *base, kv_u64 sb, kv_u32 m, kv_cpu_bits16 *b, kv_u32 nb)
{
    kv_u32 w32[16];
    vstore16(convert_uint16(b->acc & (ulong16)0xfffffffful), 0, w32);
    for (kv_u32 j = 0; j < m; j++) {
        KV_GLOBAL kv_u8 *o = base + j * sb + b->pos;
        if (nb == 4) {
            vstore4(as_uchar4(w32[j]), 0, o);
        } else {
            for (kv_u32 k = 0; k < nb; k++)
                o[k] = (kv_u8)(w32[j] >> (8 * k));
        }
    }
}

/* Appends a w-bit code per lane (w <= 16); 32 pending bits go out. */
KV_FN_INLINE void kv_cpu_bits16_put(KV_GLOBAL kv_u8 *base, kv_u64 sb, kv_u32 m, kv_cpu_bits16 *b, uint16 q, kv_u32 w)
{
    b->acc |= convert_ulong16(q) << (ulong16)b->have;
    b->have += w;
    if (b->have >= 32) {
        kv_cpu_bits16_out(base, sb, m, b, 4);
        b->acc >>= (ulong16)32;
        b->have -= 32;
        b->pos += 4;
    }
}

/* The last, partial bytes of every lane's stream. */
KV_FN_INLINE void kv_cpu_bits16_flush(KV_GLOBAL kv_u8 *base, kv_u64 sb, kv_u32 m, kv_cpu_bits16 *b)
{
    if (b->have)
        kv_cpu_bits16_out(base, sb, m, b, (b->have + 7) / 8);
}

/* kv_cpu_codes16 with a scale and zero per lane. */
KV_FN_INLINE uint16 kv_cpu_codes16v(float16 x, float16 s, float16 z, kv_u32 bits)
{
    float maxq = (float)kv_dev_code_max(bits);
    float16 v = (x - z) / s;
    v = select(v, (float16)0.0f, v < (float16)0.0f);
    v = select(v, (float16)maxq, v > (float16)maxq);
    uint16 q = convert_uint16(rint(v));
    q = select(q, (uint16)0u, s == (float16)0.0f);
    q = select(q, select((uint16)0u, (uint16)kv_dev_code_max(bits), x > (float16)0.0f), isinf(x));
    return select(q, (uint16)0u, isnan(x));
}

/* Columns c0 .. c0 + 15 of row `row` (columns at or past cols repeat column cols - 1). */
KV_FN_INLINE float16 kv_cpu_row_load16(KV_GLOBAL const float *x, kv_dev_layout l, kv_u64 row, kv_u32 c0)
{
    KV_GLOBAL const float *p = x + row * l.cols + c0;
    if (l.cols - c0 >= 16)
        return vload16(0, p);
    float tmp[16];
    for (kv_u32 j = 0; j < 16; j++)
        tmp[j] = p[j < l.cols - c0 ? j : l.cols - c0 - 1];
    return vload16(0, tmp);
}

/* Work-item `item` of a CHANNEL-grouped encode: block item / ceil(cols / 16)
   of group_size rows, columns 16 * (item % ceil(cols / 16)) on, one group
   per column (the arguments of kv_encode). The same values, metadata and
   stream bits as kv_encode's scalar loop, group by group. */
KV_FN void kv_cpu_encode_channels(KV_GLOBAL const float *x, KV_GLOBAL kv_u8 *apl, KV_GLOBAL kv_u8 *rpl,
                                  KV_GLOBAL kv_u16 *scale, KV_GLOBAL kv_u16 *zero, kv_dev_layout l, kv_u64 item,
                                  kv_u32 bits, kv_u32 anchor_bits)
{
    kv_u32 chunks = (l.cols + 15) / 16;
    kv_u64 block = item / chunks;
    kv_u32 c0 = (kv_u32)(item - block * chunks) * 16;
    kv_u32 m = l.cols - c0 < 16 ? l.cols - c0 : 16;
    kv_u64 r0 = block * l.group_size;
    kv_u32 n = l.rows - r0 < l.group_size ? (kv_u32)(l.rows - r0) : l.group_size;
    int16 kmin = (int16)0x7fffffff, kmax = (int16)(-0x7fffffff - 1);
    for (kv_u32 i = 0; i < n; i++) {
        int16 u = as_int16(kv_cpu_row_load16(x, l, r0 + i, c0));
        int16 fin = (u & 0x7f800000) != (int16)0x7f800000; /* finite: -1 */
        int16 key = kv_cpu_key16(u);
        kmin = min(kmin, select((int16)0x7fffffff, key, fin));
        kmax = max(kmax, select((int16)(-0x7fffffff - 1), key, fin));
    }
    uint16 meta = kv_cpu_meta16(kmin, kmax, bits);
    kv_u32 mv[16];
    vstore16(meta, 0, mv);
    kv_u64 g0 = block * l.cols + c0;
    for (kv_u32 j = 0; j < m; j++) {
        scale[g0 + j] = (kv_u16)(mv[j] & 0xffffu);
        zero[g0 + j] = (kv_u16)(mv[j] >> 16);
    }
    float16 s = kv_cpu_f16_to_f32_16(meta & 0xffffu), z = kv_cpu_f16_to_f32_16(meta >> 16);

    kv_u32 abits = anchor_bits ? anchor_bits : bits;
    kv_u32 r = anchor_bits ? bits - anchor_bits : 0;
    kv_u64 asb = kv_dev_stream_bytes(n, abits), rsb = kv_dev_stream_bytes(n, r);
    /* kv_dev_group_offset of group g0: block * cols * full + c0 * (this block's stream bytes) */
    KV_GLOBAL kv_u8 *ap = apl + block * l.cols * kv_dev_stream_bytes(l.group_size, abits) + c0 * asb;
    KV_GLOBAL kv_u8 *rp = anchor_bits ? rpl + block * l.cols * kv_dev_stream_bytes(l.group_size, r) + c0 * rsb : ap;
    kv_cpu_bits16 ab = {(ulong16)0, 0, 0}, rb = {(ulong16)0, 0, 0};
    for (kv_u32 i = 0; i < n; i++) {
        uint16 q = kv_cpu_codes16v(kv_cpu_row_load16(x, l, r0 + i, c0), s, z, bits);
        kv_cpu_bits16_put(ap, asb, m, &ab, q >> r, abits);
        if (anchor_bits)
            kv_cpu_bits16_put(rp, rsb, m, &rb, q & (uint16)kv_dev_code_max(r), r);
    }
    kv_cpu_bits16_flush(ap, asb, m, &ab);
    if (anchor_bits)
        kv_cpu_bits16_flush(rp, rsb, m, &rb);
}
#endif /* KV_DIV_MODE == 0 */
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
   a 2-, 4- or 8-bit plane with one vector load per 16 codes, swizzles and
   shifts, and one vector fma (the same fma as kv_dev_dequant, so the values
   are bit for bit the scalar reader's); the group's scale and zero are
   converted once per group. Every other store (CHANNEL groups, other widths,
   head_dims or groups not a multiple of 16, unaligned kv_data) goes through
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

/* How kv_cpu_row reads one page's K or V: the store's constants worked
   out once per page (the layout arithmetic takes divisions, which cost more
   than a chunk's loads and fma). fast: 0 the scalar reader, 1 f32, 2 bf16,
   3 quantized TOKEN groups of a multiple of 16 values with 2, 4 or 8 bits. */
typedef struct kv_cpu_rd {
    int fast;
    kv_u32 pb, gs, per_row, r;
    kv_u64 row_bytes, full, groups;
    float mid;
} kv_cpu_rd;

KV_FN kv_cpu_rd kv_cpu_rd_get(int aligned, const kv_dev_store *st)
{
    kv_cpu_rd rd;
    kv_u32 cols = st->l.cols, gs = st->l.group_size, pb = st->plane_bits;
    rd.fast = 0;
    rd.pb = pb;
    rd.gs = gs;
    rd.per_row = rd.r = 0;
    rd.row_bytes = rd.full = rd.groups = 0;
    rd.mid = 0.0f;
    if (!aligned || cols % 16 != 0)
        return rd;
    if (st->kind == 0 || st->kind == 1) {
        rd.fast = st->kind == 0 ? 1 : 2;
        return rd;
    }
    if (st->l.grouping != 0 || gs % 16 != 0 || (pb != 8 && pb != 4 && pb != 2))
        return rd;
    rd.fast = 3;
    rd.per_row = (cols + gs - 1) / gs;
    rd.full = kv_dev_stream_bytes(gs, pb);
    kv_u32 last = cols % gs;
    rd.row_bytes = (cols / gs) * rd.full + (last ? kv_dev_stream_bytes(last, pb) : 0);
    rd.groups = st->groups;
    rd.r = st->anchor_bits ? st->bits - st->anchor_bits : 0;
    rd.mid = (float)((1u << rd.r) - 1u) / 2.0f; /* exact */
    return rd;
}

/* Values d0 .. d0 + 15 of row t of a page's K or V (0 past head_dim) by the
   scalar reader: every store that kv_cpu_row's vector readers do not take. */
KV_FN float16 kv_cpu_row16_scalar(KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *st, kv_u32 t,
                                  kv_u32 d0)
{
    float tmp[16];
    kv_u32 n = st->l.cols - d0 < 16 ? st->l.cols - d0 : 16;
    kv_dev_row_chunk(data, aligned, st, t, d0, n, tmp);
    for (kv_u32 j = n; j < 16; j++)
        tmp[j] = 0.0f;
    return vload16(0, tmp);
}

/* scale * (the float-float sum of 16 lanes (hi, lo)): the lanes pairwise
   (TwoSum on halves), 16 -> 8 -> 4 -> 2 -> 1, then kv_dev_logit_end. */
KV_FN_INLINE kv_dev_ff kv_cpu_ff16_end(float16 hi, float16 lo, float scale)
{
    float8 h8 = hi.lo + hi.hi, b8 = h8 - hi.lo;
    float8 l8 = (lo.lo + lo.hi) + ((hi.lo - (h8 - b8)) + (hi.hi - b8));
    float4 h4 = h8.lo + h8.hi, b4 = h4 - h8.lo;
    float4 l4 = (l8.lo + l8.hi) + ((h8.lo - (h4 - b4)) + (h8.hi - b4));
    float2 h2 = h4.lo + h4.hi, b2 = h2 - h4.lo;
    float2 l2 = (l4.lo + l4.hi) + ((h4.lo - (h2 - b2)) + (h4.hi - b2));
    kv_dev_ff sum = kv_dev_two_sum(h2.x, h2.y);
    return kv_dev_logit_end(sum.hi, (l2.x + l2.y) + sum.lo, scale);
}

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
/* Attention on CPU devices (KV_LANES > 1): the same split over the context
   and the same arguments as the GPU shape below, but a work-group is one
   work-item and serves up to KV_CPU_HEADS query heads of one GQA group: the
   work-group of head h does heads h .. h + KV_CPU_HEADS - 1 when h is the
   first of such a batch in its group, and the others stop at once. Each
   K and V row of the chunk is decoded once per batch (kv_cpu_row), not
   once per query head, and no barrier or local memory is needed. Per tile
   of KV_CPU_TILE tokens, for each head: the dot products in vector lanes
   (in double with KV_FP64, kv_cpu_dot_d; else float-float, kv_cpu_dot16),
   the 16 tokens' lanes added by one transposing tree into 16 logits; the
   running max M (the tile's largest logit when it is larger: any M near the
   maximum will do); p = e^(logit - M) for the 16 tokens at once; l = l f +
   sum p; acc = acc f + the tile's weighted V, as in the GPU shape. Error
   against the reference at 32K tokens (bench kernels): 5.6e-7 to 1.0e-6. */
#define KV_CPU_HEADS 8
#define KV_CPU_TILE 16
#define KV_CPU_CHUNKS (KV_MAX_HEAD_DIM / 16)

/* dot(q, k) over nch chunks of 16 (q and k 0 past head_dim) as float-float
   in 16 lanes: *hi + *lo, lane j summing dimensions j, j + 16, ... */
KV_FN_INLINE void kv_cpu_dot16(const float16 *q, const float16 *k, kv_u32 nch, float16 *hio, float16 *loo)
{
    float16 hi = (float16)0.0f, lo = (float16)0.0f;
    for (kv_u32 c = 0; c < nch; c++) {
        float16 p = q[c] * k[c];
        float16 pe = fma(q[c], k[c], -p); /* p + pe = the exact product */
        float16 sh = hi + p;
        float16 bb = sh - hi;
        lo = lo + (((hi - (sh - bb)) + (p - bb)) + pe);
        hi = sh;
    }
    *hio = hi;
    *loo = lo;
}

/* q[0 .. head_dim) as chunks of 16 (0 past head_dim). */
KV_FN_INLINE void kv_cpu_q16(KV_GLOBAL const float *q, kv_u32 head_dim, float16 *out)
{
    for (kv_u32 c = 0; 16 * c < head_dim; c++) {
        if (16 * c + 16 <= head_dim) {
            out[c] = vload16(0, q + 16 * c);
        } else {
            float tmp[16];
            for (kv_u32 j = 0; j < 16; j++)
                tmp[j] = 16 * c + j < head_dim ? q[16 * c + j] : 0.0f;
            out[c] = vload16(0, tmp);
        }
    }
}

/* (xh, xl) + (yh, yl) lane by lane, float-float (TwoSum of the highs). */
#define KV_CPU_FF_ADD(xh, xl, yh, yl, oh, ol)                                                                      \
    do {                                                                                                           \
        oh = (xh) + (yh);                                                                                          \
        __typeof__(oh) bb_ = oh - (xh);                                                                            \
        ol = ((xl) + (yl)) + (((xh) - (oh - bb_)) + ((yh) - bb_));                                                 \
    } while (0)

/* The 16 tokens' logits scale * (sum of lanes of h[e] + l[e]) as float-float
   vectors (lane e: token e): a transposing tree that adds halves of two
   tokens' lanes at each level (16 x 16 -> 8 x (2 x 8) -> 4 x (4 x 4) -> 2 x
   (8 x 2) -> 16 x 1), then kv_dev_logit_end on every lane. */
KV_FN_INLINE void kv_cpu_ff_tree(const float16 *h, const float16 *l, float scale, float16 *oh, float16 *ol)
{
    float16 h1[8], l1[8], h2[4], l2[4], h3[2], l3[2];
    for (kv_u32 k = 0; k < 8; k++) {
        float16 a = h[2 * k], b = h[2 * k + 1], la = l[2 * k], lb = l[2 * k + 1];
        KV_CPU_FF_ADD((float16)(a.lo, b.lo), (float16)(la.lo, lb.lo), (float16)(a.hi, b.hi), (float16)(la.hi, lb.hi),
                      h1[k], l1[k]);
    }
    for (kv_u32 k = 0; k < 4; k++) {
        float16 a = h1[2 * k], b = h1[2 * k + 1], la = l1[2 * k], lb = l1[2 * k + 1];
        KV_CPU_FF_ADD((float16)(a.s0123, a.s89ab, b.s0123, b.s89ab), (float16)(la.s0123, la.s89ab, lb.s0123, lb.s89ab),
                      (float16)(a.s4567, a.scdef, b.s4567, b.scdef), (float16)(la.s4567, la.scdef, lb.s4567, lb.scdef),
                      h2[k], l2[k]);
    }
    for (kv_u32 k = 0; k < 2; k++) {
        float16 a = h2[2 * k], b = h2[2 * k + 1], la = l2[2 * k], lb = l2[2 * k + 1];
        KV_CPU_FF_ADD((float16)(a.s01, a.s45, a.s89, a.scd, b.s01, b.s45, b.s89, b.scd),
                      (float16)(la.s01, la.s45, la.s89, la.scd, lb.s01, lb.s45, lb.s89, lb.scd),
                      (float16)(a.s23, a.s67, a.sab, a.sef, b.s23, b.s67, b.sab, b.sef),
                      (float16)(la.s23, la.s67, la.sab, la.sef, lb.s23, lb.s67, lb.sab, lb.sef), h3[k], l3[k]);
    }
    float16 dh, dl;
    KV_CPU_FF_ADD((float16)(h3[0].even, h3[1].even), (float16)(l3[0].even, l3[1].even), (float16)(h3[0].odd, h3[1].odd),
                  (float16)(l3[0].odd, l3[1].odd), dh, dl);
    /* kv_dev_logit_end, 16 lanes */
    float16 sh = dh + dl, bb = sh - dh;
    float16 sl = (dh - (sh - bb)) + (dl - bb);
    float16 rh = sh * (float16)scale;
    float16 rl = fma(sh, (float16)scale, -rh) + sl * (float16)scale;
    *oh = rh + rl;
    float16 b2 = *oh - rh;
    *ol = (rh - (*oh - b2)) + (rl - b2);
}

#if KV_FP64
/* With doubles (cl_khr_fp64; the host sets KV_FP64), the dot product in
   double instead of float-float: each product of two floats is exact in
   double and the sums lose about 2^-53 of the largest partial, four vector
   operations per 16 values instead of nine. *acc: 8 lanes, lane j summing
   dimensions j, j + 8, ... (q and k as doubles, qd[2c] and qd[2c + 1] the
   two halves of chunk c; the row is converted once for every slot). */
KV_FN_INLINE double8 kv_cpu_dot_d(const double8 *qd, const double8 *kd, kv_u32 nch)
{
    double8 a0 = (double8)0.0, a1 = (double8)0.0;
    for (kv_u32 c = 0; c < nch; c++) {
        a0 = fma(qd[2 * c], kd[2 * c], a0);
        a1 = fma(qd[2 * c + 1], kd[2 * c + 1], a1);
    }
    return a0 + a1;
}

/* kv_cpu_dot_d for the 4 slots qd[0 .. 3] at once, bit for bit, on the K
   row as floats: each chunk is loaded and converted once for the 4, and the
   8 sums are independent (one slot at a time, each slot's two sums were a
   chain of dependent fma). */
KV_FN_INLINE void kv_cpu_dot_d4(const double8 (*qd)[2 * KV_CPU_CHUNKS], const float16 *row, kv_u32 nch, double8 *o0,
                                double8 *o1, double8 *o2, double8 *o3)
{
    double8 a0 = (double8)0.0, b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (kv_u32 c = 0; c < nch; c++) {
        double8 k0 = convert_double8(row[c].lo), k1 = convert_double8(row[c].hi); /* exact */
        a0 = fma(qd[0][2 * c], k0, a0);
        b0 = fma(qd[0][2 * c + 1], k1, b0);
        a1 = fma(qd[1][2 * c], k0, a1);
        b1 = fma(qd[1][2 * c + 1], k1, b1);
        a2 = fma(qd[2][2 * c], k0, a2);
        b2 = fma(qd[2][2 * c + 1], k1, b2);
        a3 = fma(qd[3][2 * c], k0, a3);
        b3 = fma(qd[3][2 * c + 1], k1, b3);
    }
    *o0 = a0 + b0;
    *o1 = a1 + b1;
    *o2 = a2 + b2;
    *o3 = a3 + b3;
}

/* The 16 tokens' logits scale * (sum of the lanes of d[e]) as float-float
   vectors (lane e: token e), by a transposing tree (16 x 8 -> 8 x (2 x 4) ->
   4 x (4 x 2) -> 2 x (8 x 1) lanes), in double. */
KV_FN_INLINE void kv_cpu_d_tree(const double8 *d, float scale, float16 *oh, float16 *ol)
{
    double8 t1[8], t2[4], t3[2];
    for (kv_u32 k = 0; k < 8; k++)
        t1[k] = (double8)(d[2 * k].lo, d[2 * k + 1].lo) + (double8)(d[2 * k].hi, d[2 * k + 1].hi);
    for (kv_u32 k = 0; k < 4; k++) {
        double8 a = t1[2 * k], b = t1[2 * k + 1];
        t2[k] = (double8)(a.s01, a.s45, b.s01, b.s45) + (double8)(a.s23, a.s67, b.s23, b.s67);
    }
    for (kv_u32 k = 0; k < 2; k++)
        t3[k] = (double8)(t2[2 * k].even, t2[2 * k + 1].even) + (double8)(t2[2 * k].odd, t2[2 * k + 1].odd);
    double8 s0 = t3[0] * (double)scale, s1 = t3[1] * (double)scale;
    float8 h0 = convert_float8(s0), h1 = convert_float8(s1);
    *oh = (float16)(h0, h1);
    *ol = (float16)(convert_float8(s0 - convert_double8(h0)), convert_float8(s1 - convert_double8(h1)));
}
#endif

KV_FN_INLINE float kv_cpu_max16f(float16 v)
{
    float8 a = fmax(v.lo, v.hi);
    float4 b = fmax(a.lo, a.hi);
    float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}

/* kv_dev_f16_to_f32 on 16 lanes with integer vector ops (its three cases
   computed and one selected), bit for bit. PoCL's vload_half is a software
   conversion of about 15 scalar instructions per value. */
KV_FN_INLINE float16 kv_cpu_f16x16(ushort16 hb)
{
    uint16 h = convert_uint16(hb);
    uint16 sign = (h & 0x8000u) << 16;
    uint16 ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint16 sub = as_uint16(convert_float16(man) * 5.9604644775390625e-8f) | sign; /* 2^-24; exact */
    uint16 special = sign | 0x7f800000u | (man << 13);
    uint16 normal = sign | ((ex + 112u) << 23) | (man << 13);
    return as_float16(select(select(normal, special, ex == 31u), sub, ex == 0u));
}

/* The metadata of rows t0 .. t0 + nt - 1 (nt <= KV_CPU_TILE) of a store that
   kv_cpu_row reads as quantized TOKEN groups (rd->fast 3), as f32: s[i] the
   scale and z[i] the zero of group t0 * per_row + i. A row's groups follow
   one another, and so do the rows', so the tile's metadata is one run of
   halves, converted 16 at a time (kv_cpu_f16x16). Other stores: nothing. */
#define KV_CPU_META (KV_CPU_TILE * KV_CPU_CHUNKS)
KV_FN_INLINE void kv_cpu_meta(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_cpu_rd *rd, kv_u32 t0,
                              kv_u32 nt, float *s, float *z)
{
    if (rd->fast != 3)
        return;
    KV_GLOBAL const kv_u16 *m = KV_CPTR(kv_u16, data, st->meta);
    kv_u64 g0 = (kv_u64)t0 * rd->per_row;
    kv_u32 n = nt * rd->per_row, i = 0;
    for (; i + 16 <= n; i += 16) {
        vstore16(kv_cpu_f16x16(vload16(0, m + g0 + i)), 0, s + i);
        vstore16(kv_cpu_f16x16(vload16(0, m + rd->groups + g0 + i)), 0, z + i);
    }
    for (; i < n; i++) {
        s[i] = kv_dev_f16_to_f32(m[g0 + i]);
        z[i] = kv_dev_f16_to_f32(m[rd->groups + g0 + i]);
    }
}

/* Chunks 0 .. nch - 1 of row t of a page's K or V into out: one loop per
   reader. A quantized TOKEN-grouped row (rd->fast 3) takes its groups' scales
   and zeros from s[0 .. per_row) and z[0 .. per_row) (kv_cpu_meta). */
KV_FN_INLINE void kv_cpu_row(KV_GLOBAL const kv_u8 *data, int aligned, const kv_dev_store *st, const kv_cpu_rd *rd,
                             kv_u32 t, kv_u32 nch, const float *s, const float *z, float16 *out)
{
    kv_u64 e0 = (kv_u64)t * st->l.cols;
    if (rd->fast == 1) {
        for (kv_u32 c = 0; c < nch; c++)
            out[c] = vload16(0, KV_CPTR(float, data, st->data) + e0 + 16 * c);
    } else if (rd->fast == 2) {
        for (kv_u32 c = 0; c < nch; c++)
            out[c] = as_float16(convert_uint16(vload16(0, KV_CPTR(kv_u16, data, st->data) + e0 + 16 * c)) << 16);
    } else if (rd->fast == 3) {
        kv_u32 pb = rd->pb, per_group = rd->gs / 16, ig = 0;
        KV_GLOBAL const kv_u8 *code = data + st->data + t * rd->row_bytes;
        kv_u32 g = 0;
        float16 sv = (float16)0.0f, zv = (float16)0.0f;
        for (kv_u32 c = 0; c < nch; c++) {
            if (ig == 0) { /* a new group */
                sv = (float16)s[g];
                zv = (float16)z[g];
            }
            /* chunk c's codes start at byte 2 pb c of the row: groups hold whole chunks */
            KV_GLOBAL const kv_u8 *cc = code + (kv_u64)2 * pb * c;
            uint16 q;
            if (pb == 8) {
                q = convert_uint16(vload16(0, cc));
            } else if (pb == 4) {
                uint16 b = convert_uint16(vload8(0, cc).s0011223344556677);
                q = (b >> (uint16)(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4)) & 15u;
            } else {
                uint16 b = convert_uint16(vload4(0, cc).s0000111122223333);
                q = (b >> (uint16)(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)) & 3u;
            }
            out[c] = st->anchor_bits ? fma(convert_float16(q << rd->r) + (float16)rd->mid, sv, zv)
                                     : fma(convert_float16(q), sv, zv);
            if (++ig == per_group) {
                ig = 0;
                g++;
            }
        }
    } else {
        for (kv_u32 c = 0; c < nch; c++)
            out[c] = kv_cpu_row16_scalar(data, aligned, st, t, 16 * c);
    }
}

/* Asks the cache for rows t0 .. t0 + nt - 1 of a store that kv_cpu_row reads
   with a vector reader (rd->fast 1-3) (kv_cpu_prefetch_rows), and for their
   metadata (kv_cpu_prefetch_meta); other stores: nothing. A page holds a few
   KB, too little for the hardware prefetcher to get going before the walk
   moves on to the next page elsewhere in kv_data, so every tile waited on
   its first loads (perf: about a fifth of the kernel's samples on the loads
   of codes and metadata). The kernel asks for the next tile's rows one at a
   time while it reads this tile's K rows: a burst of a whole tile's lines
   stalled on the cache's few outstanding misses. A hint only: nothing is
   read, so the results do not change. */
#if defined(__clang__)
#define KV_CPU_PREFETCH(p) __builtin_prefetch((p), 0, 3) /* PoCL's prefetch() is a no-op (no instruction) */
#else
#define KV_CPU_PREFETCH(p) prefetch((p), 64)
#endif
KV_FN_INLINE void kv_cpu_prefetch_rows(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_cpu_rd *rd,
                                       kv_u32 t0, kv_u32 nt)
{
    kv_u64 rb = rd->fast == 1 ? 4 * (kv_u64)st->l.cols
                : rd->fast == 2 ? 2 * (kv_u64)st->l.cols
                : rd->fast == 3 ? rd->row_bytes
                                : 0;
    KV_GLOBAL const kv_u8 *p = data + st->data + t0 * rb;
    for (kv_u64 o = 0; o < nt * rb; o += 64)
        KV_CPU_PREFETCH(p + o);
}

KV_FN_INLINE void kv_cpu_prefetch_meta(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_cpu_rd *rd,
                                       kv_u32 t0, kv_u32 nt)
{
    if (rd->fast != 3)
        return;
    kv_u64 mb = 2 * (kv_u64)nt * rd->per_row;
    KV_GLOBAL const kv_u8 *m = data + st->meta + 2 * (kv_u64)t0 * rd->per_row;
    for (kv_u64 o = 0; o < mb; o += 64) {
        KV_CPU_PREFETCH(m + o);
        KV_CPU_PREFETCH(m + 2 * rd->groups + o);
    }
}

KV_KERNEL kv_attention(KV_GLOBAL const kv_u8 *qb, kv_u64 qo, KV_GLOBAL const kv_u8 *qpb, kv_u64 qpo,
                       KV_GLOBAL const kv_u8 *pgb, kv_u64 pgo, KV_GLOBAL const kv_u8 *hpb, kv_u64 hpo,
                       KV_GLOBAL const kv_u8 *posb, kv_u64 poso, kv_u64 n_positions, KV_GLOBAL const kv_u8 *datab,
                       kv_u64 datao, kv_u64 data_bytes, KV_GLOBAL kv_u8 *ob, kv_u64 oo, KV_GLOBAL float *ml,
                       KV_GLOBAL float *part, kv_u32 n_queries, kv_u32 n_heads, kv_u32 n_kv_heads, kv_u32 head_dim,
                       kv_u32 n_pages, kv_u32 n_split, float scale)
{
    /* slot j = iq * nh + hh: query qi + iq, head h0 + hh */
    float16 qv[KV_CPU_HEADS][KV_CPU_CHUNKS], acc[KV_CPU_HEADS][KV_CPU_CHUNKS];
    float16 row[KV_CPU_CHUNKS];
#if KV_FP64
    double8 qd[KV_CPU_HEADS][2 * KV_CPU_CHUNKS], dd[KV_CPU_HEADS][KV_CPU_TILE]; /* q; dot-product lanes */
    double8 kd[2 * KV_CPU_CHUNKS];                                              /* the K row */
#else
    float16 dh[KV_CPU_HEADS][KV_CPU_TILE], dl[KV_CPU_HEADS][KV_CPU_TILE]; /* dot-product lanes */
#endif
    kv_dev_ff m[KV_CPU_HEADS];
    float pr[KV_CPU_HEADS][KV_CPU_TILE], l[KV_CPU_HEADS], f[KV_CPU_HEADS];
    float ks[KV_CPU_META], kz[KV_CPU_META], vs[KV_CPU_META], vz[KV_CPU_META]; /* the tile's metadata */
    int vis[KV_CPU_HEADS][KV_CPU_TILE], vany[KV_CPU_TILE], anyq[KV_CPU_HEADS], seen[KV_CPU_HEADS];
    kv_u32 qpos[KV_CPU_HEADS], sq[KV_CPU_HEADS]; /* sq[j]: slot j's query (j / nh), no division in the loops */

    KV_GLOBAL const kv_u8 *data = datab + datao;
    int aligned = (datao % 4) == 0;
    KV_GLOBAL const kv_u32 *pages = KV_CPTR(kv_u32, pgb, pgo);
    KV_GLOBAL const kv_u32 *positions = KV_CPTR(kv_u32, posb, poso);
    kv_u32 group = n_heads / n_kv_heads, nch = (head_dim + 15) / 16;
    kv_u32 hb = group < KV_CPU_HEADS ? group : KV_CPU_HEADS; /* heads of a batch */
    kv_u32 qbat = KV_CPU_HEADS / hb;                        /* queries of a batch */
    KV_FOR_GROUPS(wg, (kv_u64)n_queries * n_heads * n_split) {
        kv_u32 split = (kv_u32)(wg % n_split);
        kv_u64 row0 = wg / n_split; /* qi * n_heads + h */
        kv_u32 h0 = (kv_u32)(row0 % n_heads);
        kv_u32 qi = (kv_u32)(row0 / n_heads);
        kv_u32 kh = h0 / group, hg = h0 - kh * group;
        if (hg % hb != 0 || qi % qbat != 0)
            continue; /* served by the work-group of its batch's first (query, head) */
        kv_u32 nh = group - hg < hb ? group - hg : hb;
        kv_u32 nq = n_queries - qi < qbat ? n_queries - qi : qbat, nr = nq * nh;
        kv_u32 p0, p1;
        kv_dev_split_range(KV_CPTR(kv_u32, hpb, hpo), kh, n_pages, split, n_split, &p0, &p1);

        for (kv_u32 iq = 0; iq < nq; iq++) {
            qpos[iq] = KV_CPTR(kv_u32, qpb, qpo)[qi + iq];
            seen[iq] = 0; /* visibility depends on the query only, so it is the same for its heads */
        }
        for (kv_u32 j = 0; j < nr; j++) {
            sq[j] = j / nh;
            kv_u64 rj = (kv_u64)(qi + j / nh) * n_heads + h0 + j % nh;
            kv_cpu_q16(KV_CPTR(float, qb, qo) + rj * head_dim, head_dim, qv[j]);
            for (kv_u32 c = 0; c < nch; c++) {
                acc[j][c] = (float16)0.0f;
#if KV_FP64
                qd[j][2 * c] = convert_double8(qv[j][c].lo);
                qd[j][2 * c + 1] = convert_double8(qv[j][c].hi);
#endif
            }
            m[j].hi = m[j].lo = 0.0f;
            l[j] = 0.0f;
        }
        kv_dev_page nx = {0}; /* page p + 1, for kv_cpu_prefetch_rows/meta */
        kv_cpu_rd nkrd = {0}, nvrd = {0};
        if (p0 < p1) {
            nx = kv_dev_page_get(pages, p0, head_dim, data_bytes, n_positions);
            nkrd = kv_cpu_rd_get(aligned, &nx.k);
            nvrd = kv_cpu_rd_get(aligned, &nx.v);
        }
        for (kv_u32 p = p0; p < p1; p++) {
            kv_dev_page pg = nx;
            kv_cpu_rd krd = nkrd, vrd = nvrd;
            if (p + 1 < p1) {
                nx = kv_dev_page_get(pages, p + 1, head_dim, data_bytes, n_positions);
                nkrd = kv_cpu_rd_get(aligned, &nx.k);
                nvrd = kv_cpu_rd_get(aligned, &nx.v);
            }
            if (!pg.ok)
                continue;
            for (kv_u32 t0 = 0; t0 < pg.ntok; t0 += KV_CPU_TILE) {
                kv_u32 nt = pg.ntok - t0 < KV_CPU_TILE ? pg.ntok - t0 : KV_CPU_TILE;
                int any = 0;
                for (kv_u32 iq = 0; iq < nq; iq++)
                    anyq[iq] = 0;
                for (kv_u32 e = 0; e < KV_CPU_TILE; e++) {
                    kv_u32 pos = positions[pg.pos_index + t0 + (e < nt ? e : 0)];
                    vany[e] = 0;
                    for (kv_u32 iq = 0; iq < nq; iq++) {
                        vis[iq][e] = e < nt && pos <= qpos[iq];
                        anyq[iq] |= vis[iq][e];
                        vany[e] |= vis[iq][e];
                    }
                    any |= vany[e];
                }
                /* the next tile: of this page, or the next page's first (n2 = 0: none) */
                const kv_dev_store *nks = &pg.k, *nvs = &pg.v;
                const kv_cpu_rd *nkr = &krd, *nvr = &vrd;
                kv_u32 tn = t0 + KV_CPU_TILE, n2 = 0;
                if (tn < pg.ntok) {
                    n2 = pg.ntok - tn < KV_CPU_TILE ? pg.ntok - tn : KV_CPU_TILE;
                } else if (p + 1 < p1 && nx.ok) {
                    nks = &nx.k, nvs = &nx.v, nkr = &nkrd, nvr = &nvrd;
                    tn = 0;
                    n2 = nx.ntok < KV_CPU_TILE ? nx.ntok : KV_CPU_TILE;
                }
                kv_cpu_prefetch_meta(data, nks, nkr, tn, n2);
                kv_cpu_prefetch_meta(data, nvs, nvr, tn, n2);
                if (!any)
                    continue; /* M, l and acc stay as they are (f would be 1) */
                kv_cpu_meta(data, &pg.k, &krd, t0, nt, ks, kz);
                kv_cpu_meta(data, &pg.v, &vrd, t0, nt, vs, vz);
                /* 1. The dot products of the tile's tokens that some query of
                   the batch sees (16 lanes each), every slot, each K row
                   decoded once for all of them; then per slot the 16 tokens'
                   lanes added by one transposing tree (kv_cpu_ff_tree). */
                for (kv_u32 e = 0; e < KV_CPU_TILE; e++) {
                    if (e < n2) { /* row e of the next tile, spread over this loop */
                        kv_cpu_prefetch_rows(data, nks, nkr, tn + e, 1);
                        kv_cpu_prefetch_rows(data, nvs, nvr, tn + e, 1);
                    }
                    if (!vany[e]) {
                        for (kv_u32 j = 0; j < nr; j++)
#if KV_FP64
                            dd[j][e] = (double8)0.0;
#else
                            dh[j][e] = dl[j][e] = (float16)0.0f;
#endif
                        continue;
                    }
                    kv_cpu_row(data, aligned, &pg.k, &krd, t0 + e, nch, ks + e * krd.per_row, kz + e * krd.per_row,
                               row);
#if KV_FP64
                    kv_u32 j4 = 0;
                    for (; j4 + 4 <= nr; j4 += 4)
                        kv_cpu_dot_d4(qd + j4, row, nch, &dd[j4][e], &dd[j4 + 1][e], &dd[j4 + 2][e], &dd[j4 + 3][e]);
                    if (j4 < nr) /* the K row as doubles for the last slots */
                        for (kv_u32 c = 0; c < nch; c++) {
                            kd[2 * c] = convert_double8(row[c].lo);
                            kd[2 * c + 1] = convert_double8(row[c].hi);
                        }
                    for (kv_u32 j = j4; j < nr; j++)
                        dd[j][e] = kv_cpu_dot_d(qd[j], kd, nch);
#else
                    for (kv_u32 j = 0; j < nr; j++)
                        kv_cpu_dot16(qv[j], row, nch, &dh[j][e], &dl[j][e]);
#endif
                }
                /* 2. Per slot: the running max (the tile's largest logit.hi
                   when it is larger: any M near the maximum will do, as f
                   rescales what came before), the probabilities, l. A slot
                   whose query sees none of the tile keeps M, l and acc
                   (f = 1, p = 0). */
                for (kv_u32 j = 0; j < nr; j++) {
                    kv_u32 iq = sq[j];
                    if (!anyq[iq])
                        continue;
                    int16 visv = vload16(0, vis[iq]) != 0;
                    float16 lh, ll;
#if KV_FP64
                    kv_cpu_d_tree(dd[j], scale, &lh, &ll);
#else
                    kv_cpu_ff_tree(dh[j], dl[j], scale, &lh, &ll);
#endif
                    float tmax = kv_cpu_max16f(select((float16)(-INFINITY), lh, visv));
                    kv_dev_ff tm = m[j];
                    if (!seen[iq] || tmax > tm.hi) {
                        tm.hi = tmax;
                        tm.lo = 0.0f;
                    }
                    f[j] = seen[iq] ? KV_EXP(kv_dev_ff_sub(m[j], tm)) : 1.0f;
                    m[j] = tm;
                    float16 pv = select((float16)0.0f, exp((lh - (float16)tm.hi) + (ll - (float16)tm.lo)), visv);
                    vstore16(pv, 0, pr[j]);
                    float8 p8 = pv.lo + pv.hi; /* the tile's sum by halves (a serial sum was 16 dependent adds) */
                    float4 p4 = p8.lo + p8.hi;
                    float2 p2 = p4.lo + p4.hi;
                    float tl = p2.x + p2.y;
                    l[j] = l[j] * f[j] + tl;
                    if (f[j] != 1.0f)
                        for (kv_u32 c = 0; c < nch; c++)
                            acc[j][c] *= (float16)f[j];
                }
                for (kv_u32 iq = 0; iq < nq; iq++)
                    seen[iq] |= anyq[iq];
                /* 3. The tile's weighted V, each row decoded once for every slot. */
                for (kv_u32 e = 0; e < nt; e++) {
                    if (!vany[e])
                        continue;
                    kv_cpu_row(data, aligned, &pg.v, &vrd, t0 + e, nch, vs + e * vrd.per_row, vz + e * vrd.per_row,
                               row);
                    kv_u32 j4 = 0; /* 4 slots at once when all 4 see the token: each V chunk loaded once for them */
                    for (; j4 + 4 <= nr && vis[sq[j4]][e] && vis[sq[j4 + 1]][e] && vis[sq[j4 + 2]][e] && vis[sq[j4 + 3]][e];
                         j4 += 4) {
                        float16 w0 = (float16)pr[j4][e], w1 = (float16)pr[j4 + 1][e];
                        float16 w2 = (float16)pr[j4 + 2][e], w3 = (float16)pr[j4 + 3][e];
                        for (kv_u32 c = 0; c < nch; c++) {
                            float16 r = row[c];
                            acc[j4][c] = fma(w0, r, acc[j4][c]);
                            acc[j4 + 1][c] = fma(w1, r, acc[j4 + 1][c]);
                            acc[j4 + 2][c] = fma(w2, r, acc[j4 + 2][c]);
                            acc[j4 + 3][c] = fma(w3, r, acc[j4 + 3][c]);
                        }
                    }
                    for (kv_u32 j = j4; j < nr; j++) {
                        if (!vis[sq[j]][e])
                            continue;
                        float16 pw = (float16)pr[j][e];
                        for (kv_u32 c = 0; c < nch; c++)
                            acc[j][c] = fma(pw, row[c], acc[j][c]);
                    }
                }
            }
        }

        for (kv_u32 j = 0; j < nr; j++) {
            kv_u64 row = (kv_u64)(qi + j / nh) * n_heads + h0 + j % nh;
            int sn = seen[j / nh];
            float tmp[KV_MAX_HEAD_DIM];
            for (kv_u32 c = 0; c < nch; c++)
                vstore16(n_split == 1 ? (sn ? acc[j][c] / (float16)l[j] : (float16)0.0f) : acc[j][c], 0, tmp + 16 * c);
            if (n_split == 1) {
                KV_GLOBAL float *out = KV_PTR(float, ob, oo) + row * head_dim;
                for (kv_u32 d = 0; d < head_dim; d++)
                    out[d] = tmp[d];
                if (ml) {
                    ml[3 * row] = sn ? m[j].hi : 0.0f;
                    ml[3 * row + 1] = sn ? m[j].lo : 0.0f;
                    ml[3 * row + 2] = sn ? l[j] : 0.0f;
                }
            } else {
                KV_GLOBAL float *pp = part + (row * n_split + split) * ((kv_u64)head_dim + 3);
                for (kv_u32 d = 0; d < head_dim; d++)
                    pp[3 + d] = sn ? tmp[d] : 0.0f;
                pp[0] = sn ? m[j].hi : 0.0f;
                pp[1] = sn ? m[j].lo : 0.0f;
                pp[2] = sn ? l[j] : 0.0f; /* a chunk that saw a token has l >= 1 */
            }
        }
    }
    KV_KERNEL_END();
}
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
   maximum over the group's heads. */
#if defined(KV_CPU_ATTENTION) && KV_FP64
/* The scores of one page's tokens on CPU devices with doubles, when a KV
   head's (query head, query) slots fit in KV_CPU_HEADS: as the kernel below
   (per token, the largest over the group's heads of sum over queries of
   e^(logit - M) / l), but KV_CPU_TILE tokens at a time as kv_attention does
   it: each K row decoded once, the dot products in double (kv_cpu_dot_d4 /
   kv_cpu_dot_d; q converted once per page), the tile's logits by
   kv_cpu_d_tree and e^ on 16 tokens at once. Writes scores[0 .. min(ntok,
   room)). ks, kz: room for a tile's metadata (KV_CPU_META). */
KV_FN_INLINE void kv_cpu_scores_page(KV_GLOBAL const float *qall, KV_GLOBAL const kv_u32 *qpos,
                                     KV_GLOBAL const kv_u32 *positions, KV_GLOBAL const kv_u8 *data, int aligned,
                                     const kv_dev_page *pg, const kv_cpu_rd *krd, KV_GLOBAL const float *ml,
                                     KV_GLOBAL float *scores, kv_u64 room, kv_u32 kh, kv_u32 group, kv_u32 n_queries,
                                     kv_u32 n_heads, kv_u32 head_dim, float scale, float *ks, float *kz)
{
    double8 qd[KV_CPU_HEADS][2 * KV_CPU_CHUNKS], dd[KV_CPU_HEADS][KV_CPU_TILE], kd[2 * KV_CPU_CHUNKS];
    float16 row[KV_CPU_CHUNKS], qc[KV_CPU_CHUNKS];
    kv_u32 nch = (head_dim + 15) / 16, nr = group * n_queries; /* slot j = hh * n_queries + qi */
    for (kv_u32 j = 0; j < nr; j++) {
        kv_u32 hh = j / n_queries, qi = j % n_queries;
        kv_cpu_q16(qall + ((kv_u64)qi * n_heads + kh * group + hh) * head_dim, head_dim, qc);
        for (kv_u32 c = 0; c < nch; c++) {
            qd[j][2 * c] = convert_double8(qc[c].lo);
            qd[j][2 * c + 1] = convert_double8(qc[c].hi);
        }
    }
    kv_u32 ntok = pg->ntok < room ? pg->ntok : (kv_u32)room;
    for (kv_u32 t0 = 0; t0 < ntok; t0 += KV_CPU_TILE) {
        kv_u32 nt = ntok - t0 < KV_CPU_TILE ? ntok - t0 : KV_CPU_TILE;
        kv_cpu_meta(data, &pg->k, krd, t0, nt, ks, kz);
        for (kv_u32 e = 0; e < KV_CPU_TILE; e++) {
            if (e >= nt) {
                for (kv_u32 j = 0; j < nr; j++)
                    dd[j][e] = (double8)0.0;
                continue;
            }
            kv_cpu_row(data, aligned, &pg->k, krd, t0 + e, nch, ks + e * krd->per_row, kz + e * krd->per_row, row);
            kv_u32 j4 = 0;
            for (; j4 + 4 <= nr; j4 += 4)
                kv_cpu_dot_d4(qd + j4, row, nch, &dd[j4][e], &dd[j4 + 1][e], &dd[j4 + 2][e], &dd[j4 + 3][e]);
            if (j4 < nr)
                for (kv_u32 c = 0; c < nch; c++) {
                    kd[2 * c] = convert_double8(row[c].lo);
                    kd[2 * c + 1] = convert_double8(row[c].hi);
                }
            for (kv_u32 j = j4; j < nr; j++)
                dd[j][e] = kv_cpu_dot_d(qd[j], kd, nch);
        }
        int16 inpage = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) < (int16)nt;
        kv_u32 tp[KV_CPU_TILE];
        for (kv_u32 e = 0; e < KV_CPU_TILE; e++)
            tp[e] = positions[pg->pos_index + t0 + (e < nt ? e : 0)];
        uint16 tpos = vload16(0, tp);
        float16 best = (float16)0.0f;
        for (kv_u32 hh = 0; hh < group; hh++) {
            float16 sum = (float16)0.0f;
            for (kv_u32 qi = 0; qi < n_queries; qi++) {
                kv_u64 at = 3 * ((kv_u64)qi * n_heads + kh * group + hh);
                float lsum = ml[at + 2];
                int16 vis = inpage & (tpos <= (uint16)qpos[qi]);
                if (lsum == 0.0f || !any(vis))
                    continue;
                float16 lh, ll;
                kv_cpu_d_tree(dd[hh * n_queries + qi], scale, &lh, &ll);
                float16 pv = exp((lh - (float16)ml[at]) + (ll - (float16)ml[at + 1])) / (float16)lsum;
                sum += select((float16)0.0f, pv, vis);
            }
            best = hh == 0 ? sum : select(best, sum, sum > best);
        }
        float tmp[KV_CPU_TILE];
        vstore16(best, 0, tmp);
        for (kv_u32 e = 0; e < nt; e++)
            scores[t0 + e] = tmp[e];
    }
}
#endif

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
