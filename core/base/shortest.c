/* shortest.c — the shortest round-trip decimal of a double, by the Ryu algorithm (Ulf Adams, "Ryū: fast
 * float-to-string conversion", PLDI 2018); names (mmShift, vmIsTrailingZeros) follow the paper's.
 *
 * Design notes.
 *  A finite double is m2 * 2^e2. Its rounding interval — the reals strtod maps
 *  back to it — is (mm, mp) around mv, with the bounds included when m2 is even
 *  (round-half-even). Scaling mv, mm and mp by 4 makes them integers: mv = 4 m2,
 *  mp = mv + 2, mm = mv - 1 - mmShift (the lower gap halves below a power of two).
 *  One 64x128-bit multiply by a power of 5 (core/base/shortest_table.h) turns the
 *  three into decimals vr, vp, vm scaled by 10^-e10, truncated. Digits are then
 *  removed while vp and vm still differ after dropping one; vr is rounded on the
 *  last removed digit. Exactness needs to know whether the truncations dropped
 *  only zeros (vm/vr "IsTrailingZeros"); they are tracked for the rare cases.
 *  Invariants: the result lies in the interval; no shorter decimal does; of the
 *  decimals of that length in the interval it is the closest to v.
 */
#include "core/base/shortest.h"

#include <stdbool.h>
#include <string.h>

#include "core/base/shortest_table.h"

__extension__ typedef unsigned __int128 kv_u128;

enum { MANTISSA_BITS = 52, EXPONENT_BITS = 11, BIAS = 1023 };

/* ceil(log2(5^e)) for e in [0, 3528] (1 for e = 0). */
static int pow5bits(int e) { return (int)(((unsigned)e * 1217359u) >> 19) + 1; }
/* floor(log10(2^e)) for e in [0, 1650]. */
static unsigned log10_pow2(int e) { return ((unsigned)e * 78913u) >> 18; }
/* floor(log10(5^e)) for e in [0, 2620]. */
static unsigned log10_pow5(int e) { return ((unsigned)e * 732923u) >> 20; }

static unsigned pow5_factor(uint64_t v)
{
    unsigned n = 0;
    while (v % 5 == 0) {
        v /= 5;
        n++;
    }
    return n;
}

static bool multiple_of_pow5(uint64_t v, unsigned p) { return pow5_factor(v) >= p; }
static bool multiple_of_pow2(uint64_t v, unsigned p) { return (v & ((1ull << p) - 1)) == 0; }

/* (m * mul) >> j, mul a 128-bit {low, high} table entry, j >= 64. */
static uint64_t mul_shift(uint64_t m, const uint64_t *mul, int j)
{
    kv_u128 b0 = (kv_u128)m * mul[0];
    kv_u128 b2 = (kv_u128)m * mul[1];
    return (uint64_t)(((b0 >> 64) + b2) >> (j - 64));
}

static int decimal_length(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

kv_decimal kv_shortest_decimal(double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint64_t ieee_mantissa = bits & ((1ull << MANTISSA_BITS) - 1);
    unsigned ieee_exponent = (unsigned)((bits >> MANTISSA_BITS) & ((1u << EXPONENT_BITS) - 1));

    int e2;
    uint64_t m2;
    if (ieee_exponent == 0) {
        e2 = 1 - BIAS - MANTISSA_BITS - 2;
        m2 = ieee_mantissa;
    } else {
        e2 = (int)ieee_exponent - BIAS - MANTISSA_BITS - 2;
        m2 = (1ull << MANTISSA_BITS) | ieee_mantissa;
    }
    bool accept_bounds = (m2 & 1) == 0;

    /* The interval, scaled by 4. */
    uint64_t mv = 4 * m2;
    unsigned mm_shift = ieee_mantissa != 0 || ieee_exponent <= 1;

    /* To decimal: vr, vp, vm = mv, mp, mm * 2^e2 / 10^e10, truncated. */
    uint64_t vr, vp, vm;
    int e10;
    bool vm_trailing_zeros = false, vr_trailing_zeros = false;
    if (e2 >= 0) {
        unsigned q = log10_pow2(e2) - (e2 > 3);
        e10 = (int)q;
        int k = KV_POW5_INV_BITCOUNT + pow5bits((int)q) - 1;
        int i = -e2 + (int)q + k;
        vr = mul_shift(4 * m2, kv_pow5_inv_split[q], i);
        vp = mul_shift(4 * m2 + 2, kv_pow5_inv_split[q], i);
        vm = mul_shift(4 * m2 - 1 - mm_shift, kv_pow5_inv_split[q], i);
        if (q <= 21) {
            /* Only mv, mp or mm can be a multiple of 5^q, at most one of them. */
            if (mv % 5 == 0)
                vr_trailing_zeros = multiple_of_pow5(mv, q);
            else if (accept_bounds)
                vm_trailing_zeros = multiple_of_pow5(mv - 1 - mm_shift, q);
            else
                vp -= multiple_of_pow5(mv + 2, q);
        }
    } else {
        unsigned q = log10_pow5(-e2) - (-e2 > 1);
        e10 = (int)q + e2;
        int i = -e2 - (int)q;
        int k = pow5bits(i) - KV_POW5_BITCOUNT;
        int j = (int)q - k;
        vr = mul_shift(4 * m2, kv_pow5_split[i], j);
        vp = mul_shift(4 * m2 + 2, kv_pow5_split[i], j);
        vm = mul_shift(4 * m2 - 1 - mm_shift, kv_pow5_split[i], j);
        if (q <= 1) {
            /* mv = 4 m2 has at least two trailing zero bits; mp = mv + 2 one; mm one iff mm_shift. */
            vr_trailing_zeros = true;
            if (accept_bounds)
                vm_trailing_zeros = mm_shift == 1;
            else
                vp--;
        } else if (q < 63) {
            /* vr is exact iff 2^q divides mv (the product has q factors 2 fewer than 5s). */
            vr_trailing_zeros = multiple_of_pow2(mv, q);
        }
    }

    /* The shortest decimal in the interval. */
    int removed = 0;
    unsigned last_removed = 0;
    uint64_t output;
    if (vm_trailing_zeros || vr_trailing_zeros) {
        /* General case (rare): exact bounds or an exact tie are possible. */
        while (vp / 10 > vm / 10) {
            vm_trailing_zeros &= vm % 10 == 0;
            vr_trailing_zeros &= last_removed == 0;
            last_removed = (unsigned)(vr % 10);
            vr /= 10;
            vp /= 10;
            vm /= 10;
            removed++;
        }
        if (vm_trailing_zeros) {
            while (vm % 10 == 0) {
                vr_trailing_zeros &= last_removed == 0;
                last_removed = (unsigned)(vr % 10);
                vr /= 10;
                vp /= 10;
                vm /= 10;
                removed++;
            }
        }
        if (vr_trailing_zeros && last_removed == 5 && vr % 2 == 0)
            last_removed = 4; /* exactly ...50..0: round half to even */
        output = vr + ((vr == vm && (!accept_bounds || !vm_trailing_zeros)) || last_removed >= 5);
    } else {
        bool round_up = false;
        if (vp / 100 > vm / 100) { /* two digits at a time */
            round_up = vr % 100 >= 50;
            vr /= 100;
            vp /= 100;
            vm /= 100;
            removed += 2;
        }
        while (vp / 10 > vm / 10) {
            round_up = vr % 10 >= 5;
            vr /= 10;
            vp /= 10;
            vm /= 10;
            removed++;
        }
        output = vr + (vr == vm || round_up);
    }
    kv_decimal d = {output, e10 + removed, 0};
    while (d.digits % 10 == 0 && d.digits != 0) { /* defensive: the shortest form has none */
        d.digits /= 10;
        d.exponent++;
    }
    d.n_digits = decimal_length(d.digits);
    return d;
}
