/* test_trace.c — the trace readers: the shipped samples parse to known values, every malformed file gets its message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/workload/trace.h"
#include "tests/support.h"

#define SAMPLES "scenarios/traces/"
#define FIXTURES "tests/fixtures/traces/"

/* Reads a trace that must parse; returns its rows (free with kv_free). */
static kv_request_spec *read_ok(kv_trace_format fmt, const char *path, int max_rows, double time_scale, size_t *n)
{
    kv_request_spec *rows = NULL;
    kv_error err = {0};
    int rc = kv_trace_read(fmt, path, max_rows, time_scale, &rows, n, &err);
    cr_assert_eq(rc, KV_OK, "%s: %s", path, err.msg);
    cr_assert_not_null(rows);
    return rows;
}

/* Checks the invariants every trace list has: ids in order, times from 0, sorted, tokens >= 1. */
static void check_list(const char *name, const kv_request_spec *rows, size_t n)
{
    cr_assert_eq(rows[0].arrival_s, 0.0, "[%s] the first row arrives at %g", name, rows[0].arrival_s);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(rows[i].id, i, "[%s] row %zu has id %llu", name, i, (unsigned long long)rows[i].id);
        cr_assert(rows[i].prompt_tokens >= 1 && rows[i].output_tokens >= 1, "[%s] row %zu has no tokens", name, i);
        if (i > 0)
            cr_assert(rows[i].arrival_s >= rows[i - 1].arrival_s, "[%s] row %zu goes back in time", name, i);
    }
}

/* Row r of the trace `name` arrives at arrival_s with prompt and output tokens. */
static void expect_row(const char *name, const kv_request_spec *r, double arrival_s, int prompt, int output)
{
    cr_expect(fabs(r->arrival_s - arrival_s) < 1e-9, "[%s] row %llu: arrival %.12g, expected %.12g", name,
              (unsigned long long)r->id, r->arrival_s, arrival_s);
    cr_expect_eq(r->prompt_tokens, prompt, "[%s] row %llu", name, (unsigned long long)r->id);
    cr_expect_eq(r->output_tokens, output, "[%s] row %llu", name, (unsigned long long)r->id);
}

/* A trace that must parse: read with max_rows and time_scale, it gives n rows (each
   with the invariants of check_list) of which the rows listed are as written. */
typedef struct good_case {
    const char *name;
    kv_trace_format fmt;
    const char *path;
    int max_rows;
    double time_scale;
    size_t n;
    struct {
        size_t index;
        double arrival_s;
        int prompt, output;
    } rows[4]; /* up to four; a row of index 0 after the first ends the list */
} good_case;

static const good_case good_cases[] = {
    /* The Azure samples are CRLF files; times are differences of 100 ns-resolution date-times. */
    {"azure_code_sample", KV_TRACE_AZURE, SAMPLES "azure-code-2023-sample.csv", 0, 1.0, 300,
     {{0, 0.0, 4808, 10},            /* 18:17:03.9799600 */
      {1, 0.052, 3180, 8},           /* 18:17:04.0319600 */
      {2, 0.098189, 110, 27},        /* 18:17:04.0781490 */
      {299, 216.838239, 176, 88}}},  /* 18:20:40.8181990 */
    {"azure_conv_sample", KV_TRACE_AZURE, SAMPLES "azure-conv-2023-sample.csv", 0, 1.0, 300,
     {{0, 0.0, 374, 44}, {1, 4.314579, 396, 109}, {299, 84.029102, 212, 183}}},
    {"mooncake_sample", KV_TRACE_MOONCAKE, SAMPLES "mooncake-sample.jsonl", 0, 1.0, 300,
     {{0, 0.0, 6758, 500}, {1, 0.0, 7322, 490}, {299, 102.0, 979, 140}}}, /* timestamp 102000 ms */
    /* No real BurstGPT rows could be obtained (scenarios/traces/README.md), so this
       is a hand-written file: rows at 5, 45, 60 (failed: 0 response tokens, so skipped),
       118 and 118.5 s, the last with a quoted Model holding a comma. */
    {"burstgpt_handwritten", KV_TRACE_BURSTGPT, FIXTURES "burstgpt-handwritten.csv", 0, 1.0, 4,
     {{0, 0.0, 472, 18}, {1, 40.0, 1087, 230}, {2, 113.0, 417, 276}, {3, 113.5, 33, 7}}},
    {"burstgpt3_layout", KV_TRACE_BURSTGPT, FIXTURES "burstgpt3-handwritten.csv", 0, 1.0, 2,
     {{0, 0.0, 10, 20}, {1, 1.25, 11, 21}}},
    /* LF line ends, a byte-order mark, no newline at the end of the last row. */
    {"azure_lf_bom_no_final_newline", KV_TRACE_AZURE, FIXTURES "azure-lf-no-final-newline.csv", 0, 1.0, 2,
     {{0, 0.0, 374, 44}, {1, 4.314579, 396, 109}}},
    /* Time-zone suffixes (as in Azure's 2024 trace) are taken out; blank lines at the end are fine. */
    {"azure_time_zone_offsets", KV_TRACE_AZURE, FIXTURES "azure-offsets.csv", 0, 1.0, 3,
     {{0, 0.0, 100, 10},      /* 00:00:00.009930 UTC */
      {1, 1.49007, 200, 20},  /* 02:00:01.5 at +02:00 */
      {2, 1.99007, 300, 30}}}, /* 00:00:02 UTC */
    {"row_cap_and_time_scale", KV_TRACE_AZURE, SAMPLES "azure-code-2023-sample.csv", 3, 2.0, 3,
     {{1, 0.104, 3180, 8}, {2, 0.196378, 110, 27}}},
    {"time_scale_0_means_1", KV_TRACE_MOONCAKE, SAMPLES "mooncake-sample.jsonl", 0, 0.0, 300,
     {{299, 102.0, 979, 140}}},
};

Test(trace, good_files)
{
    for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++) {
        const good_case *c = &good_cases[i];
        size_t n;
        kv_request_spec *rows = read_ok(c->fmt, c->path, c->max_rows, c->time_scale, &n);
        cr_assert_eq(n, c->n, "[%s] %zu rows, expected %zu", c->name, n, c->n);
        check_list(c->name, rows, n);
        for (int k = 0; k < 4 && (k == 0 || c->rows[k].index != 0); k++) {
            expect_row(c->name, &rows[c->rows[k].index], c->rows[k].arrival_s, c->rows[k].prompt, c->rows[k].output);
        }
        kv_free(rows);
    }
}

/* Each malformed file gives KV_EINPUT, no rows, and a message with path:line:col and what is wrong. */
typedef struct bad_case {
    kv_trace_format fmt;
    const char *file;     /* under tests/fixtures/traces/ */
    const char *where;    /* ":line:col:" or ":line:" right after the path */
    const char *message;  /* a part of what follows */
} bad_case;

static const bad_case bad_cases[] = {
    {KV_TRACE_AZURE, "bad-empty.csv", ":1:1:", "empty file"},
    {KV_TRACE_AZURE, "bad-azure-header-only.csv", ":2:", "no data rows after the header"},
    {KV_TRACE_AZURE, "bad-azure-header.csv", ":1:1:", "the first line is not the header 'TIMESTAMP,ContextTokens,GeneratedTokens'"},
    {KV_TRACE_AZURE, "bad-azure-missing-field.csv", ":3:1:", "2 fields, expected 3"},
    {KV_TRACE_AZURE, "bad-azure-text-number.csv", ":3:29:", "ContextTokens: 'abc' is not a whole number"},
    {KV_TRACE_AZURE, "bad-azure-negative.csv", ":3:29:", "ContextTokens: negative token count '-5'"},
    {KV_TRACE_AZURE, "bad-azure-nan.csv", ":3:33:", "GeneratedTokens: NaN"},
    {KV_TRACE_AZURE, "bad-azure-zero.csv", ":3:33:", "GeneratedTokens: 0 tokens"},
    {KV_TRACE_AZURE, "bad-azure-empty-field.csv", ":3:29:", "ContextTokens: empty"},
    {KV_TRACE_AZURE, "bad-azure-huge.csv", ":3:29:", "ContextTokens: '99999999999' is too large"},
    {KV_TRACE_AZURE, "bad-azure-date.csv", ":3:1:", "TIMESTAMP: '2023-11-31 18:15:50.9951690' is not a valid date"},
    {KV_TRACE_AZURE, "bad-azure-time-text.csv", ":3:1:", "TIMESTAMP: 'yesterday' is not a date-time"},
    {KV_TRACE_AZURE, "bad-azure-unsorted.csv", ":3:1:", "TIMESTAMP: time goes backwards, 4.314579 s before"},
    {KV_TRACE_AZURE, "bad-azure-blank-line.csv", ":3:1:", "empty line in the middle"},
    {KV_TRACE_AZURE, "bad-azure-zone-offset.csv", ":3:28:", "TIMESTAMP: zone offset '+0x:00' in "
     "'2023-11-16 18:15:50.9951690+0x:00' is not +HH:MM or -HH:MM"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-empty.jsonl", ":1:1:", "empty file"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-blank-only.jsonl", ":1:", "no data rows"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-truncated.jsonl", ":2:44:", "invalid JSON: unterminated string"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-missing.jsonl", ":1:1:", "output_length: missing"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-negative-time.jsonl", ":1:15:", "timestamp: negative time '-3'"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-nan.jsonl", ":1:34:", "input_length: NaN"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-string-number.jsonl", ":1:34:", "input_length: '\"10\"' is not a number"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-unsorted.jsonl", ":2:15:", "timestamp: time goes backwards, 0.001 s"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-hash-ids.jsonl", ":1:70:", "hash_ids: not an array"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-hash-ids-content.jsonl", ":1:76:", "invalid JSON: expected a value"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-duplicate.jsonl", ":1:38:", "input_length: appears twice"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-zero.jsonl", ":1:55:", "output_length: 0 tokens"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-fraction.jsonl", ":1:34:", "input_length: '12.5' is not a whole number"},
    {KV_TRACE_MOONCAKE, "bad-mooncake-trailing.jsonl", ":1:74:", "text after the object"},
    {KV_TRACE_BURSTGPT, "bad-empty.csv", ":1:1:", "empty file"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-header.csv", ":1:1:", "header has no 'Response tokens' column"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-all-failed.csv", ":3:", "all 2 rows are failed requests"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-negative-time.csv", ":2:1:", "Timestamp: negative time '-5'"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-nan-time.csv", ":3:1:", "Timestamp: time is NaN"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-unsorted.csv", ":3:1:", "Timestamp: time goes backwards, 40 s"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-fields.csv", ":2:1:", "5 fields, the header has 6"},
    {KV_TRACE_BURSTGPT, "bad-burstgpt-quote.csv", ":2:3:", "unterminated quoted field"},
    /* a wrong format for a good file is caught by the header / JSON checks */
    {KV_TRACE_AZURE, "burstgpt-handwritten.csv", ":1:1:", "the first line is not the header 'TIMESTAMP,"},
    {KV_TRACE_MOONCAKE, "burstgpt-handwritten.csv", ":1:1:", "invalid JSON: expected '{'"},
};

Test(trace, malformed_files)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        char path[256], expected[512];
        snprintf(path, sizeof path, FIXTURES "%s", c->file);
        snprintf(expected, sizeof expected, "%s%s ", path, c->where);
        kv_request_spec *rows = (kv_request_spec *)&rows; /* must be reset to NULL */
        size_t n = 99;
        kv_error err = {0};
        int rc = kv_trace_read(c->fmt, path, 0, 1.0, &rows, &n, &err);
        cr_expect_eq(rc, KV_EINPUT, "%s: rc %d: %s", c->file, rc, err.msg);
        cr_expect_eq(err.code, KV_EINPUT, "%s", c->file);
        cr_expect_null(rows, "%s: partial result", c->file);
        cr_expect_eq(n, 0, "%s: partial count", c->file);
        cr_expect(strncmp(err.msg, expected, strlen(expected)) == 0, "%s: expected it to start with '%s', got '%s'",
                  c->file, expected, err.msg);
        cr_expect(strstr(err.msg, c->message) != NULL, "%s: expected '%s' in '%s'", c->file, c->message, err.msg);
    }
}

Test(trace, missing_file_directory_and_bad_arguments)
{
    kv_request_spec *rows = NULL;
    size_t n = 0;
    kv_error err = {0};
    cr_expect_eq(kv_trace_read(KV_TRACE_AZURE, FIXTURES "no-such-file.csv", 0, 1.0, &rows, &n, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, FIXTURES "no-such-file.csv: cannot open trace: No such file") == err.msg, "%s",
              err.msg);
    cr_expect_eq(kv_trace_read(KV_TRACE_AZURE, FIXTURES, 0, 1.0, &rows, &n, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "is a directory"), "%s", err.msg);
    cr_expect_eq(kv_trace_read(KV_TRACE_NONE, SAMPLES "mooncake-sample.jsonl", 0, 1.0, &rows, &n, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "unknown trace format"), "%s", err.msg);
    cr_expect_eq(kv_trace_read(KV_TRACE_MOONCAKE, SAMPLES "mooncake-sample.jsonl", 0, -1.0, &rows, &n, &err),
                 KV_EINPUT);
    cr_expect(strstr(err.msg, "time_scale"), "%s", err.msg);
    cr_expect_eq(kv_trace_read(KV_TRACE_MOONCAKE, SAMPLES "mooncake-sample.jsonl", 0, NAN, &rows, &n, &err),
                 KV_EINPUT);
    cr_expect_eq(kv_trace_read(KV_TRACE_MOONCAKE, SAMPLES "mooncake-sample.jsonl", -1, 1.0, &rows, &n, &err),
                 KV_EINPUT);
    cr_expect_null(rows);
}

/* A NUL byte cannot be written by the fixture files' text tools; the test writes it. */
Test(trace, nul_byte)
{
    char *dir = kvt_tempdir();
    cr_assert_not_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/nul.jsonl", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    static const char text[] = "{\"timestamp\": 0, \"input_length\": 1\0, \"output_length\": 1}\n";
    fwrite(text, 1, sizeof text - 1, f);
    fclose(f);
    kv_request_spec *rows = NULL;
    size_t n = 0;
    kv_error err = {0};
    cr_expect_eq(kv_trace_read(KV_TRACE_MOONCAKE, path, 0, 1.0, &rows, &n, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, ":1:35: NUL byte"), "%s", err.msg);
    kvt_rmtree(dir);
    free(dir);
}

/* A line far longer than any fixed buffer is read whole (getline), not cut. */
Test(trace, very_long_line)
{
    char *dir = kvt_tempdir();
    cr_assert_not_null(dir);
    size_t ids = 200000, cap = ids * 8 + 256, len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text + len, cap - len, "{\"timestamp\": 7, \"hash_ids\": [");
    for (size_t i = 0; i < ids; i++)
        len += (size_t)snprintf(text + len, cap - len, i ? ",%zu" : "%zu", i);
    len += (size_t)snprintf(text + len, cap - len, "], \"input_length\": 123456, \"output_length\": 9}\n");
    char *path = kvt_write(dir, "long.jsonl", text);
    free(text);
    size_t n;
    kv_request_spec *rows = read_ok(KV_TRACE_MOONCAKE, path, 0, 1.0, &n);
    cr_assert_eq(n, 1);
    expect_row("long.jsonl", &rows[0], 0.0, 123456, 9);
    kv_free(rows);
    kvt_rmtree(dir);
    free(path);
    free(dir);
}

/* A zone offset that does not parse (found by fuzzing: its digits were used
   unread, an overflow under UBSan) is refused with its own message; one out of
   range too. Either way no rows, and kvsim exits 2 without an output folder. */
Test(trace, azure_bad_zone_offsets)
{
    static const struct {
        const char *time, *message;
    } cases[] = {
        {"2024-05-10 00:00:00+", "zone offset '+' in '2024-05-10 00:00:00+' is not +HH:MM or -HH:MM"},
        {"2024-05-10 00:00:00-", "zone offset '-' in"},
        {"2024-05-10 00:00:00+1", "zone offset '+1' in"},
        {"2024-05-10 00:00:00+01", "zone offset '+01' in"},
        {"2024-05-10 00:00:00+01:", "zone offset '+01:' in"},
        {"2024-05-10 00:00:00+01:0", "zone offset '+01:0' in"},
        {"2024-05-10 00:00:00+0a:00", "zone offset '+0a:00' in"},
        {"2024-05-10 00:00:00-99x", "zone offset '-99x' in"},
        {"2024-05-10 00:00:00+01:00x", "zone offset '+01:00x' in"},
        {"2024-05-10 00:00:00+0100", "zone offset '+0100' in"},
        {"2024-05-10 00:00:00+24:00", "zone offset +24:00 in '2024-05-10 00:00:00+24:00' is out of range"},
        {"2024-05-10 00:00:00-01:60", "zone offset -01:60 in"},
    };
    char *dir = kvt_tempdir();
    cr_assert_not_null(dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256], expected[512];
        snprintf(text, sizeof text, "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,1,1\n%s,2,2\n",
                 cases[i].time);
        char *path = kvt_write(dir, "zone.csv", text);
        kv_request_spec *rows = NULL;
        size_t n = 0;
        kv_error err = {0};
        int rc = kv_trace_read(KV_TRACE_AZURE, path, 0, 1.0, &rows, &n, &err);
        cr_expect_eq(rc, KV_EINPUT, "%s: rc %d", cases[i].time, rc);
        cr_expect_null(rows, "%s: partial result", cases[i].time);
        snprintf(expected, sizeof expected, "%s:3:20: TIMESTAMP: %s", path, cases[i].message);
        cr_expect(strncmp(err.msg, expected, strlen(expected)) == 0, "%s: expected '%s...', got '%s'",
                  cases[i].time, expected, err.msg);
        free(path);
    }
    /* the same through kvsim: exit code 2, the message, no output folder */
    char text[1024];
    snprintf(text, sizeof text,
             "name: zone\nmodel: llama-3-8b\ncluster:\n  prefill: {nodes: 1, device: h100-sxm}\n"
             "  decode: {nodes: 1, device: h100-sxm}\nnetwork: {model: ideal, nic_bandwidth_gbps: 100}\n"
             "workload:\n  requests: 2\n  trace: {format: azure, path: %s/" FIXTURES "bad-azure-zone-offset.csv}\n"
             "policies: [bf16]\n",
             KV_SOURCE_DIR);
    char *scen = kvt_write(dir, "s.yaml", text);
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "run %s --out %s/out --quiet", scen, dir);
    int rc = kvt_kvsim(args, &out);
    cr_expect_eq(rc, 2, "kvsim exit %d: %s", rc, out);
    cr_expect(strstr(out, "bad-azure-zone-offset.csv:3:28: TIMESTAMP: zone offset '+0x:00'") != NULL, "%s", out);
    snprintf(args, sizeof args, "%s/out", dir);
    cr_expect(access(args, F_OK) != 0, "kvsim left %s behind", args);
    free(out);
    free(scen);
    kvt_rmtree(dir);
    free(dir);
}
