/* sg_proto.h — the messages between kvsim and its SimGrid child process (net/simgrid/).
 *
 * kvsim runs SimGrid in a forked child, one per network (docs/network.md says
 * why). The parent (sg_net.c) writes fixed-size requests on a stream socket;
 * START and SYNC are not answered (their errors come back with the next answer), every
 * other request is answered by one kv_sg_reply followed by `count` items and
 * `msg_len` bytes of error message (the key it concerns travels in the reply's
 * `key`). Both ends are the same program image, so
 * structs travel in native layout.
 *
 * Few round trips (each costs two process switches and most of a run's system time):
 * - the parent buffers unanswered requests and sends them with the next answered one in one
 *   write; the child reads requests in blocks and writes each answer (head, items, message) in
 *   one write; the parent reads answers in blocks, and waits on the socket's own timeouts
 *   (SO_RCVTIMEO / SO_SNDTIMEO = the watchdog), no poll per message;
 * - an ADVANCE that ends on its timeout (no completion) carries t_next_s, the horizon: while no
 *   flow starts or is cancelled, an ADVANCE to any t < t_next_s ends on its timeout too and
 *   changes nothing in SimGrid but its clock (a lazy LMM model updates nothing at a bare timer
 *   step). The parent then answers such an ADVANCE itself and lets the child's clock lag; the
 *   next START (its t_s) or SYNC brings the child there, before anything that reads or changes
 *   its state, and fails the run if a flow completed on the way (a wrong horizon is never
 *   silent). -inf where the child cannot be sure (a latency paid at the very step that ended the
 *   wait, a penalty still to set, a held flow, full-update models, unknown precision/timing); a flow
 *   still paying its latency is no obstacle (its date is in SimGrid's heap);
 * - the parent also answers, with no round trip, an ADVANCE to its own time (the child has reported
 *   every completion there) and one with no flow in the child; a completion dated before the time
 *   the parent had reached fails the run (a wrong horizon, never silent).
 */
#ifndef KV_SG_PROTO_H
#define KV_SG_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

enum kv_sg_op {
    KV_SG_START = 1,   /* start flow `id` at t_s (or at the child's time if later) */
    KV_SG_CANCEL = 2,  /* cancel flow `id`; answered */
    KV_SG_ADVANCE = 3, /* advance to t_s or the first completions; answered with kv_sg_done items */
    KV_SG_STATS = 4,   /* answered with kv_link_stats items, one per link */
    KV_SG_ROUTE = 5,   /* the links of src -> dst: answered with uint32_t link indices, in path order */
    KV_SG_LINKSTATE = 6, /* answered with kv_link_state items, one per link (bytes_queued left 0: the
                            parent holds the flows that start later) */
    KV_SG_SYNC = 7,    /* move to t_s with no completion on the way (a START's catch-up without a flow);
                          not answered */
};

/* kv_sg_reply.flags */
#define KV_SG_STUCK 1u
#define KV_SG_RESULT 2u /* in-child mode: the run's end; a kv_error follows, then (code KV_OK) the results */

/* The child gives up when SimGrid takes this many solver steps, plus this many per
   flow in flight, without waking the driver (no event it waits for ever comes). */
#define KV_SG_STEP_CAP 1000000
#define KV_SG_STEP_CAP_PER_FLOW 64

typedef struct kv_sg_request {
    int32_t op;               /* enum kv_sg_op */
    int32_t src, dst;         /* START: host indices */
    int32_t priority;         /* START: class */
    int32_t has_level;        /* START: 1 when level and weight are the flow's own (kv_flow_spec) */
    int32_t level;            /* START: priority level (from the class when has_level is 0) */
    double weight;            /* START: weight within the level (> 0) */
    uint64_t id;              /* START, CANCEL: flow id (assigned by the parent) */
    uint64_t bytes;           /* START: payload bytes */
    uint64_t tag;             /* START: handed back on completion */
    double t_s;               /* START: start time; ADVANCE: limit (may be +inf) */
} kv_sg_request;

typedef struct kv_sg_reply {
    int32_t code;             /* KV_OK, KV_EFAIL or KV_EINPUT */
    uint32_t count;           /* items that follow (completions, links) */
    uint32_t msg_len;         /* bytes of error message after the items */
    uint32_t flags;           /* KV_SG_STUCK: the child's watchdog stopped SimGrid (then it exits) */
    double t_now_s;           /* the network's time after the request */
    double t_next_s;          /* ADVANCE: the horizon (see above); -inf when none */
    char key[64];             /* an error's dotted scenario key ("network.priority"), "" if none; the
                                 message then does not repeat it (the parent writes "key: msg") */
} kv_sg_reply;

typedef struct kv_sg_done {
    uint64_t id, tag;         /* the completed flow */
    double t_done_s;          /* its completion time */
} kv_sg_done;

#ifdef __cplusplus
extern "C" {
#endif

/* The child's whole life: builds the platform cfg asks for, answers with a
   READY reply (code, count = links) on fd, then serves requests until the
   parent goes away. Never returns (ends with _exit). */
void kv_sg_child_main(const kv_net_config *cfg, int fd);

/* In-child mode (kv_net_run_body): the driver as the network of a run in its own process. */
typedef struct kv_sg_local kv_sg_local;
typedef void (*kv_sg_body_fn)(void *arg, kv_sg_local *local);

/* Builds the platform and answers READY as kv_sg_child_main, then runs body(arg, local) in the child's
   main line (SimGrid's maestro, the process's own stack); body ends the process (_exit) after writing its results on fd.
   log_fd >= 0: SimGrid's log goes on to that file (through a descriptor of its own: body may move
   log_fd).
   Never returns. */
void kv_sg_child_run(const kv_net_config *cfg, int fd, int log_fd, kv_sg_body_fn body, void *arg);

/* Gives the driver the run's network config (its priority mode and class weights; the rest as the
   platform was built): KV_OK, or the READY answer's code with key and msg set; *links: the platform's
   link count. */
int kv_sg_local_configure(kv_sg_local *l, const kv_net_config *cfg, uint32_t *links, char *key,
                          size_t key_size, char *msg, size_t msg_size);
/* Serves n requests, as the socket loop would; their answers wait for kv_sg_local_read. */
void kv_sg_local_send(kv_sg_local *l, const kv_sg_request *rq, size_t n);
/* Takes the next n bytes of answers: 0, or -1 when fewer are there (a protocol bug). */
int kv_sg_local_read(kv_sg_local *l, void *buf, size_t n);

/* The line of link `link` in the platform file at path: its <link id=...>, or the element
   (a <cluster>...) whose id starts its name; 0 when not found (sg_net.c). */
int kv_sg_platform_line(const char *path, const char *link);

#ifdef __cplusplus
}
#endif

#endif
