/* cmd_measure.c — `kvsim measure SCENARIO --out FILE`: a model statistics file (docs/stats-format.md) from the reference model.
 *
 * For every policy of the scenario: a Lynx entry when it speculates on an
 * anchor split (k from its speculate hook, or accuracy.speculative_positions),
 * a DiffKV entry per distinct recent window; each measured at every --lengths
 * length (clamped to the model's context, with a note). Lynx is measured one
 * length at a time (core/accuracy/feed_lynx.h; each length cached on its own,
 * so an interrupted run resumes), DiffKV in one pass per window
 * (core/accuracy/diffkv_scores.h). An existing --out keeps its entries of
 * other encodings and windows; those measured now replace theirs. The file is
 * written atomically (kv_model_stats_write): on any failure it stays as it was.
 *
 * Ownership: everything allocated here is freed here.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/accuracy/diffkv_scores.h"
#include "core/accuracy/eval_config.h"
#include "core/accuracy/feed_lynx.h"
#include "core/accuracy/model_stats.h"
#include "core/base/alloc.h"
#include "core/base/sha256.h"
#include "core/cli/commands.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"
#include "core/policy/policy_spec.h"
#include "core/refmodel/model.h"

/* Version of the measurement method recorded in producer.measurement: Lynx's and DiffKV's constants. */
#define MEASURE_METHOD (KV_FEED_LYNX_VERSION * 100 + KV_DIFFKV_SCORES_VERSION)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvsim measure SCENARIO --out FILE [--set key.path=value]... [--lengths 1024,2048,4096,8192]\n"
            "                     [--samples N] [--quiet]\n\n"
            "Measures on the reference model (accuracy.model, default SmolLM2-135M) what the simulator needs\n"
            "of it, at each prompt length: Lynx acceptance per speculative position for each speculating\n"
            "policy of the scenario's `policies` (its own encodings, k from its speculate hook or\n"
            "accuracy.speculative_positions), and DiffKV significance quantiles per (layer, KV head) for each\n"
            "DiffKV window. Writes a model statistics file (docs/stats-format.md) that `stats:` with\n"
            "`lynx.from: file` and `diffkv.scores: file` reads.\n\n"
            "  --out FILE      the statistics file; an existing one keeps its entries of other encodings and\n"
            "                  windows (those measured now replace theirs); written atomically\n"
            "  --lengths L,..  prompt lengths in tokens, increasing (default 1024,2048,4096,8192); a length past\n"
            "                  the model's context is clamped to it (less k + 1 for Lynx), with a note\n"
            "  --samples N     Lynx speculations per length, 4..64, a multiple of 4 (default 32)\n"
            "  --set key.path=value  override any scenario key, as for kvsim run\n"
            "  --quiet         no progress lines on stderr\n\n"
            "Measurements are cached on disk (per length), so a rerun or an interrupted run resumes.\n"
            "Exit codes: 0 ok, 1 failed, 2 bad input.\n");
}

/* "1024,2048" into lengths (strictly increasing, each 1..1e7); false with a message otherwise. */
static bool parse_lengths(const char *text, int *lengths, int *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 10000000 || (*end && *end != ',') || *n >= KV_CURVE_MAX_LENGTHS ||
            (*n > 0 && v <= lengths[*n - 1])) {
            fprintf(stderr, "kvsim measure: --lengths '%s': expected up to %d increasing token counts like "
                            "1024,2048,4096,8192\n", text, KV_CURVE_MAX_LENGTHS);
            return false;
        }
        lengths[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "kvsim measure: --lengths '%s': a trailing comma\n", text);
            return false;
        }
    }
    if (*n == 0) {
        fprintf(stderr, "kvsim measure: --lengths: empty\n");
        return false;
    }
    return true;
}

/* What is measured of one policy. */
typedef struct target {
    const char *name;
    kv_encoding *enc; /* [lanes], owned */
    int k;            /* Lynx: speculative positions; 0: not a Lynx entry */
    int window;       /* DiffKV: recent window; -1: not DiffKV */
} target;

static bool same_encodings(const kv_encoding *a, const kv_encoding *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char x[256], y[256];
        if (kv_encoding_text(&a[i], x, sizeof x) || kv_encoding_text(&b[i], y, sizeof y) || strcmp(x, y) != 0)
            return false;
    }
    return true;
}

/* Encodings of every (layer, KV head) into one set: one text when all are equal (the file's short form). */
static kv_stats_encodings pack_encodings(const kv_encoding *enc, size_t lanes)
{
    bool uniform = true;
    for (size_t i = 1; i < lanes && uniform; i++)
        uniform = same_encodings(&enc[0], &enc[i], 1);
    kv_stats_encodings e = {uniform ? 1 : (int)lanes, NULL};
    e.enc = kv_malloc((size_t)e.n * sizeof *e.enc);
    memcpy(e.enc, enc, (size_t)e.n * sizeof *e.enc);
    return e;
}

/* The policies' targets: speculating anchor splits and DiffKV windows, at the longest length. */
static int find_targets(const kv_scenario *s, const kv_model_config *c, int spec_override, int probe_len,
                        target **out, size_t *n_out, kv_error *err)
{
    size_t n = s->policies.count, lanes = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    target *t = kv_calloc(n ? n : 1, sizeof *t);
    kv_policy_model card = {"reference", c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim};
    kv_policy_request req = {0, probe_len, 16, 0.0};
    int rc = KV_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        kv_policy_spec spec;
        kv_policy *p = NULL;
        rc = kv_policy_spec_read(s, i, &spec, err);
        if (!rc)
            rc = kv_policy_spec_load(&spec, s, &p, err);
        kv_policy_spec_free(&spec);
        t[i].name = s->policies.items[i];
        t[i].window = -1;
        t[i].enc = kv_calloc(lanes, sizeof *t[i].enc);
        for (int l = 0; l < c->n_layers && !rc; l++)
            for (int h = 0; h < c->n_kv_heads && !rc; h++)
                rc = kv_policy_encoding(p, &card, &req, l, h, &t[i].enc[(size_t)l * c->n_kv_heads + h], err);
        int k = 0;
        if (!rc)
            rc = kv_policy_speculation(p, &req, &k, err);
        if (!rc && k > 0 && spec_override > 0)
            k = spec_override;
        if (!rc && k > 0 && kv_eval_encodings_split(t[i].enc, lanes))
            t[i].k = k > KV_FEED_MAX_POSITIONS ? KV_FEED_MAX_POSITIONS : k;
        if (!rc && t[i].enc[0].diffkv)
            t[i].window = t[i].enc[0].window;
        if (rc)
            kv_error_prefix(err, "policy '%s': ", t[i].name);
        kv_policy_destroy(p);
    }
    *out = t;
    *n_out = n;
    return rc;
}

/* Lengths clamped to at most cap, with a note; duplicates after clamping dropped. */
static int clamp_lengths(const int *in, int n, int cap, const char *what, bool quiet, int *out)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        int v = in[i] > cap ? cap : in[i];
        if (v != in[i] && !quiet)
            fprintf(stderr, "kvsim measure: note: %s: length %d clamped to %d (the model's context less what "
                            "the measurement needs)\n", what, in[i], v);
        if (m == 0 || v > out[m - 1])
            out[m++] = v;
    }
    return m;
}

/* The text's token count on the model's tokenizer. */
static int count_tokens(const kv_model *m, const char *path, long *tokens, kv_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kv_error_set(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    char chunk[1 << 15];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        kv_grow((void **)&buf, 1, &cap, len + got);
        memcpy(buf + len, chunk, got);
        len += got;
    }
    fclose(f);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = kv_tokenizer_encode(kv_model_tokenizer(m), buf ? buf : "", len, false, &ids, &n_ids, err);
    *tokens = (long)n_ids;
    kv_free(ids);
    kv_free(buf);
    return rc;
}

static void add_text(kv_model_stats *st, const char *name, const char *sha, long tokens)
{
    for (size_t i = 0; i < st->n_texts; i++)
        if (strcmp(st->texts[i].name, name) == 0) {
            snprintf(st->texts[i].sha256, sizeof st->texts[i].sha256, "%s", sha);
            st->texts[i].tokens = tokens;
            return;
        }
    st->texts = kv_realloc(st->texts, (st->n_texts + 1) * sizeof *st->texts);
    struct kv_stats_text *t = &st->texts[st->n_texts++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->sha256, sizeof t->sha256, "%s", sha);
    t->tokens = tokens;
}

static void put_lynx(kv_model_stats *st, const target *t, size_t lanes, const kv_accept_curve *curve)
{
    const kv_stats_lynx *hit = kv_model_stats_find_lynx(st, t->enc, (int)lanes);
    size_t at = hit ? (size_t)(hit - st->lynx) : st->n_lynx;
    if (at == st->n_lynx) {
        st->lynx = kv_realloc(st->lynx, (st->n_lynx + 1) * sizeof *st->lynx);
        st->n_lynx++;
    } else {
        kv_free(st->lynx[at].encodings.enc);
    }
    st->lynx[at].encodings = pack_encodings(t->enc, lanes);
    st->lynx[at].curve = *curve;
}

static void put_diffkv(kv_model_stats *st, const kv_diffkv_measured *m)
{
    const kv_stats_diffkv *hit = kv_model_stats_find_diffkv(st, m->window);
    size_t at = hit ? (size_t)(hit - st->diffkv) : st->n_diffkv;
    if (!hit) {
        st->diffkv = kv_realloc(st->diffkv, (st->n_diffkv + 1) * sizeof *st->diffkv);
        st->n_diffkv++;
    } else {
        kv_free(st->diffkv[at].z);
    }
    kv_stats_diffkv *d = &st->diffkv[at];
    memset(d, 0, sizeof *d);
    const kv_diffkv_curve *c = &m->curve;
    size_t rows = (size_t)c->table[0].layers * (size_t)c->table[0].kv_heads * KV_DIFFKV_TABLE_POINTS;
    d->points = KV_DIFFKV_TABLE_POINTS;
    d->z = kv_malloc((size_t)c->n_lengths * 2 * rows * sizeof *d->z);
    memcpy(d->z, m->z, (size_t)c->n_lengths * 2 * rows * sizeof *d->z);
    d->curve = *c;
    for (int i = 0; i < c->n_lengths; i++) {
        d->curve.table[i].z_prefill = d->z + (size_t)i * 2 * rows;
        d->curve.table[i].z_exit = d->z + (size_t)i * 2 * rows + rows;
    }
}

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

int kv_cmd_measure(int argc, char **argv)
{
    const char *scenario = NULL, *out_path = NULL, *lengths_arg = "1024,2048,4096,8192";
    int samples = 32, quiet = 0, n_sets = 0;
    const char **sets = kv_calloc((size_t)argc + 1, sizeof *sets);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            kv_free(sets);
            return 0;
        } else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            sets[n_sets++] = argv[i] + 6;
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_path = argv[++i];
        } else if (strcmp(argv[i], "--lengths") == 0 && i + 1 < argc) {
            lengths_arg = argv[++i];
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            char *end = NULL;
            errno = 0;
            long v = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || errno || v < 4 || v > 64 || v % 4) {
                fprintf(stderr, "kvsim measure: --samples '%s': expected 4..64, a multiple of 4 (one per text)\n",
                        argv[i]);
                kv_free(sets);
                return 2;
            }
            samples = (int)v;
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (argv[i][0] == '-' || scenario) {
            fprintf(stderr, "kvsim measure: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            kv_free(sets);
            return 2;
        } else {
            scenario = argv[i];
        }
    }
    int req_lengths[KV_CURVE_MAX_LENGTHS], n_req = 0;
    if (!scenario || !out_path || !out_path[0]) {
        fprintf(stderr, "kvsim measure: %s\n", !scenario ? "a SCENARIO is needed" : "--out FILE is needed");
        usage(stderr);
        kv_free(sets);
        return 2;
    }
    if (!parse_lengths(lengths_arg, req_lengths, &n_req)) {
        kv_free(sets);
        return 2;
    }
    FILE *log = quiet ? NULL : stderr;
    kv_error err;
    kv_error_clear(&err);
    kv_scenario *s = NULL;
    kv_eval_scenario *es = NULL;
    kv_model_stats st;
    memset(&st, 0, sizeof st);
    target *t = NULL;
    size_t n_t = 0;
    kv_model *m = NULL;
    char model_path[4096] = "";
    const char *model_name = "smollm2-135m";
    int spec_override = 0;
    int rc = kv_scenario_load(scenario, sets, n_sets, &s, &err);
    if (!rc && s->accuracy) {
        rc = kv_eval_scenario_from(s, &es, &err);
        if (!rc) {
            model_name = es->model;
            spec_override = es->speculative_positions;
        }
    }
    /* An existing file is read first: one that is not a statistics file is not overwritten. */
    struct stat sb;
    bool existing = !rc && stat(out_path, &sb) == 0;
    if (existing) {
        rc = kv_model_stats_read(out_path, &st, &err);
        if (rc)
            kv_error_prefix(&err, "--out %s exists and is not a statistics file kvsim can extend (it is left as it "
                                  "is): ", out_path);
    }
    kv_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (!rc)
        rc = kv_eval_model_path(model_name, model_path, sizeof model_path, &err);
    if (!rc)
        rc = kv_model_read_config(model_path, &cfg, &err);
    char sha[65] = "";
    if (!rc)
        rc = kv_sha256_file(model_path, sha, &err);
    if (!rc && existing && st.model.sha256[0] && strcmp(st.model.sha256, sha) != 0)
        rc = kv_error_set(&err, KV_EINPUT,
                          "--out %s holds statistics of another model file (SHA-256 %.12s…, this one is %.12s…): "
                          "write to a new file", out_path, st.model.sha256, sha);
    if (!rc)
        rc = find_targets(s, &cfg, spec_override, req_lengths[n_req - 1], &t, &n_t, &err);
    size_t lanes = (size_t)cfg.n_layers * (size_t)cfg.n_kv_heads;
    int n_lynx = 0, windows[64], n_windows = 0, k_max = 0;
    for (size_t i = 0; !rc && i < n_t; i++) {
        if (t[i].k > 0) {
            bool dup = false;
            for (size_t j = 0; j < i; j++)
                dup |= t[j].k > 0 && t[j].k == t[i].k && same_encodings(t[j].enc, t[i].enc, lanes);
            if (dup)
                t[i].k = 0; /* same encodings and k as an earlier policy: one entry */
            else {
                n_lynx++;
                k_max = t[i].k > k_max ? t[i].k : k_max;
            }
        }
        if (t[i].window >= 0) {
            bool dup = false;
            for (int j = 0; j < n_windows; j++)
                dup |= windows[j] == t[i].window;
            if (!dup && n_windows < 64)
                windows[n_windows++] = t[i].window;
        }
    }
    if (!rc && n_lynx == 0 && n_windows == 0)
        rc = kv_error_set(&err, KV_EINPUT,
                          "%s: policies: none speculates on an anchor split (Lynx) or encodes with DiffKV: nothing to "
                          "measure", scenario);
    const char *const *texts = NULL;
    int n_texts = kv_feed_lynx_texts(&texts);
    if (!rc)
        rc = kv_model_load(model_path, &m, &err);
    /* Provenance. */
    if (!rc) {
        st.model = (kv_stats_model){.layers = cfg.n_layers, .heads = cfg.n_heads, .kv_heads = cfg.n_kv_heads,
                                    .head_dim = cfg.head_dim, .context = cfg.context_length};
        snprintf(st.model.name, sizeof st.model.name, "%s", cfg.name[0] ? cfg.name : model_name);
        snprintf(st.model.file, sizeof st.model.file, "%s", base_name(model_path));
        snprintf(st.model.sha256, sizeof st.model.sha256, "%s", sha);
        snprintf(st.tool, sizeof st.tool, "kvsim %s", KV_VERSION);
        /* Extending a file: its command stays in front, as the earlier step of what made it. */
        if (!existing)
            st.command[0] = '\0';
        kv_model_stats_add_command(&st, "measure", argc, argv);
        st.measurement = MEASURE_METHOD;
        for (int i = 0; i < n_texts && !rc; i++) {
            char tsha[65];
            long tokens = 0;
            rc = kv_sha256_file(texts[i], tsha, &err);
            if (!rc)
                rc = count_tokens(m, texts[i], &tokens, &err);
            if (!rc)
                add_text(&st, base_name(texts[i]), tsha, tokens);
        }
    }
    kv_model_destroy(m);
    m = NULL;
    /* Lynx: one length at a time (each cached on its own), all policies together. */
    if (!rc && n_lynx > 0) {
        int lens[KV_CURVE_MAX_LENGTHS];
        int n_l = clamp_lengths(req_lengths, n_req, cfg.context_length - k_max - 1, "lynx", quiet, lens);
        kv_eval_policy *ep = kv_calloc((size_t)n_lynx, sizeof *ep);
        int *of = kv_calloc((size_t)n_lynx, sizeof *of);
        kv_accept_curve *curves = kv_calloc((size_t)n_lynx, sizeof *curves);
        kv_accept_curve one[64];
        int e = 0;
        for (size_t i = 0; i < n_t; i++)
            if (t[i].k > 0) {
                ep[e] = (kv_eval_policy){t[i].name, t[i].enc, t[i].k};
                of[e++] = (int)i;
            }
        for (int li = 0; li < n_l && !rc; li++) {
            time_t t0 = time(NULL);
            if (log)
                fprintf(log, "kvsim measure: Lynx %d/%d: %d policies at %d tokens, %d speculations each\n", li + 1,
                        n_l, n_lynx, lens[li], samples);
            bool cached[64];
            for (int a = 0; a < n_lynx && !rc; a += 64) {
                int cnt = n_lynx - a < 64 ? n_lynx - a : 64;
                rc = kv_feed_lynx_curves(model_path, ep + a, cnt, &lens[li], 1, samples, log, one, cached, &err);
                for (int j = 0; !rc && j < cnt; j++) {
                    kv_accept_curve *c = &curves[a + j];
                    c->positions = one[j].positions;
                    c->lengths[c->n_lengths] = lens[li];
                    c->samples[c->n_lengths] = one[j].samples[0];
                    memcpy(c->accept[c->n_lengths], one[j].accept[0], sizeof one[j].accept[0]);
                    c->n_lengths++;
                }
            }
            if (!rc && log)
                fprintf(log, "kvsim measure: Lynx at %d tokens done (%lds)\n", lens[li], (long)(time(NULL) - t0));
        }
        for (int j = 0; !rc && j < n_lynx; j++)
            put_lynx(&st, &t[of[j]], lanes, &curves[j]);
        kv_free(ep);
        kv_free(of);
        kv_free(curves);
    }
    /* DiffKV: one pass per window over the longest length. */
    for (int w = 0; !rc && w < n_windows; w++) {
        int lens[KV_CURVE_MAX_LENGTHS];
        int n_l = clamp_lengths(req_lengths, n_req, cfg.context_length, "diffkv", quiet, lens);
        time_t t0 = time(NULL);
        if (log)
            fprintf(log, "kvsim measure: DiffKV window %d: significance at %d lengths up to %d tokens\n", windows[w],
                    n_l, lens[n_l - 1]);
        kv_diffkv_measured dm;
        rc = kv_diffkv_scores_curve(model_path, texts, n_texts, lens, n_l, windows[w], log, &dm, NULL, &err);
        if (!rc) {
            put_diffkv(&st, &dm);
            if (log)
                fprintf(log, "kvsim measure: DiffKV window %d done (%lds)\n", windows[w], (long)(time(NULL) - t0));
        }
        kv_diffkv_measured_free(&dm);
    }
    if (!rc)
        rc = kv_model_stats_write(out_path, &st, &err);
    if (!rc && log)
        fprintf(log, "kvsim measure: wrote %s (%zu Lynx entr%s, %zu DiffKV entr%s%s)\n", out_path, st.n_lynx,
                st.n_lynx == 1 ? "y" : "ies", st.n_diffkv, st.n_diffkv == 1 ? "y" : "ies",
                existing ? "; entries of other encodings and windows kept" : "");
    if (rc)
        fprintf(stderr, "kvsim measure: %s\n", err.msg);
    for (size_t i = 0; i < n_t; i++)
        kv_free(t[i].enc);
    kv_free(t);
    kv_model_stats_free(&st);
    kv_eval_scenario_destroy(es);
    kv_scenario_destroy(s);
    kv_free(sets);
    return rc == KV_OK ? 0 : (rc == KV_EINPUT ? 2 : 1);
}
