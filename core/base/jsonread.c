/* jsonread.c — strict recursive-descent JSON parser with positions (see jsonread.h). */
#include "core/base/jsonread.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"

typedef struct parser {
    const unsigned char *p, *end;
    const unsigned char *line_start;
    int line;
    const char *origin;
    kv_error *err;
} parser;

static int col_of(const parser *ps, const unsigned char *at)
{
    /* Columns count bytes: good enough to find the place in an editor. */
    return (int)(at - ps->line_start) + 1;
}

static int fail_at(parser *ps, const unsigned char *at, const char *what)
{
    if (at >= ps->end)
        return kv_error_set(ps->err, KV_EINPUT, "%s:%d:%d: %s (at end of input)", ps->origin, ps->line,
                            col_of(ps, at), what);
    char shown[8];
    unsigned char c = *at;
    if (c >= 0x20 && c < 0x7f)
        snprintf(shown, sizeof shown, "'%c'", c);
    else
        snprintf(shown, sizeof shown, "0x%02x", c);
    return kv_error_set(ps->err, KV_EINPUT, "%s:%d:%d: %s (found %s)", ps->origin, ps->line, col_of(ps, at), what,
                        shown);
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end) {
        unsigned char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->p++;
            ps->line_start = ps->p;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            ps->p++;
        } else {
            break;
        }
    }
}

static kv_jvalue *new_value(parser *ps, kv_jkind kind)
{
    kv_jvalue *v = kv_calloc(1, sizeof *v);
    v->kind = kind;
    v->line = ps->line;
    v->col = col_of(ps, ps->p);
    return v;
}

static int literal(parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return fail_at(ps, ps->p, "expected a JSON value");
    ps->p += n;
    return KV_OK;
}

/* Length of the valid UTF-8 sequence at p (1-4), or 0 if invalid. */
static int utf8_length(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    int n;
    unsigned min;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (end - p < n)
        return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

static void put_utf8(char *buf, size_t *n, unsigned cp)
{
    if (cp < 0x80) {
        buf[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        buf[(*n)++] = (char)(0xc0 | (cp >> 6));
        buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        buf[(*n)++] = (char)(0xe0 | (cp >> 12));
        buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        buf[(*n)++] = (char)(0xf0 | (cp >> 18));
        buf[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static int hex4(parser *ps, const unsigned char *at, unsigned *out)
{
    if (ps->end - at < 4)
        return fail_at(ps, ps->end, "\\u needs four hex digits");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = at[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail_at(ps, at + i, "\\u needs four hex digits");
    }
    *out = v;
    return KV_OK;
}

/* Parses a string at ps->p (the opening quote); *out gets the decoded bytes (owned). */
static int parse_string(parser *ps, char **out, size_t *out_len)
{
    const unsigned char *start = ++ps->p;
    /* Decoded text is never longer than the source. */
    const unsigned char *q = start;
    while (q < ps->end && *q != '"') {
        if (*q == '\\' && q + 1 < ps->end)
            q++;
        q++;
    }
    char *buf = kv_malloc((size_t)(q - start) + 1);
    size_t n = 0;
    int rc = KV_OK;
    for (;;) {
        if (ps->p >= ps->end) {
            rc = fail_at(ps, ps->p, "unterminated string");
            break;
        }
        unsigned char c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            rc = fail_at(ps, ps->p, "control character in a string (escape it)");
            break;
        }
        if (c != '\\') {
            int len = utf8_length(ps->p, ps->end);
            if (len == 0) {
                rc = fail_at(ps, ps->p, "invalid UTF-8 in a string");
                break;
            }
            memcpy(buf + n, ps->p, (size_t)len);
            n += (size_t)len;
            ps->p += len;
            continue;
        }
        const unsigned char *esc = ps->p++;
        if (ps->p >= ps->end) {
            rc = fail_at(ps, ps->p, "unterminated escape");
            break;
        }
        c = *ps->p++;
        switch (c) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            rc = hex4(ps, ps->p, &cp);
            if (rc)
                break;
            ps->p += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                rc = fail_at(ps, esc, "lone low surrogate in \\u escape");
                break;
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned lo;
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    rc = fail_at(ps, esc, "high surrogate not followed by a \\u low surrogate");
                    break;
                }
                rc = hex4(ps, ps->p + 2, &lo);
                if (rc)
                    break;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    rc = fail_at(ps, esc, "high surrogate not followed by a low surrogate");
                    break;
                }
                ps->p += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            /* A \uXXXX escape decodes to at most 4 bytes from 6 (or 12) source bytes: it fits. */
            put_utf8(buf, &n, cp);
            break;
        }
        default:
            rc = fail_at(ps, esc, "unknown escape in a string");
        }
        if (rc)
            break;
    }
    if (rc) {
        kv_free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    if (out_len)
        *out_len = n;
    return KV_OK;
}

static int parse_number(parser *ps, kv_jvalue *v)
{
    const unsigned char *s = ps->p, *p = ps->p;
    if (p < ps->end && *p == '-')
        p++;
    if (p >= ps->end || *p < '0' || *p > '9')
        return fail_at(ps, p, "expected a digit");
    if (*p == '0') {
        p++;
        if (p < ps->end && *p >= '0' && *p <= '9')
            return fail_at(ps, p, "leading zeros are not allowed");
    } else {
        while (p < ps->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < ps->end && *p == '.') {
        p++;
        if (p >= ps->end || *p < '0' || *p > '9')
            return fail_at(ps, p, "expected a digit after '.'");
        while (p < ps->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < ps->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= ps->end || *p < '0' || *p > '9')
            return fail_at(ps, p, "expected a digit in the exponent");
        while (p < ps->end && *p >= '0' && *p <= '9')
            p++;
    }
    v->text = kv_strndup((const char *)s, (size_t)(p - s));
    errno = 0;
    v->number = strtod(v->text, NULL);
    ps->p = p;
    return KV_OK;
}

static int parse_value(parser *ps, kv_jvalue **out, int depth);

static int parse_container(parser *ps, kv_jvalue *v, int depth)
{
    int object = v->kind == KV_JOBJECT;
    unsigned char close = object ? '}' : ']';
    size_t cap = 0, cap_keys = 0;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return KV_OK;
    }
    for (;;) {
        skip_ws(ps);
        char *key = NULL;
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"')
                return fail_at(ps, ps->p, "expected a \"key\" in an object");
            int rc = parse_string(ps, &key, NULL);
            if (rc)
                return rc;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                kv_free(key);
                return fail_at(ps, ps->p, "expected ':' after an object key");
            }
            ps->p++;
        }
        kv_jvalue *item = NULL;
        int rc = parse_value(ps, &item, depth + 1);
        if (rc) {
            kv_free(key);
            return rc;
        }
        kv_grow((void **)&v->items, sizeof *v->items, &cap, v->count + 1);
        if (object)
            kv_grow((void **)&v->keys, sizeof *v->keys, &cap_keys, v->count + 1);
        v->items[v->count] = item;
        if (object)
            v->keys[v->count] = key;
        v->count++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == close)
                return fail_at(ps, ps->p, "trailing comma");
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return KV_OK;
        }
        return fail_at(ps, ps->p, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
    }
}

static int parse_value(parser *ps, kv_jvalue **out, int depth)
{
    *out = NULL;
    if (depth > KV_JREAD_MAX_DEPTH)
        return fail_at(ps, ps->p, "nested too deeply");
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail_at(ps, ps->p, "expected a JSON value");
    int rc = KV_OK;
    kv_jvalue *v = NULL;
    switch (*ps->p) {
    case '{':
    case '[':
        v = new_value(ps, *ps->p == '{' ? KV_JOBJECT : KV_JARRAY);
        rc = parse_container(ps, v, depth);
        break;
    case '"':
        v = new_value(ps, KV_JSTRING);
        rc = parse_string(ps, &v->text, &v->length);
        break;
    case 't':
        v = new_value(ps, KV_JBOOL);
        v->boolean = 1;
        rc = literal(ps, "true");
        break;
    case 'f':
        v = new_value(ps, KV_JBOOL);
        rc = literal(ps, "false");
        break;
    case 'n':
        v = new_value(ps, KV_JNULL);
        rc = literal(ps, "null");
        break;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) {
            v = new_value(ps, KV_JNUMBER);
            rc = parse_number(ps, v);
        } else {
            return fail_at(ps, ps->p, "expected a JSON value");
        }
    }
    if (rc) {
        kv_jvalue_free(v);
        return rc;
    }
    *out = v;
    return KV_OK;
}

int kv_jread_parse(const char *text, size_t len, const char *origin, kv_jvalue **out, kv_error *err)
{
    parser ps = {(const unsigned char *)text, (const unsigned char *)text + len, (const unsigned char *)text, 1,
                 origin, err};
    *out = NULL;
    kv_jvalue *v = NULL;
    int rc = parse_value(&ps, &v, 0);
    if (!rc) {
        skip_ws(&ps);
        if (ps.p < ps.end)
            rc = fail_at(&ps, ps.p, "unexpected text after the JSON value");
    }
    if (rc) {
        kv_jvalue_free(v);
        return rc;
    }
    *out = v;
    return KV_OK;
}

int kv_jread_file(const char *path, kv_jvalue **out, kv_error *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t n = 0;
    int rc = kv_input_read_all(path, "JSON file", KV_INPUT_MAX_JSON, &buf, &n, err);
    if (!rc)
        rc = kv_jread_parse(buf, n, path, out, err);
    kv_free(buf);
    return rc;
}

void kv_jvalue_free(kv_jvalue *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->count; i++) {
        kv_jvalue_free(v->items[i]);
        if (v->keys)
            kv_free(v->keys[i]);
    }
    kv_free(v->items);
    kv_free(v->keys);
    kv_free(v->text);
    kv_free(v);
}

const kv_jvalue *kv_jvalue_get(const kv_jvalue *obj, const char *key)
{
    if (!obj || obj->kind != KV_JOBJECT)
        return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}
