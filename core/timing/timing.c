/* timing.c — costs of prefill, decode steps, verification and KV kernels: roofline or profiled table. */
#include "core/timing/timing.h"

#include <math.h>

void kv_timing_init(kv_timing *t, const kv_model_card *m, const kv_device_profile *d, int tp)
{
    t->model = m;
    t->device = d;
    t->tp = tp;
    t->encode_efficiency = d->memory_efficiency;
    t->decode_efficiency = d->memory_efficiency;
    t->profile = NULL;
    for (int ph = 0; ph < 2; ph++) {
        t->step_floor_s[ph] = 0;
        t->step_efficiency[ph] = 1;
    }
}

double kv_timing_linear_flops_per_token(const kv_model_card *m)
{
    double q = (double)m->hidden * m->heads * m->head_dim;
    double kv = 2.0 * m->hidden * m->kv_heads * m->head_dim;
    double o = (double)m->heads * m->head_dim * m->hidden;
    double mlp = 3.0 * m->hidden * m->ffn; /* gate, up, down (SwiGLU) */
    return 2.0 * m->layers * (q + kv + o + mlp);
}

/* Attention FLOPs of one query token over `context` keys: QK^T and PV. */
static double attention_flops(const kv_model_card *m, double context)
{
    return 4.0 * m->layers * m->heads * m->head_dim * context;
}

/* LM head FLOPs for one token. */
static double head_flops(const kv_model_card *m)
{
    return 2.0 * m->hidden * m->vocab;
}

void kv_step_add_prefill(const kv_timing *t, kv_step_work *w, double tokens)
{
    const kv_model_card *m = t->model;
    /* Causal: query i sees i+1 keys, so the sum over queries is T(T+1)/2. */
    w->flops += tokens * kv_timing_linear_flops_per_token(m) + attention_flops(m, tokens * (tokens + 1) / 2.0) +
                head_flops(m);
    w->kv_bytes += tokens * 2.0 * m->layers * m->kv_heads * m->head_dim * 2.0; /* bf16 KV written */
    w->tokens += tokens;
    w->prefill_requests += 1;
    w->prefill_tokens += tokens;
}

/* Bytes of bf16 KV over `context` tokens. */
static double bf16_kv_bytes(const kv_model_card *m, double context)
{
    return kv_model_kv_values_per_token(m) * 2.0 * context;
}

void kv_step_add_decode(const kv_timing *t, kv_step_work *w, double context, double kv_bytes)
{
    const kv_model_card *m = t->model;
    w->flops += kv_timing_linear_flops_per_token(m) + attention_flops(m, context) + head_flops(m);
    w->kv_bytes += kv_bytes;
    w->tokens += 1;
    w->decode_requests += 1;
    w->decode_context += context;
    w->decode_kv_bytes += kv_bytes;
    w->decode_kv_bf16_bytes += bf16_kv_bytes(m, context);
}

void kv_step_add_verify(const kv_timing *t, kv_step_work *w, double k, double context, double kv_bytes)
{
    const kv_model_card *m = t->model;
    /* k query tokens, each over the whole context plus the verified tokens before it. */
    w->flops += k * kv_timing_linear_flops_per_token(m) + attention_flops(m, k * context + k * (k + 1) / 2.0) +
                k * head_flops(m);
    w->kv_bytes += kv_bytes;
    w->tokens += k;
    /* The profile has no verification rows: k decode tokens whose KV is read once. */
    w->decode_requests += k;
    w->decode_context += k * context;
    w->decode_kv_bytes += kv_bytes;
    w->decode_kv_bf16_bytes += k * bf16_kv_bytes(m, context);
}

static double hbm_seconds(const kv_timing *t, double bytes)
{
    const kv_device_profile *d = t->device;
    return bytes / (d->hbm_bandwidth_gbs * 1e9 * d->memory_efficiency * t->tp);
}

double kv_step_allreduce_seconds(const kv_timing *t, const kv_step_work *w)
{
    const kv_device_profile *d = t->device;
    if (t->tp <= 1 || w->tokens <= 0)
        return 0;
    /* Two all-reduces per layer (attention output, MLP output) of the bf16 activations; a ring moves
       2(tp-1)/tp of them through each device's link. */
    double bytes = w->tokens * t->model->hidden * 2.0;
    double one = d->allreduce_latency_s + 2.0 * (t->tp - 1) / t->tp * bytes / (d->interconnect_gbs * 1e9);
    return 2.0 * t->model->layers * one;
}

double kv_step_roofline_seconds(const kv_timing *t, const kv_step_work *w)
{
    const kv_device_profile *d = t->device;
    double compute = w->flops / (d->bf16_tflops * 1e12 * d->compute_efficiency * t->tp);
    double memory = hbm_seconds(t, kv_model_weight_bytes(t->model) + w->kv_bytes);
    double base = (compute > memory ? compute : memory) + kv_step_allreduce_seconds(t, w) + d->kernel_overhead_s;
    int ph = w->prefill_requests > 0 ? 0 : 1;
    base /= t->step_efficiency[ph];
    return (base > t->step_floor_s[ph] ? base : t->step_floor_s[ph]) + w->kernel_s;
}

static double fit_cost(const double *roofline, const double *table, size_t n, double floor_s, double eff)
{
    double c = 0;
    for (size_t i = 0; i < n; i++) {
        double m = roofline[i] / eff;
        double e = log((m > floor_s ? m : floor_s) / table[i]);
        c += e * e;
    }
    return c;
}

void kv_timing_fit_phase(const double *roofline, const double *table, size_t n, double *floor_s,
                         double *efficiency)
{
    *floor_s = 0;
    *efficiency = 1;
    if (n == 0)
        return;
    double lo = table[0];
    for (size_t i = 1; i < n; i++)
        lo = fmin(lo, table[i]);
    double best = INFINITY;
    for (int f = 0; f <= 150; f++) {
        double fl = lo * 0.01 * f;
        for (double eff = 0.01; eff <= 10; eff *= 1.005) {
            double c = fit_cost(roofline, table, n, fl, eff);
            if (c < best) {
                best = c;
                *floor_s = fl;
                *efficiency = eff;
            }
        }
    }
}

/* The profiled table's time for the step (see timing.h). */
static double profile_seconds(const kv_timing *t, const kv_step_work *w)
{
    double s = 0;
    if (w->prefill_requests > 0)
        s += kv_profile_prefill_s(t->profile, w->prefill_requests, w->prefill_tokens / w->prefill_requests);
    if (w->decode_requests > 0) {
        double table = kv_profile_decode_s(t->profile, w->decode_requests, w->decode_context / w->decode_requests);
        double part = table - hbm_seconds(t, w->decode_kv_bf16_bytes) + hbm_seconds(t, w->decode_kv_bytes);
        s += part > 0.1 * table ? part : 0.1 * table; /* the correction never takes off more than 90% */
    }
    return s + w->kernel_s;
}

double kv_step_seconds(const kv_timing *t, const kv_step_work *w)
{
    return t->profile ? profile_seconds(t, w) : kv_step_roofline_seconds(t, w);
}

double kv_timing_encode_seconds(const kv_timing *t, double bytes)
{
    return bytes / (t->device->hbm_bandwidth_gbs * 1e9 * t->encode_efficiency * t->tp);
}

double kv_timing_decode_kernel_seconds(const kv_timing *t, double bytes)
{
    return bytes / (t->device->hbm_bandwidth_gbs * 1e9 * t->decode_efficiency * t->tp);
}
