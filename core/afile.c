/* afile.c — atomic file replacement, output folders published whole, stale temporaries (design note in afile.h). */
#define _GNU_SOURCE /* renameat2, syscall */
#include "core/afile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"

/* "PATH.KIND.<pid>" in a fresh allocation. */
static char *temp_name(const char *path, const char *kind)
{
    size_t len = strlen(path) + strlen(kind) + 32;
    char *s = kv_malloc(len);
    snprintf(s, len, "%s.%s.%ld", path, kind, (long)getpid());
    return s;
}

/* ---- Single files --------------------------------------------------------------------------- */

int kv_afile_open(kv_afile *a, const char *path, kv_error *err)
{
    memset(a, 0, sizeof *a);
    a->tmp_path = temp_name(path, "tmp");
    int fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        /* Only a dead process that had our pid can have left it (I2). */
        unlink(a->tmp_path);
        fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        kv_free(a->tmp_path);
        a->tmp_path = NULL;
        return kv_error_set(err, KV_EFAIL, "%s: cannot create: %s", path, strerror(e));
    }
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        int e = errno;
        close(fd);
        unlink(a->tmp_path);
        kv_free(a->tmp_path);
        a->tmp_path = NULL;
        return kv_error_set(err, KV_EFAIL, "%s: cannot open: %s", path, strerror(e));
    }
    fchmod(fd, 0644);
    a->path = kv_strdup(path);
    return KV_OK;
}

int kv_afile_commit(kv_afile *a, kv_error *err)
{
    int rc = KV_OK;
    int bad = ferror(a->f) || fflush(a->f) != 0;
    if (fclose(a->f) != 0)
        bad = 1;
    a->f = NULL;
    if (bad)
        rc = kv_error_set(err, KV_EFAIL, "%s: write failed: %s", a->path, strerror(errno));
    else if (rename(a->tmp_path, a->path) != 0)
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot rename into place: %s", a->path, strerror(errno));
    if (rc)
        unlink(a->tmp_path);
    kv_free(a->tmp_path);
    kv_free(a->path);
    a->tmp_path = a->path = NULL;
    return rc;
}

void kv_afile_abort(kv_afile *a)
{
    if (a->f)
        fclose(a->f);
    if (a->tmp_path)
        unlink(a->tmp_path);
    kv_free(a->tmp_path);
    kv_free(a->path);
    memset(a, 0, sizeof *a);
}

int kv_mkdirs(const char *dir, kv_error *err)
{
    char *p = kv_strdup(dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            kv_free(p);
            return kv_error_set(err, KV_EFAIL, "%s: cannot create folder: %s", dir, strerror(e));
        }
        *s = '/';
    }
    int rc = KV_OK;
    struct stat st;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot create folder: %s", dir, strerror(errno));
    else if (stat(p, &st) == 0 && !S_ISDIR(st.st_mode))
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot create folder: something that is not a folder has that name", dir);
    kv_free(p);
    return rc;
}

/* ---- Removing trees (async-signal-safe) ------------------------------------------------------ */

/* The record SYS_getdents64 fills (the kernel's struct linux_dirent64). */
struct kv_dirent64 {
    uint64_t d_ino;           /* inode */
    int64_t d_off;            /* offset of the next record */
    unsigned short d_reclen;  /* bytes in this record */
    unsigned char d_type;     /* DT_* */
    char d_name[];            /* NUL-terminated */
};

enum { RMTREE_MAX_DEPTH = 32 }; /* 32 levels x 2 KiB of stack; deeper trees are left (rm -rf them) */

/* Removes everything in the open folder dfd. Re-reads the folder until a pass finds it empty,
   since removing entries while reading can make the kernel skip some. */
static int rm_entries(int dfd, int depth)
{
    char buf[2048] __attribute__((aligned(8)));
    for (int pass = 0; pass < 64; pass++) {
        if (lseek(dfd, 0, SEEK_SET) < 0)
            return -1;
        int seen = 0, removed = 0;
        for (;;) {
            long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
            if (n < 0)
                return -1;
            if (n == 0)
                break;
            for (long off = 0; off < n;) {
                struct kv_dirent64 *d = (struct kv_dirent64 *)(void *)(buf + off);
                off += d->d_reclen;
                const char *name = d->d_name;
                if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
                    continue;
                seen++;
                int is_dir = d->d_type == DT_DIR;
                if (d->d_type == DT_UNKNOWN) {
                    struct stat st;
                    is_dir = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
                }
                if (is_dir) {
                    if (depth < RMTREE_MAX_DEPTH) {
                        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0) {
                            rm_entries(sub, depth + 1);
                            close(sub);
                        }
                    }
                    if (unlinkat(dfd, name, AT_REMOVEDIR) == 0)
                        removed++;
                } else if (unlinkat(dfd, name, 0) == 0) {
                    removed++;
                }
            }
        }
        if (seen == 0)
            return 0;
        if (removed == 0)
            return -1; /* nothing more can go */
    }
    return -1;
}

int kv_rmtree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        rm_entries(fd, 0);
        close(fd);
    }
    return rmdir(path) == 0 || errno == ENOENT ? 0 : -1;
}

void kv_cleanup_slot_run(kv_cleanup_slot *slot)
{
    if (!slot)
        return;
    pid_t child = (pid_t)slot->child;
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    if (slot->armed)
        kv_rmtree(slot->path);
}

/* Sets the slot to name path (NULL: disarms it). The handler may run between any two statements,
   so the path is only written while disarmed, and the fences keep the compiler from moving the
   writes across the flag. */
static void slot_set(kv_cleanup_slot *slot, const char *path)
{
    if (!slot)
        return;
    slot->armed = 0;
    atomic_signal_fence(memory_order_seq_cst);
    if (!path)
        return;
    snprintf(slot->path, sizeof slot->path, "%s", path);
    atomic_signal_fence(memory_order_seq_cst);
    slot->armed = 1;
}

/* ---- Stale temporaries ----------------------------------------------------------------------- */

/* Splits "NAME.tmp.<pid>" / "NAME.old.<pid>": *kind is 't' or 'o', *base_len the length of NAME.
   Returns 0 when name is not such a temporary. */
static int parse_temp(const char *name, size_t *base_len, char *kind, pid_t *pid)
{
    size_t len = strlen(name), d = len;
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9')
        d--;
    size_t digits = len - d;
    if (digits == 0 || digits > 9 || d < 6)
        return 0;
    const char *tag = name + d - 5;
    if (strncmp(tag, ".tmp.", 5) == 0)
        *kind = 't';
    else if (strncmp(tag, ".old.", 5) == 0)
        *kind = 'o';
    else
        return 0;
    long v = strtol(name + d, NULL, 10);
    if (v <= 0)
        return 0;
    *pid = (pid_t)v;
    *base_len = d - 5;
    return *base_len > 0;
}

int kv_is_temporary_name(const char *name)
{
    size_t bl;
    char kind;
    pid_t pid;
    return parse_temp(name, &bl, &kind, &pid);
}

static char *join_path(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = kv_malloc(la + lb + 2);
    memcpy(s, a, la);
    s[la] = '/';
    memcpy(s + la + 1, b, lb + 1);
    return s;
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int kv_stale_reap(const char *folder, const char *base, kv_stale_counts *counts, kv_error *err)
{
    return kv_stale_reap_names(folder, &base, 1, counts, err);
}

int kv_stale_reap_names(const char *folder, const char *const *bases, size_t n_bases, kv_stale_counts *counts,
                        kv_error *err)
{
    /* The names sorted, so each entry is one binary search. */
    const char **sorted = kv_calloc(n_bases ? n_bases : 1, sizeof *sorted);
    if (n_bases) {
        memcpy(sorted, bases, n_bases * sizeof *sorted);
        qsort(sorted, n_bases, sizeof *sorted, by_string);
    }
    kv_stale_counts c = {0, 0, 0};
    DIR *d = opendir(folder);
    if (!d) {
        kv_free(sorted);
        if (counts)
            *counts = c;
        if (errno == ENOENT || errno == ENOTDIR)
            return KV_OK;
        return kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", folder, strerror(errno));
    }
    /* Collect first: removing and renaming while readdir runs could skip entries. */
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t bl;
        char kind;
        pid_t pid;
        if (!parse_temp(e->d_name, &bl, &kind, &pid))
            continue;
        char *b = kv_strndup(e->d_name, bl);
        const char *key = b;
        int wanted = bsearch(&key, sorted, n_bases, sizeof *sorted, by_string) != NULL;
        kv_free(b);
        if (!wanted)
            continue;
        if (n == cap)
            kv_grow((void **)&names, sizeof *names, &cap, n + 1);
        names[n++] = kv_strdup(e->d_name);
    }
    closedir(d);
    int rc = KV_OK;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        char kind;
        pid_t pid;
        parse_temp(names[i], &bl, &kind, &pid);
        if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) {
            c.live++; /* ours, running, or someone else's we may not signal (EPERM: alive) */
            continue;
        }
        char *path = join_path(folder, names[i]);
        char *name = kv_strndup(names[i], bl);
        char *final = join_path(folder, name);
        struct stat st;
        if (kind == 'o' && lstat(final, &st) != 0 && errno == ENOENT && rename(path, final) == 0) {
            c.restored++; /* a crash between the fallback's two renames: undo the first (I1) */
        } else if (kv_rmtree(path) == 0) {
            c.removed++;
        } else if (!rc) {
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot remove this stale temporary of dead process %ld: %s",
                              path, (long)pid, strerror(errno));
        }
        kv_free(final);
        kv_free(name);
        kv_free(path);
    }
    for (size_t i = 0; i < n; i++)
        kv_free(names[i]);
    kv_free(names);
    kv_free(sorted);
    if (counts)
        *counts = c;
    return rc;
}

/* ---- Output folders -------------------------------------------------------------------------- */

static int outdir_fail(kv_outdir *od, kv_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Sets a KV_EINPUT error "DIR: what (nothing was run)", undoes begin and returns KV_EINPUT. */
static int outdir_fail(kv_outdir *od, kv_error *err, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kv_error_set(err, KV_EINPUT, "%s: %s (nothing was run)", od->dir, msg);
    kv_outdir_abort(od);
    return KV_EINPUT;
}

/* Absolute path of dir without creating it: its parent is created and resolved; a final symbolic
   link is followed. NULL with *why set on failure. */
static char *resolve_out(const char *dir, char *why, size_t why_size)
{
    char *d = kv_strdup(dir);
    size_t len = strlen(d);
    while (len > 1 && d[len - 1] == '/')
        d[--len] = '\0';
    char *slash = strrchr(d, '/');
    char *parent = !slash ? kv_strdup(".") : slash == d ? kv_strdup("/") : kv_strndup(d, (size_t)(slash - d));
    const char *base = slash ? slash + 1 : d;
    kv_error e = {0};
    char *abs = NULL;
    char rp[PATH_MAX];
    if (kv_mkdirs(parent, &e) != 0) {
        snprintf(why, why_size, "cannot create its parent folder: %s", e.msg);
    } else if (!realpath(parent, rp)) {
        snprintf(why, why_size, "cannot resolve its parent folder %s: %s", parent, strerror(errno));
    } else if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
        if (realpath(d, rp))
            abs = kv_strdup(rp);
        else
            snprintf(why, why_size, "cannot resolve: %s", strerror(errno));
    } else {
        abs = strcmp(rp, "/") == 0 ? join_path("", base) : join_path(rp, base);
        struct stat st;
        if (lstat(abs, &st) == 0 && S_ISLNK(st.st_mode)) {
            if (realpath(abs, rp)) {
                kv_free(abs);
                abs = kv_strdup(rp);
            } else {
                snprintf(why, why_size, "is a symbolic link to nothing (%s)", strerror(errno));
                kv_free(abs);
                abs = NULL;
            }
        }
    }
    kv_free(parent);
    kv_free(d);
    return abs;
}

int kv_outdir_begin(kv_outdir *od, const char *dir, const char *const *owned, size_t n_owned,
                    kv_cleanup_slot *slot, kv_error *err)
{
    memset(od, 0, sizeof *od);
    od->dir = kv_strdup(dir ? dir : "");
    od->owned = owned;
    od->n_owned = n_owned;
    od->slot = slot;
    if (!dir || !dir[0])
        return outdir_fail(od, err, "an empty output folder name");
    char why[700] = "";
    od->abs = resolve_out(dir, why, sizeof why);
    if (!od->abs)
        return outdir_fail(od, err, "%s", why);
    if (strcmp(od->abs, "/") == 0)
        return outdir_fail(od, err, "the root folder cannot be an output folder");
    char *slash = strrchr(od->abs, '/');
    char *parent = slash == od->abs ? kv_strdup("/") : kv_strndup(od->abs, (size_t)(slash - od->abs));
    const char *base = slash + 1;
    /* First the leftovers of dead runs on DIR, which may bring a previous DIR back (I1). */
    kv_error reap_err = {0};
    if (kv_stale_reap(parent, base, NULL, &reap_err) != 0) {
        kv_free(parent);
        return outdir_fail(od, err, "%s", reap_err.msg);
    }
    struct stat st, pst;
    int exists = stat(od->abs, &st) == 0;
    int bad = 0;
    if (exists && !S_ISDIR(st.st_mode))
        bad = outdir_fail(od, err, "exists and is not a folder");
    else if (exists && (stat(parent, &pst) != 0 || pst.st_dev != st.st_dev || pst.st_ino == st.st_ino))
        bad = outdir_fail(od, err, "is a mount point; kvsim replaces its output folder whole, so name a folder "
                                   "inside it (e.g. %s/run1)", dir);
    if (!bad) {
        char cwd[PATH_MAX];
        size_t al = strlen(od->abs);
        if (getcwd(cwd, sizeof cwd) && strncmp(cwd, od->abs, al) == 0 && (cwd[al] == '\0' || cwd[al] == '/'))
            bad = outdir_fail(od, err, "is the current folder or holds it; kvsim replaces its output folder "
                                       "whole, so name a folder of its own (e.g. %s/run1)", dir);
    }
    if (!bad && exists && access(od->abs, W_OK | X_OK) != 0)
        bad = outdir_fail(od, err, "cannot write into it: %s", strerror(errno));
    kv_free(parent);
    if (bad)
        return bad;
    od->tmp = temp_name(od->abs, "tmp");
    if (strlen(od->tmp) >= sizeof slot->path)
        return outdir_fail(od, err, "the path is too long");
    /* Arm the signal registry before the folder exists, so no moment has it unnamed (I3). */
    slot_set(slot, od->tmp);
    int made = mkdir(od->tmp, 0777) == 0;
    if (!made && errno == EEXIST && kv_rmtree(od->tmp) == 0) /* a dead process that had our pid left it */
        made = mkdir(od->tmp, 0777) == 0;
    if (!made)
        return outdir_fail(od, err, "cannot create the staging folder %s: %s", od->tmp, strerror(errno));
    od->staged = 1;
    if (exists)
        chmod(od->tmp, st.st_mode & 07777);
    /* Test-write a file, so a long run does not discover at its end that it cannot write. */
    char *probe = join_path(od->tmp, ".kvsim-write-test");
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int ok = fd >= 0 && write(fd, "x", 1) == 1;
    int e = errno;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    unlink(probe);
    kv_free(probe);
    if (!ok)
        return outdir_fail(od, err, "cannot write a file into the staging folder %s: %s", od->tmp, strerror(e));
    return KV_OK;
}

const char *kv_outdir_staging(const kv_outdir *od)
{
    return od->tmp;
}

static int is_owned(const kv_outdir *od, const char *name)
{
    for (size_t i = 0; i < od->n_owned; i++)
        if (strcmp(od->owned[i], name) == 0)
            return 1;
    return 0;
}

static int copy_at(int from, int to, const char *name, mode_t mode)
{
    int in = openat(from, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = openat(to, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 07777);
    if (out < 0) {
        close(in);
        return -1;
    }
    char buf[65536];
    ssize_t got;
    int rc = 0;
    while ((got = read(in, buf, sizeof buf)) > 0) {
        for (ssize_t done = 0; done < got;) {
            ssize_t w = write(out, buf + done, (size_t)(got - done));
            if (w < 0) {
                rc = -1;
                break;
            }
            done += w;
        }
        if (rc)
            break;
    }
    if (got < 0)
        rc = -1;
    if (close(out) != 0)
        rc = -1;
    close(in);
    return rc;
}

/* Carries what is in from (shown: its path for messages) into to, keeping what to already has. */
static int carry_dir(const kv_outdir *od, int from, int to, const char *shown, int top, kv_error *err)
{
    int fd = dup(from);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", shown, strerror(errno));
    }
    int rc = KV_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || (top && is_owned(od, name)))
            continue;
        struct stat st, there;
        if (fstatat(from, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone meanwhile */
        int present = fstatat(to, name, &there, AT_SYMLINK_NOFOLLOW) == 0;
        char *path = join_path(shown, name);
        int fail = 0;
        if (S_ISDIR(st.st_mode)) {
            if (present && !S_ISDIR(there.st_mode)) {
                /* the run wrote a file of that name: its version wins */
            } else if (!present && mkdirat(to, name, (st.st_mode & 07777) | 0700) != 0) {
                fail = 1;
            } else {
                int sf = openat(from, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int sto = openat(to, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sf < 0 || sto < 0)
                    fail = 1;
                else
                    rc = carry_dir(od, sf, sto, path, 0, err);
                if (sf >= 0)
                    close(sf);
                if (sto >= 0)
                    close(sto);
                if (!fail && !rc && !present)
                    fchmodat(to, name, st.st_mode & 07777, 0);
            }
        } else if (present) {
            /* the run wrote this name: its version wins */
        } else if (S_ISREG(st.st_mode)) {
            fail = linkat(from, name, to, name, 0) != 0 && copy_at(from, to, name, st.st_mode) != 0;
        } else if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t n = readlinkat(from, name, target, sizeof target - 1);
            if (n >= 0)
                target[n] = '\0';
            fail = n < 0 || symlinkat(target, to, name) != 0;
        } else if (S_ISFIFO(st.st_mode)) {
            fail = mkfifoat(to, name, st.st_mode & 07777) != 0;
        } else {
            errno = ENOTSUP;
            fail = 1;
        }
        if (fail)
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot keep it in the new output folder: %s", path,
                              strerror(errno));
        kv_free(path);
    }
    closedir(d);
    return rc;
}

int kv_outdir_carry(kv_outdir *od, kv_error *err)
{
    if (!od->staged)
        return kv_error_set(err, KV_EFAIL, "%s: no staging folder", od->dir);
    int from = open(od->abs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (from < 0)
        return errno == ENOENT ? KV_OK
                               : kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", od->dir, strerror(errno));
    int to = open(od->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = to < 0 ? kv_error_set(err, KV_EFAIL, "%s: cannot open: %s", od->tmp, strerror(errno))
                    : carry_dir(od, from, to, od->dir, 1, err);
    if (to >= 0)
        close(to);
    close(from);
    return rc;
}

int kv_outdir_commit(kv_outdir *od, kv_error *err)
{
    if (!od->staged) {
        kv_error_set(err, KV_EFAIL, "%s: no staging folder to publish", od->dir);
        kv_outdir_abort(od);
        return KV_EFAIL;
    }
    struct stat st;
    int exists = lstat(od->abs, &st) == 0;
    int rc = KV_OK;
    if (exists && !S_ISDIR(st.st_mode))
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot publish the outputs: it became something other than a folder "
                          "during the run; left as it is", od->dir);
    if (!rc && exists)
        rc = kv_outdir_carry(od, err);
    if (rc) {
        kv_outdir_abort(od);
        return rc;
    }
    sigset_t block, saved;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &saved);
    char *old = NULL;
    if (!exists) {
        if (rename(od->tmp, od->abs) != 0)
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot rename the staging folder into place: %s", od->dir,
                              strerror(errno));
    } else if (!od->exchange_off && renameat2(AT_FDCWD, od->tmp, AT_FDCWD, od->abs, RENAME_EXCHANGE) == 0) {
        old = kv_strdup(od->tmp); /* the previous folder now lives under the staging name */
    } else if (od->exchange_off || errno == EINVAL || errno == ENOSYS || errno == ENOTSUP || errno == EOPNOTSUPP) {
        old = temp_name(od->abs, "old");
        if (rename(od->abs, old) != 0) {
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot move the previous folder aside: %s", od->dir,
                              strerror(errno));
        } else if (rename(od->tmp, od->abs) != 0) {
            int e = errno;
            rename(old, od->abs);
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot rename the staging folder into place: %s", od->dir,
                              strerror(e));
        }
        if (rc) {
            kv_free(old);
            old = NULL;
        }
    } else {
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot swap the staging folder into place: %s", od->dir,
                          strerror(errno));
    }
    if (rc) {
        kv_outdir_abort(od); /* still blocked: removes the staging folder, then disarms */
        sigprocmask(SIG_SETMASK, &saved, NULL);
        return rc;
    }
    od->staged = 0; /* published: the staging name is no longer ours to remove, except as `old` */
    slot_set(od->slot, old);
    sigprocmask(SIG_SETMASK, &saved, NULL);
    if (old && kv_rmtree(old) != 0)
        rc = kv_error_set(err, KV_EFAIL, "%s: published, but the previous folder, moved to %s, could not be removed: "
                          "%s", od->dir, old, strerror(errno));
    slot_set(od->slot, NULL);
    kv_free(old);
    kv_outdir_abort(od);
    return rc;
}

void kv_outdir_abort(kv_outdir *od)
{
    if (od->staged && od->tmp)
        kv_rmtree(od->tmp);
    if (od->staged || od->slot)
        slot_set(od->slot, NULL);
    kv_free(od->dir);
    kv_free(od->abs);
    kv_free(od->tmp);
    memset(od, 0, sizeof *od);
}
