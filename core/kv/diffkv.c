/* diffkv.c — DiffKV tier decisions: the exact per-head process and the per-sequence count process. */
#include "core/kv/diffkv.h"
#include "core/kv/curves.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/rng.h"

/* ---- The rule -------------------------------------------------------------------------------- */

kv_tier kv_diffkv_classify(float sum, float queries, int64_t context, float alpha_high, float alpha_low)
{
    float mean = queries > 0 ? sum / queries : 0.0f;
    /* fp32 as DiffKV's kernels: base = 1/N, thresholds = base * alpha. */
    float base = 1.0f / (float)(context > 0 ? context : 1);
    float t_low = base * alpha_low, t_high = base * alpha_high;
    if (mean < t_low)
        return KV_TIER_PRUNED;
    if (mean < t_high)
        return KV_TIER_LOW;
    return KV_TIER_HIGH;
}

kv_tier kv_diffkv_classify_z(double z, double alpha_high, double alpha_low)
{
    if (z < alpha_low)
        return KV_TIER_PRUNED;
    if (z < alpha_high)
        return KV_TIER_LOW;
    return KV_TIER_HIGH;
}

/* ---- 1. The exact process ------------------------------------------------------------------- */

void kv_diffkv_prefill_tiers(const float *score_sum, int tokens, float alpha_high, float alpha_low, int window,
                             uint8_t *tiers)
{
    for (int i = 0; i < tokens; i++)
        tiers[i] = tokens - i <= window ? KV_TIER_HIGH /* the recent window */
                                        : (uint8_t)kv_diffkv_classify(score_sum[i], (float)(tokens - i), tokens,
                                                                      alpha_high, alpha_low);
}

struct kv_diffkv_head {
    float alpha_high, alpha_low;
    int window;
    int64_t context;   /* L: tokens ever appended (stored + pruned) */
    int n, cap;        /* stored tokens, array capacity */
    int64_t *pos;      /* [n] positions, increasing */
    uint8_t *tier;     /* [n] KV_TIER_HIGH or KV_TIER_LOW */
    float *sum;        /* [n] running sum of probabilities received */
    uint32_t *queries; /* [n] queries summed into sum */
    int count[2];      /* stored tokens per tier */
};

kv_diffkv_head *kv_diffkv_head_create(float alpha_high, float alpha_low, int window, kv_error *err)
{
    if (!(alpha_high >= 0) || !(alpha_low >= 0) || alpha_low > alpha_high || window < 0) {
        kv_error_set(err, KV_EINPUT,
                     "diffkv: need 0 <= alpha_low <= alpha_high and window >= 0 (got alpha_high %g, alpha_low %g, "
                     "window %d)",
                     (double)alpha_high, (double)alpha_low, window);
        return NULL;
    }
    kv_diffkv_head *h = kv_calloc(1, sizeof *h);
    h->alpha_high = alpha_high;
    h->alpha_low = alpha_low;
    h->window = window;
    return h;
}

void kv_diffkv_head_destroy(kv_diffkv_head *h)
{
    if (!h)
        return;
    kv_free(h->pos);
    kv_free(h->tier);
    kv_free(h->sum);
    kv_free(h->queries);
    kv_free(h);
}

static void head_reserve(kv_diffkv_head *h, int need)
{
    if (need <= h->cap)
        return;
    int cap = h->cap ? h->cap : 64;
    while (cap < need)
        cap *= 2;
    h->pos = kv_realloc(h->pos, (size_t)cap * sizeof *h->pos);
    h->tier = kv_realloc(h->tier, (size_t)cap * sizeof *h->tier);
    h->sum = kv_realloc(h->sum, (size_t)cap * sizeof *h->sum);
    h->queries = kv_realloc(h->queries, (size_t)cap * sizeof *h->queries);
    h->cap = cap;
}

static void head_push(kv_diffkv_head *h, int64_t pos, kv_tier tier, float sum, uint32_t queries)
{
    head_reserve(h, h->n + 1);
    h->pos[h->n] = pos;
    h->tier[h->n] = (uint8_t)tier;
    h->sum[h->n] = sum;
    h->queries[h->n] = queries;
    h->n++;
    h->count[tier]++;
}

static void head_remove(kv_diffkv_head *h, int i)
{
    h->count[h->tier[i]]--;
    size_t rest = (size_t)(h->n - i - 1);
    memmove(h->pos + i, h->pos + i + 1, rest * sizeof *h->pos);
    memmove(h->tier + i, h->tier + i + 1, rest * sizeof *h->tier);
    memmove(h->sum + i, h->sum + i + 1, rest * sizeof *h->sum);
    memmove(h->queries + i, h->queries + i + 1, rest * sizeof *h->queries);
    h->n--;
}

void kv_diffkv_head_prefill(kv_diffkv_head *h, const float *score_sum, int tokens)
{
    h->n = 0;
    h->count[0] = h->count[1] = 0;
    h->context = tokens > 0 ? tokens : 0;
    if (tokens <= 0)
        return;
    uint8_t *tiers = kv_malloc((size_t)tokens);
    kv_diffkv_prefill_tiers(score_sum, tokens, h->alpha_high, h->alpha_low, h->window, tiers);
    for (int i = 0; i < tokens; i++)
        if (tiers[i] != KV_TIER_PRUNED)
            head_push(h, i, (kv_tier)tiers[i], score_sum[i], (uint32_t)(tokens - i));
    kv_free(tiers);
}

void kv_diffkv_head_step(kv_diffkv_head *h, const float *probs, kv_diffkv_change *out)
{
    kv_diffkv_change ch = {-1, -1, KV_TIER_PRUNED};
    head_push(h, h->context, KV_TIER_HIGH, 0.0f, 0);
    h->context++;
    int64_t L = h->context, leaving = L - 1 - h->window;
    for (int i = 0; i < h->n; i++) {
        h->sum[i] += probs[i];
        h->queries[i]++;
    }
    /* The token leaving the W most recent positions (if it is still stored: every older one is
       decided already) gets its final tier. */
    int i = h->n - 1 - h->window;
    if (leaving >= 0 && i >= 0 && h->pos[i] == leaving) {
        kv_tier t = kv_diffkv_classify(h->sum[i], (float)h->queries[i], L, h->alpha_high, h->alpha_low);
        if (t == KV_TIER_PRUNED) {
            ch.pruned = leaving;
            ch.pruned_tier = KV_TIER_HIGH;
            head_remove(h, i);
        } else if (t == KV_TIER_LOW) {
            ch.demoted = leaving;
            h->tier[i] = KV_TIER_LOW;
            h->count[KV_TIER_HIGH]--;
            h->count[KV_TIER_LOW]++;
        }
    }
    if (out)
        *out = ch;
}

int kv_diffkv_head_stored(const kv_diffkv_head *h)
{
    return h->n;
}

int kv_diffkv_head_context(const kv_diffkv_head *h)
{
    return (int)h->context;
}

int kv_diffkv_head_count(const kv_diffkv_head *h, kv_tier tier)
{
    if (tier == KV_TIER_PRUNED)
        return (int)h->context - h->n;
    return h->count[tier];
}

void kv_diffkv_head_token(const kv_diffkv_head *h, int i, int64_t *position, kv_tier *tier, float *sum,
                          uint32_t *queries)
{
    if (position)
        *position = h->pos[i];
    if (tier)
        *tier = (kv_tier)h->tier[i];
    if (sum)
        *sum = h->sum[i];
    if (queries)
        *queries = h->queries[i];
}

/* ---- 2. The sequence process ---------------------------------------------------------------- */

/* P(N(0,1) < x). */
static double normal_cdf(double x)
{
    return 0.5 * erfc(-x / sqrt(2.0));
}

static void probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, bool prefill,
                          double *high, double *low, double *pruned)
{
    double ph, pl, pp;
    if (m->kind == KV_DIFFKV_SCORES_MEASURED) {
        /* The rule on z drawn from the head's measured distribution: P(z < alpha). */
        const double *q = (prefill ? m->table.z_prefill : m->table.z_exit) + (size_t)p->table_row * KV_DIFFKV_TABLE_POINTS;
        double below_low = kv_diffkv_table_cdf(q, p->alpha_low), below_high = kv_diffkv_table_cdf(q, p->alpha_high);
        if (below_high < below_low)
            below_high = below_low;
        pp = below_low;
        pl = below_high - below_low;
        ph = 1.0 - below_high;
    } else if (m->kind == KV_DIFFKV_SCORES_FIXED) {
        ph = m->high_fraction;
        pl = m->low_fraction;
        pp = 1.0 - ph - pl;
        if (pp < 0)
            pp = 0;
    } else {
        /* z = L * significance, ln z ~ N(-s^2/2, s) so that E[z] = 1 (probabilities sum to 1). */
        double s = m->sigma * p->head_factor;
        double below_low, below_high;
        if (!(s > 0)) {
            below_low = 1.0 < p->alpha_low;
            below_high = 1.0 < p->alpha_high;
        } else {
            below_low = p->alpha_low > 0 ? normal_cdf((log(p->alpha_low) + s * s / 2) / s) : 0;
            below_high = p->alpha_high > 0 ? normal_cdf((log(p->alpha_high) + s * s / 2) / s) : 0;
        }
        if (below_high < below_low)
            below_high = below_low;
        pp = below_low;
        pl = below_high - below_low;
        ph = 1.0 - below_high;
    }
    *high = ph;
    *low = pl;
    *pruned = pp;
}

void kv_diffkv_tier_probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, double *high,
                                  double *low, double *pruned)
{
    probabilities(m, p, false, high, low, pruned);
}

void kv_diffkv_prefill_probabilities(const kv_diffkv_score_model *m, const kv_diffkv_head_params *p, double *high,
                                     double *low, double *pruned)
{
    probabilities(m, p, true, high, low, pruned);
}

double kv_diffkv_table_cdf(const double *q, double x)
{
    const int n = KV_DIFFKV_TABLE_POINTS;
    if (!(x > q[0]))
        return 0.0; /* nothing lies below the smallest measured z (z < alpha is strict) */
    if (x > q[n - 1])
        return 1.0;
    /* The last quantile below x: q[k] < x <= q[k + 1]. */
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (q[mid] < x)
            lo = mid;
        else
            hi = mid;
    }
    double span = q[hi] - q[lo], f = span > 0 ? (x - q[lo]) / span : 1.0;
    return ((double)lo + f) / (double)(n - 1);
}

int kv_diffkv_table_row(const kv_diffkv_table *t, int layer, int layers, int kv_head, int kv_heads)
{
    int l = layers > 0 ? (int)((int64_t)layer * t->layers / layers) : 0;
    int h = kv_heads > 0 ? (int)((int64_t)kv_head * t->kv_heads / kv_heads) : 0;
    l = l < t->layers ? l : t->layers - 1;
    h = h < t->kv_heads ? h : t->kv_heads - 1;
    return l * t->kv_heads + h;
}

void kv_diffkv_head_factors(const kv_diffkv_score_model *m, uint64_t seed, int heads, double *factors)
{
    kv_rng base, rng;
    kv_rng_seed(&base, seed);
    kv_rng_fork(&base, 0xd1ffc0deULL, &rng);
    for (int i = 0; i < heads; i++) {
        double g = kv_rng_normal(&rng);
        factors[i] = m->kind == KV_DIFFKV_SCORES_LOGNORMAL ? exp(m->head_spread * g) : 1.0;
    }
}

struct kv_diffkv_seq {
    int heads;
    int64_t tokens;       /* context length L */
    uint32_t *high, *low; /* [heads] tokens stored per tier */
    uint32_t *key;        /* [heads] hash key of the head in this sequence */
    uint32_t *th_pruned;  /* [heads] draw < th_pruned: pruned (probability x 2^32, saturated) */
    uint32_t *th_low;     /* [heads] draw < th_low: not high (demoted or pruned) */
    uint32_t *thp_prefill, *thl_prefill; /* [heads] the same for prompt tokens at the end of a prefill */
    uint32_t *window;     /* [heads] W */
    uint64_t total_high, total_low;
    /* Measured at several lengths (m->curve): the thresholds follow the context length. */
    const kv_diffkv_curve *curve;  /* borrowed; NULL: the thresholds above at every length */
    kv_diffkv_score_model model;   /* the score model, for the probabilities at each measured length */
    kv_diffkv_head_params *params; /* [heads] copy */
    double *cum_lo, *cum_hi;       /* [2][heads] exit P(pruned) then P(not high) at lengths br_lo, br_hi */
    int br_lo, br_hi, br_q;        /* the exit thresholds in use: bracket, w in steps of 1/KV_DIFFKV_W_STEPS */
    int64_t recheck_lo, recheck_hi;/* context lengths within which the exit thresholds stay as they are */
};

#define KV_DIFFKV_W_STEPS 256 /* decode reads a bracket's weight in these steps (thresholds change rarely) */

/* A 32-bit integer hash with good avalanche (lowbias32, by C. Wellons). */
static inline uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* The uniform draw that decides the token at `position` of head h. */
static inline uint32_t token_draw(uint32_t key, uint32_t position)
{
    return mix32(key + position * 0x9e3779b9U);
}

/* p x 2^32 as a 32-bit threshold; p = 1 saturates to 2^32 - 1, so "always" is off by 2^-32. */
static uint32_t threshold(double p)
{
    if (!(p > 0))
        return 0;
    double t = floor(p * 4294967296.0);
    return t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
}

kv_diffkv_seq *kv_diffkv_seq_create(const kv_diffkv_score_model *m, const kv_diffkv_head_params *params, int heads,
                                    uint64_t seed)
{
    kv_diffkv_seq *s = kv_calloc(1, sizeof *s);
    size_t n = heads > 0 ? (size_t)heads : 1;
    s->heads = heads;
    s->high = kv_calloc(n, sizeof *s->high);
    s->low = kv_calloc(n, sizeof *s->low);
    s->key = kv_calloc(n, sizeof *s->key);
    s->th_pruned = kv_calloc(n, sizeof *s->th_pruned);
    s->th_low = kv_calloc(n, sizeof *s->th_low);
    s->thp_prefill = kv_calloc(n, sizeof *s->thp_prefill);
    s->thl_prefill = kv_calloc(n, sizeof *s->thl_prefill);
    s->window = kv_calloc(n, sizeof *s->window);
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    for (int h = 0; h < heads; h++) {
        double ph, pl, pp;
        kv_diffkv_tier_probabilities(m, &params[h], &ph, &pl, &pp);
        s->th_pruned[h] = threshold(pp);
        s->th_low[h] = threshold(pp + pl);
        if (s->th_low[h] < s->th_pruned[h])
            s->th_low[h] = s->th_pruned[h];
        kv_diffkv_prefill_probabilities(m, &params[h], &ph, &pl, &pp);
        s->thp_prefill[h] = threshold(pp);
        s->thl_prefill[h] = threshold(pp + pl);
        if (s->thl_prefill[h] < s->thp_prefill[h])
            s->thl_prefill[h] = s->thp_prefill[h];
        s->key[h] = (uint32_t)kv_rng_u64(&rng);
        s->window[h] = params[h].window > 0 ? (uint32_t)params[h].window : 0;
    }
    if (m->kind == KV_DIFFKV_SCORES_MEASURED && m->curve && m->curve->n_lengths > 1) {
        s->curve = m->curve;
        s->model = *m;
        s->params = kv_calloc(n, sizeof *s->params);
        memcpy(s->params, params, (size_t)heads * sizeof *params);
        s->cum_lo = kv_calloc(2 * n, sizeof *s->cum_lo);
        s->cum_hi = kv_calloc(2 * n, sizeof *s->cum_hi);
        s->br_lo = s->br_hi = -1;
    }
    return s;
}

/* Head h's P(pruned) and P(not high) at measured length i (prefill or window exit). */
static void length_cum(const kv_diffkv_seq *s, int i, bool prefill, int h, double *pruned, double *not_high)
{
    kv_diffkv_score_model mi = s->model;
    mi.table = s->curve->table[i];
    double ph, pl, pp;
    probabilities(&mi, &s->params[h], prefill, &ph, &pl, &pp);
    *pruned = pp;
    *not_high = pp + pl;
}

static double mix_w(double a, double b, double w)
{
    return w == 0.0 ? a : (1.0 - w) * a + w * b;
}

static void set_thresholds(uint32_t *th_pruned, uint32_t *th_low, double pp, double not_high)
{
    *th_pruned = threshold(pp);
    *th_low = threshold(not_high);
    if (*th_low < *th_pruned)
        *th_low = *th_pruned;
}

/* The exit thresholds at context length L: the probabilities of the measured lengths bracketing L,
   interpolated in log(L) (kv_curve_locate) with the weight in steps of 1 / KV_DIFFKV_W_STEPS; each
   bracket's per-head probabilities are computed once when L enters it. */
static void exit_thresholds_at(kv_diffkv_seq *s, int64_t L)
{
    if (L >= s->recheck_lo && L < s->recheck_hi)
        return;
    const kv_diffkv_curve *c = s->curve;
    int tokens = L > INT32_MAX ? INT32_MAX : (int)L;
    kv_curve_point p = kv_curve_locate(c->lengths, c->n_lengths, tokens);
    int q = p.lo == p.hi ? 0 : (int)(p.w * KV_DIFFKV_W_STEPS);
    if (q >= KV_DIFFKV_W_STEPS)
        q = KV_DIFFKV_W_STEPS - 1;
    /* The lengths where q changes: lengths[lo] x (hi / lo)^(q / steps). */
    if (p.lo == p.hi) {
        int last = c->n_lengths - 1;
        if (tokens <= c->lengths[0]) { /* below (or at) the shortest: its figures up to it */
            s->recheck_lo = 0;
            s->recheck_hi = (int64_t)c->lengths[0] + 1;
        } else { /* at a measured length, or held beyond the longest */
            s->recheck_lo = c->lengths[p.lo];
            s->recheck_hi = p.lo == last ? INT64_MAX : (int64_t)c->lengths[p.lo] + 1;
        }
    } else {
        double a = log((double)c->lengths[p.lo]), span = log((double)c->lengths[p.hi]) - a;
        s->recheck_lo = (int64_t)ceil(exp(a + span * q / KV_DIFFKV_W_STEPS));
        s->recheck_hi = (int64_t)ceil(exp(a + span * (q + 1) / KV_DIFFKV_W_STEPS));
        if (s->recheck_lo > L)
            s->recheck_lo = L; /* rounding: L itself is inside */
        if (s->recheck_hi <= L)
            s->recheck_hi = L + 1;
    }
    if (p.lo == s->br_lo && p.hi == s->br_hi && q == s->br_q)
        return;
    int n = s->heads;
    if (p.lo != s->br_lo || p.hi != s->br_hi) {
        for (int h = 0; h < n; h++) {
            length_cum(s, p.lo, false, h, &s->cum_lo[h], &s->cum_lo[n + h]);
            if (p.hi != p.lo)
                length_cum(s, p.hi, false, h, &s->cum_hi[h], &s->cum_hi[n + h]);
            else
                s->cum_hi[h] = s->cum_lo[h], s->cum_hi[n + h] = s->cum_lo[n + h];
        }
        s->br_lo = p.lo;
        s->br_hi = p.hi;
    }
    s->br_q = q;
    double w = (double)q / KV_DIFFKV_W_STEPS;
    for (int h = 0; h < n; h++)
        set_thresholds(&s->th_pruned[h], &s->th_low[h], mix_w(s->cum_lo[h], s->cum_hi[h], w),
                       mix_w(s->cum_lo[n + h], s->cum_hi[n + h], w));
}

/* The prefill thresholds at a prompt of `tokens` tokens, interpolated exactly in log(tokens). */
static void prefill_thresholds_at(kv_diffkv_seq *s, int tokens)
{
    kv_curve_point p = kv_curve_locate(s->curve->lengths, s->curve->n_lengths, tokens);
    for (int h = 0; h < s->heads; h++) {
        double pp_lo, nh_lo, pp_hi, nh_hi;
        length_cum(s, p.lo, true, h, &pp_lo, &nh_lo);
        if (p.hi != p.lo)
            length_cum(s, p.hi, true, h, &pp_hi, &nh_hi);
        else
            pp_hi = pp_lo, nh_hi = nh_lo;
        set_thresholds(&s->thp_prefill[h], &s->thl_prefill[h], mix_w(pp_lo, pp_hi, p.w), mix_w(nh_lo, nh_hi, p.w));
    }
}

void kv_diffkv_seq_prefill_shares(const kv_diffkv_seq *s, int tokens, bool trend, double *high, double *low)
{
    double sum_high = 0, sum_low = 0;
    int n = s->heads;
    for (int h = 0; h < n; h++) {
        double pp, nh;
        if (!s->curve) {
            pp = (double)s->thp_prefill[h] / 4294967296.0;
            nh = (double)s->thl_prefill[h] / 4294967296.0;
        } else {
            const kv_diffkv_curve *c = s->curve;
            kv_curve_point p = kv_curve_locate(c->lengths, c->n_lengths, tokens);
            int lo = p.lo, hi = p.hi;
            double w = p.w;
            if (trend && p.beyond) {
                lo = c->n_lengths - 2;
                hi = c->n_lengths - 1;
                w = kv_curve_trend_weight(c->lengths, c->n_lengths, tokens);
            }
            double pp_lo, nh_lo, pp_hi, nh_hi;
            length_cum(s, lo, true, h, &pp_lo, &nh_lo);
            length_cum(s, hi, true, h, &pp_hi, &nh_hi);
            pp = mix_w(pp_lo, pp_hi, w);
            nh = mix_w(nh_lo, nh_hi, w);
            pp = pp < 0 ? 0 : pp > 1 ? 1 : pp;
            nh = nh < pp ? pp : nh > 1 ? 1 : nh;
        }
        sum_high += 1.0 - nh;
        sum_low += nh - pp;
    }
    *high = n > 0 ? sum_high / n : NAN;
    *low = n > 0 ? sum_low / n : NAN;
}

void kv_diffkv_seq_destroy(kv_diffkv_seq *s)
{
    if (!s)
        return;
    kv_free(s->high);
    kv_free(s->low);
    kv_free(s->key);
    kv_free(s->th_pruned);
    kv_free(s->th_low);
    kv_free(s->thp_prefill);
    kv_free(s->thl_prefill);
    kv_free(s->window);
    kv_free(s->params);
    kv_free(s->cum_lo);
    kv_free(s->cum_hi);
    kv_free(s);
}

void kv_diffkv_seq_prefill(kv_diffkv_seq *s, int tokens)
{
    if (tokens < 0)
        tokens = 0;
    s->tokens = tokens;
    s->total_high = s->total_low = 0;
    if (s->curve) {
        prefill_thresholds_at(s, tokens);
        s->recheck_lo = s->recheck_hi = 0; /* the next step finds its exit thresholds */
    }
    for (int h = 0; h < s->heads; h++) {
        uint32_t w = s->window[h] < (uint32_t)tokens ? s->window[h] : (uint32_t)tokens;
        uint32_t high = w, low = 0, key = s->key[h], thl = s->thl_prefill[h], thp = s->thp_prefill[h];
        /* The tokens outside the window, positions 0 .. tokens-w-1, each decided by its own draw. */
        for (uint32_t pos = 0; pos < (uint32_t)tokens - w; pos++) {
            uint32_t u = token_draw(key, pos);
            high += u >= thl;
            low += (u >= thp) & (u < thl);
        }
        s->high[h] = high;
        s->low[h] = low;
        s->total_high += high;
        s->total_low += low;
    }
}

/* One head's step: the new token joins high; the token leaving the window (if any) stays high, is
   demoted or is pruned by its draw. Branch-free, so blocks of heads vectorise. */
static inline void head_step(uint32_t L, uint32_t key, uint32_t thl, uint32_t thp, uint32_t win, uint32_t *high,
                             uint32_t *low, uint32_t *add_high, uint32_t *add_low)
{
    uint32_t e = L - 1 >= win;           /* a token left the W most recent */
    uint32_t u = token_draw(key, L - 1 - win);
    uint32_t keep = u >= thl;
    uint32_t demote = (u >= thp) & (keep ^ 1U);
    uint32_t dh = (1U - e) + (e & keep);
    uint32_t dl = e & demote;
    *high += dh;
    *low += dl;
    *add_high += dh;
    *add_low += dl;
}

/* Four heads at once with the compiler's generic vectors (16 bytes: SSE2 on x86-64, NEON on arm64;
   no intrinsics). The lanes compute exactly what head_step computes. */
typedef uint32_t v4u32 __attribute__((vector_size(16)));

static inline v4u32 load4(const uint32_t *p)
{
    v4u32 v;
    memcpy(&v, p, sizeof v);
    return v;
}

void kv_diffkv_seq_step(kv_diffkv_seq *s)
{
    uint32_t L = (uint32_t)++s->tokens;
    if (s->curve)
        exit_thresholds_at(s, L);
    const uint32_t *key = s->key, *thp = s->th_pruned, *thl = s->th_low, *win = s->window;
    uint32_t *high = s->high, *low = s->low;
    uint32_t add_high = 0, add_low = 0;
    int h = 0;
    v4u32 acc_h = {0}, acc_l = {0};
    const v4u32 one = {1, 1, 1, 1};
    for (; h + 4 <= s->heads; h += 4) {
        /* Vector comparisons give all-ones (-1) for true: & one turns them into 0/1. */
        v4u32 w = load4(win + h), lm1 = one * (L - 1);
        v4u32 e = (v4u32)(lm1 >= w) & one;
        v4u32 x = load4(key + h) + (lm1 - w) * 0x9e3779b9U;
        x ^= x >> 16;
        x *= 0x7feb352dU;
        x ^= x >> 15;
        x *= 0x846ca68bU;
        x ^= x >> 16;
        v4u32 keep = (v4u32)(x >= load4(thl + h)) & one;
        v4u32 demote = (v4u32)(x >= load4(thp + h)) & one & (keep ^ one);
        v4u32 dh = (one - e) + (e & keep), dl = e & demote;
        v4u32 nh = load4(high + h) + dh, nl = load4(low + h) + dl;
        memcpy(high + h, &nh, sizeof nh);
        memcpy(low + h, &nl, sizeof nl);
        acc_h += dh;
        acc_l += dl;
    }
    for (int j = 0; j < 4; j++) {
        add_high += acc_h[j];
        add_low += acc_l[j];
    }
    for (; h < s->heads; h++)
        head_step(L, key[h], thl[h], thp[h], win[h], &high[h], &low[h], &add_high, &add_low);
    s->total_high += add_high;
    s->total_low += add_low;
}

int kv_diffkv_seq_heads(const kv_diffkv_seq *s)
{
    return s->heads;
}

int64_t kv_diffkv_seq_tokens(const kv_diffkv_seq *s)
{
    return s->tokens;
}

const uint32_t *kv_diffkv_seq_high(const kv_diffkv_seq *s)
{
    return s->high;
}

const uint32_t *kv_diffkv_seq_low(const kv_diffkv_seq *s)
{
    return s->low;
}

void kv_diffkv_seq_totals(const kv_diffkv_seq *s, uint64_t *high, uint64_t *low, uint64_t *pruned)
{
    if (high)
        *high = s->total_high;
    if (low)
        *low = s->total_low;
    if (pruned)
        *pruned = (uint64_t)s->tokens * (uint64_t)s->heads - s->total_high - s->total_low;
}
