/* ci.h — 95% confidence intervals: Student t for means (of replicates, of blocks of tokens) and Wilson for
 * proportions. Pure functions; nothing here allocates.
 *
 *  - kv_ci_t975(dof): the 0.975 quantile of Student's t, tabled for dof 1..29, 1.959964 (the normal
 *    quantile) beyond.
 *  - kv_ci_mean: mean ± t(0.975, n-1) · s / sqrt(n), s the sample standard deviation (n-1 denominator).
 *  - kv_ci_wilson: Wilson's score interval for k successes in n trials at z = 1.959964; it stays inside
 *    [0, 1], holds the estimate k/n, and is not degenerate at k = 0 or k = n (unlike the Wald interval).
 */
#ifndef KV_CI_H
#define KV_CI_H

#include <stddef.h>

#define KV_CI_Z975 1.959963985 /* the standard normal's 0.975 quantile */

/* Student t's 0.975 quantile with dof degrees of freedom (dof >= 1; NaN below). */
double kv_ci_t975(int dof);
/* Mean and 95% half-width of x[0..n): n = 0 gives NaN for both; n = 1 a half-width of 0. */
void kv_ci_mean(const double *x, size_t n, double *mean, double *half_width);
/* Wilson 95% interval of k successes out of n (0 <= k <= n) into [*lo, *hi]; n = 0 gives NaN for both. */
void kv_ci_wilson(long k, long n, double *lo, double *hi);

#endif
