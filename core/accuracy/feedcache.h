/* feedcache.h — measured reference-model figures cached on disk, keyed by what determines them.
 *
 * A measurement on the reference model (Lynx acceptance, DiffKV tiers) costs
 * seconds to a minute; its result depends only on the model file, kvsim's
 * measurement code and the inputs of the measurement. The caller writes all of
 * those into one key text (model file identity, a measurement version
 * constant, the policy's encodings, lengths, samples, seed) and stores the
 * numbers under it.
 *
 * Invariants:
 *  1. A load is a hit only when the file's stored key equals the key byte for
 *     byte and it holds exactly n numbers: a hash collision, a stale format or
 *     a corrupt / truncated file is a miss, never an error.
 *  2. A store replaces the file atomically (temporary file + rename), so a
 *     reader sees the old file, the new file, or none — never half of one.
 *  3. Numbers round-trip exactly (written with 17 significant digits).
 *  4. The cache never changes results: a hit returns the very numbers a
 *     measurement stored.
 *
 * The folder: $KVSIM_CACHE_DIR, else $XDG_CACHE_HOME/kvsim/feed, else
 * $HOME/.cache/kvsim/feed (empty variables count as unset); created on the
 * first store. One file per key: <16 hex digits of FNV-1a 64 of the key>.feed.
 */
#ifndef KV_FEEDCACHE_H
#define KV_FEEDCACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/base/error.h"

#define KV_FEEDCACHE_MAX_VALUES 4096 /* numbers per entry */

/* Looks the key up. *found=false when absent, stale (other key) or corrupt (a
   corrupt file is ignored and overwritten by the next store, never fatal); on
   a hit values[0..n) is filled, otherwise left as it was. KV_EFAIL only for
   misuse (NULL key, n outside 1..KV_FEEDCACHE_MAX_VALUES). */
int kv_feedcache_load(const char *key, double *values, int n, bool *found, kv_error *err);

/* Stores values[0..n) under the key (atomic: temporary file + rename). The
   cache is an optimisation: when no cache folder can be named, created or
   written (read-only home, full disk), nothing is stored and KV_OK is returned
   without a message — the caller has its numbers and the next run measures
   again. KV_EFAIL only for misuse (as kv_feedcache_load). */
int kv_feedcache_store(const char *key, const double *values, int n, kv_error *err);

/* The cache folder as described above, into buf; false when none can be named
   (no variable set) or it does not fit. */
bool kv_feedcache_dir(char *buf, size_t len);

/* A key fragment naming a file's identity: "PATH size=BYTES mtime=SEC.NSEC"
   (a changed or replaced model file changes it). KV_EINPUT when the file
   cannot be stat'ed. */
int kv_feedcache_file_id(const char *path, char *buf, size_t len, kv_error *err);

#endif
