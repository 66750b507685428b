/* sweep_internal.h — the sweep struct and two helpers shared by sweep.c (spec), sweep_emit.c (job
 * scripts) and sweep_collect.c (the combined CSV); not for other files. */
#ifndef KV_SWEEP_INTERNAL_H
#define KV_SWEEP_INTERNAL_H

#include <stddef.h>

#include "core/study/sweep.h"

struct kv_sweep {
    char *path;            /* the sweep file as given */
    char *name;            /* `name:` or the file's base name without .yaml */
    char *base;            /* absolute path of the base scenario */
    char *out_dir;         /* absolute */
    char *kvsim;           /* the binary the commands run */
    int zip;               /* mode: zip (else cartesian) */
    int capacity;          /* output: capacity (kvsim capacity per point; else kvsim run) */
    char *slo;             /* output: capacity: the --slo text ("ttft_p99_ms=300,tpot_p99_ms=30") */
    char *attainment;      /* output: capacity: the --attainment text as written, or NULL */
    char *precision;       /* output: capacity: the --precision text as written, or NULL */
    char *cwd;             /* the working folder kvsim sweep ran in (absolute): jobs cd there first */
    char **keys;           /* [n_keys] dotted scenario keys, in file order */
    size_t n_keys;
    char **fixed;          /* [n_fixed] "key=value" applied to every point */
    size_t n_fixed;
    kv_sweep_point *points;/* [n_points] */
    size_t n_points;
    char ***argv;          /* [n_points] NULL-terminated argv of each point */
    char **commands;       /* [n_points] shell lines */
    /* Where each input came from, for kv_sweep_validate's messages ("file:line:col"). */
    char *base_where;      /* the base: value */
    char *matrix_where;    /* matrix:, or NULL without one */
    char **key_where;      /* [n_keys] each matrix key */
    char ***item_where;    /* [n_keys][n_items(k)] each matrix value (one item for a key that is not a list) */
    size_t *n_items;       /* [n_keys] */
    size_t *choice;        /* [n_points * n_keys] the item index of each key at each point */
    char **fixed_where;    /* [n_fixed] the set: key, or NULL for an extra --set */
};

/* a + b + c in a new string (kv_free). */
char *kv_sweep_join3(const char *a, const char *b, const char *c);
/* Whether path is a regular file. */
int kv_sweep_file_exists(const char *path);

#endif
