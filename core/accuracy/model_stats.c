/* model_stats.c — reads, checks and writes the model statistics file (docs/stats-format.md, model_stats.h). */
#include "core/accuracy/model_stats.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/json.h"
#include "core/base/jsonread.h"

/* ---- Encoding text ---------------------------------------------------------------------------- */

static int tensor_text(const kv_tensor_enc *t, char *buf, size_t len)
{
    if (t->kind == KV_TENSOR_BF16)
        return snprintf(buf, len, "bf16");
    char a[16] = "";
    if (t->anchor_bits > 0)
        snprintf(a, sizeof a, "a%d", t->anchor_bits);
    return snprintf(buf, len, "int%d%sg%d%s", t->bits, a, t->group_size, t->per_channel ? "c" : "");
}

int kv_encoding_text(const kv_encoding *e, char *buf, size_t len)
{
    char k[48], v[48], win[32] = "", dk[256] = "";
    tensor_text(&e->key, k, sizeof k);
    tensor_text(&e->value, v, sizeof v);
    if (e->full_precision_window > 0)
        snprintf(win, sizeof win, ",window=%d", e->full_precision_window);
    if (e->diffkv) {
        char kl[48], vl[48];
        tensor_text(&e->key_low, kl, sizeof kl);
        tensor_text(&e->value_low, vl, sizeof vl);
        snprintf(dk, sizeof dk, ",low=%s/%s,alpha=%.17g/%.17g,recent=%d", kl, vl, e->alpha_high, e->alpha_low,
                 e->window);
    }
    int n = snprintf(buf, len, "k=%s,v=%s%s%s", k, v, win, dk);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* A decimal integer in [lo, hi] at *p (advanced past it). */
static bool parse_uint(const char **p, int lo, int hi, int *out)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return false;
    long v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s - '0');
        if (v > hi)
            return false;
        s++;
    }
    if (v < lo)
        return false;
    *out = (int)v;
    *p = s;
    return true;
}

static bool parse_tensor(const char **p, kv_tensor_enc *t)
{
    memset(t, 0, sizeof *t);
    if (strncmp(*p, "bf16", 4) == 0) {
        t->kind = KV_TENSOR_BF16;
        t->bits = 16;
        *p += 4;
        return true;
    }
    if (strncmp(*p, "int", 3) != 0)
        return false;
    const char *s = *p + 3;
    t->kind = KV_TENSOR_INT;
    if (!parse_uint(&s, 1, 16, &t->bits))
        return false;
    if (*s == 'a') {
        s++;
        if (t->bits < 2 || !parse_uint(&s, 1, t->bits - 1, &t->anchor_bits))
            return false;
    }
    if (*s++ != 'g' || !parse_uint(&s, 1, 1 << 20, &t->group_size))
        return false;
    if (*s == 'c') {
        t->per_channel = 1;
        s++;
    }
    *p = s;
    return true;
}

/* A number up to the next '/' or ',' or the end (strtod's syntax, finite, >= 0). */
static bool parse_alpha(const char **p, double *out)
{
    const char *s = *p;
    if (!(isdigit((unsigned char)*s) || *s == '.'))
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v) || v < 0)
        return false;
    *out = v;
    *p = end;
    return true;
}

static bool lit(const char **p, const char *word)
{
    size_t n = strlen(word);
    if (strncmp(*p, word, n) != 0)
        return false;
    *p += n;
    return true;
}

int kv_encoding_parse(const char *text, kv_encoding *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    const char *p = text;
    const char *what = "expected k=TENSOR,v=TENSOR[,window=R][,low=K/V,alpha=H/L,recent=W]";
    if (!lit(&p, "k=") || !parse_tensor(&p, &out->key) || !lit(&p, ",v=") || !parse_tensor(&p, &out->value))
        goto bad;
    if (lit(&p, ",window=") && !parse_uint(&p, 1, 1 << 30, &out->full_precision_window))
        goto bad;
    if (lit(&p, ",low=")) {
        out->diffkv = true;
        if (!parse_tensor(&p, &out->key_low) || !lit(&p, "/") || !parse_tensor(&p, &out->value_low) ||
            !lit(&p, ",alpha=") || !parse_alpha(&p, &out->alpha_high) || !lit(&p, "/") ||
            !parse_alpha(&p, &out->alpha_low) || !lit(&p, ",recent=") || !parse_uint(&p, 0, 1 << 30, &out->window))
            goto bad;
        if (out->alpha_low > out->alpha_high) {
            what = "alpha H/L needs L <= H";
            goto bad;
        }
    }
    if (*p)
        goto bad;
    return KV_OK;
bad:
    memset(out, 0, sizeof *out);
    return kv_error_set(err, KV_EINPUT, "encoding \"%s\": %s (at \"%s\"; docs/stats-format.md)", text, what, p);
}

/* ---- Comparing encodings as parsed -------------------------------------------------------------- */

static bool same_tensor(const kv_tensor_enc *a, const kv_tensor_enc *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == KV_TENSOR_BF16)
        return true;
    return a->bits == b->bits && a->anchor_bits == b->anchor_bits && a->group_size == b->group_size &&
           (a->per_channel != 0) == (b->per_channel != 0);
}

static bool same_encoding(const kv_encoding *a, const kv_encoding *b)
{
    if (!same_tensor(&a->key, &b->key) || !same_tensor(&a->value, &b->value) ||
        a->full_precision_window != b->full_precision_window || a->diffkv != b->diffkv)
        return false;
    if (!a->diffkv)
        return true;
    return same_tensor(&a->key_low, &b->key_low) && same_tensor(&a->value_low, &b->value_low) &&
           a->alpha_high == b->alpha_high && a->alpha_low == b->alpha_low && a->window == b->window;
}

/* enc[0..n) against a set: equal head by head, a set of one standing for every head. */
static bool same_set(const kv_stats_encodings *set, const kv_encoding *enc, int n)
{
    if (n < 1 || !enc || (set->n != n && set->n != 1 && n != 1))
        return false;
    int m = set->n > n ? set->n : n;
    for (int i = 0; i < m; i++)
        if (!same_encoding(&set->enc[set->n == 1 ? 0 : i], &enc[n == 1 ? 0 : i]))
            return false;
    return true;
}

const kv_stats_lynx *kv_model_stats_find_lynx(const kv_model_stats *s, const kv_encoding *enc, int n)
{
    for (size_t i = 0; s && i < s->n_lynx; i++)
        if (same_set(&s->lynx[i].encodings, enc, n))
            return &s->lynx[i];
    return NULL;
}

const kv_stats_diffkv *kv_model_stats_find_diffkv(const kv_model_stats *s, int window)
{
    for (size_t i = 0; s && i < s->n_diffkv; i++)
        if (s->diffkv[i].curve.window == window)
            return &s->diffkv[i];
    return NULL;
}

const kv_stats_accuracy *kv_model_stats_find_accuracy(const kv_model_stats *s, const kv_encoding *enc, int n)
{
    for (size_t i = 0; s && i < s->n_accuracy; i++)
        if (same_set(&s->accuracy[i].encodings, enc, n))
            return &s->accuracy[i];
    return NULL;
}

void kv_model_stats_free(kv_model_stats *s)
{
    if (!s)
        return;
    kv_free(s->texts);
    for (size_t i = 0; i < s->n_lynx; i++)
        kv_free(s->lynx[i].encodings.enc);
    kv_free(s->lynx);
    for (size_t i = 0; i < s->n_diffkv; i++)
        kv_free(s->diffkv[i].z);
    kv_free(s->diffkv);
    for (size_t i = 0; i < s->n_accuracy; i++) {
        kv_free(s->accuracy[i].encodings.enc);
        kv_free(s->accuracy[i].attention_error);
    }
    kv_free(s->accuracy);
    memset(s, 0, sizeof *s);
}

/* ---- Reading ------------------------------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    kv_error *err;
} reader;

/* "path:line: member what" */
static int bad(const reader *r, const kv_jvalue *v, const char *member, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(const reader *r, const kv_jvalue *v, const char *member, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kv_error_set(r->err, KV_EINPUT, "%s:%d: %s %s", r->path, v ? v->line : 1, member, what);
}

static const char *kind_name(kv_jkind k)
{
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[k];
}

/* obj must be an object whose members are all among names[] (NULL-terminated) and whose
   required ones (names[0..n_required)) are present. */
static int check_object(const reader *r, const kv_jvalue *obj, const char *member, const char *const *names,
                        int n_required)
{
    if (!obj || obj->kind != KV_JOBJECT)
        return bad(r, obj, member, "is %s; expected an object", obj ? kind_name(obj->kind) : "missing");
    for (size_t i = 0; i < obj->count; i++) {
        int k = 0;
        while (names[k] && strcmp(names[k], obj->keys[i]) != 0)
            k++;
        if (!names[k])
            return bad(r, obj->items[i], member, "has an unknown member \"%s\" (docs/stats-format.md)",
                       obj->keys[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(obj->keys[j], obj->keys[i]) == 0)
                return bad(r, obj->items[i], member, "has \"%s\" twice", obj->keys[i]);
    }
    for (int k = 0; k < n_required; k++)
        if (!kv_jvalue_get(obj, names[k]))
            return bad(r, obj, member, "has no \"%s\"", names[k]);
    return KV_OK;
}

static void join(char *buf, size_t len, const char *member, const char *key)
{
    snprintf(buf, len, "%s%s%s", member, member[0] ? "." : "", key);
}

static int get_string(const reader *r, const kv_jvalue *obj, const char *member, const char *key, char *buf,
                      size_t len)
{
    char m[256];
    join(m, sizeof m, member, key);
    const kv_jvalue *v = kv_jvalue_get(obj, key);
    if (!v || v->kind != KV_JSTRING)
        return bad(r, v ? v : obj, m, "is %s; expected a string", v ? kind_name(v->kind) : "missing");
    if (v->length >= len || strlen(v->text) != v->length)
        return bad(r, v, m, "is longer than %zu bytes or holds a NUL", len - 1);
    memcpy(buf, v->text, v->length + 1);
    return KV_OK;
}

static int get_sha(const reader *r, const kv_jvalue *obj, const char *member, const char *key, char *buf)
{
    if (get_string(r, obj, member, key, buf, 65))
        return r->err->code;
    size_t n = strlen(buf);
    bool hex = n == 64;
    for (size_t i = 0; hex && i < n; i++)
        hex = isdigit((unsigned char)buf[i]) || (buf[i] >= 'a' && buf[i] <= 'f');
    if (n != 0 && !hex) {
        char m[256];
        join(m, sizeof m, member, key);
        return bad(r, kv_jvalue_get(obj, key), m, "is \"%s\"; expected 64 lowercase hex digits or \"\"", buf);
    }
    return KV_OK;
}

static int as_long(const reader *r, const kv_jvalue *v, const char *m, long lo, long hi, long *out)
{
    if (!v || v->kind != KV_JNUMBER)
        return bad(r, v, m, "is %s; expected an integer", v ? kind_name(v->kind) : "missing");
    double x = v->number;
    if (!(x == floor(x)) || x < (double)lo || x > (double)hi)
        return bad(r, v, m, "is %s; expected an integer in [%ld, %ld]", v->text, lo, hi);
    *out = (long)x;
    return KV_OK;
}

static int get_int(const reader *r, const kv_jvalue *obj, const char *member, const char *key, int lo, int hi,
                   int *out)
{
    char m[256];
    join(m, sizeof m, member, key);
    const kv_jvalue *v = kv_jvalue_get(obj, key);
    long x = 0;
    if (!v)
        return bad(r, obj, m, "is missing");
    if (as_long(r, v, m, lo, hi, &x))
        return r->err->code;
    *out = (int)x;
    return KV_OK;
}

static int as_number(const reader *r, const kv_jvalue *v, const char *m, double lo, double hi, double *out)
{
    if (!v || v->kind != KV_JNUMBER)
        return bad(r, v, m, "is %s; expected a number", v ? kind_name(v->kind) : "missing");
    if (!isfinite(v->number) || v->number < lo || v->number > hi)
        return bad(r, v, m, "is %s; expected a number in [%.17g, %.17g]", v->text, lo, hi);
    *out = v->number;
    return KV_OK;
}

/* An array of exactly n elements (n < 0: any count >= 1, at most -n). */
static int as_array(const reader *r, const kv_jvalue *v, const char *m, long n, const char *count_is)
{
    if (!v || v->kind != KV_JARRAY)
        return bad(r, v, m, "is %s; expected an array", v ? kind_name(v->kind) : "missing");
    if (n >= 0 && v->count != (size_t)n)
        return bad(r, v, m, "has %zu %s, %s", v->count, v->count == 1 ? "element" : "elements", count_is);
    if (n < 0 && (v->count < 1 || v->count > (size_t)-n))
        return bad(r, v, m, "has %zu elements; expected 1 to %ld", v->count, -n);
    return KV_OK;
}

/* lengths: 1..KV_CURVE_MAX_LENGTHS positive integers, strictly increasing. */
static int read_lengths(const reader *r, const kv_jvalue *obj, const char *member, int *n_out, int *lengths)
{
    char m[256], mi[300];
    join(m, sizeof m, member, "lengths");
    const kv_jvalue *v = kv_jvalue_get(obj, "lengths");
    if (as_array(r, v, m, -KV_CURVE_MAX_LENGTHS, ""))
        return r->err->code;
    for (size_t i = 0; i < v->count; i++) {
        long x;
        snprintf(mi, sizeof mi, "%s[%zu]", m, i);
        if (as_long(r, v->items[i], mi, 1, INT_MAX, &x))
            return r->err->code;
        lengths[i] = (int)x;
        if (i > 0 && lengths[i] <= lengths[i - 1])
            return bad(r, v->items[i], mi, "is %d, not above %s[%zu] = %d: lengths must increase strictly",
                       lengths[i], m, i - 1, lengths[i - 1]);
    }
    *n_out = (int)v->count;
    return KV_OK;
}

static int read_encodings(const reader *r, const kv_model_stats *s, const kv_jvalue *obj, const char *member,
                          kv_stats_encodings *out)
{
    char m[256], mi[300];
    join(m, sizeof m, member, "encodings");
    const kv_jvalue *v = kv_jvalue_get(obj, "encodings");
    int heads = s->model.layers * s->model.kv_heads;
    const kv_jvalue *one = v;
    size_t n = 1;
    if (v && v->kind == KV_JARRAY) {
        n = v->count;
        if (n != 1 && n != (size_t)heads)
            return bad(r, v, m, "has %zu texts; expected 1 or layers x kv_heads = %d x %d = %d", n,
                       s->model.layers, s->model.kv_heads, heads);
        one = NULL;
    } else if (!v || v->kind != KV_JSTRING) {
        return bad(r, v ? v : obj, m, "is %s; expected an encoding text or an array of them",
                   v ? kind_name(v->kind) : "missing");
    }
    out->n = (int)n;
    out->enc = kv_calloc(n, sizeof *out->enc);
    for (size_t i = 0; i < n; i++) {
        const kv_jvalue *t = one ? one : v->items[i];
        if (one)
            snprintf(mi, sizeof mi, "%s", m);
        else
            snprintf(mi, sizeof mi, "%s[%zu]", m, i);
        if (t->kind != KV_JSTRING || strlen(t->text) != t->length)
            return bad(r, t, mi, "is %s; expected an encoding text", kind_name(t->kind));
        kv_error e;
        if (kv_encoding_parse(t->text, &out->enc[i], &e))
            return bad(r, t, mi, "%s", e.msg);
    }
    return KV_OK;
}

static int read_model(const reader *r, const kv_jvalue *root, kv_stats_model *m)
{
    static const char *const names[] = {"name", "file", "sha256", "layers", "heads", "kv_heads", "head_dim",
                                        "context", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "model");
    if (check_object(r, v, "model", names, 8) || get_string(r, v, "model", "name", m->name, sizeof m->name) ||
        get_string(r, v, "model", "file", m->file, sizeof m->file) || get_sha(r, v, "model", "sha256", m->sha256) ||
        get_int(r, v, "model", "layers", 1, 4096, &m->layers) || get_int(r, v, "model", "heads", 1, 4096, &m->heads) ||
        get_int(r, v, "model", "kv_heads", 1, 4096, &m->kv_heads) ||
        get_int(r, v, "model", "head_dim", 1, 65536, &m->head_dim) ||
        get_int(r, v, "model", "context", 1, INT_MAX, &m->context))
        return r->err->code;
    if (m->heads % m->kv_heads != 0)
        return bad(r, kv_jvalue_get(v, "kv_heads"), "model.kv_heads", "is %d, which does not divide heads = %d",
                   m->kv_heads, m->heads);
    return KV_OK;
}

static int read_producer(const reader *r, const kv_jvalue *root, kv_model_stats *s)
{
    static const char *const names[] = {"tool", "command", "measurement", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "producer");
    if (check_object(r, v, "producer", names, 3) || get_string(r, v, "producer", "tool", s->tool, sizeof s->tool) ||
        get_string(r, v, "producer", "command", s->command, sizeof s->command) ||
        get_int(r, v, "producer", "measurement", 0, INT_MAX, &s->measurement))
        return r->err->code;
    return KV_OK;
}

static int read_texts(const reader *r, const kv_jvalue *root, kv_model_stats *s)
{
    static const char *const names[] = {"name", "sha256", "tokens", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "texts");
    if (as_array(r, v, "texts", (long)(v && v->kind == KV_JARRAY ? v->count : 0), ""))
        return r->err->code;
    s->texts = kv_calloc(v->count ? v->count : 1, sizeof *s->texts);
    s->n_texts = v->count;
    for (size_t i = 0; i < v->count; i++) {
        char m[64];
        snprintf(m, sizeof m, "texts[%zu]", i);
        const kv_jvalue *t = v->items[i];
        int tokens = 0;
        if (check_object(r, t, m, names, 3) || get_string(r, t, m, "name", s->texts[i].name, sizeof s->texts[i].name) ||
            get_sha(r, t, m, "sha256", s->texts[i].sha256) || get_int(r, t, m, "tokens", 1, INT_MAX, &tokens))
            return r->err->code;
        s->texts[i].tokens = tokens;
    }
    return KV_OK;
}

static int read_lynx(const reader *r, const kv_jvalue *root, kv_model_stats *s)
{
    static const char *const names[] = {"encodings", "positions", "lengths", "accept", "samples", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "lynx");
    if (as_array(r, v, "lynx", (long)(v && v->kind == KV_JARRAY ? v->count : 0), ""))
        return r->err->code;
    s->lynx = kv_calloc(v->count ? v->count : 1, sizeof *s->lynx);
    for (size_t i = 0; i < v->count; i++) {
        char m[64], mm[128], mij[160];
        snprintf(m, sizeof m, "lynx[%zu]", i);
        const kv_jvalue *e = v->items[i];
        kv_stats_lynx *x = &s->lynx[i];
        s->n_lynx = i + 1;
        kv_accept_curve *c = &x->curve;
        if (check_object(r, e, m, names, 5) || read_encodings(r, s, e, m, &x->encodings) ||
            get_int(r, e, m, "positions", 1, KV_CURVE_MAX_POSITIONS, &c->positions) ||
            read_lengths(r, e, m, &c->n_lengths, c->lengths))
            return r->err->code;
        for (size_t j = 0; j < i; j++)
            if (same_set(&s->lynx[j].encodings, x->encodings.enc, x->encodings.n))
                return bad(r, e, m, "has the encodings of lynx[%zu]", j);
        char count[64];
        snprintf(count, sizeof count, "lengths has %d", c->n_lengths);
        snprintf(mm, sizeof mm, "%s.accept", m);
        const kv_jvalue *a = kv_jvalue_get(e, "accept");
        if (as_array(r, a, mm, c->n_lengths, count))
            return r->err->code;
        snprintf(count, sizeof count, "positions is %d", c->positions);
        for (int li = 0; li < c->n_lengths; li++) {
            snprintf(mij, sizeof mij, "%s[%d]", mm, li);
            const kv_jvalue *row = a->items[li];
            if (row && row->kind == KV_JARRAY && row->count != (size_t)c->positions)
                return bad(r, row, mij, "has %zu numbers, %s", row->count, count);
            if (as_array(r, row, mij, c->positions, count))
                return r->err->code;
            for (int p = 0; p < c->positions; p++) {
                char mp[200];
                snprintf(mp, sizeof mp, "%s[%d]", mij, p);
                if (as_number(r, row->items[p], mp, 0.0, 1.0, &c->accept[li][p]))
                    return r->err->code;
            }
        }
        snprintf(mm, sizeof mm, "%s.samples", m);
        snprintf(count, sizeof count, "lengths has %d", c->n_lengths);
        const kv_jvalue *sm = kv_jvalue_get(e, "samples");
        if (as_array(r, sm, mm, c->n_lengths, count))
            return r->err->code;
        for (int li = 0; li < c->n_lengths; li++) {
            snprintf(mij, sizeof mij, "%s[%d]", mm, li);
            if (as_long(r, sm->items[li], mij, 0, LONG_MAX / 2, &c->samples[li]))
                return r->err->code;
        }
    }
    return KV_OK;
}

/* One of prefill / exit: [n_lengths][layers][kv_heads][points], each head's quantiles >= 0, non-decreasing. */
static int read_quantiles(const reader *r, const kv_model_stats *s, const kv_jvalue *e, const char *m,
                          const char *key, int which, kv_stats_diffkv *x)
{
    const kv_diffkv_curve *c = &x->curve;
    int L = s->model.layers, H = s->model.kv_heads, P = x->points;
    char mk[128], ml[160], mh[200], mp[240], count[80];
    snprintf(mk, sizeof mk, "%s.%s", m, key);
    const kv_jvalue *a = kv_jvalue_get(e, key);
    snprintf(count, sizeof count, "lengths has %d", c->n_lengths);
    if (as_array(r, a, mk, c->n_lengths, count))
        return r->err->code;
    for (int i = 0; i < c->n_lengths; i++) {
        snprintf(ml, sizeof ml, "%s[%d]", mk, i);
        snprintf(count, sizeof count, "model.layers is %d", L);
        if (as_array(r, a->items[i], ml, L, count))
            return r->err->code;
        for (int l = 0; l < L; l++) {
            const kv_jvalue *lv = a->items[i]->items[l];
            snprintf(mh, sizeof mh, "%s[%d]", ml, l);
            snprintf(count, sizeof count, "model.kv_heads is %d", H);
            if (as_array(r, lv, mh, H, count))
                return r->err->code;
            for (int h = 0; h < H; h++) {
                const kv_jvalue *q = lv->items[h];
                snprintf(mp, sizeof mp, "%s[%d]", mh, h);
                if (q && q->kind == KV_JARRAY && q->count != (size_t)P)
                    return bad(r, q, mp, "has %zu numbers, points is %d", q->count, P);
                snprintf(count, sizeof count, "points is %d", P);
                if (as_array(r, q, mp, P, count))
                    return r->err->code;
                double *z = x->z + (((size_t)i * 2 + (size_t)which) * (size_t)(L * H) + (size_t)(l * H + h)) *
                                       (size_t)P;
                for (int u = 0; u < P; u++) {
                    char mu[280];
                    snprintf(mu, sizeof mu, "%s[%d]", mp, u);
                    if (as_number(r, q->items[u], mu, 0.0, 1e300, &z[u]))
                        return r->err->code;
                    if (u > 0 && z[u] < z[u - 1])
                        return bad(r, q->items[u], mu, "is %s, below the quantile before it (%s): quantiles must not "
                               "decrease", q->items[u]->text, q->items[u - 1]->text);
                }
            }
        }
    }
    return KV_OK;
}

static int read_diffkv(const reader *r, const kv_jvalue *root, kv_model_stats *s)
{
    static const char *const names[] = {"window", "points", "lengths", "prefill", "exit", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "diffkv");
    if (as_array(r, v, "diffkv", (long)(v && v->kind == KV_JARRAY ? v->count : 0), ""))
        return r->err->code;
    s->diffkv = kv_calloc(v->count ? v->count : 1, sizeof *s->diffkv);
    for (size_t i = 0; i < v->count; i++) {
        char m[64];
        snprintf(m, sizeof m, "diffkv[%zu]", i);
        const kv_jvalue *e = v->items[i];
        kv_stats_diffkv *x = &s->diffkv[i];
        s->n_diffkv = i + 1;
        kv_diffkv_curve *c = &x->curve;
        if (check_object(r, e, m, names, 5) || get_int(r, e, m, "window", 0, 1 << 30, &c->window) ||
            get_int(r, e, m, "points", 2, 1 << 16, &x->points) || read_lengths(r, e, m, &c->n_lengths, c->lengths))
            return r->err->code;
        for (size_t j = 0; j < i; j++)
            if (s->diffkv[j].curve.window == c->window)
                return bad(r, e, m, "has the window of diffkv[%zu] (%d)", j, c->window);
        int heads = s->model.layers * s->model.kv_heads;
        x->z = kv_calloc((size_t)c->n_lengths * 2 * (size_t)heads * (size_t)x->points, sizeof *x->z);
        if (read_quantiles(r, s, e, m, "prefill", 0, x) || read_quantiles(r, s, e, m, "exit", 1, x))
            return r->err->code;
        for (int li = 0; li < c->n_lengths; li++) {
            c->table[li].layers = s->model.layers;
            c->table[li].kv_heads = s->model.kv_heads;
            c->table[li].z_prefill = x->z + ((size_t)li * 2) * (size_t)heads * (size_t)x->points;
            c->table[li].z_exit = x->z + ((size_t)li * 2 + 1) * (size_t)heads * (size_t)x->points;
        }
    }
    return KV_OK;
}

/* An optional figure and its optional _ci95 (NaN when absent). */
static int read_figure(const reader *r, const kv_jvalue *e, const char *m, const char *key, bool required,
                       double lo, double hi, double *out, double *ci)
{
    char mk[128], mc[160], key_ci[64];
    snprintf(mk, sizeof mk, "%s.%s", m, key);
    snprintf(key_ci, sizeof key_ci, "%s_ci95", key);
    snprintf(mc, sizeof mc, "%s.%s", m, key_ci);
    const kv_jvalue *v = kv_jvalue_get(e, key), *c = kv_jvalue_get(e, key_ci);
    *out = ci[0] = ci[1] = NAN;
    if (!v) {
        if (required)
            return bad(r, e, mk, "is missing");
        if (c)
            return bad(r, c, mc, "is given without %s", key);
        return KV_OK;
    }
    if (as_number(r, v, mk, lo, hi, out))
        return r->err->code;
    if (!c)
        return KV_OK;
    if (as_array(r, c, mc, 2, "expected [low, high]"))
        return r->err->code;
    char m0[200], m1[200];
    snprintf(m0, sizeof m0, "%s[0]", mc);
    snprintf(m1, sizeof m1, "%s[1]", mc);
    if (as_number(r, c->items[0], m0, lo, hi, &ci[0]) || as_number(r, c->items[1], m1, lo, hi, &ci[1]))
        return r->err->code;
    if (ci[0] > ci[1])
        return bad(r, c, mc, "is [%s, %s]: low above high", c->items[0]->text, c->items[1]->text);
    return KV_OK;
}

static int read_accuracy(const reader *r, const kv_jvalue *root, kv_model_stats *s)
{
    static const char *const names[] = {"encodings",     "context_tokens",  "scored_tokens",  "delta_ppl",
                                        "top1_agree",    "delta_ppl_ci95",  "top1_agree_ci95", "needle_recall",
                                        "needle_recall_ci95", "accepted_share", "accepted_share_ci95",
                                        "attention_error", NULL};
    const kv_jvalue *v = kv_jvalue_get(root, "accuracy");
    if (!v)
        return KV_OK;
    if (as_array(r, v, "accuracy", (long)(v->kind == KV_JARRAY ? v->count : 0), ""))
        return r->err->code;
    s->accuracy = kv_calloc(v->count ? v->count : 1, sizeof *s->accuracy);
    for (size_t i = 0; i < v->count; i++) {
        char m[64], ma[128];
        snprintf(m, sizeof m, "accuracy[%zu]", i);
        const kv_jvalue *e = v->items[i];
        kv_stats_accuracy *x = &s->accuracy[i];
        s->n_accuracy = i + 1;
        int scored = 0;
        if (check_object(r, e, m, names, 5) || read_encodings(r, s, e, m, &x->encodings) ||
            get_int(r, e, m, "context_tokens", 1, INT_MAX, &x->context_tokens) ||
            get_int(r, e, m, "scored_tokens", 1, INT_MAX, &scored) ||
            read_figure(r, e, m, "delta_ppl", true, -1e300, 1e300, &x->delta_ppl, x->delta_ppl_ci95) ||
            read_figure(r, e, m, "top1_agree", true, 0, 1, &x->top1_agree, x->top1_agree_ci95) ||
            read_figure(r, e, m, "needle_recall", false, 0, 1, &x->needle_recall, x->needle_recall_ci95) ||
            read_figure(r, e, m, "accepted_share", false, 0, 1, &x->accepted_share, x->accepted_share_ci95))
            return r->err->code;
        x->scored_tokens = scored;
        for (size_t j = 0; j < i; j++)
            if (same_set(&s->accuracy[j].encodings, x->encodings.enc, x->encodings.n))
                return bad(r, e, m, "has the encodings of accuracy[%zu]", j);
        const kv_jvalue *ae = kv_jvalue_get(e, "attention_error");
        if (!ae)
            continue;
        snprintf(ma, sizeof ma, "%s.attention_error", m);
        char count[64];
        snprintf(count, sizeof count, "model.layers is %d", s->model.layers);
        if (as_array(r, ae, ma, s->model.layers, count))
            return r->err->code;
        x->n_layers = s->model.layers;
        x->attention_error = kv_calloc((size_t)x->n_layers, sizeof *x->attention_error);
        for (int l = 0; l < x->n_layers; l++) {
            char ml[160];
            snprintf(ml, sizeof ml, "%s[%d]", ma, l);
            if (as_number(r, ae->items[l], ml, 0, 1e300, &x->attention_error[l]))
                return r->err->code;
        }
    }
    return KV_OK;
}

int kv_model_stats_read(const char *path, kv_model_stats *out, kv_error *err)
{
    static const char *const names[] = {"format", "version", "model", "producer", "texts", "lynx", "diffkv",
                                        "accuracy", NULL};
    memset(out, 0, sizeof *out);
    kv_jvalue *root = NULL;
    if (kv_jread_file(path, &root, err))
        return kv_error_prefix(err, "model statistics file: ");
    reader r = {path, err};
    /* format and version first: another kind of file, or a later version, is said as such */
    static const char *const any[] = {NULL};
    int rc = root->kind == KV_JOBJECT ? KV_OK : check_object(&r, root, "the file", any, 0);
    const kv_jvalue *f = kv_jvalue_get(root, "format"), *ver = kv_jvalue_get(root, "version");
    if (!rc && !f)
        rc = bad(&r, root, "the file", "has no \"format\" (not a kvsim model statistics file)");
    if (!rc) {
        if (f->kind != KV_JSTRING || strcmp(f->text, KV_MODEL_STATS_FORMAT) != 0)
            rc = bad(&r, f, "format", "is %s%s%s; expected \"%s\" (not a kvsim model statistics file)",
                     f->kind == KV_JSTRING ? "\"" : kind_name(f->kind), f->kind == KV_JSTRING ? f->text : "",
                     f->kind == KV_JSTRING ? "\"" : "", KV_MODEL_STATS_FORMAT);
    }
    if (!rc && !ver)
        rc = bad(&r, root, "the file", "has no \"version\"");
    if (!rc) {
        if (ver->kind != KV_JNUMBER || ver->number != KV_MODEL_STATS_VERSION)
            rc = bad(&r, ver, "version", "is %s; this kvsim reads version %d only", ver->text ? ver->text : "not a number",
                     KV_MODEL_STATS_VERSION);
    }
    if (!rc)
        rc = check_object(&r, root, "the file", names, 7);
    if (!rc)
        rc = read_model(&r, root, &out->model);
    if (!rc)
        rc = read_producer(&r, root, out);
    if (!rc)
        rc = read_texts(&r, root, out);
    if (!rc)
        rc = read_lynx(&r, root, out);
    if (!rc)
        rc = read_diffkv(&r, root, out);
    if (!rc)
        rc = read_accuracy(&r, root, out);
    kv_jvalue_free(root);
    if (rc)
        kv_model_stats_free(out);
    return rc;
}

/* ---- Writing -------------------------------------------------------------------------------------- */

static void put_number(FILE *f, double x)
{
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", x);
    fputs(buf, f);
}

static void put_numbers(FILE *f, const double *x, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        put_number(f, x[i]);
    }
    fputc(']', f);
}

static void put_ints(FILE *f, const int *x, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : "", x[i]);
    fputc(']', f);
}

static int put_encodings(FILE *f, const kv_stats_encodings *e, kv_error *err)
{
    fputs("\"encodings\": [", f);
    for (int i = 0; i < e->n; i++) {
        char text[512];
        if (kv_encoding_text(&e->enc[i], text, sizeof text))
            return kv_error_set(err, KV_EFAIL, "an encoding's text is longer than %zu bytes", sizeof text);
        if (i)
            fputs(", ", f);
        kv_json_string(f, text);
    }
    fputc(']', f);
    return KV_OK;
}

static bool all_finite(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

static void put_figure(FILE *f, const char *key, double v, const double *ci)
{
    if (!isfinite(v))
        return;
    fprintf(f, ",\n      \"%s\": ", key);
    put_number(f, v);
    if (isfinite(ci[0]) && isfinite(ci[1])) {
        fprintf(f, ", \"%s_ci95\": ", key);
        put_numbers(f, ci, 2);
    }
}

static int write_body(FILE *f, const kv_model_stats *s, kv_error *err)
{
    const kv_stats_model *m = &s->model;
    int heads = m->layers * m->kv_heads;
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"model\": {\n    \"name\": ", KV_MODEL_STATS_FORMAT,
            KV_MODEL_STATS_VERSION);
    kv_json_string(f, m->name);
    fputs(", \"file\": ", f);
    kv_json_string(f, m->file);
    fputs(", \"sha256\": ", f);
    kv_json_string(f, m->sha256);
    fprintf(f, ",\n    \"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"context\": %d\n  },\n",
            m->layers, m->heads, m->kv_heads, m->head_dim, m->context);
    fputs("  \"producer\": {\"tool\": ", f);
    kv_json_string(f, s->tool);
    fputs(", \"command\": ", f);
    kv_json_string(f, s->command);
    fprintf(f, ", \"measurement\": %d},\n  \"texts\": [", s->measurement);
    for (size_t i = 0; i < s->n_texts; i++) {
        fputs(i ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
        kv_json_string(f, s->texts[i].name);
        fputs(", \"sha256\": ", f);
        kv_json_string(f, s->texts[i].sha256);
        fprintf(f, ", \"tokens\": %ld}", s->texts[i].tokens);
    }
    fputs(s->n_texts ? "\n  ],\n  \"lynx\": [" : "],\n  \"lynx\": [", f);
    for (size_t i = 0; i < s->n_lynx; i++) {
        const kv_accept_curve *c = &s->lynx[i].curve;
        fputs(i ? ",\n    {\n      " : "\n    {\n      ", f);
        if (put_encodings(f, &s->lynx[i].encodings, err))
            return err->code;
        fprintf(f, ",\n      \"positions\": %d,\n      \"lengths\": ", c->positions);
        put_ints(f, c->lengths, c->n_lengths);
        fputs(",\n      \"accept\": [", f);
        for (int li = 0; li < c->n_lengths; li++) {
            if (!all_finite(c->accept[li], (size_t)c->positions))
                return kv_error_set(err, KV_EFAIL, "lynx[%zu] has a rate that is not a finite number", i);
            fputs(li ? ", " : "", f);
            put_numbers(f, c->accept[li], c->positions);
        }
        fputs("],\n      \"samples\": [", f);
        for (int li = 0; li < c->n_lengths; li++)
            fprintf(f, "%s%ld", li ? ", " : "", c->samples[li]);
        fputs("]\n    }", f);
    }
    fputs(s->n_lynx ? "\n  ],\n  \"diffkv\": [" : "],\n  \"diffkv\": [", f);
    for (size_t i = 0; i < s->n_diffkv; i++) {
        const kv_stats_diffkv *x = &s->diffkv[i];
        const kv_diffkv_curve *c = &x->curve;
        fprintf(f, "%s{\n      \"window\": %d,\n      \"points\": %d,\n      \"lengths\": ", i ? ",\n    " : "\n    ",
                c->window, x->points);
        put_ints(f, c->lengths, c->n_lengths);
        for (int which = 0; which < 2; which++) {
            fprintf(f, ",\n      \"%s\": [", which ? "exit" : "prefill");
            for (int li = 0; li < c->n_lengths; li++) {
                const double *z = which ? c->table[li].z_exit : c->table[li].z_prefill;
                if (!z || !all_finite(z, (size_t)heads * (size_t)x->points))
                    return kv_error_set(err, KV_EFAIL, "diffkv[%zu] has a quantile that is not a finite number", i);
                fputs(li ? ",\n        [" : "\n        [", f);
                for (int l = 0; l < m->layers; l++) {
                    fputs(l ? ",\n         [" : "[", f);
                    for (int h = 0; h < m->kv_heads; h++) {
                        fputs(h ? ",\n          " : "", f);
                        put_numbers(f, z + (size_t)(l * m->kv_heads + h) * (size_t)x->points, x->points);
                    }
                    fputc(']', f);
                }
                fputc(']', f);
            }
            fputs("\n      ]", f);
        }
        fputs("\n    }", f);
    }
    fputs(s->n_diffkv ? "\n  ]" : "]", f);
    if (s->n_accuracy) {
        fputs(",\n  \"accuracy\": [", f);
        for (size_t i = 0; i < s->n_accuracy; i++) {
            const kv_stats_accuracy *a = &s->accuracy[i];
            fputs(i ? ",\n    {\n      " : "\n    {\n      ", f);
            if (put_encodings(f, &a->encodings, err))
                return err->code;
            if (!isfinite(a->delta_ppl) || !isfinite(a->top1_agree))
                return kv_error_set(err, KV_EFAIL, "accuracy[%zu] has no delta_ppl or top1_agree", i);
            fprintf(f, ",\n      \"context_tokens\": %d,\n      \"scored_tokens\": %ld", a->context_tokens,
                    a->scored_tokens);
            put_figure(f, "delta_ppl", a->delta_ppl, a->delta_ppl_ci95);
            put_figure(f, "top1_agree", a->top1_agree, a->top1_agree_ci95);
            put_figure(f, "needle_recall", a->needle_recall, a->needle_recall_ci95);
            put_figure(f, "accepted_share", a->accepted_share, a->accepted_share_ci95);
            if (a->attention_error && a->n_layers > 0) {
                if (!all_finite(a->attention_error, (size_t)a->n_layers))
                    return kv_error_set(err, KV_EFAIL, "accuracy[%zu].attention_error is not finite", i);
                fputs(",\n      \"attention_error\": ", f);
                put_numbers(f, a->attention_error, a->n_layers);
            }
            fputs("\n    }", f);
        }
        fputs("\n  ]", f);
    }
    fputs("\n}\n", f);
    return KV_OK;
}

int kv_model_stats_write(const char *path, const kv_model_stats *s, kv_error *err)
{
    kv_afile a;
    if (kv_afile_open(&a, path, err))
        return err->code;
    if (write_body(a.f, s, err)) {
        kv_afile_abort(&a);
        return kv_error_prefix(err, "%s: ", path);
    }
    return kv_afile_commit(&a, err);
}

void kv_model_stats_add_command(kv_model_stats *s, const char *word, int argc, char **argv)
{
    size_t size = sizeof s->command, at = strlen(s->command);
    int n = snprintf(s->command + at, size - at, "%skvsim %s", at ? "; then " : "", word);
    at = n > 0 && at + (size_t)n < size ? at + (size_t)n : size - 1;
    for (int i = 1; i < argc && at < size - 1; i++) {
        n = snprintf(s->command + at, size - at, " %s", argv[i]);
        at = n > 0 && at + (size_t)n < size ? at + (size_t)n : size - 1;
    }
}
