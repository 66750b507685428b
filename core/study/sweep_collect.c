/* sweep_collect.c — the combined CSV of a sweep's finished points (kvsim sweep --collect). */
#define _XOPEN_SOURCE 700
#include "core/study/sweep.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/jsonread.h"
#include "core/study/sweep_internal.h"

/* ---- The combined CSV ------------------------------------------------------------------------ */

typedef struct point_row {
    char *name;             /* folder name */
    char **values;          /* [n_keys] */
    kv_jvalue *results;     /* parsed results.json, or NULL */
    const char *status;     /* ok | failed | missing | unreadable */
} point_row;

static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (const char *p = s; *p; p++) {
        if (*p == '"')
            fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}

static void csv_json_scalar(FILE *f, const kv_jvalue *v)
{
    if (!v)
        return;
    switch (v->kind) {
    case KV_JNUMBER: fputs(v->text, f); break;
    case KV_JBOOL: fputs(v->boolean ? "true" : "false", f); break;
    case KV_JSTRING: csv_field(f, v->text); break;
    default: break; /* null, arrays and objects: empty */
    }
}

/* A column's value in a policy entry: a field, or "replicates.n", "replicates.mean.KEY",
   "replicates.ci95.KEY" inside its replicates object (kvsim run --seeds N). */
static const kv_jvalue *column_value(const kv_jvalue *o, const char *col)
{
    if (strncmp(col, "policy.", 7) == 0) /* a field named like a fixed column (fixed_column) */
        return kv_jvalue_get(o, col + 7);
    if (strncmp(col, "replicates.", 11) != 0)
        return kv_jvalue_get(o, col);
    const kv_jvalue *r = kv_jvalue_get(o, "replicates");
    const char *rest = col + 11, *dot = strchr(rest, '.');
    if (!dot)
        return kv_jvalue_get(r, rest);
    char section[8];
    size_t len = (size_t)(dot - rest);
    if (len >= sizeof section)
        return NULL;
    memcpy(section, rest, len);
    section[len] = '\0';
    return kv_jvalue_get(kv_jvalue_get(r, section), dot + 1);
}

/* Whether a field's name is one of sweep.csv's own columns (capacity.json's per-policy "status":
   found, unbounded, none): such a field's column is "policy.NAME". */
static int fixed_column(const char *name)
{
    return strcmp(name, "point") == 0 || strcmp(name, "dir") == 0 || strcmp(name, "status") == 0 ||
           strcmp(name, "policy") == 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Without points.json: every sub-folder that looks like a point, in name order. */
static int scan_points(const char *dir, point_row **rows, size_t *n, kv_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return kv_error_set(err, KV_EINPUT, "%s: cannot open folder: %s", dir, strerror(errno));
    char **names = NULL;
    size_t cap = 0, count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || kv_is_temporary_name(e->d_name))
            continue; /* a run's staging folder is not a point */
        char *sub = kv_sweep_join3(dir, "/", e->d_name);
        char *r = kv_sweep_join3(sub, "/", "results.json");
        char *c = kv_sweep_join3(sub, "/", "command.txt");
        char *capf = kv_sweep_join3(sub, "/", "capacity.json");
        int point = kv_sweep_file_exists(r) || kv_sweep_file_exists(c) || kv_sweep_file_exists(capf);
        kv_free(capf);
        if (point) {
            kv_grow((void **)&names, sizeof *names, &cap, count + 1);
            names[count++] = kv_strdup(e->d_name);
        }
        kv_free(sub);
        kv_free(r);
        kv_free(c);
    }
    closedir(d);
    if (count)
        qsort(names, count, sizeof *names, by_name);
    *rows = kv_calloc(count ? count : 1, sizeof **rows);
    for (size_t i = 0; i < count; i++)
        (*rows)[i].name = names[i];
    kv_free(names);
    *n = count;
    return KV_OK;
}

static int read_manifest(const char *dir, char ***keys, size_t *n_keys, point_row **rows, size_t *n, kv_error *err)
{
    char *path = kv_sweep_join3(dir, "/", "points.json");
    *keys = NULL;
    *n_keys = 0;
    *rows = NULL;
    *n = 0;
    if (!kv_sweep_file_exists(path)) {
        kv_free(path);
        return scan_points(dir, rows, n, err);
    }
    kv_jvalue *m = NULL;
    int rc = kv_jread_file(path, &m, err);
    const kv_jvalue *jk = rc ? NULL : kv_jvalue_get(m, "keys");
    const kv_jvalue *jp = rc ? NULL : kv_jvalue_get(m, "points");
    if (!rc && (!jk || jk->kind != KV_JARRAY || !jp || jp->kind != KV_JARRAY))
        rc = kv_error_set(err, KV_EINPUT, "%s: expected \"keys\" and \"points\" lists (written by kvsim sweep)",
                          path);
    if (!rc) {
        *n_keys = jk->count;
        *keys = kv_calloc(jk->count ? jk->count : 1, sizeof **keys);
        for (size_t k = 0; k < jk->count; k++)
            (*keys)[k] = kv_strdup(jk->items[k]->kind == KV_JSTRING ? jk->items[k]->text : "?");
        *rows = kv_calloc(jp->count ? jp->count : 1, sizeof **rows);
        *n = jp->count;
        for (size_t i = 0; i < jp->count && !rc; i++) {
            const kv_jvalue *d = kv_jvalue_get(jp->items[i], "dir");
            const kv_jvalue *vals = kv_jvalue_get(jp->items[i], "values");
            if (!d || d->kind != KV_JSTRING || strchr(d->text, '/') || !vals || vals->kind != KV_JARRAY ||
                vals->count != jk->count) {
                rc = kv_error_set(err, KV_EINPUT, "%s:%d:%d: point %zu: expected \"dir\" (a folder name) and "
                                  "\"values\" (one per key)", path, jp->items[i]->line, jp->items[i]->col, i);
                break;
            }
            (*rows)[i].name = kv_strdup(d->text);
            (*rows)[i].values = kv_calloc(jk->count ? jk->count : 1, sizeof *(*rows)[i].values);
            for (size_t k = 0; k < jk->count; k++)
                (*rows)[i].values[k] = kv_strdup(vals->items[k]->kind == KV_JSTRING ? vals->items[k]->text : "");
        }
    }
    kv_jvalue_free(m);
    kv_free(path);
    return rc;
}

static void add_column(char ***cols, size_t *n, size_t *cap, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*cols)[i], name) == 0)
            return;
    kv_grow((void **)cols, sizeof **cols, cap, *n + 1);
    (*cols)[(*n)++] = kv_strdup(name);
}

int kv_sweep_collect(const char *dir, kv_sweep_totals *totals, kv_error *err)
{
    memset(totals, 0, sizeof *totals);
    char **keys = NULL;
    size_t n_keys = 0, n = 0;
    point_row *rows = NULL;
    int rc = read_manifest(dir, &keys, &n_keys, &rows, &n, err);
    char **cols = NULL, **nested = NULL; /* nested: fields that are an object or a list somewhere */
    size_t n_cols = 0, cap_cols = 0, n_nested = 0, cap_nested = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        point_row *r = &rows[i];
        char *sub = kv_sweep_join3(dir, "/", r->name);
        /* kvsim run's results.json, else kvsim capacity's capacity.json (output: capacity): both list
           "policies", whose scalar fields become the columns. */
        char *res = kv_sweep_join3(sub, "/", "results.json");
        if (!kv_sweep_file_exists(res)) {
            kv_free(res);
            res = kv_sweep_join3(sub, "/", "capacity.json");
            if (!kv_sweep_file_exists(res)) {
                kv_free(res);
                res = kv_sweep_join3(sub, "/", "results.json");
            }
        }
        char *errp = kv_sweep_join3(sub, "/", "stderr.txt");
        struct stat st;
        if (kv_sweep_file_exists(res)) {
            kv_error perr = {0};
            if (kv_jread_file(res, &r->results, &perr) != KV_OK) {
                r->status = "unreadable";
                fprintf(stderr, "kvsim sweep: %s\n", perr.msg);
                totals->failed++;
            } else {
                r->status = "ok";
                totals->ok++;
            }
        } else if (stat(errp, &st) == 0 && st.st_size > 0) {
            r->status = "failed";
            totals->failed++;
        } else {
            r->status = "missing";
            totals->missing++;
        }
        const kv_jvalue *pol = r->results ? kv_jvalue_get(r->results, "policies") : NULL;
        for (size_t p = 0; pol && pol->kind == KV_JARRAY && p < pol->count; p++) {
            const kv_jvalue *o = pol->items[p];
            for (size_t k = 0; o->kind == KV_JOBJECT && k < o->count; k++) {
                kv_jkind kind = o->items[k]->kind;
                if (kind == KV_JARRAY || kind == KV_JOBJECT)
                    add_column(&nested, &n_nested, &cap_nested, o->keys[k]);
                if (strcmp(o->keys[k], "name") != 0 && kind != KV_JARRAY && kind != KV_JOBJECT) {
                    if (fixed_column(o->keys[k])) {
                        char *c = kv_sweep_join3("policy", ".", o->keys[k]);
                        add_column(&cols, &n_cols, &cap_cols, c);
                        kv_free(c);
                    } else {
                        add_column(&cols, &n_cols, &cap_cols, o->keys[k]);
                    }
                }
                if (strcmp(o->keys[k], "replicates") == 0 && kind == KV_JOBJECT) {
                    /* the mean and 95% half-width of every metric, as replicates.mean.KEY, replicates.ci95.KEY */
                    const kv_jvalue *mean = kv_jvalue_get(o->items[k], "mean");
                    add_column(&cols, &n_cols, &cap_cols, "replicates.n");
                    for (size_t j = 0; mean && mean->kind == KV_JOBJECT && j < mean->count; j++) {
                        char *c = kv_sweep_join3("replicates.mean", ".", mean->keys[j]);
                        add_column(&cols, &n_cols, &cap_cols, c);
                        kv_free(c);
                        c = kv_sweep_join3("replicates.ci95", ".", mean->keys[j]);
                        add_column(&cols, &n_cols, &cap_cols, c);
                        kv_free(c);
                    }
                }
            }
        }
        kv_free(sub);
        kv_free(res);
        kv_free(errp);
    }
    /* A field that is an object in one entry and null in another (capacity.json's "best" when no rate
       met the SLOs) is not a column. */
    size_t kept = 0;
    for (size_t c = 0; c < n_cols; c++) {
        int drop = 0;
        for (size_t j = 0; j < n_nested && !drop; j++)
            drop = strcmp(cols[c], nested[j]) == 0;
        if (drop)
            kv_free(cols[c]);
        else
            cols[kept++] = cols[c];
    }
    n_cols = kept;
    for (size_t j = 0; j < n_nested; j++)
        kv_free(nested[j]);
    kv_free(nested);
    totals->points = n;
    kv_afile a = {0};
    char *path = kv_sweep_join3(dir, "/", "sweep.csv");
    if (!rc)
        rc = kv_stale_reap(dir, "sweep.csv", NULL, err); /* a killed collect's sweep.csv.tmp.<pid> */
    if (!rc)
        rc = kv_afile_open(&a, path, err);
    if (!rc) {
        FILE *f = a.f;
        fputs("point,dir,status", f);
        for (size_t k = 0; k < n_keys; k++) {
            fputc(',', f);
            csv_field(f, keys[k]);
        }
        fputs(",policy", f);
        for (size_t c = 0; c < n_cols; c++) {
            fputc(',', f);
            csv_field(f, cols[c]);
        }
        fputc('\n', f);
        for (size_t i = 0; i < n; i++) {
            const point_row *r = &rows[i];
            const kv_jvalue *pol = r->results ? kv_jvalue_get(r->results, "policies") : NULL;
            size_t np = pol && pol->kind == KV_JARRAY ? pol->count : 0;
            for (size_t p = 0; p < (np ? np : 1); p++) {
                const kv_jvalue *o = np ? pol->items[p] : NULL;
                fprintf(f, "%zu,", i);
                csv_field(f, r->name);
                fprintf(f, ",%s", np ? r->status : (r->results ? "empty" : r->status));
                for (size_t k = 0; k < n_keys; k++) {
                    fputc(',', f);
                    csv_field(f, r->values ? r->values[k] : "");
                }
                fputc(',', f);
                const kv_jvalue *pname = kv_jvalue_get(o, "name");
                if (pname && pname->kind == KV_JSTRING)
                    csv_field(f, pname->text);
                for (size_t c = 0; c < n_cols; c++) {
                    fputc(',', f);
                    csv_json_scalar(f, column_value(o, cols[c]));
                }
                fputc('\n', f);
                totals->rows++;
            }
        }
        rc = kv_afile_commit(&a, err);
    }
    kv_free(path);
    for (size_t i = 0; i < n; i++) {
        kv_free(rows[i].name);
        for (size_t k = 0; rows[i].values && k < n_keys; k++)
            kv_free(rows[i].values[k]);
        kv_free(rows[i].values);
        kv_jvalue_free(rows[i].results);
    }
    kv_free(rows);
    for (size_t k = 0; k < n_keys; k++)
        kv_free(keys[k]);
    kv_free(keys);
    for (size_t c = 0; c < n_cols; c++)
        kv_free(cols[c]);
    kv_free(cols);
    return rc;
}
