/* datadir.h — where kvsim finds its own data (scenarios/, policies/, scripts/plot) at run time.
 *
 * Nothing of the build machine is compiled in. The places, in order:
 *   1. $KVSIM_DATA_DIR, when set and not empty (then the only place);
 *   2. <exe>/../share/kvsim, the installed layout (make install: bin/kvsim, share/kvsim/);
 *   3. the source tree: the nearest folder above the executable's own (up to three levels,
 *      so build/kvsim and build/tests/test_x both reach it) that holds scenarios/ and policies/.
 * <exe> is the folder of /proc/self/exe. The first place that holds scenarios/ and policies/ is
 * kvsim's data folder; there may be none (then only the scenario's and the working folder count).
 */
#ifndef KV_DATADIR_H
#define KV_DATADIR_H

#include <stdbool.h>
#include <stddef.h>

#define KV_DATA_MAX_PLACES 3
#define KV_DATA_PATH_MAX 4096

/* The places looked at, in order (a value, no ownership). */
typedef struct kv_data_places {
    int count;
    char path[KV_DATA_MAX_PLACES][KV_DATA_PATH_MAX];
    const char *what[KV_DATA_MAX_PLACES]; /* "KVSIM_DATA_DIR", "installed", "source tree" (static text) */
    bool usable[KV_DATA_MAX_PLACES];      /* holds scenarios/ and policies/ */
} kv_data_places;

/* This executable's path (/proc/self/exe) into buf; false when it cannot be read. */
bool kv_self_exe(char *buf, size_t size);
/* Fills *out with the places, in order. */
void kv_data_places_list(kv_data_places *out);
/* The data folder (the first usable place) into path; returns true, or false with path "" when
   no place holds kvsim's data. */
bool kv_data_dir(char *path, size_t size);

#endif
