/* support.h — helpers shared by the tests: temporary folders, running kvsim, reading files. */
#ifndef KV_TEST_SUPPORT_H
#define KV_TEST_SUPPORT_H

#include <stddef.h>
#include <sys/types.h>

struct kv_policy;
struct kv_policy_param;
struct kv_scenario;
struct kv_study;

/* Makes a fresh temporary folder; the returned path is owned by the caller (free). */
char *kvt_tempdir(void);
/* Writes text to dir/name; returns the full path (free it). */
char *kvt_write(const char *dir, const char *name, const char *text);
/* Reads a whole file (NUL-terminated, free it); NULL if missing. *len may be NULL. */
char *kvt_read(const char *path, size_t *len);
/* Expects dir_a/names[i] and dir_b/names[i] to exist with the same bytes, for each of the n names. */
void kvt_expect_same_files(const char *dir_a, const char *dir_b, const char *const *names, int n);
/* Runs a shell command line (sh -c) with stderr joined to stdout; the output in *output (free it; NULL
   to drop it). Returns the exit code, or -1 if it could not start or was killed by a signal. */
int kvt_sh(const char *cmd, char **output);
/* Runs the kvsim binary with a shell argument string; captures stdout+stderr
   (free *output). Returns the exit code, or -1 if it was killed by a signal. */
int kvt_kvsim(const char *args, char **output);
/* Removes a folder and everything in it. */
void kvt_rmtree(const char *dir);
/* Path of a file in the source tree (free it). */
char *kvt_source(const char *relative);
/* dir/name (free it); fails the test if it cannot be made. */
char *kvt_path(const char *dir, const char *name);
/* The names in dir, sorted, joined by spaces ("" when empty or missing); free it. */
char *kvt_listing(const char *dir);
/* A pid that belonged to a process that has exited and been reaped (kill(pid, 0) fails with ESRCH). */
pid_t kvt_dead_pid(void);
/* Copies tests/fixtures/<fixture> (e.g. "scenarios/sweep-base.yaml") to dir/name, failing the
   test if it cannot; returns the copy's path (free it). */
char *kvt_fixture_copy(const char *fixture, const char *dir, const char *name);
/* Loads the policy at `path` with `params` (n of them) and the default limits, failing the
   test (with the error) if it does not load; the caller owns it (kv_policy_destroy). */
struct kv_policy *kvt_policy_load(const char *path, const struct kv_policy_param *params, int n);
/* Loads the scenario at `path` with `sets` (n_sets "key=value" overrides) into *s, prepares and
   runs its study, failing the test on any error; the caller owns both (kv_study_destroy,
   kv_scenario_free). */
struct kv_study *kvt_study_run(const char *path, const char **sets, int n_sets, struct kv_scenario **s);

#endif
