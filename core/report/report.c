/* report.c — comparison table, JSON and CSV outputs (deterministic formatting). */
#include "core/report/report.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/json.h"

static void cell(FILE *out, double v, int width, int prec)
{
    if (isnan(v))
        fprintf(out, " %*s", width, "-");
    else
        fprintf(out, " %*.*f", width, prec, v);
}

/* Whether some request of the run went beyond the longest length its statistics were measured at. */
static bool beyond(const kv_run_result *r)
{
    return r->accept_beyond_requests > 0 || r->diffkv_beyond_requests > 0;
}

/* A count of tokens with thousands separated: 8,192. */
static void tokens_text(int v, char *buf, size_t len)
{
    if (v >= 1000000)
        snprintf(buf, len, "%d,%03d,%03d", v / 1000000, v / 1000 % 1000, v % 1000);
    else if (v >= 1000)
        snprintf(buf, len, "%d,%03d", v / 1000, v % 1000);
    else
        snprintf(buf, len, "%d", v);
}

/* The footnote under the table for a policy marked with a dagger. */
static void beyond_footnote(FILE *out, const char *name, const kv_run_result *r)
{
    char t[32];
    if (r->accept_beyond_requests > 0) {
        tokens_text(r->accept_longest_tokens, t, sizeof t);
        double lo = fmin(r->accept_held_mean, r->accept_trend_mean), hi = fmax(r->accept_held_mean, r->accept_trend_mean);
        fprintf(out, "\xe2\x80\xa0 %s: %.0f%% of requests beyond the measured %s prompt tokens: acceptance held there "
                     "(mean %.2f); trend band %.2f\xe2\x80\x93%.2f\n",
                name, 100 * r->accept_beyond_share, t, r->accept_held_mean, lo, hi);
    }
    if (r->diffkv_beyond_requests > 0) {
        tokens_text(r->diffkv_longest_tokens, t, sizeof t);
        double held = r->diffkv_held_high + r->diffkv_held_low, trend = r->diffkv_trend_high + r->diffkv_trend_low;
        fprintf(out, "\xe2\x80\xa0 %s: %.0f%% of requests beyond the measured %s context tokens: DiffKV tiers held there "
                     "(kept %.2f, high %.2f); trend band kept %.2f\xe2\x80\x93%.2f, high %.2f\xe2\x80\x93%.2f\n",
                name, 100 * r->diffkv_beyond_share, t, held, r->diffkv_held_high, fmin(held, trend), fmax(held, trend),
                fmin(r->diffkv_held_high, r->diffkv_trend_high), fmax(r->diffkv_held_high, r->diffkv_trend_high));
    }
}

void kv_report_table(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n)
{
    fprintf(out, "\n%s — %s, %d prefill + %d decode x %s (tp %d), network %s %.0f Gbit/s, %zu requests, seed %d\n",
            s->name, s->model_card.name, s->cluster.prefill.nodes, s->cluster.decode.nodes, s->decode_device.name,
            s->cluster.decode.tp, n ? o[0].run.network : kv_network_model_names[s->network.model],
            s->network.nic_bandwidth_gbps, n ? o[0].run.n_requests : 0, s->seed);
    char ttkt[32];
    snprintf(ttkt, sizeof ttkt, "ttkt@%d", s->lynx.ttkt_k);
    fprintf(out, "%-10s %9s %6s %9s %9s %9s %9s %9s %8s %9s %8s %7s\n", "policy", "KV MB/req", "ratio", "xfer ms",
            "ttft_spec", "ttft ms", "p99 ttft", ttkt, "tpot ms", "e2el ms", "req/s", "accept");
    bool any_fixed = false;
    for (size_t i = 0; i < n; i++) {
        const kv_summary *m = &o[i].summary;
        if (beyond(&o[i].run))
            fprintf(out, "%-.9s\xe2\x80\xa0%*s", o[i].name, 9 - (int)(strlen(o[i].name) < 9 ? strlen(o[i].name) : 9), "");
        else
            fprintf(out, "%-10.10s", o[i].name);
        cell(out, m->mean_kv_wire_bytes / 1e6, 9, 1);
        cell(out, m->compression_ratio, 6, 2);
        cell(out, m->transfer_ms.mean, 9, 2);
        cell(out, m->ttft_spec_ms.mean, 9, 2);
        cell(out, m->ttft_ms.mean, 9, 2);
        cell(out, m->ttft_ms.p99, 9, 2);
        cell(out, m->ttkt_ms.mean, 9, 2);
        cell(out, m->tpot_ms.mean, 8, 3);
        cell(out, m->e2el_ms.mean, 9, 1);
        cell(out, m->request_throughput, 8, 3);
        cell(out, m->spec_accept_rate, 7, 3);
        if (!isnan(m->spec_accept_rate) && strncmp(o[i].run.acceptance_source, "scenario", 8) == 0) {
            fputs(" fixed", out); /* drawn from lynx.acceptance, not measured: said on the row (#20) */
            any_fixed = true;
        }
        fputc('\n', out);
    }
    fprintf(out, "(ms are means over requests unless p99; ttft_spec = first speculative token, ttft = first "
                 "committed token,\n ttkt@K = K-th committed token; accept = accepted / speculated%s; timing: %s)\n",
            any_fixed ? " (fixed: drawn from lynx.acceptance, not measured)" : "",
            n ? o[0].run.timing_source : "model");
    for (size_t i = 0; i < n; i++)
        beyond_footnote(out, o[i].name, &o[i].run);
    kv_report_memory_table(out, s, o, n);
}

/* " " then "v ±h" in width columns (v scaled, with prec decimals, signed if sign; h the larger side of the
   interval), "v" alone without an interval, "-" when not measured. */
static void acc_cell(FILE *out, bool measured, double v, const double ci[2], double scale, int width, int prec,
                     bool sign)
{
    char buf[64];
    if (!measured || isnan(v)) {
        snprintf(buf, sizeof buf, "-");
    } else {
        int k = snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", prec, v * scale);
        if (!isnan(ci[0]) && !isnan(ci[1]) && ci[1] > ci[0])
            snprintf(buf + k, sizeof buf - (size_t)k, " \u00b1%.*f", prec, fmax(ci[1] - v, v - ci[0]) * scale);
    }
    int pad = width - (int)strlen(buf) + (strstr(buf, "\u00b1") ? 1 : 0); /* "±": two bytes, one column */
    fprintf(out, " %*s%s", pad > 0 ? pad : 0, "", buf);
}

void kv_report_accuracy_table(FILE *out, const kv_policy_outcome *o, size_t n, const char *notes)
{
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any |= o[i].accuracy != NULL;
    if (any) {
        fprintf(out, "%-10s %9s %8s %15s %12s %12s %12s\n", "accuracy", "ttft ms", "tpot ms", "delta ppl", "top1 agree%",
                "needle%", "accept%");
        for (size_t i = 0; i < n; i++) {
            const kv_acc_figures *a = o[i].accuracy;
            static const kv_acc_figures none = {0};
            if (!a)
                a = &none;
            fprintf(out, "%-10.10s", o[i].name);
            cell(out, o[i].summary.ttft_ms.mean, 9, 2);
            cell(out, o[i].summary.tpot_ms.mean, 8, 3);
            acc_cell(out, a->measured, a->delta_ppl, a->delta_ppl_ci95, 1.0, 15, 3, true);
            acc_cell(out, a->measured, a->top1, a->top1_ci95, 100.0, 12, 1, false);
            acc_cell(out, a->measured, a->needle, a->needle_ci95, 100.0, 12, 0, false);
            acc_cell(out, a->measured && a->spec_k > 0, a->accept, a->accept_ci95, 100.0, 12, 1, false);
            fputc('\n', out);
        }
    }
    if (notes && notes[0])
        fputs(notes, out);
}

/* Share of decode step time the memory manager took (modelled, or measured when asked for). */
static double manager_fraction(const kv_run_result *r, bool measured)
{
    double t = measured ? r->kv_manager_measured_s : r->kv_manager_s;
    return r->decode_busy_s > 0 ? t / r->decode_busy_s : NAN;
}

void kv_report_memory_table(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n)
{
    /* The decode nodes' paged KV memory: what capacity turned into (docs/diffkv.md). */
    fprintf(out, "%-10s %7s %9s %8s %6s %6s %7s %9s %6s %6s %6s %6s\n", "memory", "page B", "tok/page", "peak GB",
            "batch", "max", "preempt", "tok/s", "mgr %", "high", "low", "pruned");
    for (size_t i = 0; i < n; i++) {
        const kv_run_result *r = &o[i].run;
        char tpp[24];
        if (r->kv_tokens_per_page[1] > 0)
            snprintf(tpp, sizeof tpp, "%d/%d", r->kv_tokens_per_page[0], r->kv_tokens_per_page[1]);
        else
            snprintf(tpp, sizeof tpp, "%d", r->kv_tokens_per_page[0]);
        fprintf(out, "%-10.10s %7.0f %9s", o[i].name, r->kv_page_bytes, tpp);
        cell(out, r->kv_mem_peak_bytes / 1e9, 8, 2);
        cell(out, r->mean_decode_batch, 6, 1);
        fprintf(out, " %6d %7llu", r->max_decode_batch, (unsigned long long)r->preemptions);
        cell(out, o[i].summary.output_throughput, 9, 0);
        cell(out, 100 * manager_fraction(r, s->memory.measure_manager), 6, 3);
        cell(out, r->tier_high_fraction, 6, 3);
        cell(out, r->tier_low_fraction, 6, 3);
        cell(out, r->tier_pruned_fraction, 6, 3);
        fputc('\n', out);
    }
    fprintf(out, "(peak GB = most KV pages in use x page size on one decode node; batch = mean decode batch "
                 "(time-weighted), max = largest;\n"
                 " mgr %% = memory-manager time / decode step time, %s; high/low/pruned = DiffKV tiers over every "
                 "(layer, KV head, token))\n",
            s->memory.measure_manager ? "measured wall time of the real calls on timing.backend" : "modelled");
}

static void jkey(FILE *out, const char *key)
{
    kv_json_string(out, key);
    fputc(':', out);
}

static void jnum(FILE *out, const char *key, double v, int comma)
{
    jkey(out, key);
    kv_json_number(out, v);
    if (comma)
        fputc(',', out);
}

static void jstr(FILE *out, const char *key, const char *v, const char *after)
{
    jkey(out, key);
    kv_json_string(out, v);
    fputs(after, out);
}

static void jstat(FILE *out, const char *name, const kv_stat *st)
{
    char key[64];
    snprintf(key, sizeof key, "mean_%s", name);
    jnum(out, key, st->mean, 1);
    snprintf(key, sizeof key, "std_%s", name);
    jnum(out, key, st->std, 1);
    snprintf(key, sizeof key, "median_%s", name);
    jnum(out, key, st->median, 1);
    snprintf(key, sizeof key, "p90_%s", name);
    jnum(out, key, st->p90, 1);
    snprintf(key, sizeof key, "p99_%s", name);
    jnum(out, key, st->p99, 1);
    fputc('\n', out);
}

/* The opening of one "beyond_measured" part: how many requests went past the longest measured length. */
static void beyond_counts(FILE *out, int longest, size_t requests, double share, const char *max_name, int max)
{
    fputc('{', out);
    jnum(out, "longest_measured_tokens", longest, 1);
    jnum(out, "requests", (double)requests, 1);
    jnum(out, "share", share, 1);
    jnum(out, max_name, max, 1);
}

/* "beyond_measured": the requests longer than the measured lengths of the policy's statistics
   (core/kv/curves.h), the method, and the band a log-linear trend would give; null parts where the
   policy read no statistics by length. */
static void json_beyond(FILE *out, const kv_run_result *r)
{
    jkey(out, "beyond_measured");
    fputc('{', out);
    jstr(out, "method", KV_CURVE_BEYOND_METHOD, ",");
    jkey(out, "lynx");
    if (r->accept_longest_tokens > 0) {
        beyond_counts(out, r->accept_longest_tokens, r->accept_beyond_requests, r->accept_beyond_share,
                      "max_prompt_tokens", r->accept_beyond_max_tokens);
        jnum(out, "held_mean_accept", r->accept_held_mean, 1);
        jnum(out, "trend_mean_accept", r->accept_trend_mean, 0);
        fputs("},", out);
    } else {
        fputs("null,", out);
    }
    jkey(out, "diffkv");
    if (r->diffkv_longest_tokens > 0) {
        beyond_counts(out, r->diffkv_longest_tokens, r->diffkv_beyond_requests, r->diffkv_beyond_share,
                      "max_context_tokens", r->diffkv_beyond_max_tokens);
        jnum(out, "held_high", r->diffkv_held_high, 1);
        jnum(out, "held_low", r->diffkv_held_low, 1);
        jnum(out, "held_kept", r->diffkv_held_high + r->diffkv_held_low, 1);
        jnum(out, "trend_high", r->diffkv_trend_high, 1);
        jnum(out, "trend_low", r->diffkv_trend_low, 1);
        jnum(out, "trend_kept", r->diffkv_trend_high + r->diffkv_trend_low, 0);
        fputc('}', out);
    } else {
        fputs("null", out);
    }
    fputs("},\n", out);
}

void kv_report_json(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n)
{
    fputs("{\n", out);
    jstr(out, "kvsim_version", KV_VERSION, ",\n");
    jkey(out, "scenario");
    fputs("{", out);
    jstr(out, "name", s->name, ",");
    jstr(out, "path", s->path, ",");
    jnum(out, "seed", s->seed, 1);
    jstr(out, "model", s->model_card.name, ",");
    jstr(out, "decode_device", s->decode_device.name, ",");
    jstr(out, "prefill_device", s->prefill_device.name, ",");
    jnum(out, "prefill_nodes", s->cluster.prefill.nodes, 1);
    jnum(out, "decode_nodes", s->cluster.decode.nodes, 1);
    jnum(out, "nic_bandwidth_gbps", s->network.nic_bandwidth_gbps, 1);
    jstr(out, "lynx_acceptance_from", kv_lynx_from_names[s->lynx.from], ",");
    jstr(out, "diffkv_scores", kv_diffkv_scores_from_names[s->diffkv.scores], "},\n");
    /* Every --set override, in the order applied: {"key": ..., "value": ...} as written. */
    jkey(out, "overrides");
    fputc('[', out);
    for (int i = 0; i < s->n_overrides; i++) {
        const char *text = s->overrides[i], *eq = strchr(text, '=');
        size_t klen = eq ? (size_t)(eq - text) : strlen(text);
        char *key = kv_strndup(text, klen);
        fputc('{', out);
        jstr(out, "key", key, ",");
        jstr(out, "value", eq ? eq + 1 : "", i + 1 < s->n_overrides ? "}," : "}");
        kv_free(key);
    }
    fputs("],\n", out);
    jkey(out, "policies");
    fputs("[\n", out);
    for (size_t i = 0; i < n; i++) {
        const kv_summary *m = &o[i].summary;
        const kv_run_result *r = &o[i].run;
        fputs("{", out);
        jstr(out, "name", o[i].name, ",");
        jstr(out, "file", o[i].file, ",");
        jstr(out, "network", r->network, ",");
        jstr(out, "timing_source", r->timing_source, ",");
        jstr(out, "acceptance_source", r->acceptance_source, ",");
        jnum(out, "acceptance_samples", (double)o[i].acceptance_samples, 1);
        jstr(out, "tiers_source", r->tiers_source, ",\n");
        /* The policy's parameters in effect (defaults, scenario and --set), sorted by key, as the host renders them. */
        jkey(out, "params");
        fputc('{', out);
        int np = kv_policy_param_count(o[i].policy);
        for (int j = 0; j < np; j++)
            jstr(out, kv_policy_param_key(o[i].policy, j), kv_policy_param_value(o[i].policy, j), j + 1 < np ? "," : "");
        fputs("},\n", out);
        jnum(out, "completed", (double)m->completed, 1);
        jnum(out, "duration", m->duration_s, 1);
        jnum(out, "request_throughput", m->request_throughput, 1);
        jnum(out, "output_throughput", m->output_throughput, 1);
        jnum(out, "total_input_tokens", m->total_input_tokens, 1);
        jnum(out, "total_output_tokens", m->total_output_tokens, 1);
        jnum(out, "total_token_throughput", m->total_token_throughput, 1);
        fputc('\n', out);
        jstat(out, "ttft_ms", &m->ttft_ms);
        jstat(out, "ttft_spec_ms", &m->ttft_spec_ms);
        jstat(out, "ttkt_ms", &m->ttkt_ms);
        jstat(out, "tpot_ms", &m->tpot_ms);
        jstat(out, "itl_ms", &m->itl_ms);
        jstat(out, "e2el_ms", &m->e2el_ms);
        jstat(out, "transfer_ms", &m->transfer_ms);
        jstat(out, "anchor_transfer_ms", &m->anchor_transfer_ms);
        jstat(out, "queue_ms", &m->queue_ms);
        jnum(out, "ttkt_k", s->lynx.ttkt_k, 1);
        jnum(out, "kv_wire_bytes", m->kv_wire_bytes, 1);
        jnum(out, "mean_kv_wire_bytes", m->mean_kv_wire_bytes, 1);
        jnum(out, "anchor_bytes", m->mean_anchor_bytes, 1);
        jnum(out, "residual_bytes", m->mean_residual_bytes, 1);
        jnum(out, "compression_ratio", m->compression_ratio, 1);
        jnum(out, "kept_tokens_fraction", m->kept_tokens_fraction, 1);
        fputc('\n', out);
        jnum(out, "spec_tokens", m->spec_tokens, 1);
        jnum(out, "accepted_tokens", m->accepted_tokens, 1);
        jnum(out, "wasted_tokens", m->wasted_tokens, 1);
        jnum(out, "spec_accept_rate", m->spec_accept_rate, 1);
        jnum(out, "kv_mem_peak_bytes", m->kv_mem_peak_bytes, 1);
        jnum(out, "kv_mem_capacity_bytes", r->kv_mem_capacity_bytes, 1);
        jnum(out, "max_decode_batch", m->max_decode_batch, 1);
        jnum(out, "decode_steps", (double)r->decode_steps, 1);
        fputc('\n', out);
        jnum(out, "kv_page_bytes", r->kv_page_bytes, 1);
        jkey(out, "kv_tokens_per_page");
        fprintf(out, "[%d,%d],", r->kv_tokens_per_page[0], r->kv_tokens_per_page[1]);
        jnum(out, "kv_pages_capacity", r->kv_pages_capacity, 1);
        jnum(out, "kv_pages_peak", r->kv_pages_peak, 1);
        jnum(out, "preemptions", (double)r->preemptions, 1);
        jnum(out, "swap_bytes", r->swap_bytes, 1);
        jnum(out, "decode_busy_s", r->decode_busy_s, 1);
        jnum(out, "mean_decode_batch", r->mean_decode_batch, 1);
        fputc('\n', out);
        jnum(out, "kv_manager_calls", (double)r->kv_manager_calls, 1);
        jnum(out, "kv_manager_ms", r->kv_manager_s * 1e3, 1);
        jnum(out, "kv_manager_charged_ms", r->kv_manager_charged_s * 1e3, 1);
        jnum(out, "kv_manager_fraction", manager_fraction(r, false), 1);
        jnum(out, "kv_manager_measured_ms", r->kv_manager_measured_s * 1e3, 1);
        jnum(out, "kv_manager_measured_fraction", manager_fraction(r, true), 1);
        fputc('\n', out);
        jnum(out, "tier_high_fraction", r->tier_high_fraction, 1);
        jnum(out, "tier_low_fraction", r->tier_low_fraction, 1);
        jnum(out, "tier_pruned_fraction", r->tier_pruned_fraction, 1);
        fputc('\n', out);
        json_beyond(out, r);
        jkey(out, "links");
        fputc('[', out);
        size_t shown = 0;
        for (size_t l = 0; l < r->n_links; l++) {
            if (r->links[l].bytes == 0)
                continue; /* idle links would drown the file on large topologies */
            fputs(shown++ ? ",\n" : "\n", out);
            fputc('{', out);
            jstr(out, "name", r->links[l].name, ",");
            jnum(out, "bytes", (double)r->links[l].bytes, 1);
            jnum(out, "busy_s", r->links[l].busy_s, 1);
            jnum(out, "bandwidth_gbps", r->links[l].bandwidth_gbps, 1);
            jnum(out, "utilisation", m->duration_s > 0 ? r->links[l].busy_s / m->duration_s : NAN, 0);
            fputc('}', out);
        }
        fputc(']', out);
        if (o[i].accuracy) { /* kvsim run of a scenario with an `accuracy:` section */
            const kv_acc_figures *a = o[i].accuracy;
            fputs(",\n", out);
            jkey(out, "accuracy");
            fputc('{', out);
            fprintf(out, "\"measured\":%s,", a->measured ? "true" : "false");
            jstr(out, "source", a->measured ? a->source : "not measured", a->measured ? "," : "");
            if (a->measured) {
                jnum(out, "context_tokens", a->context_tokens, 1);
                jnum(out, "scored_tokens", (double)a->scored_tokens, 1);
                const struct { const char *name; double v; const double *ci; } f[] = {
                    {"delta_ppl", a->delta_ppl, a->delta_ppl_ci95},
                    {"top1_agreement", a->top1, a->top1_ci95},
                    {"needle_recall", a->needle, a->needle_ci95},
                    {"spec_accepted_share", a->spec_k > 0 ? a->accept : NAN, a->accept_ci95},
                };
                for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
                    jnum(out, f[k].name, f[k].v, 1);
                    char ci[64];
                    snprintf(ci, sizeof ci, "%s_ci95", f[k].name);
                    jkey(out, ci);
                    fputc('[', out);
                    kv_json_number(out, isnan(f[k].v) ? NAN : f[k].ci[0]);
                    fputc(',', out);
                    kv_json_number(out, isnan(f[k].v) ? NAN : f[k].ci[1]);
                    fputs("],", out);
                }
                jnum(out, "spec_k", a->spec_k, 0);
            }
            fputc('}', out);
        }
        if (o[i].replicates_json) { /* kvsim run --seeds N: absent for one run, so its bytes stay as they were */
            fputs(",\n", out);
            fputs(o[i].replicates_json, out);
        }
        fputc('}', out);
        fputs(i + 1 < n ? ",\n" : "\n", out);
    }
    fputs("]\n}\n", out);
}

/* A requests.csv row is built in memory and written with one fwrite (stdio per field was most of a run). */
enum { ROW_NAME_MAX = 512 }; /* longer policy names are written on their own */
typedef struct csv_row {
    char buf[ROW_NAME_MAX + 40 * KV_JSON_NUMBER_SIZE]; /* the name, 33 fields, newline */
    size_t n;                                          /* bytes used */
} csv_row;

static void row_uint(csv_row *w, unsigned long long u, bool negative)
{
    w->buf[w->n++] = ',';
    if (negative)
        w->buf[w->n++] = '-';
    w->n += kv_json_format_uint(w->buf + w->n, u);
}

static void row_int(csv_row *w, int v) /* ",%d" */
{
    row_uint(w, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v, v < 0);
}

/* ,number — or just the comma when v is not finite (an empty cell). */
static void csv_num(csv_row *w, double v)
{
    w->buf[w->n++] = ',';
    if (isfinite(v))
        w->n += kv_json_format_number(w->buf + w->n, v);
}

static void csv_ms(csv_row *w, double from, double to)
{
    csv_num(w, from >= 0 && to >= 0 ? (to - from) * 1e3 : NAN);
}

static void csv_fields(csv_row *w, const kv_request_result *q)
{
    row_uint(w, (unsigned long long)q->id, false);
    csv_num(w, q->arrival_s);
    row_int(w, q->prompt_tokens);
    row_int(w, q->output_tokens);
    row_int(w, q->prefill_node);
    row_int(w, q->decode_node);
    const double times[] = {q->prefill_start_s, q->prefill_end_s, q->encode_end_s, q->anchor_arrived_s,
                            q->kv_arrived_s, q->admitted_s, q->first_spec_s, q->first_token_s,
                            q->kth_token_s, q->done_s};
    for (size_t t = 0; t < sizeof times / sizeof times[0]; t++)
        csv_num(w, times[t] >= 0 ? times[t] : NAN);
    csv_ms(w, q->arrival_s, q->first_token_s);
    csv_ms(w, q->arrival_s, q->first_spec_s);
    csv_ms(w, q->arrival_s, q->kth_token_s);
    csv_num(w, q->output_tokens > 1 && q->done_s >= 0
                   ? (q->done_s - q->first_token_s) * 1e3 / (q->output_tokens - 1)
                   : NAN);
    csv_ms(w, q->arrival_s, q->done_s);
    csv_num(w, q->anchor_bytes);
    csv_num(w, q->residual_bytes);
    csv_num(w, q->kept_tokens_fraction);
    row_int(w, q->spec_tokens);
    row_int(w, q->accepted_tokens);
    row_int(w, q->verifications);
    csv_num(w, q->tier_high_fraction);
    csv_num(w, q->tier_low_fraction);
    csv_num(w, q->tier_pruned_fraction);
    row_int(w, q->preemptions);
    csv_num(w, q->bits);
    w->buf[w->n++] = '\n';
}

void kv_report_csv(FILE *out, const kv_policy_outcome *o, size_t n)
{
    fputs("policy,id,arrival_s,prompt_tokens,output_tokens,prefill_node,decode_node,prefill_start_s,prefill_end_s,"
          "encode_end_s,anchor_arrived_s,kv_arrived_s,admitted_s,first_spec_s,first_token_s,kth_token_s,done_s,"
          "ttft_ms,ttft_spec_ms,ttkt_ms,tpot_ms,e2el_ms,anchor_bytes,residual_bytes,kept_tokens_fraction,"
          "spec_tokens,accepted_tokens,verifications,tier_high_fraction,tier_low_fraction,tier_pruned_fraction,"
          "preemptions,bits\n",
          out);
    csv_row w;
    for (size_t p = 0; p < n; p++) {
        size_t name_len = strlen(o[p].name);
        for (size_t i = 0; i < o[p].run.n_requests; i++) {
            w.n = 0;
            if (name_len <= ROW_NAME_MAX) {
                memcpy(w.buf, o[p].name, name_len);
                w.n = name_len;
            } else {
                fputs(o[p].name, out);
            }
            csv_fields(&w, &o[p].run.requests[i]);
            fwrite(w.buf, 1, w.n, out);
        }
    }
}

const char *const kv_report_owned_names[] = {"results.json", "requests.csv", "trace.json", "figures"};
const size_t kv_report_owned_count = sizeof kv_report_owned_names / sizeof kv_report_owned_names[0];

typedef enum { OUT_JSON, OUT_CSV, OUT_TRACE } out_kind;

/* Writes one file into dir. The folder is a staging folder that is published or removed
   (afile.h), so the file needs no temporary of its own. */
static int write_one(const char *dir, const char *name, out_kind kind, const kv_scenario *s,
                     const kv_policy_outcome *o, size_t n, const kv_timeline *tl, kv_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return kv_error_set(err, KV_EFAIL, "%s: cannot create: %s", path, strerror(errno));
    if (kind == OUT_JSON)
        kv_report_json(f, s, o, n);
    else if (kind == OUT_CSV)
        kv_report_csv(f, o, n);
    else
        kv_timeline_write(tl, f);
    int bad = ferror(f) || fflush(f) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? kv_error_set(err, KV_EFAIL, "%s: write failed: %s", path, strerror(e)) : KV_OK;
}

int kv_report_write(const char *dir, const kv_scenario *s, const kv_policy_outcome *o, size_t n,
                    const kv_timeline *tl, kv_error *err)
{
    int rc = KV_OK;
    if (s->outputs.json)
        rc = write_one(dir, "results.json", OUT_JSON, s, o, n, tl, err);
    if (!rc && s->outputs.csv)
        rc = write_one(dir, "requests.csv", OUT_CSV, s, o, n, tl, err);
    if (!rc && s->outputs.trace && tl)
        rc = write_one(dir, "trace.json", OUT_TRACE, s, o, n, tl, err);
    return rc;
}
