/* kernel_time.c — measured kernel times for `timing: measured`, and the
 * calibration file (`kvsim bench kernels --json`) for `timing: model`. */
#include "backends/kernel_time.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/infile.h"

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

/* ---- A small JSON reader for the calibration file -------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    double num;
    char *str;            /* J_STR */
    struct jval *items;   /* J_ARR, J_OBJ: values */
    char **keys;          /* J_OBJ */
    size_t n;
} jval;

typedef struct jparser {
    const char *s, *path;
    size_t at;
    kv_error *err;
    int depth;
} jparser;

static void jfree(jval *v)
{
    if (v->type == J_STR)
        kv_free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys)
            kv_free(v->keys[i]);
    }
    kv_free(v->items);
    kv_free(v->keys);
}

static int jerr(jparser *p, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->at && p->s[i]; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return kv_error_set(p->err, KV_EINPUT, "%s:%zu:%zu: %s", p->path, line, col, what);
}

static void jskip(jparser *p)
{
    while (p->s[p->at] && isspace((unsigned char)p->s[p->at]))
        p->at++;
}

static int jparse(jparser *p, jval *v);

static int jstring(jparser *p, char **out)
{
    p->at++; /* opening quote */
    size_t cap = 16, n = 0;
    char *s = kv_malloc(cap);
    for (;;) {
        char ch = p->s[p->at];
        if (ch == '\0' || ch == '\n') {
            kv_free(s);
            return jerr(p, "unterminated string");
        }
        p->at++;
        if (ch == '"')
            break;
        if (ch == '\\') {
            char e = p->s[p->at++];
            ch = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
            if (e == 'u') { /* keep \uXXXX as '?': the calibration file has no such keys */
                for (int i = 0; i < 4 && isxdigit((unsigned char)p->s[p->at]); i++)
                    p->at++;
                ch = '?';
            }
        }
        if (n + 2 > cap)
            kv_grow((void **)&s, 1, &cap, n + 2);
        s[n++] = ch;
    }
    s[n] = '\0';
    *out = s;
    return KV_OK;
}

static int jcontainer(jparser *p, jval *v, int object)
{
    char close = object ? '}' : ']';
    size_t cap = 0;
    v->type = object ? J_OBJ : J_ARR;
    p->at++;
    jskip(p);
    if (p->s[p->at] == close) {
        p->at++;
        return KV_OK;
    }
    for (;;) {
        jskip(p);
        char *key = NULL;
        if (object) {
            if (p->s[p->at] != '"')
                return jerr(p, "expected a \"key\"");
            int rc = jstring(p, &key);
            if (rc)
                return rc;
            jskip(p);
            if (p->s[p->at] != ':') {
                kv_free(key);
                return jerr(p, "expected ':'");
            }
            p->at++;
        }
        if (v->n == cap) {
            size_t c2 = cap;
            kv_grow((void **)&v->items, sizeof *v->items, &cap, v->n + 1);
            if (object)
                kv_grow((void **)&v->keys, sizeof *v->keys, &c2, v->n + 1);
        }
        memset(&v->items[v->n], 0, sizeof v->items[v->n]);
        if (object)
            v->keys[v->n] = key;
        v->n++;
        int rc = jparse(p, &v->items[v->n - 1]);
        if (rc)
            return rc;
        jskip(p);
        if (p->s[p->at] == ',') {
            p->at++;
            continue;
        }
        if (p->s[p->at] == close) {
            p->at++;
            return KV_OK;
        }
        return jerr(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jparse(jparser *p, jval *v)
{
    memset(v, 0, sizeof *v);
    jskip(p);
    if (++p->depth > 64)
        return jerr(p, "nested too deeply");
    char ch = p->s[p->at];
    int rc = KV_OK;
    if (ch == '{' || ch == '[') {
        rc = jcontainer(p, v, ch == '{');
    } else if (ch == '"') {
        v->type = J_STR;
        rc = jstring(p, &v->str);
    } else if (strncmp(p->s + p->at, "true", 4) == 0 || strncmp(p->s + p->at, "false", 5) == 0) {
        v->type = J_BOOL;
        v->num = ch == 't';
        p->at += ch == 't' ? 4 : 5;
    } else if (strncmp(p->s + p->at, "null", 4) == 0) {
        p->at += 4;
    } else {
        char *end;
        v->type = J_NUM;
        v->num = strtod(p->s + p->at, &end);
        if (end == p->s + p->at)
            rc = jerr(p, "expected a value");
        else
            p->at = (size_t)(end - p->s);
    }
    p->depth--;
    return rc;
}

static const jval *jget(const jval *o, const char *key, jtype type)
{
    if (!o || o->type != J_OBJ)
        return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0)
            return o->items[i].type == type ? &o->items[i] : NULL;
    return NULL;
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
    int rc = kv_input_read_all(path, "the calibration file", KV_INPUT_MAX_TEXT, &text, NULL, err);
    if (rc)
        return rc;
    jparser p = {text, path, 0, err, 0};
    jval root;
    rc = jparse(&p, &root);
    if (!rc) {
        jskip(&p);
        if (p.s[p.at])
            rc = jerr(&p, "text after the JSON value");
    }
    kv_free(text);
    if (rc) {
        jfree(&root);
        return rc;
    }
    const jval *bes = jget(&root, "backends", J_ARR), *chosen = NULL;
    for (size_t i = 0; bes && i < bes->n && !chosen; i++) {
        const jval *name = jget(&bes->items[i], "backend", J_STR);
        if (name && (!backend || strcmp(name->str, backend) == 0))
            chosen = &bes->items[i];
    }
    if (!chosen) {
        rc = kv_error_set(err, KV_EINPUT, "%s: backends: no entry for backend '%s' (is this a kvsim bench kernels "
                          "--json file?)", path, backend ? backend : "(any)");
        jfree(&root);
        return rc;
    }
    kv_kernel_calib *c = kv_calloc(1, sizeof *c);
    const jval *bw = jget(chosen, "bandwidth_gbps", J_NUM);
    c->bandwidth_gbps = bw ? bw->num : 0;
    const jval *ks = jget(chosen, "kernels", J_ARR);
    for (size_t i = 0; ks && i < ks->n; i++) {
        /* the on-CPU ratio, where measured, is the one free of other processes' load */
        const jval *cls = jget(&ks->items[i], "calib", J_STR), *ctx = jget(&ks->items[i], "context", J_NUM),
                   *ratio = jget(&ks->items[i], "ratio_oncpu", J_NUM);
        if (!ratio || !(ratio->num > 0))
            ratio = jget(&ks->items[i], "ratio", J_NUM);
        if (!cls || !ratio || !(ratio->num > 0))
            continue;
        double context = ctx ? ctx->num : 0;
        calib_entry *e = NULL;
        for (size_t k = 0; k < c->n; k++)
            if (strcmp(c->e[k].kernel_class, cls->str) == 0)
                e = &c->e[k];
        if (!e) {
            kv_grow((void **)&c->e, sizeof *c->e, &c->cap, c->n + 1);
            e = &c->e[c->n++];
            memset(e, 0, sizeof *e);
            snprintf(e->kernel_class, sizeof e->kernel_class, "%s", cls->str);
            e->context = -1;
        }
        if (context > e->context) {
            e->context = context;
            e->sum = 0;
            e->count = 0;
        }
        if (context == e->context) {
            e->sum += ratio->num;
            e->count++;
        }
    }
    jfree(&root);
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
