/* replicates.c — mean and Student-t 95% interval of every results.json metric over several seeds. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include "core/report/replicates.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/ci.h"
#include "core/base/json.h"
#include "core/base/jsonread.h"
#include "core/report/report.h"

/* The intervals themselves are core/base/ci.h's (kvsim eval uses them too). */
double kv_replicates_t975(int dof)
{
    return kv_ci_t975(dof);
}

void kv_replicates_mean_ci(const double *x, size_t n, double *mean, double *ci95)
{
    kv_ci_mean(x, n, mean, ci95);
}

kv_replicates *kv_replicates_create(size_t n_policies, int runs)
{
    kv_replicates *r = kv_calloc(1, sizeof *r);
    r->runs = runs;
    r->seeds = kv_calloc((size_t)runs, sizeof *r->seeds);
    r->n_policies = n_policies;
    r->sets = kv_calloc(n_policies ? n_policies : 1, sizeof *r->sets);
    return r;
}

void kv_replicates_destroy(kv_replicates *r)
{
    if (!r)
        return;
    for (size_t p = 0; p < r->n_policies; p++) {
        kv_replicate_set *set = &r->sets[p];
        for (size_t m = 0; m < set->n_metrics; m++)
            kv_free(set->names[m]);
        kv_free(set->names);
        kv_free(set->values);
        kv_free(set->mean);
        kv_free(set->ci95);
    }
    kv_free(r->sets);
    kv_free(r->seeds);
    kv_free(r);
}

/* The first run's numeric (or null) fields name the metrics. */
static void first_names(kv_replicate_set *set, const kv_jvalue *entry, int runs)
{
    size_t count = 0;
    for (size_t k = 0; k < entry->count; k++)
        count += entry->items[k]->kind == KV_JNUMBER || entry->items[k]->kind == KV_JNULL;
    set->n_metrics = count;
    set->names = kv_calloc(count ? count : 1, sizeof *set->names);
    set->values = kv_calloc((count ? count : 1) * (size_t)runs, sizeof *set->values);
    set->mean = kv_calloc(count ? count : 1, sizeof *set->mean);
    set->ci95 = kv_calloc(count ? count : 1, sizeof *set->ci95);
    size_t m = 0;
    for (size_t k = 0; k < entry->count; k++)
        if (entry->items[k]->kind == KV_JNUMBER || entry->items[k]->kind == KV_JNULL)
            set->names[m++] = kv_strdup(entry->keys[k]);
}

int kv_replicates_add(kv_replicates *r, int seed, const kv_scenario *s, const kv_policy_outcome *o, size_t n,
                      kv_error *err)
{
    if (r->added >= r->runs || n != r->n_policies)
        return kv_error_set(err, KV_EFAIL, "replicates: run %d of %d with %zu policies (expected %zu)",
                            r->added + 1, r->runs, n, r->n_policies);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        return kv_error_set(err, KV_EFAIL, "replicates: cannot render seed %d's results", seed);
    kv_report_json(mem, s, o, n);
    int bad = ferror(mem);
    if (fclose(mem) != 0 || bad) {
        free(text); /* open_memstream's buffer comes from malloc */
        return kv_error_set(err, KV_EFAIL, "replicates: cannot render seed %d's results", seed);
    }
    kv_jvalue *root = NULL;
    char origin[64];
    snprintf(origin, sizeof origin, "results of seed %d", seed);
    int rc = kv_jread_parse(text, len, origin, &root, err);
    free(text);
    if (rc)
        return rc;
    const kv_jvalue *pol = kv_jvalue_get(root, "policies");
    if (!pol || pol->kind != KV_JARRAY || pol->count != n) {
        kv_jvalue_free(root);
        return kv_error_set(err, KV_EFAIL, "replicates: seed %d's results lack their policies", seed);
    }
    int run = r->added;
    for (size_t p = 0; p < n; p++) {
        kv_replicate_set *set = &r->sets[p];
        if (run == 0)
            first_names(set, pol->items[p], r->runs);
        for (size_t m = 0; m < set->n_metrics; m++) {
            const kv_jvalue *v = kv_jvalue_get(pol->items[p], set->names[m]);
            set->values[m * (size_t)r->runs + (size_t)run] = v && v->kind == KV_JNUMBER ? v->number : NAN;
        }
    }
    kv_jvalue_free(root);
    r->seeds[run] = seed;
    r->added++;
    return KV_OK;
}

void kv_replicates_finish(kv_replicates *r)
{
    for (size_t p = 0; p < r->n_policies; p++) {
        kv_replicate_set *set = &r->sets[p];
        for (size_t m = 0; m < set->n_metrics; m++)
            kv_replicates_mean_ci(set->values + m * (size_t)r->runs, (size_t)r->added, &set->mean[m],
                                  &set->ci95[m]);
    }
}

static void object(FILE *out, const kv_replicate_set *set, const double *v)
{
    fputc('{', out);
    for (size_t m = 0; m < set->n_metrics; m++) {
        if (m)
            fputc(',', out);
        kv_json_string(out, set->names[m]);
        fputc(':', out);
        kv_json_number(out, v[m]);
    }
    fputc('}', out);
}

void kv_replicates_json(FILE *out, const kv_replicates *r, size_t policy)
{
    const kv_replicate_set *set = &r->sets[policy];
    fprintf(out, "\"replicates\":{\"n\":%d,\"seeds\":[", r->added);
    for (int i = 0; i < r->added; i++)
        fprintf(out, i ? ",%d" : "%d", r->seeds[i]);
    fputs("],\"t975\":", out);
    kv_json_number(out, kv_replicates_t975(r->added - 1));
    fputs(",\n\"mean\":", out);
    object(out, set, set->mean);
    fputs(",\n\"ci95\":", out);
    object(out, set, set->ci95);
    fputc('}', out);
}

static size_t metric_index(const kv_replicate_set *set, const char *name)
{
    for (size_t m = 0; m < set->n_metrics; m++)
        if (strcmp(set->names[m], name) == 0)
            return m;
    return (size_t)-1;
}

/* "mean±ci" right-aligned in `width` columns (± is one column, two bytes). */
static void pm_cell(FILE *out, const kv_replicate_set *set, const char *name, double scale, int width, int prec)
{
    size_t m = metric_index(set, name);
    double mean = m == (size_t)-1 ? NAN : set->mean[m] * scale, ci = m == (size_t)-1 ? NAN : set->ci95[m] * scale;
    char buf[96];
    int cols;
    if (isnan(mean)) {
        snprintf(buf, sizeof buf, "-");
        cols = 1;
    } else {
        cols = snprintf(buf, sizeof buf, "%.*f\xc2\xb1%.*f", prec, mean, prec, isnan(ci) ? 0.0 : ci) - 1;
    }
    fprintf(out, " %*s%s", width > cols ? width - cols : 0, "", buf);
}

void kv_replicates_table(FILE *out, const kv_scenario *s, const kv_policy_outcome *o, size_t n,
                         const kv_replicates *r)
{
    fprintf(out, "\n%s — %s, %d prefill + %d decode x %s (tp %d), network %s %.0f Gbit/s, %zu requests, seeds %d..%d "
                 "(%d runs)\n",
            s->name, s->model_card.name, s->cluster.prefill.nodes, s->cluster.decode.nodes, s->decode_device.name,
            s->cluster.decode.tp, n ? o[0].run.network : kv_network_model_names[s->network.model],
            s->network.nic_bandwidth_gbps, n ? o[0].run.n_requests : 0, r->seeds[0], r->seeds[r->added - 1],
            r->added);
    char ttkt[32];
    snprintf(ttkt, sizeof ttkt, "ttkt@%d", s->lynx.ttkt_k);
    fprintf(out, "%-10s %15s %11s %15s %17s %17s %17s %17s %13s %15s %13s %13s\n", "policy", "KV MB/req", "ratio",
            "xfer ms", "ttft_spec", "ttft ms", "p99 ttft", ttkt, "tpot ms", "e2el ms", "req/s", "accept");
    for (size_t i = 0; i < n && i < r->n_policies; i++) {
        const kv_replicate_set *set = &r->sets[i];
        fprintf(out, "%-10.10s", o[i].name);
        pm_cell(out, set, "mean_kv_wire_bytes", 1e-6, 15, 1);
        pm_cell(out, set, "compression_ratio", 1, 11, 2);
        pm_cell(out, set, "mean_transfer_ms", 1, 15, 2);
        pm_cell(out, set, "mean_ttft_spec_ms", 1, 17, 2);
        pm_cell(out, set, "mean_ttft_ms", 1, 17, 2);
        pm_cell(out, set, "p99_ttft_ms", 1, 17, 2);
        pm_cell(out, set, "mean_ttkt_ms", 1, 17, 2);
        pm_cell(out, set, "mean_tpot_ms", 1, 13, 3);
        pm_cell(out, set, "mean_e2el_ms", 1, 15, 1);
        pm_cell(out, set, "request_throughput", 1, 13, 3);
        pm_cell(out, set, "spec_accept_rate", 1, 13, 3);
        fputc('\n', out);
    }
    fprintf(out, "(mean ± 95%% CI over %d seeds: Student t, %d dof, t = %.3f; ms are means over requests unless p99;\n"
                 " every results.json metric has its mean and CI under \"replicates\"; timing: %s; the memory table "
                 "is seed %d's)\n",
            r->added, r->added - 1, kv_replicates_t975(r->added - 1), n ? o[0].run.timing_source : "model",
            r->seeds[0]);
    kv_report_memory_table(out, s, o, n);
}
