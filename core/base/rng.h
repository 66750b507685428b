/* rng.h — a seeded, splittable pseudo-random generator (xoshiro256**). */
#ifndef KV_RNG_H
#define KV_RNG_H

#include <stdint.h>

typedef struct kv_rng {
    uint64_t s[4]; /* state; never all zero */
} kv_rng;

/* Seeds from one 64-bit value via splitmix64. */
void kv_rng_seed(kv_rng *rng, uint64_t seed);
/* An independent stream derived from rng's seed and a label (e.g. a policy index). */
void kv_rng_fork(const kv_rng *rng, uint64_t label, kv_rng *child);
uint64_t kv_rng_u64(kv_rng *rng);
double kv_rng_uniform(kv_rng *rng);                   /* [0, 1) */
double kv_rng_uniform_open(kv_rng *rng);              /* (0, 1) */
double kv_rng_normal(kv_rng *rng);                    /* mean 0, sd 1 */
double kv_rng_exponential(kv_rng *rng, double rate);  /* mean 1/rate */
double kv_rng_gamma(kv_rng *rng, double shape, double scale);
uint64_t kv_rng_below(kv_rng *rng, uint64_t n);       /* [0, n), n > 0, unbiased */

#endif
