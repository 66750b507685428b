/* ytree.h — a YAML document as a tree of nodes that remember their file:line:col.
 *
 * libyaml parses; this module keeps what the scenario loader needs: scalars,
 * mappings (ordered, duplicate keys rejected) and sequences, each with its
 * source position so every error can point at the exact place.
 *
 * Hostile input is refused with KV_EINPUT at file:line:col: a scalar (key or
 * value) holding a NUL byte ("a\0b" would otherwise be cut silently), any
 * explicit YAML tag (!include, !!str, ...: kvsim gives tags no meaning), aliases
 * (*name, so nothing expands), nesting deeper than 64, more than
 * KV_YTREE_MAX_NODES nodes, more than one document. Files are read through
 * kv_input_read_all (infile.h): regular files of at most 16 MiB.
 * Key lookup in a mapping is O(1) on average (a hash index built as the
 * mapping grows), so a mapping of n keys is built and checked in O(n).
 */
#ifndef KV_YTREE_H
#define KV_YTREE_H

#include <stddef.h>

#include "core/base/error.h"

/* Nodes one document may have (each costs ~100 bytes of memory). */
#define KV_YTREE_MAX_NODES 2000000

typedef enum kv_ynode_kind {
    KV_YSCALAR = 0,
    KV_YMAP = 1,
    KV_YSEQ = 2,
} kv_ynode_kind;

typedef struct kv_ynode kv_ynode;
struct kv_ynode {
    kv_ynode_kind kind;
    char *value;        /* KV_YSCALAR: the text (never NULL) */
    int quoted;         /* KV_YSCALAR: written in quotes (so never a number) */
    char **keys;        /* KV_YMAP: [count] */
    int *key_lines;     /* KV_YMAP: [count] line of each key */
    int *key_cols;      /* KV_YMAP: [count] column of each key */
    kv_ynode **items;   /* KV_YMAP: values [count]; KV_YSEQ: items [count] */
    size_t count;
    size_t cap;         /* allocated entries of items (and keys, key_lines, key_cols) */
    size_t *index;      /* KV_YMAP: open-addressing hash of key -> position + 1 (0 = empty),
                           [index_cap], NULL for small or hand-built mappings (then a linear scan) */
    size_t index_cap;
    const char *file;   /* source file name (owned by the tree) or "--set" */
    int line, col;      /* 1-based position of the node */
};

/* Parses a whole file. Syntax errors, duplicate keys, anchors/aliases and
   multi-document files give KV_EINPUT with "file:line:col: ...". */
int kv_ytree_load_file(const char *path, kv_ynode **out, kv_error *err);
/* Parses text (e.g. the value of --set) as one YAML node; `origin` names it in errors. */
int kv_ytree_load_string(const char *text, const char *origin, kv_ynode **out, kv_error *err);
void kv_ytree_free(kv_ynode *node); /* NULL is fine; frees children and strings */

/* Mapping lookup: the value of key, or NULL. *index gets its position if not NULL. */
kv_ynode *kv_ytree_get(const kv_ynode *map, const char *key, size_t *index);
/* Follows a dotted path ("cluster.prefill.nodes") through mappings; NULL if absent. */
kv_ynode *kv_ytree_path(const kv_ynode *root, const char *dotted);

/* Sets root[dotted] = value (value's tree is adopted), creating mappings on the
   way; replaces an existing value. Fails if a step on the way is not a mapping. */
int kv_ytree_set(kv_ynode *root, const char *dotted, kv_ynode *value, kv_error *err);

/* Removes key (and its value, freed) from a mapping, keeping the order of the rest; returns 1 if it
   was there, 0 if not (or map is not a mapping). */
int kv_ytree_remove(kv_ynode *map, const char *key);

/* "file:line:col" of a node into buf. */
const char *kv_ytree_where(const kv_ynode *node, char *buf, size_t size);

#endif
