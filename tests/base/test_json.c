/* test_json.c — kv_json_format_number writes exactly the text of the original shortest-%g search, much faster. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/json.h"
#include "core/base/shortest.h"

/* The oracle: kv_json_number as it was (snprintf + strtod up to twelve times). */
static void oracle(char *buf, double v)
{
    if (!isfinite(v)) {
        strcpy(buf, "null");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, 40, "%.0f", v);
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, 40, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double from_bits(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1p-53; }

/* Counts mismatches, reporting the first few. */
static long failures;

static void check(double v)
{
    char want[40], got[KV_JSON_NUMBER_SIZE + 8];
    oracle(want, v);
    memset(got, 'X', sizeof got);
    size_t n = kv_json_format_number(got, v);
    if (n != strlen(want) || strcmp(got, want) != 0) {
        if (failures < 10)
            cr_log_error("%a (%.17g): got \"%s\" (length %zu), want \"%s\"", v, v, got, n, want);
        failures++;
    }
}

static void check_both_signs(double v)
{
    check(v);
    check(-v);
}

/* Sample counts scale with KVSIM_JSON_SAMPLES (default 1: about two million numbers). */
static long scaled(long n)
{
    const char *e = getenv("KVSIM_JSON_SAMPLES");
    long f = e ? atol(e) : 1;
    return n * (f > 0 ? f : 1);
}

Test(json_number, special_values)
{
    failures = 0;
    const double special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, DBL_MIN, DBL_MAX, DBL_TRUE_MIN, DBL_EPSILON,
                              1e15, 1e15 - 1, 1e15 + 0.5, 999999999999999.9, 1e16, 1e17, 1e21, 1e22, 1e23,
                              0x1p52, 0x1p53, 0x1p53 + 2, 0.1, 0.2, 0.3, 0.5, 1.0 / 3, 2.0 / 3, 123456.5, 1234567.5,
                              5e-324, 1e-5, 1e-4, 9.9999999999999e-5, 0.0001, 123456, 1234567.25, 1e-300, 1.7976931348623157e308,
                              4.35, 0.000123456, 100000.5, 999999.5, 9999995, 0.9999995, 1.0000005};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        check_both_signs(special[i]);
    char buf[KV_JSON_NUMBER_SIZE];
    cr_expect_str_eq((kv_json_format_number(buf, NAN), buf), "null");
    cr_expect_str_eq((kv_json_format_number(buf, -INFINITY), buf), "null");
    cr_expect_str_eq((kv_json_format_number(buf, -0.0), buf), "-0");
    cr_expect_str_eq((kv_json_format_number(buf, 0.1), buf), "0.1");
    cr_expect_str_eq((kv_json_format_number(buf, 1e15), buf), "1e+15");
    cr_expect_str_eq((kv_json_format_number(buf, 1.0 / 3), buf), "0.3333333333333333");
    cr_expect_str_eq((kv_json_format_number(buf, 1234567.5), buf), "1234567.5");
    cr_expect_str_eq((kv_json_format_number(buf, 5e-324), buf), "4.94066e-324");
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, powers_of_ten_and_two_and_neighbours)
{
    failures = 0;
    for (int e = -330; e <= 310; e++) {
        char s[16];
        snprintf(s, sizeof s, "1e%d", e);
        double v = strtod(s, NULL);
        for (int m = 1; m <= 9; m++) {
            double w = v * m;
            check_both_signs(w);
            check_both_signs(nextafter(w, 0));
            check_both_signs(nextafter(w, INFINITY));
        }
    }
    for (int e = -1074; e <= 1023; e++) {
        double v = ldexp(1.0, e);
        check_both_signs(v);
        check_both_signs(nextafter(v, 0));
        check_both_signs(nextafter(v, INFINITY));
        check_both_signs(v * 3);
    }
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, random_bit_patterns_and_subnormals, .timeout = 600)
{
    failures = 0;
    uint64_t s = 1;
    for (long i = 0; i < scaled(400000); i++)
        check(from_bits(splitmix(&s))); /* every exponent, NaNs and infinities included */
    for (long i = 0; i < scaled(100000); i++)
        check_both_signs(from_bits(splitmix(&s) >> 12)); /* subnormals */
    for (long i = 0; i < scaled(100000); i++) /* short mantissas: few significant bits, exact ties likely */
        check_both_signs(ldexp((double)(splitmix(&s) >> (64 - 1 - (int)(splitmix(&s) % 30))),
                               (int)(splitmix(&s) % 200) - 100));
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, simulator_like_values, .timeout = 600)
{
    failures = 0;
    uint64_t s = 2;
    for (long i = 0; i < scaled(200000); i++) {
        double t0 = uniform(&s) * 3600, t1 = t0 + uniform(&s) * 10;
        check(t0);                      /* times in seconds */
        check((t1 - t0) * 1e3);         /* durations in ms, like requests.csv */
        check((t1 - t0) * 1e3 / (1 + (int)(splitmix(&s) % 500)));
        check(uniform(&s));             /* fractions */
        check(uniform(&s) * 1e9 + 0.5); /* bytes, half-integers */
        check(ldexp(uniform(&s), (int)(splitmix(&s) % 120) - 60));
    }
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, consecutive_doubles_where_the_forms_change, .timeout = 600)
{
    /* Runs of adjacent doubles around the boundaries of the integer path, of %f/%e, and of 2^49..2^54
       where the interval's bounds are exact decimals (Ryu's q <= 1 case). */
    failures = 0;
    const double at[] = {1e15, 0x1p49, 0x1p50, 0x1p51, 0x1p52, 0x1p53, 0x1p54, 1e16, 1e17, 1e-4, 1e-5, 1e6, 1e7, 0.5};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        double up = at[i], down = at[i];
        for (long j = 0; j < scaled(20000); j++) {
            check_both_signs(up);
            check_both_signs(down);
            up = nextafter(up, INFINITY);
            down = nextafter(down, 0);
        }
    }
    uint64_t s = 6;
    for (long i = 0; i < scaled(200000); i++) /* anywhere in [2^48, 2^56) */
        check(ldexp(1.0 + uniform(&s), 48 + (int)(splitmix(&s) % 8)));
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, short_decimals_read_back, .timeout = 600)
{
    /* Decimals of 1 to 17 digits, as strtod reads them: short outputs, ties at every precision. */
    failures = 0;
    uint64_t s = 3;
    for (long i = 0; i < scaled(300000); i++) {
        int digits = 1 + (int)(splitmix(&s) % 17);
        uint64_t m = splitmix(&s) % 100000000000000000ULL;
        for (int d = digits; d < 17; d++)
            m /= 10;
        char text[48];
        snprintf(text, sizeof text, "%llue%d", (unsigned long long)m, (int)(splitmix(&s) % 60) - 30);
        double v = strtod(text, NULL);
        check_both_signs(v);
        check_both_signs(v + 0.5 * (v - nextafter(v, 0))); /* rounds to v or its neighbour */
    }
    cr_expect_eq(failures, 0, "%ld mismatches", failures);
}

Test(json_number, shortest_decimal_reads_back_and_is_short)
{
    /* Ryu on its own: the digits read back, and one digit fewer never does. */
    uint64_t s = 4;
    for (int i = 0; i < 100000; i++) {
        double v = fabs(from_bits(splitmix(&s)));
        if (!isfinite(v) || v == 0)
            continue;
        kv_decimal d = kv_shortest_decimal(v);
        char text[48];
        snprintf(text, sizeof text, "%llue%d", (unsigned long long)d.digits, d.exponent);
        cr_assert_eq(strtod(text, NULL), v, "%a: %s does not read back", v, text);
        cr_assert(d.digits % 10 != 0, "%a: %s has a trailing zero", v, text);
        if (d.n_digits > 1) {
            char shorter[48];
            snprintf(shorter, sizeof shorter, "%.*e", d.n_digits - 2, v);
            cr_assert_neq(strtod(shorter, NULL), v, "%a: %s is shorter than %s", v, shorter, text);
        }
    }
}

Test(json_number, writes_through_a_file)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    kv_json_number(f, 0.1);
    fputc(',', f);
    kv_json_number(f, -0.0);
    fputc(',', f);
    kv_json_number(f, NAN);
    fputc(',', f);
    kv_json_number(f, 12.345678901234567);
    fclose(f);
    cr_expect_str_eq(text, "0.1,-0,null,12.345678901234567");
    free(text);
}

static double cpu_seconds(void) { return (double)clock() / CLOCKS_PER_SEC; }

Test(json_number, much_faster_than_the_search)
{
    /* The point of the change: CPU time, not wall time, so a loaded machine does not matter much. */
    enum { N = 20000 };
    static double v[N];
    uint64_t s = 5;
    for (int i = 0; i < N; i++)
        v[i] = uniform(&s) * 3600;
    char buf[48];
    size_t sink = 0;
    double t0 = cpu_seconds();
    for (int i = 0; i < N; i++) {
        oracle(buf, v[i]);
        sink += (unsigned char)buf[0];
    }
    double t_search = cpu_seconds() - t0;
    t0 = cpu_seconds();
    for (int r = 0; r < 10; r++)
        for (int i = 0; i < N; i++)
            sink += kv_json_format_number(buf, v[i]);
    double t_fast = (cpu_seconds() - t0) / 10;
    cr_log_info("search %.0f ns, fast %.0f ns per number (sink %zu)", t_search / N * 1e9, t_fast / N * 1e9, sink);
    cr_expect(t_fast * 5 < t_search, "fast %.3g s vs search %.3g s: less than 5x faster", t_fast, t_search);
}

/* kv_json_string as it was: one fputc per character. */
static void string_oracle(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

Test(json_string, escapes_exactly_as_before)
{
    uint64_t s = 8;
    const char *fixed[] = {"", "plain", "\"", "\\", "a\"b\\c\nd\re\tf\x01g\x1f", "\xc3\xa9 caf\xc3\xa9", "end\\"};
    for (int i = 0; i < 20000; i++) {
        char text[64];
        if (i < (int)(sizeof fixed / sizeof fixed[0])) {
            snprintf(text, sizeof text, "%s", fixed[i]);
        } else {
            int len = (int)(splitmix(&s) % 40);
            for (int j = 0; j < len; j++) {
                uint64_t r = splitmix(&s);
                unsigned c = r % 4 == 0   ? 1 + (unsigned)((r >> 8) % 0x21)           /* control characters, space */
                             : r % 4 == 1 ? (unsigned char)"\"\\\n\t"[(r >> 8) % 4] /* escaped ones */
                                          : 1 + (unsigned)((r >> 8) % 255);         /* any byte but NUL */
                text[j] = (char)c;
            }
            text[len] = '\0';
        }
        char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
        kv_json_string(fa, text);
        string_oracle(fb, text);
        fclose(fa);
        fclose(fb);
        cr_assert(la == lb && memcmp(a, b, la) == 0, "string %d: got %s, want %s", i, a, b);
        free(a);
        free(b);
    }
}

Test(json_int, formats_as_lld)
{
    const long long v[] = {0, 1, -1, 9, 10, -10, 123456789, -987654321, 2147483647LL, -2147483648LL,
                           9223372036854775807LL, -9223372036854775807LL - 1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char got[32], want[32];
        size_t n = kv_json_format_int(got, v[i]);
        snprintf(want, sizeof want, "%lld", v[i]);
        cr_expect_str_eq(got, want);
        cr_expect_eq(n, strlen(want));
    }
}
