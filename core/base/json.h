/* json.h — writing JSON: escaped strings and numbers that read back exactly. */
#ifndef KV_JSON_H
#define KV_JSON_H

#include <stddef.h>
#include <stdio.h>

/* Room for any number's text and its NUL ("-2.2250738585072014e-308" is 24 bytes). */
#define KV_JSON_NUMBER_SIZE 32

void kv_json_string(FILE *out, const char *s);  /* "..." with escapes */
void kv_json_number(FILE *out, double v);       /* shortest exact form; null for NaN/Inf */
/* The text kv_json_number writes, NUL-terminated in buf[KV_JSON_NUMBER_SIZE]; returns its length.
   Integers below 1e15 as %.0f ("-0" for negative zero), others as the shortest %.Pg
   (6 <= P <= 17) that strtod reads back to v; "null" for NaN and infinities. */
size_t kv_json_format_number(char *buf, double v);
/* v as %lld into buf (at least 21 bytes), NUL-terminated; returns its length. */
size_t kv_json_format_int(char *buf, long long v);
/* v as %llu into buf (at least 21 bytes), NUL-terminated; returns its length. */
size_t kv_json_format_uint(char *buf, unsigned long long v);

#endif
