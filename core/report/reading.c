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
        const kv_acc_figures *a = r->accuracy;
        fprintf(out, "%s%s %+.3f ±%.3f", any ? ", " : "; at a delta perplexity of ", r->name, a->delta_ppl,
                (a->delta_ppl_ci95[1] - a->delta_ppl_ci95[0]) / 2);
        any = true;
    }
    if (any)
        fputs(" on the reference model", out);
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
    fputc('\n', out);
}
