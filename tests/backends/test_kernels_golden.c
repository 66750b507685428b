/* test_kernels_golden.c — hand-worked cases through the backend interface on
 * both CPU devices (fast and reference): layouts, packed bytes, KIVI channel
 * groups, split planes, argument checks. */
#include <criterion/criterion.h>

#include "backends/backend.h"
#include "backends/numerics.h"
#include "tests/kernels_util.h"

Test(layout, group_counts_lengths_and_offsets)
{
    /* 2 rows x 5 cols, G = 2, token groups: lengths 2, 2, 1 per row */
    kv_quant_layout t = {2, 5, 2, KV_GROUP_TOKEN};
    cr_assert_eq(kv_layout_groups(&t), 6);
    cr_assert_eq(kv_layout_group_len(&t, 2), 1);
    cr_assert_eq(kv_layout_group_len(&t, 3), 2);
    cr_assert_eq(kv_layout_packed_bytes(&t, 3), 6);       /* 1 + 1 + 1 bytes a row */
    cr_assert_eq(kv_layout_group_offset(&t, 3, 4), 4);    /* row 1, second group */
    cr_assert_eq(kv_layout_packed_bytes(&t, 5), 2 * (2 + 2 + 1));
    cr_assert_eq(kv_layout_group_offset(&t, 5, 5), 5 + 4);
    /* 5 rows x 3 cols, G = 2, channel groups: blocks of rows {0,1}, {2,3}, {4} */
    kv_quant_layout c = {5, 3, 2, KV_GROUP_CHANNEL};
    cr_assert_eq(kv_layout_groups(&c), 9);
    cr_assert_eq(kv_layout_group_len(&c, 7), 1);
    cr_assert_eq(kv_layout_packed_bytes(&c, 7), 3 * (2 + 2 + 1));
    cr_assert_eq(kv_layout_group_offset(&c, 7, 7), 2 * 3 * 2 + 1 * 1);
    cr_assert_eq(kv_layout_meta_bytes(&c), 36);
    kv_quant_layout empty = {0, 128, 32, KV_GROUP_TOKEN};
    cr_assert_eq(kv_layout_groups(&empty), 0);
    cr_assert_eq(kv_layout_packed_bytes(&empty, 4), 0);
}

static void for_both_devices(void (*fn)(kv_backend *be))
{
    for (int d = 0; d < 2; d++) {
        kv_backend *be = kvt_open("cpu", d);
        fn(be);
        kv_backend_close(be);
    }
}

/* 3-bit codes {1,2,3,4,5}: stream 1 | 2<<3 | 3<<6 | 4<<9 | 5<<12 = 0x58d1 → d1 58. */
static void pack_by_hand(kv_backend *be)
{
    uint16_t codes[5] = {1, 2, 3, 4, 5};
    kv_quant_layout l = {1, 5, 5, KV_GROUP_TOKEN};
    kv_buffer *bc = kvt_put(be, codes, 10), *bp = kvt_fill(be, 2, 0xff);
    kv_pack_args a = {l, 3, {bc, 0}, {bp, 0}};
    kv_error err = {0};
    cr_assert_eq(kv_backend_pack(be, &a, &err), KV_OK, "%s", err.msg);
    uint8_t *got = kvt_get(be, bp, 2);
    cr_assert_eq(got[0], 0xd1);
    cr_assert_eq(got[1], 0x58); /* the unused top bit is 0 */
    free(got);
    /* two groups of 2 (+1): each starts on a byte: {1,2} → 0x11, {3,4} → 0x23, {5} → 0x05 */
    kv_quant_layout l2 = {1, 5, 2, KV_GROUP_TOKEN};
    kv_buffer *bp2 = kvt_fill(be, 3, 0xff);
    kv_pack_args a2 = {l2, 3, {bc, 0}, {bp2, 0}};
    cr_assert_eq(kv_backend_pack(be, &a2, &err), KV_OK, "%s", err.msg);
    got = kvt_get(be, bp2, 3);
    cr_assert_eq(got[0], 0x11);
    cr_assert_eq(got[1], 0x23);
    cr_assert_eq(got[2], 0x05);
    free(got);
    kv_buffer_free(be, bc), kv_buffer_free(be, bp), kv_buffer_free(be, bp2);
}

Test(golden, pack_by_hand)
{
    for_both_devices(pack_by_hand);
}

/* KIVI: a 4 x 2 matrix grouped per channel over 2 tokens, b = 2:
   column 0 = {0, 3, 1, 1}, column 1 = {10, 10, 4, 7}. Groups in order:
   (rows 0-1, col 0) s = 3/3 = 1, z = 0, codes 0, 3; (rows 0-1, col 1)
   constant: s = 0, z = 10; (rows 2-3, col 0) constant: z = 1; (rows 2-3,
   col 1) s = 1, z = 4, codes 0, 3. */
static void kivi_by_hand(kv_backend *be)
{
    float x[8] = {0, 10, 3, 10, 1, 4, 1, 7};
    kv_quant_layout l = {4, 2, 2, KV_GROUP_CHANNEL};
    kv_buffer *bx = kvt_put(be, x, 32), *bc = kvt_fill(be, 16, 0xff), *bs = kvt_fill(be, 8, 0xff),
              *bz = kvt_fill(be, 8, 0xff), *bp = kvt_fill(be, 4, 0xff);
    kv_error err = {0};
    kv_quantize_args q = {l, 2, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_quantize(be, &q, &err), KV_OK, "%s", err.msg);
    kv_encode_args e = {l, 2, 0, {bx, 0}, {bp, 0}, {NULL, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    uint16_t *codes = kvt_get(be, bc, 16), *s = kvt_get(be, bs, 8), *z = kvt_get(be, bz, 8);
    uint8_t *packed = kvt_get(be, bp, 4);
    uint16_t want_codes[8] = {0, 0, 3, 0, 0, 0, 0, 3};
    uint16_t want_s[4] = {kv_f16_from_f32(1.0f), 0, 0, kv_f16_from_f32(1.0f)};
    uint16_t want_z[4] = {0, kv_f16_from_f32(10.0f), kv_f16_from_f32(1.0f), kv_f16_from_f32(4.0f)};
    for (int i = 0; i < 8; i++)
        cr_assert_eq(codes[i], want_codes[i], "code %d: %u", i, codes[i]);
    for (int g = 0; g < 4; g++) {
        cr_assert_eq(s[g], want_s[g], "scale %d: 0x%04x", g, s[g]);
        cr_assert_eq(z[g], want_z[g], "zero %d: 0x%04x", g, z[g]);
    }
    /* one byte per group: {0,3} → 0x0c, {0,0} → 0, {0,0} → 0, {0,3} → 0x0c */
    cr_assert_eq(packed[0], 0x0c);
    cr_assert_eq(packed[1], 0x00);
    cr_assert_eq(packed[2], 0x00);
    cr_assert_eq(packed[3], 0x0c);
    free(codes), free(s), free(z), free(packed);
    kv_buffer_free(be, bx), kv_buffer_free(be, bc), kv_buffer_free(be, bs), kv_buffer_free(be, bz);
    kv_buffer_free(be, bp);
}

Test(golden, kivi_channel_groups_by_hand)
{
    for_both_devices(kivi_by_hand);
}

/* Lynx split of one group of 4 values at b = 8, a = 3: x = {0, 51, 204, 255}
   gives s = 1, z = 0, codes = x; anchors = q >> 5 = {0, 1, 6, 7} (3 bits:
   0 | 1<<3 | 6<<6 | 7<<9 = 0x0f88 → 88 0f), residuals = q & 31 =
   {0, 19, 12, 31} (5 bits: 0 | 19<<5 | 12<<10 | 31<<15 = 0xfb260 → 60 b2 0f);
   anchor-only values: (A*32 + 15.5)*1 + 0 = {15.5, 47.5, 207.5, 239.5}. */
static void lynx_by_hand(kv_backend *be)
{
    float x[4] = {0, 51, 204, 255};
    kv_quant_layout l = {1, 4, 4, KV_GROUP_TOKEN};
    kv_buffer *bx = kvt_put(be, x, 16), *ba = kvt_fill(be, 2, 0xff), *br = kvt_fill(be, 3, 0xff),
              *bs = kvt_fill(be, 2, 0xff), *bz = kvt_fill(be, 2, 0xff), *bo = kvt_fill(be, 16, 0xff);
    kv_error err = {0};
    kv_encode_args e = {l, 8, 3, {bx, 0}, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    uint8_t *a = kvt_get(be, ba, 2), *r = kvt_get(be, br, 3);
    cr_assert_eq(a[0], 0x88);
    cr_assert_eq(a[1], 0x0f);
    cr_assert_eq(r[0], 0x60);
    cr_assert_eq(r[1], 0xb2);
    cr_assert_eq(r[2], 0x0f);
    kv_decode_args d = {l, 8, 3, {ba, 0}, {NULL, 0}, {bs, 0}, {bz, 0}, {bo, 0}};
    cr_assert_eq(kv_backend_decode(be, &d, &err), KV_OK, "%s", err.msg);
    float *o = kvt_get(be, bo, 16);
    float want[4] = {15.5f, 47.5f, 207.5f, 239.5f};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(o[i], want[i], "anchor-only %d: %g", i, (double)o[i]);
    free(o);
    kv_decode_args full = {l, 8, 3, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}, {bo, 0}};
    cr_assert_eq(kv_backend_decode(be, &full, &err), KV_OK, "%s", err.msg);
    o = kvt_get(be, bo, 16);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(o[i], x[i]);
    free(o), free(a), free(r);
    kv_buffer_free(be, bx), kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs);
    kv_buffer_free(be, bz), kv_buffer_free(be, bo);
}

Test(golden, lynx_split_by_hand)
{
    for_both_devices(lynx_by_hand);
}

static void bad_arguments(kv_backend *be)
{
    kv_error err = {0};
    kv_buffer *small = kvt_fill(be, 8, 0);
    kv_quant_layout l = {4, 4, 4, KV_GROUP_TOKEN};
    kv_quantize_args q = {l, 4, {small, 0}, {small, 0}, {small, 0}, {small, 0}};
    cr_assert_eq(kv_backend_quantize(be, &q, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "quantize") && strstr(err.msg, "'x'"), "%s", err.msg);
    q.bits = 17;
    cr_assert_eq(kv_backend_quantize(be, &q, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "bits must be 1..16"), "%s", err.msg);
    q.bits = 4;
    q.x.offset = 2;
    cr_assert_eq(kv_backend_quantize(be, &q, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "multiple of 4"), "%s", err.msg);
    kv_split_args s = {4, 8, 8, {small, 0}, {small, 0}, {small, 0}};
    cr_assert_eq(kv_backend_split(be, &s, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "anchor_bits"), "%s", err.msg);
    kv_encode_args e = {l, 8, 4, {small, 0}, {small, 0}, {NULL, 0}, {small, 0}, {small, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "residual_packed"), "%s", err.msg);
    kv_buffer_free(be, small);
}

Test(golden, bad_arguments_are_input_errors)
{
    for_both_devices(bad_arguments);
}

Test(golden, unknown_backends_and_devices)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open("nosuch", 0, &be, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "built: cpu"), "%s", err.msg);
    cr_assert_eq(kv_backend_open("cpu", 2, &be, &err), KV_EINPUT);
    cr_assert_null(be);
    be = kvt_open("cpu", 0);
    kv_backend_props props;
    cr_assert_eq(kv_backend_get_props(be, &props), KV_OK);
    cr_assert_str_eq(props.backend, "cpu");
    cr_assert(props.compute_units >= 1);
    kv_backend_close(be);
    kv_backend_close(NULL);
}

/* Attention by hand: one KV head, head_dim 1, two f32 tokens k = {0, ln 3},
   v = {4, 8}, two query heads (GQA 2), two queries at positions 1 and 0.
   Query 0, head 0 (q = 1): p = {1/4, 3/4}, out = 7; head 1 (q = −1):
   p = {3/4, 1/4}, out = 5. Query 1 sees token 0 only: out = 4 for both.
   Scores: token 0: head 0: 1/4 + 1, head 1: 3/4 + 1 → max 1.75; token 1:
   head 0: 3/4, head 1: 1/4 → 0.75. */
static void attention_by_hand(kv_backend *be)
{
    float kv[4] = {0.0f, logf(3.0f), 4.0f, 8.0f};
    kv_page_desc page = {2, 0, {KV_STORE_F32, 0, 0, 0, 0}, {KV_STORE_F32, 0, 0, 0, 0}, 0, 0, 8, 0};
    uint32_t head_pages[2] = {0, 1}, positions[2] = {0, 1}, q_pos[2] = {1, 0};
    float q[4] = {1.0f, -1.0f, 1.0f, -1.0f};
    kv_buffer *bkv = kvt_put(be, kv, 16), *bpg = kvt_put(be, &page, sizeof page), *bhp = kvt_put(be, head_pages, 8),
              *bpos = kvt_put(be, positions, 8), *bqp = kvt_put(be, q_pos, 8), *bq = kvt_put(be, q, 16),
              *bo = kvt_fill(be, 16, 0xff), *bs = kvt_fill(be, 8, 0xff);
    kv_attention_args a = {2, 2, 1, 1, 1, 2, 1.0f, {bq, 0}, {bqp, 0}, {bpg, 0}, {bhp, 0}, {bpos, 0}, {bkv, 0},
                           {bo, 0}, {bs, 0}};
    kv_error err = {0};
    cr_assert_eq(kv_backend_attention(be, &a, &err), KV_OK, "%s", err.msg);
    float *o = kvt_get(be, bo, 16), *s = kvt_get(be, bs, 8);
    float want[4] = {7.0f, 5.0f, 4.0f, 4.0f};
    for (int i = 0; i < 4; i++)
        cr_assert_float_eq(o[i], want[i], 1e-5, "out %d = %g", i, (double)o[i]);
    cr_assert_float_eq(s[0], 1.75f, 1e-6, "score 0 = %g", (double)s[0]);
    cr_assert_float_eq(s[1], 0.75f, 1e-6, "score 1 = %g", (double)s[1]);
    /* a query that sees no token gets 0 */
    uint32_t early[2] = {0, 0};
    positions[0] = 5;
    positions[1] = 6;
    cr_assert_eq(kv_buffer_write(be, bpos, 0, positions, 8, &err), KV_OK);
    cr_assert_eq(kv_buffer_write(be, bqp, 0, early, 8, &err), KV_OK);
    cr_assert_eq(kv_backend_attention(be, &a, &err), KV_OK, "%s", err.msg);
    free(o);
    o = kvt_get(be, bo, 16);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(o[i], 0.0f);
    /* a page that points outside kv_data is an input error */
    page.value_data = 12;
    cr_assert_eq(kv_buffer_write(be, bpg, 0, &page, sizeof page, &err), KV_OK);
    cr_assert_eq(kv_backend_attention(be, &a, &err), KV_EINPUT);
    cr_assert(strstr(err.msg, "page 0 value data"), "%s", err.msg);
    free(o), free(s);
    kv_buffer *all[] = {bkv, bpg, bhp, bpos, bqp, bq, bo, bs};
    for (int i = 0; i < 8; i++)
        kv_buffer_free(be, all[i]);
}

Test(golden, attention_by_hand)
{
    for_both_devices(attention_by_hand);
}
