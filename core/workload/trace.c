/* trace.c — strict readers for public LLM-inference traces (Azure 2023 CSV, Mooncake JSONL, BurstGPT CSV).
 *
 * Every reader works line by line (getline, so no line is ever truncated) and
 * checks everything it uses: the header, the field count, each number (not
 * empty, not NaN, not negative, integer token counts >= 1), and that times
 * never go backwards. The first problem ends the read with
 * "path:line:col: field: what is wrong" and no partial result. CRLF line ends,
 * a UTF-8 byte-order mark and blank lines at the end of the file are accepted;
 * a blank line followed by more data is not.
 *
 * Ranges (trace.h): a time is at most KV_TRACE_MAX_TIME_S after the first row
 * (also after time_scale), a token count at most KV_TRACE_MAX_TOKENS, a trace at
 * most KV_WORKLOAD_MAX_REQUESTS rows; the file is a regular file of at most
 * KV_INPUT_MAX_TRACE bytes (infile.h). A header that does not match is reported
 * without quoting it: the file may not be a trace at all.
 *
 * Times come back relative to the first row, so a sample cut from the middle of
 * a long trace starts at 0 s like one cut from its start.
 */
#include "core/workload/trace.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"

/* One field of a CSV line: a span of the line buffer (quotes stripped). */
typedef struct csv_field {
    const char *text; /* not NUL-terminated */
    size_t len;       /* bytes */
    int col;          /* 1-based byte column where the field starts */
} csv_field;

/* The state of one read: the file, the current line and where the rows go. */
typedef struct trace_reader {
    const char *path;
    FILE *file;
    char *line;          /* current line, CR/LF stripped, NUL-terminated */
    size_t line_cap;     /* getline's buffer size, bytes */
    size_t line_len;     /* bytes in line */
    long line_no;        /* 1-based number of the current line */
    long blank_line_no;  /* first blank line not yet followed by data (0 = none) */
    csv_field *fields;   /* the current line split at commas */
    size_t n_fields, fields_cap;
    kv_request_spec *rows; /* accepted requests so far */
    size_t n_rows, rows_cap;
    double first_t;      /* raw time of the first accepted row */
    double prev_t;       /* raw time of the previous accepted row */
    long last_row_line;  /* line of the last accepted row */
    kv_error *err;
} trace_reader;

/* Azure date-times are absolute; they are kept as whole seconds plus a
   fraction so that differences keep their 100 ns digits (a double holding
   ~1.7e9 s would keep only ~0.2 us). */
typedef struct azure_time {
    long long whole_s; /* seconds since 1970-01-01 00:00:00 UTC */
    double frac_s;     /* [0, 1) */
} azure_time;

static int trace_fail(trace_reader *r, int col, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sets "path:line:col: field: message" and returns KV_EINPUT. */
static int trace_fail(trace_reader *r, int col, const char *field, const char *fmt, ...)
{
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (field)
        return kv_error_set(r->err, KV_EINPUT, "%s:%ld:%d: %s: %s", r->path, r->line_no, col, field, what);
    return kv_error_set(r->err, KV_EINPUT, "%s:%ld:%d: %s", r->path, r->line_no, col, what);
}

/* Quotes a field for a message, shortened to keep the message readable. */
static void quote_field(char *out, size_t out_size, const char *text, size_t len)
{
    size_t max = 40;
    if (len > max)
        snprintf(out, out_size, "'%.*s...'", (int)max, text);
    else
        snprintf(out, out_size, "'%.*s'", (int)len, text);
}

/* Reads the next line into r->line. Returns 1 for a line, 0 at the end of the
   file, or -1 with the error code in *status. */
static int next_line(trace_reader *r, int *status)
{
    errno = 0;
    ssize_t got = getline(&r->line, &r->line_cap, r->file);
    if (got < 0) {
        if (ferror(r->file)) {
            *status = kv_error_set(r->err, KV_EFAIL, "%s:%ld: read error: %s", r->path, r->line_no + 1,
                                   strerror(errno ? errno : EIO));
            return -1;
        }
        return 0;
    }
    r->line_no++;
    size_t len = (size_t)got;
    if (len > 0 && r->line[len - 1] == '\n')
        len--;
    if (len > 0 && r->line[len - 1] == '\r')
        len--;
    r->line[len] = '\0';
    r->line_len = len;
    if (strlen(r->line) != len) {
        *status = trace_fail(r, (int)strlen(r->line) + 1, NULL, "NUL byte in line (not a text file?)");
        return -1;
    }
    if (r->line_no == 1 && len >= 3 && memcmp(r->line, "\xEF\xBB\xBF", 3) == 0) {
        memmove(r->line, r->line + 3, len - 2); /* UTF-8 byte-order mark, with the NUL */
        r->line_len = len - 3;
    }
    return 1;
}

/* Reads the next non-blank line. A blank line is only allowed at the end of the
   file; one followed by data is reported at the blank line. */
static int next_data_line(trace_reader *r, int *status)
{
    for (;;) {
        int got = next_line(r, status);
        if (got <= 0)
            return got;
        bool blank = true;
        for (size_t i = 0; i < r->line_len; i++)
            if (r->line[i] != ' ' && r->line[i] != '\t')
                blank = false;
        if (blank) {
            if (!r->blank_line_no)
                r->blank_line_no = r->line_no;
            continue;
        }
        if (r->blank_line_no) {
            r->line_no = r->blank_line_no;
            *status = trace_fail(r, 1, NULL, "empty line in the middle of the trace");
            return -1;
        }
        return 1;
    }
}

/* Splits r->line at commas into r->fields; "quoted, fields" keep their commas. */
static int split_csv(trace_reader *r)
{
    r->n_fields = 0;
    const char *p = r->line, *end = r->line + r->line_len;
    for (;;) {
        kv_grow((void **)&r->fields, sizeof *r->fields, &r->fields_cap, r->n_fields + 1);
        csv_field *f = &r->fields[r->n_fields++];
        f->col = (int)(p - r->line) + 1;
        if (p < end && *p == '"') {
            const char *q = p + 1;
            while (q < end && !(*q == '"' && (q + 1 >= end || q[1] != '"')))
                q += (*q == '"') ? 2 : 1; /* "" is an escaped quote */
            if (q >= end)
                return trace_fail(r, f->col, NULL, "unterminated quoted field");
            f->text = p + 1;
            f->len = (size_t)(q - p - 1);
            p = q + 1;
            if (p < end && *p != ',')
                return trace_fail(r, (int)(p - r->line) + 1, NULL, "text after a closing quote");
        } else {
            const char *q = p;
            while (q < end && *q != ',')
                q++;
            f->text = p;
            f->len = (size_t)(q - p);
            p = q;
        }
        if (p >= end)
            return KV_OK;
        p++; /* the comma */
    }
}

static bool field_is(const csv_field *f, const char *name)
{
    return f->len == strlen(name) && memcmp(f->text, name, f->len) == 0;
}

static bool span_is_nan(const char *s, size_t n)
{
    if (n > 0 && (*s == '-' || *s == '+'))
        s++, n--;
    return n == 3 && (s[0] == 'n' || s[0] == 'N') && (s[1] == 'a' || s[1] == 'A') && (s[2] == 'n' || s[2] == 'N');
}

static bool span_is_inf(const char *s, size_t n)
{
    if (n > 0 && (*s == '-' || *s == '+'))
        s++, n--;
    return (n == 3 && strncasecmp(s, "inf", 3) == 0) || (n == 8 && strncasecmp(s, "infinity", 8) == 0);
}

/* Parses a token count: decimal digits only. zero_ok lets BurstGPT see its
   failed requests (0 response tokens) instead of an error. */
static int parse_tokens(trace_reader *r, const char *s, size_t n, int col, const char *field, bool zero_ok,
                        int *out)
{
    char shown[64];
    quote_field(shown, sizeof shown, s, n);
    if (n == 0)
        return trace_fail(r, col, field, "empty (expected a token count)");
    if (span_is_nan(s, n))
        return trace_fail(r, col, field, "NaN is not a token count");
    if (s[0] == '-')
        return trace_fail(r, col, field, "negative token count %s", shown);
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return trace_fail(r, col, field, "%s is not a whole number of tokens", shown);
        v = v * 10 + (s[i] - '0');
        if (v > KV_TRACE_MAX_TOKENS)
            return trace_fail(r, col, field, "%s is too large (at most %d tokens)", shown, KV_TRACE_MAX_TOKENS);
    }
    if (v == 0 && !zero_ok)
        return trace_fail(r, col, field, "0 tokens (a request needs at least 1)");
    *out = (int)v;
    return KV_OK;
}

/* Parses a time in plain decimal notation (digits, optional fraction and
   exponent), >= 0 and finite. `unit` names the unit for messages. */
static int parse_time(trace_reader *r, const char *s, size_t n, int col, const char *field, double *out)
{
    char shown[64];
    quote_field(shown, sizeof shown, s, n);
    if (n == 0)
        return trace_fail(r, col, field, "empty (expected a time)");
    if (span_is_nan(s, n))
        return trace_fail(r, col, field, "time is NaN");
    if (span_is_inf(s, n))
        return trace_fail(r, col, field, "time is infinite");
    size_t i = 0, digits = 0;
    bool negative = false;
    if (s[i] == '-' || s[i] == '+')
        negative = s[i++] == '-';
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, digits++;
    }
    if (digits > 0 && i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1, exp_digits = 0;
        if (j < n && (s[j] == '-' || s[j] == '+'))
            j++;
        while (j < n && s[j] >= '0' && s[j] <= '9')
            j++, exp_digits++;
        if (exp_digits > 0)
            i = j;
    }
    if (digits == 0 || i != n)
        return trace_fail(r, col, field, "%s is not a number", shown);
    char *copy = kv_strndup(s, n); /* the span is not NUL-terminated in a CSV line */
    double v = strtod(copy, NULL);
    kv_free(copy);
    if (negative && v != 0.0)
        return trace_fail(r, col, field, "negative time %s", shown);
    if (!isfinite(v))
        return trace_fail(r, col, field, "time %s is too large", shown);
    *out = negative ? 0.0 : v; /* "-0" is 0 */
    return KV_OK;
}

/* Appends one request after checking that time does not go backwards.
   t is the row's raw time in seconds (Azure: relative to its first row). */
static int add_row(trace_reader *r, double t, int col, const char *field, int prompt, int output)
{
    if (r->n_rows > 0 && t < r->prev_t)
        return trace_fail(r, col, field, "time goes backwards, %.9g s before the previous row (the trace "
                          "must be sorted by time)", r->prev_t - t);
    /* t is >= 0 and finite (parse_time); past the cap, simulated times would lose their microseconds. */
    if (t > KV_TRACE_MAX_TIME_S || (r->n_rows > 0 && t - r->first_t > KV_TRACE_MAX_TIME_S))
        return trace_fail(r, col, field, "time %.9g s is past the %.0e s (about 31 years) kvsim keeps exact",
                          r->n_rows > 0 ? t - r->first_t : t, KV_TRACE_MAX_TIME_S);
    if (r->n_rows >= KV_WORKLOAD_MAX_REQUESTS)
        return trace_fail(r, 1, NULL, "more than %d rows (set workload.requests to read fewer)",
                          KV_WORKLOAD_MAX_REQUESTS);
    r->last_row_line = r->line_no;
    if (r->n_rows == 0)
        r->first_t = t;
    r->prev_t = t;
    kv_grow((void **)&r->rows, sizeof *r->rows, &r->rows_cap, r->n_rows + 1);
    kv_request_spec *q = &r->rows[r->n_rows];
    q->id = r->n_rows;
    q->arrival_s = t - r->first_t;
    q->prompt_tokens = prompt;
    q->output_tokens = output;
    r->n_rows++;
    return KV_OK;
}

/* ---- Azure LLM inference trace 2023: TIMESTAMP,ContextTokens,GeneratedTokens ---- */

static const char azure_header[] = "TIMESTAMP,ContextTokens,GeneratedTokens";

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar
   (era arithmetic: 400-year eras of 146097 days, years starting in March). */
static long long days_from_civil(long long y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(long long y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* Consumes one of the characters any_of at s[*i]; false if none is there. */
static bool take_char(const char *s, size_t n, size_t *i, const char *any_of)
{
    if (*i >= n || !strchr(any_of, s[*i]))
        return false;
    (*i)++;
    return true;
}

/* Reads exactly `count` digits at s[*i]; false if they are not there. */
static bool take_digits(const char *s, size_t n, size_t *i, int count, long long *out)
{
    long long v = 0;
    for (int k = 0; k < count; k++, (*i)++) {
        if (*i >= n || s[*i] < '0' || s[*i] > '9')
            return false;
        v = v * 10 + (s[*i] - '0');
    }
    *out = v;
    return true;
}

/* Parses "YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]" (a 'T' may replace
   the space); the offset, if any, is taken out so the result is UTC. */
static int parse_azure_time(trace_reader *r, const csv_field *f, azure_time *out)
{
    const char *s = f->text;
    size_t n = f->len, i = 0;
    char shown[64];
    quote_field(shown, sizeof shown, s, n);
    if (n == 0)
        return trace_fail(r, f->col, "TIMESTAMP", "empty (expected a date-time like 2023-11-16 18:15:46.6805900)");
    if (span_is_nan(s, n))
        return trace_fail(r, f->col, "TIMESTAMP", "time is NaN");
    if (s[0] == '-')
        return trace_fail(r, f->col, "TIMESTAMP", "negative time %s", shown);
    long long year, month, day, hour, minute, second;
    bool ok = take_digits(s, n, &i, 4, &year) && take_char(s, n, &i, "-") && take_digits(s, n, &i, 2, &month) &&
              take_char(s, n, &i, "-") && take_digits(s, n, &i, 2, &day) && take_char(s, n, &i, " T") &&
              take_digits(s, n, &i, 2, &hour) && take_char(s, n, &i, ":") && take_digits(s, n, &i, 2, &minute) &&
              take_char(s, n, &i, ":") && take_digits(s, n, &i, 2, &second);
    double frac = 0.0;
    if (ok && i < n && s[i] == '.') {
        double scale = 0.1;
        size_t start = ++i;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, scale *= 0.1)
            frac += (s[i] - '0') * scale;
        ok = i > start;
    }
    long long offset_s = 0;
    if (ok && i < n && s[i] == 'Z') {
        i++;
    } else if (ok && i < n && (s[i] == '+' || s[i] == '-')) {
        /* The zone offset is read whole before it is used: a malformed one is
           an error of its own, never a number made of unread digits. */
        size_t zone = i;
        long long oh = 0, om = 0;
        int sign = s[i++] == '-' ? -1 : 1;
        if (!(take_digits(s, n, &i, 2, &oh) && take_char(s, n, &i, ":") && take_digits(s, n, &i, 2, &om) &&
              i == n)) {
            char zone_shown[64];
            quote_field(zone_shown, sizeof zone_shown, s + zone, n - zone);
            return trace_fail(r, (int)(s + zone - r->line) + 1, "TIMESTAMP",
                              "zone offset %s in %s is not +HH:MM or -HH:MM", zone_shown, shown);
        }
        if (oh > 23 || om > 59)
            return trace_fail(r, (int)(s + zone - r->line) + 1, "TIMESTAMP", "zone offset %.6s in %s is out of range "
                              "(-23:59 to +23:59)", s + zone, shown);
        offset_s = sign * (oh * 3600 + om * 60);
    }
    if (!ok || i != n)
        return trace_fail(r, f->col, "TIMESTAMP", "%s is not a date-time like 2023-11-16 18:15:46.6805900", shown);
    if (month < 1 || month > 12 || day < 1 || day > days_in_month(year, (int)month) || hour > 23 || minute > 59 ||
        second > 59)
        return trace_fail(r, f->col, "TIMESTAMP", "%s is not a valid date and time", shown);
    out->whole_s = days_from_civil(year, (int)month, (int)day) * 86400 + hour * 3600 + minute * 60 + second - offset_s;
    out->frac_s = frac;
    return KV_OK;
}

static int read_azure(trace_reader *r, int max_rows, int *status)
{
    int got = next_line(r, status);
    if (got < 0)
        return *status;
    if (got == 0) {
        r->line_no = 1;
        return trace_fail(r, 1, NULL, "empty file (expected the header '%s')", azure_header);
    }
    int rc = split_csv(r);
    if (rc)
        return rc;
    if (r->n_fields != 3 || !field_is(&r->fields[0], "TIMESTAMP") || !field_is(&r->fields[1], "ContextTokens") ||
        !field_is(&r->fields[2], "GeneratedTokens"))
        return trace_fail(r, 1, NULL, "the first line is not the header '%s' (Azure LLM inference trace)",
                          azure_header);
    azure_time first = {0, 0.0};
    while (max_rows == 0 || r->n_rows < (size_t)max_rows) {
        got = next_data_line(r, status);
        if (got < 0)
            return *status;
        if (got == 0)
            break;
        if ((rc = split_csv(r)))
            return rc;
        if (r->n_fields != 3)
            return trace_fail(r, 1, NULL, "%zu fields, expected 3 (%s)", r->n_fields, azure_header);
        azure_time t = {0, 0.0};
        int prompt, output;
        if ((rc = parse_azure_time(r, &r->fields[0], &t)) ||
            (rc = parse_tokens(r, r->fields[1].text, r->fields[1].len, r->fields[1].col, "ContextTokens", false,
                               &prompt)) ||
            (rc = parse_tokens(r, r->fields[2].text, r->fields[2].len, r->fields[2].col, "GeneratedTokens", false,
                               &output)))
            return rc;
        if (r->n_rows == 0)
            first = t;
        double rel = (double)(t.whole_s - first.whole_s) + (t.frac_s - first.frac_s);
        if ((rc = add_row(r, rel, r->fields[0].col, "TIMESTAMP", prompt, output)))
            return rc;
    }
    return KV_OK;
}

/* ---- BurstGPT: Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type ---- */

static const char burstgpt_header[] = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type";

static int read_burstgpt(trace_reader *r, int max_rows, int *status)
{
    int got = next_line(r, status);
    if (got < 0)
        return *status;
    if (got == 0) {
        r->line_no = 1;
        return trace_fail(r, 1, NULL, "empty file (expected the header '%s')", burstgpt_header);
    }
    int rc = split_csv(r);
    if (rc)
        return rc;
    /* Columns are found by name: BurstGPT_1/_2 have the six above, BurstGPT_3
       adds "Session ID" and "Elapsed time" after Timestamp. */
    static const char *const needed[3] = {"Timestamp", "Request tokens", "Response tokens"};
    size_t col_of[3];
    for (int k = 0; k < 3; k++) {
        col_of[k] = r->n_fields;
        for (size_t j = 0; j < r->n_fields; j++)
            if (field_is(&r->fields[j], needed[k]))
                col_of[k] = j;
        if (col_of[k] == r->n_fields)
            return trace_fail(r, 1, NULL, "header has no '%s' column (expected '%s', BurstGPT)", needed[k],
                              burstgpt_header);
    }
    size_t n_columns = r->n_fields;
    long failed = 0;
    while (max_rows == 0 || r->n_rows < (size_t)max_rows) {
        got = next_data_line(r, status);
        if (got < 0)
            return *status;
        if (got == 0)
            break;
        if ((rc = split_csv(r)))
            return rc;
        if (r->n_fields != n_columns)
            return trace_fail(r, 1, NULL, "%zu fields, the header has %zu", r->n_fields, n_columns);
        const csv_field *ft = &r->fields[col_of[0]], *fp = &r->fields[col_of[1]], *fo = &r->fields[col_of[2]];
        double t;
        int prompt, output;
        if ((rc = parse_time(r, ft->text, ft->len, ft->col, "Timestamp", &t)) ||
            (rc = parse_tokens(r, fp->text, fp->len, fp->col, "Request tokens", false, &prompt)) ||
            (rc = parse_tokens(r, fo->text, fo->len, fo->col, "Response tokens", true, &output)))
            return rc;
        /* BurstGPT logs failed requests with 0 response tokens; they never ran,
           so they are skipped (BurstGPT_without_fails_*.csv is the same trace
           without them). Their times still have to be in order. */
        if (output == 0) {
            if (r->n_rows > 0 && t < r->prev_t)
                return trace_fail(r, ft->col, "Timestamp", "time goes backwards, %.9g s before the previous "
                                  "row (the trace must be sorted by time)", r->prev_t - t);
            failed++;
            continue;
        }
        if ((rc = add_row(r, t, ft->col, "Timestamp", prompt, output)))
            return rc;
    }
    if (r->n_rows == 0 && failed > 0)
        return kv_error_set(r->err, KV_EINPUT, "%s:%ld: no requests: all %ld rows are failed requests "
                            "(Response tokens 0)", r->path, r->line_no, failed);
    return KV_OK;
}

/* ---- Mooncake JSONL: {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]} ---- */

/* A cursor over one JSON line. */
typedef struct json_cursor {
    trace_reader *r;
    const char *p;   /* next byte */
} json_cursor;

static int json_col(const json_cursor *c)
{
    return (int)(c->p - c->r->line) + 1;
}

static void json_ws(json_cursor *c)
{
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')
        c->p++;
}

static int json_error(json_cursor *c, const char *what)
{
    if (*c->p == '\0')
        return trace_fail(c->r, json_col(c), NULL, "invalid JSON: %s, found the end of the line", what);
    return trace_fail(c->r, json_col(c), NULL, "invalid JSON: %s, found '%c'", what, *c->p);
}

/* Skips a JSON string starting at '"'; *start and *len get its raw content. */
static int json_string(json_cursor *c, const char **start, size_t *len)
{
    c->p++; /* the opening quote */
    const char *s = c->p;
    for (;;) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '\0')
            return json_error(c, "unterminated string");
        if (ch < 0x20)
            return json_error(c, "control character in a string");
        if (ch == '"')
            break;
        if (ch == '\\') {
            c->p++;
            if (*c->p == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (!strchr("0123456789abcdefABCDEF", c->p[k]) || c->p[k] == '\0') {
                        c->p += k;
                        return json_error(c, "bad \\u escape");
                    }
                c->p += 4;
            } else if (!*c->p || !strchr("\"\\/bfnrt", *c->p)) {
                return json_error(c, "bad escape in a string");
            }
        }
        c->p++;
    }
    if (start)
        *start = s;
    if (len)
        *len = (size_t)(c->p - s);
    c->p++; /* the closing quote */
    return KV_OK;
}

/* Skips a JSON number (strict JSON grammar); *is_integer says whether it had
   no fraction and no exponent. */
static int json_number(json_cursor *c, bool *is_integer)
{
    const char *p = c->p;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else {
        c->p = p;
        return json_error(c, "expected a digit");
    }
    *is_integer = true;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) {
            c->p = p;
            return json_error(c, "expected a digit after '.'");
        }
        while (*p >= '0' && *p <= '9')
            p++;
        *is_integer = false;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9')) {
            c->p = p;
            return json_error(c, "expected a digit in the exponent");
        }
        while (*p >= '0' && *p <= '9')
            p++;
        *is_integer = false;
    }
    c->p = p;
    return KV_OK;
}

/* Skips any JSON value; depth bounds nesting so a hostile line cannot
   exhaust the stack. */
static int json_skip_value(json_cursor *c, int depth)
{
    if (depth > 64)
        return json_error(c, "nested more than 64 deep");
    json_ws(c);
    char ch = *c->p;
    if (ch == '"')
        return json_string(c, NULL, NULL);
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        bool is_integer;
        return json_number(c, &is_integer);
    }
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++;
        json_ws(c);
        if (*c->p == close) {
            c->p++;
            return KV_OK;
        }
        for (;;) {
            int rc;
            if (ch == '{') {
                json_ws(c);
                if (*c->p != '"')
                    return json_error(c, "expected a key string");
                if ((rc = json_string(c, NULL, NULL)))
                    return rc;
                json_ws(c);
                if (*c->p != ':')
                    return json_error(c, "expected ':'");
                c->p++;
            }
            if ((rc = json_skip_value(c, depth + 1)))
                return rc;
            json_ws(c);
            if (*c->p == close) {
                c->p++;
                return KV_OK;
            }
            if (*c->p != ',')
                return json_error(c, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
            c->p++;
        }
    }
    static const char *const words[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++)
        if (strncmp(c->p, words[k], strlen(words[k])) == 0) {
            c->p += strlen(words[k]);
            return KV_OK;
        }
    return json_error(c, "expected a value");
}

/* Length of a bare word (letters) at p, for NaN/Infinity detection. */
static size_t word_len(const char *p)
{
    size_t n = 0;
    if (p[n] == '-' || p[n] == '+')
        n++;
    while ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z'))
        n++;
    return n;
}

/* Reads the number for a known key. integer: a token count (digits only). */
static int json_known_number(json_cursor *c, const char *key, bool integer, double *out)
{
    int col = json_col(c);
    size_t w = word_len(c->p);
    if (span_is_nan(c->p, w))
        return trace_fail(c->r, col, key, "NaN (not a number, and not valid JSON)");
    if (span_is_inf(c->p, w))
        return trace_fail(c->r, col, key, "infinite (not valid JSON)");
    if (*c->p != '-' && !(*c->p >= '0' && *c->p <= '9')) {
        const char *start = c->p;
        int rc = json_skip_value(c, 0);
        if (rc)
            return rc;
        char shown[64];
        quote_field(shown, sizeof shown, start, (size_t)(c->p - start));
        return trace_fail(c->r, col, key, "%s is not a number", shown);
    }
    const char *start = c->p;
    bool is_integer;
    int rc = json_number(c, &is_integer);
    if (rc)
        return rc;
    size_t n = (size_t)(c->p - start);
    if (integer) {
        if (*start == '-')
            return trace_fail(c->r, col, key, "negative token count '%.*s'", (int)n, start);
        if (!is_integer)
            return trace_fail(c->r, col, key, "'%.*s' is not a whole number of tokens", (int)n, start);
        int v;
        if ((rc = parse_tokens(c->r, start, n, col, key, false, &v)))
            return rc;
        *out = v;
        return KV_OK;
    }
    return parse_time(c->r, start, n, col, key, out);
}

static int read_mooncake(trace_reader *r, int max_rows, int *status)
{
    static const char *const keys[4] = {"timestamp", "input_length", "output_length", "hash_ids"};
    while (max_rows == 0 || r->n_rows < (size_t)max_rows) {
        int got = next_data_line(r, status);
        if (got < 0)
            return *status;
        if (got == 0)
            break;
        json_cursor c = {r, r->line};
        double value[3] = {0, 0, 0};
        int value_col[3] = {0, 0, 0};
        bool seen[4] = {false, false, false, false};
        int rc;
        json_ws(&c);
        if (*c.p != '{')
            return json_error(&c, "expected '{' (one JSON object per line)");
        c.p++;
        json_ws(&c);
        if (*c.p == '}')
            c.p++;
        else
            for (;;) {
                json_ws(&c);
                if (*c.p != '"')
                    return json_error(&c, "expected a key string");
                int key_col = json_col(&c);
                const char *key;
                size_t key_len;
                if ((rc = json_string(&c, &key, &key_len)))
                    return rc;
                json_ws(&c);
                if (*c.p != ':')
                    return json_error(&c, "expected ':'");
                c.p++;
                json_ws(&c);
                int k = 0;
                while (k < 4 && !(strlen(keys[k]) == key_len && memcmp(key, keys[k], key_len) == 0))
                    k++;
                if (k < 4 && seen[k])
                    return trace_fail(r, key_col, keys[k], "appears twice");
                if (k < 3) {
                    value_col[k] = json_col(&c);
                    if ((rc = json_known_number(&c, keys[k], k > 0, &value[k])))
                        return rc;
                } else if (k == 3) {
                    if (*c.p != '[')
                        return trace_fail(r, json_col(&c), "hash_ids", "not an array");
                    if ((rc = json_skip_value(&c, 0))) /* content unused, but must be valid */
                        return rc;
                } else if ((rc = json_skip_value(&c, 0))) { /* other keys are allowed and ignored */
                    return rc;
                }
                if (k < 4)
                    seen[k] = true;
                json_ws(&c);
                if (*c.p == '}') {
                    c.p++;
                    break;
                }
                if (*c.p != ',')
                    return json_error(&c, "expected ',' or '}'");
                c.p++;
            }
        json_ws(&c);
        if (*c.p != '\0')
            return json_error(&c, "text after the object");
        for (int k = 0; k < 3; k++)
            if (!seen[k])
                return trace_fail(r, 1, keys[k], "missing (each line needs timestamp, input_length, "
                                  "output_length)");
        if ((rc = add_row(r, value[0] / 1000.0, value_col[0], "timestamp", (int)value[1], (int)value[2])))
            return rc;
    }
    if (r->n_rows == 0 && r->line_no == 0) {
        r->line_no = 1;
        return trace_fail(r, 1, NULL, "empty file (expected one JSON object per line)");
    }
    return KV_OK;
}

int kv_trace_read(kv_trace_format fmt, const char *path, int max_rows, double time_scale,
                  kv_request_spec **out, size_t *count, kv_error *err)
{
    *out = NULL;
    *count = 0;
    if (!path)
        return kv_error_set(err, KV_EINPUT, "trace: no file given");
    if (fmt != KV_TRACE_AZURE && fmt != KV_TRACE_MOONCAKE && fmt != KV_TRACE_BURSTGPT)
        return kv_error_set(err, KV_EINPUT, "%s: unknown trace format %d (azure, mooncake or burstgpt)", path,
                            (int)fmt);
    if (max_rows < 0)
        return kv_error_set(err, KV_EINPUT, "%s: row cap %d is negative", path, max_rows);
    if (time_scale == 0.0)
        time_scale = 1.0;
    if (!(time_scale > 0.0) || !isfinite(time_scale))
        return kv_error_set(err, KV_EINPUT, "%s: time_scale %g must be a positive number", path, time_scale);

    trace_reader r = {.path = path, .err = err};
    r.file = kv_input_fopen(path, "trace", KV_INPUT_MAX_TRACE, err);
    if (!r.file)
        return err ? err->code : KV_EINPUT;

    int status = KV_OK;
    int rc = fmt == KV_TRACE_AZURE      ? read_azure(&r, max_rows, &status)
             : fmt == KV_TRACE_BURSTGPT ? read_burstgpt(&r, max_rows, &status)
                                        : read_mooncake(&r, max_rows, &status);
    if (rc == KV_OK && r.n_rows == 0)
        rc = kv_error_set(err, KV_EINPUT, "%s:%ld: no data rows%s", path,
                          r.blank_line_no ? r.blank_line_no : r.line_no + 1,
                          fmt == KV_TRACE_MOONCAKE ? "" : " after the header");
    fclose(r.file);
    kv_free(r.line);
    kv_free(r.fields);
    if (rc != KV_OK) {
        kv_free(r.rows);
        return rc;
    }
    for (size_t i = 0; i < r.n_rows; i++)
        r.rows[i].arrival_s *= time_scale;
    if (r.rows[r.n_rows - 1].arrival_s > KV_TRACE_MAX_TIME_S) {
        double span = r.rows[r.n_rows - 1].arrival_s;
        kv_free(r.rows);
        return kv_error_set(err, KV_EINPUT, "%s:%ld: time_scale %g makes this row arrive %.9g s after the first, "
                            "past the %.0e s kvsim keeps exact", path, r.last_row_line, time_scale, span,
                            KV_TRACE_MAX_TIME_S);
    }
    *out = r.rows;
    *count = r.n_rows;
    return KV_OK;
}
