/* timeline.c — collect spans, emit trace-event JSON ("X" complete events, "M" names). */
#include "core/timeline.h"

#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

typedef struct span {
    int process, track;
    char *name;           /* owned */
    const char *category; /* static strings from the engine */
    double t0_s, t1_s;
    int64_t request;
} span;

typedef struct track {
    int process;
    char *name;
} track;

struct kv_timeline {
    span *spans;
    size_t n_spans, cap_spans;
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
    for (size_t i = 0; i < tl->n_tracks; i++)
        kv_free(tl->tracks[i].name);
    for (size_t i = 0; i < tl->n_processes; i++)
        kv_free(tl->processes[i]);
    kv_free(tl->spans);
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

void kv_timeline_write(const kv_timeline *tl, FILE *out)
{
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out);
    int first = 1;
    for (size_t i = 0; i < tl->n_processes; i++) {
        fprintf(out, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%zu,\"tid\":0,\"args\":{\"name\":",
                first ? "" : ",\n", i + 1);
        kv_json_string(out, tl->processes[i]);
        fputs("}}", out);
        first = 0;
    }
    for (size_t i = 0; i < tl->n_tracks; i++) {
        fprintf(out, "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%zu,\"args\":{\"name\":",
                first ? "" : ",\n", tl->tracks[i].process + 1, i + 1);
        kv_json_string(out, tl->tracks[i].name);
        fprintf(out, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%zu,"
                     "\"args\":{\"sort_index\":%zu}}",
                tl->tracks[i].process + 1, i + 1, i);
        first = 0;
    }
    for (size_t i = 0; i < tl->n_spans; i++) {
        const span *s = &tl->spans[i];
        fprintf(out, "%s{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", first ? "" : ",\n", s->process + 1,
                s->track + 1);
        kv_json_number(out, s->t0_s * 1e6);
        fputs(",\"dur\":", out);
        kv_json_number(out, (s->t1_s - s->t0_s) * 1e6);
        fputs(",\"name\":", out);
        kv_json_string(out, s->name);
        fputs(",\"cat\":", out);
        kv_json_string(out, s->category);
        if (s->request >= 0)
            fprintf(out, ",\"args\":{\"request\":%lld}", (long long)s->request);
        fputs("}", out);
        first = 0;
    }
    fputs("\n]}\n", out);
}
