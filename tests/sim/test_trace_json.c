/* test_trace_json.c — trace.json is strict JSON in the trace-event format, with the tracks and spans it promises. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/jsonread.h"
#include "tests/support.h"

/* ---- The strict reader itself: it must be able to say no. ------------------------------------- */

static int parses(const char *text)
{
    kv_jvalue *v = NULL;
    kv_error err = {0};
    int rc = kv_jread_parse(text, strlen(text), "t", &v, &err);
    kv_jvalue_free(v);
    return rc == KV_OK;
}

Test(jsonread, accepts_valid_documents)
{
    const char *good[] = {
        "{}", "[]", "0", "-0.5e+3", "\"a\\u00e9\\ud83d\\ude00\\n\"", "{\"a\":[1,2,{\"b\":null}],\"c\":true}",
        " [ false , \"x\" ] \n", "1E5", "\"\xc3\xa9\"",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_expect(parses(good[i]), "should parse: %s", good[i]);
}

Test(jsonread, rejects_what_json_forbids)
{
    const char *bad[] = {
        "",            "[1,]",        "{\"a\":1,}", "01",         "1.",           ".5",        "+1",
        "NaN",         "Infinity",    "[1 2]",      "{\"a\" 1}",  "{a:1}",        "'x'",       "\"\\x\"",
        "\"\\ud800\"", "\"\\udc00\"", "\"a\tb\"",   "\"\xff\"",   "\"\xc0\xaf\"", "[1] [2]",   "// c\n1",
        "[",           "\"abc",       "tru",        "nul",        "-",            "1e",        "\"\xed\xa0\x80\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect(!parses(bad[i]), "should be rejected: %s", bad[i]);
}

Test(jsonread, errors_name_line_and_column)
{
    kv_jvalue *v = NULL;
    kv_error err = {0};
    const char *text = "{\n  \"a\": [1,\n  2,]\n}";
    cr_assert_neq(kv_jread_parse(text, strlen(text), "doc.json", &v, &err), KV_OK);
    cr_expect(strstr(err.msg, "doc.json:3:5") != NULL, "got: %s", err.msg);
    cr_expect(strstr(err.msg, "trailing comma") != NULL, "got: %s", err.msg);
}

Test(jsonread, keeps_order_and_text)
{
    kv_jvalue *v = NULL;
    kv_error err = {0};
    const char *text = "{\"z\":1.50,\"a\":\"x\\\"y\",\"m\":[true]}";
    cr_assert_eq(kv_jread_parse(text, strlen(text), "t", &v, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(v->count, 3);
    cr_expect_str_eq(v->keys[0], "z");
    cr_expect_str_eq(kv_jvalue_get(v, "z")->text, "1.50");
    cr_expect_eq(kv_jvalue_get(v, "z")->number, 1.5);
    cr_expect_str_eq(kv_jvalue_get(v, "a")->text, "x\"y");
    cr_expect_eq(kv_jvalue_get(v, "m")->items[0]->boolean, 1);
    cr_expect_null(kv_jvalue_get(v, "nope"));
    kv_jvalue_free(v);
}

/* ---- trace.json from a small Lynx run on the ideal network ------------------------------------- */

static const char *scenario_text =
    "name: trace-test\n"
    "seed: 3\n"
    "model: llama-3.1-8b\n"
    "cluster:\n"
    "  prefill: {nodes: 1, device: h100-sxm}\n"
    "  decode: {nodes: 2, device: h100-sxm, max_batch: 8}\n"
    "network: {model: ideal, nic_bandwidth_gbps: 10}\n"
    "workload:\n"
    "  requests: 6\n"
    "  arrival: poisson\n"
    "  rate_per_s: 4\n"
    "  prompt: {dist: fixed, value: 16000}\n"
    "  output: {dist: fixed, value: 16}\n"
    "lynx: {from: scenario, acceptance: 0.9, ttkt_k: 4}\n"
    "policies: [bf16, lynx]\n";

typedef struct ev {
    const char *ph, *name;
    long long pid, tid;
    double ts, dur;
} ev;

static char *run_trace(const char *dir)
{
    char *scen = kvt_write(dir, "s.yaml", scenario_text);
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "run %s --out %s/out --quiet", scen, dir);
    int rc = kvt_kvsim(args, &out);
    cr_assert_eq(rc, 0, "kvsim %s: %s", args, out);
    free(out);
    free(scen);
    snprintf(args, sizeof args, "%s/out/trace.json", dir);
    char *text = kvt_read(args, NULL);
    cr_assert_not_null(text, "no %s", args);
    return text;
}

static int is_integer(const kv_jvalue *v)
{
    return v && v->kind == KV_JNUMBER && !strpbrk(v->text, ".eE");
}

static int by_start(const void *a, const void *b)
{
    const ev *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : (x->dur < y->dur);
}

/* Name of the track (pid, tid) from the thread_name metadata, or NULL. */
static const char *track_name(const kv_jvalue *events, long long pid, long long tid)
{
    for (size_t i = 0; i < events->count; i++) {
        const kv_jvalue *e = events->items[i];
        const kv_jvalue *name = kv_jvalue_get(e, "name");
        if (strcmp(kv_jvalue_get(e, "ph")->text, "M") == 0 && strcmp(name->text, "thread_name") == 0 &&
            (long long)kv_jvalue_get(e, "pid")->number == pid && (long long)kv_jvalue_get(e, "tid")->number == tid)
            return kv_jvalue_get(kv_jvalue_get(e, "args"), "name")->text;
    }
    return NULL;
}

static const char *process_name(const kv_jvalue *events, long long pid)
{
    for (size_t i = 0; i < events->count; i++) {
        const kv_jvalue *e = events->items[i];
        if (strcmp(kv_jvalue_get(e, "ph")->text, "M") == 0 &&
            strcmp(kv_jvalue_get(e, "name")->text, "process_name") == 0 &&
            (long long)kv_jvalue_get(e, "pid")->number == pid)
            return kv_jvalue_get(kv_jvalue_get(e, "args"), "name")->text;
    }
    return NULL;
}

Test(trace_json, is_valid_trace_event_json)
{
    char *dir = kvt_tempdir();
    char *text = run_trace(dir);
    kv_jvalue *root = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_jread_parse(text, strlen(text), "trace.json", &root, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(root->kind, KV_JOBJECT, "the top level is an object");
    const kv_jvalue *events = kv_jvalue_get(root, "traceEvents");
    cr_assert(events && events->kind == KV_JARRAY, "traceEvents is an array");
    const kv_jvalue *unit = kv_jvalue_get(root, "displayTimeUnit");
    cr_expect(!unit || (unit->kind == KV_JSTRING && (!strcmp(unit->text, "ms") || !strcmp(unit->text, "ns"))));
    cr_assert_gt(events->count, 50);

    ev *spans = calloc(events->count, sizeof *spans);
    size_t n_spans = 0, n_counters = 0, n_meta = 0;
    for (size_t i = 0; i < events->count; i++) {
        const kv_jvalue *e = events->items[i];
        cr_assert_eq(e->kind, KV_JOBJECT, "event %zu is an object", i);
        const kv_jvalue *ph = kv_jvalue_get(e, "ph"), *name = kv_jvalue_get(e, "name");
        const kv_jvalue *pid = kv_jvalue_get(e, "pid"), *tid = kv_jvalue_get(e, "tid");
        const kv_jvalue *ts = kv_jvalue_get(e, "ts"), *dur = kv_jvalue_get(e, "dur");
        cr_assert(ph && ph->kind == KV_JSTRING, "event %zu: ph is a string", i);
        cr_assert(name && name->kind == KV_JSTRING && name->length > 0, "event %zu: name is a string", i);
        cr_assert(is_integer(pid) && pid->number >= 0, "event %zu: pid is a whole number", i);
        cr_assert(is_integer(tid) && tid->number >= 0, "event %zu: tid is a whole number", i);
        const kv_jvalue *cat = kv_jvalue_get(e, "cat");
        cr_assert(!cat || cat->kind == KV_JSTRING, "event %zu: cat is a string", i);
        const kv_jvalue *args = kv_jvalue_get(e, "args");
        cr_assert(!args || args->kind == KV_JOBJECT, "event %zu: args is an object", i);
        if (!strcmp(ph->text, "X")) {
            cr_assert(ts && ts->kind == KV_JNUMBER && ts->number >= 0, "event %zu: X needs ts >= 0", i);
            cr_assert(dur && dur->kind == KV_JNUMBER && dur->number >= 0, "event %zu: X needs dur >= 0", i);
            spans[n_spans++] = (ev){ph->text, name->text, (long long)pid->number, (long long)tid->number,
                                    ts->number, dur->number};
        } else if (!strcmp(ph->text, "C")) {
            cr_assert(ts && ts->kind == KV_JNUMBER && ts->number >= 0, "event %zu: C needs ts", i);
            cr_assert(args && args->count > 0, "event %zu: C needs args", i);
            for (size_t k = 0; k < args->count; k++)
                cr_assert_eq(args->items[k]->kind, KV_JNUMBER, "event %zu: counter values are numbers", i);
            n_counters++;
        } else if (!strcmp(ph->text, "M")) {
            cr_assert(args, "event %zu: metadata needs args", i);
            if (!strcmp(name->text, "process_name") || !strcmp(name->text, "thread_name")) {
                const kv_jvalue *an = kv_jvalue_get(args, "name");
                cr_assert(an && an->kind == KV_JSTRING, "event %zu: args.name is a string", i);
            } else if (!strcmp(name->text, "thread_sort_index") || !strcmp(name->text, "process_sort_index")) {
                cr_assert(is_integer(kv_jvalue_get(args, "sort_index")), "event %zu: sort_index", i);
            } else {
                cr_assert_fail("event %zu: unknown metadata '%s'", i, name->text);
            }
            n_meta++;
        } else {
            cr_assert_fail("event %zu: phase '%s' is not one kvsim writes (X, C, M)", i, ph->text);
        }
    }
    cr_expect_gt(n_counters, 0, "KV memory counters");
    cr_expect_gt(n_meta, 0);

    /* Every track and process a span uses is named; spans on one track nest (Perfetto needs it). */
    qsort(spans, n_spans, sizeof *spans, by_start);
    for (size_t i = 0; i < n_spans; i++) {
        cr_assert_not_null(track_name(events, spans[i].pid, spans[i].tid), "span '%s' on unnamed track %lld/%lld",
                           spans[i].name, spans[i].pid, spans[i].tid);
        cr_assert_not_null(process_name(events, spans[i].pid), "span '%s' in unnamed process", spans[i].name);
    }
    for (size_t i = 0; i < n_spans;) {
        size_t j = i;
        double stack[64];
        int depth = 0;
        for (; j < n_spans && spans[j].pid == spans[i].pid && spans[j].tid == spans[i].tid; j++) {
            double end = spans[j].ts + spans[j].dur;
            while (depth > 0 && stack[depth - 1] <= spans[j].ts)
                depth--;
            cr_assert(depth == 0 || end <= stack[depth - 1],
                      "span '%s' [%g, %g] on track '%s' overlaps its parent without nesting", spans[j].name,
                      spans[j].ts, end, track_name(events, spans[j].pid, spans[j].tid));
            cr_assert_lt(depth, 64);
            stack[depth++] = end;
        }
        i = j;
    }

    /* The tracks and spans the issue asks for. */
    const char *tracks[] = {"prefill 0", "decode 0", "decode 1", "link prefill 0 out", "link decode 0 in",
                            "request 0"};
    for (size_t t = 0; t < sizeof tracks / sizeof tracks[0]; t++)
        cr_expect(strstr(text, tracks[t]) != NULL, "no track '%s'", tracks[t]);
    const char *names[] = {"\"prefill", "\"encode", "\"anchor transfer\"", "\"residual transfer\"",
                           "\"KV transfer\"", "\"speculative decode", "\"verify", "\"decode (", "\"step B=",
                           "\"anchor r", "\"residual r", "\"kv r", "\"KV memory decode 0\"", "\"lynx requests\""};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        cr_expect(strstr(text, names[k]) != NULL, "no span named %s...", names[k] + 1);

    free(spans);
    kv_jvalue_free(root);
    free(text);
    kvt_rmtree(dir);
    free(dir);
}

Test(trace_json, same_seed_same_bytes)
{
    char *a_dir = kvt_tempdir(), *b_dir = kvt_tempdir();
    char *a = run_trace(a_dir), *b = run_trace(b_dir);
    cr_expect(strcmp(a, b) == 0, "two runs of the same scenario wrote different trace.json");
    free(a);
    free(b);
    kvt_rmtree(a_dir);
    kvt_rmtree(b_dir);
    free(a_dir);
    free(b_dir);
}
