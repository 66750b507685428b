/* afile.h — outputs written all or nothing: single files (temporary + rename) and whole output folders
 * (a staging folder published with one rename).
 *
 * Design note: publishing an output folder (kv_outdir_*)
 *
 * A command that fills an output folder DIR (kvsim run --out DIR, kvsim eval --out DIR) does:
 *
 *   1. kv_outdir_begin, before any long work. DIR's parent is created (mkdir -p); temporaries of DIR
 *      left by dead processes are removed (kv_stale_reap); the staging folder DIR.tmp.<pid> is created
 *      beside DIR (so on the same file system) and a file is test-written into it. Any failure here is
 *      bad input (KV_EINPUT, exit 2) with a message naming the path: nothing has been simulated yet.
 *      Refused as well: DIR that is not a folder, a mount point, the current folder or one holding it.
 *   2. Every output file, figures included, is written into the staging folder (kv_outdir_staging).
 *   3. kv_outdir_commit publishes it:
 *      a. If DIR exists, the entries of DIR the command does not own (owned = the names given to
 *         kv_outdir_begin; kvsim run owns results.json, requests.csv, trace.json and figures/) are
 *         carried into the staging folder first: regular files as hard links (copied where a link is
 *         refused), symbolic links and FIFOs recreated, folders recursively. So a sweep point's
 *         command.txt and stderr.txt (still open by the sweep), or an accuracy.json from kvsim eval,
 *         survive a rerun. An owned entry this run did not write (trace.json of an earlier run made
 *         with outputs.trace on) is dropped: the published DIR describes exactly one run.
 *      b. SIGINT, SIGTERM and SIGHUP are blocked for the renames.
 *      c. DIR absent: rename(DIR.tmp.<pid>, DIR). DIR present: renameat2(RENAME_EXCHANGE) swaps the
 *         two in one step, so DIR always names a complete folder. On a file system that cannot
 *         exchange, DIR is renamed to DIR.old.<pid>, then the staging folder to DIR (if that second
 *         rename fails the first is undone).
 *      d. The previous folder (now at DIR.tmp.<pid>, or DIR.old.<pid>) is removed.
 *   4. A failure before 3c, or kv_outdir_abort, removes the staging folder: DIR is left exactly as
 *      it was, and the command exits non-zero.
 *
 * Invariants:
 *   I1. At every instant DIR is what it was before the command, or the complete new folder (with the
 *       one exception of a crash between the two renames of the fallback in 3c, which the next
 *       kv_stale_reap undoes: DIR missing and DIR.old.<deadpid> present → renamed back to DIR).
 *   I2. A temporary is named NAME.tmp.<pid> or NAME.old.<pid>, pid being the process that made it
 *       (kv_afile's single-file temporaries too). A process removes only its own temporaries and those
 *       whose pid is dead (kill(pid, 0) fails with ESRCH).
 *   I3. While the staging folder (or, after 3c, the previous folder) exists, slot->path names it and
 *       slot->armed is 1. The command layer's signal handler calls kv_cleanup_slot_run, which only
 *       makes async-signal-safe system calls, then exits 128 + the signal (130 SIGINT, 143 SIGTERM).
 *
 * Limits: kill -9 cannot be caught; its DIR.tmp.<pid> stays beside DIR (DIR itself is untouched)
 * until the next command on DIR, or kvsim sweep resuming the sweep, removes it. A process on another
 * host sharing the folder (NFS) looks dead from here, so do not run two commands on one DIR from two
 * hosts at once. Entries created in DIR by someone else during step 3 may be lost with the old folder.
 */
#ifndef KV_AFILE_H
#define KV_AFILE_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

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

/* rm -rf path without following symbolic links. Async-signal-safe (system calls only, no
   allocation). Returns 0, or -1 when something could not be removed (errno says why); a
   missing path is 0. */
int kv_rmtree(const char *path);

typedef struct kv_stale_counts {
    size_t removed;  /* temporaries of dead processes removed */
    size_t restored; /* NAME.old.<deadpid> renamed back to a missing NAME */
    size_t live;     /* temporaries of processes still running (left alone) */
} kv_stale_counts;

/* Looks in folder for NAME.tmp.<pid> and NAME.old.<pid> with NAME = base and deals with those
   whose pid is dead (I2): removes them, except that NAME.old.<pid> becomes NAME again when NAME
   is missing. counts may be NULL. A missing folder is fine. Returns KV_OK or KV_EFAIL (a
   temporary could not be removed, or the folder not read). */
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
    char *abs;                 /* its absolute path, parent resolved */
    char *tmp;                 /* the staging folder, abs + ".tmp.<pid>" */
    const char *const *owned;  /* names the command owns in DIR (not carried over); borrowed */
    size_t n_owned;            /* entries in owned */
    kv_cleanup_slot *slot;     /* the signal registry to keep current, or NULL; borrowed */
    int staged;                /* 1 while the staging folder exists and is ours */
    int exchange_off;          /* 1: publish with the two-rename fallback of step 3c even where the file
                                  system can exchange (tests set it, to exercise that path) */
} kv_outdir;

/* Step 1 of the design note. owned and slot must outlive od. On failure nothing is left behind
   (beyond DIR's parent folders) and the error is KV_EINPUT naming the path. */
int kv_outdir_begin(kv_outdir *od, const char *dir, const char *const *owned, size_t n_owned,
                    kv_cleanup_slot *slot, kv_error *err);
/* The folder to write into (the staging folder). */
const char *kv_outdir_staging(const kv_outdir *od);
/* Step 3a alone: carries DIR's unowned entries into the staging folder (e.g. before plotting
   there, so the plots see an accuracy.json kept from before). Idempotent; commit calls it again. */
int kv_outdir_carry(kv_outdir *od, kv_error *err);
/* Steps 3a-3d. On failure the staging folder is removed and DIR is unchanged (KV_EFAIL). Frees od
   either way. */
int kv_outdir_commit(kv_outdir *od, kv_error *err);
/* Removes the staging folder and frees od; safe after a failed begin or a commit. */
void kv_outdir_abort(kv_outdir *od);

#endif
