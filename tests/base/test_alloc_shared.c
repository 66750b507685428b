/* test_alloc_shared.c — kv_calloc_shared (core/base/alloc.h): zeroed memory a forked child fills for
 * its parent, as the SimGrid child fills a run's per-request results. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/alloc.h"

/* Under AddressSanitizer kv_calloc_shared always answers NULL (alloc.h): its callers' fallback is
   what a sanitizer build tests, and these tests check that answer instead. */
#define EXPECT_NULL_UNDER_ASAN(p)                                                                     \
    do {                                                                                              \
        if (KV_ASAN) {                                                                                \
            cr_assert_null(p, "under AddressSanitizer the mapping is refused, so callers fall back"); \
            return;                                                                                   \
        }                                                                                             \
    } while (0)

Test(alloc_shared, zeroed_and_written_by_a_forked_child)
{
    size_t n = 300000; /* 2.4 MB: more than one page, not a multiple of one */
    uint64_t *a = kv_calloc_shared(n, sizeof *a);
    EXPECT_NULL_UNDER_ASAN(a);
    cr_assert_not_null(a);
    for (size_t i = 0; i < n; i += 997)
        cr_assert_eq(a[i], 0, "entry %zu is not zero", i);
    a[n - 1] = 7;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        for (size_t i = 0; i < n; i++)
            a[i] = a[i] + 3 * i;
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (size_t i = 0; i + 1 < n; i++)
        cr_assert_eq(a[i], 3 * i, "entry %zu: %llu, the child wrote %zu", i, (unsigned long long)a[i], 3 * i);
    cr_assert_eq(a[n - 1], 7 + 3 * (n - 1), "the parent's write before the fork is kept");
    kv_free_shared(a, n, sizeof *a);
}

Test(alloc_shared, empty_and_null)
{
    char *p = kv_calloc_shared(0, 1); /* one byte, as kv_calloc */
    EXPECT_NULL_UNDER_ASAN(p);
    cr_assert_not_null(p);
    cr_assert_eq(p[0], 0);
    kv_free_shared(p, 0, 1);
    kv_free_shared(NULL, 10, 10);
}

Test(alloc_shared, an_impossible_size_is_refused)
{
    cr_assert_null(kv_calloc_shared(SIZE_MAX / 2, 4), "the product overflows: NULL, the caller falls back");
}
