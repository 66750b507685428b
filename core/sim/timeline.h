/* timeline.h — spans recorded during a run, written as Chrome/Perfetto trace-event JSON. */
#ifndef KV_TIMELINE_H
#define KV_TIMELINE_H

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "core/base/stream.h"

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

/* A counter sample: `name` (e.g. "KV memory decode 0") has `value` from t_s on,
   shown as a counter track of the process; unit names the value's unit (e.g. "GB"). */
void kv_timeline_counter(kv_timeline *tl, int process, const char *name, const char *unit, double t_s, double value);

/* What a timeline holds at one moment, so that what a run adds after it can travel from the process
   that ran it (the SimGrid child, kv_engine_run) to the one that keeps the timeline. */
typedef struct kv_timeline_mark {
    size_t processes, tracks, spans, counters;
} kv_timeline_mark;
void kv_timeline_get_mark(const kv_timeline *tl, kv_timeline_mark *m); /* NULL tl: all 0 */
/* Writes what tl holds beyond m. Categories and units travel as addresses: both processes must be
   the same program image (a fork). Returns 0, or -1 when the stream failed. */
int kv_timeline_save(const kv_timeline *tl, const kv_timeline_mark *m, kv_stream *out);
/* Appends what kv_timeline_save wrote from a copy of tl as it is now (its ids keep their values).
   Returns 0, or -1 when the stream failed or does not continue tl (tl is then unchanged). */
int kv_timeline_load(kv_timeline *tl, kv_stream *in);

/* Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to out. Times are
   whole microseconds (ts and ts+dur are rounded the same way, so a span that
   ends with its parent still nests). Spans on one track that overlap without
   nesting go to extra lanes, tracks named "NAME (2)", "NAME (3)", ... right
   after their track, so every track nests properly (Perfetto needs that). */
void kv_timeline_write(const kv_timeline *tl, FILE *out);

#endif
