/* timing.c — roofline costs of prefill, decode steps, verification and KV kernels. */
#include "core/timing.h"

void kv_timing_init(kv_timing *t, const kv_model_card *m, const kv_device_profile *d, int tp)
{
    t->model = m;
    t->device = d;
    t->tp = tp;
    t->encode_efficiency = d->memory_efficiency;
    t->decode_efficiency = d->memory_efficiency;
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
}

void kv_step_add_decode(const kv_timing *t, kv_step_work *w, double context, double kv_bytes)
{
    const kv_model_card *m = t->model;
    w->flops += kv_timing_linear_flops_per_token(m) + attention_flops(m, context) + head_flops(m);
    w->kv_bytes += kv_bytes;
    w->tokens += 1;
}

void kv_step_add_verify(const kv_timing *t, kv_step_work *w, double k, double context, double kv_bytes)
{
    const kv_model_card *m = t->model;
    /* k query tokens, each over the whole context plus the verified tokens before it. */
    w->flops += k * kv_timing_linear_flops_per_token(m) + attention_flops(m, k * context + k * (k + 1) / 2.0) +
                k * head_flops(m);
    w->kv_bytes += kv_bytes;
    w->tokens += k;
}

double kv_step_seconds(const kv_timing *t, const kv_step_work *w)
{
    const kv_device_profile *d = t->device;
    double compute = w->flops / (d->bf16_tflops * 1e12 * d->compute_efficiency * t->tp);
    double bytes = kv_model_weight_bytes(t->model) + w->kv_bytes;
    double memory = bytes / (d->hbm_bandwidth_gbs * 1e9 * d->memory_efficiency * t->tp);
    return (compute > memory ? compute : memory) + d->kernel_overhead_s + w->kernel_s;
}

double kv_timing_encode_seconds(const kv_timing *t, double bytes)
{
    return bytes / (t->device->hbm_bandwidth_gbs * 1e9 * t->encode_efficiency * t->tp);
}

double kv_timing_decode_kernel_seconds(const kv_timing *t, double bytes)
{
    return bytes / (t->device->hbm_bandwidth_gbs * 1e9 * t->decode_efficiency * t->tp);
}
