/* study.c — prepare a scenario's workload and policies, run each policy, hand results to the reports. */
#include "core/study/study.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/sim/engine.h"
#include "core/study/feasible.h"
#include "core/study/study_stats.h"
#include "core/timing/measure.h"
#include "core/report/metrics.h"
#include "core/report/reading.h"
#include "core/report/replicates.h"
#include "core/accuracy/diffkv_scores.h"
#include "core/accuracy/feed_lynx.h"
#include "core/policy/policy.h"
#include "core/policy/policy_spec.h"
#include "core/timing/profile.h"
#include "core/base/progress.h"
#include "core/base/rng.h"
#include "core/sim/timeline.h"
#include "core/workload/trace.h"
#include "core/workload/workload.h"

struct kv_study {
    const kv_scenario *s;
    kv_workload *workload;
    kv_policy **policies;     /* [n] in scenario order */
    char **files;             /* [n] resolved Lua paths */
    kv_policy_outcome *outcomes;
    size_t n;
    kv_timeline *timeline;
    kv_kernel_costs *costs;   /* [n] per policy */
    kv_feed_acceptance *accepts; /* [n] Lynx acceptance measured on the reference model, when asked */
    kv_profile *prefill_profile, *decode_profile; /* timing.source: profile; else NULL */
    kv_diffkv_measured *dkv;  /* [n] DiffKV significance tables (z NULL: none needed) */
    kv_accept_curve *accept_curves; /* [n] accepts[i] by prompt length (n_lengths 0: none) */
    kv_diffkv_curve *dkv_curves;    /* [n] dkv[i] by length, borrowing its z (n_lengths 0: none) */
    kv_model_stats stats;           /* the scenario's `stats` file, read when lynx.from or diffkv.scores is file;
                                       the curves from it borrow its tables */
    bool stats_read;                /* stats holds the file (kv_study_stats) */
    kv_engine_config engine;  /* what every run's engine reads of the scenario (built by the first run) */
    int engine_built;
    int ran;
    int probing;              /* kv_study_rescale was called: no timeline (capacity probes write none) */
    double factor;            /* the load factor of the workload in use (1: the scenario's) */
    kv_replicates *reps;      /* kvsim run --seeds N (N > 1); else NULL */
    char **reps_json;         /* [n] each policy's "replicates" member, rendered (open_memstream's: free) */
    char *accuracy_notes;     /* kvsim run: the accuracy lines under the table (owned); NULL: none */
};

static kv_length_kind length_kind(kv_workload_length dist)
{
    switch (dist) {
    case KV_WORKLOAD_LENGTH_UNIFORM: return KV_LEN_UNIFORM;
    case KV_WORKLOAD_LENGTH_LOGNORMAL: return KV_LEN_LOGNORMAL;
    case KV_WORKLOAD_LENGTH_EMPIRICAL: return KV_LEN_EMPIRICAL;
    case KV_WORKLOAD_LENGTH_FIXED: break;
    }
    return KV_LEN_FIXED;
}

static kv_arrival_kind arrival_kind(kv_workload_arrival arrival)
{
    switch (arrival) {
    case KV_WORKLOAD_ARRIVAL_GAMMA: return KV_ARRIVAL_GAMMA;
    case KV_WORKLOAD_ARRIVAL_FIXED: return KV_ARRIVAL_FIXED;
    case KV_WORKLOAD_ARRIVAL_POISSON: break;
    }
    return KV_ARRIVAL_POISSON;
}

static kv_trace_format trace_format(kv_workload_trace_format format)
{
    switch (format) {
    case KV_WORKLOAD_TRACE_AZURE: return KV_TRACE_AZURE;
    case KV_WORKLOAD_TRACE_MOONCAKE: return KV_TRACE_MOONCAKE;
    case KV_WORKLOAD_TRACE_BURSTGPT: return KV_TRACE_BURSTGPT;
    case KV_WORKLOAD_TRACE_NONE: break;
    }
    return KV_TRACE_NONE;
}

static kv_length_dist length_dist(const kv_length_config *c)
{
    return (kv_length_dist){.kind = length_kind(c->dist), .value = c->value, .sigma = c->sigma,
                            .min = c->min, .max = c->max, .samples = c->samples.items,
                            .n_samples = c->samples.count};
}

/* The scenario's workload with its load multiplied by factor (1: as written): the synthetic rate times
   factor, or the trace's clock divided by it (kv_study_rescale). */
static int make_workload(kv_study *st, double factor, kv_error *err)
{
    const kv_scenario *s = st->s;
    kv_workload_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.requests = s->workload.requests;
    cfg.arrival = arrival_kind(s->workload.arrival);
    cfg.rate_per_s = factor == 1.0 ? s->workload.rate_per_s : s->workload.rate_per_s * factor;
    cfg.burstiness = s->workload.burstiness;
    cfg.prompt = length_dist(&s->workload.prompt);
    cfg.output = length_dist(&s->workload.output);
    cfg.time_scale = factor == 1.0 ? s->workload.trace.time_scale : kv_study_time_scale(s, factor);
    cfg.repeat = s->workload.trace.repeat;
    cfg.max_prompt_tokens = s->model_card.max_context;
    cfg.fit_context = s->workload.fit_context;
    char path[4096];
    if (s->workload.trace.format != KV_WORKLOAD_TRACE_NONE) {
        int rc = kv_scenario_find_file(s, s->workload.trace.path, "workload.trace.path", path, sizeof path, err);
        if (rc)
            return rc;
        cfg.trace_format = trace_format(s->workload.trace.format);
        cfg.trace_path = path;
    }
    kv_rng rng;
    kv_rng_seed(&rng, (uint64_t)s->seed);
    int rc = kv_workload_create(&cfg, &rng, &st->workload, err);
    if (rc)
        kv_scenario_locate(s, err); /* configuration errors carry their key; trace rows carry their own line */
    return rc;
}

/* Loads policy i with its policy.<name>.* parameters (core/policy/policy_spec.h). */
static int load_policy(kv_study *st, size_t i, kv_error *err)
{
    kv_policy_spec spec;
    int rc = kv_policy_spec_read(st->s, i, &spec, err);
    if (!rc)
        rc = kv_policy_spec_load(&spec, st->s, &st->policies[i], err);
    if (!rc)
        st->files[i] = kv_strdup(spec.file);
    kv_policy_spec_free(&spec);
    return rc;
}

/* A study with its workload built and every policy loaded: what needs no measurement. */
static int study_inputs(const kv_scenario *s, kv_study **out, kv_error *err)
{
    kv_study *st = kv_calloc(1, sizeof *st);
    *out = st;
    st->s = s;
    st->n = s->policies.count;
    st->policies = kv_calloc(st->n, sizeof *st->policies);
    st->files = kv_calloc(st->n, sizeof *st->files);
    st->outcomes = kv_calloc(st->n, sizeof *st->outcomes);
    st->costs = kv_calloc(st->n, sizeof *st->costs);
    st->dkv = kv_calloc(st->n, sizeof *st->dkv);
    st->accepts = kv_calloc(st->n, sizeof *st->accepts);
    st->accept_curves = kv_calloc(st->n, sizeof *st->accept_curves);
    st->dkv_curves = kv_calloc(st->n, sizeof *st->dkv_curves);
    st->factor = 1.0;
    int rc = make_workload(st, 1.0, err);
    if (!rc)
        rc = kv_engine_check_network(s, err);
    for (size_t i = 0; !rc && i < st->n; i++)
        rc = load_policy(st, i, err);
    return rc;
}

int kv_study_check(const kv_scenario *s, kv_error *err)
{
    kv_study *st = NULL;
    int rc = study_inputs(s, &st, err);
    kv_study_destroy(st);
    return rc;
}

int kv_study_validate(const kv_scenario *s, bool strict, FILE *log, size_t *n_requests, kv_error *err)
{
    *n_requests = 0;
    kv_study *st = NULL;
    int rc = study_inputs(s, &st, err);
    kv_kernel_costs costs;
    if (!rc && s->timing.source != KV_TIMING_MEASURED) /* a calibration file is read, nothing is timed */
        rc = kv_measure_costs(s, st->policies[0], 1, &costs, err);
    if (!rc)
        rc = kv_measure_profiles(s, &st->prefill_profile, &st->decode_profile, err); /* reads the table */
    if (!rc)
        rc = kv_study_feasible(s, st->workload, st->policies, st->n, strict, log, err);
    if (!rc)
        *n_requests = kv_workload_count(st->workload);
    kv_study_destroy(st);
    return rc;
}

int kv_study_prepare(const kv_scenario *s, kv_study **out, kv_error *err)
{
    *out = NULL;
    kv_study *st = NULL;
    int rc = study_inputs(s, &st, err);
    size_t n_req = st->workload ? kv_workload_count(st->workload) : 0;
    int first_prompt = n_req ? kv_workload_get(st->workload, 0)->prompt_tokens : 1;
    for (size_t i = 0; !rc && i < st->n; i++)
        rc = kv_measure_costs(s, st->policies[i], first_prompt, &st->costs[i], err);
    if (!rc)
        rc = kv_measure_profiles(s, &st->prefill_profile, &st->decode_profile, err);
    for (size_t i = 0; !rc && st->prefill_profile && i < st->n; i++) {
        char kernels[sizeof st->costs[i].source];
        const char *pd = kv_profile_describe(st->prefill_profile), *dd = kv_profile_describe(st->decode_profile);
        snprintf(kernels, sizeof kernels, "%s", st->costs[i].source);
        if (strcmp(pd, dd) == 0)
            snprintf(st->costs[i].source, sizeof st->costs[i].source, "profile %s %s; KV kernels: %s",
                     s->timing.profile.file, pd, kernels);
        else
            snprintf(st->costs[i].source, sizeof st->costs[i].source,
                     "profile %s, prefill: %s; decode: %s; KV kernels: %s", s->timing.profile.file, pd, dd, kernels);
    }
    if (!rc && s->lynx.from == KV_LYNX_FROM_REFERENCE_MODEL) {
        /* Every speculative policy's acceptance, on prompts near the workload's (cached on disk). */
        int *prompts = kv_calloc(n_req ? n_req : 1, sizeof *prompts);
        for (size_t r = 0; r < n_req; r++)
            prompts[r] = kv_workload_get(st->workload, r)->prompt_tokens;
        rc = kv_feed_acceptance_measure(s, st->policies, st->n, prompts, n_req, stderr, st->accepts, err);
        kv_free(prompts);
    }
    /* DiffKV's significance distribution, measured on the reference model (diffkv.scores: measured). */
    int *dkv_prompts = kv_calloc(n_req ? n_req : 1, sizeof *dkv_prompts);
    for (size_t r = 0; r < n_req; r++)
        dkv_prompts[r] = kv_workload_get(st->workload, r)->prompt_tokens;
    for (size_t i = 0; !rc && i < st->n; i++) {
        bool needed = false;
        rc = kv_diffkv_scores_for_policy(s, st->policies[i], dkv_prompts, n_req, &st->dkv[i], &needed, err);
        /* Whether it was measured now or read back is said here, not in results.json: a rerun must
           write the same bytes. */
        if (!rc && needed && st->dkv[i].z)
            fprintf(stderr, "kvsim: DiffKV significance of %s: %s\n", s->policies.items[i],
                    st->dkv[i].cached ? "from the feed cache (measured before on the reference model)"
                                      : "measured on the reference model (now in the feed cache)");
    }
    kv_free(dkv_prompts);
    /* The reference model's measurements, as curves the engine reads at each request's length. */
    for (size_t i = 0; !rc && i < st->n; i++) {
        const kv_feed_acceptance *a = &st->accepts[i];
        if (a->positions > 0)
            st->accept_curves[i] = a->curve;
        if (st->dkv[i].z && st->dkv[i].curve.n_lengths > 0) {
            st->dkv_curves[i] = st->dkv[i].curve;
        } else if (st->dkv[i].z) {
            kv_diffkv_curve *c = &st->dkv_curves[i];
            c->window = st->dkv[i].window;
            c->n_lengths = 1;
            c->lengths[0] = st->dkv[i].tokens;
            c->table[0] = st->dkv[i].table;
        }
    }
    /* lynx.from: file, diffkv.scores: file: the curves by length from the model statistics file. */
    if (!rc && (s->lynx.from == KV_LYNX_FROM_FILE || s->diffkv.scores == KV_DIFFKV_FROM_FILE)) {
        int *prompts = kv_calloc(n_req ? n_req : 1, sizeof *prompts);
        for (size_t r = 0; r < n_req; r++)
            prompts[r] = kv_workload_get(st->workload, r)->prompt_tokens;
        kv_stats_policy *sp = kv_calloc(st->n, sizeof *sp);
        rc = kv_study_stats_curves(s, st->policies, st->n, prompts, n_req, &st->stats, sp, err);
        st->stats_read = rc == KV_OK;
        for (size_t i = 0; !rc && i < st->n; i++) {
            if (sp[i].accept.n_lengths > 0) {
                st->accept_curves[i] = sp[i].accept;
                st->accepts[i].positions = sp[i].accept.positions;
                st->accepts[i].speculations = sp[i].speculations;
                snprintf(st->accepts[i].source, sizeof st->accepts[i].source, "%s", sp[i].accept_source);
            }
            if (sp[i].diffkv.n_lengths > 0) {
                st->dkv_curves[i] = sp[i].diffkv;
                snprintf(st->dkv[i].source, sizeof st->dkv[i].source, "%s", sp[i].diffkv_source);
            }
        }
        kv_free(sp);
        kv_free(prompts);
    }
    if (rc) {
        kv_study_destroy(st);
        return rc;
    }
    *out = st;
    return KV_OK;
}

void kv_study_destroy(kv_study *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++) {
        kv_policy_destroy(st->policies[i]);
        kv_free(st->files[i]);
        kv_run_result_free(&st->outcomes[i].run);
    }
    kv_free(st->policies);
    kv_free(st->files);
    kv_free(st->outcomes);
    kv_free(st->costs);
    kv_profile_destroy(st->prefill_profile);
    kv_profile_destroy(st->decode_profile);
    for (size_t i = 0; st->dkv && i < st->n; i++)
        kv_diffkv_measured_free(&st->dkv[i]);
    kv_free(st->dkv);
    kv_free(st->accepts);
    kv_free(st->accept_curves);
    kv_free(st->dkv_curves);
    kv_model_stats_free(&st->stats);
    kv_workload_destroy(st->workload);
    kv_timeline_destroy(st->timeline);
    kv_replicates_destroy(st->reps);
    for (size_t i = 0; st->reps_json && i < st->n; i++)
        free(st->reps_json[i]); /* open_memstream's buffers come from malloc */
    kv_free(st->reps_json);
    kv_free(st->accuracy_notes);
    kv_free(st);
}

size_t kv_study_request_count(const kv_study *st)
{
    return kv_workload_count(st->workload);
}

/* The engine's view of the scenario, built once for every policy and probe; its errors (weights that
   do not fit) read as they did when the first policy's run found them. */
static int engine_config(kv_study *st, kv_error *err)
{
    if (st->engine_built)
        return KV_OK;
    int rc = kv_engine_config_build(st->s, &st->engine, err);
    if (rc)
        return kv_error_prefix(err, "policy %s: ", st->s->policies.items[0]);
    st->engine_built = 1;
    return KV_OK;
}

int kv_study_run_policy(kv_study *st, size_t i, kv_error *err)
{
    const kv_scenario *s = st->s;
    if (i >= st->n)
        return kv_error_set(err, KV_EFAIL, "policy index %zu of %zu", i, st->n);
    int rc = engine_config(st, err);
    if (rc)
        return rc;
    if (s->outputs.trace && !st->timeline && !st->probing)
        st->timeline = kv_timeline_create();
    double bf16_per_token = kv_model_kv_values_per_token(&s->model_card) * 2.0;
    kv_progress *progress = kv_progress_create(stderr, s->outputs.progress, s->policies.items[i],
                                               kv_workload_count(st->workload));
    kv_run_inputs in = {.config = &st->engine, .policy = st->policies[i], .workload = st->workload,
                        .costs = &st->costs[i], .timeline = st->probing ? NULL : st->timeline,
                        .progress = progress, .prefill_profile = st->prefill_profile,
                        .decode_profile = st->decode_profile, .keep_policy_state = st->probing};
    const kv_feed_acceptance *a = &st->accepts[i];
    if (st->accept_curves[i].n_lengths > 0) {
        in.accept_curve = &st->accept_curves[i];
        in.accept_source = a->source;
    }
    if (st->dkv_curves[i].n_lengths > 0) {
        in.diffkv_curve = &st->dkv_curves[i];
        in.diffkv_source = st->dkv[i].source;
    }
    kv_policy_outcome *o = &st->outcomes[i];
    kv_run_result_free(&o->run); /* a probe's earlier run */
    memset(o, 0, sizeof *o);
    o->name = s->policies.items[i];
    o->file = st->files[i];
    o->policy = st->policies[i];
    o->acceptance_samples = a->positions > 0 ? a->speculations : 0;
    rc = kv_engine_run(&in, &o->run, err);
    kv_progress_finish(progress);
    if (rc) {
        kv_scenario_locate(s, err); /* an error keyed to a scenario key gets its position */
        return kv_error_prefix(err, "policy %s: ", o->name);
    }
    kv_summary_compute(&o->run, bf16_per_token, &o->summary);
    return KV_OK;
}

int kv_study_run(kv_study *st, kv_error *err)
{
    int rc = engine_config(st, err);
    for (size_t i = 0; !rc && i < st->n; i++)
        rc = kv_study_run_policy(st, i, err);
    if (rc)
        return rc;
    st->ran = 1;
    return KV_OK;
}

const kv_policy_outcome *kv_study_outcome(const kv_study *st, size_t i)
{
    return i < st->n ? &st->outcomes[i] : NULL;
}

double kv_study_time_scale(const kv_scenario *s, double factor)
{
    double base = s->workload.trace.time_scale > 0 ? s->workload.trace.time_scale : 1.0;
    return base / factor;
}

int kv_study_rescale(kv_study *st, double factor, kv_error *err)
{
    if (!(factor > 0) || !isfinite(factor))
        return kv_error_set(err, KV_EFAIL, "load factor %g: must be a positive number", factor);
    kv_workload *old = st->workload;
    st->workload = NULL;
    int rc = make_workload(st, factor, err);
    if (rc) {
        st->workload = old;
        return rc;
    }
    kv_workload_destroy(old);
    st->factor = factor;
    st->probing = 1;
    st->ran = 0;
    kv_timeline_destroy(st->timeline);
    st->timeline = NULL;
    return KV_OK;
}

double kv_study_offered_rate(const kv_study *st)
{
    const kv_scenario *s = st->s;
    if (s->workload.trace.format == KV_WORKLOAD_TRACE_NONE)
        return s->workload.rate_per_s * st->factor;
    size_t n = kv_workload_count(st->workload);
    if (n < 2)
        return NAN;
    double span = kv_workload_get(st->workload, n - 1)->arrival_s - kv_workload_get(st->workload, 0)->arrival_s;
    return span > 0 ? (double)(n - 1) / span : INFINITY;
}

int kv_study_replicate(kv_study *st, int runs, kv_error *err)
{
    const kv_scenario *s = st->s;
    if (!st->ran)
        return kv_error_set(err, KV_EFAIL, "replicates: the study has not run");
    if (runs < 2)
        return KV_OK;
    if ((long long)s->seed + runs - 1 > 2147483647LL)
        return kv_error_set(err, KV_EINPUT, "replicates: seeds %d..%lld pass the largest seed, 2147483647", s->seed,
                            (long long)s->seed + runs - 1);
    kv_replicates_destroy(st->reps);
    for (size_t i = 0; st->reps_json && i < st->n; i++)
        free(st->reps_json[i]);
    kv_free(st->reps_json);
    st->reps_json = NULL;
    st->reps = kv_replicates_create(st->n, runs);
    int rc = kv_replicates_add(st->reps, s->seed, s, st->outcomes, st->n, err);
    /* Each further seed is the scenario loaded again with the same --set values and seed=K: what
       `kvsim run --seed K` does, measurements included (they depend on the seed's prompts). */
    const char **sets = kv_calloc((size_t)s->n_overrides + 1, sizeof *sets);
    for (int k = 0; k < s->n_overrides; k++)
        sets[k] = s->overrides[k];
    char seed_set[48];
    sets[s->n_overrides] = seed_set;
    for (int r = 1; !rc && r < runs; r++) {
        int seed = s->seed + r;
        snprintf(seed_set, sizeof seed_set, "seed=%d", seed);
        kv_scenario *sk = NULL;
        kv_study *stk = NULL;
        rc = kv_scenario_load(s->path, sets, s->n_overrides + 1, &sk, err);
        if (!rc)
            rc = kv_study_prepare(sk, &stk, err);
        if (!rc) {
            stk->probing = 1; /* its timeline is not written */
            rc = kv_study_run(stk, err);
        }
        if (!rc)
            rc = kv_replicates_add(st->reps, seed, sk, stk->outcomes, stk->n, err);
        if (rc)
            kv_error_prefix(err, "seed %d: ", seed);
        kv_study_destroy(stk);
        kv_scenario_destroy(sk);
    }
    kv_free(sets);
    if (rc) {
        kv_replicates_destroy(st->reps);
        st->reps = NULL;
        return rc;
    }
    kv_replicates_finish(st->reps);
    st->reps_json = kv_calloc(st->n, sizeof *st->reps_json);
    for (size_t i = 0; i < st->n; i++) {
        size_t len = 0;
        FILE *mem = open_memstream(&st->reps_json[i], &len);
        if (!mem)
            return kv_error_set(err, KV_EFAIL, "replicates: cannot render policy %s's intervals",
                                st->outcomes[i].name);
        kv_replicates_json(mem, st->reps, i);
        int bad = ferror(mem);
        if (fclose(mem) != 0 || bad)
            return kv_error_set(err, KV_EFAIL, "replicates: cannot render policy %s's intervals",
                                st->outcomes[i].name);
        st->outcomes[i].replicates_json = st->reps_json[i];
    }
    return KV_OK;
}

const kv_policy_outcome *kv_study_outcomes(const kv_study *st, size_t *n)
{
    *n = st->ran ? st->n : 0;
    return st->outcomes;
}

void kv_study_print(const kv_study *st, FILE *out)
{
    if (st->reps)
        kv_replicates_table(out, st->s, st->outcomes, st->ran ? st->n : 0, st->reps);
    else
        kv_report_table(out, st->s, st->outcomes, st->ran ? st->n : 0);
    if (st->accuracy_notes)
        kv_report_accuracy_table(out, st->outcomes, st->ran ? st->n : 0, st->accuracy_notes);
    if (!st->reps)
        kv_report_reading(out, st->outcomes, st->ran ? st->n : 0); /* last: it reads both tables */
}

void kv_study_set_accuracy(kv_study *st, const kv_acc_figures *fig, const char *notes)
{
    for (size_t i = 0; i < st->n; i++)
        st->outcomes[i].accuracy = fig ? &fig[i] : NULL;
    kv_free(st->accuracy_notes);
    st->accuracy_notes = notes ? kv_strdup(notes) : NULL;
}

int kv_study_write(const kv_study *st, const char *dir, kv_error *err)
{
    return kv_report_write(dir, st->s, st->outcomes, st->ran ? st->n : 0, st->timeline, err);
}

const kv_model_stats *kv_study_stats(const kv_study *st)
{
    return st->stats_read ? &st->stats : NULL;
}
