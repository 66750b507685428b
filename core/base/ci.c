/* ci.c — Student-t and Wilson 95% confidence intervals (see ci.h). */
#include "core/base/ci.h"

#include <math.h>

/* t(0.975, dof) for dof = 1..29. */
static const double t975_table[29] = {
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
    2.306004135,  2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688,
    2.131449546,  2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845,
    2.073873068,  2.068657610, 2.063898562, 2.059538553, 2.055529439, 2.051830516, 2.048407142,
    2.045229642,
};

double kv_ci_t975(int dof)
{
    if (dof < 1)
        return NAN;
    return dof <= 29 ? t975_table[dof - 1] : KV_CI_Z975;
}

void kv_ci_mean(const double *x, size_t n, double *mean, double *half_width)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    double m = n ? sum / (double)n : NAN;
    *mean = m;
    if (n < 2 || !isfinite(m)) {
        *half_width = n == 1 && isfinite(m) ? 0.0 : NAN;
        return;
    }
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (x[i] - m) * (x[i] - m);
    double sd = sqrt(ss / (double)(n - 1));
    *half_width = kv_ci_t975((int)(n - 1)) * sd / sqrt((double)n);
}

void kv_ci_wilson(long k, long n, double *lo, double *hi)
{
    if (n <= 0 || k < 0 || k > n) {
        *lo = *hi = NAN;
        return;
    }
    double z = KV_CI_Z975, z2 = z * z, nn = (double)n, p = (double)k / nn;
    double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
    double half = z / (1 + z2 / nn) * sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
    double l = centre - half, h = centre + half;
    /* Exact ends at k = 0 and k = n (rounding could leave them a hair inside). */
    *lo = k == 0 ? 0.0 : (l < 0 ? 0.0 : l);
    *hi = k == n ? 1.0 : (h > 1 ? 1.0 : h);
}
