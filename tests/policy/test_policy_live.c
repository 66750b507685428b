/* test_policy_live.c — hooks that see the running system: ctx.now, node lists, route, state, hook complete, cache rules. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/policy.h"
#include "core/study/study.h"
#include "tests/support.h"

#define LOAD_STEP "tests/fixtures/scenarios/load-step.yaml"

typedef struct run {
    kv_scenario *s;
    kv_study *st;
    const kv_policy_outcome *o; /* int8, adaptive, feedback (as in the fixture) */
    size_t n;
} run;

static void run_start(run *r)
{
    kv_error err = {0};
    memset(r, 0, sizeof *r);
    cr_assert_eq(kv_scenario_load(LOAD_STEP, NULL, 0, &r->s, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_prepare(r->s, &r->st, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_study_run(r->st, &err), 0, "%s", err.msg);
    r->o = kv_study_outcomes(r->st, &r->n);
    cr_assert_eq(r->n, 3);
}

static void run_free(run *r)
{
    kv_study_destroy(r->st);
    kv_scenario_destroy(r->s);
}

/* Requests 0-3 and 20-23 arrive 10 s apart (quiet), 4-19 within 0.15 s at t = 40 s (the burst). */
static bool in_burst(uint64_t id)
{
    return id >= 5 && id <= 19; /* request 4 opens the burst: nothing is in flight yet when it is encoded */
}

Test(policy_live, bits_follow_the_route_and_decode_load)
{
    run r;
    run_start(&r);
    const kv_run_result *ad = &r.o[1].run, *i8 = &r.o[0].run;
    cr_assert_eq(ad->n_requests, 24);
    for (size_t i = 0; i < ad->n_requests; i++) {
        const kv_request_result *q = &ad->requests[i];
        double want = in_burst(q->id) ? 5.0 : 9.0; /* 4 or 8 bits + 32/32 of scale and zero */
        cr_expect_eq(q->bits, want, "request %llu: %g bits, want %g", (unsigned long long)q->id, q->bits, want);
        cr_expect_eq(i8->requests[i].bits, 9.0);
        if (in_burst(q->id))
            cr_expect(q->anchor_bytes < i8->requests[i].anchor_bytes);
        else
            cr_expect_eq(q->anchor_bytes, i8->requests[i].anchor_bytes);
    }
    run_free(&r);
}

Test(policy_live, same_scenario_same_bytes)
{
    char *dir = kvt_tempdir();
    char *a = kvt_path(dir, "a"), *b = kvt_path(dir, "b");
    const char *names[] = {"results.json", "requests.csv", "trace.json"};
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet --out %s", LOAD_STEP, a);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "run %s --quiet --out %s", LOAD_STEP, b);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    free(out);
    kvt_expect_same_files(a, b, names, 3);
    free(a);
    free(b);
    kvt_rmtree(dir);
    free(dir);
}

Test(policy_live, complete_sees_ttft_and_state_persists)
{
    run r;
    run_start(&r);
    const kv_run_result *fb = &r.o[2].run;
    /* live_complete.lua: 8 bits until hook complete has counted a finished request, then 4. Request 0
       finishes before request 1 arrives (10 s later), so only request 0 is sent at 8 bits. */
    cr_expect_eq(fb->requests[0].bits, 9.0);
    for (size_t i = 1; i < fb->n_requests; i++)
        cr_expect_eq(fb->requests[i].bits, 5.0, "request %zu: %g bits", i, fb->requests[i].bits);
    run_free(&r);
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run %s --quiet", LOAD_STEP);
    cr_assert_eq(kvt_kvsim(args, &out), 0, "%s", out);
    /* print() from hook complete: the measured TTFT of request 0 and its 9 bits. */
    cr_expect(strstr(out, "policy feedback: complete 0 ttft 0.") != NULL, "%s", out);
    cr_expect(strstr(out, "bits 9.000") != NULL, "%s", out);
    free(out);
}

Test(policy_live, unknown_live_field_names_file_and_line)
{
    char *path = kvt_source("tests/fixtures/policies/live_typo.lua");
    kv_policy *p = kvt_policy_load(path, NULL, 0);
    kv_policy_model m = {"toy", 2, 4, 2, 64};
    kv_policy_request r = {.id = 3, .prompt_tokens = 10, .output_tokens = 2, .prefill_start_s = -1,
                           .prefill_end_s = -1};
    kv_encoding e;
    kv_error err = {0};
    cr_assert_eq(kv_policy_encoding(p, &m, &r, 0, 0, &e, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "live_typo.lua:4: ctx has no field 'noww' in hook 'encode'; did you mean 'now'?"),
              "%s", err.msg);
    kv_policy_destroy(p);
    free(path);
}

/* A view whose clock the test sets. */
typedef struct fake_sys {
    double now;
    kv_policy_node nodes[2];
    int calls;
} fake_sys;

static double fake_now(void *u)
{
    return ((fake_sys *)u)->now;
}

static int fake_nodes(void *u, int pool, const kv_policy_node **out)
{
    fake_sys *f = u;
    f->calls++;
    *out = f->nodes;
    return pool == 1 ? 2 : 1;
}

static int fake_route(void *u, uint64_t id, kv_policy_link *links, int max)
{
    (void)u;
    cr_assert(max >= 2);
    links[0] = (kv_policy_link){.capacity_gbps = 100, .rate_gbps = 50, .utilisation = 0.5, .flows = (int)id,
                                .bytes_in_flight = 1e6, .bytes_queued = 2e6};
    return 1;
}

Test(policy_live, live_reads_are_never_cached)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "clock.lua",
                           "return {\n"
                           "  encode = function(ctx)\n"
                           "    local b = ctx.now < 1 and 8 or 4\n"
                           "    return { key = { bits = b }, value = { bits = b } }\n"
                           "  end,\n"
                           "  transfer = function(ctx)\n"
                           "    local l = ctx.route[1]\n"
                           "    assert(l.capacity_gbps == 100 and l.utilisation == 0.5 and l.bytes_queued == 2e6)\n"
                           "    assert(#ctx.decode_nodes == 2 and #ctx.prefill_nodes == 1)\n"
                           "    assert(ctx.decode_nodes[2].kv_free_bytes == 7)\n"
                           "    return { order = l.flows > 1 and 'anchor_first' or 'concurrent' }\n"
                           "  end,\n"
                           "}\n");
    kv_policy *p = kvt_policy_load(path, NULL, 0);
    fake_sys f = {.now = 0.5};
    f.nodes[1].index = 1;
    f.nodes[1].kv_free_bytes = 7;
    kv_policy_view v = {.user = &f, .now = fake_now, .nodes = fake_nodes, .route = fake_route};
    kv_policy_set_view(p, &v);
    kv_policy_model m = {"toy", 2, 4, 2, 64};
    kv_policy_request r = {.id = 1, .prompt_tokens = 10, .output_tokens = 2};
    kv_encoding e;
    kv_error err = {0};
    cr_assert_eq(kv_policy_encoding(p, &m, &r, 0, 0, &e, &err), 0, "%s", err.msg);
    cr_expect_eq(e.key.bits, 8);
    cr_expect(!kv_policy_encoding_fixed(p, &m, 0, 0), "an answer that read ctx.now was cached");
    f.now = 2.0;
    cr_assert_eq(kv_policy_encoding(p, &m, &r, 0, 0, &e, &err), 0, "%s", err.msg);
    cr_expect_eq(e.key.bits, 4);
    kv_transfer_plan tp;
    cr_assert_eq(kv_policy_transfer(p, &r, &tp, &err), 0, "%s", err.msg);
    cr_expect_eq(tp.order, KV_ORDER_CONCURRENT);
    r.id = 2;
    cr_assert_eq(kv_policy_transfer(p, &r, &tp, &err), 0, "%s", err.msg);
    cr_expect_eq(tp.order, KV_ORDER_ANCHOR_FIRST);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.cache_hits, 0);
    cr_expect_eq(st.lua_calls, 4);
    kv_policy_destroy(p);
    free(path);
    kvt_rmtree(dir);
    free(dir);
}
