/* test_safety_outputs.c — kvsim never removes or rewrites what it did not create (symlinks, mounts, stale names). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/afile.h"
#include "tests/support.h"

/* A policy that fails only once the simulation runs: a run that checked --out after simulating
   would report this instead of the path. */
static const char *boom_text =
    "return { name = 'boom', decode_node = function(ctx) error('the simulation ran') end }\n";

/* Whether path's text is exactly text. */
static int holds(const char *path, const char *text)
{
    char *body = kvt_read(path, NULL);
    int same = body && strcmp(body, text) == 0;
    free(body);
    return same;
}

static ino_t inode_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? st.st_ino : 0;
}

/* `kvsim run SCENARIO --quiet --out OUT` (plus extra); the exit code, the output in *text (free). */
static int run_out(const char *scenario, const char *out, const char *extra, char **text)
{
    char args[8192];
    snprintf(args, sizeof args, "run %s --quiet --out '%s' %s", scenario, out, extra ? extra : "");
    return kvt_kvsim(args, text);
}

/* A private mount namespace for this test process (and the kvsim it starts), so mounts vanish with
   it. 1 when mounts can be made; 0 with why set (not root, no CAP_SYS_ADMIN, no tmpfs). */
static int private_mounts(const char *probe, char *why, size_t why_size)
{
    if (geteuid() != 0) {
        snprintf(why, why_size, "mount tests need root (euid %ld)", (long)geteuid());
        return 0;
    }
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        snprintf(why, why_size, "no private mount namespace: %s", strerror(errno));
        return 0;
    }
    if (mount("kvsim-test", probe, "tmpfs", 0, "size=1m") != 0) {
        snprintf(why, why_size, "cannot mount a tmpfs: %s", strerror(errno));
        return 0;
    }
    umount2(probe, MNT_DETACH);
    return 1;
}

/* ---- --out naming a symbolic link ------------------------------------------------------------- */

/* A symbolic link named as the output folder (a link planted at /tmp/run1 to someone's home) is
   refused before simulating, naming it; the folder it points to is not touched, nothing is made
   beside either. */
Test(safety_outputs, symlinked_out_refused_before_simulating)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char *boom = kvt_write(dir, "boom.lua", boom_text);
    char *victim_parent = kvt_path(dir, "home");
    mkdir(victim_parent, 0755);
    char *victim = kvt_path(victim_parent, "other");
    mkdir(victim, 0755);
    char *precious = kvt_write(victim, "results.json", "{\"theirs\": 1}\n");
    char *sub = kvt_path(victim, "sub");
    mkdir(sub, 0700);
    free(kvt_write(sub, "deep", "deep\n"));
    ino_t sub_ino = inode_of(sub), precious_ino = inode_of(precious);
    char *runs = kvt_path(dir, "runs");
    mkdir(runs, 0755);
    char *link = kvt_path(runs, "run1");
    cr_assert_eq(symlink(victim, link), 0);

    char extra[4200];
    snprintf(extra, sizeof extra, "--set policies=[boom] --set policy.boom.file=%s", boom);
    const char *forms[] = {"", "/"};
    for (size_t i = 0; i < 2; i++) {
        char out[4200];
        snprintf(out, sizeof out, "%s%s", link, forms[i]);
        char *text = NULL;
        int rc = run_out(scenario, out, extra, &text);
        cr_expect_eq(rc, 2, "--out %s: exit 2, got %d:\n%s", out, rc, text);
        cr_expect(strstr(text, link) && strstr(text, "symbolic link"), "the message names the link:\n%s", text);
        cr_expect(!strstr(text, "the simulation ran"), "--out %s checked after simulating:\n%s", out, text);
        free(text);
    }
    /* kvsim eval checks it the same way, before loading its model. */
    char *eval_sc = kvt_source("scenarios/accuracy.yaml");
    char args[8192], *text = NULL;
    snprintf(args, sizeof args, "eval %s --quiet --out %s", eval_sc, link);
    int rc = kvt_kvsim(args, &text);
    cr_expect(rc == 2 && strstr(text, "symbolic link"), "eval --out LINK: exit %d:\n%.400s", rc, text);
    free(text);
    free(eval_sc);

    char *left = kvt_listing(victim);
    cr_expect_str_eq(left, "results.json sub", "the linked folder is as it was: %s", left);
    free(left);
    cr_expect(holds(precious, "{\"theirs\": 1}\n") && inode_of(precious) == precious_ino, "its file untouched");
    cr_expect(inode_of(sub) == sub_ino, "its sub-folder is the same folder");
    left = kvt_listing(victim_parent);
    cr_expect_str_eq(left, "other", "nothing beside the linked folder: %s", left);
    free(left);
    left = kvt_listing(runs);
    cr_expect_str_eq(left, "run1", "nothing beside the link: %s", left);
    free(left);
    struct stat st;
    cr_expect(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link itself stays");

    free(link);
    free(runs);
    free(sub);
    free(precious);
    free(victim);
    free(victim_parent);
    free(boom);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- --out "" ---------------------------------------------------------------------------------- */

Test(safety_outputs, empty_out_exits_2)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char args[8192], *text = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out ''", scenario);
    int rc = kvt_kvsim(args, &text);
    cr_expect_eq(rc, 2, "run --out '': exit %d:\n%s", rc, text);
    cr_expect(strstr(text, "--out") && strstr(text, "empty"), "the message says what is wrong:\n%s", text);
    free(text);

    char *eval_sc = kvt_source("scenarios/accuracy.yaml");
    snprintf(args, sizeof args, "eval %s --quiet --out ''", eval_sc);
    rc = kvt_kvsim(args, &text);
    cr_expect(rc == 2 && strstr(text, "--out") && strstr(text, "empty"), "eval --out '': exit %d:\n%.400s", rc, text);
    free(text);
    free(eval_sc);

    /* A sweep whose file names a folder: --out '' must not fall back to it. */
    free(kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "base.yaml"));
    char sweep_text[4400];
    snprintf(sweep_text, sizeof sweep_text, "name: st\nbase: base.yaml\nout: %s/fallback\nmatrix: {seed: [1, 2]}\n",
             dir);
    char *sweep = kvt_write(dir, "sweep.yaml", sweep_text);
    snprintf(args, sizeof args, "sweep %s --out ''", sweep);
    rc = kvt_kvsim(args, &text);
    cr_expect(rc == 2 && strstr(text, "--out") && strstr(text, "empty"), "sweep --out '': exit %d:\n%s", rc, text);
    free(text);
    snprintf(args, sizeof args, "sweep --collect ''");
    rc = kvt_kvsim(args, &text);
    cr_expect(rc == 2 && strstr(text, "--collect"), "sweep --collect '': exit %d:\n%s", rc, text);
    free(text);
    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "base.yaml quick.yaml sweep.yaml", "nothing written: %s", left);
    free(left);

    free(sweep);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- What DIR holds besides kvsim's names ------------------------------------------------------ */

/* Sockets, FIFOs and devices in DIR are not kvsim's: the run publishes beside them, they stay. */
Test(safety_outputs, special_files_in_dir_left_alone)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char *out = kvt_path(dir, "out");
    mkdir(out, 0755);
    free(kvt_write(out, "results.json", "{\"earlier\": 1}\n"));
    char *sock_path = kvt_path(out, "app.sock");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
    char *fifo = kvt_path(out, "pipe");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    char *dev = kvt_path(out, "null-device");
    int have_dev = mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0; /* needs CAP_MKNOD */
    if (!have_dev)
        cr_log_info("no device node in this test: mknod: %s", strerror(errno));
    ino_t sock_ino = inode_of(sock_path), fifo_ino = inode_of(fifo), dev_ino = have_dev ? inode_of(dev) : 0;

    char *text = NULL;
    int rc = run_out(scenario, out, NULL, &text);
    cr_expect_eq(rc, 0, "the run publishes beside them:\n%s", text);
    free(text);
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, have_dev ? "app.sock null-device pipe requests.csv results.json"
                                    : "app.sock pipe requests.csv results.json",
                     "%s", left);
    free(left);
    struct stat st;
    cr_expect(lstat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == sock_ino, "the socket stays");
    cr_expect(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_ino == fifo_ino, "the FIFO stays");
    if (have_dev)
        cr_expect(lstat(dev, &st) == 0 && S_ISCHR(st.st_mode) && st.st_ino == dev_ino, "the device stays");
    char *results = kvt_path(out, "results.json");
    cr_expect(!holds(results, "{\"earlier\": 1}\n"), "results.json is the new run's");
    free(results);
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "out quick.yaml", "no temporaries: %s", left);
    free(left);
    close(s);

    free(dev);
    free(fifo);
    free(sock_path);
    free(out);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* The user's entries keep their inode, owner and mode (nothing is copied or recreated); kvsim's
   own names are replaced, and one that is a symbolic link is replaced as a link: what it points to
   is never written or removed (as git does with a tracked path that became a link). */
Test(safety_outputs, only_owned_names_replaced_and_links_never_followed)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char *outside = kvt_path(dir, "outside");
    mkdir(outside, 0755);
    char *target_file = kvt_write(outside, "passwd", "root:x:0:0\n");
    char *target_dir = kvt_path(outside, "figs");
    mkdir(target_dir, 0755);
    char *target_fig = kvt_write(target_dir, "keep.png", "png\n");

    char *out = kvt_path(dir, "out");
    mkdir(out, 0755);
    char *note = kvt_write(out, "note.txt", "mine\n");
    char *sub = kvt_path(out, "sub");
    mkdir(sub, 0750);
    free(kvt_write(sub, "deep.txt", "deep\n"));
    int chowned = geteuid() == 0 && chown(sub, 4321, 4321) == 0; /* as root: owned by someone else */
    char *results = kvt_path(out, "results.json");
    char *csv = kvt_path(out, "requests.csv");
    char *figures = kvt_path(out, "figures");
    char *trace = kvt_path(out, "trace.json");
    cr_assert_eq(symlink(target_file, results), 0);
    cr_assert_eq(symlink("/nonexistent/kvsim-test", csv), 0);
    cr_assert_eq(symlink(target_dir, figures), 0);
    cr_assert_eq(symlink(outside, trace), 0);
    struct stat note_before, sub_before;
    cr_assert_eq(lstat(note, &note_before), 0);
    cr_assert_eq(lstat(sub, &sub_before), 0);

    char *text = NULL;
    int rc = run_out(scenario, out, NULL, &text);
    cr_expect_eq(rc, 0, "%s", text);
    free(text);
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, "note.txt requests.csv results.json sub", "owned names not written go: %s", left);
    free(left);
    struct stat st;
    cr_expect(lstat(results, &st) == 0 && S_ISREG(st.st_mode), "results.json is a file now");
    cr_expect(lstat(csv, &st) == 0 && S_ISREG(st.st_mode), "requests.csv is a file now");
    cr_expect(holds(target_file, "root:x:0:0\n"), "what results.json pointed to is not written");
    cr_expect(holds(target_fig, "png\n"), "what figures/ pointed to is not removed");
    left = kvt_listing(outside);
    cr_expect_str_eq(left, "figs passwd", "%s", left);
    free(left);
    cr_expect(access("/nonexistent/kvsim-test", F_OK) != 0);
    struct stat note_after, sub_after;
    cr_expect(lstat(note, &note_after) == 0 && note_after.st_ino == note_before.st_ino &&
                  note_after.st_nlink == 1 && note_after.st_ctime == note_before.st_ctime,
              "note.txt is the same file, not linked or copied");
    cr_expect(lstat(sub, &sub_after) == 0 && sub_after.st_ino == sub_before.st_ino &&
                  sub_after.st_mode == sub_before.st_mode && sub_after.st_uid == sub_before.st_uid,
              "sub/ is the same folder, same mode and owner (chowned: %d; uid %ld -> %ld)", chowned,
              (long)sub_before.st_uid, (long)sub_after.st_uid);
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "out outside quick.yaml", "no temporaries: %s", left);
    free(left);

    free(trace);
    free(figures);
    free(csv);
    free(results);
    free(sub);
    free(note);
    free(out);
    free(target_fig);
    free(target_dir);
    free(target_file);
    free(outside);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- Mounts ------------------------------------------------------------------------------------ */

/* A file system mounted inside DIR is not entered: the run publishes beside it (every time). One
   mounted at or under an owned name (figures/) is found before simulating: exit 2 naming it, and
   it stays as it was; a bind mount (same st_dev) too. */
Test(safety_outputs, mounts_inside_dir_never_crossed)
{
    char *dir = kvt_tempdir();
    char *probe = kvt_path(dir, "probe");
    mkdir(probe, 0755);
    char why[256];
    if (!private_mounts(probe, why, sizeof why)) {
        free(probe);
        kvt_rmtree(dir);
        free(dir);
        cr_skip_test("skipped: %s", why);
    }
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char *boom = kvt_write(dir, "boom.lua", boom_text);
    char *out = kvt_path(dir, "out");
    mkdir(out, 0755);
    free(kvt_write(out, "results.json", "{\"earlier\": 1}\n"));
    char *data = kvt_path(out, "data");
    mkdir(data, 0755);
    cr_assert_eq(mount("kvsim-test", data, "tmpfs", 0, "size=1m"), 0, "%s", strerror(errno));
    char *mounted_file = kvt_write(data, "on-the-mount", "keep\n");

    char *text = NULL;
    for (int i = 0; i < 2; i++) {
        int rc = run_out(scenario, out, NULL, &text);
        cr_expect_eq(rc, 0, "run %d with a mount in DIR:\n%s", i, text);
        free(text);
        cr_expect(holds(mounted_file, "keep\n"), "run %d: the mounted file system is untouched", i);
    }
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, "data requests.csv results.json", "%s", left);
    free(left);
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "boom.lua out probe quick.yaml", "no temporaries: %s", left);
    free(left);

    /* A tmpfs at DIR/figures, then a bind mount of an outside folder at DIR/figures/keep. */
    char extra[4200];
    snprintf(extra, sizeof extra, "--set policies=[boom] --set policy.boom.file=%s", boom);
    char *figures = kvt_path(out, "figures");
    mkdir(figures, 0755);
    cr_assert_eq(mount("kvsim-test", figures, "tmpfs", 0, "size=1m"), 0, "%s", strerror(errno));
    char *fig = kvt_write(figures, "a.png", "png\n");
    int rc = run_out(scenario, out, extra, &text);
    cr_expect_eq(rc, 2, "a mount at figures/: exit 2, got %d:\n%s", rc, text);
    cr_expect(strstr(text, figures) && strstr(text, "mount point"), "the message names it:\n%s", text);
    cr_expect(!strstr(text, "the simulation ran"), "checked after simulating:\n%s", text);
    free(text);
    cr_expect(holds(fig, "png\n"), "the mounted figures stay");
    umount2(figures, MNT_DETACH);

    char *precious = kvt_path(dir, "precious");
    mkdir(precious, 0755);
    char *precious_file = kvt_write(precious, "thesis.tex", "years of work\n");
    char *keep = kvt_path(figures, "keep");
    mkdir(keep, 0755);
    cr_assert_eq(mount(precious, keep, NULL, MS_BIND, NULL), 0, "%s", strerror(errno));
    rc = run_out(scenario, out, extra, &text);
    cr_expect_eq(rc, 2, "a bind mount under figures/: exit 2, got %d:\n%s", rc, text);
    cr_expect(strstr(text, keep) && strstr(text, "mount point"), "the message names it:\n%s", text);
    free(text);
    /* Without the failing policy the run would replace figures/: still refused, nothing removed. */
    rc = run_out(scenario, out, NULL, &text);
    cr_expect_eq(rc, 2, "%s", text);
    free(text);
    umount2(keep, MNT_DETACH);
    cr_expect(holds(precious_file, "years of work\n"), "the bind-mounted folder is untouched");
    left = kvt_listing(dir);
    cr_expect_str_eq(left, "boom.lua out precious probe quick.yaml", "no temporaries: %s", left);
    free(left);

    /* A stale staging folder of kvsim with a mount inside: left (counted as kept), never emptied,
       and the next run is not blocked by it. */
    umount2(data, MNT_DETACH);
    char stale_name[64];
    snprintf(stale_name, sizeof stale_name, "out.tmp.%ld", (long)kvt_dead_pid());
    char *stale = kvt_path(dir, stale_name);
    mkdir(stale, 0755);
    free(kvt_write(stale, KV_OUTDIR_MARK, "results.json\n"));
    char *stale_mnt = kvt_path(stale, "m");
    mkdir(stale_mnt, 0755);
    cr_assert_eq(mount("kvsim-test", stale_mnt, "tmpfs", 0, "size=1m"), 0, "%s", strerror(errno));
    char *stale_file = kvt_write(stale_mnt, "f", "keep\n");
    rc = run_out(scenario, out, NULL, &text);
    cr_expect_eq(rc, 0, "a stale folder that cannot be removed safely does not block the run:\n%s", text);
    free(text);
    cr_expect(holds(stale_file, "keep\n"), "the file system mounted in the stale folder is untouched");
    umount2(stale_mnt, MNT_DETACH);

    free(stale_file);
    free(stale_mnt);
    free(stale);
    free(keep);
    free(precious_file);
    free(precious);
    free(fig);
    free(figures);
    free(mounted_file);
    free(data);
    free(out);
    free(boom);
    free(scenario);
    free(probe);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- Stale temporaries ------------------------------------------------------------------------- */

/* Names of the form DIR.tmp.<deadpid> / DIR.old.<deadpid> that kvsim did not make (a symbolic link,
   a folder without the marker, another user's folder) are left alone and never followed. */
Test(safety_outputs, stale_names_kvsim_did_not_make_left_alone)
{
    char *dir = kvt_tempdir();
    char *scenario = kvt_fixture_copy("scenarios/outputs-quick.yaml", dir, "quick.yaml");
    char *victim = kvt_path(dir, "victim");
    mkdir(victim, 0755);
    char *victim_file = kvt_write(victim, "results.json", "{\"theirs\": 1}\n");
    char *runs = kvt_path(dir, "runs");
    mkdir(runs, 0755);
    char *out = kvt_path(runs, "out");

    char tmp_link[64], old_link[64], plain[64], foreign[64];
    snprintf(tmp_link, sizeof tmp_link, "out.tmp.%ld", (long)kvt_dead_pid());
    snprintf(old_link, sizeof old_link, "out.old.%ld", (long)kvt_dead_pid());
    snprintf(plain, sizeof plain, "out.tmp.%ld", (long)kvt_dead_pid());
    snprintf(foreign, sizeof foreign, "out.tmp.%ld", (long)kvt_dead_pid());
    char *p_tmp_link = kvt_path(runs, tmp_link), *p_old_link = kvt_path(runs, old_link);
    char *p_plain = kvt_path(runs, plain), *p_foreign = kvt_path(runs, foreign);
    cr_assert_eq(symlink(victim, p_tmp_link), 0);
    cr_assert_eq(symlink(victim, p_old_link), 0); /* DIR is missing: an old-style restore must not take it */
    mkdir(p_plain, 0755);
    char *plain_file = kvt_write(p_plain, "data.csv", "a user's folder that happens to have this name\n");
    int have_foreign = geteuid() == 0;
    if (have_foreign) {
        mkdir(p_foreign, 0755);
        free(kvt_write(p_foreign, KV_OUTDIR_MARK, "results.json\n"));
        free(kvt_write(p_foreign, "results.json", "{\"someone else's run\": 1}\n"));
        cr_assert_eq(chown(p_foreign, 4321, 4321), 0);
    }

    char *text = NULL;
    int rc = run_out(scenario, out, NULL, &text);
    cr_expect_eq(rc, 0, "%s", text);
    free(text);
    struct stat st;
    cr_expect(lstat(out, &st) == 0 && S_ISDIR(st.st_mode), "DIR is a new real folder, not a renamed link");
    char *left = kvt_listing(out);
    cr_expect_str_eq(left, "requests.csv results.json", "%s", left);
    free(left);
    left = kvt_listing(victim);
    cr_expect_str_eq(left, "results.json", "the folder the links point to is as it was: %s", left);
    free(left);
    cr_expect(holds(victim_file, "{\"theirs\": 1}\n"));
    cr_expect(lstat(p_tmp_link, &st) == 0 && S_ISLNK(st.st_mode), "%s (a link) is left alone", tmp_link);
    cr_expect(lstat(p_old_link, &st) == 0 && S_ISLNK(st.st_mode), "%s (a link) is left alone", old_link);
    cr_expect(holds(plain_file, "a user's folder that happens to have this name\n"), "%s (no marker) is left", plain);
    if (have_foreign)
        cr_expect(access(p_foreign, F_OK) == 0, "%s (another user's) is left", foreign);

    /* The library says so too: all of them kept, none removed. */
    kv_stale_counts c;
    kv_error err = {0};
    cr_expect_eq(kv_stale_reap(runs, "out", &c, &err), KV_OK, "%s", err.msg);
    cr_expect(c.removed == 0 && c.restored == 0 && c.kept == (size_t)(have_foreign ? 4 : 3),
              "removed %zu restored %zu kept %zu", c.removed, c.restored, c.kept);

    free(plain_file);
    free(p_foreign);
    free(p_plain);
    free(p_old_link);
    free(p_tmp_link);
    free(out);
    free(runs);
    free(victim_file);
    free(victim);
    free(scenario);
    kvt_rmtree(dir);
    free(dir);
}

/* ---- Failed and killed publishes (the library) ------------------------------------------------- */

static const char *const run_names[] = {"results.json", "requests.csv", "trace.json", "figures"};

/* A folder as an earlier run left it, plus the user's note. */
static void make_previous(const char *out)
{
    mkdir(out, 0755);
    free(kvt_write(out, "note.txt", "mine\n"));
    free(kvt_write(out, "results.json", "{\"old\": 1}\n"));
    free(kvt_write(out, "requests.csv", "old csv\n"));
    free(kvt_write(out, "trace.json", "old trace\n"));
    char *figures = kvt_path(out, "figures");
    mkdir(figures, 0755);
    free(kvt_write(figures, "old.png", "old png\n"));
    free(figures);
}

/* Fills a begun od's staging folder as a run writing results.json, requests.csv and figures/ does. */
static void stage_new(kv_outdir *od)
{
    const char *s = kv_outdir_staging(od);
    free(kvt_write(s, "results.json", "{\"new\": 1}\n"));
    free(kvt_write(s, "requests.csv", "new csv\n"));
    char *figures = kvt_path(s, "figures");
    mkdir(figures, 0755);
    free(kvt_write(figures, "new.png", "new png\n"));
    free(figures);
}

/* Whether out is exactly make_previous's folder, with the same inodes as in ino[5]. */
static int is_previous(const char *out, const ino_t *ino)
{
    const char *names[] = {"note.txt", "results.json", "requests.csv", "trace.json", "figures"};
    char *left = kvt_listing(out);
    int ok = left && strcmp(left, "figures note.txt requests.csv results.json trace.json") == 0;
    free(left);
    for (size_t i = 0; ok && i < 5; i++) {
        char *p = kvt_path(out, names[i]);
        ok = inode_of(p) == ino[i];
        free(p);
    }
    char *p = kvt_path(out, "results.json");
    ok = ok && holds(p, "{\"old\": 1}\n");
    free(p);
    p = kvt_path(out, "figures/old.png");
    ok = ok && holds(p, "old png\n");
    free(p);
    return ok;
}

static int is_new(const char *out)
{
    char *left = kvt_listing(out);
    int ok = left && strcmp(left, "figures note.txt requests.csv results.json") == 0;
    free(left);
    char *p = kvt_path(out, "results.json");
    ok = ok && holds(p, "{\"new\": 1}\n");
    free(p);
    p = kvt_path(out, "figures/new.png");
    ok = ok && holds(p, "new png\n");
    free(p);
    p = kvt_path(out, "note.txt");
    ok = ok && holds(p, "mine\n");
    free(p);
    return ok;
}

/* A publish that fails after any number of its moves (4 aside, 3 in) is undone: DIR is exactly as
   it was, the same files, and no temporary is left; with RENAME_NOREPLACE and without. */
Test(safety_outputs, failed_publish_undone_at_every_step)
{
    char *dir = kvt_tempdir();
    char *out = kvt_path(dir, "out");
    make_previous(out);
    const char *names[] = {"note.txt", "results.json", "requests.csv", "trace.json", "figures"};
    ino_t ino[5];
    for (size_t i = 0; i < 5; i++) {
        char *p = kvt_path(out, names[i]);
        ino[i] = inode_of(p);
        free(p);
    }
    for (int plain = 0; plain < 2; plain++) {
        for (int stop = 1; stop <= 6; stop++) {
            kv_outdir od;
            kv_cleanup_slot slot;
            memset(&slot, 0, sizeof slot);
            kv_error err = {0};
            cr_assert_eq(kv_outdir_begin(&od, out, run_names, 4, &slot, &err), KV_OK, "%s", err.msg);
            stage_new(&od);
            od.plain_rename = plain;
            od.test_stop_after = stop;
            cr_expect_eq(kv_outdir_commit(&od, &err), KV_EFAIL, "plain %d stop %d: the publish fails", plain, stop);
            cr_expect(strstr(err.msg, "left as it was") != NULL, "plain %d stop %d: %s", plain, stop, err.msg);
            cr_expect(is_previous(out, ino), "plain %d stop %d: DIR is as it was: %s", plain, stop, kvt_listing(out));
            cr_expect(!slot.armed, "disarmed");
            char *left = kvt_listing(dir);
            cr_expect_str_eq(left, "out", "plain %d stop %d: no temporaries: %s", plain, stop, left);
            free(left);
        }
    }
    /* DIR absent: a failed publish leaves it absent. */
    char *fresh = kvt_path(dir, "fresh");
    kv_outdir od;
    kv_error err = {0};
    cr_assert_eq(kv_outdir_begin(&od, fresh, run_names, 4, NULL, &err), KV_OK, "%s", err.msg);
    stage_new(&od);
    od.test_stop_after = 2;
    cr_expect_eq(kv_outdir_commit(&od, &err), KV_EFAIL);
    char *left = kvt_listing(dir);
    cr_expect_str_eq(left, "out", "no fresh/ and no temporaries: %s", left);
    free(left);
    /* And with no stop the publish goes through. */
    cr_assert_eq(kv_outdir_begin(&od, out, run_names, 4, NULL, &err), KV_OK, "%s", err.msg);
    stage_new(&od);
    cr_expect_eq(kv_outdir_commit(&od, &err), KV_OK, "%s", err.msg);
    cr_expect(is_new(out), "published: %s", kvt_listing(out));
    char *note = kvt_path(out, "note.txt");
    cr_expect(inode_of(note) == ino[0], "note.txt is the same file");
    free(note);

    free(fresh);
    free(out);
    kvt_rmtree(dir);
    free(dir);
}

/* A publish killed (-9) after any of its moves is finished by the next command on DIR: DIR then
   holds the new run's complete set and the user's note; nothing of either run is lost or mixed. */
Test(safety_outputs, killed_publish_finished_by_next_command)
{
    char *dir = kvt_tempdir();
    char *out = kvt_path(dir, "out");
    for (int stop = 1; stop <= 6; stop++) {
        kvt_rmtree(out);
        make_previous(out);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            kv_outdir od;
            kv_error err = {0};
            if (kv_outdir_begin(&od, out, run_names, 4, NULL, &err) != KV_OK)
                _exit(3);
            stage_new(&od);
            od.test_stop_after = stop;
            od.test_stop_kill = 1;
            kv_outdir_commit(&od, &err);
            _exit(4); /* not reached: the publish kills the process */
        }
        int status = 0;
        waitpid(pid, &status, 0);
        cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "stop %d: the child was killed mid-publish",
                  stop);
        char staging[64];
        snprintf(staging, sizeof staging, "out.tmp.%ld", (long)pid);
        char *left = kvt_listing(dir);
        char want[128];
        snprintf(want, sizeof want, "out %s", staging);
        cr_expect_str_eq(left, want, "stop %d: the staging folder is left: %s", stop, left);
        free(left);

        kv_stale_counts c;
        kv_error err = {0};
        cr_expect_eq(kv_stale_reap(dir, "out", &c, &err), KV_OK, "%s", err.msg);
        cr_expect(c.restored == 1 && c.kept == 0, "stop %d: restored %zu kept %zu", stop, c.restored, c.kept);
        cr_expect(is_new(out), "stop %d: DIR holds the new set: %s", stop, kvt_listing(out));
        left = kvt_listing(dir);
        cr_expect_str_eq(left, "out", "stop %d: no temporaries: %s", stop, left);
        free(left);
    }
    free(out);
    kvt_rmtree(dir);
    free(dir);
}
