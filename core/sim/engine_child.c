/* engine_child.c — where a policy run executes: in this process, or wholly inside the SimGrid child.
 *
 * kv_engine_run picks the place; for the child it hands kv_net_run_body (net/net.h) the run and the two
 * halves of its return trip: save_run writes the results in the child, load_run reads them back here.
 */
#include "core/sim/engine.h"

#include <stdbool.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/base/histogram.h"
#include "core/base/progress.h"
#include "core/base/stream.h"
#include "core/sim/engine_internal.h"
#include "core/sim/timeline.h"
#include "core/workload/workload.h"
#include "net/net.h"

/* One run: its inputs, its results, and the timeline as it was before it (kv_net_run_body). */
typedef struct engine_run {
    const kv_run_inputs *in;
    kv_run_result *out;
    kv_request_result *shared; /* out->requests, mapped before the fork (NULL: they come back streamed) */
    kv_timeline_mark mark;
} engine_run;

/* ---- The run in the SimGrid child (docs/network.md "How it runs") ----
   The child runs kv_engine_run_loop with SimGrid a function call away, then writes back everything of the
   run the caller keeps: the whole kv_run_result and what the run added to the timeline. The per-request
   results (megabytes) are not written: the child fills them in a mapping this process shares with it
   (kv_calloc_shared, made before the fork), so they cost no copy, no second set of pages and no
   copy-on-write faults here; where that mapping is refused they travel with the rest. The rest stays in
   the child: the policy's Lua state (nothing reads it after a run but its parameters, which a run does not
   change; a caller whose later runs must continue it sets keep_policy_state) and the backend the engine
   opened. The child draws the progress line itself and clears it at the end. */

static int run_in_child(void *arg, kv_net_host *host, kv_error *err)
{
    const engine_run *r = arg;
    int rc = kv_engine_run_loop(r->in, r->out, host, err);
    kv_progress_clear(r->in->progress);
    return rc;
}

static int save_run(void *arg, kv_stream *s, kv_error *err)
{
    const engine_run *r = arg;
    const kv_run_result *out = r->out;
    kv_stream_put(s, out, sizeof *out); /* its pointers are the child's: load replaces them */
    if (!r->shared)
        kv_stream_put(s, out->requests, out->n_requests * sizeof *out->requests);
    kv_stream_put(s, out->links, out->n_links * sizeof *out->links);
    kv_histogram_save(&out->itl_s, s);
    if (r->in->timeline)
        kv_timeline_save(r->in->timeline, &r->mark, s);
    return s->failed ? kv_error_set(err, KV_EFAIL, "engine: writing the run's results failed") : KV_OK;
}

static int load_run(void *arg, kv_stream *s, kv_error *err)
{
    const engine_run *r = arg;
    kv_run_result *out = r->out;
    size_t n = kv_workload_count(r->in->workload);
    int bad = kv_stream_get(s, out, sizeof *out) != 0;
    out->requests = r->shared; /* the mapping is this process's own; the child's pointer is not read */
    out->requests_shared = r->shared != NULL;
    out->links = NULL;
    memset(&out->itl_s, 0, sizeof out->itl_s);
    if (bad || out->n_requests != n || out->n_links > (1u << 24)) {
        bad = 1; /* not this run's */
        out->n_requests = n; /* the size the shared mapping has */
    }
    if (!bad) {
        if (!r->shared)
            out->requests = kv_calloc(n ? n : 1, sizeof *out->requests);
        out->links = kv_calloc(out->n_links ? out->n_links : 1, sizeof *out->links);
        bad = (!r->shared && kv_stream_get(s, out->requests, n * sizeof *out->requests) != 0) ||
              kv_stream_get(s, out->links, out->n_links * sizeof *out->links) != 0 ||
              kv_histogram_load(&out->itl_s, s) != 0 ||
              (r->in->timeline && kv_timeline_load(r->in->timeline, s) != 0);
    }
    if (!bad)
        return KV_OK;
    kv_run_result_free(out);
    return kv_error_set(err, KV_EFAIL, "engine: the run's results came back incomplete from the SimGrid child");
}

/* Whether the run can go to the SimGrid child: a simgrid network asked to, a CPU backend the child
   opens itself (a device opened here, or one a child of a process that used it cannot open, stays
   here), and no later run that must continue this one's policy state. */
static bool run_goes_to_child(const kv_run_inputs *in)
{
    const kv_engine_config *c = in->config;
    const char *be = c->timing_backend ? c->timing_backend : "cpu";
    return !c->colocated && c->net.model == KV_NET_SIMGRID && c->net.run_in_child && !in->backend &&
           strcmp(be, "cpu") == 0 && !in->keep_policy_state;
}

int kv_engine_run(const kv_run_inputs *in, kv_run_result *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    engine_run r = {.in = in, .out = out};
    if (!run_goes_to_child(in))
        return kv_engine_run_loop(in, out, NULL, err);
    kv_timeline_get_mark(in->timeline, &r.mark);
    size_t n = kv_workload_count(in->workload);
    r.shared = kv_calloc_shared(n, sizeof *r.shared);
    out->requests = r.shared; /* the child's setup fills it in place */
    out->requests_shared = r.shared != NULL;
    out->n_requests = r.shared ? n : 0;
    kv_net_body body = {.run = run_in_child, .save = save_run, .load = load_run, .arg = &r};
    int rc = kv_net_run_body(&in->config->net, &body, err);
    if (rc != KV_OK)
        kv_run_result_free(out); /* the mapping too, when no load took it */
    return rc;
}

