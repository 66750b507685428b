/* profile.c — read a profiled performance table and interpolate prefill and decode step times. */
#include "core/timing/profile.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"

/* One measured point of a surface: the mean of its rows. */
typedef struct point {
    double batch; /* requests in the step */
    double x;     /* prompt tokens (prefill) or mean context tokens (decode) */
    double t_s;   /* seconds */
    int rows;     /* rows averaged into t_s */
} point;

/* A 1-D function: knots in increasing order and their values. */
typedef struct line {
    double *k, *v; /* [n] */
    size_t n;
} line;

/* Time over (batch, x), built from points (see profile.h). */
typedef struct surface {
    point *pts;          /* [n] kept points */
    size_t n, cap;
    bool grid;           /* every (batch, x) combination was measured */
    line *rows;          /* grid: [n_rows] one line over x per batch value */
    double *row_batch;   /* grid: [n_rows] their batch values, increasing */
    size_t n_rows;
    line arm_batch;      /* cross: time over batch at x_ref */
    line arm_x;          /* cross: time over x at batch_ref */
    double t_ref;        /* cross: time at (batch_ref, x_ref) */
    double batch_ref, x_ref; /* cross: the reference point */
    bool by_tokens;      /* cross, prefill: priced on total tokens (see profile.h) */
    line ratio;          /* by_tokens: over batch, the batch arm's time / the length arm's at the same tokens */
    char dropped[200];   /* points dropped as non-monotone, for the description */
} surface;

struct kv_profile {
    surface prefill;  /* x = prompt tokens */
    surface decode;   /* x = mean context tokens */
    char describe[768];
};

/* ---- Interpolation ---------------------------------------------------------------------------- */

/* Between knot i-1 and i of n (knots k increasing), the segment a query q falls in, or the end segment
   it extrapolates from: 1 <= i < n (n >= 2). */
static size_t segment(const double *k, size_t n, double q)
{
    size_t i = 1;
    while (i < n - 1 && q > k[i])
        i++;
    return i;
}

static double lerp(double k0, double k1, double v0, double v1, double q)
{
    double v = v0 + (v1 - v0) * (q - k0) / (k1 - k0);
    return v > 0 ? v : 0;
}

/* Piecewise linear through the knots, extrapolated from the end segments, never below zero. */
static double line_at(const line *l, double q)
{
    if (l->n == 1)
        return l->v[0];
    size_t i = segment(l->k, l->n, q);
    return lerp(l->k[i - 1], l->k[i], l->v[i - 1], l->v[i], q);
}

/* Piecewise linear through the knots, held at the end values outside them. */
static double clamped_at(const line *l, double q)
{
    if (q <= l->k[0])
        return l->v[0];
    if (q >= l->k[l->n - 1])
        return l->v[l->n - 1];
    return line_at(l, q);
}

static double surface_at(const surface *s, double batch, double x)
{
    if (s->grid) {
        /* Bilinear: along x within the two measured batch sizes around `batch`, then between them. */
        if (s->n_rows == 1)
            return line_at(&s->rows[0], x);
        size_t i = segment(s->row_batch, s->n_rows, batch);
        return lerp(s->row_batch[i - 1], s->row_batch[i], line_at(&s->rows[i - 1], x), line_at(&s->rows[i], x),
                    batch);
    }
    if (s->by_tokens)
        return line_at(&s->arm_x, batch * x / s->batch_ref) * clamped_at(&s->ratio, batch);
    return s->t_ref > 0 ? line_at(&s->arm_x, x) * line_at(&s->arm_batch, batch) / s->t_ref : 0;
}

/* Prefill on a cross (profile.h): the ratio of each batch-arm point to the length arm at its total tokens. */
static void build_ratio(surface *s)
{
    const line *b = &s->arm_batch;
    s->ratio.k = kv_calloc(b->n ? b->n : 1, sizeof(double));
    s->ratio.v = kv_calloc(b->n ? b->n : 1, sizeof(double));
    s->ratio.n = b->n;
    for (size_t i = 0; i < b->n; i++) {
        double len = line_at(&s->arm_x, b->k[i] * s->x_ref / s->batch_ref);
        s->ratio.k[i] = b->k[i];
        s->ratio.v[i] = len > 0 ? b->v[i] / len : 1;
    }
    s->by_tokens = b->n > 0;
}

/* ---- Building a surface ---------------------------------------------------------------------- */

static void surface_add(surface *s, double batch, double x, double t_s)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->pts[i].batch == batch && s->pts[i].x == x) {
            s->pts[i].t_s += t_s; /* a sum until surface_build divides */
            s->pts[i].rows++;
            return;
        }
    kv_grow((void **)&s->pts, sizeof *s->pts, &s->cap, s->n + 1);
    s->pts[s->n++] = (point){batch, x, t_s, 1};
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorted distinct values of one coordinate (0: batch, 1: x). */
static size_t distinct(const surface *s, int coord, double *out)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        out[n++] = coord ? s->pts[i].x : s->pts[i].batch;
    qsort(out, n, sizeof *out, cmp_double);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || out[i] != out[m - 1])
            out[m++] = out[i];
    return m;
}

static const point *find(const surface *s, double batch, double x)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->pts[i].batch == batch && s->pts[i].x == x)
            return &s->pts[i];
    return NULL;
}

/* The value of `coord` shared by the most points (ties: the smallest). */
static double most_common(const surface *s, int coord, const double *values, size_t n_values)
{
    double best = values[0];
    size_t best_count = 0;
    for (size_t v = 0; v < n_values; v++) {
        size_t count = 0;
        for (size_t i = 0; i < s->n; i++)
            count += (coord ? s->pts[i].x : s->pts[i].batch) == values[v];
        if (count > best_count) {
            best = values[v];
            best_count = count;
        }
    }
    return best;
}

/* A point more than 20% faster than a smaller batch or length on its arm is a measurement artefact. */
#define MONOTONE_TOLERANCE 0.8

/* One arm of a cross: points with `fixed_coord` equal to `fixed`, ordered by the other coordinate; a point
   below MONOTONE_TOLERANCE x the slowest earlier point is dropped, except the reference. Noise above that
   is kept: the line goes through it. */
static void build_arm(surface *s, const char *what, int fixed_coord, double fixed, double ref_key, const char *axis,
                      line *out)
{
    out->k = kv_calloc(s->n, sizeof(double));
    out->v = kv_calloc(s->n, sizeof(double));
    out->n = 0;
    double *keys = kv_calloc(s->n, sizeof(double));
    size_t n_keys = distinct(s, !fixed_coord, keys);
    double peak = 0;
    for (size_t i = 0; i < n_keys; i++) {
        const point *p = fixed_coord ? find(s, keys[i], fixed) : find(s, fixed, keys[i]);
        if (!p)
            continue;
        if (p->t_s < MONOTONE_TOLERANCE * peak && keys[i] != ref_key) {
            size_t used = strlen(s->dropped);
            snprintf(s->dropped + used, sizeof s->dropped - used, "%s%s %s %g: %.4g ms < %.4g ms at a smaller one",
                     used ? ", " : "", what, axis, keys[i], p->t_s * 1e3, peak * 1e3);
            continue;
        }
        if (p->t_s > peak)
            peak = p->t_s;
        out->k[out->n] = keys[i];
        out->v[out->n++] = p->t_s;
    }
    kv_free(keys);
}

/* Averages the rows and builds the grid or the cross. KV_EINPUT when the points are neither. */
static int surface_build(surface *s, const char *what, const char *path, kv_error *err)
{
    for (size_t i = 0; i < s->n; i++)
        s->pts[i].t_s /= s->pts[i].rows;
    double *bs = kv_calloc(s->n, sizeof(double)), *xs = kv_calloc(s->n, sizeof(double));
    size_t nb = distinct(s, 0, bs), nx = distinct(s, 1, xs);
    int rc = KV_OK;
    if (nb * nx == s->n) {
        s->grid = true;
        s->n_rows = nb;
        s->rows = kv_calloc(nb, sizeof *s->rows);
        s->row_batch = kv_calloc(nb, sizeof *s->row_batch);
        for (size_t r = 0; r < nb; r++) {
            s->row_batch[r] = bs[r];
            s->rows[r] = (line){kv_calloc(nx, sizeof(double)), kv_calloc(nx, sizeof(double)), nx};
            for (size_t c = 0; c < nx; c++) {
                s->rows[r].k[c] = xs[c];
                s->rows[r].v[c] = find(s, bs[r], xs[c])->t_s;
            }
        }
    } else {
        double b_ref = most_common(s, 0, bs, nb), x_ref = most_common(s, 1, xs, nx);
        const point *ref = find(s, b_ref, x_ref);
        for (size_t i = 0; ref && i < s->n; i++)
            if (s->pts[i].batch != b_ref && s->pts[i].x != x_ref)
                ref = NULL;
        if (!ref) {
            rc = kv_error_set(err, KV_EINPUT,
                              "%s: the %s points form neither a full (batch x length) grid nor a cross through one "
                              "reference point, so they cannot be interpolated",
                              path, what);
        } else {
            s->t_ref = ref->t_s;
            build_arm(s, what, 1, x_ref, b_ref, "batch", &s->arm_batch);
            build_arm(s, what, 0, b_ref, x_ref, what[0] == 'p' ? "prompt" : "context", &s->arm_x);
            s->batch_ref = b_ref;
            s->x_ref = x_ref;
            if (what[0] == 'p')
                build_ratio(s);
        }
    }
    kv_free(bs);
    kv_free(xs);
    return rc;
}

static void surface_free(surface *s)
{
    kv_free(s->pts);
    for (size_t r = 0; r < s->n_rows; r++) {
        kv_free(s->rows[r].k);
        kv_free(s->rows[r].v);
    }
    kv_free(s->rows);
    kv_free(s->row_batch);
    kv_free(s->arm_batch.k);
    kv_free(s->arm_batch.v);
    kv_free(s->arm_x.k);
    kv_free(s->arm_x.v);
    kv_free(s->ratio.k);
    kv_free(s->ratio.v);
}

static void surface_range(const surface *s, double *b0, double *b1, double *x0, double *x1)
{
    *b0 = *x0 = INFINITY;
    *b1 = *x1 = 0;
    for (size_t i = 0; i < s->n; i++) {
        *b0 = fmin(*b0, s->pts[i].batch);
        *b1 = fmax(*b1, s->pts[i].batch);
        *x0 = fmin(*x0, s->pts[i].x);
        *x1 = fmax(*x1, s->pts[i].x);
    }
}

/* ---- The CSV --------------------------------------------------------------------------------- */

enum { COL_MODEL, COL_HARDWARE, COL_TP, COL_PROMPT, COL_BATCH, COL_TOKENS, COL_PROMPT_TIME, COL_TOKEN_TIME, N_COLS };
static const char *const col_names[N_COLS] = {"model",      "hardware",   "tensor_parallel", "prompt_size",
                                              "batch_size", "token_size", "prompt_time",     "token_time"};

#define MAX_FIELDS 64

/* Splits a line at commas in place, trimming blanks; quoted fields are not part of the format. */
static int split(char *line, char **fields, int *cols, int *n, const char *path, int lineno, kv_error *err)
{
    *n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*n == MAX_FIELDS)
            return kv_error_set(err, KV_EINPUT, "%s:%d: more than %d columns", path, lineno, MAX_FIELDS);
        cols[*n] = (int)(p - line) + 1;
        fields[(*n)++] = p;
        char *end = p + strcspn(p, ",\"");
        if (*end == '"')
            return kv_error_set(err, KV_EINPUT, "%s:%d:%d: quoted fields are not supported in a profile table",
                                path, lineno, (int)(end - line) + 1);
        char *stop = end;
        while (stop > p && (stop[-1] == ' ' || stop[-1] == '\t' || stop[-1] == '\r'))
            stop--;
        bool more = *end == ',';
        *stop = '\0';
        if (!more)
            return KV_OK;
        p = end + 1;
    }
}

static int number(const char *text, const char *path, int lineno, int col, const char *name, double lo,
                  double *out, kv_error *err)
{
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v) || v < lo)
        return kv_error_set(err, KV_EINPUT, "%s:%d:%d: %s: expected a finite number >= %g, got '%s'", path, lineno,
                            col, name, lo, text);
    *out = v;
    return KV_OK;
}

/* Notes a (model, hardware, tp) combination the file holds, for the no-match message. */
static void note_combo(char *list, size_t size, const char *model, const char *hardware, double tp)
{
    char one[192];
    snprintf(one, sizeof one, "%s/%s/tp%g", model, hardware, tp);
    if (strstr(list, one))
        return;
    size_t used = strlen(list);
    if (used + strlen(one) + 3 < size)
        snprintf(list + used, size - used, "%s%s", used ? ", " : "", one);
}

static int read_table(FILE *f, const char *path, const char *model, const char *hardware, int tp, kv_profile *p,
                      char *combos, size_t combos_size, kv_error *err)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, at[N_COLS];
    bool header = false;
    int rc = KV_OK;
    char *fields[MAX_FIELDS];
    int cols[MAX_FIELDS], n = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            rc = kv_error_set(err, KV_EINPUT, "%s:%d: a NUL byte inside the line", path, lineno);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        rc = split(line, fields, cols, &n, path, lineno, err);
        if (rc)
            break;
        if (!header) {
            for (int c = 0; c < N_COLS && !rc; c++) {
                at[c] = -1;
                for (int i = 0; i < n; i++)
                    if (strcasecmp(fields[i], col_names[c]) == 0)
                        at[c] = i;
                if (at[c] < 0)
                    rc = kv_error_set(err, KV_EINPUT, "%s:%d: the header has no '%s' column (a profile table needs "
                                      "model, hardware, tensor_parallel, prompt_size, batch_size, token_size, "
                                      "prompt_time, token_time)", path, lineno, col_names[c]);
            }
            header = true;
            continue;
        }
        int need = 0;
        for (int c = 0; c < N_COLS; c++)
            need = at[c] > need ? at[c] : need;
        if (n <= need) {
            rc = kv_error_set(err, KV_EINPUT, "%s:%d: %d columns, the header names %d or more", path, lineno, n,
                              need + 1);
            break;
        }
        double v[N_COLS];
        for (int c = COL_TP; c < N_COLS && !rc; c++)
            rc = number(fields[at[c]], path, lineno, cols[at[c]], col_names[c], c == COL_TOKENS ? 0 : 1e-300, &v[c],
                        err);
        if (rc)
            break;
        note_combo(combos, combos_size, fields[at[COL_MODEL]], fields[at[COL_HARDWARE]], v[COL_TP]);
        if (strcasecmp(fields[at[COL_MODEL]], model) != 0 || strcasecmp(fields[at[COL_HARDWARE]], hardware) != 0 ||
            v[COL_TP] != tp)
            continue;
        surface_add(&p->prefill, v[COL_BATCH], v[COL_PROMPT], v[COL_PROMPT_TIME] * 1e-3);
        surface_add(&p->decode, v[COL_BATCH], v[COL_PROMPT] + v[COL_TOKENS] / 2, v[COL_TOKEN_TIME] * 1e-3);
    }
    if (!rc && !header)
        rc = kv_error_set(err, KV_EINPUT, "%s: empty profile table (no header line)", path);
    free(line);
    return rc;
}

int kv_profile_load(const char *path, const char *model, const char *hardware, int tp, const char *where,
                    kv_profile **out, kv_error *err)
{
    *out = NULL;
    const char *at = where ? where : path;
    kv_error open_err = {0};
    FILE *f = kv_input_fopen(path, "profile table", KV_INPUT_MAX_TEXT, &open_err);
    if (!f) /* "PATH: cannot open profile table: why", placed after the scenario key's position */
        return kv_error_set(err, open_err.code, "%s: %s", at, open_err.msg);
    kv_profile *p = kv_calloc(1, sizeof *p);
    char combos[512] = "";
    int rc = read_table(f, path, model, hardware, tp, p, combos, sizeof combos, err);
    fclose(f);
    if (!rc && p->prefill.n == 0)
        rc = kv_error_set(err, KV_EINPUT, "%s: profile table %s has no rows for model '%s' on '%s' with tp %d "
                          "(it has: %s)", at, path, model, hardware, tp, combos[0] ? combos : "no data rows");
    if (!rc)
        rc = surface_build(&p->prefill, "prefill", path, err);
    if (!rc)
        rc = surface_build(&p->decode, "decode", path, err);
    if (rc) {
        kv_profile_destroy(p);
        return rc;
    }
    double b0, b1, x0, x1, c0, c1, d0, d1;
    surface_range(&p->prefill, &b0, &b1, &x0, &x1);
    surface_range(&p->decode, &d0, &d1, &c0, &c1);
    snprintf(p->describe, sizeof p->describe,
             "%s on %s, tp %d (%zu prefill points: batch %g-%g, prompt %g-%g tokens; %zu decode points: batch "
             "%g-%g, context %g-%g tokens%s%s%s%s)",
             model, hardware, tp, p->prefill.n, b0, b1, x0, x1, p->decode.n, d0, d1, c0, c1,
             p->prefill.dropped[0] || p->decode.dropped[0] ? "; dropped " : "", p->prefill.dropped,
             p->prefill.dropped[0] && p->decode.dropped[0] ? ", " : "", p->decode.dropped);
    *out = p;
    return KV_OK;
}

void kv_profile_destroy(kv_profile *p)
{
    if (!p)
        return;
    surface_free(&p->prefill);
    surface_free(&p->decode);
    kv_free(p);
}

double kv_profile_prefill_s(const kv_profile *p, double batch, double prompt_tokens)
{
    return surface_at(&p->prefill, batch, prompt_tokens);
}

double kv_profile_decode_s(const kv_profile *p, double batch, double context_tokens)
{
    return surface_at(&p->decode, batch, context_tokens);
}

/* A point is kept when it lies on the grid or on an arm (dropped points are on neither). */
static bool kept(const surface *s, const point *q)
{
    if (s->grid)
        return true;
    const line *arms[2] = {&s->arm_batch, &s->arm_x};
    double keys[2] = {q->batch, q->x};
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < arms[a]->n; i++)
            if (arms[a]->k[i] == keys[a] && arms[a]->v[i] == q->t_s)
                return true;
    return false;
}

size_t kv_profile_point_count(const kv_profile *p, int decode)
{
    const surface *s = decode ? &p->decode : &p->prefill;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += kept(s, &s->pts[i]);
    return n;
}

void kv_profile_point(const kv_profile *p, int decode, size_t i, double *batch, double *x, double *t_s)
{
    const surface *s = decode ? &p->decode : &p->prefill;
    for (size_t j = 0; j < s->n; j++) {
        if (!kept(s, &s->pts[j]))
            continue;
        if (i-- == 0) {
            *batch = s->pts[j].batch;
            *x = s->pts[j].x;
            *t_s = s->pts[j].t_s;
            return;
        }
    }
    *batch = *x = *t_s = NAN;
}

const char *kv_profile_describe(const kv_profile *p)
{
    return p->describe;
}
