/* test_encset.c — plan_request's reuse of fixed encodings: exact bytes, refetch when answers can change, same runs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/encset.h"
#include "core/kv/kvbytes.h"
#include "core/policy/policy.h"
#include "core/report/report.h"
#include "core/config/scenario.h"
#include "core/study/study.h"
#include "tests/support.h"

static const kv_policy_model llama8b = {"Llama-3-8B", 32, 32, 8, 128};
static const kv_policy_request short_req = {1, 1000, 200, 0.5}, long_req = {2, 9000, 100, 1.5};

/* Request-dependent: the bits follow the prompt length. */
static const char *const ctxdep_lua =
    "return { name = 'ctxdep',\n"
    "  encode = function(ctx)\n"
    "    local enc = { bits = ctx.context_length > 4096 and 4 or 8, group_size = 32 }\n"
    "    return { key = enc, value = enc }\n"
    "  end }\n";
/* Fixed but different per (layer, head): 60 distinct encodings (more than the set groups). */
static const char *const perhead_lua =
    "return { name = 'perhead',\n"
    "  encode = function(ctx)\n"
    "    local enc = { bits = 1 + ctx.layer % 15, group_size = 16 << (ctx.head % 4) }\n"
    "    return { key = enc, value = { bits = 8, group_size = 32 } }\n"
    "  end }\n";
/* Fixed, three distinct encodings (one with a residual plane). */
static const char *const mixed_lua =
    "return { name = 'mixed',\n"
    "  encode = function(ctx)\n"
    "    if ctx.layer < 2 then return { key = { bits = 16 }, value = { bits = 8, group_size = 64 } } end\n"
    "    local enc = { bits = ctx.layer % 2 == 0 and 4 or 8, anchor_bits = 2, group_size = 32 }\n"
    "    return { key = enc, value = enc }\n"
    "  end }\n";

/* What plan_request summed before: kv_encoding_bytes head by head. */
static void bytes_by_head(kv_policy *p, const kv_policy_request *r, int tokens, double out[3])
{
    out[0] = out[1] = out[2] = 0;
    kv_error err = {0};
    for (int l = 0; l < llama8b.layers; l++)
        for (int h = 0; h < llama8b.kv_heads; h++) {
            kv_encoding e;
            cr_assert_eq(kv_policy_encoding(p, &llama8b, r, l, h, &e, &err), KV_OK, "%s", err.msg);
            if (e.diffkv)
                continue;
            kv_head_bytes hb;
            kv_encoding_bytes(&e, tokens, llama8b.head_dim, NULL, &hb);
            out[0] += hb.anchor;
            out[1] += hb.residual;
            out[2] += hb.kept_tokens;
        }
}

static void expect_exact_bytes(const char *path, bool want_fixed)
{
    kv_policy *p = kvt_policy_load(path, NULL, 0), *ref = kvt_policy_load(path, NULL, 0);
    kv_policy_set_cache(ref, false);
    kv_encset *s = kv_encset_create(llama8b.layers, llama8b.kv_heads);
    kv_error err = {0};
    const int tokens[] = {1, 7, 31, 32, 33, 100, 1000, 4095, 4096, 4097, 9000, 131072, 1000000};
    const kv_policy_request *reqs[] = {&short_req, &long_req, &short_req};
    uint64_t gen = 0;
    for (int k = 0; k < 3; k++) {
        const kv_encoding *enc = NULL;
        cr_assert_eq(kv_encset_fill(s, p, &llama8b, reqs[k], &enc, &err), KV_OK, "%s", err.msg);
        cr_expect_eq(kv_encset_fixed(s), want_fixed, "%s: fixed", path);
        if (k > 0 && want_fixed)
            cr_expect_eq(kv_encset_generation(s), gen, "%s: fixed encodings were asked again", path);
        if (k > 0 && !want_fixed)
            cr_expect_neq(kv_encset_generation(s), gen, "%s: request-dependent encodings were reused", path);
        gen = kv_encset_generation(s);
        for (int i = 0; i < llama8b.layers * llama8b.kv_heads; i++) {
            kv_encoding e;
            cr_assert_eq(kv_policy_encoding(ref, &llama8b, reqs[k], i / llama8b.kv_heads, i % llama8b.kv_heads, &e,
                                            &err), KV_OK, "%s", err.msg);
            cr_assert(memcmp(&e.key, &enc[i].key, sizeof e.key) == 0 && e.key.bits == enc[i].key.bits,
                      "%s: request %d, head %d: not the policy's encoding", path, k, i);
        }
        for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++) {
            double got[3], want[3];
            kv_encset_bytes(s, tokens[t], llama8b.head_dim, &got[0], &got[1], &got[2]);
            bytes_by_head(ref, reqs[k], tokens[t], want);
            for (int j = 0; j < 3; j++)
                cr_expect(memcmp(&got[j], &want[j], sizeof got[j]) == 0, "%s: %d tokens, sum %d: %.17g, want %.17g",
                          path, tokens[t], j, got[j], want[j]);
        }
    }
    kv_encset_destroy(s);
    kv_policy_destroy(p);
    kv_policy_destroy(ref);
}

Test(encset, shipped_policies_are_fixed_and_exact)
{
    const char *shipped[] = {"policies/bf16.lua", "policies/int8.lua", "policies/int4.lua",
                             "policies/kivi2.lua", "policies/lynx.lua", "policies/diffkv.lua"};
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++)
        expect_exact_bytes(shipped[i], true);
}

Test(encset, per_head_and_request_dependent_policies)
{
    char *dir = kvt_tempdir();
    char *ctxdep = kvt_write(dir, "ctxdep.lua", ctxdep_lua);
    char *perhead = kvt_write(dir, "perhead.lua", perhead_lua);
    char *mixed = kvt_write(dir, "mixed.lua", mixed_lua);
    expect_exact_bytes(perhead, true);
    expect_exact_bytes(mixed, true);
    expect_exact_bytes(ctxdep, false);
    kvt_rmtree(dir);
    free(ctxdep);
    free(perhead);
    free(mixed);
    free(dir);
}

Test(encset, asks_again_when_the_policy_cache_is_emptied)
{
    kv_policy *p = kvt_policy_load("policies/int8.lua", NULL, 0);
    kv_encset *s = kv_encset_create(llama8b.layers, llama8b.kv_heads);
    kv_error err = {0};
    const kv_encoding *enc = NULL;
    cr_assert_eq(kv_encset_fill(s, p, &llama8b, &short_req, &enc, &err), KV_OK, "%s", err.msg);
    uint64_t gen = kv_encset_generation(s);
    cr_assert(kv_encset_fixed(s));
    kv_policy_set_cache(p, false); /* answers may now differ per call */
    cr_assert_eq(kv_encset_fill(s, p, &llama8b, &short_req, &enc, &err), KV_OK, "%s", err.msg);
    cr_expect_neq(kv_encset_generation(s), gen, "a cleared policy cache must be asked again");
    cr_expect(!kv_encset_fixed(s));
    kv_policy_set_cache(p, true);
    gen = kv_encset_generation(s);
    cr_assert_eq(kv_encset_fill(s, p, &llama8b, &short_req, &enc, &err), KV_OK, "%s", err.msg);
    cr_expect_neq(kv_encset_generation(s), gen);
    cr_expect(kv_encset_fixed(s), "cached again after one fill");
    /* The policy switched to another model and back: its cache was emptied on the way. */
    const kv_policy_model other = {"Other", 4, 4, 2, 64};
    gen = kv_encset_generation(s);
    kv_policy_set_model(p, &other);
    kv_policy_set_model(p, &llama8b);
    cr_assert_eq(kv_encset_fill(s, p, &llama8b, &short_req, &enc, &err), KV_OK, "%s", err.msg);
    cr_expect_neq(kv_encset_generation(s), gen, "a new model must be asked again");
    /* A model of another shape is refused, not read out of bounds. */
    cr_expect_eq(kv_encset_fill(s, p, &other, &short_req, &enc, &err), KV_EFAIL);
    kv_encset_destroy(s);
    kv_policy_destroy(p);
}

/* ---- Whole runs: the reusing path against the policy asked every time (cache = false). ---------- */

static char *report_text(kv_study *st, const kv_scenario *s, bool csv)
{
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    if (csv) {
        kv_report_csv(f, o, n);
    } else {
        kv_report_json(f, s, o, n);
    }
    fclose(f);
    if (!csv) { /* the policies' file paths, and so the --set overrides naming them, differ: drop them */
        char *w = text;
        for (const char *r = text; *r;) {
            if (strncmp(r, "\"file\":\"", 8) == 0) {
                r = strchr(r + 8, '"') + 1;
                continue;
            }
            if (strncmp(r, "\"overrides\":[", 13) == 0) {
                r += strcspn(r, "\n");
                continue;
            }
            *w++ = *r++;
        }
        *w = '\0';
    }
    return text;
}

/* Copy of policies/<name>.lua that opts out of the policy host's cache. */
static char *uncached_copy(const char *dir, const char *name)
{
    char src[256];
    snprintf(src, sizeof src, "policies/%s.lua", name);
    char *text = kvt_read(src, NULL);
    cr_assert(text, "%s", src);
    char *ret = strstr(text, "\nreturn {");
    cr_assert(ret, "%s has no 'return {' line", src);
    size_t at = (size_t)(ret - text) + strlen("\nreturn {");
    size_t len = strlen(text);
    char *out = malloc(len + 32);
    memcpy(out, text, at);
    strcpy(out + at, "\n  cache = false,");
    strcpy(out + at + strlen("\n  cache = false,"), text + at);
    char file[64];
    snprintf(file, sizeof file, "%s.lua", name);
    char *path = kvt_write(dir, file, out);
    free(out);
    free(text);
    return path;
}

static void expect_same_runs(const char *scenario, const char *const *policies, const char *const *files,
                             size_t n_pol, const char *const *extra, size_t n_extra)
{
    char *dir = kvt_tempdir();
    const char *sets_a[16], *sets_b[32];
    char owned[16][512];
    size_t na = 0, nb = 0;
    for (size_t i = 0; i < n_extra; i++)
        sets_a[na++] = sets_b[nb++] = extra[i];
    for (size_t i = 0; i < n_pol; i++) {
        char *path = uncached_copy(dir, files[i]);
        snprintf(owned[i], sizeof owned[i], "policy.%s.file=%s", policies[i], path);
        free(path);
        sets_b[nb++] = owned[i];
    }
    kv_scenario *sa = NULL, *sb = NULL;
    kv_study *a = kvt_study_run(scenario, sets_a, (int)na, &sa), *b = kvt_study_run(scenario, sets_b, (int)nb, &sb);
    for (int csv = 0; csv < 2; csv++) {
        char *ta = report_text(a, sa, csv), *tb = report_text(b, sb, csv);
        cr_expect(strcmp(ta, tb) == 0, "%s: %s differs between reused and per-request encodings", scenario,
                  csv ? "requests.csv" : "results.json");
        free(ta);
        free(tb);
    }
    kv_study_destroy(a);
    kv_study_destroy(b);
    kv_scenario_destroy(sa);
    kv_scenario_destroy(sb);
    kvt_rmtree(dir);
    free(dir);
}

Test(encset_runs, quickstart_same_with_and_without_reuse, .timeout = 300)
{
    const char *pol[] = {"bf16", "int8", "int4", "kivi2"};
    const char *extra[] = {"outputs.trace=false", "workload.requests=80"};
    expect_same_runs("scenarios/quickstart.yaml", pol, pol, 4, extra, 2);
}

Test(encset_runs, lynx_same_with_and_without_reuse, .timeout = 300)
{
    const char *pol[] = {"bf16", "int8", "int4", "lynx", "lynx16"};
    const char *files[] = {"bf16", "int8", "int4", "lynx", "lynx"};
    const char *extra[] = {"outputs.trace=false", "workload.requests=20"};
    expect_same_runs("scenarios/lynx.yaml", pol, files, 5, extra, 2);
}

Test(encset_runs, diffkv_same_with_and_without_reuse, .timeout = 300)
{
    const char *extra[] = {"outputs.trace=false", "workload.requests=40"};
    const char *pol[] = {"bf16", "int8", "kivi2", "diffkv"};
    expect_same_runs("scenarios/diffkv.yaml", pol, pol, 4, extra, 2);
}

Test(encset_runs, request_dependent_encodings_follow_each_request, .timeout = 300)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "ctxdep.lua", ctxdep_lua);
    char file_set[512];
    snprintf(file_set, sizeof file_set, "policy.ctxdep.file=%s", path);
    const char *sets[] = {"policies=[ctxdep]", file_set, "outputs.trace=false", "workload.requests=60"};
    kv_scenario *s = NULL;
    kv_study *st = kvt_study_run("scenarios/quickstart.yaml", sets, 4, &s);
    size_t n = 0;
    const kv_policy_outcome *o = kv_study_outcomes(st, &n);
    cr_assert_eq(n, 1);
    int seen[2] = {0, 0};
    int heads = llama8b.layers * llama8b.kv_heads;
    for (size_t i = 0; i < o[0].run.n_requests; i++) {
        const kv_request_result *q = &o[0].run.requests[i];
        int bits = q->prompt_tokens > 4096 ? 4 : 8;
        seen[bits == 4]++;
        kv_encoding e = {0};
        e.key = e.value = (kv_tensor_enc){.kind = KV_TENSOR_INT, .bits = bits, .group_size = 32};
        kv_head_bytes hb;
        kv_encoding_bytes(&e, q->prompt_tokens, llama8b.head_dim, NULL, &hb);
        cr_expect_eq(q->anchor_bytes, hb.anchor * heads, "request %llu (%d tokens): %.0f bytes, want %.0f",
                     (unsigned long long)q->id, q->prompt_tokens, q->anchor_bytes, hb.anchor * heads);
    }
    cr_expect(seen[0] > 0 && seen[1] > 0, "both branches taken (%d, %d)", seen[0], seen[1]);
    kv_study_destroy(st);
    kv_scenario_destroy(s);
    kvt_rmtree(dir);
    free(path);
    free(dir);
}
