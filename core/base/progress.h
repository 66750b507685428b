/* progress.h — a one-line progress report on a terminal while a long simulation runs.
 *
 * The engine calls kv_progress_update on every event; the reporter redraws
 * "label: t=12.3 s simulated, 120/400 requests, 1.2 M events/s" with \r at
 * most a few times a second, and only when it was created enabled and its
 * stream is a terminal, after the run has lasted half a second (short runs
 * show nothing). Otherwise every call is a cheap no-op. What it prints never
 * reaches an output file, so wall-clock time here does not touch determinism.
 */
#ifndef KV_PROGRESS_H
#define KV_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kv_progress kv_progress;

/* enabled: the scenario's outputs.progress. Returns NULL (a valid no-op
   reporter) when disabled or when out is not a terminal. label is copied. */
kv_progress *kv_progress_create(FILE *out, int enabled, const char *label, size_t requests_total);
/* now_s: simulated clock; done: requests finished; events: processed so far. NULL is fine. */
void kv_progress_update(kv_progress *p, double now_s, size_t done, uint64_t events);
/* Clears the line (if one was drawn) and frees. NULL is fine. */
void kv_progress_finish(kv_progress *p);
/* Clears the line (if one was drawn); later updates may draw again. NULL is fine. (A run in another
   process, whose copy of p is the one that drew, ends with this.) */
void kv_progress_clear(kv_progress *p);

/* Whether out is a terminal (for callers that draw their own lines). */
int kv_progress_is_terminal(FILE *out);

#endif
