/* shortest.h — the shortest decimal that reads back to a given double (Ryu, Ulf Adams, PLDI 2018). */
#ifndef KV_SHORTEST_H
#define KV_SHORTEST_H

#include <stdint.h>

/* v = digits * 10^exponent. */
typedef struct kv_decimal {
    uint64_t digits; /* significand, at most 17 decimal digits, no trailing zeros */
    int exponent;    /* power of ten */
    int n_digits;    /* decimal digits in `digits`, 1..17 */
} kv_decimal;

/* The shortest decimal that strtod reads back as |v| (IEEE round-half-even), and of
   those the closest to |v| (ties to an even last digit). v must be finite and non-zero;
   the sign is ignored. Exact for every such double, subnormals included. */
kv_decimal kv_shortest_decimal(double v);

#endif
