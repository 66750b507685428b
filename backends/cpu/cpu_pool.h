/* cpu_pool.h — a small persistent pthread pool for the CPU backend's parallel loops. */
#ifndef KV_CPU_POOL_H
#define KV_CPU_POOL_H

#include <stddef.h>

typedef struct kv_cpu_pool kv_cpu_pool;

/* Work on items [begin, end); worker is 0..threads-1 (for per-thread scratch). */
typedef void (*kv_cpu_range_fn)(void *arg, size_t begin, size_t end, int worker);

/* Starts threads - 1 helper threads (the caller is the last worker). threads < 1
   means one. Returns NULL if a thread cannot be started (then run single-threaded). */
kv_cpu_pool *kv_cpu_pool_create(int threads);
void kv_cpu_pool_destroy(kv_cpu_pool *pool); /* NULL is fine */
int kv_cpu_pool_threads(const kv_cpu_pool *pool); /* 1 for NULL */

/* Runs fn over [0, n) in chunks of `grain` items, spread over all workers,
   and returns when every item is done. pool NULL runs it on the caller. Not
   reentrant: one parallel loop at a time per pool. */
void kv_cpu_pool_run(kv_cpu_pool *pool, size_t n, size_t grain, kv_cpu_range_fn fn, void *arg);

/* On-CPU time of the helper threads (workers 1..threads-1): each adds the
   thread CPU time it spends inside runs. Reset, run, then read the largest;
   with the caller's own thread CPU time this estimates how long the loop
   would take if no other process wanted the cores (`kvsim bench kernels`
   reports it next to wall time on shared machines). 0 without helpers. */
void kv_cpu_pool_cpu_reset(kv_cpu_pool *pool);
double kv_cpu_pool_cpu_max_s(const kv_cpu_pool *pool);

/* The calling thread's CPU seconds (CLOCK_THREAD_CPUTIME_ID). */
double kv_cpu_thread_cpu_s(void);

#endif
