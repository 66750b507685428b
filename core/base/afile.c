/* afile.c — atomic file replacement, output folders published name by name, stale temporaries (afile.h). */
#define _GNU_SOURCE /* renameat2, syscall */
#include "core/base/afile.h"

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
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/alloc.h"

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
    int fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat st;
    if (fd < 0 && errno == EEXIST && lstat(a->tmp_path, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == geteuid()) {
        /* Only a dead process that had our pid can have left this file of ours (I2); anything
           else of that name (a symbolic link, a folder) is not kvsim's and stays. */
        unlink(a->tmp_path);
        fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
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

/* ---- File systems ---------------------------------------------------------------------------- */

/* Which mounted file system holds an entry: st_dev alone misses a bind mount of a folder of the
   same file system, so the mount id (statx, Linux 5.8) is compared too where the kernel gives it. */
typedef struct fs_id {
    dev_t dev;         /* st_dev */
    uint64_t mnt;      /* stx_mnt_id, when has_mnt */
    int has_mnt;       /* 1: mnt is known */
} fs_id;

/* The file system of name in dirfd (name "" : dirfd itself), without following a final symbolic
   link. Async-signal-safe (one system call). 0, or -1 with errno. */
static int fs_of(int dirfd, const char *name, fs_id *id)
{
    struct statx sx;
    int flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | (name[0] ? 0 : AT_EMPTY_PATH);
    if (syscall(SYS_statx, dirfd, name, flags, STATX_BASIC_STATS | STATX_MNT_ID, &sx) != 0)
        return -1;
    id->dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
    id->has_mnt = (sx.stx_mask & STATX_MNT_ID) != 0;
    id->mnt = id->has_mnt ? sx.stx_mnt_id : 0;
    return 0;
}

static int fs_same(const fs_id *a, const fs_id *b)
{
    return a->dev == b->dev && (!a->has_mnt || !b->has_mnt || a->mnt == b->mnt);
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

/* Removes everything in the open folder dfd that lies on the file system root. Re-reads the
   folder until a pass finds it empty, since removing entries while reading can make the kernel
   skip some. A folder on another file system (a mount point) is neither entered nor removed. */
static int rm_entries(int dfd, int depth, const fs_id *root)
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
                fs_id here;
                if (fs_of(dfd, name, &here) != 0 || !fs_same(&here, root))
                    continue; /* a mount point (or gone): never crossed, never removed */
                int is_dir = d->d_type == DT_DIR;
                if (d->d_type == DT_UNKNOWN) {
                    struct stat st;
                    is_dir = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
                }
                if (is_dir) {
                    if (depth < RMTREE_MAX_DEPTH) {
                        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        fs_id opened;
                        if (sub >= 0 && fs_of(sub, "", &opened) == 0 && fs_same(&opened, root))
                            rm_entries(sub, depth + 1, root);
                        if (sub >= 0)
                            close(sub);
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
    if (fd < 0)
        return -1;
    fs_id self, parent;
    int ok = fs_of(fd, "", &self) == 0 && fs_of(fd, "..", &parent) == 0 && fs_same(&self, &parent);
    if (ok)
        rm_entries(fd, 0, &self);
    close(fd);
    if (!ok) {
        errno = EXDEV; /* path is itself a mount point: what is mounted there is not ours */
        return -1;
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

/* ---- Publishing names into a folder ---------------------------------------------------------- */

#define MARK_PUBLISH_A ".kvsim-publish-a" /* the marker while step A runs (design note, 3c) */
#define MARK_PUBLISH_B ".kvsim-publish-b" /* the marker while step B runs */
#define OLD_SUB ".kvsim-old"              /* in the staging folder: DIR's previous owned entries */

/* Whether name may be an owned name: one path component, not "." or "..", not kvsim's markers. */
static int plain_name(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 &&
           strncmp(name, ".kvsim-", 7) != 0;
}

static int present_at(int dirfd, const char *name)
{
    struct stat st;
    return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Renames from/name to to/name, never replacing what is there (RENAME_NOREPLACE; where the file
   system lacks it, or plain is set, a look first). 0, or -1 with errno. */
static int move_at(int from, int to, const char *name, int plain)
{
    if (!plain) {
        if (renameat2(from, name, to, name, RENAME_NOREPLACE) == 0)
            return 0;
        if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP)
            return -1;
    }
    if (present_at(to, name)) {
        errno = EEXIST;
        return -1;
    }
    return renameat(from, name, to, name);
}

/* What one publish works on: DIR, the staging folder, its OLD_SUB, the owned names. */
typedef struct publish {
    int dfd, sfd, ofd;          /* DIR, the staging folder, its OLD_SUB (borrowed descriptors) */
    const char *const *names;   /* owned names, the completion marker (results.json) first */
    size_t n;                   /* entries in names */
    int plain;                  /* move_at without RENAME_NOREPLACE */
    int stop_after;             /* tests: fail (or die) after this many moves; 0: never */
    int stop_kill;              /* tests: SIGKILL instead of failing there */
    int moves;                  /* moves made so far */
    const char *bad;            /* the name a failed move was about */
} publish;

static int publish_move(publish *p, int from, int to, const char *name)
{
    if (p->stop_after > 0 && p->moves == p->stop_after) {
        if (p->stop_kill)
            raise(SIGKILL);
        p->bad = name;
        errno = EIO;
        return -1;
    }
    if (move_at(from, to, name, p->plain) != 0) {
        p->bad = name;
        return -1;
    }
    p->moves++;
    return 0;
}

/* Step A: every owned entry of DIR into OLD_SUB, in order (results.json first). */
static int publish_aside(publish *p)
{
    for (size_t i = 0; i < p->n; i++)
        if (present_at(p->dfd, p->names[i]) && !present_at(p->ofd, p->names[i]) &&
            publish_move(p, p->dfd, p->ofd, p->names[i]) != 0)
            return -1;
    return 0;
}

/* Step B: every owned entry the run wrote into DIR, in reverse order (results.json last). After
   step A no owned name is left in DIR, so NOREPLACE only stops at what someone else made meanwhile. */
static int publish_in(publish *p)
{
    for (size_t i = p->n; i-- > 0;)
        if (present_at(p->sfd, p->names[i]) && publish_move(p, p->sfd, p->dfd, p->names[i]) != 0)
            return -1;
    return 0;
}

/* Undoes step B: the owned entries now in DIR (all the run's, after step A) back into staging. */
static int unpublish_in(publish *p)
{
    int rc = 0;
    for (size_t i = 0; i < p->n; i++)
        if (present_at(p->dfd, p->names[i]) && !present_at(p->sfd, p->names[i]) &&
            move_at(p->dfd, p->sfd, p->names[i], p->plain) != 0)
            rc = -1;
    return rc;
}

/* Undoes step A: what OLD_SUB holds back into DIR. */
static int unpublish_aside(publish *p)
{
    int rc = 0;
    for (size_t i = 0; i < p->n; i++)
        if (present_at(p->ofd, p->names[i]) && move_at(p->ofd, p->dfd, p->names[i], p->plain) != 0)
            rc = -1;
    return rc;
}

/* The owned names a staging folder's marker (one name a line) lists; NULL if it is not a regular
   file of ours or lists a name that is not plain. Free with free_names. */
static char **read_marker(int sfd, const char *mark, size_t *n)
{
    *n = 0;
    int fd = openat(sfd, mark, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_size > 65536) {
        close(fd);
        return NULL;
    }
    char *text = kv_malloc((size_t)st.st_size + 1);
    ssize_t got = read(fd, text, (size_t)st.st_size);
    close(fd);
    if (got != (ssize_t)st.st_size) {
        kv_free(text);
        return NULL;
    }
    text[got] = '\0';
    char **names = NULL;
    size_t cap = 0, count = 0;
    int ok = 1;
    for (char *line = text, *next; ok && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (!plain_name(line)) {
            ok = 0;
            break;
        }
        if (count == cap)
            kv_grow((void **)&names, sizeof *names, &cap, count + 1);
        names[count++] = kv_strdup(line);
    }
    kv_free(text);
    if (!ok) {
        for (size_t i = 0; i < count; i++)
            kv_free(names[i]);
        kv_free(names);
        return NULL;
    }
    if (!names)
        names = kv_calloc(1, sizeof *names);
    *n = count;
    return names;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        kv_free(names[i]);
    kv_free(names);
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

/* What a folder named like a staging folder holds: 'w' KV_OUTDIR_MARK (a run's staging folder),
   'a' / 'b' a publish's marker (3c), 'e' nothing at all, 0 something else (not kvsim's). */
static char staging_kind(int pfd, const char *name)
{
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    char kind = 0;
    if (fstatat(fd, MARK_PUBLISH_B, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
        kind = 'b';
    else if (fstatat(fd, MARK_PUBLISH_A, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
        kind = 'a';
    else if (fstatat(fd, KV_OUTDIR_MARK, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
        kind = 'w';
    if (!kind) {
        int d2 = dup(fd);
        DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
        if (!d && d2 >= 0)
            close(d2);
        int empty = d != NULL;
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                empty = 0;
        if (d)
            closedir(d);
        kind = empty ? 'e' : 0;
    }
    close(fd);
    return kind;
}

/* Finishes the publish a dead process left half done (3c): staging folder tmp_name of DIR base, in
   folder pfd, its marker says step kind ('a' or 'b'). Returns 0 when DIR now holds the run's
   complete set; -1 when it cannot be finished safely (then nothing more is moved). */
static int finish_publish(int pfd, const char *tmp_name, const char *base, char kind)
{
    int sfd = openat(pfd, tmp_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sfd < 0)
        return -1;
    size_t n = 0;
    char **names = read_marker(sfd, kind == 'a' ? MARK_PUBLISH_A : MARK_PUBLISH_B, &n);
    int rc = names ? 0 : -1;
    if (!rc && mkdirat(pfd, base, 0777) != 0 && errno != EEXIST)
        rc = -1;
    int dfd = rc ? -1 : openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    fs_id parent_fs, dir_fs;
    if (dfd < 0 || fs_of(pfd, "", &parent_fs) != 0 || fs_of(dfd, "", &dir_fs) != 0 ||
        !fs_same(&parent_fs, &dir_fs))
        rc = -1; /* DIR is no folder of this file system now: leave everything */
    if (!rc && mkdirat(sfd, OLD_SUB, 0700) != 0 && errno != EEXIST)
        rc = -1;
    int ofd = rc ? -1 : openat(sfd, OLD_SUB, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (ofd < 0)
        rc = -1;
    if (!rc) {
        publish p = {.dfd = dfd, .sfd = sfd, .ofd = ofd, .names = (const char *const *)names, .n = n};
        if (kind == 'a')
            rc = publish_aside(&p);
        if (!rc)
            rc = publish_in(&p);
    }
    if (ofd >= 0)
        close(ofd);
    if (dfd >= 0)
        close(dfd);
    close(sfd);
    free_names(names, n);
    return rc;
}

int kv_stale_reap_names(const char *folder, const char *const *bases, size_t n_bases, kv_stale_counts *counts,
                        kv_error *err)
{
    kv_stale_counts c = {0, 0, 0, 0};
    if (counts)
        *counts = c;
    int pfd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return KV_OK;
        return kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", folder, strerror(errno));
    }
    fs_id folder_fs;
    int dup_fd = dup(pfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d || fs_of(pfd, "", &folder_fs) != 0) {
        int e = errno;
        if (d)
            closedir(d);
        else if (dup_fd >= 0)
            close(dup_fd);
        close(pfd);
        return kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", folder, strerror(e));
    }
    /* The names sorted, so each entry is one binary search. */
    const char **sorted = kv_calloc(n_bases ? n_bases : 1, sizeof *sorted);
    if (n_bases) {
        memcpy(sorted, bases, n_bases * sizeof *sorted);
        qsort(sorted, n_bases, sizeof *sorted, by_string);
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
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        char kind;
        pid_t pid;
        parse_temp(names[i], &bl, &kind, &pid);
        if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) {
            c.live++; /* ours, running, or someone else's we may not signal (EPERM: alive) */
            continue;
        }
        /* Only what kvsim makes, made by this user, on this folder's file system, is touched (I2). */
        struct stat st;
        fs_id here;
        int mine = fstatat(pfd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == geteuid() &&
                   fs_of(pfd, names[i], &here) == 0 && fs_same(&here, &folder_fs);
        char *name = kv_strndup(names[i], bl);
        int done = 0;
        if (mine && kind == 't' && S_ISREG(st.st_mode) && st.st_nlink == 1) {
            done = unlinkat(pfd, names[i], 0) == 0; /* kv_afile's temporary */
            c.removed += (size_t)done;
        } else if (mine && kind == 't' && S_ISDIR(st.st_mode)) {
            char sk = staging_kind(pfd, names[i]);
            if (sk == 'a' || sk == 'b') {
                /* A publish was under way (3c): finish it, so DIR holds one run's complete set. */
                if (finish_publish(pfd, names[i], name, sk) == 0) {
                    c.restored++;
                    char *path = join_path(folder, names[i]);
                    kv_rmtree(path); /* what is left is kvsim's: the previous outputs, the marker */
                    kv_free(path);
                    done = 1;
                }
            } else if (sk == 'e') {
                done = unlinkat(pfd, names[i], AT_REMOVEDIR) == 0;
                c.removed += (size_t)done;
            } else if (sk == 'w') {
                char *path = join_path(folder, names[i]);
                done = kv_rmtree(path) == 0;
                c.removed += (size_t)done;
                kv_free(path);
            }
        } else if (mine && kind == 'o' && S_ISDIR(st.st_mode) && !present_at(pfd, name)) {
            /* An earlier kvsim's crash between two renames of a whole folder: undo the first. */
            done = renameat(pfd, names[i], pfd, name) == 0;
            c.restored += (size_t)done;
        }
        if (!done)
            c.kept++;
        kv_free(name);
    }
    for (size_t i = 0; i < n; i++)
        kv_free(names[i]);
    kv_free(names);
    kv_free(sorted);
    close(pfd);
    if (counts)
        *counts = c;
    return KV_OK;
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

/* Absolute path of dir without creating it or following its last component: its parent is
   created and resolved. NULL with *why set on failure. */
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
    }
    kv_free(parent);
    kv_free(d);
    return abs;
}

/* Why the owned entry path (shown, for messages) at name in the open folder dfd cannot be moved
   aside and removed safely; 0 when it can, or is absent. dir_st is the folder's stat, root its
   file system. Folders are walked to depth RMTREE_MAX_DEPTH. */
static int owned_blocker(int dfd, const char *name, const struct stat *dir_st, const fs_id *root, int depth,
                         const char *shown, char *why, size_t why_size)
{
    struct stat st;
    fs_id here;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : snprintf(why, why_size, "%s: cannot look at it: %s", shown, strerror(errno));
    if (fs_of(dfd, name, &here) != 0 || !fs_same(&here, root))
        return snprintf(why, why_size, "%s: is a mount point (another file system) where kvsim replaces its own "
                        "outputs; kvsim never removes across file systems, so unmount it or name another folder",
                        shown);
    uid_t me = geteuid();
    if (me != 0 && (dir_st->st_mode & S_ISVTX) && st.st_uid != me && dir_st->st_uid != me)
        return snprintf(why, why_size, "%s: belongs to another user in a folder with the sticky bit, so kvsim "
                        "could not replace it", shown);
    if (!S_ISDIR(st.st_mode))
        return 0;
    if (depth >= RMTREE_MAX_DEPTH)
        return snprintf(why, why_size, "%s: more than %d folders deep; kvsim would not remove it all",
                        shown, RMTREE_MAX_DEPTH);
    if (me != 0 && faccessat(dfd, name, W_OK | X_OK, AT_EACCESS) != 0)
        return snprintf(why, why_size, "%s: cannot remove what it holds: %s", shown, strerror(errno));
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = sub >= 0 ? fdopendir(sub) : NULL;
    if (!d) {
        int e = errno;
        if (sub >= 0)
            close(sub);
        return snprintf(why, why_size, "%s: cannot read it: %s", shown, strerror(e));
    }
    int bad = 0;
    struct dirent *e;
    while (!bad && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *path = join_path(shown, e->d_name);
        bad = owned_blocker(dirfd(d), e->d_name, &st, root, depth + 1, path, why, why_size);
        kv_free(path);
    }
    closedir(d);
    return bad;
}

/* The owned entries of the open folder dfd that block a publish; KV_OK, or KV_EFAIL with err set
   to "DIR/NAME: why". */
static int check_owned(const kv_outdir *od, int dfd, kv_error *err)
{
    struct stat st;
    fs_id root;
    if (fstat(dfd, &st) != 0 || fs_of(dfd, "", &root) != 0)
        return kv_error_set(err, KV_EFAIL, "%s: cannot look at it: %s", od->dir, strerror(errno));
    char why[800];
    for (size_t i = 0; i < od->n_owned; i++) {
        char *shown = join_path(od->dir, od->owned[i]);
        int bad = owned_blocker(dfd, od->owned[i], &st, &root, 0, shown, why, sizeof why);
        kv_free(shown);
        if (bad)
            return kv_error_set(err, KV_EFAIL, "%s", why);
    }
    return KV_OK;
}

/* Opens DIR (in od->pfd) as a real folder on its parent's file system: the descriptor, -1 when it
   is absent (errno ENOENT), or -2 with why set. */
static int open_dir(const kv_outdir *od, struct stat *st, char *why, size_t why_size)
{
    if (fstatat(od->pfd, od->base, st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT)
            return -1;
        snprintf(why, why_size, "cannot look at it: %s", strerror(errno));
        return -2;
    }
    if (S_ISLNK(st->st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlinkat(od->pfd, od->base, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        snprintf(why, why_size, "is a symbolic link (to %s); kvsim does not write through a symbolic link named as "
                 "its output folder, so name the folder itself", target);
        return -2;
    }
    if (!S_ISDIR(st->st_mode)) {
        snprintf(why, why_size, "exists and is not a folder");
        return -2;
    }
    int fd = openat(od->pfd, od->base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat fst;
    fs_id pfs, dfs;
    if (fd < 0 || fstat(fd, &fst) != 0 || fst.st_ino != st->st_ino || fst.st_dev != st->st_dev) {
        snprintf(why, why_size, "cannot open it: %s", fd < 0 ? strerror(errno) : "it changed meanwhile");
        if (fd >= 0)
            close(fd);
        return -2;
    }
    if (fs_of(od->pfd, "", &pfs) != 0 || fs_of(fd, "", &dfs) != 0 || !fs_same(&pfs, &dfs)) {
        snprintf(why, why_size, "is a mount point; kvsim stages its outputs beside the folder and renames them in, "
                 "which cannot cross file systems, so name a folder inside it (e.g. %s/run1)", od->dir);
        close(fd);
        return -2;
    }
    return fd;
}

int kv_outdir_begin(kv_outdir *od, const char *dir, const char *const *owned, size_t n_owned,
                    kv_cleanup_slot *slot, kv_error *err)
{
    memset(od, 0, sizeof *od);
    od->pfd = od->sfd = -1;
    od->dir = kv_strdup(dir ? dir : "");
    od->owned = owned;
    od->n_owned = n_owned;
    od->slot = slot;
    if (!dir || !dir[0]) {
        kv_error_set(err, KV_EINPUT, "an empty output folder name (nothing was run)");
        kv_outdir_abort(od);
        return KV_EINPUT;
    }
    for (size_t i = 0; i < n_owned; i++)
        if (!plain_name(owned[i]))
            return outdir_fail(od, err, "internal: '%s' cannot be an owned name", owned[i]);
    char why[700] = "";
    od->abs = resolve_out(dir, why, sizeof why);
    if (!od->abs)
        return outdir_fail(od, err, "%s", why);
    if (strcmp(od->abs, "/") == 0)
        return outdir_fail(od, err, "the root folder cannot be an output folder");
    char *slash = strrchr(od->abs, '/');
    char *parent = slash == od->abs ? kv_strdup("/") : kv_strndup(od->abs, (size_t)(slash - od->abs));
    od->base = kv_strdup(slash + 1);
    od->pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (od->pfd < 0) {
        int e = errno;
        kv_free(parent);
        return outdir_fail(od, err, "cannot open its parent folder: %s", strerror(e));
    }
    /* First the leftovers of dead runs on DIR (a publish one left half done is finished). */
    kv_error reap_err = {0};
    int reap_rc = kv_stale_reap(parent, od->base, NULL, &reap_err);
    kv_free(parent);
    if (reap_rc != 0)
        return outdir_fail(od, err, "%s", reap_err.msg);
    struct stat st;
    int dfd = open_dir(od, &st, why, sizeof why);
    if (dfd == -2)
        return outdir_fail(od, err, "%s", why);
    if (dfd >= 0) {
        od->existed = 1;
        od->dev = st.st_dev;
        od->ino = st.st_ino;
        kv_error owned_err = {0};
        int bad = faccessat(od->pfd, od->base, W_OK | X_OK, AT_EACCESS) != 0
                      ? kv_error_set(&owned_err, KV_EFAIL, "%s: cannot write into it: %s", od->dir, strerror(errno))
                      : check_owned(od, dfd, &owned_err);
        close(dfd);
        if (bad) {
            kv_error_set(err, KV_EINPUT, "%s (nothing was run)", owned_err.msg);
            kv_outdir_abort(od);
            return KV_EINPUT;
        }
    }
    od->tmp = temp_name(od->abs, "tmp");
    if (strlen(od->tmp) >= sizeof slot->path)
        return outdir_fail(od, err, "the path is too long");
    const char *tmp_base = strrchr(od->tmp, '/') + 1;
    /* Arm the signal registry before the folder exists, so no moment has it unnamed (I3). */
    slot_set(slot, od->tmp);
    int made = mkdirat(od->pfd, tmp_base, 0777) == 0;
    if (!made && errno == EEXIST) {
        slot_set(slot, NULL); /* not ours (yet): a signal now must not remove it */
        char sk = staging_kind(od->pfd, tmp_base); /* kvsim's, of a dead process that had our pid */
        if ((sk == 'w' || sk == 'e') && kv_rmtree(od->tmp) == 0) {
            slot_set(slot, od->tmp);
            made = mkdirat(od->pfd, tmp_base, 0777) == 0;
        }
        else
            errno = EEXIST;
    }
    if (!made)
        return outdir_fail(od, err, "cannot create the staging folder %s: %s", od->tmp,
                           errno == EEXIST ? "something kvsim did not make has that name" : strerror(errno));
    od->staged = 1;
    od->sfd = openat(od->pfd, tmp_base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (od->sfd < 0)
        return outdir_fail(od, err, "cannot open the staging folder %s: %s", od->tmp, strerror(errno));
    /* The marker names the folder as kvsim's and lists the owned names (a crashed publish is finished
       from it); writing it also tests that a long run will be able to write at its end. */
    int fd = openat(od->sfd, KV_OUTDIR_MARK, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int ok = fd >= 0;
    for (size_t i = 0; ok && i < n_owned; i++) {
        size_t len = strlen(owned[i]);
        ok = write(fd, owned[i], len) == (ssize_t)len && write(fd, "\n", 1) == 1;
    }
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        e = errno;
    }
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

int kv_outdir_carry(kv_outdir *od, kv_error *err)
{
    if (!od->staged)
        return kv_error_set(err, KV_EFAIL, "%s: no staging folder", od->dir);
    struct stat st;
    char why[700];
    int dfd = open_dir(od, &st, why, sizeof why);
    if (dfd == -1)
        return KV_OK;
    if (dfd < 0)
        return kv_error_set(err, KV_EFAIL, "%s: %s", od->dir, why);
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return kv_error_set(err, KV_EFAIL, "%s: cannot read folder: %s", od->dir, strerror(e));
    }
    int rc = KV_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || is_owned(od, name) || present_at(od->sfd, name))
            continue;
        /* A symbolic link to DIR's entry: read through it, removed with the staging folder (never
           followed), never published. */
        char *target = join_path(od->abs, name);
        if (symlinkat(target, od->sfd, name) != 0)
            rc = kv_error_set(err, KV_EFAIL, "%s/%s: cannot show it in the staging folder: %s", od->dir, name,
                              strerror(errno));
        kv_free(target);
    }
    closedir(d);
    return rc;
}

int kv_outdir_commit(kv_outdir *od, kv_error *err)
{
    if (!od->staged) {
        kv_error_set(err, KV_EFAIL, "%s: no staging folder to publish", od->dir);
        kv_outdir_abort(od);
        return KV_EFAIL;
    }
    /* DIR now: the folder checked at the start (or, if it was absent, absent or a real folder),
       with nothing in the way of the owned names. */
    struct stat st;
    char why[700] = "";
    int rc = KV_OK;
    int dfd = open_dir(od, &st, why, sizeof why);
    if (dfd == -2)
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot publish the outputs: it %s; left as it is", od->dir,
                          strncmp(why, "exists and ", 11) == 0 ? "became something other than a folder during the run"
                                                               : why);
    else if (dfd >= 0 && od->existed && (st.st_dev != od->dev || st.st_ino != od->ino))
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot publish the outputs: it was replaced by another folder during "
                          "the run; left as it is", od->dir);
    else if (dfd >= 0)
        rc = check_owned(od, dfd, err);
    int ofd = -1;
    if (!rc && (renameat(od->sfd, KV_OUTDIR_MARK, od->sfd, MARK_PUBLISH_A) != 0 ||
                mkdirat(od->sfd, OLD_SUB, 0700) != 0 ||
                (ofd = openat(od->sfd, OLD_SUB, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0))
        rc = kv_error_set(err, KV_EFAIL, "%s: cannot prepare the staging folder for publishing: %s", od->tmp,
                          strerror(errno));
    if (rc) {
        if (dfd >= 0)
            close(dfd);
        if (ofd >= 0)
            close(ofd);
        kv_outdir_abort(od);
        return rc;
    }
    sigset_t block, saved;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &saved);
    int created = 0;
    if (dfd < 0) {
        created = mkdirat(od->pfd, od->base, 0777) == 0;
        dfd = created ? openat(od->pfd, od->base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        if (dfd < 0)
            rc = kv_error_set(err, KV_EFAIL, "%s: cannot create the folder: %s", od->dir, strerror(errno));
    }
    publish p = {.dfd = dfd, .sfd = od->sfd, .ofd = ofd, .names = od->owned, .n = od->n_owned,
                 .plain = od->plain_rename, .stop_after = od->test_stop_after, .stop_kill = od->test_stop_kill};
    int step = 0; /* 1: in step A, 2: in step B */
    if (!rc) {
        step = 1;
        rc = publish_aside(&p);
    }
    if (!rc) {
        step = 2;
        rc = renameat(od->sfd, MARK_PUBLISH_A, od->sfd, MARK_PUBLISH_B);
        if (!rc)
            rc = publish_in(&p);
    }
    int undone = 1;
    if (rc && step) {
        int e = errno;
        if (step == 2)
            undone = unpublish_in(&p) == 0 && renameat(od->sfd, MARK_PUBLISH_B, od->sfd, MARK_PUBLISH_A) == 0;
        undone = undone && unpublish_aside(&p) == 0;
        if (undone && created)
            unlinkat(od->pfd, od->base, AT_REMOVEDIR);
        const char *what = p.bad ? p.bad : "the staging folder's marker";
        if (undone)
            kv_error_set(err, KV_EFAIL, "%s: cannot move %s into place: %s; left as it was", od->dir, what,
                         strerror(e));
        else
            kv_error_set(err, KV_EFAIL, "%s: cannot move %s into place: %s, and could not undo the moves: %s keeps "
                         "the rest, and the next kvsim command on %s finishes the publish", od->dir, what,
                         strerror(e), od->tmp, od->dir);
    }
    if (dfd >= 0)
        close(dfd);
    if (ofd >= 0)
        close(ofd);
    if (!undone) {
        od->staged = 0; /* the next command on DIR finishes the publish from it (kv_stale_reap) */
        slot_set(od->slot, NULL);
    }
    sigprocmask(SIG_SETMASK, &saved, NULL);
    if (rc) {
        kv_outdir_abort(od); /* removes the staging folder when the moves were undone */
        return KV_EFAIL;
    }
    /* Published. What is left in the staging folder is kvsim's: the previous owned entries, the
       marker, the symbolic links of kv_outdir_carry, whatever a writer left that is not owned. */
    od->staged = 0;
    if (kv_rmtree(od->tmp) != 0)
        rc = kv_error_set(err, KV_EFAIL, "%s: published, but the staging folder %s, which holds the previous outputs, "
                          "could not be removed: %s", od->dir, od->tmp, strerror(errno));
    kv_outdir_abort(od);
    return rc;
}

void kv_outdir_abort(kv_outdir *od)
{
    if (od->staged && od->tmp)
        kv_rmtree(od->tmp);
    if (od->staged || od->slot)
        slot_set(od->slot, NULL);
    if (od->dir) { /* begin ran: the descriptors are ours (a zeroed od has none) */
        if (od->sfd >= 0)
            close(od->sfd);
        if (od->pfd >= 0)
            close(od->pfd);
    }
    kv_free(od->dir);
    kv_free(od->abs);
    kv_free(od->base);
    kv_free(od->tmp);
    memset(od, 0, sizeof *od);
}
