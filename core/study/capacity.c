/* capacity.c — goodput search (bracket, then bisect the load factor) and its table and capacity.json. */
#include "core/study/capacity.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/json.h"

const char *const kv_capacity_status_names[] = {"found", "unbounded", "none"};

int kv_capacity_parse_slo(const char *text, kv_slo *slo, kv_error *err)
{
    slo->ttft_ms = slo->tpot_ms = slo->e2el_ms = NAN;
    if (!text || !*text)
        return kv_error_set(err, KV_EINPUT, "--slo: empty; expected e.g. ttft_ms=500,tpot_ms=50");
    int bounds = 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *part = kv_strndup(p, len);
        char *eq = strchr(part, '=');
        int rc = KV_OK;
        if (!eq) {
            rc = kv_error_set(err, KV_EINPUT, "--slo: '%s': expected KEY=MS (ttft_ms, tpot_ms, e2el_ms)", part);
        } else {
            *eq = '\0';
            const char *key = part, *val = eq + 1;
            double *dst = NULL;
            if (strcmp(key, "ttft_ms") == 0 || strcmp(key, "ttft_p99_ms") == 0)
                dst = &slo->ttft_ms;
            else if (strcmp(key, "tpot_ms") == 0 || strcmp(key, "tpot_p99_ms") == 0)
                dst = &slo->tpot_ms;
            else if (strcmp(key, "e2el_ms") == 0 || strcmp(key, "e2el_p99_ms") == 0)
                dst = &slo->e2el_ms;
            char *vend = NULL;
            errno = 0;
            double v = *val ? strtod(val, &vend) : NAN;
            if (!dst)
                rc = kv_error_set(err, KV_EINPUT, "--slo: unknown bound '%s' (ttft_ms, tpot_ms, e2el_ms; or "
                                  "ttft_p99_ms, tpot_p99_ms, e2el_p99_ms)", key);
            else if (!isnan(*dst))
                rc = kv_error_set(err, KV_EINPUT, "--slo: '%s' given twice", key);
            else if (!*val || *vend != '\0' || errno || !isfinite(v) || !(v > 0))
                rc = kv_error_set(err, KV_EINPUT, "--slo: %s: expected a positive number of ms, got '%s'", key, val);
            else
                *dst = v;
        }
        kv_free(part);
        if (rc)
            return rc;
        bounds++;
        if (!end)
            break;
        p = end + 1;
        if (!*p)
            return kv_error_set(err, KV_EINPUT, "--slo: '%s' ends with a comma", text);
    }
    return bounds ? KV_OK : kv_error_set(err, KV_EINPUT, "--slo: no bound given");
}

double kv_capacity_attainment(const kv_run_result *r, const kv_slo *slo, size_t *met)
{
    size_t ok = 0;
    for (size_t i = 0; i < r->n_requests; i++) {
        const kv_request_result *q = &r->requests[i];
        if (q->done_s < 0 || q->first_token_s < 0)
            continue; /* not completed: misses every bound */
        double ttft = (q->first_token_s - q->arrival_s) * 1e3, e2el = (q->done_s - q->arrival_s) * 1e3;
        double tpot = q->output_tokens > 1 ? (q->done_s - q->first_token_s) * 1e3 / (q->output_tokens - 1) : 0.0;
        if ((isnan(slo->ttft_ms) || ttft <= slo->ttft_ms) && (isnan(slo->tpot_ms) || tpot <= slo->tpot_ms) &&
            (isnan(slo->e2el_ms) || e2el <= slo->e2el_ms))
            ok++;
    }
    if (met)
        *met = ok;
    return r->n_requests ? (double)ok / (double)r->n_requests : 0.0;
}

typedef struct search {
    kv_study *st;
    const kv_scenario *s;
    const kv_capacity_config *cfg;
    size_t policy;
    kv_capacity_policy *out;
    size_t cap;
    int unscalable; /* the last probe's workload could not be built at its factor (a trace stretched past
                       KV_TRACE_MAX_TIME_S) */
} search;

/* Runs the policy at factor f (or finds the probe already made there). */
static int probe(search *x, double f, kv_capacity_probe *p, kv_error *err)
{
    for (size_t i = 0; i < x->out->n_probes; i++)
        if (x->out->probes[i].factor == f) {
            *p = x->out->probes[i];
            return KV_OK;
        }
    int rc = kv_study_rescale(x->st, f, err);
    x->unscalable = rc == KV_EINPUT;
    if (!rc)
        rc = kv_study_run_policy(x->st, x->policy, err);
    if (rc) {
        kv_scenario_locate(x->s, err);
        return kv_error_prefix(err, "capacity probe at %g x the scenario's load: ", f);
    }
    const kv_policy_outcome *o = kv_study_outcome(x->st, x->policy);
    memset(p, 0, sizeof *p);
    p->factor = f;
    p->rate = kv_study_offered_rate(x->st);
    p->knob = x->s->workload.trace.format == KV_WORKLOAD_TRACE_NONE ? x->s->workload.rate_per_s * f
                                                                     : kv_study_time_scale(x->s, f);
    p->requests = o->run.n_requests;
    p->attainment = kv_capacity_attainment(&o->run, &x->cfg->slo, &p->met);
    kv_grow((void **)&x->out->probes, sizeof *x->out->probes, &x->cap, x->out->n_probes + 1);
    x->out->probes[x->out->n_probes++] = *p;
    return KV_OK;
}

static int meets(const search *x, const kv_capacity_probe *p)
{
    return p->attainment >= x->cfg->attainment;
}

static int by_factor(const void *a, const void *b)
{
    double fa = ((const kv_capacity_probe *)a)->factor, fb = ((const kv_capacity_probe *)b)->factor;
    return (fa > fb) - (fa < fb);
}

static int search_policy(search *x, kv_error *err)
{
    kv_capacity_probe lo, hi, p;
    int rc = probe(x, 1.0, &p, err);
    if (rc)
        return rc;
    double f = 1.0;
    if (meets(x, &p)) {
        lo = p;
        int steps = 0;
        for (;;) {
            if (steps++ == KV_CAPACITY_MAX_STEPS) {
                x->out->status = KV_CAPACITY_UNBOUNDED;
                x->out->best = lo;
                return KV_OK;
            }
            f *= 2;
            if ((rc = probe(x, f, &p, err)) != KV_OK)
                return rc;
            if (!meets(x, &p))
                break;
            lo = p;
        }
        hi = p;
    } else {
        hi = p;
        int steps = 0;
        for (;;) {
            if (steps++ == KV_CAPACITY_MAX_STEPS) {
                x->out->status = KV_CAPACITY_NONE;
                x->out->above = hi;
                return KV_OK;
            }
            f /= 2;
            if ((rc = probe(x, f, &p, err)) != KV_OK && x->unscalable) {
                /* A trace cannot be stretched that far: stop halving, the SLOs were missed at every rate tried. */
                x->out->status = KV_CAPACITY_NONE;
                x->out->above = hi;
                memset(err, 0, sizeof *err);
                return KV_OK;
            }
            if (rc)
                return rc;
            if (meets(x, &p))
                break;
            hi = p;
        }
        lo = p;
    }
    while (hi.factor - lo.factor > x->cfg->precision * lo.factor) {
        double mid = 0.5 * (lo.factor + hi.factor);
        if ((rc = probe(x, mid, &p, err)) != KV_OK)
            return rc;
        if (meets(x, &p))
            lo = p;
        else
            hi = p;
    }
    x->out->status = KV_CAPACITY_FOUND;
    x->out->best = lo;
    x->out->above = hi;
    return KV_OK;
}

int kv_capacity_search(kv_study *st, const kv_scenario *s, const kv_capacity_config *cfg, kv_capacity_result *out,
                       kv_error *err)
{
    memset(out, 0, sizeof *out);
    out->cfg = *cfg;
    bool trace = s->workload.trace.format != KV_WORKLOAD_TRACE_NONE;
    out->knob = trace ? "workload.trace.time_scale" : "workload.rate_per_s";
    if (!trace && !(s->workload.rate_per_s > 0)) {
        kv_error_set_key(err, KV_EINPUT, "workload.rate_per_s",
                         "workload.rate_per_s: is 0 (every request at once): kvsim capacity scales a rate > 0");
        kv_scenario_locate(s, err);
        return KV_EINPUT;
    }
    out->n = s->policies.count;
    out->policies = kv_calloc(out->n ? out->n : 1, sizeof *out->policies);
    int rc = KV_OK;
    for (size_t i = 0; !rc && i < out->n; i++) {
        search x = {.st = st, .s = s, .cfg = cfg, .policy = i, .out = &out->policies[i]};
        out->policies[i].name = s->policies.items[i];
        rc = search_policy(&x, err);
        if (out->policies[i].n_probes > 1)
            qsort(out->policies[i].probes, out->policies[i].n_probes, sizeof *out->policies[i].probes, by_factor);
    }
    return rc;
}

void kv_capacity_result_free(kv_capacity_result *r)
{
    for (size_t i = 0; r->policies && i < r->n; i++)
        kv_free(r->policies[i].probes);
    kv_free(r->policies);
    memset(r, 0, sizeof *r);
}

static void slo_text(char *buf, size_t size, const kv_slo *slo)
{
    size_t n = 0;
    buf[0] = '\0';
    const double v[] = {slo->ttft_ms, slo->tpot_ms, slo->e2el_ms};
    const char *names[] = {"ttft", "tpot", "e2el"};
    for (int i = 0; i < 3; i++)
        if (!isnan(v[i]) && n < size)
            n += (size_t)snprintf(buf + n, size - n, "%s%s <= %g ms", n ? ", " : "", names[i], v[i]);
}

void kv_capacity_print(FILE *out, const kv_scenario *s, const kv_capacity_result *r)
{
    char slo[160];
    slo_text(slo, sizeof slo, &r->cfg.slo);
    fprintf(out, "\n%s — capacity: %s for >= %.3g of requests; %s scaled, precision %.3g (relative), seed %d\n",
            s->name, slo, r->cfg.attainment, r->knob, r->cfg.precision, s->seed);
    fprintf(out, "%-10s %13s %8s %13s %8s %7s  %s\n", "policy", "goodput req/s", "attain", "next req/s", "attain",
                 "probes", "status");
    for (size_t i = 0; i < r->n; i++) {
        const kv_capacity_policy *p = &r->policies[i];
        fprintf(out, "%-10.10s", p->name);
        if (p->status != KV_CAPACITY_NONE)
            fprintf(out, " %13.4f %8.3f", p->best.rate, p->best.attainment);
        else
            fprintf(out, " %13s %8s", "-", "-");
        if (p->status != KV_CAPACITY_UNBOUNDED)
            fprintf(out, " %13.4f %8.3f", p->above.rate, p->above.attainment);
        else
            fprintf(out, " %13s %8s", "-", "-");
        fprintf(out, " %7zu  %s\n", p->n_probes,
                p->status == KV_CAPACITY_FOUND       ? "found"
                : p->status == KV_CAPACITY_UNBOUNDED ? "met at every rate tried (up to 2^16 x the scenario's)"
                                                     : "missed at every rate tried (down to 2^-16 x)");
    }
    fprintf(out, "(goodput = highest offered rate at which >= %.3g of requests meet every bound (DistServe); next = "
                 "the lowest rate above it that misses,\n within %.3g relative; reproduce a row with kvsim run "
                 "--set %s=VALUE from capacity.json)\n",
            r->cfg.attainment, r->cfg.precision, r->knob);
}

static void jnum(FILE *out, const char *key, double v, const char *after)
{
    kv_json_string(out, key);
    fputc(':', out);
    kv_json_number(out, v);
    fputs(after, out);
}

static void jprobe(FILE *out, const kv_capacity_result *r, const kv_capacity_probe *p)
{
    fputc('{', out);
    jnum(out, "factor", p->factor, ",");
    jnum(out, "rate", p->rate, ",");
    jnum(out, "value", p->knob, ",");
    char num[KV_JSON_NUMBER_SIZE], set[256];
    kv_json_format_number(num, p->knob);
    snprintf(set, sizeof set, "%s=%s", r->knob, num);
    kv_json_string(out, "set");
    fputc(':', out);
    kv_json_string(out, set);
    fputc(',', out);
    jnum(out, "attainment", p->attainment, ",");
    jnum(out, "met", (double)p->met, ",");
    jnum(out, "requests", (double)p->requests, "}");
}

void kv_capacity_json(FILE *out, const kv_scenario *s, const kv_capacity_result *r)
{
    fputs("{\n", out);
    kv_json_string(out, "kvsim_version");
    fputc(':', out);
    kv_json_string(out, KV_VERSION);
    fputs(",\n\"scenario\":{\"name\":", out);
    kv_json_string(out, s->name);
    fputs(",\"path\":", out);
    kv_json_string(out, s->path);
    fputc(',', out);
    jnum(out, "seed", s->seed, "},\n");
    fputs("\"overrides\":[", out);
    for (int i = 0; i < s->n_overrides; i++) {
        if (i)
            fputc(',', out);
        kv_json_string(out, s->overrides[i]);
    }
    fputs("],\n\"slo\":{", out);
    jnum(out, "ttft_ms", r->cfg.slo.ttft_ms, ",");
    jnum(out, "tpot_ms", r->cfg.slo.tpot_ms, ",");
    jnum(out, "e2el_ms", r->cfg.slo.e2el_ms, "},\n");
    jnum(out, "attainment", r->cfg.attainment, ",");
    jnum(out, "precision", r->cfg.precision, ",");
    jnum(out, "max_doublings", KV_CAPACITY_MAX_STEPS, ",\n");
    fputs("\"scaled\":", out);
    kv_json_string(out, r->knob);
    fputs(",\n\"policies\":[\n", out);
    for (size_t i = 0; i < r->n; i++) {
        const kv_capacity_policy *p = &r->policies[i];
        fputs("{\"name\":", out);
        kv_json_string(out, p->name);
        fputs(",\"status\":", out);
        kv_json_string(out, kv_capacity_status_names[p->status]);
        fputc(',', out);
        bool has_best = p->status != KV_CAPACITY_NONE, has_above = p->status != KV_CAPACITY_UNBOUNDED;
        jnum(out, "goodput_rate", has_best ? p->best.rate : NAN, ",");
        jnum(out, "attainment", has_best ? p->best.attainment : NAN, ",");
        /* The same answer under the names a sweep's columns carry (docs/sweeps.md): capacity_req_s is
           goodput_rate; goodput_req_s the requests meeting the SLOs per second there (rate x attainment,
           vLLM's "request goodput"); above_* the next rate, which misses them. */
        jnum(out, "capacity_req_s", has_best ? p->best.rate : NAN, ",");
        jnum(out, "goodput_req_s", has_best ? p->best.rate * p->best.attainment : NAN, ",");
        jnum(out, "above_rate", has_above ? p->above.rate : NAN, ",");
        jnum(out, "above_attainment", has_above ? p->above.attainment : NAN, ",\n");
        fputs("\"best\":", out);
        if (has_best)
            jprobe(out, r, &p->best);
        else
            fputs("null", out);
        fputs(",\n\"above\":", out);
        if (has_above)
            jprobe(out, r, &p->above);
        else
            fputs("null", out);
        fputs(",\n\"probes\":[", out);
        for (size_t k = 0; k < p->n_probes; k++) {
            fputs(k ? ",\n" : "\n", out);
            jprobe(out, r, &p->probes[k]);
        }
        fputs("]}", out);
        fputs(i + 1 < r->n ? ",\n" : "\n", out);
    }
    fputs("]\n}\n", out);
}

int kv_capacity_write(const char *dir, const kv_scenario *s, const kv_capacity_result *r, kv_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/capacity.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return kv_error_set(err, KV_EFAIL, "%s: cannot create: %s", path, strerror(errno));
    kv_capacity_json(f, s, r);
    int bad = ferror(f) || fflush(f) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? kv_error_set(err, KV_EFAIL, "%s: write failed: %s", path, strerror(e)) : KV_OK;
}
