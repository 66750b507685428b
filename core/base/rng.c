/* rng.c — xoshiro256** seeded by splitmix64; distributions built on it. */
#include "core/base/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void kv_rng_seed(kv_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

void kv_rng_fork(const kv_rng *rng, uint64_t label, kv_rng *child)
{
    uint64_t x = rng->s[0] ^ rotl(rng->s[1], 17) ^ (label * 0xd1342543de82ef95ULL);
    for (int i = 0; i < 4; i++)
        child->s[i] = splitmix64(&x);
}

uint64_t kv_rng_u64(kv_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kv_rng_uniform(kv_rng *rng)
{
    return (double)(kv_rng_u64(rng) >> 11) * 0x1.0p-53;
}

double kv_rng_uniform_open(kv_rng *rng)
{
    return ((double)(kv_rng_u64(rng) >> 12) + 0.5) * 0x1.0p-52;
}

double kv_rng_normal(kv_rng *rng)
{
    /* Box–Muller; one value per call keeps the stream simple to reason about. */
    double u1 = kv_rng_uniform_open(rng), u2 = kv_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

double kv_rng_exponential(kv_rng *rng, double rate)
{
    return -log(kv_rng_uniform_open(rng)) / rate;
}

double kv_rng_gamma(kv_rng *rng, double shape, double scale)
{
    /* Marsaglia–Tsang; shape < 1 boosted by U^(1/shape). */
    if (shape < 1.0) {
        double u = kv_rng_uniform_open(rng);
        return kv_rng_gamma(rng, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = kv_rng_normal(rng), v = 1.0 + c * x;
        if (v <= 0.0)
            continue;
        v = v * v * v;
        double u = kv_rng_uniform_open(rng);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * scale;
    }
}

uint64_t kv_rng_below(kv_rng *rng, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = kv_rng_u64(rng);
    while (x >= limit);
    return x % n;
}
