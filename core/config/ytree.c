/* ytree.c — build a kv_ynode tree from libyaml's event stream. */
#include "core/config/ytree.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"

/* Nesting deeper than this is rejected: scenarios are shallow, and a bound
   keeps hostile input from exhausting the stack. */
#define KV_YTREE_MAX_DEPTH 64

typedef struct builder {
    yaml_parser_t parser;
    const char *file;
    kv_error *err;
    size_t nodes; /* made so far, against KV_YTREE_MAX_NODES */
} builder;

/* Mappings of more keys than this get a hash index; smaller ones are scanned. */
#define KV_YTREE_INDEX_MIN 8

static kv_ynode *node_new(kv_ynode_kind kind, const char *file, const yaml_mark_t *mark)
{
    kv_ynode *n = kv_calloc(1, sizeof *n);
    n->kind = kind;
    n->file = kv_strdup(file);
    n->line = (int)mark->line + 1;
    n->col = (int)mark->column + 1;
    return n;
}

void kv_ytree_free(kv_ynode *node)
{
    if (!node)
        return;
    for (size_t i = 0; i < node->count; i++) {
        if (node->kind == KV_YMAP)
            kv_free(node->keys[i]);
        kv_ytree_free(node->items[i]);
    }
    kv_free(node->keys);
    kv_free(node->key_lines);
    kv_free(node->key_cols);
    kv_free(node->index);
    kv_free(node->items);
    kv_free(node->value);
    kv_free((char *)node->file);
    kv_free(node);
}

static int parse_error(builder *b)
{
    const yaml_parser_t *p = &b->parser;
    const yaml_mark_t *m = p->problem ? &p->problem_mark : &p->mark;
    return kv_error_set(b->err, KV_EINPUT, "%s:%zu:%zu: YAML syntax error: %s%s%s", b->file, m->line + 1,
                        m->column + 1, p->problem ? p->problem : "malformed document",
                        p->context ? " " : "", p->context ? p->context : "");
}

static int next_event(builder *b, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&b->parser, ev))
        return parse_error(b);
    return KV_OK;
}

/* FNV-1a of a key, for the mapping index. */
static size_t key_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)h;
}

/* Puts keys[i] into the index (which has room). */
static void index_put(kv_ynode *map, size_t i)
{
    size_t mask = map->index_cap - 1, at = key_hash(map->keys[i]) & mask;
    while (map->index[at])
        at = (at + 1) & mask;
    map->index[at] = i + 1;
}

/* Keeps the index at most half full; builds it once the mapping is no longer small. */
static void index_grow(kv_ynode *map)
{
    if (map->count <= KV_YTREE_INDEX_MIN || map->count * 2 <= map->index_cap)
        return;
    size_t cap = map->index_cap ? map->index_cap : 32;
    while (map->count * 2 > cap)
        cap *= 2;
    kv_free(map->index);
    map->index = kv_calloc(cap, sizeof *map->index);
    map->index_cap = cap;
    for (size_t i = 0; i < map->count; i++)
        index_put(map, i);
}

static void append(kv_ynode *parent, kv_ynode *child, char *key, int line, int col)
{
    size_t n = parent->count;
    if (n == parent->cap) { /* geometric growth: n appends cost O(n) */
        size_t cap = parent->cap ? parent->cap * 2 : 4;
        parent->items = kv_realloc(parent->items, cap * sizeof *parent->items);
        if (parent->kind == KV_YMAP) {
            parent->keys = kv_realloc(parent->keys, cap * sizeof *parent->keys);
            parent->key_lines = kv_realloc(parent->key_lines, cap * sizeof *parent->key_lines);
            parent->key_cols = kv_realloc(parent->key_cols, cap * sizeof *parent->key_cols);
        }
        parent->cap = cap;
    }
    parent->items[n] = child;
    if (parent->kind == KV_YMAP) {
        parent->keys[n] = key;
        parent->key_lines[n] = line;
        parent->key_cols[n] = col;
    }
    parent->count = n + 1;
    if (parent->kind == KV_YMAP) {
        if (parent->index && parent->count * 2 <= parent->index_cap)
            index_put(parent, n);
        else
            index_grow(parent);
    }
}

/* A scalar's text with a NUL byte in it would be cut at the NUL: refused. key: the mapping key whose
   value this is (NULL for a key itself, a list item or the root), for the message. */
static int check_scalar(builder *b, const yaml_event_t *ev, const char *key)
{
    if (!memchr(ev->data.scalar.value, '\0', ev->data.scalar.length))
        return KV_OK;
    return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: %s%sa NUL byte (\\0) inside a YAML string is not allowed",
                        b->file, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1, key ? key : "",
                        key ? ": " : "");
}

/* Explicit tags (!include FILE, !!binary, !custom ...) have no meaning in kvsim's files: refused. */
static int check_tag(builder *b, const yaml_event_t *ev)
{
    const yaml_char_t *tag = ev->type == YAML_SCALAR_EVENT           ? ev->data.scalar.tag
                             : ev->type == YAML_MAPPING_START_EVENT  ? ev->data.mapping_start.tag
                             : ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.tag
                                                                     : NULL;
    if (!tag)
        return KV_OK;
    return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: YAML tags (!name before a value) are not supported",
                        b->file, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1);
}

/* key: the mapping key whose value this is, for messages (NULL for list items and the root). */
static int build_node(builder *b, yaml_event_t *ev, int depth, const char *key, kv_ynode **out);

/* Builds the children of a mapping or sequence until its end event. */
static int build_children(builder *b, kv_ynode *n, int depth)
{
    for (;;) {
        yaml_event_t ev;
        int rc = next_event(b, &ev);
        if (rc)
            return rc;
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return KV_OK;
        }
        if (n->kind == KV_YSEQ) {
            kv_ynode *child = NULL;
            rc = build_node(b, &ev, depth + 1, NULL, &child);
            yaml_event_delete(&ev);
            if (rc)
                return rc;
            append(n, child, NULL, 0, 0);
            continue;
        }
        /* Mapping: a scalar key, then its value. */
        if (ev.type != YAML_SCALAR_EVENT) {
            int line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1;
            yaml_event_delete(&ev);
            return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: mapping keys must be plain scalars", b->file, line,
                                col);
        }
        rc = check_scalar(b, &ev, NULL);
        if (!rc)
            rc = check_tag(b, &ev);
        if (rc) {
            yaml_event_delete(&ev);
            return rc;
        }
        int kline = (int)ev.start_mark.line + 1, kcol = (int)ev.start_mark.column + 1;
        char *key = kv_strdup((const char *)ev.data.scalar.value);
        yaml_event_delete(&ev);
        if (kv_ytree_get(n, key, NULL)) {
            rc = kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: duplicate key '%s'", b->file, kline, kcol, key);
            kv_free(key);
            return rc;
        }
        rc = next_event(b, &ev);
        if (rc) {
            kv_free(key);
            return rc;
        }
        kv_ynode *child = NULL;
        rc = build_node(b, &ev, depth + 1, key, &child);
        yaml_event_delete(&ev);
        if (rc) {
            kv_free(key);
            return rc;
        }
        append(n, child, key, kline, kcol);
    }
}

static int build_node(builder *b, yaml_event_t *ev, int depth, const char *key, kv_ynode **out)
{
    *out = NULL;
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    if (depth > KV_YTREE_MAX_DEPTH)
        return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: nesting deeper than %d levels", b->file, line, col,
                            KV_YTREE_MAX_DEPTH);
    if (++b->nodes > KV_YTREE_MAX_NODES)
        return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: more than %d YAML values in one file", b->file, line, col,
                            KV_YTREE_MAX_NODES);
    int rc = check_tag(b, ev);
    if (rc)
        return rc;
    switch (ev->type) {
    case YAML_SCALAR_EVENT: {
        rc = check_scalar(b, ev, key);
        if (rc)
            return rc;
        kv_ynode *n = node_new(KV_YSCALAR, b->file, &ev->start_mark);
        n->value = kv_strndup((const char *)ev->data.scalar.value, ev->data.scalar.length);
        n->quoted = ev->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                    ev->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
        *out = n;
        return KV_OK;
    }
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT: {
        kv_ynode *n = node_new(ev->type == YAML_MAPPING_START_EVENT ? KV_YMAP : KV_YSEQ, b->file,
                               &ev->start_mark);
        rc = build_children(b, n, depth);
        if (rc) {
            kv_ytree_free(n);
            return rc;
        }
        *out = n;
        return KV_OK;
    }
    case YAML_ALIAS_EVENT:
        return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: YAML aliases (*name) are not supported in scenarios",
                            b->file, line, col);
    default:
        return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: unexpected YAML event", b->file, line, col);
    }
}

/* Reads the stream: exactly one document whose root is returned. */
static int build_document(builder *b, kv_ynode **out)
{
    *out = NULL;
    yaml_event_t ev;
    int rc;
    kv_ynode *root = NULL;
    while ((rc = next_event(b, &ev)) == KV_OK) {
        yaml_event_type_t type = ev.type;
        if (type == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (type == YAML_DOCUMENT_START_EVENT && root) {
            int line = (int)ev.start_mark.line + 1;
            yaml_event_delete(&ev);
            kv_ytree_free(root);
            return kv_error_set(b->err, KV_EINPUT, "%s:%d:1: only one YAML document per file", b->file, line);
        }
        if (type == YAML_SCALAR_EVENT || type == YAML_MAPPING_START_EVENT || type == YAML_SEQUENCE_START_EVENT ||
            type == YAML_ALIAS_EVENT) {
            rc = build_node(b, &ev, 0, NULL, &root);
            yaml_event_delete(&ev);
            if (rc)
                return rc;
            continue;
        }
        yaml_event_delete(&ev);
    }
    if (rc) {
        kv_ytree_free(root);
        return rc;
    }
    if (!root) {
        yaml_mark_t m = {0, 0, 0};
        root = node_new(KV_YMAP, b->file, &m); /* an empty file is an empty mapping */
    }
    *out = root;
    return KV_OK;
}

/* Parses len bytes of text (not necessarily NUL-terminated). */
static int load_text(const char *text, size_t len, const char *origin, kv_ynode **out, kv_error *err)
{
    *out = NULL;
    builder b = {.file = origin, .err = err};
    if (!yaml_parser_initialize(&b.parser))
        return kv_error_set(err, KV_EFAIL, "%s: cannot initialise the YAML parser", origin);
    yaml_parser_set_input_string(&b.parser, (const unsigned char *)text, len);
    int rc = build_document(&b, out);
    yaml_parser_delete(&b.parser);
    return rc;
}

int kv_ytree_load_file(const char *path, kv_ynode **out, kv_error *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = kv_input_read_all(path, "YAML file", KV_INPUT_MAX_TEXT, &text, &len, err);
    if (rc)
        return rc;
    rc = load_text(text, len, path, out, err);
    kv_free(text);
    return rc;
}

int kv_ytree_load_string(const char *text, const char *origin, kv_ynode **out, kv_error *err)
{
    return load_text(text, strlen(text), origin, out, err);
}

kv_ynode *kv_ytree_get(const kv_ynode *map, const char *key, size_t *index)
{
    if (!map || map->kind != KV_YMAP)
        return NULL;
    if (map->index) {
        size_t mask = map->index_cap - 1;
        for (size_t at = key_hash(key) & mask; map->index[at]; at = (at + 1) & mask) {
            size_t i = map->index[at] - 1;
            if (strcmp(map->keys[i], key) == 0) {
                if (index)
                    *index = i;
                return map->items[i];
            }
        }
        return NULL;
    }
    for (size_t i = 0; i < map->count; i++) {
        if (strcmp(map->keys[i], key) == 0) {
            if (index)
                *index = i;
            return map->items[i];
        }
    }
    return NULL;
}

kv_ynode *kv_ytree_path(const kv_ynode *root, const char *dotted)
{
    char part[256];
    const kv_ynode *n = root;
    const char *s = dotted;
    while (n && *s) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (len >= sizeof part)
            return NULL;
        memcpy(part, s, len);
        part[len] = '\0';
        n = kv_ytree_get(n, part, NULL);
        s = dot ? dot + 1 : s + len;
    }
    return (kv_ynode *)n;
}

int kv_ytree_remove(kv_ynode *map, const char *key)
{
    size_t at = 0;
    if (!map || map->kind != KV_YMAP || !kv_ytree_get(map, key, &at))
        return 0;
    kv_free(map->keys[at]);
    kv_ytree_free(map->items[at]);
    for (size_t i = at + 1; i < map->count; i++) { /* keeps the order of the rest */
        map->keys[i - 1] = map->keys[i];
        map->key_lines[i - 1] = map->key_lines[i];
        map->key_cols[i - 1] = map->key_cols[i];
        map->items[i - 1] = map->items[i];
    }
    map->count--;
    /* Positions moved: rebuild the index (or drop it when the mapping is small again). */
    kv_free(map->index);
    map->index = NULL;
    map->index_cap = 0;
    index_grow(map);
    return 1;
}

int kv_ytree_set(kv_ynode *root, const char *dotted, kv_ynode *value, kv_error *err)
{
    char part[256];
    kv_ynode *n = root;
    const char *s = dotted;
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (len == 0 || len >= sizeof part) {
            kv_ytree_free(value);
            return kv_error_set(err, KV_EINPUT, "--set %s: empty or too long key in the path", dotted);
        }
        memcpy(part, s, len);
        part[len] = '\0';
        if (n->kind != KV_YMAP) {
            kv_ytree_free(value);
            return kv_error_set(err, KV_EINPUT, "--set %s: '%s' is inside a value that is not a mapping (%s:%d:%d)",
                                dotted, part, n->file, n->line, n->col);
        }
        size_t idx;
        kv_ynode *child = kv_ytree_get(n, part, &idx);
        if (!dot) {
            if (child) {
                kv_ytree_free(child);
                n->items[idx] = value;
            } else {
                append(n, value, kv_strdup(part), value->line, value->col);
            }
            return KV_OK;
        }
        if (!child) {
            yaml_mark_t m = {0, (size_t)value->line - 1, (size_t)value->col - 1};
            child = node_new(KV_YMAP, value->file, &m);
            append(n, child, kv_strdup(part), value->line, value->col);
        }
        n = child;
        s = dot + 1;
    }
}

const char *kv_ytree_where(const kv_ynode *node, char *buf, size_t size)
{
    if (strncmp(node->file, "--set", 5) == 0) /* a value from the command line has no file position */
        snprintf(buf, size, "%s", node->file);
    else
        snprintf(buf, size, "%s:%d:%d", node->file, node->line, node->col);
    return buf;
}
