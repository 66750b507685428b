/* sweep.c — sweep files: load, expand (cartesian or zip), point commands, folders and state
 * (job scripts: sweep_emit.c; the combined CSV: sweep_collect.c). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "core/study/sweep.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "core/base/alloc.h"
#include "core/base/didyoumean.h"
#include "core/base/infile.h"
#include "core/base/json.h"
#include "core/config/scenario.h"
#include "core/study/capacity.h"
#include "core/study/study.h"
#include "core/study/sweep_internal.h"
#include "core/config/ytree.h"


static const char *const sweep_keys[] = {"name", "description", "base", "set", "mode", "matrix", "out",
                                         "output", "slo", "attainment", "precision"};

/* ---- Small string helpers -------------------------------------------------------------------- */

/* Whether s holds a control byte (0x01-0x1f or 0x7f): newline, tab, CR, ESC, DEL. */
static int has_control(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

/* s for a message: control bytes as '?', at most size - 1 bytes. Returns buf. */
static const char *shown(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 1 < size; p++)
        buf[n++] = *p < 0x20 || *p == 0x7f ? '?' : (char)*p;
    buf[n] = '\0';
    return buf;
}

static int needs_yaml_quotes(const char *s)
{
    if (!s[0])
        return 1;
    if (has_control(s))
        return 1;
    for (const char *p = s; *p; p++)
        if (strchr(",[]{}:#'\"&*!|>%@`", *p))
            return 1;
    /* "- x" and "? x" start block syntax; "-5" is a number. */
    return s[0] == ' ' || ((s[0] == '-' || s[0] == '?') && (s[1] == ' ' || s[1] == '\0')) || s[strlen(s) - 1] == ' ';
}

/* Writes a scalar as YAML flow text. Text with a control byte is double-quoted with escapes
   ("a\nb", "\x1b"): on one line, and read back byte for byte (a single-quoted YAML scalar would
   fold its line breaks into spaces). Other text that needs quotes is single-quoted. */
static void yaml_scalar(FILE *out, const char *s, int quoted)
{
    if (has_control(s)) {
        fputc('"', out);
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
            if (*p == '"' || *p == '\\')
                fprintf(out, "\\%c", *p);
            else if (*p == '\n')
                fputs("\\n", out);
            else if (*p == '\t')
                fputs("\\t", out);
            else if (*p == '\r')
                fputs("\\r", out);
            else if (*p < 0x20 || *p == 0x7f)
                fprintf(out, "\\x%02x", *p);
            else
                fputc(*p, out);
        }
        fputc('"', out);
    } else if (quoted || (needs_yaml_quotes(s) && s[0])) {
        fputc('\'', out);
        for (const char *p = s; *p; p++) {
            if (*p == '\'')
                fputc('\'', out);
            fputc(*p, out);
        }
        fputc('\'', out);
    } else {
        fputs(s, out);
    }
}

/* Writes a node as YAML flow text: what --set parses back into the same node. */
static void yaml_flow(FILE *out, const kv_ynode *n)
{
    if (n->kind == KV_YSCALAR) {
        yaml_scalar(out, n->value, n->quoted);
        return;
    }
    fputc(n->kind == KV_YSEQ ? '[' : '{', out);
    for (size_t i = 0; i < n->count; i++) {
        if (i)
            fputs(", ", out);
        if (n->kind == KV_YMAP) {
            yaml_scalar(out, n->keys[i], n->keys[i][0] == '\0');
            fputs(": ", out);
        }
        yaml_flow(out, n->items[i]);
    }
    fputc(n->kind == KV_YSEQ ? ']' : '}', out);
}

static char *flow_text(const kv_ynode *n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return kv_strdup("");
    yaml_flow(f, n);
    fclose(f);
    char *copy = kv_strdup(buf);
    free(buf); /* open_memstream's buffer comes from malloc */
    return copy;
}

char *kv_sweep_join3(const char *a, const char *b, const char *c)
{
    size_t len = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = kv_malloc(len);
    snprintf(s, len, "%s%s%s", a, b, c);
    return s;
}

int kv_sweep_shell_quote(FILE *out, const char *word)
{
    if (has_control(word))
        return -1; /* no one-line quoting for these in POSIX sh (dash has no $'...') */
    int safe = word[0] != '\0';
    for (const char *p = word; *p && safe; p++)
        safe = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               strchr("_@%+=:,./-", *p) != NULL;
    if (safe && ((word[0] >= 'a' && word[0] <= 'z') || (word[0] >= 'A' && word[0] <= 'Z') || word[0] == '_')) {
        /* NAME=... as a command's first word is an assignment, not the command: quote it. */
        size_t name = strspn(word, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        safe = word[name] != '=';
    }
    if (safe) {
        fputs(word, out);
        return 0;
    }
    fputc('\'', out);
    for (const char *p = word; *p; p++) {
        if (*p == '\'')
            fputs("'\\''", out);
        else
            fputc(*p, out);
    }
    fputc('\'', out);
    return 0;
}

/* The part of a point's folder name for one key=value: last key component, value made file-safe. */
static void name_part(FILE *out, const char *key, const char *value)
{
    const char *dot = strrchr(key, '.');
    const char *last = dot ? dot + 1 : key;
    fputc('-', out);
    for (const char *p = last; *p && p - last < 40; p++)
        fputc((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ? *p
                                                                                                             : '_',
              out);
    fputc('=', out);
    int written = 0;
    for (const char *p = value; *p && written < 40; p++) {
        char c = *p;
        if (strchr("[]{} '\"", c))
            continue;
        if (c == ',')
            c = '+';
        else if (c == ':')
            c = '-';
        else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._+-", c)))
            c = '_';
        fputc(c, out);
        written++;
    }
}

/* ---- Loading --------------------------------------------------------------------------------- */

static int bad(kv_error *err, const kv_ynode *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* KV_EINPUT with the node's file:line:col before the message. */
static int bad(kv_error *err, const kv_ynode *n, const char *fmt, ...)
{
    char w[512], msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kv_error_set(err, KV_EINPUT, "%s: %s", kv_ytree_where(n, w, sizeof w), msg);
}

/* The base scenario's absolute path: relative names are relative to the sweep file's folder. */
static int resolve_base(kv_sweep *sw, const kv_ynode *node, kv_error *err)
{
    char *tmp = kv_strdup(sw->path);
    char *dir = kv_strdup(dirname(tmp));
    kv_free(tmp);
    char *joined = node->value[0] == '/' ? kv_strdup(node->value) : kv_sweep_join3(dir, "/", node->value);
    kv_free(dir);
    char resolved[PATH_MAX], show[300];
    struct stat st;
    int rc = KV_OK;
    if (!node->value[0])
        rc = bad(err, node, "base: empty; name the scenario every point starts from, e.g. base: ../lynx.yaml");
    else if (has_control(node->value))
        rc = bad(err, node, "base: '%s': a control character (newline, tab, ...) in the path; a job script "
                 "cannot carry it on one line", shown(node->value, show, sizeof show));
    else if (!realpath(joined, resolved))
        rc = bad(err, node, "base: '%s' not found (a path relative to the sweep file's folder)", node->value);
    else if (stat(resolved, &st) != 0)
        rc = bad(err, node, "base: '%s': %s", node->value, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = bad(err, node, "base: '%s' is %s, not a scenario file", node->value,
                 S_ISDIR(st.st_mode) ? "a folder" : "a device or other special file");
    else if (has_control(resolved))
        rc = bad(err, node, "base: '%s' resolves to '%s': a control character (newline, tab, ...) in the path; "
                 "a job script cannot carry it on one line", node->value, shown(resolved, show, sizeof show));
    else
        sw->base = kv_strdup(resolved);
    kv_free(joined);
    return rc;
}

/* The first path on the way to dir (dir itself, or a folder above it) that exists and is not a
   folder, or NULL (owned by the caller). */
static char *non_folder_on_way(const char *dir)
{
    char *p = kv_strdup(dir);
    for (;;) {
        struct stat st;
        if (stat(p, &st) == 0) {
            if (S_ISDIR(st.st_mode))
                break;
            return p;
        }
        char *slash = strrchr(p, '/');
        if (!slash || slash == p)
            break;
        *slash = '\0';
    }
    kv_free(p);
    return NULL;
}

static int resolve_out(kv_sweep *sw, const char *out)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, ".");
    sw->cwd = kv_strdup(cwd);
    if (out[0] == '/')
        sw->out_dir = kv_strdup(out);
    else
        sw->out_dir = kv_sweep_join3(cwd, "/", out);
    size_t n = strlen(sw->out_dir);
    while (n > 1 && sw->out_dir[n - 1] == '/')
        sw->out_dir[--n] = '\0';
    return KV_OK;
}

/* Adds "key=value" (adopted) for every point; where is its set: key's position, or NULL. */
static void add_fixed(kv_sweep *sw, size_t *cap, char *kv, const char *where)
{
    size_t old = *cap;
    kv_grow((void **)&sw->fixed, sizeof *sw->fixed, cap, sw->n_fixed + 1);
    if (*cap != old) {
        size_t c = old;
        kv_grow((void **)&sw->fixed_where, sizeof *sw->fixed_where, &c, *cap);
    }
    sw->fixed_where[sw->n_fixed] = where ? kv_strdup(where) : NULL;
    sw->fixed[sw->n_fixed++] = kv;
}

/* Builds every point's values: cartesian (last key fastest) or zip. */
static int expand(kv_sweep *sw, const kv_ynode *matrix, kv_error *err)
{
    size_t n = sw->n_keys;
    size_t *lengths = kv_calloc(n ? n : 1, sizeof *lengths);
    const kv_ynode **lists = kv_calloc(n ? n : 1, sizeof *lists);
    size_t total = 1; /* an empty matrix is one point: the base scenario */
    int rc = KV_OK;
    for (size_t k = 0; k < n; k++) {
        const kv_ynode *v = matrix->items[k];
        lists[k] = v;
        lengths[k] = v->kind == KV_YSEQ ? v->count : 1;
        if (v->kind == KV_YSEQ && v->count == 0) {
            rc = bad(err, v, "matrix.%s: an empty list gives no points", sw->keys[k]);
            break;
        }
        if (sw->zip) {
            if (k > 0 && lengths[k] != lengths[0]) {
                rc = bad(err, v, "matrix.%s: mode zip needs lists of equal length (this one has %zu values, %s has "
                         "%zu)", sw->keys[k], lengths[k], sw->keys[0], lengths[0]);
                break;
            }
            total = lengths[0];
        } else {
            if (kv_mul_size(total, lengths[k], &total) != 0 || total > 1000000) {
                rc = bad(err, matrix, "matrix: more than a million points");
                break;
            }
        }
    }
    if (!rc) {
        sw->n_points = total;
        sw->points = kv_calloc(total, sizeof *sw->points);
        sw->choice = kv_calloc(total * (n ? n : 1), sizeof *sw->choice);
        int width = 2;
        for (size_t t = total > 0 ? total - 1 : 0; t >= 100; t /= 10)
            width++;
        for (size_t i = 0; i < total; i++) {
            kv_sweep_point *p = &sw->points[i];
            p->index = i;
            p->values = kv_calloc(n ? n : 1, sizeof *p->values);
            size_t rest = i;
            for (size_t kk = n; kk-- > 0;) {
                size_t at = sw->zip ? i : rest % lengths[kk];
                if (!sw->zip)
                    rest /= lengths[kk];
                const kv_ynode *v = lists[kk];
                p->values[kk] = flow_text(v->kind == KV_YSEQ ? v->items[at] : v);
                sw->choice[i * n + kk] = v->kind == KV_YSEQ ? at : 0;
            }
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            fprintf(f, "p%0*zu", width, i);
            for (size_t k = 0; k < n; k++)
                name_part(f, sw->keys[k], p->values[k]);
            fclose(f);
            if (len > 160)
                buf[160] = '\0';
            p->name = kv_strdup(buf);
            free(buf);
            p->dir = kv_sweep_join3(sw->out_dir, "/", p->name);
        }
    }
    kv_free(lengths);
    kv_free(lists);
    return rc;
}

/* Every point's argv and its shell line. KV_EINPUT if a word cannot be quoted (kv_sweep_load
   refuses such inputs before, so this is the last line of defence). */
static int build_commands(kv_sweep *sw, kv_error *err)
{
    int rc = KV_OK;
    sw->argv = kv_calloc(sw->n_points ? sw->n_points : 1, sizeof *sw->argv);
    sw->commands = kv_calloc(sw->n_points ? sw->n_points : 1, sizeof *sw->commands);
    for (size_t i = 0; i < sw->n_points; i++) {
        kv_sweep_point *p = &sw->points[i];
        /* kvsim run BASE, --set pairs, --set outputs.json=true, --out DIR, --quiet, NULL; or
           kvsim capacity BASE --slo S [--attainment A] [--precision P], --set pairs, --out DIR, --quiet */
        size_t max = 3 + 6 + 2 * (sw->n_fixed + sw->n_keys) + 2 + 2 + 1 + 1;
        char **argv = kv_calloc(max, sizeof *argv);
        size_t a = 0;
        argv[a++] = kv_strdup(sw->kvsim);
        argv[a++] = kv_strdup(sw->capacity ? "capacity" : "run");
        argv[a++] = kv_strdup(sw->base);
        if (sw->capacity) {
            argv[a++] = kv_strdup("--slo");
            argv[a++] = kv_strdup(sw->slo);
            if (sw->attainment) {
                argv[a++] = kv_strdup("--attainment");
                argv[a++] = kv_strdup(sw->attainment);
            }
            if (sw->precision) {
                argv[a++] = kv_strdup("--precision");
                argv[a++] = kv_strdup(sw->precision);
            }
        }
        for (size_t k = 0; k < sw->n_fixed; k++) {
            argv[a++] = kv_strdup("--set");
            argv[a++] = kv_strdup(sw->fixed[k]);
        }
        for (size_t k = 0; k < sw->n_keys; k++) {
            argv[a++] = kv_strdup("--set");
            argv[a++] = kv_sweep_join3(sw->keys[k], "=", p->values[k]);
        }
        /* The point is finished when results.json exists, so it must be written (kvsim capacity
           always writes its capacity.json). */
        if (!sw->capacity) {
            argv[a++] = kv_strdup("--set");
            argv[a++] = kv_strdup("outputs.json=true");
        }
        argv[a++] = kv_strdup("--out");
        argv[a++] = kv_strdup(p->dir);
        argv[a++] = kv_strdup("--quiet");
        argv[a] = NULL;
        sw->argv[i] = argv;
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
            return kv_error_set(err, KV_EFAIL, "sweep: out of memory writing point %zu's command", i);
        for (size_t k = 0; argv[k] && !rc; k++) {
            if (k)
                fputc(' ', f);
            if (kv_sweep_shell_quote(f, argv[k]) != 0) {
                char show[300];
                rc = kv_error_set(err, KV_EINPUT, "%s: point %s: argument '%s' has a control character (newline, "
                                  "tab, ...) that no job script can carry on one line", sw->path, p->name,
                                  shown(argv[k], show, sizeof show));
            }
        }
        fclose(f);
        sw->commands[i] = kv_strdup(buf);
        free(buf);
        if (rc)
            return rc;
    }
    return KV_OK;
}

/* A number in (lo, hi] (hi excluded when open_hi) for attainment: or precision:, kept as written. */
static int read_fraction(const kv_ynode *n, const char *key, double lo, double hi, int open_hi, char **text,
                         kv_error *err)
{
    char *end = NULL;
    double d = n->kind == KV_YSCALAR && n->value[0] ? strtod(n->value, &end) : NAN;
    if (!end || *end != '\0' || !(d > lo) || (open_hi ? !(d < hi) : !(d <= hi)))
        return bad(err, n, "%s: expected a number in (%g, %g%c (as kvsim capacity --%s takes)", key, lo, hi,
                   open_hi ? ')' : ']', key);
    *text = kv_strdup(n->value);
    return KV_OK;
}

/* output: run (default) | capacity, and capacity's slo:, attainment:, precision: (kvsim capacity's
   flags). The SLO is a mapping {ttft_p99_ms: 300, tpot_p99_ms: 30} or the --slo text itself; it is
   parsed here (kv_capacity_parse_slo) so a mistake stops the sweep before anything runs. */
static int read_output(kv_sweep *sw, const kv_ynode *tree, kv_error *err)
{
    const kv_ynode *output = kv_ytree_get(tree, "output", NULL);
    const kv_ynode *slo = kv_ytree_get(tree, "slo", NULL);
    const kv_ynode *att = kv_ytree_get(tree, "attainment", NULL);
    const kv_ynode *prec = kv_ytree_get(tree, "precision", NULL);
    if (output && (output->kind != KV_YSCALAR ||
                   (strcmp(output->value, "run") != 0 && strcmp(output->value, "capacity") != 0)))
        return bad(err, output, "output: expected run (each point a kvsim run, the default) or capacity (each "
                   "point a kvsim capacity search under slo:)");
    sw->capacity = output && strcmp(output->value, "capacity") == 0;
    const kv_ynode *extra = slo ? slo : att ? att : prec;
    if (!sw->capacity) {
        if (extra)
            return bad(err, extra, "%s: only for output: capacity (add output: capacity, or remove it)",
                       extra == slo ? "slo" : extra == att ? "attainment" : "precision");
        return KV_OK;
    }
    if (!slo)
        return bad(err, output, "output: capacity needs slo:, e.g. slo: {ttft_p99_ms: 300, tpot_p99_ms: 30}");
    char *text = NULL;
    if (slo->kind == KV_YSCALAR) {
        text = kv_strdup(slo->value);
    } else if (slo->kind == KV_YMAP && slo->count > 0) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
            return kv_error_set(err, KV_EFAIL, "sweep: out of memory reading slo:");
        for (size_t i = 0; i < slo->count; i++) {
            const kv_ynode *v = slo->items[i];
            if (v->kind != KV_YSCALAR || strpbrk(slo->keys[i], ",=") || strpbrk(v->value, ",=")) {
                fclose(f);
                free(buf);
                return bad(err, v, "slo.%s: expected a number of ms", slo->keys[i]);
            }
            fprintf(f, "%s%s=%s", i ? "," : "", slo->keys[i], v->value);
        }
        fclose(f);
        text = kv_strdup(buf);
        free(buf); /* open_memstream's buffer comes from malloc */
    } else {
        return bad(err, slo, "slo: expected a mapping of bounds in ms, e.g. {ttft_p99_ms: 300, tpot_p99_ms: 30}");
    }
    kv_slo parsed;
    kv_error e = {0};
    if (has_control(text) || kv_capacity_parse_slo(text, &parsed, &e) != KV_OK) {
        int rc = bad(err, slo, "slo: %s", e.msg[0] ? e.msg : "a control character in the bounds");
        kv_free(text);
        return rc;
    }
    sw->slo = text;
    if (att && read_fraction(att, "attainment", 0, 1, 0, &sw->attainment, err))
        return err->code;
    if (prec && read_fraction(prec, "precision", 0, 1, 1, &sw->precision, err))
        return err->code;
    return KV_OK;
}

int kv_sweep_load(const char *path, const char *const *extra_sets, int n_extra, const char *out_dir,
                  const char *kvsim, kv_sweep **out, kv_error *err)
{
    *out = NULL;
    kv_ynode *tree = NULL;
    int rc = kv_ytree_load_file(path, &tree, err);
    if (rc)
        return rc;
    kv_sweep *sw = kv_calloc(1, sizeof *sw);
    sw->path = kv_strdup(path);
    sw->kvsim = kv_strdup(kvsim && kvsim[0] ? kvsim : "kvsim");
    size_t cap_fixed = 0;
    if (tree->kind != KV_YMAP)
        rc = bad(err, tree, "a sweep file is a mapping: base:, matrix:, mode:, set:, out: (docs/sweeps.md)");
    for (size_t i = 0; !rc && i < tree->count; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof sweep_keys / sizeof sweep_keys[0]; k++)
            known |= strcmp(tree->keys[i], sweep_keys[k]) == 0;
        if (!known) {
            char hint[80] = "";
            const char *best = kv_did_you_mean(tree->keys[i], sweep_keys, sizeof sweep_keys / sizeof sweep_keys[0]);
            if (best)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
            rc = kv_error_set(err, KV_EINPUT, "%s:%d:%d: unknown key '%s'%s; a sweep file has name, description, "
                              "base, set, mode, matrix, out, output, slo, attainment, precision", path, tree->key_lines[i], tree->key_cols[i],
                              tree->keys[i], hint);
        }
    }
    const kv_ynode *name = rc ? NULL : kv_ytree_get(tree, "name", NULL);
    const kv_ynode *base = rc ? NULL : kv_ytree_get(tree, "base", NULL);
    const kv_ynode *set = rc ? NULL : kv_ytree_get(tree, "set", NULL);
    const kv_ynode *mode = rc ? NULL : kv_ytree_get(tree, "mode", NULL);
    const kv_ynode *matrix = rc ? NULL : kv_ytree_get(tree, "matrix", NULL);
    const kv_ynode *outn = rc ? NULL : kv_ytree_get(tree, "out", NULL);
    char show[300];
    if (!rc && name && name->kind != KV_YSCALAR)
        rc = bad(err, name, "name: expected text");
    if (!rc && name && has_control(name->value))
        rc = bad(err, name, "name: '%s': a control character (newline, tab, ...) in the name; the name goes into "
                 "job scripts' headers, one line each", shown(name->value, show, sizeof show));
    if (!rc) {
        if (name && name->value[0]) {
            sw->name = kv_strdup(name->value);
        } else {
            char *tmp = kv_strdup(path);
            const char *b = basename(tmp);
            size_t len = strlen(b);
            if (len > 5 && strcmp(b + len - 5, ".yaml") == 0)
                len -= 5;
            else if (len > 4 && strcmp(b + len - 4, ".yml") == 0)
                len -= 4;
            sw->name = kv_strndup(b, len);
            kv_free(tmp);
            if (has_control(sw->name))
                rc = kv_error_set(err, KV_EINPUT, "%s: name: the sweep file's name has a control character (newline, "
                                  "tab, ...); give the sweep a name: line", shown(path, show, sizeof show));
        }
    }
    if (!rc && !base)
        rc = kv_error_set(err, KV_EINPUT, "%s: base: missing; name the scenario every point starts from, e.g. "
                          "base: ../lynx.yaml", path);
    if (!rc && base->kind != KV_YSCALAR)
        rc = bad(err, base, "base: expected a path to a scenario");
    if (!rc)
        rc = resolve_base(sw, base, err);
    char where[512];
    if (!rc)
        sw->base_where = kv_strdup(kv_ytree_where(base, where, sizeof where));
    if (!rc && mode) {
        if (mode->kind != KV_YSCALAR || (strcmp(mode->value, "cartesian") != 0 && strcmp(mode->value, "zip") != 0))
            rc = bad(err, mode, "mode: expected cartesian or zip");
        else
            sw->zip = strcmp(mode->value, "zip") == 0;
    }
    if (!rc)
        rc = read_output(sw, tree, err);
    if (!rc && set) {
        if (set->kind != KV_YMAP)
            rc = bad(err, set, "set: expected a mapping of scenario keys to values, e.g. {workload.requests: 16}");
        for (size_t i = 0; !rc && i < set->count; i++) {
            snprintf(where, sizeof where, "%s:%d:%d", set->file, set->key_lines[i], set->key_cols[i]);
            if (has_control(set->keys[i])) {
                rc = kv_error_set(err, KV_EINPUT, "%s: set.%s: a control character (newline, tab, ...) in a key",
                                  where, shown(set->keys[i], show, sizeof show));
                break;
            }
            char *v = flow_text(set->items[i]);
            add_fixed(sw, &cap_fixed, kv_sweep_join3(set->keys[i], "=", v), where);
            kv_free(v);
        }
    }
    for (int i = 0; !rc && i < n_extra; i++) {
        if (!strchr(extra_sets[i], '='))
            rc = kv_error_set(err, KV_EINPUT, "--set %s: expected key.path=value", shown(extra_sets[i], show,
                                                                                         sizeof show));
        else if (has_control(extra_sets[i]))
            rc = kv_error_set(err, KV_EINPUT, "--set %s: a control character (newline, tab, ...); write it as a "
                              "YAML escape in double quotes, e.g. --set 'name=\"a\\nb\"'",
                              shown(extra_sets[i], show, sizeof show));
        else
            add_fixed(sw, &cap_fixed, kv_strdup(extra_sets[i]), NULL);
    }
    if (!rc && matrix && matrix->kind != KV_YMAP)
        rc = bad(err, matrix, "matrix: expected a mapping of scenario keys to lists of values, e.g. "
                 "{network.nic_bandwidth_gbps: [10, 25, 100]}");
    if (!rc && matrix) {
        sw->matrix_where = kv_strdup(kv_ytree_where(matrix, where, sizeof where));
        sw->n_keys = matrix->count;
        sw->keys = kv_calloc(matrix->count ? matrix->count : 1, sizeof *sw->keys);
        sw->item_where = kv_calloc(matrix->count ? matrix->count : 1, sizeof *sw->item_where);
        sw->key_where = kv_calloc(matrix->count ? matrix->count : 1, sizeof *sw->key_where);
        sw->n_items = kv_calloc(matrix->count ? matrix->count : 1, sizeof *sw->n_items);
        for (size_t k = 0; k < matrix->count; k++) {
            sw->keys[k] = kv_strdup(matrix->keys[k]);
            snprintf(where, sizeof where, "%s:%d:%d", matrix->file, matrix->key_lines[k], matrix->key_cols[k]);
            sw->key_where[k] = kv_strdup(where);
            const kv_ynode *v = matrix->items[k];
            size_t items = v->kind == KV_YSEQ ? v->count : 1;
            sw->n_items[k] = items;
            sw->item_where[k] = kv_calloc(items ? items : 1, sizeof *sw->item_where[k]);
            for (size_t j = 0; j < items; j++)
                sw->item_where[k][j] = kv_strdup(kv_ytree_where(v->kind == KV_YSEQ ? v->items[j] : v, where,
                                                                sizeof where));
            if (!rc && has_control(matrix->keys[k]))
                rc = kv_error_set(err, KV_EINPUT, "%s:%d:%d: matrix.%s: a control character (newline, tab, ...) in "
                                  "a key", matrix->file, matrix->key_lines[k], matrix->key_cols[k],
                                  shown(matrix->keys[k], show, sizeof show));
            if (!rc && v->kind == KV_YMAP)
                rc = bad(err, v, "matrix.%s: expected a list of values; write nested keys with dots "
                         "(network.nic_bandwidth_gbps: [10, 25])", matrix->keys[k]);
        }
    }
    if (!rc) {
        const char *o = out_dir && out_dir[0] ? out_dir : NULL;
        char deflt[600];
        if (!o && outn) {
            if (outn->kind != KV_YSCALAR || !outn->value[0])
                rc = bad(err, outn, "out: expected a folder");
            o = outn->value;
        }
        if (!o) {
            snprintf(deflt, sizeof deflt, "out/sweeps/%s", sw->name);
            o = deflt;
        }
        /* How to name where the folder came from in a message. */
        char origin[700];
        if (out_dir && out_dir[0])
            snprintf(origin, sizeof origin, "--out");
        else if (outn)
            snprintf(origin, sizeof origin, "%s: out", kv_ytree_where(outn, where, sizeof where));
        else
            snprintf(origin, sizeof origin, "%s: out (default, from the name)", path);
        if (!rc && has_control(o))
            rc = kv_error_set(err, KV_EINPUT, "%s: '%s': a control character (newline, tab, ...) in the folder's "
                              "path; a job script cannot carry it on one line", origin, shown(o, show, sizeof show));
        if (!rc)
            rc = resolve_out(sw, o);
        char *blocker = rc ? NULL : non_folder_on_way(sw->out_dir);
        if (blocker) {
            char show2[300];
            if (strcmp(blocker, sw->out_dir) == 0)
                rc = kv_error_set(err, KV_EINPUT, "%s: '%s' is a file, not a folder (the sweep's folder holds one "
                                  "folder per point)", origin, shown(o, show, sizeof show));
            else
                rc = kv_error_set(err, KV_EINPUT, "%s: '%s': '%s' on its way is a file, not a folder", origin,
                                  shown(o, show, sizeof show), shown(blocker, show2, sizeof show2));
            kv_free(blocker);
        }
    }
    if (!rc && has_control(sw->kvsim))
        rc = kv_error_set(err, KV_EINPUT, "--kvsim %s: a control character (newline, tab, ...) in the binary's path; "
                          "a job script cannot carry it on one line", shown(sw->kvsim, show, sizeof show));
    if (!rc)
        rc = expand(sw, matrix ? matrix : tree, err);
    if (!rc)
        rc = build_commands(sw, err);
    kv_ytree_free(tree);
    if (rc) {
        kv_sweep_destroy(sw);
        return rc;
    }
    *out = sw;
    return KV_OK;
}

void kv_sweep_destroy(kv_sweep *sw)
{
    if (!sw)
        return;
    for (size_t i = 0; i < sw->n_points; i++) {
        kv_sweep_point *p = &sw->points[i];
        for (size_t k = 0; k < sw->n_keys && p->values; k++)
            kv_free(p->values[k]);
        kv_free(p->values);
        kv_free(p->name);
        kv_free(p->dir);
        if (sw->argv && sw->argv[i]) {
            for (size_t a = 0; sw->argv[i][a]; a++)
                kv_free(sw->argv[i][a]);
            kv_free(sw->argv[i]);
        }
        if (sw->commands)
            kv_free(sw->commands[i]);
    }
    kv_free(sw->argv);
    kv_free(sw->commands);
    kv_free(sw->points);
    for (size_t k = 0; k < sw->n_keys; k++)
        kv_free(sw->keys[k]);
    kv_free(sw->keys);
    for (size_t k = 0; k < sw->n_fixed; k++)
        kv_free(sw->fixed[k]);
    kv_free(sw->fixed);
    kv_free(sw->choice);
    for (size_t k = 0; k < sw->n_keys && sw->item_where; k++) {
        for (size_t j = 0; j < sw->n_items[k] && sw->item_where[k]; j++)
            kv_free(sw->item_where[k][j]);
        kv_free(sw->item_where[k]);
    }
    kv_free(sw->item_where);
    kv_free(sw->n_items);
    for (size_t k = 0; k < sw->n_keys && sw->key_where; k++)
        kv_free(sw->key_where[k]);
    kv_free(sw->key_where);
    for (size_t k = 0; k < sw->n_fixed; k++)
        kv_free(sw->fixed_where[k]);
    kv_free(sw->fixed_where);
    kv_free(sw->base_where);
    kv_free(sw->matrix_where);
    kv_free(sw->path);
    kv_free(sw->name);
    kv_free(sw->base);
    kv_free(sw->out_dir);
    kv_free(sw->kvsim);
    kv_free(sw->slo);
    kv_free(sw->attainment);
    kv_free(sw->precision);
    kv_free(sw->cwd);
    kv_free(sw);
}

const char *kv_sweep_name(const kv_sweep *sw) { return sw->name; }
const char *kv_sweep_out_dir(const kv_sweep *sw) { return sw->out_dir; }
const char *kv_sweep_base(const kv_sweep *sw) { return sw->base; }
const char *kv_sweep_result_file(const kv_sweep *sw) { return sw->capacity ? "capacity.json" : "results.json"; }
size_t kv_sweep_key_count(const kv_sweep *sw) { return sw->n_keys; }
const char *kv_sweep_key(const kv_sweep *sw, size_t i) { return sw->keys[i]; }
size_t kv_sweep_point_count(const kv_sweep *sw) { return sw->n_points; }
const kv_sweep_point *kv_sweep_point_get(const kv_sweep *sw, size_t i) { return &sw->points[i]; }
char *const *kv_sweep_point_argv(const kv_sweep *sw, size_t i) { return sw->argv[i]; }
const char *kv_sweep_point_command(const kv_sweep *sw, size_t i) { return sw->commands[i]; }

/* ---- Validation ------------------------------------------------------------------------------ */

/* Whether a scenario error came from the value of `--set KEY` (ytree names such values "--set KEY"). */
static int names_set(const char *msg, const char *key, size_t key_len)
{
    for (const char *at = strstr(msg, "--set "); at; at = strstr(at + 1, "--set "))
        if (strncmp(at + 6, key, key_len) == 0 && at[6 + key_len] == ':')
            return 1;
    return 0;
}

/* Turns point i's scenario error into one that says where in the sweep file it comes from. */
static int blame(const kv_sweep *sw, size_t i, const kv_error *e, kv_error *err)
{
    const kv_sweep_point *p = &sw->points[i];
    for (size_t k = 0; k < sw->n_keys; k++) {
        if (!names_set(e->msg, sw->keys[k], strlen(sw->keys[k])))
            continue;
        if (strstr(e->msg, "unknown key")) /* the key is wrong, not this value: point at the key */
            return kv_error_set(err, KV_EINPUT, "%s: matrix.%s: %s", sw->key_where[k], sw->keys[k], e->msg);
        return kv_error_set(err, KV_EINPUT, "%s: matrix.%s: %s (point %s): %s",
                            sw->item_where[k][sw->choice[i * sw->n_keys + k]], sw->keys[k], p->values[k], p->name,
                            e->msg);
    }
    for (size_t f = 0; f < sw->n_fixed; f++) {
        const char *eq = strchr(sw->fixed[f], '=');
        size_t len = eq ? (size_t)(eq - sw->fixed[f]) : strlen(sw->fixed[f]);
        if (!names_set(e->msg, sw->fixed[f], len))
            continue;
        if (sw->fixed_where[f])
            return kv_error_set(err, KV_EINPUT, "%s: set.%.*s (every point): %s", sw->fixed_where[f], (int)len,
                                sw->fixed[f], e->msg);
        return kv_error_set(err, KV_EINPUT, "%s: --set %s (every point): %s", sw->path, sw->fixed[f], e->msg);
    }
    /* Nothing swept is named: the base itself, or a combination of values. */
    kv_scenario *s = NULL;
    kv_error base_err = {0};
    int base_rc = kv_scenario_load(sw->base, NULL, 0, &s, &base_err);
    kv_scenario_destroy(s);
    if (base_rc)
        return kv_error_set(err, KV_EINPUT, "%s: base: '%s' does not load as a scenario: %s", sw->base_where,
                            sw->base, base_err.msg);
    return kv_error_set(err, KV_EINPUT, "%s: point %s: %s", sw->matrix_where ? sw->matrix_where : sw->base_where,
                        p->name, e->msg);
}

int kv_sweep_validate(const kv_sweep *sw, kv_error *err)
{
    for (size_t i = 0; i < sw->n_points; i++) {
        /* Exactly the --set values of the point's command, in its order. */
        char *const *argv = sw->argv[i];
        size_t n = 0;
        while (argv[n])
            n++;
        const char **sets = kv_calloc(n ? n : 1, sizeof *sets);
        int n_sets = 0;
        for (size_t a = 0; a + 1 < n; a++)
            if (strcmp(argv[a], "--set") == 0)
                sets[n_sets++] = argv[++a];
        kv_scenario *s = NULL;
        kv_error e = {0};
        int rc = kv_scenario_load(sw->base, sets, n_sets, &s, &e);
        if (!rc)
            rc = kv_study_check(s, &e);
        kv_scenario_destroy(s);
        kv_free(sets);
        if (rc)
            return blame(sw, i, &e, err);
    }
    return KV_OK;
}

/* ---- Folders, manifest, state ---------------------------------------------------------------- */

static int write_text(const char *path, const char *text, kv_error *err)
{
    kv_afile a;
    int rc = kv_afile_open(&a, path, err);
    if (rc)
        return rc;
    fputs(text, a.f);
    return kv_afile_commit(&a, err);
}

int kv_sweep_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kv_sweep_prepare(const kv_sweep *sw, kv_error *err)
{
    int rc = kv_mkdirs(sw->out_dir, err);
    /* Temporaries of dead processes in the sweep folder: of the files kvsim sweep writes there, and
       of the points (kvsim sweep looks at those first, in kv_sweep_point_state). */
    if (!rc) {
        static const char *const files[] = {"points.json", "sweep.csv", "sweep.slurm", "jobs.txt", "figures"};
        size_t nf = sizeof files / sizeof files[0];
        const char **names = kv_calloc(sw->n_points + nf, sizeof *names);
        memcpy(names, files, sizeof files);
        for (size_t i = 0; i < sw->n_points; i++)
            names[nf + i] = sw->points[i].name;
        rc = kv_stale_reap_names(sw->out_dir, names, sw->n_points + nf, NULL, err);
        kv_free(names);
    }
    for (size_t i = 0; !rc && i < sw->n_points; i++)
        rc = kv_mkdirs(sw->points[i].dir, err);
    if (rc)
        return rc;
    char *path = kv_sweep_join3(sw->out_dir, "/", "points.json");
    kv_afile a;
    rc = kv_afile_open(&a, path, err);
    kv_free(path);
    if (rc)
        return rc;
    FILE *f = a.f;
    fputs("{\"sweep\":", f);
    kv_json_string(f, sw->path);
    fputs(",\"name\":", f);
    kv_json_string(f, sw->name);
    fputs(",\"base\":", f);
    kv_json_string(f, sw->base);
    fprintf(f, ",\"mode\":\"%s\",\"output\":\"%s\",\"cwd\":", sw->zip ? "zip" : "cartesian",
            sw->capacity ? "capacity" : "run");
    kv_json_string(f, sw->cwd);
    fputs(",\n\"set\":[", f);
    for (size_t k = 0; k < sw->n_fixed; k++) {
        if (k)
            fputc(',', f);
        kv_json_string(f, sw->fixed[k]);
    }
    fputs("],\n\"keys\":[", f);
    for (size_t k = 0; k < sw->n_keys; k++) {
        if (k)
            fputc(',', f);
        kv_json_string(f, sw->keys[k]);
    }
    fputs("],\n\"points\":[\n", f);
    for (size_t i = 0; i < sw->n_points; i++) {
        const kv_sweep_point *p = &sw->points[i];
        fprintf(f, "{\"point\":%zu,\"dir\":", i);
        kv_json_string(f, p->name);
        fputs(",\"values\":[", f);
        for (size_t k = 0; k < sw->n_keys; k++) {
            if (k)
                fputc(',', f);
            kv_json_string(f, p->values[k]);
        }
        fputs("],\"command\":", f);
        kv_json_string(f, sw->commands[i]);
        fputs(i + 1 < sw->n_points ? "},\n" : "}\n", f);
    }
    fputs("]}\n", f);
    rc = kv_afile_commit(&a, err);
    for (size_t i = 0; !rc && i < sw->n_points; i++) {
        char *cmd_path = kv_sweep_join3(sw->points[i].dir, "/", "command.txt");
        char *text = kv_sweep_join3(sw->commands[i], "\n", "");
        rc = write_text(cmd_path, text, err);
        kv_free(cmd_path);
        kv_free(text);
    }
    return rc;
}

/* A point's command.txt, or NULL if it is missing or not a regular file of at most 16 MiB. */
static char *read_small(const char *path)
{
    char *buf = NULL;
    kv_error quiet = {0};
    return kv_input_read_all(path, "command file", KV_INPUT_MAX_TEXT, &buf, NULL, &quiet) == KV_OK ? buf : NULL;
}

int kv_sweep_point_state(const kv_sweep *sw, size_t i, int *stale, int *interrupted)
{
    *stale = 0;
    *interrupted = 0;
    const kv_sweep_point *p = &sw->points[i];
    /* A run killed before it published left POINT.tmp.<pid> beside the point (afile.h): remove it,
       and do not count the point as finished whatever its folder holds. A live one means a run of
       this point is going on elsewhere; it is pending too. */
    kv_stale_counts tc;
    if (kv_stale_reap(sw->out_dir, p->name, &tc, NULL) != 0 || tc.removed + tc.restored + tc.live > 0)
        *interrupted = 1;
    char *results = kv_sweep_join3(p->dir, "/", kv_sweep_result_file(sw));
    int state = KV_POINT_PENDING;
    if (kv_sweep_file_exists(results) && !*interrupted) {
        char *cmd_path = kv_sweep_join3(p->dir, "/", "command.txt");
        char *old = read_small(cmd_path);
        kv_free(cmd_path);
        size_t len = old ? strlen(old) : 0;
        while (len > 0 && (old[len - 1] == '\n' || old[len - 1] == '\r'))
            old[--len] = '\0';
        if (!old || strcmp(old, sw->commands[i]) == 0) {
            state = KV_POINT_FINISHED;
        } else {
            *stale = 1;
            unlink(results);
        }
        kv_free(old);
    }
    kv_free(results);
    return state;
}
