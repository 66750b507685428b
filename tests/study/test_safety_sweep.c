/* test_safety_sweep.c — kvsim sweep under hostile input: job files run by real bash and GNU parallel,
 * names refused, every point validated first, signals stop the workers, an out path that is a file. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/jsonread.h"
#include "core/study/sweep.h"
#include "tests/support.h"

/* ---- Helpers ------------------------------------------------------------------------------------ */

static char *cat(const char *a, const char *b)
{
    size_t len = strlen(a) + strlen(b) + 1;
    char *s = malloc(len);
    snprintf(s, len, "%s%s", a, b);
    return s;
}

/* s with every "@P@" replaced by p (free it). */
static char *subst(const char *s, const char *p)
{
    char *out = strdup("");
    for (const char *at; (at = strstr(s, "@P@")) != NULL; s = at + 3) {
        char *head = strndup(s, (size_t)(at - s));
        char *t = cat(out, head);
        free(out);
        out = cat(t, p);
        free(t);
        free(head);
    }
    char *t = cat(out, s);
    free(out);
    return t;
}

/* A shell word for the test's own command lines (sh -c through popen/system): single quotes. */
static char *sq(const char *s)
{
    char *out = strdup("'");
    for (const char *p = s; *p; p++) {
        char one[2] = {*p, 0};
        char *t = cat(out, *p == '\'' ? "'\\''" : one);
        free(out);
        out = t;
    }
    char *t = cat(out, "'");
    free(out);
    return t;
}

/* s as a YAML double-quoted scalar (escapes for ", \ and control bytes). */
static char *yaml_dq(const char *s)
{
    char *out = strdup("\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char one[8];
        if (*p == '"' || *p == '\\')
            snprintf(one, sizeof one, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            snprintf(one, sizeof one, "\\x%02x", *p);
        else
            snprintf(one, sizeof one, "%c", *p);
        char *t = cat(out, one);
        free(out);
        out = t;
    }
    char *t = cat(out, "\"");
    free(out);
    return t;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Whether some entry of dir has ".tmp." or ".old." in its name (a temporary left behind). */
static int has_temporary(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int yes = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        yes |= strstr(e->d_name, ".tmp.") != NULL || strstr(e->d_name, ".old.") != NULL;
    closedir(d);
    return yes;
}

static int have_gnu_parallel(void)
{
    return system("parallel --version 2>/dev/null | grep -q 'GNU parallel'") == 0;
}

/* Values no job file may let loose. @P@ is the folder whose files would prove a command ran. */
static const char *const hostile[] = {
    "x\ntouch @P@/newline",
    "x\n touch @P@/newline-space #",
    "'; touch @P@/single-quote; '",
    "\"; touch @P@/double-quote; \"",
    "$(touch @P@/dollar)",
    "`touch @P@/backtick`",
    "a; touch @P@/semicolon",
    "a && touch @P@/and",
    "a & touch @P@/amp",
    "a | touch @P@/pipe",
    "*",
    "~",
    "~root/x",
    "-x",
    "--out=/tmp",
    "  two  spaces  ",
    "\xc3\xa9 \xc3\xbc \xe6\x97\xa5\xe6\x9c\xac",
    "",
    "#not a comment",
    "back\\slash\\",
    "\\n not a newline",
    "{} {1} {#} {.} {%} :::",
    "tab\there\rcr\x1b[31m",
    "ends with newline\n",
    "$HOME ${PATH} $0 $$ !! !-1",
    "'",
    "SEED=1",
};
#define N_HOSTILE (sizeof hostile / sizeof hostile[0])

/* The sweep file: the scenario's free-text `name` swept over the hostile values. */
static char *hostile_sweep(const char *dir, const char *pwn)
{
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *text = strdup("name: hostile\nbase: base.yaml\nmatrix:\n  name:\n");
    for (size_t i = 0; i < N_HOSTILE; i++) {
        char *v = subst(hostile[i], pwn);
        char *q = yaml_dq(v);
        char *line = cat("    - ", q);
        char *t1 = cat(text, line);
        char *t2 = cat(t1, "\n");
        free(text);
        free(t1);
        text = t2;
        free(line);
        free(q);
        free(v);
    }
    char *path = kvt_write(dir, "sweep.yaml", text);
    free(text);
    return path;
}

/* The stub kvsim: writes its arguments, each followed by a NUL, into DIR/argv.bin (DIR = its --out). */
static const char *stub_text = "#!/bin/sh\n"
                               "out=\n"
                               "prev=\n"
                               "for a in \"$@\"; do\n"
                               "  if [ \"$prev\" = --out ]; then out=$a; fi\n"
                               "  prev=$a\n"
                               "done\n"
                               "for a in \"$@\"; do printf '%s\\000' \"$a\"; done > \"$out/argv.bin\"\n";

/* Every point's argv.bin equals the argv kvsim sweep runs locally (argv[1..]), byte for byte; removes it. */
static void expect_argv_arrived(const kv_sweep *sw, const char *how)
{
    for (size_t i = 0; i < kv_sweep_point_count(sw); i++) {
        char *const *argv = kv_sweep_point_argv(sw, i);
        char *expect = NULL;
        size_t expect_len = 0;
        FILE *m = open_memstream(&expect, &expect_len);
        cr_assert_not_null(m);
        for (size_t a = 1; argv[a]; a++)
            fwrite(argv[a], 1, strlen(argv[a]) + 1, m);
        fclose(m);
        char *path = cat(kv_sweep_point_get(sw, i)->dir, "/argv.bin");
        size_t got_len = 0;
        char *got = kvt_read(path, &got_len);
        cr_expect_not_null(got, "%s: point %zu did not run (no %s)", how, i, path);
        if (got) {
            cr_expect(got_len == expect_len && memcmp(got, expect, got_len) == 0,
                      "%s: point %zu's arguments arrived changed (%zu bytes, expected %zu)", how, i, got_len,
                      expect_len);
        }
        unlink(path);
        free(got);
        free(path);
        free(expect);
    }
}

/* ---- 1. Job files under real bash and GNU parallel ------------------------------------------------ */

Test(sweep_safety, hostile_values_and_paths_in_job_files_run_by_bash_and_gnu_parallel, .timeout = 600)
{
    cr_assert(have_gnu_parallel(), "GNU parallel is missing (Debian package parallel; scripts/setup.sh installs it)");
    char *dir = kvt_tempdir();
    char *pwn = cat(dir, "/pwn");
    cr_assert_eq(mkdir(pwn, 0755), 0);
    char *sweep = hostile_sweep(dir, pwn);
    /* Hostile folder names too (all but control characters, which are refused: next test). */
    char *hostile_dir = subst("/out 'q' \"d\" $(touch @P@/outdir) `touch @P@/outdir2` %x #h \xc3\xa9 ; &", pwn);
    char *out_par = cat(dir, hostile_dir);
    char *stub_dir = subst("/stub $(touch @P@/stub) 'it''s'", pwn);
    char *stub_folder = cat(dir, stub_dir);
    char *q_stub_folder = sq(stub_folder);
    char mk[4096];
    snprintf(mk, sizeof mk, "mkdir -p %s", q_stub_folder);
    cr_assert_eq(system(mk), 0);
    free(q_stub_folder);
    char *stub = kvt_write(stub_folder, "kvsim stub;x", stub_text);
    cr_assert_eq(chmod(stub, 0755), 0);

    kv_error err = {0};
    kv_sweep *sw = NULL;
    cr_assert_eq(kv_sweep_load(sweep, NULL, 0, out_par, stub, &sw, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_sweep_point_count(sw), N_HOSTILE);

    /* GNU parallel: one job per line, every value intact, nothing injected. */
    char *q_sweep = sq(sweep), *q_out = sq(out_par), *q_stub = sq(stub);
    char args[8192], cmd[8192], *out = NULL;
    snprintf(args, sizeof args, "sweep %s --emit parallel --out %s --kvsim %s", q_sweep, q_out, q_stub);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    char *jobs = cat(out_par, "/jobs.txt");
    char *q_jobs = sq(jobs);
    size_t len = 0;
    char *text = kvt_read(jobs, &len);
    cr_assert_not_null(text);
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        lines += c == '\n';
        cr_expect(c == '\n' || (c >= 0x20 && c != 0x7f), "jobs.txt: control byte 0x%02x at %zu", c, i);
    }
    cr_expect_eq(lines, N_HOSTILE, "jobs.txt: one line per point");
    free(text);
    /* From sh (dash here), whose parallel runs the lines with /bin/sh, then from bash. */
    snprintf(cmd, sizeof cmd, "cd / && parallel -j 4 < %s", q_jobs);
    cr_expect_eq(system(cmd), 0, "parallel < jobs.txt under sh");
    expect_argv_arrived(sw, "parallel (sh)");
    snprintf(cmd, sizeof cmd, "bash -c 'cd / && parallel -j 4 < \"$0\"' %s", q_jobs);
    cr_expect_eq(system(cmd), 0, "parallel < jobs.txt under bash");
    expect_argv_arrived(sw, "parallel (bash)");
    /* The same lines as plain scripts. */
    snprintf(cmd, sizeof cmd, "cd / && sh -e %s", q_jobs);
    cr_expect_eq(system(cmd), 0);
    expect_argv_arrived(sw, "sh jobs.txt");
    snprintf(cmd, sizeof cmd, "cd / && bash -e %s", q_jobs);
    cr_expect_eq(system(cmd), 0);
    expect_argv_arrived(sw, "bash jobs.txt");
    kv_sweep_destroy(sw);

    /* The Slurm array, each task by hand under bash. */
    char *out_slurm = cat(out_par, " slurm");
    cr_assert_eq(kv_sweep_load(sweep, NULL, 0, out_slurm, stub, &sw, &err), KV_OK, "%s", err.msg);
    char *q_slurm_out = sq(out_slurm);
    snprintf(args, sizeof args, "sweep %s --emit slurm --out %s --kvsim %s", q_sweep, q_slurm_out, q_stub);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    char *script = cat(out_slurm, "/sweep.slurm");
    char *q_script = sq(script);
    snprintf(cmd, sizeof cmd, "bash -n %s", q_script);
    cr_expect_eq(system(cmd), 0, "the script parses");
    for (size_t i = 0; i < N_HOSTILE; i++) {
        snprintf(cmd, sizeof cmd, "cd / && SLURM_ARRAY_TASK_ID=%zu bash %s", i, q_script);
        cr_expect_eq(system(cmd), 0, "task %zu", i);
    }
    expect_argv_arrived(sw, "slurm task");
    kv_sweep_destroy(sw);

    /* The real kvsim, through GNU parallel: each point's scenario name is the value, byte for byte. */
    char *out_real = cat(out_par, " real");
    char *q_real = sq(out_real);
    snprintf(args, sizeof args, "sweep %s --emit parallel --out %s", q_sweep, q_real);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    char *real_jobs = cat(out_real, "/jobs.txt");
    char *q_real_jobs = sq(real_jobs);
    snprintf(cmd, sizeof cmd, "cd / && parallel -j 2 < %s", q_real_jobs);
    cr_expect_eq(system(cmd), 0, "the real points ran");
    cr_assert_eq(kv_sweep_load(sweep, NULL, 0, out_real, NULL, &sw, &err), KV_OK, "%s", err.msg);
    for (size_t i = 0; i < N_HOSTILE; i++) {
        char *res = cat(kv_sweep_point_get(sw, i)->dir, "/results.json");
        kv_jvalue *j = NULL;
        kv_error jerr = {0};
        cr_expect_eq(kv_jread_file(res, &j, &jerr), KV_OK, "point %zu: %s", i, jerr.msg);
        const kv_jvalue *name = kv_jvalue_get(kv_jvalue_get(j, "scenario"), "name");
        char *want = subst(hostile[i], pwn);
        cr_expect(name && name->kind == KV_JSTRING && name->length == strlen(want) &&
                      memcmp(name->text, want, name->length) == 0,
                  "point %zu: the scenario's name arrived as '%s', not '%s'", i, name ? name->text : "(none)", want);
        free(want);
        kv_jvalue_free(j);
        free(res);
    }
    kv_sweep_destroy(sw);
    snprintf(args, sizeof args, "sweep --collect %s", q_real);
    cr_expect_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);

    cr_expect_eq(count_entries(pwn), 0, "an injected command ran: %s is not empty", pwn);
    free(q_real_jobs);
    free(real_jobs);
    free(q_real);
    free(out_real);
    free(q_script);
    free(script);
    free(q_slurm_out);
    free(out_slurm);
    free(q_jobs);
    free(jobs);
    free(q_sweep);
    free(q_out);
    free(q_stub);
    free(stub);
    free(stub_folder);
    free(stub_dir);
    free(out_par);
    free(hostile_dir);
    free(sweep);
    free(pwn);
    kvt_rmtree(dir);
    free(dir);
}

/* kv_sweep_shell_quote itself, against sh and bash: the word comes back byte for byte. */
Test(sweep_safety, shell_quote_round_trips_through_sh_and_bash)
{
    char *dir = kvt_tempdir();
    const char *extra[] = {"seed=1", "A=b", "_x=1", "plain", "a.b=c", "/abs/path-1.2_x", "%", "@x", "a:b,c+d"};
    size_t n = N_HOSTILE + sizeof extra / sizeof extra[0];
    for (size_t i = 0; i < n; i++) {
        const char *word = i < N_HOSTILE ? hostile[i] : extra[i - N_HOSTILE];
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        cr_assert_not_null(f);
        fputs("printf '%s\\000' ", f);
        int rc = kv_sweep_shell_quote(f, word);
        fputs("\n", f);
        fclose(f);
        int control = 0;
        for (const unsigned char *p = (const unsigned char *)word; *p; p++)
            control |= *p < 0x20 || *p == 0x7f;
        if (control) {
            cr_expect_eq(rc, -1, "word %zu has a control byte: refused", i);
            cr_expect_str_eq(buf, "printf '%s\\000' \n", "nothing written for a refused word");
            free(buf);
            continue;
        }
        cr_expect_eq(rc, 0, "word %zu", i);
        cr_expect_eq(strchr(buf, '\n'), buf + strlen(buf) - 1, "one line");
        char *script = kvt_write(dir, "q.sh", buf);
        const char *shells[] = {"sh", "bash"};
        for (size_t s = 0; s < 2; s++) {
            char cmd[2048];
            snprintf(cmd, sizeof cmd, "cd %s && %s q.sh > got.bin", dir, shells[s]);
            cr_expect_eq(system(cmd), 0);
            char *got_path = cat(dir, "/got.bin");
            size_t got_len = 0;
            char *got = kvt_read(got_path, &got_len);
            cr_expect(got && got_len == strlen(word) + 1 && memcmp(got, word, got_len) == 0,
                      "%s: word %zu ('%s') came back as '%s'", shells[s], i, word, got ? got : "");
            free(got);
            free(got_path);
        }
        free(script);
        free(buf);
    }
    /* NAME=... first on a line would be an assignment: it is quoted. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kv_sweep_shell_quote(f, "PATH=/x");
    fclose(f);
    cr_expect_str_eq(buf, "'PATH=/x'");
    free(buf);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- 1b. Names and paths with control characters are refused; #SBATCH lines stay whole ---------- */

Test(sweep_safety, control_characters_in_names_and_paths_refused_with_position)
{
    char *dir = kvt_tempdir();
    char *pwn = cat(dir, "/pwn");
    cr_assert_eq(mkdir(pwn, 0755), 0);
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *out_dir = cat(dir, "/out");
    char *q_out = sq(out_dir);
    /* A base whose real path has a newline, reached through a symbolic link. */
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "odd\nname.yaml"));
    char *link = cat(dir, "/link.yaml");
    cr_assert_eq(symlink("odd\nname.yaml", link), 0);
    free(link);
    struct {
        const char *sweep, *extra, *expect;
    } cases[] = {
        {"name: \"x\\ntouch @P@/name #\"\nbase: base.yaml\n", "--emit slurm", "sweep.yaml:1:7: name:"},
        {"name: \"x\\ntouch @P@/name #\"\nbase: base.yaml\n", "-j 1", "sweep.yaml:1:7: name:"},
        {"name: \"a\\0b\"\nbase: base.yaml\n", "--emit slurm", "sweep.yaml:1:7: name:"},
        {"name: \"tab\\there\"\nbase: base.yaml\n", "--emit parallel", "sweep.yaml:1:7: name:"},
        {"base: base.yaml\nmatrix:\n  \"seed\\ntouch @P@/key\": [1]\n", "--emit parallel", "sweep.yaml:3:3: matrix."},
        {"base: base.yaml\nmatrix:\n  \"se\\0ed\": [1]\n", "--emit parallel", "sweep.yaml:3:3:"},
        {"base: base.yaml\nset:\n  \"seed\\rx\": 1\n", "--emit parallel", "sweep.yaml:3:3: set."},
        {"base: \"base\\n.yaml\"\n", "--emit parallel", "sweep.yaml:1:7: base:"},
        {"base: base.yaml\nout: \"@P@/o\\nut\"\n", "--emit parallel", "sweep.yaml:2:6: out:"},
        {"base: link.yaml\n", "--emit parallel", "sweep.yaml:1:7: base: 'link.yaml' resolves to"},
        {"base: base.yaml\n", "--emit parallel --set 'name=a\ntouch @P@/set'", "--set name=a?touch"},
        {"base: base.yaml\n", "--emit parallel --kvsim '/bin/kv\nsim'", "--kvsim /bin/kv?sim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = subst(cases[i].sweep, pwn);
        char *sweep = kvt_write(dir, "sweep.yaml", text);
        char *extra = subst(cases[i].extra, pwn);
        char args[4096], *out = NULL;
        /* The out: case names its own folder; the others get --out. */
        snprintf(args, sizeof args, "sweep %s %s%s %s", sweep, strstr(text, "out:") ? "" : "--out ",
                 strstr(text, "out:") ? "" : q_out, extra);
        int rc = kvt_kvsim(args, &out);
        cr_expect_eq(rc, 2, "case %zu: exit 2:\n%s", i, out);
        cr_expect(strstr(out, cases[i].expect) != NULL, "case %zu: expected '%s' in:\n%s", i, cases[i].expect, out);
        cr_expect(access(out_dir, F_OK) != 0, "case %zu: nothing written", i);
        /* Were a script written anyway, running it must not run anything injected. */
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "cd / && for f in %s/sweep.slurm %s/jobs.txt; do [ -f \"$f\" ] && "
                 "SLURM_ARRAY_TASK_ID=0 bash \"$f\"; done >/dev/null 2>&1", q_out, q_out);
        (void)!system(cmd);
        kvt_rmtree(out_dir);
        free(out);
        free(extra);
        free(sweep);
        free(text);
    }
    char *sweep = kvt_write(dir, "sweep.yaml", "base: base.yaml\n");
    char args[4096], *out = NULL;
    char *q_sweep = sq(sweep);
    snprintf(args, sizeof args, "sweep %s --out %s/'new\nline' --dry-run", q_sweep, q_out);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    cr_expect(strstr(out, "--out") != NULL, "%s", out);
    free(out);
    cr_expect_eq(count_entries(pwn), 0, "an injected command ran");
    free(q_sweep);
    free(sweep);
    free(q_out);
    free(out_dir);
    free(pwn);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_safety, sbatch_header_lines_cannot_be_broken_out_of)
{
    char *dir = kvt_tempdir();
    char *pwn = cat(dir, "/pwn");
    cr_assert_eq(mkdir(pwn, 0755), 0);
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *text = subst("name: \"x --mem=1T --wrap='touch @P@/wrap' \\\"q\\\" $(touch @P@/name) #c\"\n"
                       "base: base.yaml\nmatrix: {seed: [1, 2]}\n", pwn);
    char *sweep = kvt_write(dir, "sweep.yaml", text);
    const char *outs[] = {"/out", "/out with space %x \"q\" #h"};
    for (size_t o = 0; o < 2; o++) {
        char *out_dir = cat(dir, outs[o]);
        char *q_out = sq(out_dir);
        char args[4096], *out = NULL;
        snprintf(args, sizeof args, "sweep %s --emit slurm --out %s", sweep, q_out);
        cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
        free(out);
        char *script = cat(out_dir, "/sweep.slurm");
        char *body = kvt_read(script, NULL);
        cr_assert_not_null(body);
        /* Every #SBATCH line is "#SBATCH --option=value" with one word of [A-Za-z0-9._+-/=%] after it. */
        int sbatch_lines = 0, output_line = 0;
        for (char *line = body; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            if (strncmp(line, "#SBATCH", 7) == 0) {
                sbatch_lines++;
                const char *opt = line + 8;
                cr_expect(line[7] == ' ' && strncmp(opt, "--", 2) == 0, "%s", line);
                cr_expect_eq(strspn(opt, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-/=%"),
                             strlen(opt), "one plain word: %s", line);
                output_line |= strncmp(opt, "--output=", 9) == 0;
                cr_expect(strncmp(opt, "--mem", 5) != 0 && strncmp(opt, "--wrap", 6) != 0, "%s", line);
            }
            line = nl ? nl + 1 : NULL;
        }
        cr_expect_eq(sbatch_lines, o == 0 ? 4 : 3, "job-name, array, cpus-per-task%s", o == 0 ? ", output" : "");
        cr_expect_eq(output_line, o == 0, "--output only for a folder an #SBATCH line can carry");
        char *q_script = sq(script);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "bash -n %s && cd / && SLURM_ARRAY_TASK_ID=1 bash %s", q_script, q_script);
        cr_expect_eq(system(cmd), 0);
        char *res = cat(out_dir, "/p01-seed=2/results.json");
        cr_expect(access(res, F_OK) == 0, "the task ran its point");
        free(res);
        free(q_script);
        free(body);
        free(script);
        free(q_out);
        free(out_dir);
    }
    cr_expect_eq(count_entries(pwn), 0, "an injected command ran");
    free(sweep);
    free(text);
    free(pwn);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- 2. Every point is validated before any runs ------------------------------------------------- */

Test(sweep_safety, mistakes_stop_the_sweep_before_any_point_runs, .timeout = 300)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    free(kvt_write(dir, "notes.txt", "not a scenario\n"));
    char *out_dir = cat(dir, "/out");
    struct {
        const char *sweep, *expect1, *expect2;
    } cases[] = {
        {"base: base.yaml\nmatrix:\n  network.nic_bandwdth_gbps: [10, 25]\n",
         "sweep.yaml:3:3: matrix.network.nic_bandwdth_gbps:", "unknown key"},
        {"base: base.yaml\nmatrix:\n  seed: [1, 2]\n  netwrk.nic_bandwidth_gbps: [10]\n",
         "sweep.yaml:4:3: matrix.netwrk.nic_bandwidth_gbps:", "unknown key"},
        {"base: .\nmatrix: {seed: [1, 2]}\n", "sweep.yaml:1:7: base:", "folder"},
        {"base: /dev/null\nmatrix: {seed: [1, 2]}\n", "sweep.yaml:1:7: base:", "/dev/null"},
        {"base: \"\"\nmatrix: {seed: [1, 2]}\n", "sweep.yaml:1:7: base:", "empty"},
        {"base: notes.txt\nmatrix: {seed: [1, 2]}\n", "sweep.yaml:1:7: base:", "notes.txt"},
        {"base: base.yaml\nmatrix:\n  network.nic_bandwidth_gbps: [10, -5, 100]\n",
         "sweep.yaml:3:36: matrix.network.nic_bandwidth_gbps: -5", "p01-"},
        {"base: base.yaml\nset:\n  workload.reqests: 3\nmatrix: {seed: [1, 2]}\n", "sweep.yaml:3:3: set.workload.reqests",
         "unknown key"},
        {"base: base.yaml\nmatrix:\n  policies: [[bf16], [bf16, nosuch]]\n", "sweep.yaml:3:22: matrix.policies:",
         "nosuch"},
    };
    const char *modes[] = {"-j 2", "--emit parallel", "--emit slurm", "--dry-run"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *sweep = kvt_write(dir, "sweep.yaml", cases[i].sweep);
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            char args[4096], *out = NULL;
            snprintf(args, sizeof args, "sweep %s --out %s %s", sweep, out_dir, modes[m]);
            int rc = kvt_kvsim(args, &out);
            cr_expect_eq(rc, 2, "case %zu (%s): exit 2 before anything runs:\n%s", i, modes[m], out);
            cr_expect(strstr(out, cases[i].expect1) && strstr(out, cases[i].expect2),
                      "case %zu (%s): expected '%s' and '%s' in:\n%s", i, modes[m], cases[i].expect1,
                      cases[i].expect2, out);
            cr_expect(access(out_dir, F_OK) != 0, "case %zu (%s): the sweep wrote its folder", i, modes[m]);
            kvt_rmtree(out_dir);
            free(out);
        }
        free(sweep);
    }
    /* A --set on the command line that no scenario has: named as such. */
    char *sweep = kvt_write(dir, "sweep.yaml", "base: base.yaml\nmatrix: {seed: [1]}\n");
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "sweep %s --out %s --set workload.rat_per_s=3", sweep, out_dir);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    cr_expect(strstr(out, "--set workload.rat_per_s=3 (every point)") != NULL, "%s", out);
    cr_expect(access(out_dir, F_OK) != 0);
    free(out);
    free(sweep);
    free(out_dir);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- 3. A signal stops the workers ---------------------------------------------------------------- */

/* The pids of the processes whose parent is `parent` (from /proc), up to max. */
static int children_of(pid_t parent, pid_t *pids, int max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *close = strrchr(buf, ')'); /* after "pid (comm)": " state ppid ..." */
        char state = 0;
        long ppid = 0;
        if (close && sscanf(close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent && state != 'Z')
            pids[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

static int alive(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *close = strrchr(buf, ')');
    char state = 0;
    return close && sscanf(close + 1, " %c", &state) == 1 && state != 'Z' && state != 'X';
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* group: the signal goes to the sweep's whole process group, as a terminal's Ctrl-C does (the
   workers get it at the same moment as the sweep); else to the sweep alone. */
static void stop_test(int sig, int expect_status, int group)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    /* Each point simulates 300 000 requests: seconds a point, far longer than the test waits. */
    char *sweep = kvt_write(dir, "sweep.yaml", "base: base.yaml\n"
                                               "set: {workload.requests: 300000, workload.rate_per_s: 50}\n"
                                               "matrix: {seed: [1, 2, 3, 4, 5, 6]}\n");
    char *out_dir = cat(dir, "/out");
    const char *bin = getenv("KVSIM");
    char *log = cat(dir, "/sweep.log");
    pid_t sweep_pid = fork();
    cr_assert(sweep_pid >= 0);
    if (sweep_pid == 0) {
        setpgid(0, 0);
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(1, 2);
        execl(bin ? bin : KV_BINARY_DIR "/kvsim", "kvsim", "sweep", sweep, "-j", "3", "--out", out_dir, (char *)NULL);
        _exit(127);
    }
    pid_t workers[16];
    int n = 0;
    for (int t = 0; t < 600 && n < 3; t++) { /* up to 60 s for the three workers to start */
        sleep_ms(100);
        n = children_of(sweep_pid, workers, 16);
    }
    sleep_ms(300); /* the workers are simulating now */
    n = children_of(sweep_pid, workers, 16);
    kill(group ? -sweep_pid : sweep_pid, sig);
    int status = 0;
    pid_t got = -1;
    for (int t = 0; t < 300; t++) { /* the sweep has STOP_GRACE_S (10 s) to stop its workers */
        got = waitpid(sweep_pid, &status, WNOHANG);
        if (got != 0)
            break;
        sleep_ms(100);
    }
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (alive(workers[i])) {
            left++;
            kill(workers[i], SIGKILL); /* do not leave them running whatever the verdict */
        }
    }
    if (got == 0) {
        kill(sweep_pid, SIGKILL);
        waitpid(sweep_pid, &status, 0);
    }
    char *text = kvt_read(log, NULL);
    cr_expect_eq(n, 3, "three workers were running:\n%s", text ? text : "");
    cr_expect_eq(got, sweep_pid, "the sweep exited within 30 s of the signal");
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == expect_status,
              "exit status %d expected (got %s %d):\n%s", expect_status, WIFEXITED(status) ? "exit" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), text ? text : "");
    cr_expect_eq(left, 0, "%d worker(s) still running after the sweep exited", left);
    cr_expect(text && strstr(text, "3 stopped") && !strstr(text, "FAILED"),
              "the running points are stopped, not failed:\n%s", text ? text : "");
    cr_expect(!has_temporary(out_dir), "a stopped point's staging folder is left in %s", out_dir);
    /* No point was published half-way: any results.json there is complete JSON. */
    DIR *d = opendir(out_dir);
    cr_assert_not_null(d);
    struct dirent *e;
    int published = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, "p0", 2) != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/results.json", out_dir, e->d_name);
        if (access(path, F_OK) != 0)
            continue;
        published++;
        kv_jvalue *j = NULL;
        kv_error jerr = {0};
        cr_expect_eq(kv_jread_file(path, &j, &jerr), KV_OK, "%s", jerr.msg);
        kv_jvalue_free(j);
    }
    closedir(d);
    cr_expect(published < 6, "the sweep stopped before all points ran");
    free(text);
    free(log);
    free(out_dir);
    free(sweep);
    kvt_rmtree(dir);
    free(dir);
}

Test(sweep_safety, sigterm_stops_and_waits_for_the_workers, .timeout = 180)
{
    stop_test(SIGTERM, 143, 0);
}

Test(sweep_safety, ctrl_c_to_the_process_group_stops_the_sweep, .timeout = 180)
{
    stop_test(SIGINT, 130, 1);
}

Test(sweep_safety, sighup_stops_and_waits_for_the_workers, .timeout = 180)
{
    stop_test(SIGHUP, 129, 0);
}

/* ---- 4. An out path that is a file ------------------------------------------------------------------ */

Test(sweep_safety, out_that_is_a_file_is_bad_input_with_position)
{
    char *dir = kvt_tempdir();
    free(kvt_fixture_copy("scenarios/sweep-base.yaml", dir, "base.yaml"));
    char *file = kvt_write(dir, "taken", "a file\n");
    char *q_file = sq(file);
    struct {
        const char *sweep, *extra, *expect;
    } cases[] = {
        {"base: base.yaml\nout: @P@\nmatrix: {seed: [1]}\n", "", "sweep.yaml:2:6: out:"},
        {"base: base.yaml\nout: @P@/sub\nmatrix: {seed: [1]}\n", "", "sweep.yaml:2:6: out:"},
        {"base: base.yaml\nmatrix: {seed: [1]}\n", "--out @P@", "--out"},
        {"base: base.yaml\nmatrix: {seed: [1]}\n", "--out @P@/a/b --emit parallel", "--out"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = subst(cases[i].sweep, file);
        char *sweep = kvt_write(dir, "sweep.yaml", text);
        char *extra = subst(cases[i].extra, q_file);
        char args[4096], *out = NULL;
        snprintf(args, sizeof args, "sweep %s %s", sweep, extra);
        cr_expect_eq(kvt_kvsim(args, &out), 2, "case %zu: exit 2:\n%s", i, out);
        cr_expect(strstr(out, cases[i].expect) && strstr(out, "is a file, not a folder"), "case %zu:\n%s", i, out);
        free(out);
        free(extra);
        free(sweep);
        free(text);
    }
    char *again = kvt_read(file, NULL);
    cr_expect_str_eq(again, "a file\n", "the file is untouched");
    free(again);
    free(q_file);
    free(file);
    kvt_rmtree(dir);
    free(dir);
}
