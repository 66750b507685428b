/* timeline.h — spans recorded during a run, written as Chrome/Perfetto trace-event JSON. */
#ifndef KV_TIMELINE_H
#define KV_TIMELINE_H

#include <stdint.h>
#include <stdio.h>

typedef struct kv_timeline kv_timeline;

kv_timeline *kv_timeline_create(void);
void kv_timeline_destroy(kv_timeline *tl); /* NULL is fine */

/* A process groups tracks (one per policy run); returns its id. */
int kv_timeline_process(kv_timeline *tl, const char *name);
/* A track (thread) within a process, e.g. "prefill 0", "decode 1", "link host0-up". */
int kv_timeline_track(kv_timeline *tl, int process, const char *name);
/* A complete span [t0_s, t1_s) on a track. name and category are copied;
   request is -1 when the span is not about one request. */
void kv_timeline_span(kv_timeline *tl, int process, int track, const char *name, const char *category, double t0_s,
                      double t1_s, int64_t request);

/* Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to out. */
void kv_timeline_write(const kv_timeline *tl, FILE *out);

#endif
