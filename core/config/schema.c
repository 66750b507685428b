/* schema.c — table-driven binding of YAML trees to structs, with precise errors. */
#include "core/config/schema.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/base/alloc.h"
#include "core/base/didyoumean.h"

/* ---- Scalars ------------------------------------------------------------------- */

static const char *where(const kv_ynode *n, char *buf, size_t size)
{
    return kv_ytree_where(n, buf, size);
}

static int need_scalar(const kv_ynode *n, const char *what, const char *type, kv_error *err)
{
    if (n->kind == KV_YSCALAR)
        return KV_OK;
    char w[300];
    return kv_error_set(err, KV_EINPUT, "%s: %s: expected %s, got a %s", where(n, w, sizeof w), what, type,
                        n->kind == KV_YMAP ? "mapping" : "list");
}

int kv_ynode_double(const kv_ynode *n, const char *what, double *out, kv_error *err)
{
    int rc = need_scalar(n, what, "a number", err);
    if (rc)
        return rc;
    char w[300];
    const char *s = n->value;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (n->quoted || end == s || *end != '\0' || errno == ERANGE || !isfinite(v) ||
        strncasecmp(s, "0x", 2) == 0 || strpbrk(s, "nN") != NULL)
        return kv_error_set(err, KV_EINPUT, "%s: %s: expected a finite number, got '%s'", where(n, w, sizeof w),
                            what, s);
    *out = v;
    return KV_OK;
}

int kv_ynode_int(const kv_ynode *n, const char *what, long long min, long long max, long long *out, kv_error *err)
{
    double v;
    char w[300];
    int rc = kv_ynode_double(n, what, &v, err);
    if (rc)
        return rc;
    if (v != floor(v) || v < -9.0e15 || v > 9.0e15)
        return kv_error_set(err, KV_EINPUT, "%s: %s: expected a whole number, got '%s'", where(n, w, sizeof w), what,
                            n->value);
    if (v < (double)min || v > (double)max)
        return kv_error_set(err, KV_EINPUT, "%s: %s: %s is out of range [%lld, %lld]", where(n, w, sizeof w), what,
                            n->value, min, max);
    *out = (long long)v;
    return KV_OK;
}

int kv_ynode_bool(const kv_ynode *n, const char *what, int *out, kv_error *err)
{
    int rc = need_scalar(n, what, "true or false", err);
    if (rc)
        return rc;
    const char *s = n->value;
    if (!n->quoted && (strcmp(s, "true") == 0 || strcmp(s, "yes") == 0 || strcmp(s, "on") == 0)) {
        *out = 1;
        return KV_OK;
    }
    if (!n->quoted && (strcmp(s, "false") == 0 || strcmp(s, "no") == 0 || strcmp(s, "off") == 0)) {
        *out = 0;
        return KV_OK;
    }
    char w[300];
    return kv_error_set(err, KV_EINPUT, "%s: %s: expected true or false, got '%s'", where(n, w, sizeof w), what, s);
}

/* ---- Binding -------------------------------------------------------------------- */

const kv_key_spec *kv_schema_find(const kv_schema *s, const char *path)
{
    for (size_t i = 0; i < s->count; i++)
        if (strcmp(s->keys[i].path, path) == 0)
            return &s->keys[i];
    return NULL;
}

static void *field(void *base, const kv_key_spec *k)
{
    return (char *)base + k->offset;
}

static void free_value(const kv_key_spec *k, void *base)
{
    void *f = field(base, k);
    switch (k->type) {
    case KV_KEY_STRING:
        kv_free(*(char **)f);
        *(char **)f = NULL;
        break;
    case KV_KEY_STRLIST: {
        kv_strlist *l = f;
        for (size_t i = 0; i < l->count; i++)
            kv_free(l->items[i]);
        kv_free(l->items);
        l->items = NULL;
        l->count = 0;
        break;
    }
    case KV_KEY_INTLIST:
        kv_free(((kv_intlist *)f)->items);
        memset(f, 0, sizeof(kv_intlist));
        break;
    case KV_KEY_DOUBLELIST:
        kv_free(((kv_doublelist *)f)->items);
        memset(f, 0, sizeof(kv_doublelist));
        break;
    default:
        break;
    }
}

static int check_range(const kv_ynode *n, const kv_key_spec *k, double v, kv_error *err)
{
    char w[300];
    if (k->type == KV_KEY_POSITIVE && !(v > 0))
        return kv_error_set(err, KV_EINPUT, "%s: %s: must be greater than 0, got %s", where(n, w, sizeof w), k->path,
                            n->value);
    if (v < k->min || v > k->max)
        return kv_error_set(err, KV_EINPUT, "%s: %s: %s is out of range [%g, %g]", where(n, w, sizeof w), k->path,
                            n->value, k->min, k->max);
    return KV_OK;
}

static int bind_number(const kv_ynode *n, const kv_key_spec *k, double *out, kv_error *err)
{
    int rc = kv_ynode_double(n, k->path, out, err);
    return rc ? rc : check_range(n, k, *out, err);
}

/* An enum's names as "a|b|c", in buf. */
static const char *join_names(const kv_key_spec *k, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; k->names[i] && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? "|" : "", k->names[i]);
    return buf;
}

static int bind_value(const kv_ynode *n, const kv_key_spec *k, void *base, kv_error *err)
{
    void *f = field(base, k);
    char w[300];
    int rc = KV_OK;
    switch (k->type) {
    case KV_KEY_INT: {
        long long v;
        rc = kv_ynode_int(n, k->path, (long long)k->min, (long long)k->max, &v, err);
        if (!rc)
            *(int *)f = (int)v;
        return rc;
    }
    case KV_KEY_DOUBLE:
    case KV_KEY_POSITIVE:
        return bind_number(n, k, (double *)f, err);
    case KV_KEY_BOOL: {
        int v;
        rc = kv_ynode_bool(n, k->path, &v, err);
        if (!rc)
            *(bool *)f = v != 0;
        return rc;
    }
    case KV_KEY_STRING:
        rc = need_scalar(n, k->path, "a string", err);
        if (rc)
            return rc;
        free_value(k, base);
        *(char **)f = kv_strdup(n->value);
        return KV_OK;
    case KV_KEY_ENUM: {
        rc = need_scalar(n, k->path, "a string", err);
        if (rc)
            return rc;
        for (int i = 0; k->names[i]; i++)
            if (strcmp(k->names[i], n->value) == 0) {
                *(int *)f = i;
                return KV_OK;
            }
        char names[512];
        return kv_error_set(err, KV_EINPUT, "%s: %s: '%s' is not one of %s", where(n, w, sizeof w), k->path,
                            n->value, join_names(k, names, sizeof names));
    }
    case KV_KEY_STRLIST:
    case KV_KEY_INTLIST:
    case KV_KEY_DOUBLELIST: {
        if (n->kind != KV_YSEQ)
            return kv_error_set(err, KV_EINPUT, "%s: %s: expected a list, e.g. [a, b]", where(n, w, sizeof w),
                                k->path);
        free_value(k, base);
        /* Sized once from the list (a realloc per item is quadratic where realloc copies). */
        if (n->count && k->type == KV_KEY_STRLIST)
            ((kv_strlist *)f)->items = kv_calloc(n->count, sizeof(char *));
        else if (n->count && k->type == KV_KEY_INTLIST)
            ((kv_intlist *)f)->items = kv_calloc(n->count, sizeof(int));
        else if (n->count)
            ((kv_doublelist *)f)->items = kv_calloc(n->count, sizeof(double));
        for (size_t i = 0; i < n->count && !rc; i++) {
            const kv_ynode *it = n->items[i];
            if (k->type == KV_KEY_STRLIST) {
                kv_strlist *l = f;
                rc = need_scalar(it, k->path, "a string", err);
                if (!rc)
                    l->items[l->count++] = kv_strdup(it->value);
            } else if (k->type == KV_KEY_INTLIST) {
                kv_intlist *l = f;
                long long v;
                rc = kv_ynode_int(it, k->path, (long long)k->min, (long long)k->max, &v, err);
                if (!rc)
                    l->items[l->count++] = (int)v;
            } else {
                kv_doublelist *l = f;
                double v;
                rc = bind_number(it, k, &v, err);
                if (!rc)
                    l->items[l->count++] = v;
            }
        }
        return rc;
    }
    case KV_KEY_FREEMAP:
        if (n->kind != KV_YMAP && !(n->kind == KV_YSCALAR && n->value[0] == '\0'))
            return kv_error_set(err, KV_EINPUT, "%s: %s: expected a mapping", where(n, w, sizeof w), k->path);
        *(const kv_ynode **)f = n;
        return KV_OK;
    case KV_KEY_SECTION:
        break;
    }
    return KV_OK;
}

/* Whether an unknown key looks like a key name and may be quoted in a message. A file that is not of
   the expected kind (a model card path naming /etc/shadow, say) parses as YAML keys made of its
   lines: those are never echoed. */
static bool key_name_like(const char *key)
{
    size_t n = 0;
    for (const char *p = key; *p; p++, n++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-' || *p == '.'))
            return false;
    return n > 0 && n <= 64;
}

/* Binds every key of mapping `map`, whose dotted path is `prefix` ("" at the root). */
static int bind_map(const kv_schema *s, const kv_ynode *map, const char *prefix, void *base, bool *seen,
                    kv_error *err)
{
    char w[300];
    if (map->kind == KV_YSCALAR && (map->value[0] == '\0' || strcmp(map->value, "~") == 0 ||
                                    strcmp(map->value, "null") == 0))
        return KV_OK; /* "section:" with nothing under it */
    if (map->kind != KV_YMAP)
        return kv_error_set(err, KV_EINPUT, "%s: %s: expected a mapping of keys", where(map, w, sizeof w),
                            prefix[0] ? prefix : s->what);
    for (size_t i = 0; i < map->count; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", map->keys[i]);
        const kv_key_spec *k = kv_schema_find(s, path);
        if (!k) {
            /* Collect the keys allowed here for the hint and the message. */
            const char *cands[128];
            size_t nc = 0, plen = strlen(prefix);
            for (size_t j = 0; j < s->count && nc < 128; j++) {
                const char *p = s->keys[j].path;
                if (plen && (strncmp(p, prefix, plen) != 0 || p[plen] != '.'))
                    continue;
                const char *rest = plen ? p + plen + 1 : p;
                if (!strchr(rest, '.'))
                    cands[nc++] = rest;
            }
            const kv_ynode *v = map->items[i];
            if (strncmp(v->file, "--set", 5) == 0) /* added from the command line */
                snprintf(w, sizeof w, "%s", v->file);
            else
                snprintf(w, sizeof w, "%s:%d:%d", map->file, map->key_lines[i], map->key_cols[i]);
            if (!key_name_like(map->keys[i]))
                return kv_error_set(err, KV_EINPUT, "%s: unknown key in %s, and not a key name (is this file a %s?)",
                                    w, prefix[0] ? prefix : s->what, s->what);
            const char *hint = kv_did_you_mean(map->keys[i], cands, nc);
            if (hint)
                return kv_error_set(err, KV_EINPUT, "%s: unknown key '%s' in %s (did you mean '%s'?)", w, path,
                                    prefix[0] ? prefix : s->what, hint);
            return kv_error_set(err, KV_EINPUT, "%s: unknown key '%s' in %s (see kvsim help %s)", w, path,
                                prefix[0] ? prefix : s->what, strcmp(s->what, "scenario") == 0 ? "scenario" : "cards");
        }
        seen[k - s->keys] = true;
        int rc = k->type == KV_KEY_SECTION ? bind_map(s, map->items[i], path, base, seen, err)
                                           : bind_value(map->items[i], k, base, err);
        if (rc)
            return rc;
    }
    return KV_OK;
}

int kv_schema_bind(const kv_schema *s, const kv_ynode *root, void *base, kv_error *err)
{
    /* Defaults first, through the same conversions as user values. */
    for (size_t i = 0; i < s->count; i++) {
        const kv_key_spec *k = &s->keys[i];
        if (k->type == KV_KEY_SECTION || k->type == KV_KEY_FREEMAP || !k->def)
            continue;
        kv_ynode *n = NULL;
        int rc = kv_ytree_load_string(k->def, "default", &n, err);
        if (!rc)
            rc = bind_value(n, k, base, err);
        kv_ytree_free(n);
        if (rc)
            return kv_error_prefix(err, "internal: bad default for %s: ", k->path);
    }
    bool *seen = kv_calloc(s->count, sizeof *seen);
    int rc = bind_map(s, root, "", base, seen, err);
    for (size_t i = 0; !rc && i < s->count; i++) {
        const kv_key_spec *k = &s->keys[i];
        if (!k->def && k->type != KV_KEY_SECTION && k->type != KV_KEY_FREEMAP && !seen[i])
            rc = kv_error_set(err, KV_EINPUT, "%s: missing required key '%s' (%s)", root->file, k->path, k->doc);
    }
    kv_free(seen);
    return rc;
}

void kv_schema_free(const kv_schema *s, void *base)
{
    for (size_t i = 0; i < s->count; i++)
        free_value(&s->keys[i], base);
}

static const char *type_name(const kv_key_spec *k, char *buf, size_t size)
{
    switch (k->type) {
    case KV_KEY_SECTION: return "section";
    case KV_KEY_INT: return "integer";
    case KV_KEY_DOUBLE: return "number";
    case KV_KEY_POSITIVE: return "number > 0";
    case KV_KEY_BOOL: return "bool";
    case KV_KEY_STRING: return "string";
    case KV_KEY_ENUM: return join_names(k, buf, size);
    case KV_KEY_STRLIST: return "list of strings";
    case KV_KEY_INTLIST: return "list of integers";
    case KV_KEY_DOUBLELIST: return "list of numbers";
    case KV_KEY_FREEMAP: return "mapping";
    }
    return "?";
}

void kv_schema_print(const kv_schema *s, FILE *out)
{
    for (size_t i = 0; i < s->count; i++) {
        const kv_key_spec *k = &s->keys[i];
        int depth = 0;
        for (const char *p = k->path; *p; p++)
            depth += *p == '.';
        const char *leaf = strrchr(k->path, '.');
        leaf = leaf ? leaf + 1 : k->path;
        if (k->type == KV_KEY_SECTION) {
            fprintf(out, "%*s%s:    # %s\n", depth * 2, "", leaf, k->doc);
            continue;
        }
        char names[512];
        fprintf(out, "%*s%s: %s    # %s; %s%s\n", depth * 2, "", leaf, k->def ? k->def : "(required)", k->doc,
                type_name(k, names, sizeof names), k->def ? "" : ", required");
    }
}
