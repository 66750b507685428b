/* timeline.c — collect spans and counters, emit trace-event JSON ("X" complete, "C" counter, "M" names).
 *
 * Perfetto (and chrome://tracing) require the complete events of one thread
 * to nest: a span that starts inside another must end inside it. Concurrent
 * transfers on one link, or a request's residual transfer beside its
 * speculative decode, overlap without nesting, so the writer assigns lanes:
 * per track, spans in (start, longest first) order go to the first lane where
 * they nest under the innermost open span (or where none is open); the other
 * lanes become extra tracks. Times are quantised to whole microseconds before
 * the lane check, so what is checked is exactly what is written.
 */
#include "core/sim/timeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/json.h"

typedef struct span {
    int process, track;
    char *name;           /* owned */
    const char *category; /* static strings from the engine */
    double t0_s, t1_s;
    int64_t request;
} span;

typedef struct counter {
    int process;
    char *name;           /* owned */
    const char *unit;     /* static string from the engine */
    double t_s, value;
} counter;

typedef struct track {
    int process;
    char *name;
} track;

struct kv_timeline {
    span *spans;
    size_t n_spans, cap_spans;
    counter *counters;
    size_t n_counters, cap_counters;
    track *tracks;
    size_t n_tracks, cap_tracks;
    char **processes;
    size_t n_processes, cap_processes;
};

kv_timeline *kv_timeline_create(void)
{
    return kv_calloc(1, sizeof(kv_timeline));
}

void kv_timeline_destroy(kv_timeline *tl)
{
    if (!tl)
        return;
    for (size_t i = 0; i < tl->n_spans; i++)
        kv_free(tl->spans[i].name);
    for (size_t i = 0; i < tl->n_counters; i++)
        kv_free(tl->counters[i].name);
    for (size_t i = 0; i < tl->n_tracks; i++)
        kv_free(tl->tracks[i].name);
    for (size_t i = 0; i < tl->n_processes; i++)
        kv_free(tl->processes[i]);
    kv_free(tl->spans);
    kv_free(tl->counters);
    kv_free(tl->tracks);
    kv_free(tl->processes);
    kv_free(tl);
}

int kv_timeline_process(kv_timeline *tl, const char *name)
{
    kv_grow((void **)&tl->processes, sizeof *tl->processes, &tl->cap_processes, tl->n_processes + 1);
    tl->processes[tl->n_processes] = kv_strdup(name);
    return (int)tl->n_processes++;
}

int kv_timeline_track(kv_timeline *tl, int process, const char *name)
{
    kv_grow((void **)&tl->tracks, sizeof *tl->tracks, &tl->cap_tracks, tl->n_tracks + 1);
    tl->tracks[tl->n_tracks] = (track){process, kv_strdup(name)};
    return (int)tl->n_tracks++;
}

void kv_timeline_span(kv_timeline *tl, int process, int track, const char *name, const char *category, double t0_s,
                      double t1_s, int64_t request)
{
    if (!tl)
        return;
    kv_grow((void **)&tl->spans, sizeof *tl->spans, &tl->cap_spans, tl->n_spans + 1);
    tl->spans[tl->n_spans++] = (span){process, track, kv_strdup(name), category, t0_s, t1_s, request};
}

void kv_timeline_counter(kv_timeline *tl, int process, const char *name, const char *unit, double t_s, double value)
{
    if (!tl)
        return;
    kv_grow((void **)&tl->counters, sizeof *tl->counters, &tl->cap_counters, tl->n_counters + 1);
    tl->counters[tl->n_counters++] = (counter){process, kv_strdup(name), unit, t_s, value};
}

/* ---- From one process to another (kv_timeline_save / load) ------------------------------------ */

void kv_timeline_get_mark(const kv_timeline *tl, kv_timeline_mark *m)
{
    *m = (kv_timeline_mark){0};
    if (tl)
        *m = (kv_timeline_mark){tl->n_processes, tl->n_tracks, tl->n_spans, tl->n_counters};
}

static void put_str(kv_stream *out, const char *str)
{
    uint32_t n = (uint32_t)strlen(str);
    kv_stream_put(out, &n, sizeof n);
    kv_stream_put(out, str, n);
}

/* A string of at most 1 MiB (names are short); NULL when the stream failed or the length is absurd. */
static char *get_str(kv_stream *in)
{
    uint32_t n = 0;
    if (kv_stream_get(in, &n, sizeof n) != 0 || n > (1u << 20))
        return NULL;
    char *str = kv_malloc((size_t)n + 1);
    if (kv_stream_get(in, str, n) != 0) {
        kv_free(str);
        return NULL;
    }
    str[n] = 0;
    return str;
}

int kv_timeline_save(const kv_timeline *tl, const kv_timeline_mark *m, kv_stream *out)
{
    kv_timeline_mark now;
    kv_timeline_get_mark(tl, &now);
    kv_stream_put(out, m, sizeof *m);
    kv_stream_put(out, &now, sizeof now);
    for (size_t i = m->processes; i < now.processes; i++)
        put_str(out, tl->processes[i]);
    for (size_t i = m->tracks; i < now.tracks; i++) {
        kv_stream_put(out, &tl->tracks[i].process, sizeof tl->tracks[i].process);
        put_str(out, tl->tracks[i].name);
    }
    for (size_t i = m->spans; i < now.spans; i++) {
        span sp = tl->spans[i];
        char *name = sp.name;
        sp.name = NULL;
        kv_stream_put(out, &sp, sizeof sp); /* category: an address in the same image */
        put_str(out, name);
    }
    for (size_t i = m->counters; i < now.counters; i++) {
        counter c = tl->counters[i];
        char *name = c.name;
        c.name = NULL;
        kv_stream_put(out, &c, sizeof c);
        put_str(out, name);
    }
    return out->failed ? -1 : 0;
}

int kv_timeline_load(kv_timeline *tl, kv_stream *in)
{
    kv_timeline_mark from, to, here;
    kv_timeline_get_mark(tl, &here);
    if (kv_stream_get(in, &from, sizeof from) != 0 || kv_stream_get(in, &to, sizeof to) != 0)
        return -1;
    if (memcmp(&from, &here, sizeof from) != 0 || to.processes < from.processes || to.tracks < from.tracks ||
        to.spans < from.spans || to.counters < from.counters || (!tl && memcmp(&from, &to, sizeof to) != 0))
        return -1;
    for (size_t i = from.processes; i < to.processes; i++) {
        char *name = get_str(in);
        if (!name)
            goto fail;
        kv_grow((void **)&tl->processes, sizeof *tl->processes, &tl->cap_processes, tl->n_processes + 1);
        tl->processes[tl->n_processes++] = name;
    }
    for (size_t i = from.tracks; i < to.tracks; i++) {
        track t;
        if (kv_stream_get(in, &t.process, sizeof t.process) != 0 || !(t.name = get_str(in)))
            goto fail;
        kv_grow((void **)&tl->tracks, sizeof *tl->tracks, &tl->cap_tracks, tl->n_tracks + 1);
        tl->tracks[tl->n_tracks++] = t;
    }
    for (size_t i = from.spans; i < to.spans; i++) {
        span sp;
        if (kv_stream_get(in, &sp, sizeof sp) != 0 || !(sp.name = get_str(in)))
            goto fail;
        kv_grow((void **)&tl->spans, sizeof *tl->spans, &tl->cap_spans, tl->n_spans + 1);
        tl->spans[tl->n_spans++] = sp;
    }
    for (size_t i = from.counters; i < to.counters; i++) {
        counter c;
        if (kv_stream_get(in, &c, sizeof c) != 0 || !(c.name = get_str(in)))
            goto fail;
        kv_grow((void **)&tl->counters, sizeof *tl->counters, &tl->cap_counters, tl->n_counters + 1);
        tl->counters[tl->n_counters++] = c;
    }
    return 0;
fail: /* back to what it held */
    while (tl->n_processes > here.processes)
        kv_free(tl->processes[--tl->n_processes]);
    while (tl->n_tracks > here.tracks)
        kv_free(tl->tracks[--tl->n_tracks].name);
    while (tl->n_spans > here.spans)
        kv_free(tl->spans[--tl->n_spans].name);
    while (tl->n_counters > here.counters)
        kv_free(tl->counters[--tl->n_counters].name);
    return -1;
}

/* ---- Writing ------------------------------------------------------------------------------------ */

typedef struct placed {
    size_t span;          /* index into spans */
    long long ts_us, end_us;
    size_t track;         /* base track */
    size_t lane;          /* 0: the track itself */
} placed;

static int by_track_start(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    if (x->track != y->track)
        return x->track < y->track ? -1 : 1;
    if (x->ts_us != y->ts_us)
        return x->ts_us < y->ts_us ? -1 : 1;
    if (x->end_us != y->end_us)
        return x->end_us > y->end_us ? -1 : 1; /* the longer (outer) span first */
    return x->span < y->span ? -1 : (x->span > y->span);
}

static int by_time(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    if (x->ts_us != y->ts_us)
        return x->ts_us < y->ts_us ? -1 : 1;
    if (x->end_us != y->end_us)
        return x->end_us > y->end_us ? -1 : 1;
    if (x->track != y->track)
        return x->track < y->track ? -1 : 1;
    return x->lane < y->lane ? -1 : (x->lane > y->lane);
}

static long long to_us(double t_s)
{
    return llround(t_s * 1e6);
}

typedef struct lane {
    long long *ends;      /* stack of open spans' end times */
    size_t n, cap;
} lane;

/* Assigns lanes to one track's spans p[0..n) (sorted by start); returns the lanes used. */
static size_t assign_lanes(placed *p, size_t n)
{
    lane *lanes = NULL;
    size_t n_lanes = 0, cap_lanes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        for (;; l++) {
            if (l == n_lanes) {
                kv_grow((void **)&lanes, sizeof *lanes, &cap_lanes, n_lanes + 1);
                lanes[n_lanes++] = (lane){0};
            }
            lane *ln = &lanes[l];
            while (ln->n > 0 && ln->ends[ln->n - 1] <= p[i].ts_us)
                ln->n--;
            if (ln->n == 0 || ln->ends[ln->n - 1] >= p[i].end_us)
                break;
        }
        lane *ln = &lanes[l];
        kv_grow((void **)&ln->ends, sizeof *ln->ends, &ln->cap, ln->n + 1);
        ln->ends[ln->n++] = p[i].end_us;
        p[i].lane = l;
    }
    for (size_t l = 0; l < n_lanes; l++)
        kv_free(lanes[l].ends);
    kv_free(lanes);
    return n_lanes;
}

static void thread_meta(FILE *out, int *first, int pid, size_t tid, const char *name, size_t sort_index)
{
    fprintf(out, "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%zu,\"args\":{\"name\":",
            *first ? "" : ",\n", pid, tid);
    kv_json_string(out, name);
    fprintf(out, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%zu,"
                 "\"args\":{\"sort_index\":%zu}}",
            pid, tid, sort_index);
    *first = 0;
}

/* Copies the NUL-terminated s to p (no NUL); returns its length. */
static size_t put(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return n;
}

void kv_timeline_write(const kv_timeline *tl, FILE *out)
{
    size_t n = tl->n_spans;
    placed *p = kv_calloc(n ? n : 1, sizeof *p);
    for (size_t i = 0; i < n; i++) {
        const span *s = &tl->spans[i];
        long long ts = to_us(s->t0_s), end = to_us(s->t1_s);
        p[i] = (placed){i, ts, end < ts ? ts : end, (size_t)s->track, 0};
    }
    qsort(p, n, sizeof *p, by_track_start);
    /* Lanes per track; lane_tid[track] is the first extra tid of that track. */
    size_t *lanes = kv_calloc(tl->n_tracks ? tl->n_tracks : 1, sizeof *lanes);
    size_t *lane_tid = kv_calloc(tl->n_tracks ? tl->n_tracks : 1, sizeof *lane_tid);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && p[j].track == p[i].track)
            j++;
        lanes[p[i].track] = assign_lanes(p + i, j - i);
        i = j;
    }
    size_t next_tid = tl->n_tracks + 1;
    for (size_t t = 0; t < tl->n_tracks; t++) {
        lane_tid[t] = next_tid;
        if (lanes[t] > 1)
            next_tid += lanes[t] - 1;
    }

    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out);
    int first = 1;
    for (size_t i = 0; i < tl->n_processes; i++) {
        fprintf(out, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%zu,\"tid\":0,\"args\":{\"name\":",
                first ? "" : ",\n", i + 1);
        kv_json_string(out, tl->processes[i]);
        fprintf(out, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%zu,\"tid\":0,"
                     "\"args\":{\"sort_index\":%zu}}",
                i + 1, i);
        first = 0;
    }
    for (size_t t = 0; t < tl->n_tracks; t++) {
        const track *tr = &tl->tracks[t];
        thread_meta(out, &first, tr->process + 1, t + 1, tr->name, t * 1000);
        for (size_t l = 1; l < lanes[t]; l++) {
            size_t len = strlen(tr->name) + 24;
            char *name = kv_malloc(len);
            snprintf(name, len, "%s (%zu)", tr->name, l + 1);
            thread_meta(out, &first, tr->process + 1, lane_tid[t] + l - 1, name, t * 1000 + l);
            kv_free(name);
        }
    }
    /* Spans in time order, outer before inner: viewers that do not sort still nest them right. */
    qsort(p, n, sizeof *p, by_time);
    for (size_t i = 0; i < n; i++) {
        const span *s = &tl->spans[p[i].span];
        size_t tid = p[i].lane == 0 ? p[i].track + 1 : lane_tid[p[i].track] + p[i].lane - 1;
        /* As fprintf "%s{\"ph\":\"X\",\"pid\":%d,\"tid\":%zu,\"ts\":%lld,\"dur\":%lld,\"name\":" would. */
        char head[160];
        size_t h = 0;
        h += put(head + h, first ? "{\"ph\":\"X\",\"pid\":" : ",\n{\"ph\":\"X\",\"pid\":");
        h += kv_json_format_int(head + h, tl->tracks[s->track].process + 1);
        h += put(head + h, ",\"tid\":");
        h += kv_json_format_int(head + h, (long long)tid);
        h += put(head + h, ",\"ts\":");
        h += kv_json_format_int(head + h, p[i].ts_us);
        h += put(head + h, ",\"dur\":");
        h += kv_json_format_int(head + h, p[i].end_us - p[i].ts_us);
        h += put(head + h, ",\"name\":");
        fwrite(head, 1, h, out);
        kv_json_string(out, s->name);
        fputs(",\"cat\":", out);
        kv_json_string(out, s->category);
        if (s->request >= 0) {
            h = put(head, ",\"args\":{\"request\":");
            h += kv_json_format_int(head + h, (long long)s->request);
            h += put(head + h, "}");
            fwrite(head, 1, h, out);
        }
        fputc('}', out);
        first = 0;
    }
    for (size_t i = 0; i < tl->n_counters; i++) {
        const counter *c = &tl->counters[i];
        fprintf(out, "%s{\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%lld,\"name\":", first ? "" : ",\n", c->process + 1,
                to_us(c->t_s));
        kv_json_string(out, c->name);
        fputs(",\"args\":{", out);
        kv_json_string(out, c->unit);
        fputc(':', out);
        kv_json_number(out, c->value);
        fputs("}}", out);
        first = 0;
    }
    fputs("\n]}\n", out);
    kv_free(p);
    kv_free(lanes);
    kv_free(lane_tid);
}
