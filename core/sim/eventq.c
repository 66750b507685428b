/* eventq.c — binary heap of events on (time, sequence). */
#include "core/sim/eventq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/base/alloc.h"

void kv_eventq_init(kv_eventq *q)
{
    q->heap = NULL;
    q->n = q->cap = 0;
    q->next_seq = 0;
    q->now_s = 0;
}

void kv_eventq_free(kv_eventq *q)
{
    kv_free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}

static int before(const kv_event *a, const kv_event *b)
{
    return a->t_s < b->t_s || (a->t_s == b->t_s && a->seq < b->seq);
}

void kv_eventq_push(kv_eventq *q, double t_s, int type, int a, int b)
{
    if (!(t_s >= q->now_s) || !isfinite(t_s)) {
        /* Invariant 1 of the engine: the clock never decreases. */
        fprintf(stderr, "kvsim: internal error: event type %d at t=%.17g pushed before now=%.17g\n", type, t_s,
                q->now_s);
        abort();
    }
    kv_grow((void **)&q->heap, sizeof *q->heap, &q->cap, q->n + 1);
    kv_event ev = {t_s, q->next_seq++, type, a, b};
    size_t i = q->n++;
    while (i > 0 && before(&ev, &q->heap[(i - 1) / 2])) {
        q->heap[i] = q->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->heap[i] = ev;
}

int kv_eventq_pop(kv_eventq *q, kv_event *ev)
{
    if (q->n == 0)
        return 0;
    *ev = q->heap[0];
    kv_event last = q->heap[--q->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const kv_event *best = &last;
        if (l < q->n && before(&q->heap[l], best)) {
            m = l;
            best = &q->heap[l];
        }
        if (r < q->n && before(&q->heap[r], best))
            m = r;
        if (m == i)
            break;
        q->heap[i] = q->heap[m];
        i = m;
    }
    if (q->n > 0)
        q->heap[i] = last;
    q->now_s = ev->t_s;
    return 1;
}

double kv_eventq_peek_time(const kv_eventq *q)
{
    return q->n ? q->heap[0].t_s : INFINITY;
}
