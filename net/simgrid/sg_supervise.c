/* sg_supervise.c — the SimGrid child's supervision: forks it, talks to it under the watchdog, reads
 * its replies and reaps it, recording why it failed (sg_net.c's design notes say why a child). */
#define _GNU_SOURCE /* close_range, prctl */
#include "net/simgrid/sg_supervise.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "net/simgrid/sg_options.h"

/* The watchdog on the socket itself: a send or recv that moves no byte for watchdog_ms fails with
   EAGAIN (no poll per message). */
static int set_watchdog(sg_net *net)
{
    struct timeval tv = {.tv_sec = net->watchdog_ms / 1000, .tv_usec = (net->watchdog_ms % 1000) * 1000};
    if (setsockopt(net->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(net->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        return -1;
    return 0;
}

/* watch_cpu: whether the child used CPU since the last check (a stopped or sleeping child does not). */
static int child_cpu_moved(sg_net *net)
{
    clockid_t clock;
    struct timespec ts;
    if (net->pid <= 0 || clock_getcpuclockid(net->pid, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return 0;
    double cpu = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    int moved = cpu != net->cpu_seen_s;
    net->cpu_seen_s = cpu;
    return moved;
}

int kv_sg_write_full(sg_net *net, const void *buf, size_t n)
{
    if (net->local) {
        kv_sg_local_send(net->local, buf, n / sizeof(kv_sg_request)); /* sg_net.c writes whole requests */
        return 0;
    }
    const char *p = buf;
    while (n > 0) {
        ssize_t r = send(net->fd, p, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            net->timed_out = 1;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int kv_sg_read_full(sg_net *net, void *buf, size_t n)
{
    if (net->local)
        return kv_sg_local_read(net->local, buf, n);
    char *p = buf;
    while (n > 0) {
        if (net->in_pos == net->in_len) {
            ssize_t r = recv(net->fd, net->in, KV_SG_IN_BYTES, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && net->watch_cpu && child_cpu_moved(net))
                continue; /* a long run, still computing */
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                net->timed_out = 1;
            if (r <= 0)
                return -1;
            net->in_pos = 0;
            net->in_len = (size_t)r;
        }
        size_t k = net->in_len - net->in_pos < n ? net->in_len - net->in_pos : n;
        memcpy(p, net->in + net->in_pos, k);
        net->in_pos += k;
        p += k;
        n -= k;
    }
    return 0;
}

/* The last non-empty line SimGrid wrote, without its "[time] file:line: [category]" prefix. */
static void last_words(FILE *log, char *out, size_t cap)
{
    out[0] = 0;
    if (!log || fflush(log) != 0)
        return;
    char buf[2048];
    long size = (fseek(log, 0, SEEK_END) == 0) ? ftell(log) : -1;
    if (size <= 0)
        return;
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    if (fseek(log, from, SEEK_SET) != 0)
        return;
    size_t n = fread(buf, 1, sizeof buf - 1, log);
    buf[n] = 0;
    /* Prefer the last CRITICAL line (xbt_die's message), else the last line. */
    char *pick = NULL, *line = buf;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (*line && (!pick || strstr(line, "CRITICAL") || !strstr(pick, "CRITICAL")))
            pick = line;
        line = nl ? nl + 1 : NULL;
    }
    if (!pick)
        return;
    /* "[0.000000] ./src/file.cpp:179: [root/CRITICAL] Model 'FOO' is invalid!" -> the message. */
    const char *msg = pick, *cat = strstr(pick, "/CRITICAL] ");
    if (cat)
        msg = cat + strlen("/CRITICAL] ");
    snprintf(out, cap, "%s", msg);
}

/* Kills and reaps the child; *status gets its wait status (0 if none). */
static void reap(sg_net *net, int *status)
{
    *status = 0;
    if (net->pid <= 0)
        return;
    kill(net->pid, SIGKILL);
    while (waitpid(net->pid, status, 0) < 0 && errno == EINTR)
        continue;
    net->pid = 0;
}

/* Records that SimGrid stopped making progress (the parent's timeout, or the child's
   own step cap, `detail`). With SimGrid options in the scenario they are the likely
   cause: bad input (KV_EINPUT) naming them; without, the run failed (KV_EFAIL). */
static int stuck(sg_net *net, const char *when, const char *detail, kv_error *err)
{
    int status;
    reap(net, &status);
    char what[400];
    snprintf(what, sizeof what, "SimGrid made no progress %s (%s)", when, detail);
    if (net->n_suspects == 1)
        kv_error_set(&net->failure, KV_EINPUT, "%s: %s; this SimGrid option is the likely cause", net->suspects,
                     what);
    else if (net->n_suspects > 1)
        kv_error_set_key(&net->failure, KV_EINPUT, "network.simgrid",
                         "%s: network.simgrid: %s; the likely cause is one of the scenario's SimGrid options: %s",
                         net->source, what, net->suspects);
    else
        kv_error_set(&net->failure, KV_EFAIL, "net simgrid: %s; a SimGrid bug or an overloaded machine (raise "
                     "network.watchdog_s if the machine is just slow)", what);
    net->broken = 1;
    if (err)
        *err = net->failure;
    return net->failure.code;
}

/* After the socket failed: a stuck reply the child sent before it exited, if any. */
static int stuck_reply(sg_net *net, char *msg, size_t cap)
{
    kv_sg_reply head;
    net->watchdog_ms = 200; /* the child has written and exited, or will never write */
    if (set_watchdog(net) != 0)
        return 0;
    if (kv_sg_read_full(net, &head, sizeof head) != 0 || !(head.flags & KV_SG_STUCK) || head.count != 0)
        return 0;
    size_t keep = head.msg_len < cap - 1 ? head.msg_len : cap - 1;
    if (kv_sg_read_full(net, msg, keep) != 0)
        keep = 0;
    msg[keep] = 0;
    return 1;
}

int kv_sg_child_failed(sg_net *net, int code, const char *when, kv_error *err)
{
    char watch[160];
    if (net->timed_out) {
        snprintf(watch, sizeof watch, "no answer for %g s, network.watchdog_s", net->watchdog_ms / 1e3);
        return stuck(net, when, watch, err);
    }
    char stuck_msg[300];
    if (net->fd >= 0 && stuck_reply(net, stuck_msg, sizeof stuck_msg))
        return stuck(net, when, stuck_msg, err);
    char words[700];
    last_words(net->errlog, words, sizeof words);
    char how[64] = "closed its connection";
    int status;
    int had_child = net->pid > 0;
    reap(net, &status);
    if (had_child && WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)
        snprintf(how, sizeof how, "died of signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGABRT ? " (abort)" : "");
    kv_error_set(&net->failure, code, "net simgrid: SimGrid %s %s%s%s", how, when, words[0] ? ": " : "", words);
    net->broken = 1;
    if (err)
        *err = net->failure;
    return code;
}

int kv_sg_finish_reply(sg_net *net, const kv_sg_reply *head, kv_error *err)
{
    if (head->msg_len == 0 && head->code == KV_OK)
        return KV_OK;
    char msg[1000];
    size_t keep = head->msg_len < sizeof msg - 1 ? head->msg_len : sizeof msg - 1;
    if (kv_sg_read_full(net, msg, keep) != 0)
        return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
    msg[keep] = 0;
    for (size_t left = head->msg_len - keep; left > 0;) {
        char skip[256];
        size_t n = left < sizeof skip ? left : sizeof skip;
        if (kv_sg_read_full(net, skip, n) != 0)
            return kv_sg_child_failed(net, KV_EFAIL, "during the run", err);
        left -= n;
    }
    if (head->code == KV_OK)
        return KV_OK;
    if (head->flags & KV_SG_STUCK)
        return stuck(net, "during the run", msg, err);
    kv_error_set(&net->failure, head->code, "%s", msg);
    net->broken = 1;
    *err = net->failure;
    return head->code;
}

/* In the child: closes every descriptor it inherited except 0-2 and keep[0..n). */
static void close_inherited(const int *keep, int n)
{
    DIR *d = opendir("/proc/self/fd");
    int self = d ? dirfd(d) : -1;
    struct dirent *e = NULL;
    for (int fd = 3; d ? (e = readdir(d)) != NULL : fd < 1024; fd++) {
        int f = d ? atoi(e->d_name) : fd;
        int kept = f <= 2 || f == self;
        for (int i = 0; i < n; i++)
            kept = kept || f == keep[i];
        if (!kept)
            close(f);
    }
    if (d)
        closedir(d);
}

int kv_sg_ready_error(kv_error *err, int code, const char *src, const char *key, const char *msg)
{
    return kv_error_set_key(err, code, key, "%s: %s: %s", src, key[0] ? key : "network", msg);
}

/* kv_sg_spawn and kv_sg_spawn_run (body NULL: serve requests). */
static int spawn(sg_net *net, const kv_net_config *cfg, kv_sg_body_fn body, void *arg, kv_sg_child_fds *fds,
                 uint32_t *links, kv_error *err)
{
    const char *src = cfg->source ? cfg->source : "network";
    int rc;
    /* SimGrid's own messages go to a temporary file, read back when it fails;
       a scenario that sets the `log` option sees them on stderr instead. */
    if (!kv_sg_option_value(cfg, "log"))
        net->errlog = tmpfile();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: socketpair: %s", strerror(errno));
        return rc;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return rc;
    }
    if (pid == 0) {
        /* The child: dies with kvsim, talks only on sv[1], writes only to the log. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct rlimit no_core = {0, 0}; /* a SimGrid abort must not leave core files behind */
        setrlimit(RLIMIT_CORE, &no_core);
        int keep[3] = {sv[1], -1, -1};
        if (body) { /* the run prints where kvsim does (its progress line, policies' print) */
            fds->out = keep[1] = dup(STDOUT_FILENO);
            fds->err = keep[2] = dup(STDERR_FILENO);
            fds->sock = sv[1];
        }
        if (net->errlog)
            dup2(fileno(net->errlog), STDERR_FILENO);
        dup2(STDERR_FILENO, STDOUT_FILENO);
        close_inherited(keep, 3);
        if (body)
            kv_sg_child_run(cfg, sv[1], net->errlog ? STDERR_FILENO : -1, body, arg);
        else
            kv_sg_child_main(cfg, sv[1]);
        _exit(0);
    }
    close(sv[1]);
    net->pid = pid;
    net->fd = sv[0];
    if (set_watchdog(net) != 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: setsockopt: %s", strerror(errno));
        return rc;
    }
    kv_sg_reply ready;
    if (kv_sg_read_full(net, &ready, sizeof ready) != 0) {
        char when[600];
        if (cfg->topology == KV_TOPO_PLATFORM)
            snprintf(when, sizeof when, "while loading %s for %s", cfg->platform_file, src);
        else
            snprintf(when, sizeof when, "while building the %s network of %s", kv_net_topology_name(cfg->topology),
                     src);
        rc = kv_sg_child_failed(net, KV_EINPUT, when, err);
        return rc;
    }
    if (ready.code != KV_OK) {
        char msg[900];
        size_t keep = ready.msg_len < sizeof msg - 1 ? ready.msg_len : sizeof msg - 1;
        if (kv_sg_read_full(net, msg, keep) != 0)
            keep = 0;
        msg[keep] = 0;
        /* The child names the key its message concerns in the reply (sg_proto.h); without one the
           message is about the network as a whole. */
        ready.key[sizeof ready.key - 1] = 0;
        return kv_sg_ready_error(err, ready.code, src, ready.key, msg);
    }
    *links = ready.count;
    return KV_OK;
}

int kv_sg_spawn(sg_net *net, const kv_net_config *cfg, uint32_t *links, kv_error *err)
{
    return spawn(net, cfg, NULL, NULL, NULL, links, err);
}

int kv_sg_spawn_run(sg_net *net, const kv_net_config *cfg, kv_sg_body_fn body, void *arg, kv_sg_child_fds *fds,
                    uint32_t *links, kv_error *err)
{
    return spawn(net, cfg, body, arg, fds, links, err);
}

void kv_sg_stop(sg_net *net)
{
    if (net->fd >= 0)
        close(net->fd);
    if (net->pid > 0) {
        /* The child keeps nothing worth flushing: stop it now rather than let it
           simulate the flows still in flight. */
        kill(net->pid, SIGKILL);
        while (waitpid(net->pid, NULL, 0) < 0 && errno == EINTR)
            continue;
    }
    if (net->errlog)
        fclose(net->errlog);
}
