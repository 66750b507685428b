/* jsonread.h — a small strict JSON reader (RFC 8259): kvsim's own outputs read back for sweeps and tests.
 *
 * Strict means: UTF-8 checked, no trailing commas, no comments, no leading
 * zeros, no NaN/Infinity, control characters in strings rejected, escapes
 * checked (including \u surrogate pairs), nothing but whitespace after the
 * value, nesting at most KV_JREAD_MAX_DEPTH deep. Errors say
 * "origin:line:col: what". Object keys keep their order; duplicate keys are
 * kept as written (kv_jvalue_get returns the first).
 */
#ifndef KV_JSONREAD_H
#define KV_JSONREAD_H

#include <stddef.h>

#include "core/base/error.h"

#define KV_JREAD_MAX_DEPTH 256

typedef enum kv_jkind {
    KV_JNULL = 0,
    KV_JBOOL,
    KV_JNUMBER,
    KV_JSTRING,
    KV_JARRAY,
    KV_JOBJECT,
} kv_jkind;

typedef struct kv_jvalue kv_jvalue;
struct kv_jvalue {
    kv_jkind kind;
    int boolean;        /* KV_JBOOL: 0 or 1 */
    double number;      /* KV_JNUMBER: the value (strtod of text) */
    char *text;         /* KV_JNUMBER: the number as written; KV_JSTRING: the decoded UTF-8 (may hold NULs: see length) */
    size_t length;      /* KV_JSTRING: bytes in text, without the terminating NUL */
    char **keys;        /* KV_JOBJECT: [count] decoded keys */
    kv_jvalue **items;  /* KV_JOBJECT: values [count]; KV_JARRAY: elements [count] */
    size_t count;
    int line, col;      /* 1-based position of the value's first character */
};

/* Parses text[0..len). On success *out owns the tree (kv_jvalue_free);
   on failure *out is NULL and err says where. `origin` names the text in errors. */
int kv_jread_parse(const char *text, size_t len, const char *origin, kv_jvalue **out, kv_error *err);
/* Reads and parses a whole file. */
int kv_jread_file(const char *path, kv_jvalue **out, kv_error *err);
void kv_jvalue_free(kv_jvalue *v); /* NULL is fine */

/* Object member by key, or NULL (also when obj is not an object). */
const kv_jvalue *kv_jvalue_get(const kv_jvalue *obj, const char *key);

#endif
