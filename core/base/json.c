/* json.c — JSON string escaping and exact, deterministic number formatting.
 *
 * Design notes (numbers).
 *  The text of a number is defined by the original algorithm, kept verbatim in
 *  json_number_by_search (and in tests/base/test_json.c as the oracle): integers
 *  below 1e15 as %.0f, otherwise the first %.{6..17}g that strtod reads back to
 *  the same double. The fast path produces the same bytes without printf:
 *  for a normal double whose stored mantissa is not zero, the rounding
 *  interval is symmetric and narrower than the spacing of 15-digit decimals, so
 *  (1) %.Pg reads back exactly when some P-digit decimal lies in the interval,
 *  i.e. when P >= k, the length of the shortest one (core/base/shortest.c), and
 *  (2) at P = max(6, k) the correctly rounded P digits are the shortest digits
 *  followed by zeros, which %g strips. So the text is the shortest digits,
 *  laid out as %g lays out P = max(6, k) significant digits. Powers of two
 *  (asymmetric interval) and subnormals (wide interval) take the search.
 */
#include "core/base/json.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/shortest.h"

void kv_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    const unsigned char *run = (const unsigned char *)s; /* characters written as they are, not yet written */
    const unsigned char *p = run;
    for (; *p; p++) {
        if (*p >= 0x20 && *p != '"' && *p != '\\')
            continue;
        fwrite(run, 1, (size_t)(p - run), out);
        run = p + 1;
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default: fprintf(out, "\\u%04x", *p);
        }
    }
    fwrite(run, 1, (size_t)(p - run), out);
    fputc('"', out);
}

/* The defining algorithm: the shortest %.*g (6 to 17 digits) that reads back. */
static size_t json_number_by_search(char *buf, double v)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, KV_JSON_NUMBER_SIZE, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return strlen(buf);
}

/* Decimal digits of v (< 10^20) into p, most significant first; returns the count. */
static int put_digits(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

size_t kv_json_format_number(char *buf, double v)
{
    if (!isfinite(v)) {
        memcpy(buf, "null", 5);
        return 4;
    }
    char *p = buf;
    if (v == floor(v) && fabs(v) < 1e15) {
        /* As %.0f: the integer, with "-0" for negative zero. */
        if (signbit(v))
            *p++ = '-';
        p += put_digits(p, (uint64_t)fabs(v));
        *p = '\0';
        return (size_t)(p - buf);
    }
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & ((1ull << 52) - 1)) == 0 || ((bits >> 52) & 0x7ff) == 0)
        return json_number_by_search(buf, v); /* a power of two, or subnormal */

    kv_decimal d = kv_shortest_decimal(v);
    char digits[20];
    int k = put_digits(digits, d.digits);
    int x = k - 1 + d.exponent; /* decimal exponent of the first digit */
    int prec = k > 6 ? k : 6;
    if (v < 0)
        *p++ = '-';
    if (x < -4 || x >= prec) {
        /* %e style: d[.ddd]e±XX */
        *p++ = digits[0];
        if (k > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, (size_t)(k - 1));
            p += k - 1;
        }
        *p++ = 'e';
        *p++ = x < 0 ? '-' : '+';
        int ax = x < 0 ? -x : x;
        if (ax < 10)
            *p++ = '0';
        p += put_digits(p, (uint64_t)ax);
    } else if (x >= 0) {
        /* %f style, x + 1 digits before the point. */
        if (k <= x + 1) {
            memcpy(p, digits, (size_t)k);
            p += k;
            memset(p, '0', (size_t)(x + 1 - k));
            p += x + 1 - k;
        } else {
            memcpy(p, digits, (size_t)(x + 1));
            p += x + 1;
            *p++ = '.';
            memcpy(p, digits + x + 1, (size_t)(k - x - 1));
            p += k - x - 1;
        }
    } else {
        /* 0.000ddd */
        *p++ = '0';
        *p++ = '.';
        memset(p, '0', (size_t)(-x - 1));
        p += -x - 1;
        memcpy(p, digits, (size_t)k);
        p += k;
    }
    *p = '\0';
    return (size_t)(p - buf);
}

size_t kv_json_format_uint(char *buf, unsigned long long v)
{
    size_t n = (size_t)put_digits(buf, v);
    buf[n] = '\0';
    return n;
}

size_t kv_json_format_int(char *buf, long long v)
{
    char *p = buf;
    if (v < 0)
        *p++ = '-';
    p += put_digits(p, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v);
    *p = '\0';
    return (size_t)(p - buf);
}

void kv_json_number(FILE *out, double v)
{
    char buf[KV_JSON_NUMBER_SIZE];
    fwrite(buf, 1, kv_json_format_number(buf, v), out);
}
