/* test_simgrid_pace.c — the SimGrid network's round-trip shortcuts: the same completions, at the same
 * dates, as asking the child every time (kv_net_config.ask_always), for fewer round trips; and what
 * `kvsim bench sim` reports of them. */
#include <stdio.h>
#include <stdlib.h>

#include "core/base/alloc.h"
#include "tests/net_support.h"
#include "tests/support.h"

/* Everything a run showed: each completion (id, tag, date) and each advance's stopping time, in order. */
typedef struct pace_log {
    double *v;          /* owned; kv_free */
    size_t n, cap;
    kv_net *net;
    uint64_t rng;
    int restart;        /* start a new flow from the completion callback, as kvsim's next layer does */
    int levels;         /* flows carry their own level and weight */
    int hosts;
    uint64_t started;
} pace_log;

static void pace_put(pace_log *l, double x)
{
    kv_grow((void **)&l->v, sizeof *l->v, &l->cap, l->n + 1);
    l->v[l->n++] = x;
}

static uint64_t pace_rand(pace_log *l)
{
    l->rng = l->rng * 6364136223846793005ull + 1442695040888963407ull;
    return l->rng >> 33;
}

static void pace_start(pace_log *l, double at)
{
    int src = (int)(pace_rand(l) % (uint64_t)(l->hosts / 2));
    int dst = l->hosts / 2 + (int)(pace_rand(l) % (uint64_t)(l->hosts - l->hosts / 2));
    kv_flow_spec f = {.src = src, .dst = dst, .bytes = 100000 + pace_rand(l) % 40000000,
                      .priority = (int)(pace_rand(l) % 3), .tag = l->started++};
    if (l->levels) {
        f.has_level = 1;
        f.level = (int)(pace_rand(l) % 3);
        f.weight = 1.0 + (double)(pace_rand(l) % 4);
    }
    kv_flow_id id = 0;
    kv_error err;
    int rc = kv_net_flow_start(l->net, &f, at, &id, &err);
    cr_assert_eq(rc, KV_OK, "flow_start: %s", err.msg);
    pace_put(l, (double)id);
}

static void pace_done(void *user, kv_flow_id id, uint64_t tag, double t)
{
    pace_log *l = user;
    pace_put(l, (double)id);
    pace_put(l, (double)tag);
    pace_put(l, t);
    if (l->restart && pace_rand(l) % 2 == 0)
        pace_start(l, t); /* starts at the completion date */
}

/* A kvsim-like driver: flows start now or later, advances go to the next "event" (often the
   network's own time again, as the engine asks before each event), some flows are cancelled. */
static size_t pace_run(kv_net_config cfg, int ask_always, int restart, int levels, uint64_t seed, pace_log *l)
{
    memset(l, 0, sizeof *l);
    l->rng = seed;
    l->restart = restart;
    l->levels = levels;
    l->hosts = cfg.hosts;
    cfg.ask_always = ask_always;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_create(&cfg, pace_done, l, &l->net, &err);
    if (rc != KV_OK && strstr(err.msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim (%s)", err.msg);
    cr_assert_eq(rc, KV_OK, "create: %s", err.msg);
    double now = 0;
    for (int step = 0; step < 600; step++) {
        uint64_t what = pace_rand(l) % 16;
        if (what < 4 || kv_net_active_flows(l->net) == 0) {
            pace_start(l, now);
        } else if (what < 6) {
            pace_start(l, now + 1e-4 * (double)(1 + pace_rand(l) % 50)); /* scheduled */
        } else if (what == 6 && l->started > 0) {
            kv_flow_id victim = 1 + pace_rand(l) % l->started;
            rc = kv_net_flow_cancel(l->net, victim, &err); /* fails for flows already done: both runs alike */
            pace_put(l, rc == KV_OK ? 1.0 : 0.0);
        }
        double t_next = what % 3 == 0 ? now : now + 1e-5 * (double)(1 + pace_rand(l) % 2000);
        for (int again = 0; again < 2; again++) {
            double t = 0;
            rc = kv_net_advance(l->net, t_next, &t, &err);
            cr_assert_eq(rc, KV_OK, "advance: %s", err.msg);
            pace_put(l, t);
            now = t;
        }
    }
    double t = 0;
    while (kv_net_active_flows(l->net) > 0) {
        rc = kv_net_advance(l->net, INFINITY, &t, &err);
        cr_assert_eq(rc, KV_OK, "advance: %s", err.msg);
        pace_put(l, t);
    }
    size_t trips = kv_net_round_trips(l->net);
    kv_net_destroy(l->net);
    l->net = NULL;
    return trips;
}

/* Runs the driver with and without the shortcuts and wants the same record, bit for bit. */
static void pace_same(kv_net_config cfg, int restart, int levels, const char *what)
{
    for (uint64_t seed = 1; seed <= 3; seed++) {
        pace_log ref, fast;
        size_t trips_ref = pace_run(cfg, 1, restart, levels, seed, &ref);
        size_t trips_fast = pace_run(cfg, 0, restart, levels, seed, &fast);
        cr_assert_eq(fast.n, ref.n, "%s, seed %llu: %zu record entries, %zu asking the child every time", what,
                     (unsigned long long)seed, fast.n, ref.n);
        for (size_t i = 0; i < ref.n; i++)
            cr_assert(memcmp(&fast.v[i], &ref.v[i], sizeof(double)) == 0,
                      "%s, seed %llu: entry %zu is %.17g, %.17g asking the child every time", what,
                      (unsigned long long)seed, i, fast.v[i], ref.v[i]);
        cr_assert_lt(trips_fast, trips_ref, "%s: %zu round trips, %zu asking every time", what, trips_fast, trips_ref);
        kv_free(ref.v);
        kv_free(fast.v);
    }
}

Test(simgrid_pace, shortcuts_change_nothing_on_a_contended_star, .timeout = 120)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 6, 100.0, 2e-6);
    pace_same(cfg, 0, 0, "star");
    pace_same(cfg, 1, 0, "star, flows started from callbacks");
}

Test(simgrid_pace, shortcuts_change_nothing_on_a_fat_tree_with_classes, .timeout = 120)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 8, 100.0, 2e-6);
    cfg.topology = KV_TOPO_FAT_TREE;
    cfg.hosts_per_leaf = 2;
    cfg.oversubscription = 2;
    cfg.switch_latency_s = 1e-6;
    cfg.priority = KV_PRIO_STRICT;
    pace_same(cfg, 1, 0, "fat-tree, strict classes");
    cfg.priority = KV_PRIO_WEIGHTED;
    cfg.class_weight[0] = 4;
    cfg.class_weight[1] = 2;
    cfg.class_weight[2] = 1;
    pace_same(cfg, 1, 0, "fat-tree, weighted classes");
}

Test(simgrid_pace, shortcuts_change_nothing_with_per_flow_levels, .timeout = 120)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 6, 100.0, 2e-6);
    pace_same(cfg, 1, 1, "star, per-flow levels");
}

/* kvsim's pattern per KV transfer: start at t, advance to t twice (events at t), then to the next
   event, past the completion. One round trip per flow; asking every time took three. */
Test(simgrid_pace, a_lone_transfer_costs_one_round_trip)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 2, 100.0, 2e-6);
    kv_net *net = nett_create(&cfg, &r);
    double t = 0, now = 0;
    kv_error err;
    for (int i = 0; i < 20; i++) {
        size_t before = kv_net_round_trips(net);
        nett_start(net, 0, 1, 10000000, 0, (uint64_t)i, now);
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(kv_net_advance(net, now, &t, &err), KV_OK, "%s", err.msg);
            cr_assert_eq(t, now);
        }
        cr_assert_eq(kv_net_advance(net, now + 0.01, &t, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(r.n, i + 1, "flow %d completed", i);
        cr_assert_eq(kv_net_round_trips(net) - before, 1, "flow %d: %zu round trips", i,
                     kv_net_round_trips(net) - before);
        now = t + 0.02; /* the next transfer starts later: the advance there needs no child */
        cr_assert_eq(kv_net_advance(net, now, &t, &err), KV_OK, "%s", err.msg);
    }
    kv_net_destroy(net);
}

/* A flow whose latency was paid during an advance that ended before its completion: the child gives
   a horizon (its completion date), so the advances up to there need no round trip. */
Test(simgrid_pace, a_horizon_follows_a_latency_paid_on_the_way)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 3, 100.0, 2e-6);
    kv_net *net = nett_create(&cfg, &r);
    double t = 0;
    kv_error err;
    nett_start(net, 0, 2, 125000000, 0, 1, 0); /* 10 ms at 100 Gb/s */
    nett_start(net, 1, 2, 125000000, 0, 2, 0); /* shares the receiving NIC: both end near 20 ms */
    cr_assert_eq(kv_net_advance(net, 1e-3, &t, &err), KV_OK, "%s", err.msg);
    size_t after_first = kv_net_round_trips(net);
    for (int k = 2; k < 19; k++) {
        cr_assert_eq(kv_net_advance(net, k * 1e-3, &t, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(t, k * 1e-3);
    }
    cr_assert_eq(kv_net_round_trips(net), after_first, "%zu round trips below the horizon",
                 kv_net_round_trips(net) - after_first);
    cr_assert_eq(r.n, 0);
    nett_drain(net);
    cr_assert_eq(r.n, 2);
    nett_close(r.t[0], 4e-6 + 2 * 125000000 / 12.5e9, 1e-9, "shared NIC");
    kv_net_destroy(net);
}

/* An advance that ends exactly where a new flow's latency is paid: the flow joins SimGrid's solve at
   that step, after the solver ran, so the child's next date is not sure and it gives no horizon. The
   small flow (on other links than the long one) must still be reported, at its own date. */
Test(simgrid_pace, a_latency_paid_at_the_advance_date_gives_no_horizon)
{
    nett_rec r = {0};
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, 100.0, 2e-6);
    kv_net *net = nett_create(&cfg, &r);
    double t = 0;
    kv_error err;
    nett_start(net, 0, 1, 125000000, 0, 1, 0); /* 10 ms */
    cr_assert_eq(kv_net_advance(net, 1e-3, &t, &err), KV_OK, "%s", err.msg);
    nett_start(net, 2, 3, 12500, 0, 2, t); /* 1 us of bytes after its 4 us of latency */
    double paid = 1e-3 + (2e-6 + 2e-6);
    cr_assert_eq(kv_net_advance(net, paid, &t, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(t, paid);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(kv_net_advance(net, 2e-3, &t, &err), KV_OK, "advance: %s", err.msg);
    cr_assert_eq(r.n, 1, "the small flow completed before 2 ms");
    cr_assert_eq(r.tag[0], 2);
    nett_close(r.t[0], paid + 1e-6, 1e-6, "small flow");
    nett_drain(net);
    kv_net_destroy(net);
}

/* `kvsim bench sim` with SimGrid: the child's CPU time, the round trips per request (none with the run
   in the child, the default; some with --socket), and the ideal network's run beside it with both
   ratios (children included); --no-ideal leaves that run out. */
Test(simgrid_pace, bench_sim_reports_round_trips_and_the_ratio_to_ideal, .timeout = 120)
{
    char *out = NULL;
    int rc = kvt_kvsim("bench sim --requests 200 --network simgrid", &out);
    if (rc != 0 && strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "round trips          0 to the network's process, 0.00 per request"), "%s", out);
    free(out);
    out = NULL;
    rc = kvt_kvsim("bench sim --requests 200 --network simgrid --socket", &out);
    if (rc != 0 && strstr(out, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "CPU time, children"), "%s", out);
    const char *rt = strstr(out, "round trips ");
    cr_assert(rt, "%s", out);
    unsigned long long trips = 0;
    double per = 0;
    cr_assert_eq(sscanf(rt, "round trips %llu to the network's process, %lf per request", &trips, &per), 2, "%s", out);
    cr_expect(trips > 0 && per > 0 && per < 3, "%llu round trips, %g per request", trips, per);
    const char *vs = strstr(out, "vs the ideal network");
    cr_assert(vs, "%s", out);
    cr_expect(strstr(vs, "x per wall-second") && strstr(vs, "x per CPU-second"), "%s", out);
    free(out);
    out = NULL;
    cr_assert_eq(kvt_kvsim("bench sim --requests 200 --network simgrid --no-ideal", &out), 0, "%s", out);
    cr_expect(strstr(out, "round trips") && !strstr(out, "vs the ideal network"), "%s", out);
    free(out);
}
