/* test_simgrid_inchild.c — kv_net_run_body: a whole run inside the SimGrid child computes exactly what the
 * same run computes here over the socket (completions, advance times, link states, routes, link stats),
 * with no round trip; and its failures (a child that dies or stops, a run's error, bad platform input,
 * a network the driver refuses) reach the caller with the same code and message, the child reaped. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "tests/net_support.h"
#include "tests/support.h"

#if __has_include(<xbt/asserts.h>)
#include <simgrid/engine.h>
#include <xbt/asserts.h>
#include <xbt/log.h>
XBT_LOG_NEW_DEFAULT_CATEGORY(kvsim_test, "test_simgrid_inchild: a SimGrid abort inside the run");
#define HAVE_XBT 1
#endif

/* One scripted run: what it saw goes in v (completions, advance stops, link states, routes, stats). */
typedef struct script {
    kv_net_config base;    /* what kv_net_run_body builds the platform from */
    kv_net_config run;     /* what the run asks for (the policy's priority) */
    int levels;            /* flows with their own level and weight */
    int fail;              /* 0: none; 1: raise SIGTERM mid-run; 2: return KV_EINPUT; 3: SIGSTOP mid-run;
                              4: xbt_die (SimGrid's abort, its last words in its log);
                              5: SimGrid steps on without the driver waking (its step cap) */
    double v[20000];
    size_t n;
    size_t round_trips;    /* the run's network's count (not compared) */
    int pid;               /* the process the run ran in (not compared) */
    kv_net *net;
    uint64_t rng, started;
} script;

static void put(script *s, double x)
{
    cr_assert_lt(s->n, sizeof s->v / sizeof s->v[0]);
    s->v[s->n++] = x;
}

static uint64_t rnd(script *s)
{
    s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
    return s->rng >> 33;
}

static int start(script *s, double at, kv_flow_id *id, kv_error *err)
{
    int hosts = s->run.hosts;
    kv_flow_spec f = {.src = (int)(rnd(s) % (uint64_t)(hosts / 2)),
                      .dst = hosts / 2 + (int)(rnd(s) % (uint64_t)(hosts - hosts / 2)),
                      .bytes = 200000 + rnd(s) % 30000000, .priority = (int)(rnd(s) % 2), .tag = s->started++};
    if (s->levels) {
        f.has_level = 1;
        f.level = (int)(rnd(s) % 3);
        f.weight = 1.0 + (double)(rnd(s) % 3);
    }
    int rc = kv_net_flow_start(s->net, &f, at, id, err);
    put(s, rc == KV_OK ? (double)*id : -1.0);
    return rc;
}

static void on_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    script *s = user;
    put(s, (double)id);
    put(s, (double)tag);
    put(s, t);
    if (rnd(s) % 3 == 0) { /* a start from the callback, at the completion date */
        kv_flow_id nid;
        kv_error err;
        if (s->started < 60)
            start(s, t, &nid, &err);
    }
}

/* Every link's state now, and one route. */
static int look(script *s, kv_error *err)
{
    size_t links[64], n = 0;
    int rc = kv_net_route(s->net, 0, s->run.hosts - 1, links, 64, &n, err);
    if (rc != KV_OK)
        return rc;
    put(s, (double)n);
    for (size_t i = 0; i < n; i++)
        put(s, (double)links[i]);
    for (size_t l = 0; l < kv_net_link_count(s->net); l++) {
        kv_link_state st;
        rc = kv_net_link_state(s->net, l, &st, err);
        if (rc != KV_OK)
            return rc;
        put(s, st.rate_gbps);
        put(s, st.utilisation);
        put(s, st.flows);
        put(s, (double)st.bytes_in_flight);
        put(s, (double)st.bytes_queued);
    }
    return KV_OK;
}

/* The run: flows now and later, cancels of running and scheduled flows, looks at the network, advances in
   steps until nothing is in flight, then the link statistics. */
static int script_run(void *arg, kv_net_host *host, kv_error *err)
{
    script *s = arg;
    s->pid = (int)getpid();
    int rc = kv_net_host_create(host, &s->run, on_done, s, &s->net, err);
    if (rc != KV_OK)
        return rc;
    kv_flow_id ids[16];
    for (int i = 0; rc == KV_OK && i < 16; i++)
        rc = start(s, i < 10 ? 0.0 : 0.002 * i, &ids[i], err); /* 6 scheduled for later */
    if (rc == KV_OK)
        rc = look(s, err);
    if (rc == KV_OK)
        rc = kv_net_flow_cancel(s->net, ids[3], err); /* running */
    if (rc == KV_OK)
        rc = kv_net_flow_cancel(s->net, ids[12], err); /* scheduled */
    double t = 0;
    for (int step = 0; rc == KV_OK && kv_net_active_flows(s->net) > 0; step++) {
        double now = 0;
        rc = kv_net_advance(s->net, t + 0.0007, &now, err);
        put(s, now);
        t = now;
        if (rc == KV_OK && step % 5 == 2)
            rc = look(s, err);
        if (rc == KV_OK && step == 7 && kv_net_flow_cancel(s->net, ids[14], err) != KV_OK)
            put(s, -2.0); /* already done: the caller's mistake, reported, not fatal */
        if (step == 4 && s->fail == 1)
            raise(SIGTERM);
        if (step == 4 && s->fail == 3)
            raise(SIGSTOP);
#ifdef HAVE_XBT
        if (step == 4 && s->fail == 4)
            xbt_die("the network solver gave up at step %d", step);
        for (long k = 0; step == 4 && s->fail == 5 && k < 3000000; k++)
            simgrid_run_until(simgrid_get_clock() + 1e-9); /* the run is SimGrid's maestro: SimGrid steps,
                                                                 and the driver never sees a wait end */
#endif
        if (step == 4 && s->fail == 2)
            rc = kv_error_set_key(err, KV_EINPUT, "policies", "run.yaml: the run's own bad input");
    }
    for (size_t l = 0; rc == KV_OK && l < kv_net_link_count(s->net); l++) {
        kv_link_stats st;
        if (kv_net_link_stats(s->net, l, &st) != KV_OK)
            rc = kv_error_set(err, KV_EFAIL, "link stats %zu", l);
        put(s, (double)st.bytes);
        put(s, st.busy_s);
    }
    s->round_trips = kv_net_round_trips(s->net);
    kv_net_destroy(s->net);
    s->net = NULL;
    return rc;
}

static int script_save(void *arg, kv_stream *out, kv_error *err)
{
    script *s = arg;
    kv_stream_put(out, &s->n, sizeof s->n);
    kv_stream_put(out, s->v, s->n * sizeof s->v[0]);
    kv_stream_put(out, &s->round_trips, sizeof s->round_trips);
    kv_stream_put(out, &s->pid, sizeof s->pid);
    return out->failed ? kv_error_set(err, KV_EFAIL, "save") : KV_OK;
}

static int script_load(void *arg, kv_stream *in, kv_error *err)
{
    script *s = arg;
    if (kv_stream_get(in, &s->n, sizeof s->n) != 0 || s->n > sizeof s->v / sizeof s->v[0] ||
        kv_stream_get(in, s->v, s->n * sizeof s->v[0]) != 0 ||
        kv_stream_get(in, &s->round_trips, sizeof s->round_trips) != 0 || kv_stream_get(in, &s->pid, sizeof s->pid) != 0)
        return kv_error_set(err, KV_EFAIL, "load");
    return KV_OK;
}

/* Runs s through kv_net_run_body, in the child (in_child) or here over the socket. */
static int script_go(script *s, int in_child, kv_error *err)
{
    s->base.run_in_child = in_child;
    s->n = 0;
    s->rng = 12345;
    s->started = 0;
    s->pid = 0;
    kv_net_body body = {.run = script_run, .save = script_save, .load = script_load, .arg = s};
    kv_error_clear(err);
    int rc = kv_net_run_body(&s->base, &body, err);
    if (rc != KV_OK && strstr(err->msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    return rc;
}

/* No child of this process is left, zombie or not. */
static void expect_no_child(void)
{
    errno = 0;
    cr_expect(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD, "a child process is left behind");
}

static script *script_new(kv_priority_mode prio, int levels)
{
    script *s = kv_calloc(1, sizeof *s);
    s->base = nett_star(KV_NET_SIMGRID, 6, 10.0, 5e-6);
    s->run = s->base;
    s->run.priority = prio;
    s->run.class_weight[0] = 4;
    s->run.class_weight[1] = 1;
    s->levels = levels;
    return s;
}

/* In the child and here, the same numbers to the bit; the child asked nothing over a socket. */
static void expect_same(kv_priority_mode prio, int levels)
{
    script *a = script_new(prio, levels), *b = script_new(prio, levels);
    kv_error err;
    cr_assert_eq(script_go(a, 1, &err), KV_OK, "in the child: %s", err.msg);
    cr_assert_eq(script_go(b, 0, &err), KV_OK, "over the socket: %s", err.msg);
    cr_assert_neq(a->pid, (int)getpid(), "the in-child run ran here");
    cr_assert_eq(b->pid, (int)getpid());
    cr_expect_eq(a->round_trips, 0, "in the child: %zu round trips", a->round_trips);
    cr_expect_gt(b->round_trips, 0);
    cr_assert_gt(a->n, 200, "the script saw too little (%zu values)", a->n);
    cr_assert_eq(a->n, b->n, "in the child %zu values, over the socket %zu", a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        cr_assert(memcmp(&a->v[i], &b->v[i], sizeof a->v[i]) == 0, "value %zu: %.17g in the child, %.17g over the socket",
                  i, a->v[i], b->v[i]);
    expect_no_child();
    kv_free(a);
    kv_free(b);
}

Test(simgrid_inchild, same_numbers_as_the_socket_without_classes, .timeout = 60)
{
    expect_same(KV_PRIO_NONE, 0);
}

Test(simgrid_inchild, same_numbers_as_the_socket_with_strict_classes, .timeout = 60)
{
    expect_same(KV_PRIO_STRICT, 0); /* the run's priority differs from the platform's config */
}

Test(simgrid_inchild, same_numbers_as_the_socket_with_weighted_classes, .timeout = 60)
{
    expect_same(KV_PRIO_WEIGHTED, 0);
}

Test(simgrid_inchild, same_numbers_as_the_socket_with_per_flow_levels, .timeout = 60)
{
    expect_same(KV_PRIO_NONE, 1);
}

Test(simgrid_inchild, a_child_that_dies_fails_the_run_and_is_reaped, .timeout = 60)
{
    script *s = script_new(KV_PRIO_NONE, 0);
    s->fail = 1;
    kv_error err;
    int rc = script_go(s, 1, &err);
    cr_expect_eq(rc, KV_EFAIL, "rc %d: %s", rc, err.msg);
    cr_expect(strstr(err.msg, "SimGrid died of signal 15") && strstr(err.msg, "during the run"), "got: %s", err.msg);
    expect_no_child();
    kv_free(s);
}

Test(simgrid_inchild, a_simgrid_abort_in_the_run_comes_with_its_last_words, .timeout = 60)
{
#ifndef HAVE_XBT
    cr_skip_test("skipped: no SimGrid headers");
#else
    script *s = script_new(KV_PRIO_NONE, 0);
    s->fail = 4;
    kv_error err;
    int rc = script_go(s, 1, &err);
    cr_expect_eq(rc, KV_EFAIL, "rc %d: %s", rc, err.msg);
    cr_expect(strstr(err.msg, "SimGrid died of signal 6 (abort) during the run: the network solver gave up at step 4"),
              "got: %s", err.msg);
    expect_no_child();
    kv_free(s);
#endif
}

/* The cap is a million steps, each a SimGrid round here (slower under ASan), so a longer limit. */
Test(simgrid_inchild, the_step_cap_still_stops_a_spinning_simgrid, .timeout = 300)
{
#ifndef HAVE_XBT
    cr_skip_test("skipped: no SimGrid headers");
#else
    script *s = script_new(KV_PRIO_NONE, 0);
    s->fail = 5;
    kv_error err;
    int rc = script_go(s, 1, &err);
    cr_expect_eq(rc, KV_EFAIL, "rc %d: %s", rc, err.msg);
    cr_expect(strstr(err.msg, "SimGrid made no progress during the run (SimGrid took") &&
                  strstr(err.msg, "solver steps without reaching the next event"),
              "got: %s", err.msg);
    expect_no_child();
    kv_free(s);
#endif
}

Test(simgrid_inchild, a_stopped_child_fails_the_run_within_watchdog_s, .timeout = 60)
{
    script *s = script_new(KV_PRIO_NONE, 0);
    s->fail = 3;
    s->base.watchdog_s = s->run.watchdog_s = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kv_error err;
    int rc = script_go(s, 1, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_expect_eq(rc, KV_EFAIL, "rc %d: %s", rc, err.msg);
    cr_expect(strstr(err.msg, "made no progress") && strstr(err.msg, "network.watchdog_s"), "got: %s", err.msg);
    cr_expect_lt(took, 8.0, "took %.1f s (watchdog_s 1)", took);
    expect_no_child();
    kv_free(s);
}

Test(simgrid_inchild, the_runs_own_error_comes_back_with_its_code_and_key, .timeout = 60)
{
    script *s = script_new(KV_PRIO_NONE, 0);
    s->fail = 2;
    kv_error a, b;
    cr_expect_eq(script_go(s, 1, &a), KV_EINPUT);
    cr_expect_eq(script_go(s, 0, &b), KV_EINPUT);
    cr_expect_str_eq(a.msg, b.msg);
    cr_expect_str_eq(a.key, "policies");
    cr_expect_str_eq(a.key, b.key);
    expect_no_child();
    kv_free(s);
}

Test(simgrid_inchild, bad_platform_input_is_reported_as_before_the_run, .timeout = 60)
{
    script *s = script_new(KV_PRIO_NONE, 0);
    s->base.topology = s->run.topology = KV_TOPO_PLATFORM;
    s->base.platform_file = s->run.platform_file = "/nonexistent/platform.xml";
    kv_error a, b;
    int rc = script_go(s, 1, &a);
    cr_expect_eq(rc, KV_EINPUT, "rc %d: %s", rc, a.msg);
    cr_expect_eq(s->pid, 0, "the run started");
    cr_expect_eq(script_go(s, 0, &b), KV_EINPUT);
    cr_expect_str_eq(a.msg, b.msg);
    cr_expect_str_eq(a.key, b.key);
    expect_no_child();
    kv_free(s);
}

Test(simgrid_inchild, a_priority_the_driver_refuses_is_the_same_bad_input, .timeout = 60)
{
    /* Strict classes with a maxmin/precision that leaves them no room: refused when the run asks for its
       network (in the child: by the driver already built; here: by a fresh child). */
    script *s = script_new(KV_PRIO_STRICT, 0);
    static const char *key = "maxmin/precision", *value = "0.01";
    s->base.n_options = s->run.n_options = 1;
    s->base.option_key[0] = s->run.option_key[0] = key;
    s->base.option_value[0] = s->run.option_value[0] = value;
    kv_error a, b;
    int rc = script_go(s, 1, &a);
    cr_expect_eq(rc, KV_EINPUT, "rc %d: %s", rc, a.msg);
    cr_expect(strstr(a.msg, "strict classes need"), "got: %s", a.msg);
    cr_expect_eq(script_go(s, 0, &b), KV_EINPUT);
    cr_expect_str_eq(a.msg, b.msg);
    cr_expect_str_eq(a.key, "network.priority");
    cr_expect_str_eq(a.key, b.key);
    expect_no_child();
    kv_free(s);
}
