/* test_model_stats.c — the model statistics file (docs/stats-format.md): encoding texts, write/read round trip, bad files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/accuracy/model_stats.h"
#include "core/base/alloc.h"
#include "tests/support.h"

/* A valid file: 2 layers x 1 KV head, one Lynx entry (3 positions, 2 lengths), one DiffKV window
   (3 points), one accuracy entry. Line numbers matter to the bad-file tests below. */
static const char *const VALID =
    "{\n"                                                                              /* 1 */
    "  \"format\": \"kvsim-model-stats\",\n"                                           /* 2 */
    "  \"version\": 1,\n"                                                              /* 3 */
    "  \"model\": {\"name\": \"tiny\", \"file\": \"tiny.gguf\", \"sha256\": \"\",\n"   /* 4 */
    "    \"layers\": 2, \"heads\": 2, \"kv_heads\": 1, \"head_dim\": 8, \"context\": 4096},\n" /* 5 */
    "  \"producer\": {\"tool\": \"hand\", \"command\": \"vi\", \"measurement\": 2},\n" /* 6 */
    "  \"texts\": [{\"name\": \"GPL-3\", \"sha256\": \"\", \"tokens\": 9000}],\n"     /* 7 */
    "  \"lynx\": [{\n"                                                                 /* 8 */
    "    \"encodings\": [\"k=int8a4g32,v=int8a4g32\"],\n"                             /* 9 */
    "    \"positions\": 3,\n"                                                          /* 10 */
    "    \"lengths\": [1024, 4096],\n"                                                 /* 11 */
    "    \"accept\": [[0.97, 0.95, 0.1],\n"                                            /* 12 */
    "               [0.96, 0.93, 0.30000000000000004]],\n"                             /* 13 */
    "    \"samples\": [32, 16]}],\n"                                                   /* 14 */
    "  \"diffkv\": [{\n"                                                               /* 15 */
    "    \"window\": 32, \"points\": 3, \"lengths\": [1024, 4096],\n"                  /* 16 */
    "    \"prefill\": [[[[0, 0.5, 7]], [[0, 1, 9]]],\n"                                /* 17 */
    "                [[[0, 0.25, 8]], [[0.1, 1.5, 10]]]],\n"                           /* 18 */
    "    \"exit\": [[[[0, 0.6, 5]], [[0, 1.1, 6]]],\n"                                 /* 19 */
    "             [[[0, 0.7, 5.5]], [[0, 1.2, 6.5]]]]}],\n"                            /* 20 */
    "  \"accuracy\": [{\"encodings\": \"k=int4g32,v=int4g32\", \"context_tokens\": 1024,\n" /* 21 */
    "    \"scored_tokens\": 1000, \"delta_ppl\": 0.9, \"delta_ppl_ci95\": [0.7, 1.1],\n" /* 22 */
    "    \"top1_agree\": 0.93, \"attention_error\": [0.01, 0.02]}]\n"                  /* 23 */
    "}\n";

static char *dir;

static void setup(void)
{
    dir = kvt_tempdir();
}

static void teardown(void)
{
    kvt_rmtree(dir);
    free(dir);
}

/* text with the first `from` replaced by `to` (free it); the test fails when `from` is absent. */
static char *replace(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    cr_assert(at != NULL, "\"%s\" is not in the fixture", from);
    size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

/* Reading `text` fails with KV_EINPUT and a message holding "stats.json:LINE:" and `what`. */
static void expect_bad(const char *text, int line, const char *what)
{
    char *path = kvt_write(dir, "stats.json", text);
    kv_model_stats s;
    kv_error err = {0};
    int rc = kv_model_stats_read(path, &s, &err);
    cr_expect_eq(rc, KV_EINPUT, "read gave %d (%s)", rc, err.msg);
    cr_expect_eq(err.code, KV_EINPUT);
    char where[64];
    snprintf(where, sizeof where, "stats.json:%d:", line);
    cr_expect(strstr(err.msg, where) != NULL, "message \"%s\" does not say %s", err.msg, where);
    cr_expect(strstr(err.msg, what) != NULL, "message \"%s\" does not say \"%s\"", err.msg, what);
    cr_expect_eq(s.n_lynx, 0u, "a failed read leaves nothing behind");
    free(path);
}

TestSuite(model_stats, .init = setup, .fini = teardown);

Test(model_stats, reads_every_member)
{
    char *path = kvt_write(dir, "stats.json", VALID);
    kv_model_stats s;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(path, &s, &err), KV_OK, "%s", err.msg);
    cr_expect_str_eq(s.model.name, "tiny");
    cr_expect_eq(s.model.layers, 2);
    cr_expect_eq(s.model.kv_heads, 1);
    cr_expect_eq(s.measurement, 2);
    cr_assert_eq(s.n_texts, 1u);
    cr_expect_eq(s.texts[0].tokens, 9000);
    cr_assert_eq(s.n_lynx, 1u);
    const kv_accept_curve *c = &s.lynx[0].curve;
    cr_expect_eq(c->positions, 3);
    cr_expect_eq(c->n_lengths, 2);
    cr_expect_eq(c->lengths[1], 4096);
    cr_expect_eq(c->accept[1][2], 0.30000000000000004);
    cr_expect_eq(c->samples[1], 16);
    cr_assert_eq(s.n_diffkv, 1u);
    const kv_diffkv_curve *d = &s.diffkv[0].curve;
    cr_expect_eq(d->window, 32);
    cr_expect_eq(s.diffkv[0].points, 3);
    cr_expect_eq(d->table[1].layers, 2);
    cr_expect_eq(d->table[1].z_prefill[3 + 1], 1.5, "length 1, layer 1, u = 1/2");
    cr_expect_eq(d->table[0].z_exit[2], 5);
    cr_assert_eq(s.n_accuracy, 1u);
    cr_expect_eq(s.accuracy[0].delta_ppl_ci95[1], 1.1);
    cr_expect(isnan(s.accuracy[0].top1_agree_ci95[0]), "absent interval is NaN");
    cr_expect(isnan(s.accuracy[0].needle_recall));
    cr_expect_eq(s.accuracy[0].attention_error[1], 0.02);

    /* lookups: one-text entries match a policy's full per-head set of that encoding */
    kv_encoding e[2];
    cr_assert_eq(kv_encoding_parse("k=int8a4g32,v=int8a4g32", &e[0], &err), KV_OK, "%s", err.msg);
    e[1] = e[0];
    cr_expect_eq(kv_model_stats_find_lynx(&s, e, 2), &s.lynx[0]);
    cr_expect_eq(kv_model_stats_find_lynx(&s, e, 1), &s.lynx[0]);
    cr_assert_eq(kv_encoding_parse("k=int8a2g32,v=int8a4g32", &e[1], &err), KV_OK, "%s", err.msg);
    cr_expect_null(kv_model_stats_find_lynx(&s, e, 2), "one head differs: no match");
    cr_expect_null(kv_model_stats_find_accuracy(&s, e, 2));
    cr_expect_eq(kv_model_stats_find_diffkv(&s, 32), &s.diffkv[0]);
    cr_expect_null(kv_model_stats_find_diffkv(&s, 64));
    kv_model_stats_free(&s);
    free(path);
}

/* write -> read gives the very numbers (memcmp of the doubles), and writing again the same bytes. */
Test(model_stats, write_read_round_trip_exact)
{
    char *path = kvt_write(dir, "stats.json", VALID);
    kv_model_stats a, b;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(path, &a, &err), KV_OK, "%s", err.msg);
    /* numbers that %.6g would not keep */
    a.lynx[0].curve.accept[0][1] = 1.0 / 3.0;
    a.diffkv[0].z[4] = 0.1 + 0.2; /* length 0, prefill, layer 1, u = 1/2: between 0 and 9 */
    a.accuracy[0].delta_ppl = -2.2250738585072014e-308;
    char *out = kvt_path(dir, "out.json"), *out2 = kvt_path(dir, "out2.json");
    cr_assert_eq(kv_model_stats_write(out, &a, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_model_stats_read(out, &b, &err), KV_OK, "%s", err.msg);
    cr_expect_str_eq(b.model.name, a.model.name);
    cr_expect_str_eq(b.command, a.command);
    cr_expect_eq(b.n_texts, a.n_texts);
    cr_expect_eq(memcmp(b.texts, a.texts, sizeof *a.texts * a.n_texts), 0);
    cr_assert_eq(b.n_lynx, 1u);
    cr_expect_eq(memcmp(&b.lynx[0].curve, &a.lynx[0].curve, sizeof a.lynx[0].curve), 0, "accept curve bytes");
    cr_expect_eq(b.lynx[0].encodings.n, 1);
    cr_expect_eq(memcmp(b.lynx[0].encodings.enc, a.lynx[0].encodings.enc, sizeof(kv_encoding)), 0);
    cr_assert_eq(b.n_diffkv, 1u);
    size_t nz = 2 * 2 * 2 * 3;
    cr_expect_eq(memcmp(b.diffkv[0].z, a.diffkv[0].z, nz * sizeof(double)), 0, "quantile bytes");
    cr_expect_eq(b.diffkv[0].curve.table[1].z_exit - b.diffkv[0].z, (ptrdiff_t)(3 * 2 * 3));
    cr_assert_eq(b.n_accuracy, 1u);
    cr_expect_eq(memcmp(&b.accuracy[0].delta_ppl, &a.accuracy[0].delta_ppl, sizeof(double)), 0);
    cr_expect_eq(memcmp(b.accuracy[0].attention_error, a.accuracy[0].attention_error, 2 * sizeof(double)), 0);
    cr_expect(isnan(b.accuracy[0].needle_recall));
    cr_expect(isnan(b.accuracy[0].top1_agree_ci95[0]));
    cr_assert_eq(kv_model_stats_write(out2, &b, &err), KV_OK, "%s", err.msg);
    char *t1 = kvt_read(out, NULL), *t2 = kvt_read(out2, NULL);
    cr_expect_str_eq(t1, t2, "the written bytes are a function of the numbers");
    cr_expect(strstr(t1, "0.33333333333333331") != NULL, "17 significant digits: %s", t1);
    char *listing = kvt_listing(dir);
    cr_expect_str_eq(listing, "out.json out2.json stats.json", "no temporary left");
    free(listing);
    free(t1);
    free(t2);
    kv_model_stats_free(&a);
    kv_model_stats_free(&b);
    free(out);
    free(out2);
    free(path);
}

Test(model_stats, write_failure_leaves_nothing)
{
    char *path = kvt_write(dir, "stats.json", VALID);
    kv_model_stats a;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(path, &a, &err), KV_OK, "%s", err.msg);
    a.lynx[0].curve.accept[1][0] = NAN;
    char *out = kvt_path(dir, "out.json");
    cr_expect_neq(kv_model_stats_write(out, &a, &err), KV_OK);
    cr_expect(strstr(err.msg, "lynx[0]") != NULL, "%s", err.msg);
    char *listing = kvt_listing(dir);
    cr_expect_str_eq(listing, "stats.json", "neither the file nor a temporary is left");
    free(listing);
    kv_model_stats_free(&a);
    free(out);
    free(path);
}

/* Every encoding kind the shipped policies produce reads back to its text and to the same fields. */
Test(model_stats, encoding_text_round_trip)
{
    static const char *const texts[] = {
        "k=bf16,v=bf16",
        "k=int8g32,v=int8g32",
        "k=int4g128,v=int2g64",
        "k=int8a4g32,v=int8a4g32",
        "k=int8a2g32,v=int8a6g32",
        "k=int2g32c,v=int2g32,window=32",
        "k=int8g32,v=int4g32,low=int4g32/int2g32,alpha=1/0.02,recent=32",
        "k=int8g32,v=int4g32,low=int4g32c/int2g32,alpha=0.10000000000000001/0,recent=0",
        "k=bf16,v=int4g32,window=16,low=int4g32/int2g32,alpha=2.5/0.5,recent=64",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        kv_encoding e, f;
        kv_error err = {0};
        char buf[256];
        cr_assert_eq(kv_encoding_parse(texts[i], &e, &err), KV_OK, "%s: %s", texts[i], err.msg);
        cr_assert_eq(kv_encoding_text(&e, buf, sizeof buf), 0);
        cr_expect_str_eq(buf, texts[i]);
        cr_assert_eq(kv_encoding_parse(buf, &f, &err), KV_OK, "%s", err.msg);
        cr_expect_eq(memcmp(&e, &f, sizeof e), 0, "%s", texts[i]);
    }
    kv_encoding e;
    kv_error err = {0};
    cr_assert_eq(kv_encoding_parse("k=int8a4g32,v=int8a4g32", &e, &err), KV_OK);
    cr_expect_eq(e.key.bits, 8);
    cr_expect_eq(e.key.anchor_bits, 4);
    cr_expect_eq(e.key.group_size, 32);
    cr_assert_eq(kv_encoding_parse("k=int2g32c,v=int2g32,window=32", &e, &err), KV_OK);
    cr_expect(e.key.per_channel && !e.value.per_channel);
    cr_expect_eq(e.full_precision_window, 32);
    cr_assert_eq(kv_encoding_parse("k=int8g32,v=int4g32,low=int4g32/int2g32,alpha=1/0.02,recent=32", &e, &err),
                 KV_OK);
    cr_expect(e.diffkv);
    cr_expect_eq(e.alpha_low, 0.02);
    cr_expect_eq(e.value_low.bits, 2);
    cr_expect_eq(e.window, 32);
    static const char *const bad[] = {
        "",  "k=bf16", "k=bf16,v=bf16,", "k=int8,v=bf16", "k=int8a8g32,v=bf16", "k=int17g32,v=bf16",
        "k=int8g0,v=bf16", "k=bf16c,v=bf16", "k=bf16,v=bf16,window=0",
        "k=int8g32,v=int4g32,low=int4g32/int2g32,alpha=0.02/1,recent=32",
        "k=int8g32,v=int4g32,low=int4g32/int2g32,alpha=1/0.02", "K=bf16,v=bf16", "k=bf16,v=bf16 ",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kv_error e2 = {0};
        cr_expect_eq(kv_encoding_parse(bad[i], &e, &e2), KV_EINPUT, "\"%s\" parsed", bad[i]);
        cr_expect(strstr(e2.msg, "encoding \"") != NULL, "%s", e2.msg);
    }
}

Test(model_stats, truncated_json)
{
    char *t = strdup(VALID);
    t[strlen(t) / 2] = 0;
    char *path = kvt_write(dir, "stats.json", t);
    kv_model_stats s;
    kv_error err = {0};
    cr_expect_eq(kv_model_stats_read(path, &s, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "stats.json:") != NULL, "%s", err.msg);
    free(path);
    free(t);
}

Test(model_stats, missing_file)
{
    char *path = kvt_path(dir, "absent.json");
    kv_model_stats s;
    kv_error err = {0};
    cr_expect_eq(kv_model_stats_read(path, &s, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "absent.json") != NULL, "%s", err.msg);
    free(path);
}

#define BAD(name, from, to, line, what)                                                                          \
    Test(model_stats, name)                                                                                      \
    {                                                                                                            \
        char *t = replace(VALID, from, to);                                                                      \
        expect_bad(t, line, what);                                                                               \
        free(t);                                                                                                 \
    }

BAD(wrong_format, "\"kvsim-model-stats\"", "\"kvsim-results\"", 2, "format is \"kvsim-results\"")
BAD(version_2, "\"version\": 1", "\"version\": 2", 3, "version is 2")
BAD(lengths_not_increasing, "[1024, 4096],\n    \"accept\"", "[4096, 4096],\n    \"accept\"", 11,
    "lynx[0].lengths[1] is 4096")
BAD(rate_above_one, "0.93,", "1.5,", 13, "lynx[0].accept[1][1] is 1.5")
BAD(rate_below_zero, "[0.97,", "[-0.01,", 12, "lynx[0].accept[0][0] is -0.01")
BAD(accept_row_short, "[0.96, 0.93, 0.30000000000000004]", "[0.96, 0.93]", 13,
    "lynx[0].accept[1] has 2 numbers, positions is 3")
BAD(accept_rows_not_lengths, "[0.97, 0.95, 0.1],\n               [0.96, 0.93, 0.30000000000000004]",
    "[0.97, 0.95, 0.1]", 12, "lynx[0].accept has 1 element, lengths has 2")
BAD(samples_count, "[32, 16]", "[32]", 14, "lynx[0].samples has 1 element")
BAD(wrong_quantile_count, "[[0, 1, 9]]]", "[[0, 1]]]", 17, "diffkv[0].prefill[0][1][0] has 2 numbers, points is 3")
BAD(quantiles_decrease, "[0.1, 1.5, 10]", "[0.1, 1.5, 1]", 18, "diffkv[0].prefill[1][1][0][2] is 1")
BAD(shape_layers, "[[[[0, 0.6, 5]], [[0, 1.1, 6]]],", "[[[[0, 0.6, 5]]],", 19,
    "diffkv[0].exit[0] has 1 element, model.layers is 2")
BAD(shape_kv_heads, "[[[0, 0.7, 5.5]], [[0, 1.2, 6.5]]]", "[[[0, 0.7, 5.5], [0, 1, 2]], [[0, 1.2, 6.5]]]", 20,
    "diffkv[0].exit[1][0] has 2 elements, model.kv_heads is 1")
BAD(encodings_count, "[\"k=int8a4g32,v=int8a4g32\"]", "[\"k=bf16,v=bf16\", \"k=bf16,v=bf16\", \"k=bf16,v=bf16\"]",
    9, "lynx[0].encodings has 3 texts; expected 1 or layers x kv_heads")
BAD(encoding_syntax, "\"k=int8a4g32,v=int8a4g32\"", "\"k=int8a4g32;v=int8a4g32\"", 9,
    "lynx[0].encodings[0] encoding \"k=int8a4g32;v=int8a4g32\"")
BAD(unknown_member, "\"positions\": 3,", "\"positions\": 3, \"temperature\": 1,", 10,
    "lynx[0] has an unknown member \"temperature\"")
BAD(unknown_top_member, "\"version\": 1,", "\"version\": 1, \"extra\": [],", 3,
    "the file has an unknown member \"extra\"")
BAD(missing_member, "\"samples\": [32, 16]", "\"sample\": [32, 16]", 14, "lynx[0] has an unknown member \"sample\"")
BAD(missing_model_member, "\"head_dim\": 8, ", "", 4, "model has no \"head_dim\"")
BAD(bad_sha, "\"file\": \"tiny.gguf\", \"sha256\": \"\"", "\"file\": \"tiny.gguf\", \"sha256\": \"ABC\"", 4,
    "model.sha256 is \"ABC\"")
BAD(positions_not_integer, "\"positions\": 3,", "\"positions\": 2.5,", 10, "lynx[0].positions is 2.5")
BAD(top1_out_of_range, "\"top1_agree\": 0.93", "\"top1_agree\": 1.93", 23, "accuracy[0].top1_agree is 1.93")
BAD(ci_reversed, "[0.7, 1.1]", "[1.1, 0.7]", 22, "accuracy[0].delta_ppl_ci95 is [1.1, 0.7]")
BAD(attention_error_layers, "[0.01, 0.02]", "[0.01]", 23, "accuracy[0].attention_error has 1 element")
BAD(duplicate_window, "             [[[0, 0.7, 5.5]], [[0, 1.2, 6.5]]]]}],",
    "             [[[0, 0.7, 5.5]], [[0, 1.2, 6.5]]]]},\n"
    "    {\"window\": 32, \"points\": 2, \"lengths\": [8], \"prefill\": [[[[0, 1]], [[0, 1]]]],"
    " \"exit\": [[[[0, 1]], [[0, 1]]]]}],",
    21, "diffkv[1] has the window of diffkv[0]")

/* An accuracy entry's optional accepted_share (speculating encodings) reads, checks its range and writes back. */
Test(model_stats, accuracy_accepted_share_round_trips)
{
    char *text = replace(VALID, "\"top1_agree\": 0.93,",
                         "\"top1_agree\": 0.93, \"accepted_share\": 0.6015625, \"accepted_share_ci95\": [0.5, 0.7],");
    char *path = kvt_write(dir, "stats.json", text);
    kv_model_stats a, b;
    kv_error err = {0};
    cr_assert_eq(kv_model_stats_read(path, &a, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(a.accuracy[0].accepted_share, 0.6015625);
    cr_expect_eq(a.accuracy[0].accepted_share_ci95[1], 0.7);
    char *out = kvt_path(dir, "out.json");
    cr_assert_eq(kv_model_stats_write(out, &a, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_model_stats_read(out, &b, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(b.accuracy[0].accepted_share, 0.6015625);
    cr_expect_eq(b.accuracy[0].accepted_share_ci95[0], 0.5);
    char *written = kvt_read(out, NULL);
    cr_expect(strstr(written, "\"accepted_share\": 0.6015625") != NULL, "%s", written);
    free(written);
    kv_model_stats_free(&a);
    kv_model_stats_free(&b);
    free(out);
    free(path);
    free(text);

    /* absent: NaN, and not written */
    path = kvt_write(dir, "stats.json", VALID);
    cr_assert_eq(kv_model_stats_read(path, &a, &err), KV_OK, "%s", err.msg);
    cr_expect(isnan(a.accuracy[0].accepted_share));
    kv_model_stats_free(&a);
    free(path);

    text = replace(VALID, "\"top1_agree\": 0.93,", "\"top1_agree\": 0.93, \"accepted_share\": 1.5,");
    expect_bad(text, 23, "accuracy[0].accepted_share");
    free(text);
}
