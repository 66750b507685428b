/* test_stat.c — kv_stat_compute (radix-sorted) gives bit for bit what the qsort version gave. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/metrics.h"

/* The oracle: kv_stat_compute as it was, sorting with qsort. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *sorted, size_t n, double p)
{
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

static void oracle(const double *values, size_t n, kv_stat *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0) {
        out->mean = out->median = out->p90 = out->p99 = NAN;
        return;
    }
    double *v = malloc(n * sizeof *v);
    memcpy(v, values, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    out->mean = sum / (double)n;
    out->median = percentile(v, n, 50);
    out->p90 = percentile(v, n, 90);
    out->p99 = percentile(v, n, 99);
    free(v);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void expect_same(const double *v, size_t n, const char *what)
{
    kv_stat got, want;
    kv_stat_compute(v, n, &got);
    oracle(v, n, &want);
    cr_expect(got.n == want.n && same_bits(got.mean, want.mean) && same_bits(got.median, want.median) &&
                  same_bits(got.p90, want.p90) && same_bits(got.p99, want.p99),
              "%s, n = %zu: got %a %a %a %a, want %a %a %a %a", what, n, got.mean, got.median, got.p90, got.p99,
              want.mean, want.median, want.p90, want.p99);
}

Test(stat, equals_the_qsort_version_on_many_distributions)
{
    const size_t sizes[] = {0, 1, 2, 255, 256, 257, 1000, 4097, 200000};
    uint64_t s = 7;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        double *v = malloc((n + 1) * sizeof *v);
        for (int kind = 0; kind < 8; kind++) {
            for (size_t i = 0; i < n; i++) {
                uint64_t r = splitmix(&s);
                double u = (double)(r >> 11) * 0x1p-53;
                switch (kind) {
                case 0: v[i] = u * 100; break;                         /* positive ms */
                case 1: v[i] = (u - 0.5) * 1e6; break;                 /* both signs */
                case 2: v[i] = (double)(r % 17); break;                /* many duplicates, +0 */
                case 3: v[i] = 42.5; break;                            /* all equal */
                case 4: v[i] = ldexp(u, (int)(r % 2000) - 1000) * ((r >> 60) & 1 ? -1 : 1); break; /* every exponent */
                case 5: v[i] = i % 3 ? u : (i % 2 ? INFINITY : -INFINITY); break;
                case 6: v[i] = i % 5 ? u - 0.5 : -0.0; break;          /* negative zeros: qsort's order */
                default: v[i] = i % 7 ? u : NAN; break;                /* NaN: qsort's order */
                }
            }
            char what[32];
            snprintf(what, sizeof what, "distribution %d", kind);
            expect_same(v, n, what);
        }
        free(v);
    }
}
