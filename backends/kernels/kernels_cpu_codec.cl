/* kernels_cpu_codec.cl — the codec kernels' bodies for CPU OpenCL devices (PoCL; KV_LANES > 1):
 * 16 values, codes or groups per work-item in vector types, bit for bit the scalar kernels (why and how:
 * kernels.cl's comment above its #include of this file). OpenCL only: the build embeds it into kernels.cl
 * (backends/opencl/embed.cmake); CUDA, HIP and Ascend never see it. */

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

/* The stream of 16 codes of w bits (1 <= w <= 15, masked to w) as two halves
   of 8 codes (8w bits, w bytes each) in vector registers: half h's bytes 0-7
   in lo[h], its bytes 8 .. w - 1 (w > 8) in hi[h]. Codes pair up (2w bits),
   pairs into quads (4w <= 60 bits), quads into halves: every width in the
   same shifts and ors, no private buffer (the 12-bit residual of b16/a4 and
   every width but 1, 2, 4, 8, 16 went through kv_cpu_pack16's scalar loop). */
KV_FN_INLINE void kv_cpu_halves16(uint16 c, kv_u32 w, ulong2 *lo, ulong2 *hi)
{
    uint8 p = c.even | (c.odd << w);
    ulong4 q = convert_ulong4(p.even) | (convert_ulong4(p.odd) << (ulong)(2 * w));
    *lo = q.even | (q.odd << (ulong)(4 * w));
    *hi = q.odd >> (ulong)(64 - 4 * w); /* the bits of the odd quad past 64 (none when w <= 8) */
}

/* The low k (<= 7) bytes of u at p, little-endian. */
KV_FN_INLINE void kv_cpu_put_low(KV_GLOBAL kv_u8 *p, ulong u, kv_u32 k)
{
    if (k & 4u) {
        vstore4(as_uchar4((uint)u), 0, p);
        p += 4;
        u >>= 32;
    }
    if (k & 2u) {
        vstore2(as_uchar2((ushort)u), 0, p);
        p += 2;
        u >>= 16;
    }
    if (k & 1u)
        *p = (kv_u8)u;
}

/* The first k (<= 15) bytes of the 16 in (lo, hi) at p. */
KV_FN_INLINE void kv_cpu_put_bytes(KV_GLOBAL kv_u8 *p, ulong lo, ulong hi, kv_u32 k)
{
    if (k >= 8) {
        vstore8(as_uchar8(lo), 0, p);
        kv_cpu_put_low(p + 8, hi, k - 8);
    } else {
        kv_cpu_put_low(p, lo, k);
    }
}

/* 16 codes of w bits (masked to w) stored as the nb bytes of their stream at
   out (nb == 2w but in a group's last, short chunk). For w = 1, 2, 4, 8, 16
   and a whole chunk, straight from vector registers; every other width
   below 16 and every short chunk below 16 bits through kv_cpu_halves16, also
   without a buffer. kv_cpu_pack16 into a private buffer and back cost a
   store-forwarding stall per chunk (perf: the narrow reloads of the buffer
   were the hottest instructions of pack); it remains for w = 16's short
   chunks. */
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
    } else if (w < 16) {
        ulong2 lo, hi;
        kv_cpu_halves16(c, w, &lo, &hi);
        kv_u32 n0 = nb < w ? nb : w; /* half 0 holds bytes 0 .. w - 1 */
        kv_cpu_put_bytes(out, lo.x, hi.x, n0);
        kv_cpu_put_bytes(out + w, lo.y, hi.y, nb - n0);
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

/* kv_dev_f16_to_f32 on 16 values with integer vector ops (its three cases computed and one
   selected), bit for bit; also the attention's metadata reader (kernels_cpu_attention.cl). PoCL's
   vload_half is a software conversion of about 15 scalar instructions per value. */
KV_FN_INLINE float16 kv_cpu_f16_to_f32_16(uint16 h)
{
    uint16 sign = (h & 0x8000u) << 16;
    uint16 ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint16 sub = as_uint16(convert_float16(man) * 5.9604644775390625e-8f) | sign; /* 2^-24; exact */
    uint16 special = sign | 0x7f800000u | (man << 13);
    uint16 normal = sign | ((ex + 112u) << 23) | (man << 13);
    return as_float16(select(select(normal, special, ex == 31u), sub, ex == 0u));
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

/* The codes and streams of token groups g0 .. g0 + ng - 1 of an encode
   (their scales and zeros in sv[], zv[]). Called with constant widths by
   kv_cpu_encode_groups for the common formats, so that the width branches of
   kv_cpu_put16 and the residual plane's fold away there. */
KV_FN_INLINE void kv_cpu_encode_codes(KV_GLOBAL const float *xall, KV_GLOBAL kv_u8 *apl, KV_GLOBAL kv_u8 *rpl,
                                      kv_dev_layout l, kv_u64 g0, kv_u32 ng, const float *sv, const float *zv,
                                      kv_u32 bits, kv_u32 anchor_bits)
{
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

/* Token groups KV_CPU_GROUPS * item on (KV_CPU_GROUPS of them, fewer at the
   end) of an encode (the arguments of kv_encode): their metadata 16 at a
   time, then each group's codes and streams, with the widths of int8, int4
   and Lynx b8/a4, b16/a4 as constants (the same codes as the generic call). */
KV_FN void kv_cpu_encode_groups(KV_GLOBAL const float *xall, KV_GLOBAL kv_u8 *apl, KV_GLOBAL kv_u8 *rpl,
                                KV_GLOBAL kv_u16 *scale, KV_GLOBAL kv_u16 *zero, kv_dev_layout l, kv_u64 item,
                                kv_u32 bits, kv_u32 anchor_bits)
{
    kv_u64 g0 = item * KV_CPU_GROUPS, groups = kv_dev_groups(l);
    kv_u32 ng = groups - g0 < KV_CPU_GROUPS ? (kv_u32)(groups - g0) : KV_CPU_GROUPS;
    float sv[16], zv[16];
    kv_cpu_groups_meta(xall, scale, zero, l, g0, ng, bits, sv, zv);
    if (bits == 8 && anchor_bits == 0)
        kv_cpu_encode_codes(xall, apl, rpl, l, g0, ng, sv, zv, 8, 0);
    else if (bits == 4 && anchor_bits == 0)
        kv_cpu_encode_codes(xall, apl, rpl, l, g0, ng, sv, zv, 4, 0);
    else if (bits == 8 && anchor_bits == 4)
        kv_cpu_encode_codes(xall, apl, rpl, l, g0, ng, sv, zv, 8, 4);
    else if (bits == 16 && anchor_bits == 4)
        kv_cpu_encode_codes(xall, apl, rpl, l, g0, ng, sv, zv, 16, 4);
    else
        kv_cpu_encode_codes(xall, apl, rpl, l, g0, ng, sv, zv, bits, anchor_bits);
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
