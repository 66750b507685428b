/* test_kernels_numerics.c — the scalar numerics (backends/numerics.h) against
 * the compiler's IEEE conversions and against hand-worked values. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "backends/numerics.h"
#include "core/base/rng.h"

static uint16_t f16_oracle(float f) /* GCC's _Float16 conversion: IEEE round to nearest even */
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static int is_f16_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static void check_f16(float f)
{
    uint16_t got = kv_f16_from_f32(f), want = f16_oracle(f);
    if (isnan(f))
        cr_assert(is_f16_nan(got) && (got & 0x8000u) == (kv_f32_bits(f) >> 16 & 0x8000u),
                  "NaN 0x%08x → 0x%04x", kv_f32_bits(f), got);
    else
        cr_assert_eq(got, want, "fp16(%a) (bits 0x%08x): got 0x%04x, want 0x%04x", (double)f, kv_f32_bits(f), got,
                     want);
}

Test(fp16, every_half_round_trips_and_widens_exactly)
{
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t u = (uint16_t)h;
        memcpy(&ref, &u, 2);
        float f = kv_f16_to_f32(u);
        if (is_f16_nan(u)) {
            cr_assert(isnan(f));
            continue;
        }
        cr_assert_eq(kv_f32_bits(f), kv_f32_bits((float)ref), "half 0x%04x", h);
        cr_assert_eq(kv_f16_from_f32(f), u, "half 0x%04x does not round-trip", h);
    }
}

Test(fp16, midpoints_and_neighbours_round_to_nearest_even)
{
    /* between each pair of adjacent finite halves: the midpoint and the floats on either side */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float lo = kv_f16_to_f32((uint16_t)h), hi = kv_f16_to_f32((uint16_t)(h + 1));
        float mid = lo + (hi - lo) / 2; /* exact: both are halves */
        check_f16(mid);
        check_f16(-mid);
        check_f16(nextafterf(mid, 0));
        check_f16(nextafterf(mid, INFINITY));
    }
    /* overflow: 65504 + 16 is the tie between 65504 and 65536: rounds to Inf */
    check_f16(65519.996f);
    check_f16(65520.0f);
    cr_assert_eq(kv_f16_from_f32(65520.0f), 0x7c00);
    cr_assert_eq(kv_f16_from_f32(65519.0f), 0x7bff);
    cr_assert_eq(kv_f16_from_f32(-1e9f), 0xfc00);
    cr_assert_eq(kv_f16_from_f32(INFINITY), 0x7c00);
    /* subnormals and underflow: 2^-25 ties to 0, just above rounds to 2^-24 */
    cr_assert_eq(kv_f16_from_f32(0x1p-25f), 0x0000);
    cr_assert_eq(kv_f16_from_f32(nextafterf(0x1p-25f, 1)), 0x0001);
    cr_assert_eq(kv_f16_from_f32(0x1.8p-24f), 0x0002); /* 1.5 units: tie to even 2 */
    cr_assert_eq(kv_f16_from_f32(-0x1p-14f), 0x8400);
    cr_assert_eq(kv_f16_from_f32(-0.0f), 0x8000);
}

Test(fp16, random_bit_patterns_match_the_compiler)
{
    kv_rng rng;
    kv_rng_seed(&rng, 1);
    for (int i = 0; i < 2000000; i++)
        check_f16(kv_f32_from_bits((uint32_t)kv_rng_u64(&rng)));
    /* and the dense range where halves live */
    for (int i = 0; i < 1000000; i++)
        check_f16((float)(kv_rng_normal(&rng) * pow(2.0, (double)kv_rng_below(&rng, 44) - 28.0)));
}

Test(fp16, metadata_saturates_instead_of_overflowing)
{
    cr_assert_eq(kv_f16_from_f32_sat(1e6f), 0x7bff);
    cr_assert_eq(kv_f16_from_f32_sat(-1e6f), 0xfbff);
    cr_assert_eq(kv_f16_from_f32_sat(INFINITY), 0x7bff);
    cr_assert_eq(kv_f16_from_f32_sat(65504.0f), 0x7bff);
    cr_assert_eq(kv_f16_from_f32_sat(1.0f), 0x3c00);
}

Test(bf16, round_to_nearest_even_by_hand)
{
    cr_assert_eq(kv_bf16_from_f32(1.0f), 0x3f80);
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x3f808000u)), 0x3f80); /* tie, even below */
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x3f818000u)), 0x3f82); /* tie, even above */
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x3f808001u)), 0x3f81);
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX overflows to Inf */
    cr_assert_eq(kv_bf16_from_f32(-INFINITY), 0xff80);
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x7f800001u)), 0x7fc0); /* signalling NaN becomes quiet */
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0xffc12345u)), 0xffc1);
    cr_assert_eq(kv_bf16_from_f32(kv_f32_from_bits(0x00008000u)), 0x0000); /* subnormal tie to even */
    cr_assert_eq(kv_bf16_to_f32(0x4049), 3.140625f);
}

/* q = clamp(rint((x − z) / s)) by hand: x = {1, 2.5, 3.5, 4.5, 16}, b = 4:
   mn = 1, mx = 16, s = 15/15 = 1, z = 1; (x − z) = 0, 1.5, 2.5, 3.5, 15 →
   rint half-even: 0, 2, 2, 4, 15. */
Test(quant, codes_by_hand_round_half_even)
{
    kv_qparams p = kv_quant_params(1.0f, 16.0f, 1, 4);
    cr_assert_eq(p.scale_h, 0x3c00);
    cr_assert_eq(p.zero_h, 0x3c00);
    float x[] = {1.0f, 2.5f, 3.5f, 4.5f, 16.0f};
    uint16_t want[] = {0, 2, 2, 4, 15};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(kv_quant_code(x[i], p.s, p.z, 4), want[i], "x = %g", (double)x[i]);
}

/* The metadata rounds first and the codes use the rounded values: x in
   [0.1, 0.7], b = 8: scale = fp16(0.6/255) = fp16(0.0023529...) = 0x18d2
   (0.0023536682), zero = fp16(0.1) = 0x2e66 (0.099975586). */
Test(quant, metadata_rounds_to_fp16_before_coding)
{
    kv_qparams p = kv_quant_params(0.1f, 0.7f, 1, 8);
    cr_assert_eq(p.scale_h, 0x18d2, "got 0x%04x", p.scale_h);
    cr_assert_eq(p.zero_h, 0x2e66, "got 0x%04x", p.zero_h);
    cr_assert_eq(p.s, 0.0023536682128906250f);
    cr_assert_eq(p.z, 0.0999755859375f);
    /* 0.7: (0.7 − 0.0999755859) / 0.0023536682 = 254.93 → 255 */
    cr_assert_eq(kv_quant_code(0.7f, p.s, p.z, 8), 255);
    /* 0.1: 0.0000244/0.00235 = 0.0104 → 0 */
    cr_assert_eq(kv_quant_code(0.1f, p.s, p.z, 8), 0);
    /* 0.4: 0.3000244/0.0023536682 = 127.47 → 127 */
    cr_assert_eq(kv_quant_code(0.4f, p.s, p.z, 8), 127);
}

Test(quant, non_finite_values_and_constant_groups)
{
    /* group {NaN, −Inf, +Inf, 1, 3}, b = 1: finite min 1, max 3, s = 2, z = 1 */
    kv_qparams p = kv_quant_params(1.0f, 3.0f, 1, 1);
    cr_assert_eq(p.scale_h, 0x4000);
    cr_assert_eq(p.zero_h, 0x3c00);
    cr_assert_eq(kv_quant_code(NAN, p.s, p.z, 1), 0);
    cr_assert_eq(kv_quant_code(-INFINITY, p.s, p.z, 1), 0);
    cr_assert_eq(kv_quant_code(INFINITY, p.s, p.z, 1), 1);
    cr_assert_eq(kv_quant_code(1.0f, p.s, p.z, 1), 0);
    cr_assert_eq(kv_quant_code(3.0f, p.s, p.z, 1), 1);
    /* no finite value: scale 0, zero 0 */
    kv_qparams none = kv_quant_params(0, 0, 0, 8);
    cr_assert_eq(none.scale_h, 0);
    cr_assert_eq(none.zero_h, 0);
    /* constant group: scale 0, every finite code 0, +Inf still 2^b − 1 (N4) */
    kv_qparams c = kv_quant_params(2.5f, 2.5f, 1, 16);
    cr_assert_eq(c.scale_h, 0);
    cr_assert_eq(c.zero_h, 0x4100);
    cr_assert_eq(kv_quant_code(2.5f, c.s, c.z, 16), 0);
    cr_assert_eq(kv_quant_code(INFINITY, c.s, c.z, 16), 65535);
    cr_assert_eq(kv_dequant(0, c.s, c.z), 2.5f);
    /* −0 is canonicalised: a group of −0 stores zero +0 (N3) */
    kv_qparams z = kv_quant_params(-0.0f, -0.0f, 1, 4);
    cr_assert_eq(z.zero_h, 0x0000);
    cr_assert_eq(z.scale_h, 0x0000);
}

Test(quant, overflowing_metadata_saturates_and_dequantizes_finitely)
{
    kv_qparams p = kv_quant_params(-1e6f, 1e6f, 1, 8);
    cr_assert_eq(p.zero_h, 0xfbff); /* −65504 */
    cr_assert_eq(p.scale_h, kv_f16_from_f32(2e6f / 255.0f));
    kv_qparams q = kv_quant_params(-3e38f, 3e38f, 1, 4); /* mx − mn overflows fp32 */
    cr_assert_eq(q.scale_h, 0x7bff);
    cr_assert(isfinite(kv_dequant(15, q.s, q.z)));
}

Test(quant, dequant_and_midpoint_by_hand)
{
    cr_assert_eq(kv_dequant(3, 0.5f, -1.0f), 0.5f);
    /* b = 8, a = 4, r = 4: anchor 5 covers codes 80..95, midpoint 87.5 */
    cr_assert_eq(kv_dequant_anchor(5, 4, 0.5f, -1.0f), 87.5f * 0.5f - 1.0f);
    /* b = 16, a = 4, r = 12: midpoint of codes A*4096 .. A*4096 + 4095 */
    cr_assert_eq(kv_dequant_anchor(15, 12, 1.0f, 0.0f), 61440.0f + 2047.5f);
    cr_assert_eq(kv_split_anchor(0xabcd, 16, 4), 0xa);
    cr_assert_eq(kv_split_residual(0xabcd, 16, 4), 0xbcd);
    cr_assert_eq(kv_merge_code(0xa, 0xbcd, 16, 4), 0xabcd);
    cr_assert_eq(kv_split_anchor(0x1ff, 8, 3), 0x7); /* bits above b are ignored */
}

/* Round trip error bound for b = 2..16: |x̂ − x| <= s/2 plus what the fp16
   rounding of the metadata moved the grid (|mn − z| below, the top of the
   grid versus mx above) plus a few fp32 ulps of the arithmetic. Anchor-only
   reconstruction: within (2^r − 1)/2 · s + 1/2 s of the same slack. */
Test(quant, round_trip_error_is_bounded)
{
    kv_rng rng;
    kv_rng_seed(&rng, 2);
    float x[64];
    for (unsigned bits = 2; bits <= 16; bits++)
        for (int trial = 0; trial < 200; trial++) {
            double sd = pow(10.0, (double)kv_rng_below(&rng, 6) - 3.0);
            double off = kv_rng_normal(&rng) * sd * 3;
            float mn = INFINITY, mx = -INFINITY;
            for (int i = 0; i < 64; i++) {
                x[i] = (float)(off + kv_rng_normal(&rng) * sd);
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            kv_qparams p = kv_quant_params(mn, mx, 1, bits);
            double top = (double)p.z + (double)kv_code_max(bits) * p.s;
            double slack = fabs((double)mn - p.z) + fmax(0.0, (double)mx - top) + 8 * (fabs(mn) + fabs(mx)) * 0x1p-24;
            for (int i = 0; i < 64; i++) {
                uint16_t q = kv_quant_code(x[i], p.s, p.z, bits);
                double err = fabs((double)kv_dequant(q, p.s, p.z) - x[i]);
                cr_assert(err <= p.s / 2 + slack, "b=%u x=%g err=%g s=%g slack=%g", bits, (double)x[i], err,
                          (double)p.s, slack);
                for (unsigned a = 1; a < bits; a += 3) {
                    unsigned r = bits - a;
                    double ea = fabs((double)kv_dequant_anchor(kv_split_anchor(q, bits, a), r, p.s, p.z) - x[i]);
                    cr_assert(ea <= ((double)kv_code_max(r) / 2 + 0.5) * p.s + slack, "b=%u a=%u err=%g", bits, a,
                              ea);
                }
            }
        }
}
