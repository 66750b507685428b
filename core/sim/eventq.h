/* eventq.h — the discrete-event queue: events ordered by (time, sequence number).
 *
 * Invariant: the queue never hands out an event earlier than the last one it
 * handed out (the simulated clock never decreases); pushing an event into the
 * past is an internal error and aborts through an always-on check.
 * Ties in time pop in push order, which makes every run deterministic.
 */
#ifndef KV_EVENTQ_H
#define KV_EVENTQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_event {
    double t_s;     /* simulated time */
    uint64_t seq;   /* push order, breaks ties */
    int type;       /* engine-defined */
    int a, b;       /* engine-defined arguments (request, node, layer, ...) */
} kv_event;

typedef struct kv_eventq {
    kv_event *heap; /* binary min-heap on (t_s, seq) */
    size_t n, cap;
    uint64_t next_seq;
    double now_s;   /* time of the last popped event */
} kv_eventq;

void kv_eventq_init(kv_eventq *q);
void kv_eventq_free(kv_eventq *q);
void kv_eventq_push(kv_eventq *q, double t_s, int type, int a, int b);
/* Pops the earliest event into *ev; returns 0 when the queue is empty. */
int kv_eventq_pop(kv_eventq *q, kv_event *ev);
/* Time of the earliest event, or +Inf when empty. */
double kv_eventq_peek_time(const kv_eventq *q);

#endif
