/* infile.h — open a user-supplied input file: a regular file only, of bounded size.
 *
 * Every path kvsim reads on a user's say-so (scenario, sweep, model card, device profile,
 * policy, trace, profile table, calibration file, SimGrid platform, accuracy texts, model
 * file) goes through here. The file is opened with O_NONBLOCK | O_NOCTTY, so a FIFO nobody
 * writes or a terminal cannot block or become the controlling terminal; anything but a
 * regular file (FIFO, character or block device such as /dev/zero, socket, directory) is
 * refused with KV_EINPUT naming the path and what it is; then O_NONBLOCK is cleared. A file
 * larger than the cap of its kind is refused before anything is read, and kv_input_read_all
 * never reads more than the cap even if the file grows meanwhile.
 * The caps are documented in docs/design-notes.md ("What kvsim guarantees about its inputs").
 */
#ifndef KV_INFILE_H
#define KV_INFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/base/error.h"

/* Scenario, sweep, model card, device profile, policy, calibration, profile table, texts. */
#define KV_INPUT_MAX_TEXT ((uint64_t)16 << 20)
/* Traces (read line by line; the rows kept are bounded by workload.requests). */
#define KV_INPUT_MAX_TRACE ((uint64_t)4 << 30)
/* JSON files kvsim wrote itself and reads back (a sweep's manifest, a point's results.json). */
#define KV_INPUT_MAX_JSON ((uint64_t)1 << 30)
/* No size cap (a model file, which is mapped, not read). */
#define KV_INPUT_NO_CAP ((uint64_t)0)

/* Opens path read-only (O_CLOEXEC) if it is a regular file of at most max_bytes (0: any size).
   Returns the descriptor (blocking), or -1 with KV_EINPUT in err: "PATH: cannot open WHAT: ..."
   (`what` names the kind of file, e.g. "trace"). *size_out (may be NULL) gets the size. */
int kv_input_open(const char *path, const char *what, uint64_t max_bytes, uint64_t *size_out, kv_error *err);
/* The same as a stdio stream ("rb"); NULL on failure. The caller fcloses it. */
FILE *kv_input_fopen(const char *path, const char *what, uint64_t max_bytes, kv_error *err);
/* Reads the whole file into *out (NUL-terminated, owned by the caller: kv_free); *len (may be NULL)
   gets its length. KV_EINPUT for a file that is not regular or is larger than max_bytes (also
   when it grew past the cap while read), KV_EFAIL for a read error. */
int kv_input_read_all(const char *path, const char *what, uint64_t max_bytes, char **out, size_t *len,
                      kv_error *err);

#endif
