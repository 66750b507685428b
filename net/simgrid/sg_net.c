/* sg_net.c — the simgrid network model, kvsim side: forks the SimGrid child, talks to it (the config
 * is checked first by sg_options.c).
 *
 * Design notes (docs/network.md has the user's view).
 * - SimGrid 3.32 cannot give a second, fresh engine in one process, and it aborts
 *   on some bad input. Each network therefore runs SimGrid in its own forked child
 *   (sg_child.cpp): creating a network forks, destroying it kills the child. A
 *   crash or abort in SimGrid ends the child, never kvsim; the parent reports it
 *   with SimGrid's last words, which the child writes to a temporary file.
 * - Requests go over a socket (sg_proto.h). Flow ids are assigned here, so a START
 *   needs no answer and is buffered until the next request that needs one; a
 *   run costs about one round trip per ADVANCE.
 * - Completions come back in batches (all flows completing at one date, in start
 *   order) and are handed to the callback one by one. The callback may start
 *   flows (they start at that date: the child has not moved) or cancel flows,
 *   including ones of the same batch not yet handed over (they are then dropped
 *   here, never reported: net.h invariant 3).
 * - A flow started later than the network's time waits in a heap here; advance
 *   stops the child at its start time, starts it there, and goes on.
 * - After any failure of the child the network is broken: every later call
 *   returns the same error.
 */
#define _GNU_SOURCE /* close_range, prctl */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "net/net.h"
#include "net/simgrid/sg_options.h"
#include "net/simgrid/sg_proto.h"

/* Topology sizes SimGrid builds in a few seconds and bounded memory (measured, docs/network.md):
   its torus and dragonfly zones cost about quadratic time / ~100 KB per position. */

typedef struct sg_net {
    kv_net_done_fn done;
    void *user;
    int hosts;
    pid_t pid;             /* the child, 0 once reaped */
    int fd;                /* socket to the child */
    FILE *errlog;          /* the child's stderr (NULL when the scenario asked for SimGrid logs) */
    double now_s;          /* network time, as the child last reported it */
    uint64_t next_id;
    size_t active;         /* started, not yet reported or cancelled */
    kv_sg_request *out;    /* buffered START requests */
    size_t n_out, cap_out;
    kv_sg_request *later;  /* min-heap on (t_s, id): flows that start after now_s */
    size_t n_later, cap_later;
    kv_sg_done *batch;     /* completions being handed over */
    size_t n_batch, cap_batch, i_batch;
    int delivering;        /* inside the completion callbacks */
    kv_link_stats *links;  /* cached answer of STATS */
    size_t n_links;
    int links_fresh;
    int broken;            /* the child failed; `failure` says why */
    kv_error failure;
    int watchdog_ms;       /* longest wait for the child to move one byte (ms) */
    int timed_out;         /* the last socket wait ran past watchdog_ms */
    char *suspects;        /* the scenario's SimGrid options with where they are written (NULL: none) */
    int n_suspects;
    char *source;          /* the scenario file, for messages */
} sg_net;

/* ---- talking to the child ---- */

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Waits until fd is ready for `events`, at most watchdog_ms since `since` (the last
   byte moved); 0 when ready, -1 on a timeout (net->timed_out set). */
static int wait_ready(sg_net *net, short events, double since)
{
    for (;;) {
        double left = net->watchdog_ms - (mono_ms() - since);
        if (left <= 0) {
            net->timed_out = 1;
            return -1;
        }
        struct pollfd p = {.fd = net->fd, .events = events};
        int r = poll(&p, 1, (int)ceil(left));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Full writes and reads on the child's socket; -1 when the child closed it, failed, or
   moved no byte for watchdog_ms (the watchdog: SimGrid stuck, or the child stopped). */
static int write_full(sg_net *net, const void *buf, size_t n)
{
    const char *p = buf;
    double since = mono_ms();
    while (n > 0) {
        if (wait_ready(net, POLLOUT, since) != 0)
            return -1;
        ssize_t r = send(net->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        since = mono_ms();
    }
    return 0;
}

static int read_full(sg_net *net, void *buf, size_t n)
{
    char *p = buf;
    double since = mono_ms();
    while (n > 0) {
        if (wait_ready(net, POLLIN, since) != 0)
            return -1;
        ssize_t r = recv(net->fd, p, n, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        since = mono_ms();
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
    if (read_full(net, &head, sizeof head) != 0 || !(head.flags & KV_SG_STUCK) || head.count != 0)
        return 0;
    size_t keep = head.msg_len < cap - 1 ? head.msg_len : cap - 1;
    if (read_full(net, msg, keep) != 0)
        keep = 0;
    msg[keep] = 0;
    return 1;
}

/* Reaps the child after it failed and records why; returns the error code. */
static int child_failed(sg_net *net, int code, const char *when, kv_error *err)
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

static int flush_out(sg_net *net, kv_error *err)
{
    if (net->n_out == 0)
        return KV_OK;
    size_t n = net->n_out;
    net->n_out = 0;
    if (write_full(net, net->out, n * sizeof *net->out) != 0)
        return child_failed(net, KV_EFAIL, "while starting flows", err);
    return KV_OK;
}

/* Sends rq (after the buffered STARTs) and reads the answer's head; items and
   message stay to be read by the caller. */
static int request(sg_net *net, const kv_sg_request *rq, kv_sg_reply *head, kv_error *err)
{
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    int rc = flush_out(net, err);
    if (rc != KV_OK)
        return rc;
    if (write_full(net, rq, sizeof *rq) != 0 || read_full(net, head, sizeof *head) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    return KV_OK;
}

/* Reads the message of an answer; a failed answer breaks the network. */
static int finish_reply(sg_net *net, const kv_sg_reply *head, kv_error *err)
{
    if (head->msg_len == 0 && head->code == KV_OK)
        return KV_OK;
    char msg[1000];
    size_t keep = head->msg_len < sizeof msg - 1 ? head->msg_len : sizeof msg - 1;
    if (read_full(net, msg, keep) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    msg[keep] = 0;
    for (size_t left = head->msg_len - keep; left > 0;) {
        char skip[256];
        size_t n = left < sizeof skip ? left : sizeof skip;
        if (read_full(net, skip, n) != 0)
            return child_failed(net, KV_EFAIL, "during the run", err);
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

/* ---- flows that start in the future ---- */

static int later_before(const kv_sg_request *a, const kv_sg_request *b)
{
    return a->t_s != b->t_s ? a->t_s < b->t_s : a->id < b->id;
}

static void later_push(sg_net *net, kv_sg_request rq)
{
    kv_grow((void **)&net->later, sizeof *net->later, &net->cap_later, net->n_later + 1);
    size_t i = net->n_later++;
    while (i > 0 && later_before(&rq, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    net->later[i] = rq;
}

static void later_remove(sg_net *net, size_t i)
{
    kv_sg_request last = net->later[--net->n_later];
    if (i == net->n_later)
        return;
    while (i > 0 && later_before(&last, &net->later[(i - 1) / 2])) {
        net->later[i] = net->later[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const kv_sg_request *best = &last;
        if (l < net->n_later && later_before(&net->later[l], best))
            best = &net->later[m = l];
        if (r < net->n_later && later_before(&net->later[r], best))
            m = r;
        if (m == i)
            break;
        net->later[i] = net->later[m];
        i = m;
    }
    net->later[i] = last;
}

/* ---- the interface ---- */

static int sg_flow_start(void *ctx, const kv_flow_spec *flow, double now_s, kv_flow_id *out, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (flow->src < 0 || flow->src >= net->hosts || flow->dst < 0 || flow->dst >= net->hosts)
        return kv_error_set(err, KV_EFAIL, "net simgrid: host out of range (%d -> %d, %d hosts)", flow->src,
                            flow->dst, net->hosts);
    if (!isfinite(now_s))
        return kv_error_set(err, KV_EFAIL, "net simgrid: flow start time %g", now_s);
    kv_sg_request rq = {.op = KV_SG_START, .src = flow->src, .dst = flow->dst, .priority = flow->priority,
                        .id = net->next_id, .bytes = flow->bytes, .tag = flow->tag,
                        .t_s = now_s > net->now_s ? now_s : net->now_s};
    if (rq.t_s > net->now_s) {
        later_push(net, rq); /* started by sg_advance when the network gets there */
    } else {
        kv_grow((void **)&net->out, sizeof *net->out, &net->cap_out, net->n_out + 1);
        net->out[net->n_out++] = rq;
        if (net->n_out >= 256) {
            int rc = flush_out(net, err);
            if (rc != KV_OK)
                return rc;
        }
    }
    net->links_fresh = 0;
    net->active++;
    *out = net->next_id++;
    return KV_OK;
}

static int sg_flow_cancel(void *ctx, kv_flow_id id, kv_error *err)
{
    sg_net *net = ctx;
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    /* A flow of the batch being handed over is done in the child: drop it here. */
    for (size_t i = net->i_batch + 1; net->delivering && i < net->n_batch; i++) {
        if (net->batch[i].id == id) {
            net->batch[i].id = 0;
            net->active--;
            return KV_OK;
        }
    }
    if (id == 0 || id >= net->next_id)
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    for (size_t i = 0; i < net->n_later; i++) {
        if (net->later[i].id == id) {
            later_remove(net, i);
            net->active--;
            return KV_OK;
        }
    }
    kv_sg_request rq = {.op = KV_SG_CANCEL, .id = id};
    kv_sg_reply head;
    int rc = request(net, &rq, &head, err);
    if (rc != KV_OK)
        return rc;
    rc = finish_reply(net, &head, err);
    if (rc != KV_OK)
        return rc;
    if (head.count == 1) /* not active: already reported or cancelled, the caller's error */
        return kv_error_set(err, KV_EFAIL, "net simgrid: no active flow %llu", (unsigned long long)id);
    net->links_fresh = 0;
    net->active--;
    return KV_OK;
}

/* One ADVANCE round trip to t_s; the completions it finds are left in net->batch. */
static int advance_once(sg_net *net, double t_s, kv_sg_reply *head, kv_error *err)
{
    kv_sg_request rq = {.op = KV_SG_ADVANCE, .t_s = t_s};
    int rc = request(net, &rq, head, err);
    if (rc != KV_OK)
        return rc;
    kv_grow((void **)&net->batch, sizeof *net->batch, &net->cap_batch, head->count + 1);
    if (head->count && read_full(net, net->batch, head->count * sizeof *net->batch) != 0)
        return child_failed(net, KV_EFAIL, "during the run", err);
    rc = finish_reply(net, head, err);
    if (rc != KV_OK)
        return rc;
    net->links_fresh = 0;
    net->now_s = head->t_now_s;
    net->n_batch = head->count;
    return KV_OK;
}

static int sg_advance(void *ctx, double t_limit_s, double *t_now_s, kv_error *err)
{
    sg_net *net = ctx;
    if (net->delivering)
        return kv_error_set(err, KV_EFAIL, "net simgrid: kv_net_advance called from a completion callback");
    if (t_limit_s != t_limit_s)
        return kv_error_set(err, KV_EFAIL, "net simgrid: advance to NaN");
    if (net->broken) {
        *err = net->failure;
        return net->failure.code;
    }
    if (net->active == 0) {
        /* Nothing in flight or scheduled: no need to ask. The child catches up with
           the next START, which carries this time. */
        if (t_limit_s > net->now_s && isfinite(t_limit_s))
            net->now_s = t_limit_s;
        *t_now_s = net->now_s;
        return KV_OK;
    }
    kv_sg_reply head;
    for (;;) {
        /* Stop first where scheduled flows start, and start them there. */
        int start_due = net->n_later > 0 && net->later[0].t_s <= t_limit_s;
        int rc = advance_once(net, start_due ? net->later[0].t_s : t_limit_s, &head, err);
        if (rc != KV_OK)
            return rc;
        if (head.count > 0 || !start_due)
            break;
        while (net->n_later > 0 && net->later[0].t_s <= net->now_s) {
            kv_grow((void **)&net->out, sizeof *net->out, &net->cap_out, net->n_out + 1);
            net->out[net->n_out] = net->later[0];
            net->out[net->n_out++].t_s = net->now_s;
            later_remove(net, 0);
        }
    }
    net->delivering = 1;
    for (net->i_batch = 0; net->i_batch < net->n_batch; net->i_batch++) {
        kv_sg_done d = net->batch[net->i_batch];
        if (d.id == 0)
            continue; /* cancelled by an earlier callback of this batch */
        net->active--;
        net->done(net->user, d.id, d.tag, d.t_done_s);
    }
    net->delivering = 0;
    net->n_batch = 0;
    *t_now_s = net->now_s;
    return KV_OK;
}

static size_t sg_active_flows(void *ctx)
{
    return ((sg_net *)ctx)->active;
}

static size_t sg_link_count(void *ctx)
{
    return ((sg_net *)ctx)->n_links;
}

static int sg_link_stats(void *ctx, size_t link, kv_link_stats *out)
{
    sg_net *net = ctx;
    if (link >= net->n_links)
        return KV_EFAIL;
    if (!net->links_fresh) {
        kv_error err;
        kv_sg_request rq = {.op = KV_SG_STATS};
        kv_sg_reply head;
        if (request(net, &rq, &head, &err) != KV_OK)
            return KV_EFAIL;
        if (head.code != KV_OK) {
            finish_reply(net, &head, &err);
            return KV_EFAIL;
        }
        if (head.count != net->n_links ||
            read_full(net, net->links, net->n_links * sizeof *net->links) != 0) {
            child_failed(net, KV_EFAIL, "during the run", &err);
            return KV_EFAIL;
        }
        if (finish_reply(net, &head, &err) != KV_OK)
            return KV_EFAIL;
        net->links_fresh = 1;
    }
    *out = net->links[link];
    return KV_OK;
}

static void sg_destroy(void *ctx)
{
    sg_net *net = ctx;
    if (!net)
        return;
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
    kv_free(net->out);
    kv_free(net->later);
    kv_free(net->batch);
    kv_free(net->links);
    kv_free(net->suspects);
    kv_free(net->source);
    kv_free(net);
}

static const kv_net_i sg_iface = {
    .api_version = KV_NET_API_VERSION,
    .name = "simgrid",
    .destroy = sg_destroy,
    .flow_start = sg_flow_start,
    .flow_cancel = sg_flow_cancel,
    .advance = sg_advance,
    .active_flows = sg_active_flows,
    .link_count = sg_link_count,
    .link_stats = sg_link_stats,
};

/* In the child: closes every descriptor it inherited except 0-2 and `keep`. */
static void close_inherited(int keep)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        for (int fd = 3; fd < 1024; fd++)
            if (fd != keep)
                close(fd);
        return;
    }
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (fd > 2 && fd != keep && fd != self)
            close(fd);
    }
    closedir(d);
}

int kv_net_simgrid_create(const kv_net_config *cfg, kv_net_done_fn done, void *user,
                          const kv_net_i **iface, void **ctx, kv_error *err)
{
    int rc = kv_sg_check_config(cfg, err);
    if (rc != KV_OK)
        return rc;
    const char *src = cfg->source ? cfg->source : "network";
    sg_net *net = kv_calloc(1, sizeof *net);
    net->done = done;
    net->user = user;
    net->hosts = cfg->hosts;
    net->next_id = 1;
    net->fd = -1;
    net->watchdog_ms = (int)ceil(1e3 * (cfg->watchdog_s > 0 ? cfg->watchdog_s : KV_NET_WATCHDOG_DEFAULT_S));
    char suspects[2048] = "";
    for (int i = 0; i < cfg->n_options; i++) {
        if (strcmp(cfg->option_key[i], "log") == 0)
            continue;
        char w[700];
        size_t used = strlen(suspects);
        snprintf(suspects + used, sizeof suspects - used, "%s%s", net->n_suspects ? ", " : "",
                 kv_sg_option_where(cfg, i, w, sizeof w));
        net->n_suspects++;
    }
    if (net->n_suspects)
        net->suspects = kv_strdup(suspects);
    net->source = kv_strdup(cfg->source ? cfg->source : "network");
    /* SimGrid's own messages go to a temporary file, read back when it fails;
       a scenario that sets the `log` option sees them on stderr instead. */
    if (!kv_sg_option_value(cfg, "log"))
        net->errlog = tmpfile();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: socketpair: %s", strerror(errno));
        sg_destroy(net);
        return rc;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        rc = kv_error_set(err, KV_EFAIL, "net simgrid: fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        sg_destroy(net);
        return rc;
    }
    if (pid == 0) {
        /* The child: dies with kvsim, talks only on sv[1], writes only to the log. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct rlimit no_core = {0, 0}; /* a SimGrid abort must not leave core files behind */
        setrlimit(RLIMIT_CORE, &no_core);
        if (net->errlog)
            dup2(fileno(net->errlog), STDERR_FILENO);
        dup2(STDERR_FILENO, STDOUT_FILENO);
        close_inherited(sv[1]);
        kv_sg_child_main(cfg, sv[1]);
        _exit(0);
    }
    close(sv[1]);
    net->pid = pid;
    net->fd = sv[0];
    kv_sg_reply ready;
    if (read_full(net, &ready, sizeof ready) != 0) {
        char when[600];
        if (cfg->topology == KV_TOPO_PLATFORM)
            snprintf(when, sizeof when, "while loading %s for %s", cfg->platform_file, src);
        else
            snprintf(when, sizeof when, "while building the %s network of %s", kv_net_topology_name(cfg->topology),
                     src);
        rc = child_failed(net, KV_EINPUT, when, err);
        sg_destroy(net);
        return rc;
    }
    if (ready.code != KV_OK) {
        char msg[900];
        size_t keep = ready.msg_len < sizeof msg - 1 ? ready.msg_len : sizeof msg - 1;
        if (read_full(net, msg, keep) != 0)
            keep = 0;
        msg[keep] = 0;
        /* The child names the key its message concerns first ("network.priority: ..."): the message
           is the child's protocol, so the key is taken from it here, once, inside the network layer. */
        int keyed = strncmp(msg, "network.", 8) == 0;
        char key[96] = "";
        size_t k = keyed ? strcspn(msg, ":[ ") : 0;
        if (k < sizeof key) {
            memcpy(key, msg, k);
            key[k] = 0;
        }
        rc = kv_error_set_key(err, ready.code, key, "%s: %s%s", src, keyed ? "" : "network: ", msg);
        sg_destroy(net);
        return rc;
    }
    net->n_links = ready.count;
    net->links = kv_calloc(net->n_links + 1, sizeof *net->links);
    *iface = &sg_iface;
    *ctx = net;
    return KV_OK;
}
