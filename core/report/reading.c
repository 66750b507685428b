/* reading.c — one line under the comparison table that says what its rows show, computed from them. */
#include "core/report/reading.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* The row the others are read against: the policy named bf16, else the least compressed one. */
static size_t baseline_row(const kv_policy_outcome *o, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(o[i].name, "bf16") == 0)
            return i;
        if (o[i].summary.compression_ratio < o[best].summary.compression_ratio)
            best = i;
    }
    return best;
}

/* A row's mean time to its first token: the speculative one when it speculates. */
static bool speculates(const kv_summary *m) { return m->spec_tokens > 0 && !isnan(m->ttft_spec_ms.mean); }

static double first_token_ms(const kv_summary *m) { return speculates(m) ? m->ttft_spec_ms.mean : m->ttft_ms.mean; }

/* The row minimising (sign +1) or maximising (sign -1) f, skipping NaN; n when none. */
static size_t pick(const kv_policy_outcome *o, size_t n, double (*f)(const kv_summary *), double sign)
{
    size_t best = n;
    for (size_t i = 0; i < n; i++) {
        double v = f(&o[i].summary);
        if (!isnan(v) && (best == n || sign * v < sign * f(&o[best].summary)))
            best = i;
    }
    return best;
}

static double p99_ttft(const kv_summary *m) { return m->ttft_ms.p99; }
static double ratio(const kv_summary *m) { return m->compression_ratio; }
static double e2el(const kv_summary *m) { return m->e2el_ms.mean; }

/* A row's delta perplexity when measured, else NaN. */
static double delta_ppl(const kv_policy_outcome *o)
{
    return o->accuracy && o->accuracy->measured ? o->accuracy->delta_ppl : NAN;
}

/* The larger side of a delta-perplexity interval, as the accuracy table prints it. */
static double half_width(const kv_acc_figures *a)
{
    return fmax(a->delta_ppl_ci95[1] - a->delta_ppl, a->delta_ppl - a->delta_ppl_ci95[0]);
}

/* "; delta perplexity: A +x ±y, B ..." for the named rows (each once), when measured. */
static void accuracy_clause(FILE *out, const kv_policy_outcome *o, const size_t *rows, size_t k)
{
    bool any = false;
    for (size_t j = 0; j < k; j++) {
        bool seen = false;
        for (size_t i = 0; i < j; i++)
            seen = seen || rows[i] == rows[j];
        const kv_policy_outcome *r = &o[rows[j]];
        if (seen || isnan(delta_ppl(r)))
            continue;
        fprintf(out, "%s%s %+.3f ±%.3f", any ? ", " : "; at a delta perplexity of ", r->name, r->accuracy->delta_ppl,
                half_width(r->accuracy));
        any = true;
    }
    if (any)
        fputs(" on the reference model", out);
}

/* The compressed row (not the baseline) whose delta perplexity is nearest 0, n when none is measured. */
static size_t least_lost(const kv_policy_outcome *o, size_t n, size_t base)
{
    size_t best = n;
    for (size_t i = 0; i < n; i++)
        if (i != base && !isnan(delta_ppl(&o[i])) &&
            (best == n || fabs(delta_ppl(&o[i])) < fabs(delta_ppl(&o[best]))))
            best = i;
    return best;
}

/* "; the least accuracy lost: P +x ±y at R x smaller KV" when P is not among the rows already named. */
static void least_lost_clause(FILE *out, const kv_policy_outcome *o, size_t n, size_t base, const size_t *rows,
                              size_t k)
{
    size_t l = least_lost(o, n, base);
    if (l == n)
        return;
    for (size_t j = 0; j < k; j++)
        if (rows[j] == l)
            return;
    double r = o[l].summary.compression_ratio / o[base].summary.compression_ratio;
    fprintf(out, "; the least accuracy lost: %s %+.3f ±%.3f with %.2fx smaller KV", o[l].name,
            o[l].accuracy->delta_ppl, half_width(o[l].accuracy), r);
}

/* Decimals that show a ratio with at least two significant digits (0.78, 0.018, 0.0018). */
static int decimals(double r)
{
    int d = 2;
    while (d < 6 && r > 0 && r < 0.095 * pow(10, 2 - d))
        d++;
    return d;
}
#define D(r) decimals(r), (r) /* the precision and the value, for "%.*f" */

void kv_report_reading(FILE *out, const kv_policy_outcome *o, size_t n)
{
    if (n < 2)
        return;
    size_t b = baseline_row(o, n);
    const kv_summary *base = &o[b].summary;
    size_t fast = pick(o, n, first_token_ms, 1), tail = pick(o, n, p99_ttft, 1);
    size_t small = pick(o, n, ratio, -1), done = pick(o, n, e2el, 1);
    if (fast == n || tail == n || small == n || done == n || !(first_token_ms(base) > 0) ||
        !(base->ttft_ms.p99 > 0) || !(base->e2el_ms.mean > 0))
        return;
    double r_fast = first_token_ms(&o[fast].summary) / first_token_ms(base);
    double r_tail = o[tail].summary.ttft_ms.p99 / base->ttft_ms.p99;
    double r_small = o[small].summary.compression_ratio / base->compression_ratio;
    double r_done = o[done].summary.e2el_ms.mean / base->e2el_ms.mean;
    const char *spec = speculates(&o[fast].summary) ? ", speculative" : "";
    if (fast == tail && tail == small && small == done) {
        fprintf(out, "reading: against %s, %s leads on every count: first token %.*fx%s, p99 TTFT %.*fx, KV on the "
                     "wire %.*fx smaller, mean end-to-end latency %.*fx",
                o[b].name, o[fast].name, D(r_fast), spec, D(r_tail), D(r_small), D(r_done));
        accuracy_clause(out, o, &fast, 1);
        least_lost_clause(out, o, n, b, &fast, 1);
        fputc('\n', out);
        return;
    }
    fprintf(out, "reading: against %s, the first token comes soonest with %s (%.*fx %s's mean%s), the p99 TTFT is "
                 "lowest with %s (%.*fx), the KV on the wire is smallest with %s (%.*fx smaller) and requests "
                 "finish soonest with %s (%.*fx the mean end-to-end latency)",
            o[b].name, o[fast].name, D(r_fast), o[b].name, spec, o[tail].name, D(r_tail), o[small].name,
            D(r_small), o[done].name, D(r_done));
    size_t rows[4] = {fast, tail, small, done};
    accuracy_clause(out, o, rows, 4);
    least_lost_clause(out, o, n, b, rows, 4);
    fputc('\n', out);
}
