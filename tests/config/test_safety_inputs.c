/* test_safety_inputs.c — hostile input files (issue #17): special files, huge mappings, NUL bytes, tags,
 * aliases, out-of-range trace rows, and the trace's requests/repeat keys. Each case exits 2 with a
 * message naming the file (and line) — never a hang, an out-of-memory abort or an echo of the file. */
#define _GNU_SOURCE /* asprintf */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/alloc.h" /* KV_ASAN */
#include "core/base/infile.h"
#include "core/config/ytree.h"
#include "tests/support.h"

/* A valid base scenario; cases append lines. */
static const char *base = "name: t\n"
                          "model: llama-3-8b\n"
                          "network: {model: ideal}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs kvsim with args, killed after limit_s seconds (the old code hung or read /dev/zero until memory
   ran out: outside sanitizer builds, address space is capped at 4 GB so that fails fast too).
   Returns the exit code (137 when killed); *output gets stdout + stderr, *elapsed the wall time. */
static int run_limited(const char *args, int limit_s, char **output, double *elapsed)
{
    const char *bin = getenv("KVSIM");
    if (!bin)
        bin = KV_BINARY_DIR "/kvsim";
    const char *cap = KV_ASAN ? "" : "ulimit -v 4000000; ";
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%stimeout -s KILL %d %s %s 2>&1", cap, limit_s, bin, args);
    double t0 = now_s();
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t cap_out = 4096, n = 0, got;
    char *buf = malloc(cap_out);
    while ((got = fread(buf + n, 1, cap_out - n - 1, p)) > 0) {
        n += got;
        if (cap_out - n < 2)
            buf = realloc(buf, cap_out *= 2);
    }
    buf[n] = '\0';
    int status = pclose(p);
    if (elapsed)
        *elapsed = now_s() - t0;
    *output = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `kvsim validate` on text written as s.yaml in dir; expects exit 2 and each fragment in the output
   (NULL ends the list early), and `absent` (if not NULL) nowhere in it. */
static void expect_validate(const char *dir, const char *text, int limit_s, const char *f1, const char *f2,
                            const char *absent)
{
    char *path = kvt_write(dir, "s.yaml", text);
    char args[4200], *out = NULL;
    snprintf(args, sizeof args, "validate %s", path);
    double dt = 0;
    int rc = run_limited(args, limit_s, &out, &dt);
    cr_expect_eq(rc, 2, "exit %d after %.1f s for:\n%.600s\noutput: %.2000s", rc, dt, text, out);
    if (f1)
        cr_expect(strstr(out, f1), "expected '%s' in: %.2000s", f1, out);
    if (f2)
        cr_expect(strstr(out, f2), "expected '%s' in: %.2000s", f2, out);
    if (absent)
        cr_expect(!strstr(out, absent), "'%s' is echoed in: %.2000s", absent, out);
    cr_expect(!strstr(out, "Sanitizer"), "sanitizer report: %s", out);
    free(out);
    free(path);
}

/* `kvsim validate` that must succeed and print `fragment`. */
static void expect_valid(const char *dir, const char *text, const char *fragment)
{
    char *path = kvt_write(dir, "s.yaml", text);
    char args[4200], *out = NULL;
    snprintf(args, sizeof args, "validate %s", path);
    int rc = run_limited(args, 60, &out, NULL);
    cr_expect_eq(rc, 0, "exit %d for:\n%s\noutput: %s", rc, text, out);
    cr_expect(strstr(out, fragment), "expected '%s' in: %s", fragment, out);
    free(out);
    free(path);
}

static char *make_fifo(const char *dir)
{
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/pipe", dir) > 0);
    cr_assert_eq(mkfifo(path, 0600), 0);
    return path;
}

/* ---- 1. special files and sizes ----------------------------------------------------------------- */

Test(inputs, fifo_as_scenario_is_refused)
{
    char *dir = kvt_tempdir(), *fifo = make_fifo(dir), *out = NULL, args[4200];
    snprintf(args, sizeof args, "validate %s", fifo);
    double dt = 0;
    int rc = run_limited(args, 10, &out, &dt);
    cr_expect_eq(rc, 2, "exit %d after %.1f s: %s", rc, dt, out);
    cr_expect(strstr(out, fifo) && strstr(out, "FIFO"), "%s", out);
    free(out);
    kvt_rmtree(dir);
    free(fifo);
    free(dir);
}

Test(inputs, special_files_as_card_device_trace_policy_calibration_profile_platform)
{
    char *dir = kvt_tempdir(), *fifo = make_fifo(dir);
    char text[8192];
    snprintf(text, sizeof text, "name: t\nmodel: %s\nnetwork: {model: ideal}\npolicies: [bf16]\n", fifo);
    expect_validate(dir, text, 10, fifo, "FIFO", NULL);
    snprintf(text, sizeof text, "%scluster: {decode: {device: %s}}\npolicies: [bf16]\n", base, fifo);
    expect_validate(dir, text, 10, fifo, "FIFO", NULL);
    snprintf(text, sizeof text, "%sworkload: {trace: {format: azure, path: /dev/zero}}\npolicies: [bf16]\n", base);
    expect_validate(dir, text, 20, "/dev/zero: cannot open trace: it is a character device", NULL, NULL);
    snprintf(text, sizeof text, "%sworkload: {trace: {format: mooncake, path: %s}}\npolicies: [bf16]\n", base, fifo);
    expect_validate(dir, text, 10, "cannot open trace: it is a FIFO", NULL, NULL);
    snprintf(text, sizeof text, "%sworkload: {requests: 2}\npolicies: [bf16]\npolicy: {bf16: {file: /dev/zero}}\n",
             base);
    expect_validate(dir, text, 20, "/dev/zero: policy 'bf16': cannot open the policy file: it is a character device",
                    NULL, NULL);
    snprintf(text, sizeof text, "%sworkload: {requests: 2}\npolicies: [bf16]\ntiming: {calibration: /dev/zero}\n",
             base);
    expect_validate(dir, text, 20, "s.yaml:6:23: timing.calibration: /dev/zero: cannot open the calibration file",
                    "character device", NULL);
    snprintf(text, sizeof text,
             "%sworkload: {requests: 2}\npolicies: [bf16]\n"
             "timing: {source: profile, profile: {file: /dev/zero, model: m, prefill_hardware: h}}\n",
             base);
    expect_validate(dir, text, 20, "/dev/zero: cannot open profile table: it is a character device", NULL, NULL);
    snprintf(text, sizeof text,
             "name: t\nmodel: llama-3-8b\nnetwork: {topology: platform, platform_file: %s}\n"
             "workload: {requests: 2}\npolicies: [bf16]\n", fifo);
    expect_validate(dir, text, 10, "network.platform_file", "FIFO", NULL);
    kvt_rmtree(dir);
    free(fifo);
    free(dir);
}

Test(inputs, read_all_refuses_non_regular_and_oversized_files)
{
    char *dir = kvt_tempdir(), *fifo = make_fifo(dir);
    kv_error err = {0};
    char *text = (char *)&err;
    size_t len = 7;
    cr_expect_eq(kv_input_read_all(fifo, "thing", KV_INPUT_MAX_TEXT, &text, &len, &err), KV_EINPUT);
    cr_expect_null(text);
    cr_expect(strstr(err.msg, ": cannot open thing: it is a FIFO (named pipe), not a regular file"), "%s", err.msg);
    cr_expect_eq(kv_input_read_all("/dev/zero", "thing", KV_INPUT_MAX_TEXT, &text, &len, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "/dev/zero: cannot open thing: it is a character device"), "%s", err.msg);
    cr_expect_eq(kv_input_read_all(dir, "thing", 0, &text, &len, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "it is a directory"), "%s", err.msg);
    cr_expect_eq(kv_input_open("/dev/null", "thing", 0, NULL, &err), -1);
    cr_expect(strstr(err.msg, "character device"), "%s", err.msg);

    char *small = kvt_write(dir, "small.txt", "0123456789");
    cr_expect_eq(kv_input_read_all(small, "thing", 9, &text, &len, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "cannot open thing: larger than the 9 bytes"), "%s", err.msg);
    cr_assert_eq(kv_input_read_all(small, "thing", 10, &text, &len, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(len, 10);
    cr_expect_str_eq(text, "0123456789");
    free(text);
    FILE *f = kv_input_fopen(small, "thing", 0, &err);
    cr_assert(f, "%s", err.msg);
    cr_expect_eq(fgetc(f), '0');
    fclose(f);
    kvt_rmtree(dir);
    free(small);
    free(fifo);
    free(dir);
}

/* ---- 2. huge mappings and lists ------------------------------------------------------------------- */

Test(inputs, policy_mapping_of_200k_keys_is_checked_quickly)
{
    char *dir = kvt_tempdir();
    size_t cap = 200000 * 24 + 4096, n = 0;
    char *text = malloc(cap);
    n += (size_t)snprintf(text + n, cap - n, "%spolicies: [bf16]\npolicy:\n", base);
    for (int i = 0; i < 200000; i++)
        n += (size_t)snprintf(text + n, cap - n, "  q%d: {a: 1}\n", 199999 - i);
    snprintf(text + n, cap - n, "  bf16: {a: 1}\n");
    double t0 = now_s();
    /* the old code took over 40 s here (a linear duplicate-key scan per key) */
    expect_validate(dir, text, 30, "s.yaml:6:3: policy.q199999: 'q199999' is not in policies", NULL, NULL);
    cr_expect(now_s() - t0 < 30, "took %.1f s", now_s() - t0);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

Test(inputs, policies_list_of_150k_names_is_refused_quickly)
{
    char *dir = kvt_tempdir();
    size_t cap = 150000 * 10 + 4096, n = 0;
    char *text = malloc(cap);
    n += (size_t)snprintf(text + n, cap - n, "%spolicies: [", base);
    for (int i = 0; i < 150000; i++)
        n += (size_t)snprintf(text + n, cap - n, "%sp%d", i ? ", " : "", i);
    snprintf(text + n, cap - n, "]\n");
    /* the old code took 23 s (a quadratic duplicate check) */
    expect_validate(dir, text, 15, "s.yaml:4:11: policies: 150000 policies, at most 256", NULL, NULL);
    /* duplicates among allowed counts are still found */
    snprintf(text, cap, "%spolicies: [bf16, int8, int4, int8]\n", base);
    expect_validate(dir, text, 30, "policies: 'int8' is listed twice", NULL, NULL);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

Test(inputs, big_mapping_lookup_and_duplicates_through_the_index)
{
    enum { N = 100000 };
    size_t cap = (size_t)N * 20 + 64, n = 0;
    char *text = malloc(cap);
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(text + n, cap - n, "k%d: %d\n", i, i);
    kv_ynode *root = NULL;
    kv_error err = {0};
    double t0 = now_s();
    cr_assert_eq(kv_ytree_load_string(text, "big", &root, &err), KV_OK, "%s", err.msg);
    for (int i = 0; i < N; i += 7) {
        char key[32], want[32];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(want, sizeof want, "%d", i);
        size_t at = 0;
        const kv_ynode *v = kv_ytree_get(root, key, &at);
        cr_assert(v && strcmp(v->value, want) == 0 && at == (size_t)i, "key %s", key);
    }
    cr_expect_null(kv_ytree_get(root, "k100000", NULL));
    /* --set on a big mapping: replaced in place, and a new key found afterwards */
    kv_ynode *v = NULL;
    cr_assert_eq(kv_ytree_load_string("x", "--set", &v, &err), KV_OK);
    cr_assert_eq(kv_ytree_set(root, "k5", v, &err), KV_OK);
    cr_assert_eq(kv_ytree_load_string("y", "--set", &v, &err), KV_OK);
    cr_assert_eq(kv_ytree_set(root, "fresh", v, &err), KV_OK);
    cr_expect_str_eq(kv_ytree_get(root, "k5", NULL)->value, "x");
    cr_expect_str_eq(kv_ytree_get(root, "fresh", NULL)->value, "y");
    cr_expect_eq(root->count, (size_t)N + 1);
    kv_ytree_free(root);
    /* a duplicate far from its first occurrence */
    snprintf(text + n, cap - n, "k3: again\n");
    cr_expect_eq(kv_ytree_load_string(text, "big", &root, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "big:100001:1: duplicate key 'k3'"), "%s", err.msg);
    cr_expect(now_s() - t0 < 10, "took %.1f s", now_s() - t0);
    free(text);
}

/* ---- 3. NUL bytes, tags, aliases, echoes ----------------------------------------------------------- */

Test(inputs, nul_escapes_are_refused_in_keys_and_values)
{
    char *dir = kvt_tempdir();
    char text[2048];
    snprintf(text, sizeof text, "%s\"seed\\0junk\": 5\npolicies: [bf16]\n", base);
    expect_validate(dir, text, 30, "s.yaml:4:1: a NUL byte", NULL, NULL);
    snprintf(text, sizeof text, "%spolicies: [\"bf16\\0../../evil\"]\n", base);
    expect_validate(dir, text, 30, "s.yaml:4:12: a NUL byte", NULL, NULL);
    kv_ynode *n = NULL;
    kv_error err = {0};
    cr_expect_eq(kv_ytree_load_string("a: \"x\\0y\"", "--set a", &n, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "NUL byte"), "%s", err.msg);
    kvt_rmtree(dir);
    free(dir);
}

Test(inputs, tags_are_refused_and_foreign_files_are_not_echoed)
{
    char *dir = kvt_tempdir();
    char *secret = kvt_write(dir, "shadow", "root:$6$SeCrEtHaSh:19000:0:99999:7:::\n"
                                            "daemon:*:19000:0:99999:7:::\n");
    char text[8192];
    snprintf(text, sizeof text, "name: t\nmodel: !include %s\nnetwork: {model: ideal}\npolicies: [bf16]\n", secret);
    expect_validate(dir, text, 30, "s.yaml:2:8: YAML tags", NULL, "SeCrEt");
    snprintf(text, sizeof text, "%sseed: !!int 3\npolicies: [bf16]\n", base);
    expect_validate(dir, text, 30, "s.yaml:4:7: YAML tags", NULL, NULL);
    snprintf(text, sizeof text, "%spolicies: !!seq [bf16]\n", base);
    expect_validate(dir, text, 30, "s.yaml:4:11: YAML tags", NULL, NULL);
    /* the same file named as a card: the error names it and its line, not its text */
    snprintf(text, sizeof text, "name: t\nmodel: %s\nnetwork: {model: ideal}\npolicies: [bf16]\n", secret);
    expect_validate(dir, text, 30, "shadow:1:1: unknown key in model card, and not a key name", NULL, "SeCrEt");
    /* ... or as a trace */
    snprintf(text, sizeof text, "%sworkload: {trace: {format: azure, path: %s}}\npolicies: [bf16]\n", base, secret);
    expect_validate(dir, text, 30, "shadow:1:1: the first line is not the header", NULL, "SeCrEt");
    snprintf(text, sizeof text, "%sworkload: {trace: {format: burstgpt, path: %s}}\npolicies: [bf16]\n", base,
             secret);
    expect_validate(dir, text, 30, "shadow:1:1: header has no 'Timestamp' column", NULL, "SeCrEt");
    kvt_rmtree(dir);
    free(secret);
    free(dir);
}

Test(inputs, billion_laughs_is_refused_at_the_first_alias)
{
    char *dir = kvt_tempdir();
    char text[4096];
    snprintf(text, sizeof text,
             "%spolicies: [bf16]\n"
             "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
             "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
             "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
             "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
             "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
             "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
             "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
             "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
             "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n",
             base);
    expect_validate(dir, text, 10, "s.yaml:6:8: YAML aliases (*name) are not supported", NULL, NULL);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- 4. trace rows in range ----------------------------------------------------------------------- */

static void expect_trace_bad(const char *format, const char *name, const char *content, const char *extra,
                             const char *fragment)
{
    char *dir = kvt_tempdir();
    char *trace = kvt_write(dir, name, content);
    char text[4096], where[512];
    snprintf(text, sizeof text, "%sworkload: {requests: 0, trace: {format: %s, path: %s%s}}\npolicies: [bf16]\n",
             base, format, name, extra);
    snprintf(where, sizeof where, "%s%s", name, fragment);
    expect_validate(dir, text, 30, where, NULL, NULL);
    kvt_rmtree(dir);
    free(trace);
    free(dir);
}

Test(inputs, trace_times_and_lengths_are_range_checked)
{
    expect_trace_bad("mooncake", "big.jsonl",
                     "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": []}\n"
                     "{\"timestamp\": 1e300, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": []}\n",
                     "", ":2:15: timestamp: time 1e+297 s is past the 1e+09 s");
    expect_trace_bad("mooncake", "first.jsonl",
                     "{\"timestamp\": 2e12, \"input_length\": 10, \"output_length\": 5}\n", "",
                     ":1:15: timestamp: time 2e+09 s is past");
    expect_trace_bad("mooncake", "long.jsonl",
                     "{\"timestamp\": 0, \"input_length\": 16777217, \"output_length\": 5}\n", "",
                     ":1:34: input_length: '16777217' is too large (at most 16777216 tokens)");
    expect_trace_bad("azure", "far.csv",
                     "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
                     "9999-11-16 18:15:46.6805900,10,5\n", "",
                     ":3:1: TIMESTAMP: time 2.5");
    expect_trace_bad("burstgpt", "b.csv",
                     "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,10,5,15,Conversation log\n1e300,ChatGPT,10,5,15,Conversation log\n", "",
                     ":3:1: Timestamp: time 1e+300 s is past");
    expect_trace_bad("burstgpt", "b.csv",
                     "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,10,5,15,Conversation log\n1e8,ChatGPT,10,5,15,Conversation log\n",
                     ", time_scale: 100", ":3: time_scale 100 makes this row arrive 1e+10 s after the first");
    expect_trace_bad("burstgpt", "b.csv",
                     "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,10,99999999,15,Conversation log\n", "",
                     ":2:14: Response tokens: '99999999' is too large");
}

/* ---- 5. workload.requests: 0 and workload.trace.repeat with a trace ------------------------------ */

Test(inputs, trace_requests_zero_means_all_rows_and_repeat_tiles)
{
    char *dir = kvt_tempdir();
    char *src = kvt_source("scenarios/traces/azure-code-2023-sample.csv"), text[8192];
    snprintf(text, sizeof text, "%sworkload: {requests: 0, trace: {format: azure, path: %s}}\npolicies: [bf16]\n",
             base, src);
    expect_valid(dir, text, "300 requests");
    snprintf(text, sizeof text,
             "%sworkload: {requests: 0, trace: {format: azure, path: %s, repeat: 3}}\npolicies: [bf16]\n", base, src);
    expect_valid(dir, text, "900 requests");
    snprintf(text, sizeof text,
             "%sworkload: {requests: 500, trace: {format: azure, path: %s, repeat: 3}}\npolicies: [bf16]\n", base,
             src);
    expect_valid(dir, text, "500 requests");
    snprintf(text, sizeof text,
             "%sworkload: {requests: 1000, trace: {format: azure, path: %s}}\npolicies: [bf16]\n", base, src);
    expect_valid(dir, text, "300 requests"); /* one copy: requests only caps */
    /* too many copies: the message names the real key, at its place in the file */
    snprintf(text, sizeof text,
             "%sworkload:\n  requests: 0\n  trace: {format: azure, path: %s, repeat: 1000000}\npolicies: [bf16]\n",
             base, src);
    char where[64];
    snprintf(where, sizeof where, "s.yaml:6:%zu: workload.trace.repeat: 1000000 copies", 42 + strlen(src));
    expect_validate(dir, text, 30, where, "set workload.requests", "workload.repeat");
    kvt_rmtree(dir);
    free(src);
    free(dir);
}
