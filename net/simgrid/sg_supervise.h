/* sg_supervise.h — the SimGrid child's supervision (sg_supervise.c): starting it, talking to it under
 * the watchdog, reading its replies and reaping it; and the state of one simgrid network, which
 * sg_net.c (the flows) and sg_supervise.c (the child) share. sg_net.c calls sg_supervise.c, never
 * the reverse. */
#ifndef KV_SG_SUPERVISE_H
#define KV_SG_SUPERVISE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "core/base/error.h"
#include "net/net.h"
#include "net/simgrid/sg_proto.h"

/* One simgrid network; owned by sg_net.c (kv_net_simgrid_create, sg_destroy). */
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
    kv_sg_request *out;    /* buffered unanswered requests (START, SYNC), sent with the next answered one */
    size_t n_out, cap_out;
    size_t round_trips;    /* answered requests sent (each waits for the child) */
    int ask_always;        /* kv_net_config.ask_always: no advance answered here while flows are in flight */
    char *in;              /* bytes read from the child, not yet consumed: [in_pos, in_len) */
    size_t in_pos, in_len;
    double horizon_s;      /* the last ADVANCE's t_next_s while no flow started or was cancelled since;
                              -inf otherwise (sg_proto.h) */
    double sync_s;         /* the child's clock lags behind this time (ADVANCEs answered here); -inf: none */
    kv_sg_request *later;  /* min-heap on (t_s, id): flows that start after now_s */
    size_t n_later, cap_later;
    kv_sg_done *batch;     /* completions being handed over */
    size_t n_batch, cap_batch, i_batch;
    int delivering;        /* inside the completion callbacks */
    kv_link_stats *links;  /* cached answer of STATS */
    size_t n_links;
    int links_fresh;
    kv_link_state *states; /* cached answer of LINKSTATE (bytes_queued added here) */
    int states_fresh;
    int32_t *route_n;      /* [hosts * hosts] links of the route src -> dst, -1 until asked */
    uint32_t **route;      /* [hosts * hosts] those links (NULL until asked) */
    int broken;            /* the child failed; `failure` says why */
    kv_error failure;
    int watchdog_ms;       /* longest wait for the child to move one byte (ms) */
    int timed_out;         /* the last socket wait ran past watchdog_ms */
    char *suspects;        /* the scenario's SimGrid options with where they are written (NULL: none) */
    int n_suspects;
    char *source;          /* the scenario file, for messages */
    kv_sg_local *local;    /* in-child mode: the driver in this process (no socket, no child); NULL: socket */
    int watch_cpu;         /* in-child mode, the caller: a wait past watchdog_ms fails only if the child
                              used no CPU since the last one (a whole run is one wait) */
    double cpu_seen_s;     /* the child's CPU time at the last such check (-1: none yet) */
} sg_net;

/* Starts the SimGrid child for cfg (SimGrid's messages go to a temporary file unless cfg sets the
   `log` option) and reads its READY reply: KV_OK with net->pid, net->fd and net->errlog set and *links
   the platform's link count; otherwise err is set (KV_EINPUT for bad input, with its key when the
   child names one) and the caller destroys net, which stops the child (kv_sg_stop). */
int kv_sg_spawn(sg_net *net, const kv_net_config *cfg, uint32_t *links, kv_error *err);

/* In-child mode: kvsim's stdout and stderr as the child keeps them, and its end of the socket
   (kv_sg_spawn_run sets them in the child). */
typedef struct kv_sg_child_fds {
    int out, err, sock;
} kv_sg_child_fds;

/* kv_sg_spawn for in-child mode: the child runs body(arg, ...) after READY (kv_sg_child_run), with
   *fds (in the child's copy of it) naming kvsim's stdout and stderr, which it may use again. */
int kv_sg_spawn_run(sg_net *net, const kv_net_config *cfg, kv_sg_body_fn body, void *arg, kv_sg_child_fds *fds,
                    uint32_t *links, kv_error *err);

/* The message of a failed READY answer, or of the run's network config refused in the child (key "":
   about the network as a whole). */
int kv_sg_ready_error(kv_error *err, int code, const char *src, const char *key, const char *msg);

/* Full writes and reads on the child's socket (reads through net->in, refilled a block at a time);
   -1 when the child closed it, failed, or moved no byte for watchdog_ms (the watchdog: SimGrid
   stuck, or the child stopped; with watch_cpu, and no CPU used by the child either). In-child mode
   (net->local) they hand requests to the driver and take its answers. */
int kv_sg_write_full(sg_net *net, const void *buf, size_t n);
int kv_sg_read_full(sg_net *net, void *buf, size_t n);

/* Size of net->in (bytes). */
#define KV_SG_IN_BYTES (64 * 1024)

/* Reaps the child after it failed and records why (the network is then broken); returns the error code. */
int kv_sg_child_failed(sg_net *net, int code, const char *when, kv_error *err);

/* Reads the message of an answer whose head (and items) were read; a failed answer breaks the network. */
int kv_sg_finish_reply(sg_net *net, const kv_sg_reply *head, kv_error *err);

/* Closes the socket, kills and reaps the child if it runs, closes its log. */
void kv_sg_stop(sg_net *net);

#endif
