/* json.h — writing JSON: escaped strings and numbers that read back exactly. */
#ifndef KV_JSON_H
#define KV_JSON_H

#include <stdio.h>

void kv_json_string(FILE *out, const char *s);  /* "..." with escapes */
void kv_json_number(FILE *out, double v);       /* shortest exact form; null for NaN/Inf */

#endif
