/* kernels_cpu_attention.cl — attention for CPU OpenCL devices (PoCL; KV_LANES > 1, KV_ATTN_WG == 1):
 * the page readers (kv_cpu_rd, kv_cpu_row; kv_cpu_ch_tile for KIVI's channel-grouped K), the
 * kv_attention kernel that serves several (query, head) slots per work-group, and the scores of a
 * page (kv_cpu_scores_page, with doubles). Included by
 * kernels.cl where its GPU kv_attention would be, so both see the same helpers and macros; OpenCL only
 * (backends/opencl/embed.cmake inlines it). */

/* How kv_cpu_row reads one page's K or V: the store's constants worked
   out once per page (the layout arithmetic takes divisions, which cost more
   than a chunk's loads and fma). fast: 0 the scalar reader, 1 f32, 2 bf16,
   3 quantized TOKEN groups of a multiple of 16 values with 2, 4 or 8 bits,
   4 quantized CHANNEL groups of a multiple of 16 tokens with 2, 4 or 8 bits
   (K only: full tiles by kv_cpu_ch_tile, 16 tokens of a channel at once;
   kv_cpu_row reads its rows with the scalar reader). */
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
    if (st->l.grouping == 1) { /* CHANNEL: rd.full the stream bytes of a channel in a full block */
        if (gs % 16 == 0 && (pb == 8 || pb == 4 || pb == 2)) {
            rd.fast = 4;
            rd.full = kv_dev_stream_bytes(gs, pb);
            rd.groups = st->groups;
            rd.r = st->anchor_bits ? st->bits - st->anchor_bits : 0;
            rd.mid = (float)((1u << rd.r) - 1u) / 2.0f; /* exact */
        }
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

/* (*hi, *lo) += q * k lane by lane, float-float: the exact product
   (TwoProduct by fma) added by TwoSum to the high part. */
KV_FN_INLINE void kv_cpu_ff_fma16(float16 q, float16 k, float16 *hi, float16 *lo)
{
    float16 p = q * k;
    float16 pe = fma(q, k, -p); /* p + pe = the exact product */
    float16 sh = *hi + p;
    float16 bb = sh - *hi;
    *lo = *lo + (((*hi - (sh - bb)) + (p - bb)) + pe);
    *hi = sh;
}

/* kv_dev_logit_end on 16 lanes: scale * (h + l) as float-float (*oh, *ol). */
KV_FN_INLINE void kv_cpu_ff_end16(float16 h, float16 l, float scale, float16 *oh, float16 *ol)
{
    float16 sh = h + l, bb = sh - h;
    float16 sl = (h - (sh - bb)) + (l - bb);
    float16 rh = sh * (float16)scale;
    float16 rl = fma(sh, (float16)scale, -rh) + sl * (float16)scale;
    *oh = rh + rl;
    float16 b2 = *oh - rh;
    *ol = (rh - (*oh - b2)) + (rl - b2);
}

/* dot(q, k) over nch chunks of 16 (q and k 0 past head_dim) as float-float
   in 16 lanes: *hi + *lo, lane j summing dimensions j, j + 16, ... */
KV_FN_INLINE void kv_cpu_dot16(const float16 *q, const float16 *k, kv_u32 nch, float16 *hio, float16 *loo)
{
    float16 hi = (float16)0.0f, lo = (float16)0.0f;
    for (kv_u32 c = 0; c < nch; c++)
        kv_cpu_ff_fma16(q[c], k[c], &hi, &lo);
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
    kv_cpu_ff_end16(dh, dl, scale, oh, ol);
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
/* Lanes 0-7 from a, 8-15 from b: scale * the double sum, split into a
   float-float pair (*oh, *ol). */
KV_FN_INLINE void kv_cpu_d_end16(double8 a, double8 b, float scale, float16 *oh, float16 *ol)
{
    double8 s0 = a * (double)scale, s1 = b * (double)scale;
    float8 h0 = convert_float8(s0), h1 = convert_float8(s1);
    *oh = (float16)(h0, h1);
    *ol = (float16)(convert_float8(s0 - convert_double8(h0)), convert_float8(s1 - convert_double8(h1)));
}

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
    kv_cpu_d_end16(t3[0], t3[1], scale, oh, ol);
}
#endif

KV_FN_INLINE float kv_cpu_max16f(float16 v)
{
    float8 a = fmax(v.lo, v.hi);
    float4 b = fmax(a.lo, a.hi);
    float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}

/* The metadata of rows t0 .. t0 + nt - 1 (nt <= KV_CPU_TILE) of a store that
   kv_cpu_row reads as quantized TOKEN groups (rd->fast 3), as f32: s[i] the
   scale and z[i] the zero of group t0 * per_row + i. A row's groups follow
   one another, and so do the rows', so the tile's metadata is one run of
   halves, converted 16 at a time (kv_cpu_f16_to_f32_16, kernels_cpu_codec.cl). Other stores: nothing. */
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
        vstore16(kv_cpu_f16_to_f32_16(convert_uint16(vload16(0, m + g0 + i))), 0, s + i);
        vstore16(kv_cpu_f16_to_f32_16(convert_uint16(vload16(0, m + rd->groups + g0 + i))), 0, z + i);
    }
    for (; i < n; i++) {
        s[i] = kv_dev_f16_to_f32(m[g0 + i]);
        z[i] = kv_dev_f16_to_f32(m[rd->groups + g0 + i]);
    }
}

/* Chunks 0 .. nch - 1 of one quantized TOKEN-grouped row (rd->fast 3; code:
   the row's first byte) into out: first the codes, each 16 bytes loaded once
   and converted to 16 integer lanes once (one chunk of 8-bit codes, two of
   4-bit, four of 2-bit; a chunk is then a swizzle, a shift and an and of
   those lanes, and the row's last odd chunks take a short load), then each
   group's chunks with its scale and zero (s[g], z[g]): one branch on the
   width per row, none per chunk (before: one load of 4 or 8 bytes, a byte
   shuffle and a widening per chunk, and the width, anchor and group tests
   in the chunk loop). The same fma per value as before, bit for bit. */
KV_FN_INLINE void kv_cpu_row_tg(KV_GLOBAL const kv_u8 *code, const kv_cpu_rd *rd, int anchor, kv_u32 nch,
                                const float *s, const float *z, float16 *out)
{
    kv_u32 per_group = rd->gs / 16;
    if (rd->pb == 8) { /* one pass: the codes are one load and widening per chunk */
        for (kv_u32 c0 = 0, g = 0; c0 < nch; c0 += per_group, g++) {
            float16 sv = (float16)s[g], zv = (float16)z[g];
            kv_u32 c1 = nch - c0 < per_group ? nch : c0 + per_group;
            for (kv_u32 k = c0; k < c1; k++) {
                uint16 q = convert_uint16(vload16(0, code + 16 * k));
                out[k] = anchor ? fma(convert_float16(q << rd->r) + (float16)rd->mid, sv, zv)
                                : fma(convert_float16(q), sv, zv);
            }
        }
        return;
    }
    uint16 q[KV_CPU_CHUNKS];
    kv_u32 c = 0;
    if (rd->pb == 4) {
        const uint16 sh = (uint16)(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        for (; c + 2 <= nch; c += 2) {
            uint16 b = convert_uint16(vload16(0, code + 8 * c));
            q[c] = (b.s0011223344556677 >> sh) & 15u;
            q[c + 1] = (b.s8899aabbccddeeff >> sh) & 15u;
        }
        if (c < nch)
            q[c] = (convert_uint16(vload8(0, code + 8 * c).s0011223344556677) >> sh) & 15u;
    } else {
        const uint16 sh = (uint16)(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
        for (; c + 4 <= nch; c += 4) {
            uint16 b = convert_uint16(vload16(0, code + 4 * c));
            q[c] = (b.s0000111122223333 >> sh) & 3u;
            q[c + 1] = (b.s4444555566667777 >> sh) & 3u;
            q[c + 2] = (b.s88889999aaaabbbb >> sh) & 3u;
            q[c + 3] = (b.sccccddddeeeeffff >> sh) & 3u;
        }
        for (; c < nch; c++)
            q[c] = (convert_uint16(vload4(0, code + 4 * c).s0000111122223333) >> sh) & 3u;
    }
    for (kv_u32 c0 = 0, g = 0; c0 < nch; c0 += per_group, g++) {
        float16 sv = (float16)s[g], zv = (float16)z[g];
        kv_u32 c1 = nch - c0 < per_group ? nch : c0 + per_group;
        if (anchor) {
            for (kv_u32 k = c0; k < c1; k++)
                out[k] = fma(convert_float16(q[k] << rd->r) + (float16)rd->mid, sv, zv);
        } else {
            for (kv_u32 k = c0; k < c1; k++)
                out[k] = fma(convert_float16(q[k]), sv, zv);
        }
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
        kv_cpu_row_tg(data + st->data + t * rd->row_bytes, rd, st->anchor_bits != 0, nch, s, z, out);
    } else {
        for (kv_u32 c = 0; c < nch; c++)
            out[c] = kv_cpu_row16_scalar(data, aligned, st, t, 16 * c);
    }
}

/* ---- KIVI's channel-grouped K (kv_cpu_rd fast 4), a tile of 16 tokens at a time ----

   A CHANNEL group holds group_size consecutive tokens of one channel; a
   block of group_size tokens stores one bit stream per channel (kv_dev_row_chunk's
   CHANNEL branch), all of the block's length. With group_size a multiple of
   16, a full tile (t0 a multiple of 16, t0 + 16 <= ntok) lies inside one
   block, and channel d's 16 codes are the 2 pb contiguous bytes of its stream
   starting at byte (t0 % group_size) pb / 8: one vector load and a few
   swizzles give 16 tokens' codes, one fma with the channel's scale and zero
   (the same fma as kv_dev_dequant / kv_dev_dequant_anchor, so the values are
   bit for bit the scalar reader's) 16 tokens' values. The dot products then
   accumulate q[d] x that vector in 16 lanes, one per token: the tile's logits
   come out in lanes and need no transposing tree. Partial tiles (a page's
   last tokens), other widths, group sizes and unaligned kv_data keep the
   scalar reader. */

/* The 16 codes of pb (2, 4 or 8) bits in the 2 pb bytes at cc, code i at bits
   [pb i, pb i + pb) (the swizzles of kv_cpu_unpack16). */
KV_FN_INLINE uint16 kv_cpu_ch_codes16(KV_GLOBAL const kv_u8 *cc, kv_u32 pb)
{
    uint16 c;
    if (pb == 8) {
        c = convert_uint16(vload16(0, cc));
    } else if (pb == 4) {
        uint8 b = convert_uint8(vload8(0, cc));
        c.even = b & 0xfu;
        c.odd = b >> 4;
    } else {
        uint4 b = convert_uint4(vload4(0, cc));
        c.even.even = b & 3u;
        c.odd.even = (b >> 2) & 3u;
        c.even.odd = (b >> 4) & 3u;
        c.odd.odd = b >> 6;
    }
    return c;
}

/* Tokens t0 .. t0 + 15 of a page's K read as CHANNEL groups (rd->fast 4;
   t0 % 16 == 0, t0 + 16 <= ntok): kt[d] lane e = element (t0 + e, d) for d <
   cols. s, z: room for cols floats, which get the block's scales and zeros
   (cols of them in a row in the metadata, converted 16 at a time) unless
   *blk says they hold that block's already (the block's earlier tile): set
   *blk = ~0u for each page. */
KV_FN_INLINE void kv_cpu_ch_tile_pb(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_cpu_rd *rd,
                                    kv_u32 t0, kv_u32 pb, kv_u32 *blk, float *s, float *z, float16 *kt)
{
    kv_u32 cols = st->l.cols, gs = rd->gs;
    kv_u32 b = t0 / gs, i0 = t0 - b * gs;
    kv_u32 len = st->l.rows - b * gs < gs ? st->l.rows - b * gs : gs; /* the last block may be short */
    kv_u64 sb = kv_dev_stream_bytes(len, pb);
    KV_GLOBAL const kv_u8 *code = data + st->data + (kv_u64)b * cols * rd->full + (i0 * pb) / 8;
    KV_GLOBAL const kv_u16 *m = KV_CPTR(kv_u16, data, st->meta) + (kv_u64)b * cols;
    for (kv_u32 d = 0; d < cols && b != *blk; d += 16) {
        vstore16(kv_cpu_f16_to_f32_16(convert_uint16(vload16(0, m + d))), 0, s + d);
        vstore16(kv_cpu_f16_to_f32_16(convert_uint16(vload16(0, m + rd->groups + d))), 0, z + d);
    }
    *blk = b;
    if (st->anchor_bits) {
        for (kv_u32 d = 0; d < cols; d++)
            kt[d] = fma(convert_float16(kv_cpu_ch_codes16(code + d * sb, pb) << rd->r) + (float16)rd->mid,
                        (float16)s[d], (float16)z[d]);
    } else {
        for (kv_u32 d = 0; d < cols; d++)
            kt[d] = fma(convert_float16(kv_cpu_ch_codes16(code + d * sb, pb)), (float16)s[d], (float16)z[d]);
    }
}

KV_FN_INLINE void kv_cpu_ch_tile(KV_GLOBAL const kv_u8 *data, const kv_dev_store *st, const kv_cpu_rd *rd, kv_u32 t0,
                                 kv_u32 *blk, float *s, float *z, float16 *kt)
{
    if (rd->pb == 2) /* one copy per width, each with its own constant swizzles */
        kv_cpu_ch_tile_pb(data, st, rd, t0, 2, blk, s, z, kt);
    else if (rd->pb == 4)
        kv_cpu_ch_tile_pb(data, st, rd, t0, 4, blk, s, z, kt);
    else
        kv_cpu_ch_tile_pb(data, st, rd, t0, 8, blk, s, z, kt);
}

/* q as scalars for the channel tile's dot products: double with KV_FP64, else float. */
#if KV_FP64
typedef double kv_cpu_qs;
#else
typedef float kv_cpu_qs;
#endif

/* Lane e of oh[j] + ol[j]: scale * dot(q_j, K row t0 + e) for the n (<= 4,
   a constant where it is inlined) slots q_j = qs[j] (0 past cols), from a
   channel tile kt, as float-float. With KV_FP64 the products are summed in
   double channel by channel (each product of two floats is exact in double),
   each channel's 16 values converted once for the n slots; else TwoProduct
   and TwoSum in float lanes, as kv_cpu_dot16 does along a row. */
KV_FN_INLINE void kv_cpu_ch_dots(const kv_cpu_qs (*qs)[KV_MAX_HEAD_DIM], const float16 *kt, kv_u32 cols, kv_u32 n,
                                 float scale, float16 *oh, float16 *ol)
{
#if KV_FP64
    double8 a[4], b[4];
    for (kv_u32 j = 0; j < n; j++)
        a[j] = b[j] = (double8)0.0;
    for (kv_u32 d = 0; d < cols; d++) {
        double8 k0 = convert_double8(kt[d].lo), k1 = convert_double8(kt[d].hi); /* exact */
        for (kv_u32 j = 0; j < n; j++) {
            a[j] = fma((double8)qs[j][d], k0, a[j]);
            b[j] = fma((double8)qs[j][d], k1, b[j]);
        }
    }
    for (kv_u32 j = 0; j < n; j++)
        kv_cpu_d_end16(a[j], b[j], scale, oh + j, ol + j);
#else
    float16 hi[4], lo[4];
    for (kv_u32 j = 0; j < n; j++)
        hi[j] = lo[j] = (float16)0.0f;
    for (kv_u32 d = 0; d < cols; d++) {
        float16 k = kt[d];
        for (kv_u32 j = 0; j < n; j++)
            kv_cpu_ff_fma16((float16)qs[j][d], k, &hi[j], &lo[j]);
    }
    for (kv_u32 j = 0; j < n; j++)
        kv_cpu_ff_end16(hi[j], lo[j], scale, oh + j, ol + j);
#endif
}

/* kv_cpu_ch_dots for the nr slots qs[0 .. nr): 4 at a time, then one by one. */
KV_FN_INLINE void kv_cpu_ch_logits(const kv_cpu_qs (*qs)[KV_MAX_HEAD_DIM], const float16 *kt, kv_u32 cols, kv_u32 nr,
                                   float scale, float16 *oh, float16 *ol)
{
    kv_u32 j = 0;
    for (; j + 4 <= nr; j += 4)
        kv_cpu_ch_dots(qs + j, kt, cols, 4, scale, oh + j, ol + j);
    for (; j < nr; j++)
        kv_cpu_ch_dots(qs + j, kt, cols, 1, scale, oh + j, ol + j);
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
    int vis[KV_CPU_HEADS][KV_CPU_TILE], vany[KV_CPU_TILE], vall[KV_CPU_TILE], anyq[KV_CPU_HEADS], seen[KV_CPU_HEADS];
    float16 row2[KV_CPU_CHUNKS]; /* the second V row of a pair */
    kv_u32 qpos[KV_CPU_HEADS], sq[KV_CPU_HEADS]; /* sq[j]: slot j's query (j / nh), no division in the loops */
    kv_cpu_qs qs[KV_CPU_HEADS][KV_MAX_HEAD_DIM]; /* q as scalars, for a channel tile (K rd.fast 4) */
    float16 kt[KV_MAX_HEAD_DIM], clh[KV_CPU_HEADS], cll[KV_CPU_HEADS]; /* the tile; its logits per slot */

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
                vstore8(qd[j][2 * c], 0, qs[j] + 16 * c);
                vstore8(qd[j][2 * c + 1], 0, qs[j] + 16 * c + 8);
#else
                vstore16(qv[j][c], 0, qs[j] + 16 * c);
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
            kv_u32 kblk = ~0u; /* the block whose K metadata ks, kz hold (kv_cpu_ch_tile) */
            for (kv_u32 t0 = 0; t0 < pg.ntok; t0 += KV_CPU_TILE) {
                kv_u32 nt = pg.ntok - t0 < KV_CPU_TILE ? pg.ntok - t0 : KV_CPU_TILE;
                int any = 0;
                for (kv_u32 iq = 0; iq < nq; iq++)
                    anyq[iq] = 0;
                for (kv_u32 e = 0; e < KV_CPU_TILE; e++) {
                    kv_u32 pos = positions[pg.pos_index + t0 + (e < nt ? e : 0)];
                    vany[e] = 0;
                    vall[e] = e < nt;
                    for (kv_u32 iq = 0; iq < nq; iq++) {
                        vis[iq][e] = e < nt && pos <= qpos[iq];
                        anyq[iq] |= vis[iq][e];
                        vany[e] |= vis[iq][e];
                        vall[e] &= vis[iq][e];
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
                   lanes added by one transposing tree (kv_cpu_ff_tree). A
                   full tile of channel-grouped K (rd.fast 4) is read channel
                   by channel instead, its logits in lanes (kv_cpu_ch_tile,
                   kv_cpu_ch_logits). */
                int chan = krd.fast == 4 && nt == KV_CPU_TILE;
                if (chan) {
                    for (kv_u32 e = 0; e < n2; e++) {
                        kv_cpu_prefetch_rows(data, nks, nkr, tn + e, 1);
                        kv_cpu_prefetch_rows(data, nvs, nvr, tn + e, 1);
                    }
                    kv_cpu_ch_tile(data, &pg.k, &krd, t0, &kblk, ks, kz, kt);
                    kv_cpu_ch_logits(qs, kt, head_dim, nr, scale, clh, cll);
                }
                for (kv_u32 e = 0; e < KV_CPU_TILE && !chan; e++) {
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
                    float16 lh = clh[j], ll = cll[j];
                    if (!chan) {
#if KV_FP64
                        kv_cpu_d_tree(dd[j], scale, &lh, &ll);
#else
                        kv_cpu_ff_tree(dh[j], dl[j], scale, &lh, &ll);
#endif
                    }
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
                /* 3. The tile's weighted V, each row decoded once for every slot. Two
                   rows at once when every slot sees both (each accumulator is loaded
                   and stored once for the two: the same fma in the same order, bit
                   for bit), else row by row. */
                for (kv_u32 e = 0; e < nt; e++) {
                    if (!vany[e])
                        continue;
                    kv_cpu_row(data, aligned, &pg.v, &vrd, t0 + e, nch, vs + e * vrd.per_row, vz + e * vrd.per_row,
                               row);
                    if (e + 1 < nt && vall[e] && vall[e + 1]) {
                        kv_cpu_row(data, aligned, &pg.v, &vrd, t0 + e + 1, nch, vs + (e + 1) * vrd.per_row,
                                   vz + (e + 1) * vrd.per_row, row2);
                        kv_u32 j4 = 0;
                        for (; j4 + 4 <= nr; j4 += 4) {
                            float16 w0 = (float16)pr[j4][e], w1 = (float16)pr[j4 + 1][e];
                            float16 w2 = (float16)pr[j4 + 2][e], w3 = (float16)pr[j4 + 3][e];
                            float16 x0 = (float16)pr[j4][e + 1], x1 = (float16)pr[j4 + 1][e + 1];
                            float16 x2 = (float16)pr[j4 + 2][e + 1], x3 = (float16)pr[j4 + 3][e + 1];
                            for (kv_u32 c = 0; c < nch; c++) {
                                float16 r = row[c], r2 = row2[c];
                                acc[j4][c] = fma(x0, r2, fma(w0, r, acc[j4][c]));
                                acc[j4 + 1][c] = fma(x1, r2, fma(w1, r, acc[j4 + 1][c]));
                                acc[j4 + 2][c] = fma(x2, r2, fma(w2, r, acc[j4 + 2][c]));
                                acc[j4 + 3][c] = fma(x3, r2, fma(w3, r, acc[j4 + 3][c]));
                            }
                        }
                        for (kv_u32 j = j4; j < nr; j++) {
                            float16 pw = (float16)pr[j][e], px = (float16)pr[j][e + 1];
                            for (kv_u32 c = 0; c < nch; c++)
                                acc[j][c] = fma(px, row2[c], fma(pw, row[c], acc[j][c]));
                        }
                        e++;
                        continue;
                    }
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

#if KV_FP64
/* The scores of one page's tokens on CPU devices with doubles, when a KV
   head's (query head, query) slots fit in KV_CPU_HEADS: as the kernel below
   (per token, the largest over the group's heads of sum over queries of
   e^(logit - M) / l), but KV_CPU_TILE tokens at a time as kv_attention does
   it: each K row decoded once, the dot products in double (kv_cpu_dot_d4 /
   kv_cpu_dot_d; q converted once per page), the tile's logits by
   kv_cpu_d_tree and e^ on 16 tokens at once; a full tile of channel-grouped
   K (rd.fast 4) by kv_cpu_ch_tile and kv_cpu_ch_logits. Writes scores[0 ..
   min(ntok, room)). ks, kz: room for a tile's metadata (KV_CPU_META). */
KV_FN_INLINE void kv_cpu_scores_page(KV_GLOBAL const float *qall, KV_GLOBAL const kv_u32 *qpos,
                                     KV_GLOBAL const kv_u32 *positions, KV_GLOBAL const kv_u8 *data, int aligned,
                                     const kv_dev_page *pg, const kv_cpu_rd *krd, KV_GLOBAL const float *ml,
                                     KV_GLOBAL float *scores, kv_u64 room, kv_u32 kh, kv_u32 group, kv_u32 n_queries,
                                     kv_u32 n_heads, kv_u32 head_dim, float scale, float *ks, float *kz)
{
    double8 qd[KV_CPU_HEADS][2 * KV_CPU_CHUNKS], dd[KV_CPU_HEADS][KV_CPU_TILE], kd[2 * KV_CPU_CHUNKS];
    float16 row[KV_CPU_CHUNKS], qc[KV_CPU_CHUNKS];
    kv_cpu_qs qs[KV_CPU_HEADS][KV_MAX_HEAD_DIM];                                      /* q as scalars */
    float16 kt[KV_MAX_HEAD_DIM], clh[KV_CPU_HEADS], cll[KV_CPU_HEADS]; /* a channel tile; its logits */
    kv_u32 kblk = ~0u;
    kv_u32 nch = (head_dim + 15) / 16, nr = group * n_queries; /* slot j = hh * n_queries + qi */
    for (kv_u32 j = 0; j < nr; j++) {
        kv_u32 hh = j / n_queries, qi = j % n_queries;
        kv_cpu_q16(qall + ((kv_u64)qi * n_heads + kh * group + hh) * head_dim, head_dim, qc);
        for (kv_u32 c = 0; c < nch; c++) {
            qd[j][2 * c] = convert_double8(qc[c].lo);
            qd[j][2 * c + 1] = convert_double8(qc[c].hi);
            vstore8(qd[j][2 * c], 0, qs[j] + 16 * c);
            vstore8(qd[j][2 * c + 1], 0, qs[j] + 16 * c + 8);
        }
    }
    kv_u32 ntok = pg->ntok < room ? pg->ntok : (kv_u32)room;
    for (kv_u32 t0 = 0; t0 < ntok; t0 += KV_CPU_TILE) {
        kv_u32 nt = ntok - t0 < KV_CPU_TILE ? ntok - t0 : KV_CPU_TILE;
        kv_cpu_meta(data, &pg->k, krd, t0, nt, ks, kz);
        int chan = krd->fast == 4 && nt == KV_CPU_TILE;
        if (chan) {
            kv_cpu_ch_tile(data, &pg->k, krd, t0, &kblk, ks, kz, kt);
            kv_cpu_ch_logits(qs, kt, head_dim, nr, scale, clh, cll);
        }
        for (kv_u32 e = 0; e < KV_CPU_TILE && !chan; e++) {
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
                float16 lh = clh[hh * n_queries + qi], ll = cll[hh * n_queries + qi];
                if (!chan)
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
