/* plot.c — find Python with matplotlib and run scripts/plot on a folder (fork/exec, no shell). */
#include "core/plot.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KV_DATA_DIR
#define KV_DATA_DIR "."
#endif

/* Runs argv (PATH searched); stdout/stderr to /dev/null when quiet. Returns the exit status, or -1. */
static int run_wait(char *const argv[], int quiet)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (quiet) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int has_matplotlib(const char *python)
{
    char *argv[] = {(char *)python, "-c", "import matplotlib", NULL};
    return run_wait(argv, 1) == 0;
}

int kv_plot_folder(const char *dir, FILE *log)
{
    const char *data = getenv("KVSIM_DATA");
    char script[4096];
    snprintf(script, sizeof script, "%s/scripts/plot", data && data[0] ? data : KV_DATA_DIR);
    struct stat st;
    if (stat(script, &st) != 0) {
        fprintf(log, "plots skipped: %s not found (set KVSIM_DATA to kvsim's source folder)\n", script);
        return 0;
    }
    const char *env = getenv("KVSIM_PYTHON");
    const char *candidates[] = {env && env[0] ? env : NULL, "python3", "/usr/bin/python3"};
    const char *python = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !python; i++)
        if (candidates[i] && has_matplotlib(candidates[i]))
            python = candidates[i];
    if (!python) {
        fprintf(log, "plots skipped: no Python 3 with matplotlib (Debian: apt-get install python3-matplotlib; "
                     "or set KVSIM_PYTHON to one that has it)\n");
        return 0;
    }
    char *argv[] = {(char *)python, script, (char *)dir, NULL};
    int rc = run_wait(argv, 0);
    if (rc != 0) {
        fprintf(log, "plots failed: %s %s %s exited with status %d\n", python, script, dir, rc);
        return 1;
    }
    return 0;
}
