/* test_feedcache.c — the on-disk cache of measured reference-model figures: hit, miss, collisions, corruption. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/accuracy/feedcache.h"
#include "tests/support.h"

/* A fresh cache folder (KVSIM_CACHE_DIR) per test, removed when the test's process exits; Criterion
   runs each test in its own process. */
static char base_dir[200], cache_dir[256];

static void drop_cache(void)
{
    kvt_rmtree(base_dir);
}

static void fresh_cache(void)
{
    snprintf(base_dir, sizeof base_dir, "/tmp/kvsim-test-feedcache-XXXXXX");
    cr_assert(mkdtemp(base_dir) != NULL);
    atexit(drop_cache);
    snprintf(cache_dir, sizeof cache_dir, "%s/feed", base_dir); /* not yet there: the first store creates it */
    setenv("KVSIM_CACHE_DIR", cache_dir, 1);
}

/* The one entry file in dir (path into buf); asserts there is exactly one. */
static void only_entry(const char *dir, char *buf, size_t len)
{
    DIR *d = opendir(dir);
    cr_assert(d != NULL, "%s", dir);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(buf, len, "%s/%s", dir, e->d_name);
            count++;
        }
    closedir(d);
    cr_assert_eq(count, 1, "%d entries in %s", count, dir);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_all(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "%s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

Test(feedcache, miss_then_hit_exact_values)
{
    fresh_cache();
    kv_error err = {0};
    double v[4] = {0.6190476190476191, 1.0 / 3.0, 0.0, 1e-300};
    double got[4] = {-1, -1, -1, -1};
    bool found = true;
    cr_assert_eq(kv_feedcache_load("model=a split=2+6", got, 4, &found, &err), 0, "%s", err.msg);
    cr_expect(!found, "an empty cache misses");
    cr_expect_eq(got[0], -1.0, "a miss leaves the values alone");
    cr_assert_eq(kv_feedcache_store("model=a split=2+6", v, 4, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_feedcache_load("model=a split=2+6", got, 4, &found, &err), 0, "%s", err.msg);
    cr_assert(found);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(memcmp(&got[i], &v[i], sizeof v[i]), 0, "value %d: %.17g != %.17g", i, got[i], v[i]);
    /* Another key (a different split) misses. */
    cr_assert_eq(kv_feedcache_load("model=a split=4+4", got, 4, &found, &err), 0, "%s", err.msg);
    cr_expect(!found);
    /* The same key with another count misses (a stale layout is not a hit). */
    double three[3];
    cr_assert_eq(kv_feedcache_load("model=a split=2+6", three, 3, &found, &err), 0, "%s", err.msg);
    cr_expect(!found);
}

Test(feedcache, store_replaces_and_is_deterministic)
{
    fresh_cache();
    kv_error err = {0};
    double a[2] = {0.5, 0.25}, b[2] = {0.75, 0.125}, got[2];
    bool found;
    cr_assert_eq(kv_feedcache_store("k", a, 2, &err), 0);
    char path[512];
    only_entry(cache_dir, path, sizeof path);
    size_t len1, len2;
    char *first = read_all(path, &len1);
    cr_assert_eq(kv_feedcache_store("k", a, 2, &err), 0);
    char *second = read_all(path, &len2);
    cr_expect(len1 == len2 && memcmp(first, second, len1) == 0, "the same entry gives the same bytes");
    cr_expect(strstr(first, "\nk\n") != NULL, "the file keeps the key text: %s", first);
    cr_assert_eq(kv_feedcache_store("k", b, 2, &err), 0);
    only_entry(cache_dir, path, sizeof path); /* replaced in place, no temporary left behind */
    cr_assert_eq(kv_feedcache_load("k", got, 2, &found, &err), 0);
    cr_expect(found && got[0] == 0.75 && got[1] == 0.125);
    free(first);
    free(second);
}

Test(feedcache, key_collision_is_a_miss)
{
    /* Put key A's file where key B's hash points (a collision) and ask for B. */
    fresh_cache();
    kv_error err = {0};
    double v[1] = {0.9}, got[1] = {0};
    bool found;
    char dir_b[256], path_a[512], path_b[512];
    snprintf(dir_b, sizeof dir_b, "%s-b", cache_dir);
    setenv("KVSIM_CACHE_DIR", dir_b, 1);
    cr_assert_eq(kv_feedcache_store("key B", v, 1, &err), 0);
    only_entry(dir_b, path_b, sizeof path_b);
    const char *name_b = strrchr(path_b, '/') + 1;
    setenv("KVSIM_CACHE_DIR", cache_dir, 1);
    cr_assert_eq(kv_feedcache_store("key A", v, 1, &err), 0);
    only_entry(cache_dir, path_a, sizeof path_a);
    char target[512];
    snprintf(target, sizeof target, "%s/%s", cache_dir, name_b);
    cr_assert_eq(rename(path_a, target), 0);
    cr_assert_eq(kv_feedcache_load("key B", got, 1, &found, &err), 0);
    cr_expect(!found, "a file holding another key is not a hit");
    /* A key that is a prefix of the stored one is not a hit either. */
    cr_assert_eq(kv_feedcache_store("key A", v, 1, &err), 0);
    cr_assert_eq(kv_feedcache_load("key", got, 1, &found, &err), 0);
    cr_expect(!found);
}

Test(feedcache, corrupt_files_are_misses_and_get_overwritten)
{
    fresh_cache();
    kv_error err = {0};
    double v[3] = {0.1, 0.2, 0.3}, got[3];
    bool found;
    cr_assert_eq(kv_feedcache_store("corrupt me", v, 3, &err), 0);
    char path[512];
    only_entry(cache_dir, path, sizeof path);
    size_t len;
    char *good = read_all(path, &len);
    /* Truncations at every length, a flipped digit, trailing garbage, an empty file, a folder. */
    for (size_t cut = 0; cut < len; cut++) {
        write_all(path, good, cut);
        found = true;
        cr_assert_eq(kv_feedcache_load("corrupt me", got, 3, &found, &err), 0);
        cr_expect(!found, "a file cut at %zu bytes is a miss", cut);
    }
    char *bad = strdup(good);
    char *digit = strstr(bad, "0.2");
    cr_assert(digit);
    digit[2] = 'x';
    write_all(path, bad, len);
    cr_assert_eq(kv_feedcache_load("corrupt me", got, 3, &found, &err), 0);
    cr_expect(!found, "a mangled number is a miss");
    write_all(path, good, len);
    FILE *f = fopen(path, "ab");
    fputs("0.4\n", f);
    fclose(f);
    cr_assert_eq(kv_feedcache_load("corrupt me", got, 3, &found, &err), 0);
    cr_expect(!found, "trailing data is a miss");
    /* The next store overwrites the corrupt file, and it is a hit again. */
    cr_assert_eq(kv_feedcache_store("corrupt me", v, 3, &err), 0);
    cr_assert_eq(kv_feedcache_load("corrupt me", got, 3, &found, &err), 0);
    cr_expect(found && got[2] == 0.3);
    free(good);
    free(bad);
}

Test(feedcache, unwritable_folder_is_a_quiet_no_op)
{
    fresh_cache();
    /* The cache folder's parent is a plain file: nothing can be created there. */
    char blocker[300];
    snprintf(blocker, sizeof blocker, "%s/blocker", base_dir);
    write_all(blocker, "x", 1);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/feed", blocker);
    setenv("KVSIM_CACHE_DIR", dir, 1);
    kv_error err = {0};
    double v[1] = {1.0}, got[1];
    bool found = true;
    cr_expect_eq(kv_feedcache_store("k", v, 1, &err), 0);
    cr_expect_str_empty(err.msg);
    cr_expect_eq(kv_feedcache_load("k", got, 1, &found, &err), 0);
    cr_expect(!found);
}

Test(feedcache, folder_follows_the_environment)
{
    char buf[512];
    setenv("KVSIM_CACHE_DIR", "/x/kv", 1);
    cr_assert(kv_feedcache_dir(buf, sizeof buf));
    cr_expect_str_eq(buf, "/x/kv");
    setenv("KVSIM_CACHE_DIR", "", 1);
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    cr_assert(kv_feedcache_dir(buf, sizeof buf));
    cr_expect_str_eq(buf, "/x/xdg/kvsim/feed");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/x/home", 1);
    cr_assert(kv_feedcache_dir(buf, sizeof buf));
    cr_expect_str_eq(buf, "/x/home/.cache/kvsim/feed");
    unsetenv("HOME");
    unsetenv("KVSIM_CACHE_DIR");
    cr_expect(!kv_feedcache_dir(buf, sizeof buf));
    kv_error err = {0};
    double v[1] = {1.0};
    bool found = true;
    cr_expect_eq(kv_feedcache_store("k", v, 1, &err), 0, "no folder: a no-op");
    cr_expect_eq(kv_feedcache_load("k", v, 1, &found, &err), 0);
    cr_expect(!found);
}

Test(feedcache, misuse_and_file_identity)
{
    fresh_cache();
    kv_error err = {0};
    double v[1] = {0};
    bool found;
    cr_expect_eq(kv_feedcache_store(NULL, v, 1, &err), KV_EFAIL);
    cr_expect_eq(kv_feedcache_load("k", v, 0, &found, &err), KV_EFAIL);
    char id1[600], id2[600];
    char file[300];
    snprintf(file, sizeof file, "%s/model.gguf", base_dir);
    write_all(file, "abc", 3);
    cr_assert_eq(kv_feedcache_file_id(file, id1, sizeof id1, &err), 0, "%s", err.msg);
    cr_expect(strstr(id1, "size=3") != NULL, "%s", id1);
    write_all(file, "abcd", 4);
    cr_assert_eq(kv_feedcache_file_id(file, id2, sizeof id2, &err), 0);
    cr_expect(strcmp(id1, id2) != 0, "a changed file changes its identity");
    cr_expect_eq(kv_feedcache_file_id("/nonexistent/model.gguf", id2, sizeof id2, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "/nonexistent/model.gguf") != NULL, "%s", err.msg);
}
