/* test_blas_park.c — kv_model_blas_park stops OpenBLAS's worker threads, which would spin idle
 * after the library loads, and a threaded product afterwards starts them again with the same
 * result. Skipped (visibly) where OpenBLAS has no pthread pool or runs one thread. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "core/refmodel/model.h"

#define N 512 /* large enough for OpenBLAS to thread an sgemm */

static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d, "/proc/self/task");
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void product(const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
}

Test(blas_park, stops_the_pool_and_a_later_product_restarts_it)
{
    if (openblas_get_parallel() != 1) /* 0: sequential build, 2: OpenMP */
        cr_skip_test("skipped: this OpenBLAS build has no pthread pool (%s)", openblas_get_config());
    if (openblas_get_num_threads() < 2)
        cr_skip_test("skipped: OpenBLAS runs one thread here (one core or OPENBLAS_NUM_THREADS=1)");
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N);
    float *c0 = malloc(sizeof(float) * N * N), *c1 = malloc(sizeof(float) * N * N);
    cr_assert(a && b && c0 && c1);
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)(((unsigned)i * 7919u) % 101u) / 101.0f - 0.5f;
        b[i] = (float)(((unsigned)i * 104729u) % 97u) / 97.0f - 0.5f;
    }
    product(a, b, c0); /* the pool exists now, whether or not it did at the start */
    kv_model_blas_park();
    int alone = threads_now();
    product(a, b, c1);
    int pooled = threads_now();
    cr_expect_gt(pooled, alone, "the next threaded product starts the workers again");
    cr_expect_eq(memcmp(c0, c1, sizeof(float) * N * N), 0, "the same product, bit for bit");
    cr_expect_geq(openblas_get_num_threads(), 2, "the thread count the model reads is unchanged");
    kv_model_blas_park();
    cr_expect_eq(threads_now(), alone, "after kv_model_blas_park no BLAS worker is left");
    kv_model_blas_park(); /* twice is harmless */
    cr_expect_eq(threads_now(), alone);
    cr_expect_eq(pooled - alone, openblas_get_num_threads() - 1, "one worker per BLAS thread but the caller's");
    free(a), free(b), free(c0), free(c1);
}
