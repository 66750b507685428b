/* cpu_compact.c — DiffKV's parallel page compaction over a circular free list.
 *
 * Design notes. The free list is a ring of `capacity` page ids; state =
 * {head, tail, free_count, status}. Free pages are free_list[(head + k) %
 * capacity] for k < free_count.
 *  I1. tail == (head + free_count) % capacity, 0 <= free_count <= capacity.
 *  I2. Entry i owns the disjoint range [offsets[i], offsets[i] + demand[i]) of
 *      the ring (counted from head for alloc, from tail for release) and of
 *      pages[], where offsets is the exclusive prefix sum of demand. So every
 *      entry can copy its range independently: on the CPU device 0 the
 *      entries are spread over the worker threads.
 *  I3. A request that cannot be met (alloc beyond free_count: status 1;
 *      release beyond capacity: status 2) changes nothing but offsets and
 *      status. */
#include "backends/cpu/cpu_internal.h"

typedef struct cjob {
    const uint32_t *demand, *offsets;
    uint32_t *pages, *free_list;
    uint32_t capacity, start; /* ring position of offset 0: head (alloc) or tail (release) */
    int release;
} cjob;

static void job_copy(void *arg, size_t i0, size_t i1, int worker)
{
    const cjob *j = arg;
    (void)worker;
    for (size_t i = i0; i < i1; i++) {
        uint64_t at = ((uint64_t)j->start + j->offsets[i]) % j->capacity;
        for (uint32_t k = 0; k < j->demand[i]; k++) {
            if (j->release)
                j->free_list[at] = j->pages[j->offsets[i] + k];
            else
                j->pages[j->offsets[i] + k] = j->free_list[at];
            if (++at == j->capacity)
                at = 0;
        }
    }
}

static int compact(cpu_ctx *c, const kv_compact_args *a, int release, kv_error *err)
{
    const char *kernel = release ? "compact_release" : "compact_alloc";
    uint32_t *demand, *offsets, *free_list, *state, *pages = NULL;
    size_t n4 = (size_t)a->n * 4;
    int rc = kv_cpu_span(&a->demand, n4, (void **)&demand, kernel, "demand", err);
    if (!rc)
        rc = kv_cpu_span(&a->offsets, n4, (void **)&offsets, kernel, "offsets", err);
    if (!rc)
        rc = kv_cpu_span(&a->free_list, (size_t)a->capacity * 4, (void **)&free_list, kernel, "free_list", err);
    if (!rc)
        rc = kv_cpu_span(&a->state, 16, (void **)&state, kernel, "state", err);
    if (rc)
        return rc;
    uint32_t head = state[0], tail = state[1], free_count = state[2];
    if (head >= a->capacity || tail >= a->capacity || free_count > a->capacity ||
        tail != (uint32_t)(((uint64_t)head + free_count) % a->capacity))
        return kv_error_set(err, KV_EINPUT,
                            "%s: free-list state {head %u, tail %u, free %u} is inconsistent with capacity %u",
                            kernel, head, tail, free_count, a->capacity);

    /* The exclusive prefix sum (I2). */
    uint64_t total = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        offsets[i] = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
        total += demand[i];
    }
    if (!release && total > free_count) {
        state[3] = 1;
        return KV_OK;
    }
    if (release && total > (uint64_t)a->capacity - free_count) {
        state[3] = 2;
        return KV_OK;
    }
    if (total > 0) {
        rc = kv_cpu_span(&a->pages, (size_t)total * 4, (void **)&pages, kernel, "pages", err);
        if (rc)
            return rc;
    }
    cjob j = {demand, offsets, pages, free_list, a->capacity, release ? tail : head, release};
    kv_cpu_pool_run(c->pool, a->n, 64, job_copy, &j);
    if (release) {
        state[1] = (uint32_t)((tail + total) % a->capacity);
        state[2] = (uint32_t)(free_count + total);
    } else {
        state[0] = (uint32_t)((head + total) % a->capacity);
        state[2] = (uint32_t)(free_count - total);
    }
    state[3] = 0;
    return KV_OK;
}

int kv_cpu_compact_alloc(cpu_ctx *c, const kv_compact_args *a, kv_error *err)
{
    return compact(c, a, 0, err);
}

int kv_cpu_compact_release(cpu_ctx *c, const kv_compact_args *a, kv_error *err)
{
    return compact(c, a, 1, err);
}
