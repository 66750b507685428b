/* cpu_pool.c — persistent worker threads that split a loop into chunks taken
 * from a shared atomic counter. The caller works too and waits for the rest.
 *
 * Invariant: `generation` changes exactly once per kv_cpu_pool_run; a helper
 * runs a job only after seeing a new generation, and `active` counts helpers
 * still inside the current job, so run() returns only when all of them left.
 * Fork safety: create() returns only once every helper waits on `wake`, and
 * run() once every helper left the job, so between calls no helper is inside
 * the allocator or any other lock: a fork (kvsim forks its SimGrid child at any
 * point of a run) never copies a lock a helper holds. A helper still starting
 * once did, under AddressSanitizer, whose allocator has no fork handler: the
 * child's first allocation waited forever. */
#include "backends/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/base/alloc.h"

struct kv_cpu_pool {
    int threads;           /* workers including the caller */
    pthread_t *helpers;    /* threads - 1 of them */
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* helpers wait here for a new generation or stop */
    pthread_cond_t done;   /* run() waits here for active == 0 */
    unsigned long generation;
    int stop;
    int active;            /* helpers still working on the current job */
    int started;           /* helpers that reached their wait loop (create() waits for all) */
    /* the current job */
    kv_cpu_range_fn fn;
    void *arg;
    size_t n, grain;
    atomic_size_t next;    /* first item not yet taken */
    double *cpu_s;         /* [threads]: helper i's CPU seconds inside runs since the last reset;
                              written by helper i only, read under lock after a run */
};

typedef struct helper_arg {
    kv_cpu_pool *pool;
    int worker;
} helper_arg;

static void work(kv_cpu_pool *p, int worker)
{
    for (;;) {
        size_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n)
            return;
        size_t end = begin + p->grain < p->n ? begin + p->grain : p->n;
        p->fn(p->arg, begin, end, worker);
    }
}

static void *helper_main(void *varg)
{
    helper_arg *ha = varg;
    kv_cpu_pool *p = ha->pool;
    int worker = ha->worker;
    kv_free(ha);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->lock);
    p->started++;
    pthread_cond_signal(&p->done);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);
        double t0 = kv_cpu_thread_cpu_s();
        work(p, worker);
        double spent = kv_cpu_thread_cpu_s() - t0;
        pthread_mutex_lock(&p->lock);
        p->cpu_s[worker] += spent;
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kv_cpu_pool *kv_cpu_pool_create(int threads)
{
    if (threads < 1)
        threads = 1;
    kv_cpu_pool *p = kv_calloc(1, sizeof *p);
    p->threads = threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    p->helpers = kv_calloc((size_t)threads, sizeof *p->helpers);
    p->cpu_s = kv_calloc((size_t)threads, sizeof *p->cpu_s);
    for (int i = 0; i < threads - 1; i++) {
        helper_arg *ha = kv_malloc(sizeof *ha);
        ha->pool = p;
        ha->worker = i + 1;
        if (pthread_create(&p->helpers[i], NULL, helper_main, ha) != 0) {
            kv_free(ha);
            p->threads = i + 1; /* keep the helpers that started */
            break;
        }
    }
    pthread_mutex_lock(&p->lock);
    while (p->started < p->threads - 1)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    return p;
}

void kv_cpu_pool_destroy(kv_cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->threads - 1; i++)
        pthread_join(p->helpers[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    kv_free(p->helpers);
    kv_free(p->cpu_s);
    kv_free(p);
}

int kv_cpu_pool_threads(const kv_cpu_pool *p)
{
    return p ? p->threads : 1;
}

void kv_cpu_pool_run(kv_cpu_pool *p, size_t n, size_t grain, kv_cpu_range_fn fn, void *arg)
{
    if (grain == 0)
        grain = 1;
    if (n == 0)
        return;
    if (!p || p->threads == 1 || n <= grain) {
        for (size_t b = 0; b < n; b += grain)
            fn(arg, b, b + grain < n ? b + grain : n, 0);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    p->active = p->threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    work(p, 0);
    pthread_mutex_lock(&p->lock);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

double kv_cpu_thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kv_cpu_pool_cpu_reset(kv_cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->threads; i++)
        p->cpu_s[i] = 0;
    pthread_mutex_unlock(&p->lock);
}

double kv_cpu_pool_cpu_max_s(const kv_cpu_pool *p)
{
    if (!p)
        return 0;
    double m = 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->lock);
    for (int i = 1; i < p->threads; i++)
        m = p->cpu_s[i] > m ? p->cpu_s[i] : m;
    pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
    return m;
}
