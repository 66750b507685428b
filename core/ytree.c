/* ytree.c — build a kv_ynode tree from libyaml's event stream. */
#include "core/ytree.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "core/alloc.h"

/* Nesting deeper than this is rejected: scenarios are shallow, and a bound
   keeps hostile input from exhausting the stack. */
#define KV_YTREE_MAX_DEPTH 64

typedef struct builder {
    yaml_parser_t parser;
    const char *file;
    kv_error *err;
} builder;

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

static void append(kv_ynode *parent, kv_ynode *child, char *key, int line, int col)
{
    size_t cap = parent->count; /* exact-size growth keeps ownership simple */
    parent->items = kv_realloc(parent->items, (cap + 1) * sizeof *parent->items);
    parent->items[cap] = child;
    if (parent->kind == KV_YMAP) {
        parent->keys = kv_realloc(parent->keys, (cap + 1) * sizeof *parent->keys);
        parent->key_lines = kv_realloc(parent->key_lines, (cap + 1) * sizeof *parent->key_lines);
        parent->key_cols = kv_realloc(parent->key_cols, (cap + 1) * sizeof *parent->key_cols);
        parent->keys[cap] = key;
        parent->key_lines[cap] = line;
        parent->key_cols[cap] = col;
    }
    parent->count = cap + 1;
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
        int kline = (int)ev.start_mark.line + 1, kcol = (int)ev.start_mark.column + 1;
        if (memchr(ev.data.scalar.value, '\0', ev.data.scalar.length)) {
            yaml_event_delete(&ev);
            return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: a key holds a NUL character (\\0); keys and values "
                                "are text without NUL", b->file, kline, kcol);
        }
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
    switch (ev->type) {
    case YAML_SCALAR_EVENT: {
        if (memchr(ev->data.scalar.value, '\0', ev->data.scalar.length))
            return kv_error_set(b->err, KV_EINPUT, "%s:%d:%d: %s%sa value holds a NUL character (\\0); keys and "
                                "values are text without NUL", b->file, line, col, key ? key : "", key ? ": " : "");
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
        int rc = build_children(b, n, depth);
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

int kv_ytree_load_file(const char *path, kv_ynode **out, kv_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kv_error_set(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    builder b = {.file = path, .err = err};
    if (!yaml_parser_initialize(&b.parser)) {
        fclose(f);
        return kv_error_set(err, KV_EFAIL, "%s: cannot initialise the YAML parser", path);
    }
    yaml_parser_set_input_file(&b.parser, f);
    int rc = build_document(&b, out);
    yaml_parser_delete(&b.parser);
    fclose(f);
    return rc;
}

int kv_ytree_load_string(const char *text, const char *origin, kv_ynode **out, kv_error *err)
{
    *out = NULL;
    builder b = {.file = origin, .err = err};
    if (!yaml_parser_initialize(&b.parser))
        return kv_error_set(err, KV_EFAIL, "%s: cannot initialise the YAML parser", origin);
    yaml_parser_set_input_string(&b.parser, (const unsigned char *)text, strlen(text));
    int rc = build_document(&b, out);
    yaml_parser_delete(&b.parser);
    return rc;
}

kv_ynode *kv_ytree_get(const kv_ynode *map, const char *key, size_t *index)
{
    if (!map || map->kind != KV_YMAP)
        return NULL;
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
