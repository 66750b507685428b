/* afile.h — outputs written all or nothing: single files (temporary + rename) and output folders
 * (a staging folder whose names are renamed into the folder).
 *
 * Design note: publishing an output folder (kv_outdir_*)
 *
 * kvsim only ever creates, replaces or removes its own names: the owned names a command gives
 * kv_outdir_begin (kvsim run: results.json, requests.csv, trace.json, figures/; kvsim eval:
 * accuracy.json) and its temporaries NAME.tmp.<pid> (I2). Everything else in DIR, of any type
 * (files, folders, links, sockets, FIFOs, devices, mount points), is never moved, rewritten or
 * removed. A command that fills an output folder DIR (kvsim run --out DIR, kvsim eval --out DIR) does:
 *
 *   1. kv_outdir_begin, before any long work. DIR's parent is created (mkdir -p) and opened; the
 *      temporaries of DIR left by dead processes are dealt with (kv_stale_reap). Then DIR is
 *      checked, and anything that would make a safe publish impossible is bad input (KV_EINPUT,
 *      exit 2) with a message naming it, before anything is simulated: DIR a symbolic link (never
 *      written through, like a hostile link planted at /tmp/run1), not a folder, a mount point
 *      (renames cannot cross file systems), not writable; an owned entry that is a mount point, or
 *      a folder holding one (found by st_dev and the statx mount id, so bind mounts too), deeper
 *      than 32 levels, or not removable. The staging folder DIR.tmp.<pid> is created beside DIR
 *      with the marker KV_OUTDIR_MARK in it, which lists the owned names and tests a write.
 *   2. Every output file, figures included, is written into the staging folder (kv_outdir_staging).
 *      kv_outdir_carry adds symbolic links to DIR's other entries there, for a plotter to read;
 *      they are never published.
 *   3. kv_outdir_commit publishes, with SIGINT, SIGTERM and SIGHUP blocked:
 *      a. DIR is checked again (the same folder as at the start, same inode, and 1's checks on the
 *         owned names); DIR absent is created now.
 *      b. The marker becomes MARK_PUBLISH_A: step A moves every owned entry DIR has into the
 *         staging folder's .kvsim-old/ (results.json first). An owned name the run did not write
 *         (trace.json of an earlier run made with outputs.trace on) goes this way: DIR then
 *         describes exactly one run.
 *      c. The marker becomes MARK_PUBLISH_B: step B renames each entry the run wrote into DIR
 *         (results.json last, so its presence means the rest is there), never replacing anything
 *         (RENAME_NOREPLACE).
 *      d. If a move fails, the moves made are undone in reverse and DIR is left exactly as it was
 *         (exit 1). Then the staging folder, holding the previous outputs, is removed.
 *   4. A failure before 3, or kv_outdir_abort, removes the staging folder: DIR is left exactly as
 *      it was, and the command exits non-zero.
 *
 * Invariants:
 *   I1. Each owned name in DIR is the previous run's or this run's. Only while step A or B runs
 *       (microseconds, signals blocked) can a reader see some names new and some old, or none; a
 *       crash (kill -9) there leaves the marker saying which step, and the next kv_stale_reap on
 *       DIR finishes the publish from the staging folder (a complete set: nothing is lost).
 *   I2. A temporary is named NAME.tmp.<pid>, pid being the process that made it (kv_afile's
 *       single-file temporaries too). A process removes only its own temporaries and those whose
 *       pid is dead (kill(pid, 0) fails with ESRCH) that kvsim made: a regular file or a folder
 *       holding a marker (or empty), owned by this user, on the folder's own file system. A
 *       symbolic link, another user's folder or one without a marker is left alone, whatever its
 *       name. Removal never follows a symbolic link and never crosses into another file system.
 *   I3. While the staging folder exists, slot->path names it and slot->armed is 1. The command
 *       layer's signal handler calls kv_cleanup_slot_run, which only makes async-signal-safe
 *       system calls, then exits 128 + the signal (130 SIGINT, 143 SIGTERM).
 *
 * Limits: kill -9 cannot be caught; its DIR.tmp.<pid> stays beside DIR until the next command on
 * DIR, or kvsim sweep resuming the sweep, deals with it. A process on another host sharing the
 * folder (NFS) looks dead from here, so do not run two commands on one DIR from two hosts at once.
 * An owned name created in DIR by someone else during step 3 makes the publish fail (undone).
 * NAME.old.<pid> folders were made by earlier kvsim versions (whole-folder publishing): one whose
 * NAME is missing is renamed back to NAME; others are left alone.
 */
#ifndef KV_AFILE_H
#define KV_AFILE_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "core/base/error.h"

/* ---- Single files --------------------------------------------------------------------------- */

typedef struct kv_afile {
    FILE *f;        /* write here */
    char *path;     /* final name */
    char *tmp_path; /* temporary name PATH.tmp.<pid>; removed on abort */
} kv_afile;

/* Opens the temporary file PATH.tmp.<pid> beside `path`. */
int kv_afile_open(kv_afile *a, const char *path, kv_error *err);
/* Flushes, closes and renames onto the final path; on failure removes the temporary. */
int kv_afile_commit(kv_afile *a, kv_error *err);
/* Closes and removes the temporary file (safe after a failed commit or open). */
void kv_afile_abort(kv_afile *a);

/* mkdir -p. */
int kv_mkdirs(const char *dir, kv_error *err);

/* ---- Removing trees, stale temporaries ------------------------------------------------------- */

/* rm -rf path without following symbolic links or entering another file system (a mount point
   inside is left, with what leads to it; path itself a mount point: nothing is removed, EXDEV).
   Async-signal-safe (system calls only, no allocation). Returns 0, or -1 when something could not
   be removed (errno says why); a missing path is 0. */
int kv_rmtree(const char *path);

typedef struct kv_stale_counts {
    size_t removed;  /* temporaries of dead processes removed */
    size_t restored; /* publishes a dead process left half done, finished (I1); or NAME.old.<deadpid>
                        renamed back to a missing NAME */
    size_t live;     /* temporaries of processes still running (left alone) */
    size_t kept;     /* named like temporaries of dead processes but not kvsim's (I2), or not safely
                        removable (a mount point inside): left alone */
} kv_stale_counts;

/* The file kvsim's staging folders hold (design note, 1): it lists the owned names. */
#define KV_OUTDIR_MARK ".kvsim-staging"

/* Looks in folder for NAME.tmp.<pid> and NAME.old.<pid> with NAME = base and deals with those
   whose pid is dead and that kvsim made (I2): removes them, finishing first a publish one was in
   the middle of (I1); NAME.old.<pid> becomes NAME again when NAME is missing. counts may be NULL.
   A missing folder is fine. Returns KV_OK, or KV_EFAIL when the folder cannot be read; what cannot
   be removed safely is left and counted in kept. */
int kv_stale_reap(const char *folder, const char *base, kv_stale_counts *counts, kv_error *err);
/* The same for every NAME in bases[n_bases], in one pass over the folder. Only names a caller
   knows it writes are touched: a user's "notes.tmp.12" is not kvsim's. */
int kv_stale_reap_names(const char *folder, const char *const *bases, size_t n_bases, kv_stale_counts *counts,
                        kv_error *err);
/* Whether name has the form NAME.tmp.<pid> or NAME.old.<pid> (I2). */
int kv_is_temporary_name(const char *name);

/* ---- Output folders -------------------------------------------------------------------------- */

/* What a signal handler needs to remove a staging folder (I3). The command layer owns the one
   instance (cmd_run.c); kv_outdir_* fill it. */
typedef struct kv_cleanup_slot {
    volatile sig_atomic_t armed; /* 1 while path names a folder to remove on a signal */
    volatile sig_atomic_t child; /* a helper process writing into it (plotting) to kill first; 0: none */
    char path[4096];             /* absolute path of that folder, NUL-terminated */
} kv_cleanup_slot;

/* Kills slot->child (SIGKILL, then waits) and removes slot->path if armed. Async-signal-safe;
   NULL is fine. */
void kv_cleanup_slot_run(kv_cleanup_slot *slot);

typedef struct kv_outdir {
    char *dir;                 /* the final folder as the user named it (messages) */
    char *abs;                 /* its absolute path, parent resolved, last component not followed */
    char *base;                /* its last component */
    char *tmp;                 /* the staging folder, abs + ".tmp.<pid>" */
    int pfd;                   /* DIR's parent folder, open (all renames are relative to it) */
    int sfd;                   /* the staging folder, open; -1 before it exists */
    int existed;               /* 1: DIR existed at begin, as the folder dev/ino */
    dev_t dev;                 /* DIR's st_dev at begin */
    ino_t ino;                 /* DIR's st_ino at begin (commit refuses another folder there) */
    const char *const *owned;  /* names the command owns in DIR, results.json first; borrowed */
    size_t n_owned;            /* entries in owned */
    kv_cleanup_slot *slot;     /* the signal registry to keep current, or NULL; borrowed */
    int staged;                /* 1 while the staging folder exists and is ours */
    int plain_rename;          /* 1: move names with renameat after a look, as on a file system
                                  without RENAME_NOREPLACE (tests set it, to exercise that path) */
    int test_stop_after;       /* tests: > 0 makes the publish fail after that many moves (undone) */
    int test_stop_kill;        /* tests: with test_stop_after, SIGKILL the process there instead */
} kv_outdir;

/* Step 1 of the design note. owned and slot must outlive od. On failure nothing is left behind
   (beyond DIR's parent folders) and the error is KV_EINPUT naming the path. */
int kv_outdir_begin(kv_outdir *od, const char *dir, const char *const *owned, size_t n_owned,
                    kv_cleanup_slot *slot, kv_error *err);
/* The folder to write into (the staging folder). */
const char *kv_outdir_staging(const kv_outdir *od);
/* Step 2's view: a symbolic link in the staging folder to each entry of DIR that is not owned and
   not there yet (e.g. before plotting there, so the plots see DIR's accuracy.json). They are
   never published; nothing of DIR is touched. */
int kv_outdir_carry(kv_outdir *od, kv_error *err);
/* Step 3. On failure the staging folder is removed and DIR is unchanged (KV_EFAIL). Frees od
   either way. */
int kv_outdir_commit(kv_outdir *od, kv_error *err);
/* Removes the staging folder and frees od; safe after a failed begin or a commit. */
void kv_outdir_abort(kv_outdir *od);

#endif
