/* schema.h — bind a YAML tree to a C struct through a table of documented keys.
 *
 * One table per file type (scenario, model card, device profile) lists every
 * key: its dotted path, type, default, range and one line of documentation.
 * Binding fills defaults, then walks the tree: unknown keys are an error with
 * a "did you mean" hint, wrong types and out-of-range numbers name the key
 * and file:line:col. The same table prints the reference (kvsim help scenario).
 */
#ifndef KV_SCHEMA_H
#define KV_SCHEMA_H

#include <stddef.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/config/ytree.h"

typedef enum kv_key_type {
    KV_KEY_SECTION = 0, /* a mapping holding further keys */
    KV_KEY_INT,         /* int; min/max inclusive */
    KV_KEY_DOUBLE,      /* finite double; min inclusive, max inclusive */
    KV_KEY_POSITIVE,    /* finite double > 0 (max inclusive) */
    KV_KEY_BOOL,        /* true/false */
    KV_KEY_STRING,      /* char * (owned by the struct; freed by kv_schema_free) */
    KV_KEY_ENUM,        /* an int-backed C enum: the index of the value in `names` */
    KV_KEY_STRLIST,     /* kv_strlist */
    KV_KEY_INTLIST,     /* kv_intlist; each item within min/max */
    KV_KEY_DOUBLELIST,  /* kv_doublelist; each item within min/max */
    KV_KEY_FREEMAP,     /* const kv_ynode * kept as is (e.g. policy parameters) */
} kv_key_type;

typedef struct kv_strlist {
    char **items;
    size_t count;
} kv_strlist;

typedef struct kv_intlist {
    int *items;
    size_t count;
} kv_intlist;

typedef struct kv_doublelist {
    double *items;
    size_t count;
} kv_doublelist;

typedef struct kv_key_spec {
    const char *path;    /* dotted, e.g. "cluster.prefill.nodes" */
    kv_key_type type;
    size_t offset;       /* of the field in the bound struct (unused for sections) */
    const char *def;     /* default as YAML text; NULL = required (sections: NULL) */
    double min, max;     /* numeric range, inclusive */
    const char *const *names; /* KV_KEY_ENUM: the names of the enum's values in order, NULL-terminated
                                 (the reference and errors list them as "a|b|c") */
    const char *doc;     /* one line for the reference */
} kv_key_spec;

typedef struct kv_schema {
    const char *what;         /* "scenario", "model card", "device profile" */
    const kv_key_spec *keys;
    size_t count;
} kv_schema;

/* Fills `base` from `root` (a mapping). On error, fields may be partly set:
   call kv_schema_free on it either way. */
int kv_schema_bind(const kv_schema *s, const kv_ynode *root, void *base, kv_error *err);
/* Frees the strings and lists that binding allocated in `base`. */
void kv_schema_free(const kv_schema *s, void *base);
/* Prints the reference: every key, type, default and doc line. */
void kv_schema_print(const kv_schema *s, FILE *out);
/* Finds a key's spec; NULL if there is none. */
const kv_key_spec *kv_schema_find(const kv_schema *s, const char *path);

/* Scalar conversions that name the node in errors (`what` is the key path). */
int kv_ynode_int(const kv_ynode *n, const char *what, long long min, long long max, long long *out, kv_error *err);
int kv_ynode_double(const kv_ynode *n, const char *what, double *out, kv_error *err);
int kv_ynode_bool(const kv_ynode *n, const char *what, int *out, kv_error *err);

#endif
