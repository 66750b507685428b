/* kernel_time.c — measured kernel times for `timing: measured`, and the
 * calibration file (`kvsim bench kernels --json`) for `timing: model`. */
#include "backends/kernel_time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "core/base/jsonread.h"

double kv_kernel_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kv_kernel_time_call(kv_backend *be, int (*enqueue)(void *arg, kv_error *err), void *arg, int repeats,
                        double *best_s, double *median_s, kv_error *err)
{
    if (repeats < 1)
        repeats = 1;
    int rc = enqueue(arg, err);
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    double *t = kv_malloc((size_t)repeats * sizeof *t);
    for (int i = 0; i < repeats && !rc; i++) {
        /* Hook: a backend with device events would record them around the
           enqueue here and report the device time; every backend today is
           timed by the host wall clock around enqueue + synchronize. */
        double t0 = kv_kernel_now_s();
        rc = enqueue(arg, err);
        if (!rc)
            rc = kv_backend_synchronize(be, err);
        t[i] = kv_kernel_now_s() - t0;
    }
    if (!rc) {
        qsort(t, (size_t)repeats, sizeof *t, cmp_double);
        if (best_s)
            *best_s = t[0];
        if (median_s)
            *median_s = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    }
    kv_free(t);
    return rc;
}

/* ---- Measured timing ------------------------------------------------------------ */

static int repeats_of(const kv_kernel_timing *o)
{
    return o && o->repeats > 0 ? o->repeats : 3;
}

static double sample_of(const kv_kernel_timing *o)
{
    return o && o->sample > 0 && o->sample < 1 ? o->sample : 1.0;
}

/* Buffers of one encode/decode problem on a backend. */
typedef struct codec {
    kv_backend *be;
    kv_buffer *x, *anchor, *residual, *scale, *zero;
    kv_encode_args enc;
    kv_decode_args dec;
} codec;

static void codec_free(codec *c)
{
    kv_buffer_free(c->be, c->x);
    kv_buffer_free(c->be, c->anchor);
    kv_buffer_free(c->be, c->residual);
    kv_buffer_free(c->be, c->scale);
    kv_buffer_free(c->be, c->zero);
}

static int enqueue_encode(void *arg, kv_error *err)
{
    codec *c = arg;
    return kv_backend_encode(c->be, &c->enc, err);
}

static int enqueue_decode(void *arg, kv_error *err)
{
    codec *c = arg;
    return kv_backend_decode(c->be, &c->dec, err);
}

/* Sets up l on be with synthetic data, encoded once (so decode has input). */
static int codec_init(codec *c, kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                      kv_error *err)
{
    memset(c, 0, sizeof *c);
    c->be = be;
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    unsigned aw = anchor_bits ? anchor_bits : bits;
    float *x = kv_malloc((n ? n : 1) * sizeof *x);
    kv_fixture_normal(x, n, 7);
    int rc = kv_buffer_alloc(be, n * 4 + 4, &c->x, err);
    if (!rc)
        rc = kv_buffer_write(be, c->x, 0, x, n * 4, err);
    kv_free(x);
    if (!rc)
        rc = kv_buffer_alloc(be, kv_layout_packed_bytes(l, aw) + 4, &c->anchor, err);
    if (!rc && anchor_bits)
        rc = kv_buffer_alloc(be, kv_layout_packed_bytes(l, bits - anchor_bits) + 4, &c->residual, err);
    if (!rc)
        rc = kv_buffer_alloc(be, groups * 2 + 4, &c->scale, err);
    if (!rc)
        rc = kv_buffer_alloc(be, groups * 2 + 4, &c->zero, err);
    if (rc) {
        codec_free(c);
        return rc;
    }
    kv_encode_args e = {*l, bits, anchor_bits, {c->x, 0}, {c->anchor, 0}, {c->residual, 0}, {c->scale, 0},
                        {c->zero, 0}};
    kv_decode_args d = {*l, bits, anchor_bits, {c->anchor, 0}, {c->residual, 0}, {c->scale, 0}, {c->zero, 0},
                        {c->x, 0}};
    c->enc = e;
    c->dec = d;
    rc = enqueue_encode(c, err);
    if (!rc)
        rc = kv_backend_synchronize(be, err);
    if (rc)
        codec_free(c);
    return rc;
}

/* The layout with its token dimension sampled: rows for token groups, and
   for channel groups whole blocks of group_size rows. */
static kv_quant_layout sampled(const kv_quant_layout *l, double sample)
{
    kv_quant_layout s = *l;
    if (sample >= 1.0)
        return s;
    uint32_t rows = (uint32_t)ceil(l->rows * sample);
    if (l->grouping == KV_GROUP_CHANNEL)
        rows = (rows + l->group_size - 1) / l->group_size * l->group_size;
    s.rows = rows < 1 ? 1 : rows > l->rows ? l->rows : rows;
    return s;
}

static int time_codec(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits, int decode,
                      int anchor_only, const kv_kernel_timing *opts, double *seconds, kv_error *err)
{
    *seconds = 0;
    if (l->rows == 0 || l->cols == 0)
        return KV_OK;
    kv_quant_layout s = sampled(l, sample_of(opts));
    codec c;
    int rc = codec_init(&c, be, &s, bits, anchor_bits, err);
    if (rc)
        return rc;
    if (anchor_only)
        c.dec.residual_packed.buf = NULL;
    double med = 0;
    rc = kv_kernel_time_call(be, decode ? enqueue_decode : enqueue_encode, &c, repeats_of(opts), NULL, &med, err);
    codec_free(&c);
    if (!rc)
        *seconds = med * (double)l->rows / (double)s.rows;
    return rc;
}

int kv_kernel_time_encode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                          const kv_kernel_timing *opts, double *seconds, kv_error *err)
{
    return time_codec(be, l, bits, anchor_bits, 0, 0, opts, seconds, err);
}

int kv_kernel_time_decode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned anchor_bits,
                          int anchor_only, const kv_kernel_timing *opts, double *seconds, kv_error *err)
{
    return time_codec(be, l, bits, anchor_bits, 1, anchor_only && anchor_bits, opts, seconds, err);
}

static int enqueue_attention(void *arg, kv_error *err)
{
    return kv_attn_device_run(arg, err);
}

int kv_kernel_time_attention(kv_backend *be, const kv_attn_spec *spec, const kv_kernel_timing *opts,
                             double *seconds, kv_error *err)
{
    *seconds = 0;
    kv_attn_spec s = *spec;
    double f = sample_of(opts);
    if (f < 1.0) {
        uint32_t t = (uint32_t)ceil(spec->tokens * f);
        s.tokens = t < s.n_queries ? s.n_queries : t < 1 ? 1 : t;
    }
    kv_attn_problem *p = NULL;
    kv_attn_device *d = NULL;
    int rc = kv_attn_problem_create(&s, &p, err);
    if (!rc)
        rc = kv_attn_device_create(p, be, &d, err);
    double med = 0;
    if (!rc)
        rc = kv_kernel_time_call(be, enqueue_attention, d, repeats_of(opts), NULL, &med, err);
    kv_attn_device_destroy(d);
    kv_attn_problem_destroy(p);
    if (!rc)
        *seconds = s.tokens ? med * (double)spec->tokens / (double)s.tokens : med;
    return rc;
}

typedef struct compact_job {
    kv_backend *be;
    kv_compact_args a;
} compact_job;

static int enqueue_compact_pair(void *arg, kv_error *err)
{
    compact_job *j = arg;
    int rc = kv_backend_compact_alloc(j->be, &j->a, err);
    if (!rc)
        rc = kv_backend_compact_release(j->be, &j->a, err);
    return rc;
}

int kv_kernel_time_compact(kv_backend *be, uint32_t n, uint32_t pages_each, const kv_kernel_timing *opts,
                           double *seconds, kv_error *err)
{
    *seconds = 0;
    uint64_t total = (uint64_t)n * pages_each;
    if (total > UINT32_MAX / 2)
        return kv_error_set(err, KV_EINPUT, "compaction timing: %u x %u pages is too many", n, pages_each);
    uint32_t capacity = (uint32_t)(total * 2 + 1);
    uint32_t *host = kv_malloc((size_t)capacity * 4);
    compact_job j = {be, {n, capacity, {0}, {0}, {0}, {0}, {0}}};
    kv_buffer *b[5] = {0};
    size_t sizes[5] = {(size_t)n * 4 + 4, (size_t)n * 4 + 4, (size_t)total * 4 + 4, (size_t)capacity * 4, 16};
    int rc = KV_OK;
    for (int i = 0; i < 5 && !rc; i++)
        rc = kv_buffer_alloc(be, sizes[i], &b[i], err);
    if (!rc) {
        for (uint32_t i = 0; i < n; i++)
            host[i] = pages_each;
        rc = kv_buffer_write(be, b[0], 0, host, (size_t)n * 4, err);
    }
    if (!rc) {
        for (uint32_t i = 0; i < capacity; i++)
            host[i] = i;
        rc = kv_buffer_write(be, b[3], 0, host, (size_t)capacity * 4, err);
    }
    uint32_t state[4] = {0, 0, capacity, 0};
    if (!rc)
        rc = kv_buffer_write(be, b[4], 0, state, 16, err);
    kv_bref refs[5];
    for (int i = 0; i < 5; i++)
        refs[i] = (kv_bref){b[i], 0};
    j.a.demand = refs[0];
    j.a.offsets = refs[1];
    j.a.pages = refs[2];
    j.a.free_list = refs[3];
    j.a.state = refs[4];
    double med = 0;
    if (!rc)
        rc = kv_kernel_time_call(be, enqueue_compact_pair, &j, repeats_of(opts), NULL, &med, err);
    for (int i = 0; i < 5; i++)
        kv_buffer_free(be, b[i]);
    kv_free(host);
    if (!rc)
        *seconds = med / 2;
    return rc;
}

/* A member of the given kind, or NULL (also when obj is not an object or the member is of another kind). */
static const kv_jvalue *jget(const kv_jvalue *obj, const char *key, kv_jkind kind)
{
    const kv_jvalue *v = kv_jvalue_get(obj, key);
    return v && v->kind == kind ? v : NULL;
}

/* ---- Calibration ------------------------------------------------------------------- */

typedef struct calib_entry {
    char kernel_class[32];
    double context; /* largest context seen */
    double sum;     /* of ratios at that context */
    int count;
} calib_entry;

struct kv_kernel_calib {
    double bandwidth_gbps;
    calib_entry *e;
    size_t n, cap;
};

int kv_kernel_calib_load(const char *path, const char *backend, kv_kernel_calib **out, kv_error *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = kv_input_read_all(path, "the calibration file", KV_INPUT_MAX_TEXT, &text, &len, err);
    if (rc)
        return rc;
    kv_jvalue *root = NULL;
    rc = kv_jread_parse(text, len, path, &root, err);
    kv_free(text);
    if (rc)
        return rc;
    const kv_jvalue *bes = jget(root, "backends", KV_JARRAY), *chosen = NULL;
    for (size_t i = 0; bes && i < bes->count && !chosen; i++) {
        const kv_jvalue *name = jget(bes->items[i], "backend", KV_JSTRING);
        if (name && (!backend || strcmp(name->text, backend) == 0))
            chosen = bes->items[i];
    }
    if (!chosen) {
        rc = kv_error_set(err, KV_EINPUT, "%s: backends: no entry for backend '%s' (is this a kvsim bench kernels "
                          "--json file?)", path, backend ? backend : "(any)");
        kv_jvalue_free(root);
        return rc;
    }
    kv_kernel_calib *c = kv_calloc(1, sizeof *c);
    const kv_jvalue *bw = jget(chosen, "bandwidth_gbps", KV_JNUMBER);
    c->bandwidth_gbps = bw ? bw->number : 0;
    const kv_jvalue *ks = jget(chosen, "kernels", KV_JARRAY);
    for (size_t i = 0; ks && i < ks->count; i++) {
        /* the on-CPU ratio, where measured, is the one free of other processes' load */
        const kv_jvalue *cls = jget(ks->items[i], "calib", KV_JSTRING);
        const kv_jvalue *ctx = jget(ks->items[i], "context", KV_JNUMBER);
        const kv_jvalue *ratio = jget(ks->items[i], "ratio_oncpu", KV_JNUMBER);
        if (!ratio || !(ratio->number > 0))
            ratio = jget(ks->items[i], "ratio", KV_JNUMBER);
        if (!cls || !ratio || !(ratio->number > 0))
            continue;
        double context = ctx ? ctx->number : 0;
        calib_entry *e = NULL;
        for (size_t k = 0; k < c->n; k++)
            if (strcmp(c->e[k].kernel_class, cls->text) == 0)
                e = &c->e[k];
        if (!e) {
            kv_grow((void **)&c->e, sizeof *c->e, &c->cap, c->n + 1);
            e = &c->e[c->n++];
            memset(e, 0, sizeof *e);
            snprintf(e->kernel_class, sizeof e->kernel_class, "%s", cls->text);
            e->context = -1;
        }
        if (context > e->context) {
            e->context = context;
            e->sum = 0;
            e->count = 0;
        }
        if (context == e->context) {
            e->sum += ratio->number;
            e->count++;
        }
    }
    kv_jvalue_free(root);
    *out = c;
    return KV_OK;
}

void kv_kernel_calib_destroy(kv_kernel_calib *c)
{
    if (!c)
        return;
    kv_free(c->e);
    kv_free(c);
}

double kv_kernel_calib_efficiency(const kv_kernel_calib *c, const char *kernel_class, double fallback)
{
    for (size_t k = 0; c && k < c->n; k++)
        if (strcmp(c->e[k].kernel_class, kernel_class) == 0 && c->e[k].count > 0)
            return c->e[k].sum / c->e[k].count;
    return fallback;
}

double kv_kernel_calib_bandwidth_gbps(const kv_kernel_calib *c)
{
    return c ? c->bandwidth_gbps : 0;
}
