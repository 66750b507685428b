/* timing.c — costs of prefill, decode steps, verification and KV kernels: roofline or profiled table. */
#include "core/timing/timing.h"

#include <math.h>
#include <stdlib.h>

#include "core/base/alloc.h"

void kv_timing_init(kv_timing *t, const kv_model_card *m, const kv_device_profile *d, int tp)
{
    t->model = m;
    t->device = d;
    t->tp = tp;
    t->encode_efficiency = d->memory_efficiency;
    t->decode_efficiency = d->memory_efficiency;
    t->profile = NULL;
    const kv_device_roofline *r = kv_device_roofline_find(d, tp);
    for (int ph = 0; ph < 2; ph++) {
        t->step_floor_s[ph] = r ? r->floor_s[ph] : 0;
        t->step_efficiency[ph] = r ? r->efficiency[ph] : 1;
        t->step_token_s[ph] = r ? r->token_s[ph] : 0;
        t->step_knee_tokens[ph] = r ? r->knee_tokens[ph] : 0;
        t->step_knee_token_s[ph] = r ? r->knee_token_s[ph] : 0;
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
    base = base / t->step_efficiency[ph] + t->step_token_s[ph] * w->tokens;
    if (t->step_knee_token_s[ph] > 0) /* off by default: the sum stays what it was */
        base += t->step_knee_token_s[ph] * fmax(0, w->tokens - t->step_knee_tokens[ph]);
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

double kv_timing_fit_model(double roofline, double tokens, double floor_s, double efficiency, double token_s)
{
    return fmax(floor_s, roofline / efficiency + token_s * tokens);
}

static double fit3_cost(const double *roofline, const double *tokens, const double *table, size_t n, double floor_s,
                        double a, double b)
{
    double c = 0;
    for (size_t i = 0; i < n; i++) {
        double e = log(fmax(floor_s, a * roofline[i] + b * tokens[i]) / table[i]);
        c += e * e;
    }
    return c;
}

/* One Gauss-Newton step for m = a r + b k (b forced to 0 when !with_b) on the points above the floor:
   log m ~ log m0 + (m - m0) / m0, so minimise sum ((m - m0 (1 - log(m0 / t))) / m0)^2, a 2x2 (or 1x1)
   weighted least squares. Returns 0 when the solution is not >= 0 (the caller keeps its values). */
static int fit3_step(const double *r, const double *k, const double *t, size_t n, double floor_s, int with_b,
                     double *a, double *b)
{
    double srr = 0, srk = 0, skk = 0, sry = 0, sky = 0;
    for (size_t i = 0; i < n; i++) {
        double m0 = *a * r[i] + *b * k[i];
        if (!(m0 > floor_s) || !(m0 > 0))
            continue; /* the floor holds this point: a and b do not move it */
        double y = m0 * (1 - log(m0 / t[i])), w = 1 / (m0 * m0);
        srr += w * r[i] * r[i];
        srk += w * r[i] * k[i];
        skk += w * k[i] * k[i];
        sry += w * r[i] * y;
        sky += w * k[i] * y;
    }
    double na, nb = 0;
    if (with_b) {
        double det = srr * skk - srk * srk;
        if (!(det > 1e-12 * srr * skk))
            return 0; /* r and k (nearly) proportional */
        na = (sry * skk - sky * srk) / det;
        nb = (srr * sky - srk * sry) / det;
    } else {
        if (!(srr > 0))
            return 0;
        na = sry / srr;
    }
    /* Within the device profile's ranges: efficiency (1 / a) 1e-6 to 100, at most 1 s per token. */
    if (!(na >= 0.01 && na <= 1e6) || !(nb >= 0 && nb <= 1))
        return 0;
    *a = na;
    *b = nb;
    return 1;
}

void kv_timing_fit_phase_tokens(const double *roofline, const double *tokens, const double *table, size_t n,
                                double *floor_s, double *efficiency, double *token_s)
{
    *floor_s = 0;
    *efficiency = 1;
    *token_s = 0;
    if (n == 0)
        return;
    double lo = table[0];
    for (size_t i = 1; i < n; i++)
        lo = fmin(lo, table[i]);
    double best = INFINITY;
    for (int f = 0; f <= 150; f++) {
        double fl = lo * 0.01 * f;
        for (int with_b = 0; with_b < 2; with_b++) {
            double a = 1, b = 0;
            for (int it = 0; it < 40 && fit3_step(roofline, tokens, table, n, fl, with_b, &a, &b); it++)
                ;
            double c = fit3_cost(roofline, tokens, table, n, fl, a, b);
            if (c < best) {
                best = c;
                *floor_s = fl;
                *efficiency = 1 / a;
                *token_s = b;
            }
        }
    }
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kv_timing_knobs_seconds(const kv_timing_knobs *k, double roofline, double tokens)
{
    double m = roofline / k->efficiency + k->token_s * tokens;
    if (k->knee_token_s > 0)
        m += k->knee_token_s * fmax(0, tokens - k->knee_tokens);
    return fmax(k->floor_s, m);
}

static double knobs_cost(const double *roofline, const double *tokens, const double *table, size_t n,
                         const kv_timing_knobs *k)
{
    double c = 0;
    for (size_t i = 0; i < n; i++) {
        double e = log(kv_timing_knobs_seconds(k, roofline[i], tokens[i]) / table[i]);
        c += e * e;
    }
    return c;
}

/* Solves the m x m system a x = y (m <= 3) by elimination with partial pivoting, in place. Returns 0 when a
   pivot falls below 1e-12 of its row's diagonal as given (the bases are (nearly) dependent). */
static int solve_small(double a[3][3], double y[3], int m, double x[3])
{
    double diag[3];
    for (int i = 0; i < m; i++)
        diag[i] = fabs(a[i][i]);
    for (int c = 0; c < m; c++) {
        int p = c;
        for (int i = c + 1; i < m; i++)
            if (fabs(a[i][c]) > fabs(a[p][c]))
                p = i;
        if (p != c) {
            for (int j = 0; j < m; j++) {
                double s = a[c][j];
                a[c][j] = a[p][j];
                a[p][j] = s;
            }
            double s = y[c], d = diag[c];
            y[c] = y[p];
            y[p] = s;
            diag[c] = diag[p];
            diag[p] = d;
        }
        if (!(fabs(a[c][c]) > 1e-12 * diag[c]))
            return 0;
        for (int i = c + 1; i < m; i++) {
            double f = a[i][c] / a[c][c];
            for (int j = c; j < m; j++)
                a[i][j] -= f * a[c][j];
            y[i] -= f * y[c];
        }
    }
    for (int i = m - 1; i >= 0; i--) {
        double s = y[i];
        for (int j = i + 1; j < m; j++)
            s -= a[i][j] * x[j];
        x[i] = s / a[i][i];
    }
    return 1;
}

/* One Gauss-Newton step as fit3_step's for m = c0 r + c1 k + c2 max(0, k - knee) over the bases use[] names
   (the others stay 0). Returns 0 when the solution leaves the ranges (the caller keeps its values). */
static int knee_step(const double *r, const double *k, const double *t, size_t n, double floor_s, double knee,
                     const int use[3], double c[3])
{
    double a[3][3] = {{0}}, y[3] = {0}, x[3] = {0};
    int idx[3], m = 0;
    for (int j = 0; j < 3; j++)
        if (use[j])
            idx[m++] = j;
    for (size_t i = 0; i < n; i++) {
        double b[3] = {r[i], k[i], fmax(0, k[i] - knee)};
        double m0 = c[0] * b[0] + c[1] * b[1] + c[2] * b[2];
        if (!(m0 > floor_s) || !(m0 > 0))
            continue; /* the floor holds this point */
        double yy = m0 * (1 - log(m0 / t[i])), w = 1 / (m0 * m0);
        for (int p = 0; p < m; p++) {
            for (int q = 0; q < m; q++)
                a[p][q] += w * b[idx[p]] * b[idx[q]];
            y[p] += w * b[idx[p]] * yy;
        }
    }
    if (m == 0 || !solve_small(a, y, m, x))
        return 0;
    double nc[3] = {0, 0, 0};
    for (int p = 0; p < m; p++)
        nc[idx[p]] = x[p];
    /* The ranges of fit3_step; the knee's cost as token_s's. */
    if (!(nc[0] >= 0.01 && nc[0] <= 1e6) || !(nc[1] >= 0 && nc[1] <= 1) || !(nc[2] >= 0 && nc[2] <= 1))
        return 0;
    for (int j = 0; j < 3; j++)
        c[j] = nc[j];
    return 1;
}

void kv_timing_fit_phase_knee(const double *roofline, const double *tokens, const double *table, size_t n,
                              kv_timing_knobs *out)
{
    kv_timing_knobs k = {0, 1, 0, 0, 0};
    kv_timing_fit_phase_tokens(roofline, tokens, table, n, &k.floor_s, &k.efficiency, &k.token_s);
    *out = k;
    if (n < 2)
        return;
    double best = knobs_cost(roofline, tokens, table, n, out), lo = table[0];
    for (size_t i = 1; i < n; i++)
        lo = fmin(lo, table[i]);
    /* The distinct token counts, increasing. */
    double *u = kv_calloc(n, sizeof *u);
    for (size_t i = 0; i < n; i++)
        u[i] = tokens[i];
    qsort(u, n, sizeof *u, compare_double);
    size_t nu = 0;
    for (size_t i = 0; i < n; i++)
        if (nu == 0 || u[i] != u[nu - 1])
            u[nu++] = u[i];
    for (size_t q = 0; q + 2 < nu; q++) /* two token counts or more above the knee: one alone it would fit exactly */
        for (int mid = 0; mid < 2; mid++) {
            double knee = mid ? round(sqrt(u[q] * u[q + 1])) : u[q];
            for (int f = 0; f <= 150; f++) {
                double fl = lo * 0.01 * f;
                for (int with_b = 0; with_b < 2; with_b++) {
                    const int use[3] = {1, with_b, 1};
                    double c[3] = {1, 0, 0};
                    for (int it = 0; it < 40 && knee_step(roofline, tokens, table, n, fl, knee, use, c); it++)
                        ;
                    kv_timing_knobs cand = {fl, 1 / c[0], c[1], knee, c[2]};
                    double cost = knobs_cost(roofline, tokens, table, n, &cand);
                    if (c[2] > 0 && cost < best) {
                        best = cost;
                        *out = cand;
                    }
                }
            }
        }
    kv_free(u);
}

double kv_timing_point_stock_seconds(const kv_timing *t, int decode, double batch, double x, double *tokens,
                                     double *no_comm_s)
{
    kv_timing stock = *t;
    for (int ph = 0; ph < 2; ph++) {
        stock.step_floor_s[ph] = 0;
        stock.step_efficiency[ph] = 1;
        stock.step_token_s[ph] = 0;
        stock.step_knee_tokens[ph] = 0;
        stock.step_knee_token_s[ph] = 0;
    }
    kv_step_work w = {0};
    for (int i = 0; i < (int)batch; i++) {
        if (decode)
            kv_step_add_decode(&stock, &w, x, bf16_kv_bytes(t->model, x));
        else
            kv_step_add_prefill(&stock, &w, x);
    }
    double s = kv_step_roofline_seconds(&stock, &w);
    if (no_comm_s)
        *no_comm_s = s - kv_step_allreduce_seconds(&stock, &w);
    *tokens = w.tokens;
    return s;
}


void kv_timing_fit_errors(const double *roofline, const double *tokens, const double *table, size_t n,
                          double floor_s, double efficiency, double token_s, double *median, double *worst, double *worst_ratio)
{
    kv_timing_knobs k = {floor_s, efficiency, token_s, 0, 0};
    kv_timing_knobs_errors(roofline, tokens, table, n, &k, median, worst, worst_ratio);
}

void kv_timing_knobs_errors(const double *roofline, const double *tokens, const double *table, size_t n,
                            const kv_timing_knobs *k, double *median, double *worst, double *worst_ratio)
{
    *median = *worst = 0;
    *worst_ratio = 1;
    if (n == 0)
        return;
    double *e = kv_calloc(n, sizeof *e), far = -1;
    for (size_t i = 0; i < n; i++) {
        double m = kv_timing_knobs_seconds(k, roofline[i], tokens[i]);
        e[i] = fabs(m / table[i] - 1);
        *worst = fmax(*worst, e[i]);
        if (fabs(log(table[i] / m)) > far) {
            far = fabs(log(table[i] / m));
            *worst_ratio = table[i] / m;
        }
    }
    qsort(e, n, sizeof *e, compare_double);
    *median = n % 2 ? e[n / 2] : (e[n / 2 - 1] + e[n / 2]) / 2;
    kv_free(e);
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
