/* progress.c — the terminal progress line (see progress.h). */
#include "core/base/progress.h"

#include <time.h>
#include <unistd.h>

#include "core/base/alloc.h"

struct kv_progress {
    FILE *out;
    char *label;           /* owned */
    size_t total;          /* requests in the run */
    uint64_t calls;        /* update calls, to look at the clock only every 1024th */
    double start_wall_s;   /* monotonic clock at create */
    double last_draw_s;    /* monotonic clock of the last redraw (0: never drawn) */
    uint64_t last_events;  /* events at the last redraw, for the rate */
    double rate;           /* events per wall second, smoothed */
    int drawn;             /* a line is on the screen */
};

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int kv_progress_is_terminal(FILE *out)
{
    return out && isatty(fileno(out));
}

kv_progress *kv_progress_create(FILE *out, int enabled, const char *label, size_t requests_total)
{
    if (!enabled || !kv_progress_is_terminal(out))
        return NULL;
    kv_progress *p = kv_calloc(1, sizeof *p);
    p->out = out;
    p->label = kv_strdup(label ? label : "run");
    p->total = requests_total;
    p->start_wall_s = wall_s();
    return p;
}

void kv_progress_update(kv_progress *p, double now_s, size_t done, uint64_t events)
{
    if (!p || (++p->calls & 1023) != 0)
        return;
    double t = wall_s();
    double since = t - (p->last_draw_s > 0 ? p->last_draw_s : p->start_wall_s);
    if (t - p->start_wall_s < 0.5 || since < 0.25)
        return;
    /* The rate is measured between redraws; before the first one, set-up time would distort it. */
    if (p->last_draw_s > 0) {
        double r = (double)(events - p->last_events) / since;
        p->rate = p->rate > 0 ? 0.5 * p->rate + 0.5 * r : r;
    }
    p->last_events = events;
    p->last_draw_s = t;
    fprintf(p->out, "\r\033[K%s: t=%.1f s simulated, %zu/%zu requests", p->label, now_s, done, p->total);
    if (p->rate > 0)
        fprintf(p->out, ", %.2g M events/s", p->rate / 1e6);
    fflush(p->out);
    p->drawn = 1;
}

void kv_progress_clear(kv_progress *p)
{
    if (!p || !p->drawn)
        return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->drawn = 0;
}

void kv_progress_finish(kv_progress *p)
{
    if (!p)
        return;
    kv_progress_clear(p);
    kv_free(p->label);
    kv_free(p);
}
