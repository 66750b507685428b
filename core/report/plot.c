/* plot.c — find Python with matplotlib and run scripts/plot on a folder (fork/exec, no shell). */
#include "core/report/plot.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/datadir.h"

/* Runs argv (PATH searched); stdout/stderr to /dev/null when quiet. When log is given, the
   child's stdout comes through a pipe and is copied there with every `from` replaced by `to`.
   slot (may be NULL) names the child while it runs, so a signal handler can stop it (afile.h).
   Returns the exit status, or -1. */
static int run_wait(char *const argv[], int quiet, FILE *log, const char *from, const char *to,
                    kv_cleanup_slot *slot)
{
    int pipefd[2] = {-1, -1};
    if (log && pipe(pipefd) != 0)
        return -1;
    fflush(NULL);
    sigset_t block, saved;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &saved); /* until the slot names the child */
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &saved, NULL);
        if (log) {
            close(pipefd[0]);
            close(pipefd[1]);
        }
        return -1;
    }
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &saved, NULL);
        if (quiet) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        } else if (log) {
            dup2(pipefd[1], 1);
            close(pipefd[0]);
            close(pipefd[1]);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (slot)
        slot->child = pid;
    sigprocmask(SIG_SETMASK, &saved, NULL);
    if (log) {
        close(pipefd[1]);
        FILE *in = fdopen(pipefd[0], "r");
        char line[8192];
        size_t flen = strlen(from);
        while (in && fgets(line, sizeof line, in)) {
            char *at = line, *hit;
            while (flen && (hit = strstr(at, from)) != NULL) {
                fwrite(at, 1, (size_t)(hit - at), log);
                fputs(to, log);
                at = hit + flen;
            }
            fputs(at, log);
        }
        if (in)
            fclose(in);
        else
            close(pipefd[0]);
        fflush(log);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        ;
    if (slot)
        slot->child = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int has_matplotlib(const char *python)
{
    char *argv[] = {(char *)python, "-c", "import matplotlib", NULL};
    return run_wait(argv, 1, NULL, "", "", NULL) == 0;
}

int kv_plot_folder(const char *dir, const char *shown, FILE *log, kv_cleanup_slot *slot)
{
    if (!shown)
        shown = dir;
    char data[KV_DATA_PATH_MAX];
    if (!kv_data_dir(data, sizeof data)) {
        fprintf(log, "plots skipped: no kvsim data folder with scripts/plot (kvsim --version lists where it looks; "
                     "KVSIM_DATA_DIR names one)\n");
        return 0;
    }
    char script[KV_DATA_PATH_MAX + 16];
    snprintf(script, sizeof script, "%s/scripts/plot", data);
    struct stat st;
    if (stat(script, &st) != 0) {
        fprintf(log, "plots skipped: %s not found (KVSIM_DATA_DIR names kvsim's data folder)\n", script);
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
    int rc = run_wait(argv, 0, log, dir, shown, slot);
    if (rc != 0) {
        fprintf(log, "plots failed: %s %s %s exited with status %d\n", python, script, shown, rc);
        return 1;
    }
    return 0;
}
