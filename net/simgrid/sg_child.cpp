/* sg_child.cpp — the SimGrid child process: serves kvsim's flow requests at exact simulated times.
 *
 * Design notes.
 * - One process per network. SimGrid 3.32 keeps its engine, clock, configuration
 *   and platform in process-wide state: an Engine can be deleted and built again,
 *   but the clock carries over and the platform stays sealed, so a fresh network
 *   needs a fresh process. sg_net.c forks this child; it never returns to kvsim.
 * - In-child mode (kv_sg_child_run): the child's main line runs a whole kvsim run, whose network sends
 *   its requests to Driver::dispatch by a function call (kv_sg_local_send) instead of the socket;
 *   answers go to a buffer kvsim's side reads (kv_sg_local_read). One code path serves both modes.
 * - No actor: the driver runs in SimGrid's maestro (the process's own stack) and moves the
 *   simulation itself with Engine::run_until (Driver::run_to), so a wait is no simcall, context
 *   switch or timer. Comms start from maestro (their simcalls run in place). A run_until stops at
 *   the end of the first scheduling round in which a flow completed: the time hook sees a network
 *   action leave the model's started set and marks the engine's vetoed-activity set, which ends
 *   Engine::run_until's loop (the set holds no activity; kvsim never vetoes one).
 * - Exact time. Waiting for an ADVANCE runs SimGrid to the date a timeout would have: clock + d,
 *   d the largest step that does not pass the limit, so the driver stops at SimGrid's own
 *   completion date, and the flows kvsim starts next (from its completion callbacks) start at
 *   that date: nothing is rounded to a later event. While the driver blocks on the socket the
 *   whole simulation waits.
 * - Priority classes. SimGrid's max-min solver weighs every flow by a sharing
 *   penalty (share ∝ 1 / penalty); s4u offers no per-comm setter, so the driver
 *   sets the network action's penalty through the installed kernel headers. A
 *   CM02/LV08 comm first pays its latency with its LMM variable disabled, then
 *   SimGrid enables it with its own (shadowed) penalty; the driver therefore sets
 *   the class penalty from Engine::on_time_advance, the first moment the latency
 *   is paid and before the solver runs again. Strict classes are penalty ratios
 *   of range^(1/c_max) per class, c_max the highest class seen so far (a lower
 *   class still gets that fraction of a higher one's share where both are
 *   bottlenecked: the documented error);
 *   weighted classes are the weight ratios, exact up to the solver's precision.
 * - The solver's precision bounds the classes. SimGrid's max-min solver (3.32,
 *   lmm/maxmin.cpp) drops a link from the solve once what is left of it is below
 *   maxmin/precision x its bandwidth, or the sum of 1/penalty over its unsaturated
 *   flows is below maxmin/precision; a flow still unsaturated there gets rate 0,
 *   and the next solve aborts ("The Impossible Did Happen" in the lazy update, or a
 *   boost list assertion). What a link keeps for its unsaturated flows is at least
 *   (C_min / C_max) x w_min / (n x spread) of its bandwidth, n the flows on the
 *   busiest link, spread the largest penalty ratio between two flows in flight, w_min
 *   the smallest consumption weight (0.05 with network/crosstraffic), so the driver
 *   keeps spread x n x precision x kSafety <= (C_min / C_max) x w_min:
 *   the strict range shrinks from 1e9 as flows pile up on one link (never below
 *   kMinStrictRange), weighted classes keep their ratio, and a flow that would break
 *   the bound (or pass kMaxFlowsPerLink, where the solver's own sums of 1/penalty
 *   round to more than its precision) fails the run at its start instead of
 *   crashing SimGrid. With classes kvsim sets maxmin/precision to 1e-10 (the
 *   scenario may set it) and scales penalties so class 0 has 1/penalty ~ 1.
 * - Per-flow levels (relevel). From the first flow with its own level on, strict priority is
 *   a layered max-min computed here: a flow that a higher level leaves no room for on some
 *   link is held (Action::suspend, rate 0), the others get penalties from their weight and the
 *   dense rank of their level among the levels not held; see relevel and docs/network.md.
 *   Before that, the class penalties above run unchanged (same bytes out).
 * Invariants (numbers as in net.h): the driver's time `now_` never decreases (1),
 * is never beyond the ADVANCE limit (2), every started flow is answered once or
 * cancelled (3), and everything iterated is a vector whose order depends only on
 * the requests; hash maps are only looked up (4).
 */
#include <simgrid/kernel/resource/Action.hpp>
#include <simgrid/kernel/resource/Model.hpp>
#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/s4u.hpp>
#include <simgrid/simix.hpp>
#include <xbt/config.hpp>
#include <xbt/log.h>

#include <signal.h>
#include <stdio_ext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/simgrid/sg_platform.hpp"
#include "net/simgrid/sg_proto.h"

namespace sg4 = simgrid::s4u;
using simgrid::kernel::resource::Action;
using simgrid::kernel::resource::ActionHeap;
using simgrid::kernel::resource::Model;

namespace {

/* Strict classes c = 0..c_max get penalties kPenaltyScale * ratio^c with ratio^c_max = the
   strict range: kStrictRange while few flows share a link, less as they pile up (see the
   design notes). */
constexpr double kStrictRange = 1e9;
constexpr double kMinStrictRange = 100;  /* below, a lower class gets over 1% of a higher one's share */
constexpr double kSafety = 4;            /* margin on the precision bound */
constexpr double kPenaltyScale = 1.0;    /* class-0 penalty of the reference flow: 1/penalty ~ 1 */
constexpr double kMaxBaseRatio = 2.0;    /* a flow's RTT penalty within [1/2, 2] x the reference flow's */
constexpr int kMaxFlowsPerLink = 2048;   /* with classes: flows crossing one link at once */
constexpr double kLevelEps = 1e-9;       /* levels: a link with less left than this x its bandwidth is full */
constexpr double kMinLevelRange = 2;     /* levels: least penalty range between the highest and lowest level */

/* Requests come in batches (sg_net.c buffers them): one read takes as many as are there. */
struct InBuf {
    char data[64 * 1024];
    size_t pos = 0, len = 0;
};

/* Full reads (through `in`: one read refills it when empty) and writes on the socket; any failure
   means the parent is gone. */
void read_buffered(int fd, InBuf* in, void* buf, size_t n)
{
    char* p = static_cast<char*>(buf);
    while (n > 0) {
        if (in->pos == in->len) {
            ssize_t r = read(fd, in->data, sizeof in->data);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                _exit(0);
            in->pos = 0;
            in->len = (size_t)r;
        }
        size_t k = std::min(n, in->len - in->pos);
        std::memcpy(p, in->data + in->pos, k);
        in->pos += k;
        p += k;
        n -= k;
    }
}

void write_all(int fd, const void* buf, size_t n)
{
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            _exit(0);
        p += r;
        n -= (size_t)r;
    }
}

/* The largest d >= 0 with now + d <= t, and now + d == t whenever some d gives it:
   SimGrid dates a timeout as now + d. */
double exact_delta(double now, double t)
{
    double d = t - now;
    if (!(d > 0))
        return 0.0;
    while (d > 0 && now + d > t)
        d = std::nextafter(d, 0.0);
    for (;;) {
        double up = std::nextafter(d, std::numeric_limits<double>::infinity());
        if (now + d >= t || now + up > t)
            break;
        d = up;
    }
    return d;
}

struct LinkUse {
    uint64_t bytes = 0;  /* payload bytes of the flows that finished crossing it */
    double busy_s = 0;   /* closed intervals with at least one flow */
    double since_s = 0;  /* start of the open interval, when flows > 0 */
    int flows = 0;       /* flows on it now */
};

/* A src -> dst route as start needs it: the links kvsim reports (indices into Platform::links,
   in route order) and SimGrid's route latency. Routes of a built platform never change. */
struct Route {
    std::vector<int> links;
    double latency = 0;
};

struct Flow {
    uint64_t id, tag, bytes;
    int priority;
    int level = 0;            /* per-flow level (0 highest) and weight, for the levels mode */
    double weight = 1;
    bool held = false;        /* levels mode: suspended, a higher level fills a link of its route */
    double level_penalty = 0; /* levels mode: the penalty relevel last set (0: none yet) */
    sg4::CommPtr comm;
    const std::vector<int>* links = nullptr; /* Driver::routes_' indices into Platform::links, forward route */
    Action* action = nullptr; /* SimGrid's network action (every started flow has one) */
    double base_ratio = 0;    /* its SimGrid penalty / the reference flow's */
    bool latency_due = false; /* still paying its latency: the penalty waits (in pending_) */
    bool in_latency = false;  /* in Driver::latent_: its action was last seen paying its latency */
    bool ended = false;       /* in Driver::ended_: its action ended (and is gone after that round) */
    size_t slot = 0;          /* position in Driver::active_ */
};

class Driver {
public:
    Driver(const kv_net_config* cfg, int fd, kvsg::Platform&& platform)
        : cfg_(cfg), fd_(fd), platform_(std::move(platform)), uses_(platform_.links.size())
    {
        for (size_t i = 0; i < platform_.links.size(); i++)
            link_index_[platform_.links[i]] = (int)i;
    }

    /* Connects the watchdog and the priority hook and checks that SimGrid can give what cfg asks. */
    int prepare(kvsg::Error* err)
    {
        prepare_base();
        if (model_ == nullptr) {
            err->key = "network.simgrid";
            err->msg = "net simgrid: the network model is not one kvsim can follow (CM02, LV08, SMPI, IB)";
            return KV_EFAIL;
        }
        return prepare_priority(err);
    }

    /* What does not depend on the priority mode: the hooks, the model, the links' bandwidths. */
    void prepare_base()
    {
        sg4::Engine* engine = sg4::Engine::get_instance();
        sg4::Engine::on_time_advance_cb([this](double) {
            count_step();
            note_completion();
        });
        engine->track_vetoed_activities(&round_end_);
        model_ = dynamic_cast<Model*>(engine->get_netzone_root()->get_network_model());
        lmm_ok_ = model_ != nullptr && model_->get_maxmin_system() != nullptr && model_->is_update_lazy();
        try {
            precision_timing_ = simgrid::config::get_value<double>("surf/precision"); /* sg_precision_timing */
        } catch (const std::exception&) {
            precision_timing_ = -1; /* unknown: every ADVANCE is answered without a horizon */
        }
        double c_lo = 0, c_hi = 0;
        for (const sg4::Link* l : platform_.links) {
            double c = l->get_bandwidth();
            c_lo = c_lo == 0 ? c : std::min(c_lo, c);
            c_hi = std::max(c_hi, c);
        }
        double w_min = simgrid::config::get_value<bool>("network/crosstraffic") ? 0.05 : 1.0;
        weight_s_ = simgrid::config::get_value<double>("network/weight-S");
        /* Flows paying their latency get their penalty (classes or levels) when it is paid. */
        sg4::Engine::on_time_advance_cb([this](double) {
            apply_pending_penalties();
            note_latency_paid();
        });
        c_lo_ = c_lo;
        c_hi_ = c_hi;
        w_min_ = w_min;
    }


    /* The priority mode's checks and bounds (cfg_->priority), before any flow starts. */
    int prepare_priority(kvsg::Error* err)
    {
        double w_min = w_min_;
        precision_ = simgrid::config::get_value<double>("maxmin/precision");
        headroom_ = (c_hi_ > 0 ? c_lo_ / c_hi_ : 1.0) * w_min / (precision_ * kSafety);
        if (cfg_->priority == KV_PRIO_NONE)
            return KV_OK;
        if (!lmm_ok_) {
            err->key = "network.priority";
            err->msg = "classes need an LMM network model (CM02, LV08, SMPI) with network/optim:Lazy";
            return KV_EINPUT;
        }
        strict_range_ = std::min(kStrictRange, headroom_);
        if (cfg_->priority == KV_PRIO_STRICT && strict_range_ < kMinStrictRange) {
            err->key = "network.priority";
            err->msg = "strict classes need maxmin/precision x " + std::to_string((int)kSafety) + " x " +
                       std::to_string((int)kMinStrictRange) + " <= (slowest / fastest link bandwidth) x " +
                       (w_min < 1 ? "0.05 (network/crosstraffic)" : "1") + "; maxmin/precision is " +
                       std::to_string(precision_);
            return KV_EINPUT;
        }
        return KV_OK;
    }

    void send_ready();
    void serve();
    void dispatch(const kv_sg_request& rq);

    /* In-child mode (kv_sg_child_run): answers go to `local` instead of the socket. */
    void set_local(std::vector<char>* local) { local_ = local; }

    /* In-child mode: the network the run asks for (its priority mode and class weights; the
       platform was built from the same config without them). */
    int configure(const kv_net_config* cfg, kvsg::Error* err)
    {
        run_cfg_ = *cfg;
        cfg_ = &run_cfg_;
        bool own_precision = false;
        for (int i = 0; i < cfg->n_options; i++)
            own_precision = own_precision || std::strcmp(cfg->option_key[i], "maxmin/precision") == 0;
        if (cfg->priority != KV_PRIO_NONE && !own_precision)
            sg4::Engine::set_config("maxmin/precision:1e-10"); /* as kvsg::build_platform does */
        return prepare_priority(err);
    }

    uint32_t link_count() const { return (uint32_t)platform_.links.size(); }
    int socket() const { return fd_; }

private:
    const kv_net_config* cfg_;
    kv_net_config run_cfg_{};                 /* in-child mode: the run's network config (configure) */
    std::vector<char>* local_ = nullptr;      /* in-child mode: where answers go (else the socket) */
    double c_lo_ = 0, c_hi_ = 0, w_min_ = 1;  /* slowest, fastest link bandwidth; smallest consumption weight */
    int fd_;
    kvsg::Platform platform_;
    std::vector<LinkUse> uses_;
    std::unordered_map<const sg4::Link*, int> link_index_;
    std::vector<Flow*> active_;               /* in-flight flows; Flow::slot indexes this */
    std::unordered_map<uint64_t, Route> routes_; /* routes (start, route) by src x hosts + dst, looked up once;
                                                    Flow::links points into it (map nodes never move) */
    std::vector<Flow*> done_;                 /* advance's completions, kept to reuse their storage */
    std::vector<kv_sg_done> done_items_;      /* and their answer */
    std::vector<sg4::CommPtr> cancelled_;     /* comms cancelled since the last round: SimGrid's round that
                                                 handles their end (started from maestro) calls their
                                                 s4u side, so they live until it has run */
    std::vector<Flow*> ended_;                /* flows whose action ended, seen by note_completion, not yet
                                                 collected (their actions are gone once the round ends) */
    const std::string no_link_;               /* the busiest link's name when a route has none */
    std::unordered_map<uint64_t, std::unique_ptr<Flow>> flows_;
    std::vector<std::unique_ptr<Flow>> spare_; /* finished flows, reset, for start to reuse */
    std::vector<Flow*> pending_;              /* flows whose class penalty waits for the latency */
    std::vector<Flow*> latent_;               /* flows whose action was last seen paying its latency */
    double latency_paid_at_ = -INFINITY;      /* SimGrid's clock when a flow of latent_ was last seen past it */
    Model* model_ = nullptr;
    bool lmm_ok_ = false;                     /* an LMM model with lazy updates: penalties can be set */
    bool levels_ = false;                     /* a flow came with its own level: the levels mode is on */
    double w_ref_ = 0;                        /* levels: largest weight seen (its flows have factor 1) */
    double w_lo_ = 0;                         /* levels: smallest weight seen */
    double weight_s_ = 0;                     /* network/weight-S of the model */
    double reference_base_ = 0;               /* base penalty of the first prioritised flow */
    int max_class_ = 1;                       /* strict: highest class seen (at least 1) */
    double precision_ = 1e-5;                 /* maxmin/precision in force */
    double headroom_ = 1;                     /* (C_min / C_max) x w_min / (precision x kSafety) */
    double base_lo_ = 1, base_hi_ = 1;        /* smallest and largest base_ratio seen */
    double n_bucket_ = 1;                     /* power of two >= the most flows seen on one link */
    double strict_range_ = kStrictRange;      /* strict: penalty ratio of class c_max to class 0 */
    bool classes_moved_ = false;              /* class factors changed: reweight the running flows */
    double now_ = 0;                          /* kvsim's time of this network */
    int error_code_ = KV_OK;                  /* first error of an unanswered request */
    std::string error_;
    uint64_t steps_ = 0;                      /* solver steps since the driver last woke */
    double horizon_ = -INFINITY;              /* the next answer's t_next_s (advance sets it) */
    double precision_timing_ = -1;            /* SimGrid's precision/timing; < 0: no horizon given */
    std::set<sg4::Activity*> round_end_;      /* SimGrid's vetoed-activity set, marked by note_completion: a
                                                 non-empty set ends Engine::run_until after its round */
    std::vector<char> out_;                   /* the answer being written */
    InBuf in_;                                /* requests read, not yet served */

    /* The child's watchdog: SimGrid steps (each solve that moves the clock, maybe by 0)
       while the driver waits. Legit runs take a few per flow between two wake-ups; a
       SimGrid that never reaches the event it computed (surf/precision 0 did) spins
       here forever. Then the child answers "stuck" and exits. */
    void count_step()
    {
        if (++steps_ <= KV_SG_STEP_CAP + KV_SG_STEP_CAP_PER_FLOW * (uint64_t)active_.size())
            return;
        char msg[300];
        std::snprintf(msg, sizeof msg,
                      "SimGrid took %llu solver steps without reaching the next event, at simulated time %.9g s "
                      "with %zu flows in flight",
                      (unsigned long long)steps_, sg4::Engine::get_clock(), active_.size());
        kv_sg_reply h{};
        h.code = KV_EFAIL;
        h.flags = KV_SG_STUCK;
        h.t_now_s = now_;
        local_ = nullptr; /* in-child mode too: the stuck answer goes to kvsim on the socket */
        reply(h, nullptr, 0, msg);
        _exit(0);
    }

    /* At each solver step (the actions updated, the ended ones not yet handled): a network action
       that left the model's started set ended (finished, or failed), so the run stops after this
       round and the driver collects it. Every flow in active_ has its action there until then. */
    void note_completion()
    {
        if (model_->get_started_action_set()->size() + ended_.size() >= active_.size())
            return;
        for (Flow* f : active_) {
            if (!f->ended && f->action->get_state() != Action::State::STARTED) {
                f->ended = true;
                ended_.push_back(f);
            }
        }
        round_end_.insert(nullptr); /* SimGrid only asks whether the set is empty */
    }

    void fail(int code, const std::string& msg)
    {
        if (error_code_ == KV_OK) {
            error_code_ = code;
            error_ = msg;
        }
    }

    /* One write per answer: head, items and message together. */
    void reply(const kv_sg_reply& head, const void* items, size_t item_bytes, const std::string& msg)
    {
        kv_sg_reply h = head;
        h.msg_len = (uint32_t)msg.size();
        out_.resize(sizeof h + item_bytes + msg.size());
        std::memcpy(out_.data(), &h, sizeof h);
        if (item_bytes)
            std::memcpy(out_.data() + sizeof h, items, item_bytes);
        if (!msg.empty())
            std::memcpy(out_.data() + sizeof h + item_bytes, msg.data(), msg.size());
        if (local_ != nullptr)
            local_->insert(local_->end(), out_.begin(), out_.end());
        else
            write_all(fd_, out_.data(), out_.size());
    }

    /* Answers with the pending error (if any) and clears it. */
    void reply_status(uint32_t count, const void* items, size_t item_bytes)
    {
        kv_sg_reply h{};
        h.code = error_code_;
        h.count = count;
        h.t_now_s = now_;
        h.t_next_s = error_code_ == KV_OK ? horizon_ : -INFINITY;
        horizon_ = -INFINITY;
        reply(h, items, item_bytes, error_);
        error_code_ = KV_OK;
        error_.clear();
    }

    double class_factor(int priority) const
    {
        if (cfg_->priority == KV_PRIO_STRICT)
            return std::pow(strict_range_, (double)priority / max_class_);
        double w_max = 0;
        for (double w : cfg_->class_weight)
            w_max = std::max(w_max, w > 0 ? w : 1.0);
        double w = cfg_->class_weight[priority] > 0 ? cfg_->class_weight[priority] : 1.0;
        return w_max / w;
    }

    void apply_pending_penalties()
    {
        if (levels_) {
            bool moved = false;
            for (size_t i = 0; i < pending_.size();) {
                Flow* f = pending_[i];
                if (f->action->get_type() == ActionHeap::Type::latency) {
                    i++;
                    continue;
                }
                f->latency_due = false;
                pending_.erase(pending_.begin() + (long)i);
                moved = true;
            }
            if (moved)
                relevel();
            return;
        }
        for (size_t i = 0; i < pending_.size();) {
            Flow* f = pending_[i];
            if (f->action->get_type() == ActionHeap::Type::latency) {
                i++;
                continue;
            }
            f->action->set_sharing_penalty(penalty(f));
            f->latency_due = false;
            pending_.erase(pending_.begin() + (long)i);
        }
    }

    double penalty(const Flow* f) const { return f->base_ratio * kPenaltyScale * class_factor(f->priority); }
    double weight_spread() const;
    bool admit(const Flow* f, int busiest, const std::string& link);
    double base_ratio(const Flow* f, double route_latency_s);
    void set_priority(Flow* f);
    void find_action(Flow* f);
    bool start_levels(Flow* f, int busiest, const std::string& link);
    void relevel();
    void relevel_now();
    void route(const kv_sg_request& rq);
    const Route& route_of(int src, int dst);
    void link_state();
    void start(const kv_sg_request& rq);
    void cancel(const kv_sg_request& rq);
    void advance(double t_limit);
    double horizon_after_timeout() const;
    void note_latency_paid();
    void stats();
    bool wait_until(double t);
    bool run_to(double date);
    void collect_done(std::vector<Flow*>* done);
    void finish(Flow* f, double t, uint64_t bytes_crossed);
};

/* Runs SimGrid until its clock reaches `date` (at least one scheduling round, as a timeout there
   would: a flow ending at the clock completes), or with date < 0 until nothing is left to happen;
   stops after the first round in which a flow completed. True if one did (or one that completed
   earlier is not yet collected): collect_done then finds them. */
bool Driver::run_to(double date)
{
    if (!ended_.empty())
        return true;
    sg4::Engine* engine = sg4::Engine::get_instance();
    if (!cancelled_.empty()) {
        /* A cancelled flow's action keeps its share until SimGrid handles its end, which an actor's
           simcall would have had done before the next solve; maestro's cancel leaves it to the next
           round. A round of no time hands it over first, so the solve after it has its bandwidth. */
        round_end_.clear();
        engine->run_until(engine->get_clock());
        cancelled_.clear();
        if (!round_end_.empty()) {
            round_end_.clear();
            return true;
        }
    }
    do {
        round_end_.clear();
        engine->run_until(date);
        steps_ = 0;
        if (!round_end_.empty()) {
            round_end_.clear();
            return true;
        }
        /* run_until returns within 1e-5 s of its date when an event (a latency paid) lands there;
           the next call goes on from that event, as the rounds of one timeout would. */
    } while (date >= 0 && sg4::Engine::get_clock() < date);
    return false;
}

/* Waits without completions until kvsim time t; false if a flow completes first. */
bool Driver::wait_until(double t)
{
    if (!(t > now_))
        return true;
    double clock = sg4::Engine::get_clock();
    double d = exact_delta(clock, t);
    if (active_.empty()) {
        if (d > 0)
            run_to(clock + d); /* nothing in flight: one step of the clock */
    } else if (run_to(clock + d)) {
        return false;
    }
    now_ = t;
    return true;
}

/* The largest penalty ratio between two flows in flight (or about to be). */
double Driver::weight_spread() const
{
    double classes = 1;
    if (cfg_->priority == KV_PRIO_STRICT) {
        classes = strict_range_;
    } else {
        double w_lo = std::numeric_limits<double>::infinity(), w_hi = 0;
        for (double w : cfg_->class_weight) {
            w = w > 0 ? w : 1.0;
            w_lo = std::min(w_lo, w);
            w_hi = std::max(w_hi, w);
        }
        classes = w_hi / w_lo;
    }
    return classes * base_hi_ / base_lo_;
}

/* Whether f (its base_ratio set, its links not yet counted) keeps the solver's precision
   bound; `busiest` is the most flows one of its links will carry with it, `link` that
   link's name. Strict classes are spread again over a smaller range when needed. */
bool Driver::admit(const Flow* f, int busiest, const std::string& link)
{
    char msg[600];
    if (busiest > kMaxFlowsPerLink) {
        std::snprintf(msg, sizeof msg,
                      "net simgrid: flow %llu would be flow %d on link '%s' at once; with network priority classes "
                      "kvsim allows at most %d (SimGrid's solver rounds sums over more flows beyond its precision)",
                      (unsigned long long)f->id, busiest, link.c_str(), kMaxFlowsPerLink);
        fail(KV_EFAIL, msg);
        return false;
    }
    double lo = std::min(base_lo_, f->base_ratio), hi = std::max(base_hi_, f->base_ratio);
    double bucket = n_bucket_;
    while (bucket < busiest)
        bucket *= 2;
    if (cfg_->priority == KV_PRIO_STRICT) {
        double range = std::min(strict_range_, headroom_ / (bucket * hi / lo));
        if (range < kMinStrictRange) {
            std::snprintf(msg, sizeof msg,
                          "net simgrid: flow %llu would be flow %d on link '%s' at once; strict priority classes "
                          "would then be less than %g apart in SimGrid's solver (its maxmin/precision %g)",
                          (unsigned long long)f->id, busiest, link.c_str(), kMinStrictRange, precision_);
            fail(KV_EFAIL, msg);
            return false;
        }
        if (range < strict_range_) {
            strict_range_ = range;
            classes_moved_ = true;
        }
    } else {
        double spread = weight_spread() / (base_hi_ / base_lo_) * (hi / lo);
        if (spread * bucket > headroom_) {
            std::snprintf(msg, sizeof msg,
                          "net simgrid: flow %llu would be flow %d on link '%s' at once; network.class_weights "
                          "%g apart (x %g for path latencies) are then beyond SimGrid's solver precision "
                          "(maxmin/precision %g): at most %g flows per link",
                          (unsigned long long)f->id, busiest, link.c_str(), spread / (hi / lo), hi / lo,
                          precision_, std::floor(headroom_ / spread));
            fail(KV_EFAIL, msg);
            return false;
        }
    }
    base_lo_ = lo;
    base_hi_ = hi;
    n_bucket_ = bucket;
    return true;
}

/* SimGrid's CM02 penalty of a flow relative to the reference (first) flow's, which orders
   flows inside one class; kept within [1/kMaxBaseRatio, kMaxBaseRatio]. */
double Driver::base_ratio(const Flow* f, double route_latency_s)
{
    double base = route_latency_s;
    if (weight_s_ > 0)
        for (int l : *f->links)
            base += weight_s_ / platform_.links[(size_t)l]->get_bandwidth();
    if (!(base > 0))
        base = 1.0;
    if (reference_base_ == 0)
        reference_base_ = base;
    return std::min(kMaxBaseRatio, std::max(1.0 / kMaxBaseRatio, base / reference_base_));
}

/* The action was created by this request; it is the newest one of the model. */
void Driver::find_action(Flow* f)
{
    if (model_ == nullptr)
        return;
    auto* set = model_->get_started_action_set();
    const void* impl = f->comm->get_impl();
    for (auto it = set->rbegin(); it != set->rend(); ++it) {
        if (static_cast<const void*>(it->get_activity()) == impl) {
            f->action = &*it;
            break;
        }
    }
}

void Driver::set_priority(Flow* f)
{
    if (f->action == nullptr) {
        fail(KV_EFAIL, "net simgrid: cannot find the network action of flow " + std::to_string(f->id));
        return;
    }
    std::vector<std::pair<Action*, double>> updates;
    if (cfg_->priority == KV_PRIO_STRICT && f->priority > max_class_) {
        /* A new lowest class: spread the classes again over the whole range. */
        max_class_ = f->priority;
        classes_moved_ = true;
    }
    if (classes_moved_) {
        for (const Flow* g : active_)
            if (g != f && g->action && !g->latency_due)
                updates.emplace_back(g->action, penalty(g));
        classes_moved_ = false;
    }
    if (f->action->get_type() == ActionHeap::Type::latency) {
        f->latency_due = true;
        pending_.push_back(f);
    } else {
        updates.emplace_back(f->action, penalty(f));
    }
    if (!updates.empty())
        simgrid::kernel::actor::simcall_answered([&updates] {
            for (auto& [action, p] : updates)
                action->set_sharing_penalty(p);
        });
}

void Driver::start(const kv_sg_request& rq)
{
    if (error_code_ != KV_OK)
        return; /* the run already failed; the next answer says why */
    if (!wait_until(rq.t_s)) {
        fail(KV_EFAIL, "net simgrid: flow " + std::to_string(rq.id) +
                           " starts after a completion that was not reported; advance to its start time first");
        return;
    }
    std::unique_ptr<Flow> owned;
    if (spare_.empty()) {
        owned = std::make_unique<Flow>();
    } else {
        owned = std::move(spare_.back());
        spare_.pop_back();
    }
    Flow* f = owned.get();
    f->id = rq.id;
    f->tag = rq.tag;
    f->bytes = rq.bytes;
    f->priority = rq.priority;
    sg4::Host* src = platform_.hosts[(size_t)rq.src];
    sg4::Host* dst = platform_.hosts[(size_t)rq.dst];
    const Route& route = route_of(rq.src, rq.dst);
    double latency = route.latency;
    int busiest = 0;
    const std::string* busiest_name = &no_link_;
    f->links = &route.links;
    for (int l : route.links) {
        if (uses_[(size_t)l].flows + 1 > busiest) {
            busiest = uses_[(size_t)l].flows + 1;
            busiest_name = &platform_.links[(size_t)l]->get_name();
        }
    }
    f->level = rq.level;
    f->weight = rq.weight > 0 ? rq.weight : 1.0;
    f->base_ratio = base_ratio(f, latency); /* no effect on SimGrid until a penalty is set */
    if (rq.has_level && !levels_) {
        if (!lmm_ok_) {
            fail(KV_EFAIL, "net simgrid: per-flow priority levels need an LMM network model (CM02, LV08, SMPI) "
                           "with network/optim:Lazy");
            return;
        }
        levels_ = true; /* from now on every flow is placed by its level and weight */
        for (Flow* g : active_) {
            w_ref_ = std::max(w_ref_, g->weight);
            w_lo_ = w_lo_ == 0 ? g->weight : std::min(w_lo_, g->weight);
            if (g->action && !g->latency_due && g->action->get_type() == ActionHeap::Type::latency) {
                g->latency_due = true;
                pending_.push_back(g);
            }
        }
    }
    if (levels_) {
        if (!start_levels(f, busiest, *busiest_name))
            return;
    } else if (cfg_->priority != KV_PRIO_NONE) {
        if (!admit(f, busiest, *busiest_name))
            return; /* never handed to SimGrid; the run fails with the next answer */
    }
    for (int l : *f->links) {
        LinkUse& u = uses_[(size_t)l];
        if (u.flows++ == 0)
            u.since_s = now_;
    }
    try {
        f->comm = sg4::Comm::sendto_async(src, dst, rq.bytes);
    } catch (const std::exception& e) {
        fail(KV_EFAIL, std::string("net simgrid: starting a flow: ") + e.what());
        return;
    }
    find_action(f);
    if (f->action == nullptr) { /* note_completion follows every flow by its action */
        f->comm->cancel();
        cancelled_.push_back(f->comm);
        for (int l : *f->links)
            uses_[(size_t)l].flows--;
        fail(KV_EFAIL, "net simgrid: cannot find the network action of flow " + std::to_string(f->id));
        return;
    }
    f->slot = active_.size();
    active_.push_back(f);
    flows_.emplace(f->id, std::move(owned));
    if (f->action->get_type() == ActionHeap::Type::latency) {
        f->in_latency = true;
        latent_.push_back(f);
    }
    if (levels_) {
        if (f->action->get_type() == ActionHeap::Type::latency) {
            f->latency_due = true; /* placed when its latency is paid (apply_pending_penalties) */
            pending_.push_back(f);
        } else {
            relevel_now();
        }
    } else if (cfg_->priority != KV_PRIO_NONE) {
        set_priority(f);
    }
}

/* Levels mode: the precision bound of the design notes for f (base_ratio set, links not yet
   counted); the penalty range between levels is what the bound leaves (relevel). */
bool Driver::start_levels(Flow* f, int busiest, const std::string& link)
{
    char msg[600];
    if (busiest > kMaxFlowsPerLink) {
        std::snprintf(msg, sizeof msg,
                      "net simgrid: flow %llu would be flow %d on link '%s' at once; with priority levels kvsim "
                      "allows at most %d (SimGrid's solver rounds sums over more flows beyond its precision)",
                      (unsigned long long)f->id, busiest, link.c_str(), kMaxFlowsPerLink);
        fail(KV_EFAIL, msg);
        return false;
    }
    double lo = std::min(base_lo_, f->base_ratio), hi = std::max(base_hi_, f->base_ratio);
    double w_hi = std::max(w_ref_, f->weight), w_lo = w_lo_ == 0 ? f->weight : std::min(w_lo_, f->weight);
    double bucket = n_bucket_;
    while (bucket < busiest)
        bucket *= 2;
    if (kMinLevelRange * bucket * (hi / lo) * (w_hi / w_lo) > headroom_) {
        std::snprintf(msg, sizeof msg,
                      "net simgrid: flow %llu would be flow %d on link '%s' at once; flow weights %g apart "
                      "(x %g for path latencies) are then beyond SimGrid's solver precision (maxmin/precision %g)",
                      (unsigned long long)f->id, busiest, link.c_str(), w_hi / w_lo, hi / lo, precision_);
        fail(KV_EFAIL, msg);
        return false;
    }
    base_lo_ = lo;
    base_hi_ = hi;
    w_ref_ = w_hi;
    w_lo_ = w_lo;
    n_bucket_ = bucket;
    return true;
}

void Driver::relevel_now()
{
    simgrid::kernel::actor::simcall_answered([this] { relevel(); });
}

/* Levels mode, run whenever the flows on the links change (a start after its latency, a
   completion, a cancel): strict priority by a layered max-min on the link bandwidths. Level by
   level (0 first), a flow is held (its action suspended: rate 0) when a link of its route has
   less than kLevelEps of its bandwidth left by the higher levels; the level's other flows share
   what is left in proportion to weight / base_ratio, which is subtracted before the next level.
   The flows not held get penalties base_ratio x (w_ref / weight) x range^(rank / (k - 1)),
   rank the dense rank of their level among the k levels not held: SimGrid's solver then gives a
   lower level only what the higher ones leave, up to range^(-1/(k-1)) where both would saturate
   the same link (docs/network.md "Per-flow priority"). Maestro context. */
void Driver::relevel()
{
    std::vector<Flow*> ready;
    for (Flow* f : active_)
        if (f->action && !f->latency_due && f->action->get_state() == Action::State::STARTED)
            ready.push_back(f);
    std::sort(ready.begin(), ready.end(),
              [](const Flow* a, const Flow* b) { return a->level != b->level ? a->level < b->level : a->id < b->id; });
    size_t n_links = platform_.links.size();
    std::vector<double> left(n_links), sumw(n_links, 0.0), used(n_links, 0.0);
    for (size_t l = 0; l < n_links; l++)
        left[l] = platform_.links[l]->get_bandwidth();
    std::vector<bool> hold(ready.size(), false), fixed(ready.size(), false);
    std::vector<int> ranks;
    for (size_t i = 0; i < ready.size();) {
        size_t j = i;
        while (j < ready.size() && ready[j]->level == ready[i]->level)
            j++;
        size_t live = 0;
        for (size_t k = i; k < j; k++) {
            for (int l : *ready[k]->links)
                if (left[(size_t)l] <= kLevelEps * platform_.links[(size_t)l]->get_bandwidth())
                    hold[k] = true;
            if (!hold[k]) {
                live++;
                for (int l : *ready[k]->links)
                    sumw[(size_t)l] += ready[k]->weight / ready[k]->base_ratio;
            } else {
                fixed[k] = true;
            }
        }
        if (live > 0)
            ranks.push_back(ready[i]->level);
        /* Weighted progressive filling of the live flows on what is left. */
        for (size_t done = 0; done < live;) {
            double t_min = std::numeric_limits<double>::infinity();
            int l_min = -1;
            for (size_t k = i; k < j; k++) {
                if (fixed[k])
                    continue;
                for (int l : *ready[k]->links) {
                    double t = (left[(size_t)l] - used[(size_t)l]) / sumw[(size_t)l];
                    if (t < t_min || (t == t_min && l < l_min)) {
                        t_min = t;
                        l_min = l;
                    }
                }
            }
            if (l_min < 0)
                break;
            t_min = std::max(t_min, 0.0);
            for (size_t k = i; k < j; k++) {
                if (fixed[k] || std::find(ready[k]->links->begin(), ready[k]->links->end(), l_min) == ready[k]->links->end())
                    continue;
                double w = ready[k]->weight / ready[k]->base_ratio;
                fixed[k] = true;
                done++;
                for (int l : *ready[k]->links) {
                    used[(size_t)l] += w * t_min;
                    sumw[(size_t)l] -= w;
                }
            }
        }
        for (size_t l = 0; l < n_links; l++) {
            left[l] -= used[l];
            used[l] = 0;
            sumw[l] = 0;
        }
        i = j;
    }
    double range = std::min(kStrictRange, headroom_ / (n_bucket_ * (base_hi_ / base_lo_) * (w_ref_ / w_lo_)));
    double steps = ranks.size() > 1 ? (double)(ranks.size() - 1) : 1.0;
    for (size_t k = 0; k < ready.size(); k++) {
        Flow* f = ready[k];
        if (hold[k]) {
            if (!f->held) {
                f->action->suspend();
                f->held = true;
            }
            continue;
        }
        if (f->held) {
            f->action->resume();
            f->action->set_last_update(); /* nothing moved while held */
            f->action->set_last_value(0);
            f->held = false;
        }
        size_t rank = (size_t)(std::lower_bound(ranks.begin(), ranks.end(), f->level) - ranks.begin());
        double p = f->base_ratio * kPenaltyScale * (w_ref_ / f->weight) * std::pow(range, (double)rank / steps);
        /* Only a change: with lazy updates set_sharing_penalty takes the action off the completion heap, and an
           unchanged penalty does not mark its variable for the next solve, so nothing would put it back and the
           flow would never complete (SimGrid then stops: "Deadlock detected"). */
        if (p != f->level_penalty) {
            f->action->set_sharing_penalty(p);
            f->level_penalty = p;
        }
    }
}

/* The route between hosts src and dst (indices, in range): SimGrid's route_to the first time, then the copy. */
const Route& Driver::route_of(int src, int dst)
{
    uint64_t key = (uint64_t)src * platform_.hosts.size() + (uint64_t)dst;
    auto it = routes_.find(key);
    if (it != routes_.end())
        return it->second;
    Route r;
    std::vector<sg4::Link*> links;
    platform_.hosts[(size_t)src]->route_to(platform_.hosts[(size_t)dst], links, &r.latency);
    for (const sg4::Link* l : links) {
        auto at = link_index_.find(l);
        if (at != link_index_.end())
            r.links.push_back(at->second); /* else not a link kvsim reports (none expected) */
    }
    return routes_.emplace(key, std::move(r)).first->second;
}

void Driver::route(const kv_sg_request& rq)
{
    std::vector<uint32_t> out;
    if (rq.src < 0 || rq.dst < 0 || (size_t)rq.src >= platform_.hosts.size() || (size_t)rq.dst >= platform_.hosts.size()) {
        fail(KV_EFAIL, "net simgrid: route of hosts out of range");
    } else {
        for (int l : route_of(rq.src, rq.dst).links)
            out.push_back((uint32_t)l);
    }
    reply_status((uint32_t)out.size(), out.data(), out.size() * sizeof(uint32_t));
}

/* Every link now: the flows on it, the sum of their solver rates (0 while a flow pays its latency
   or is held) and the bytes they have left (lazy updates: as of the last update, less what the
   last rate moved since). Nothing in SimGrid is changed. */
void Driver::link_state()
{
    std::vector<kv_link_state> out(platform_.links.size());
    std::vector<double> rate(out.size(), 0.0), left(out.size(), 0.0);
    double now = sg4::Engine::get_clock();
    for (const Flow* f : active_) {
        double r = 0, rem = (double)f->bytes;
        if (f->action != nullptr) {
            r = f->action->get_rate();
            rem = f->action->get_remains_no_update();
            if (lmm_ok_ && !f->held)
                rem -= f->action->get_last_value() * (now - f->action->get_last_update());
        } else {
            rem = f->comm->get_remaining();
        }
        rem = std::min(std::max(std::ceil(rem), 0.0), (double)f->bytes);
        for (int l : *f->links) {
            out[(size_t)l].flows++;
            rate[(size_t)l] += r;
            left[(size_t)l] += rem;
        }
    }
    for (size_t i = 0; i < out.size(); i++) {
        double c = platform_.links[i]->get_bandwidth();
        out[i].capacity_gbps = c * 8.0 / 1e9;
        out[i].rate_gbps = rate[i] * 8.0 / 1e9;
        out[i].utilisation = c > 0 ? std::min(1.0, rate[i] / c) : 0.0;
        out[i].bytes_in_flight = (uint64_t)left[i];
    }
    reply_status((uint32_t)out.size(), out.data(), out.size() * sizeof(kv_link_state));
}

/* Removes f from the active set, closes its link intervals at time t, frees it. */
void Driver::finish(Flow* f, double t, uint64_t bytes_crossed)
{
    for (int l : *f->links) {
        LinkUse& u = uses_[(size_t)l];
        u.bytes += bytes_crossed;
        if (--u.flows == 0)
            u.busy_s += t - u.since_s;
    }
    size_t last = active_.size() - 1;
    active_[f->slot] = active_[last];
    active_[f->slot]->slot = f->slot;
    active_.pop_back();
    if (f->latency_due)
        pending_.erase(std::find(pending_.begin(), pending_.end(), f));
    if (f->in_latency)
        latent_.erase(std::find(latent_.begin(), latent_.end(), f));
    auto it = flows_.find(f->id);
    *f = Flow{}; /* drops its comm */
    spare_.push_back(std::move(it->second));
    flows_.erase(it);
}

void Driver::cancel(const kv_sg_request& rq)
{
    auto it = flows_.find(rq.id);
    uint32_t not_active = 0; /* answered as count = 1: the caller's mistake, not a failure */
    if (it == flows_.end()) {
        not_active = 1;
    } else {
        Flow* f = it->second.get();
        double remaining = f->comm->get_remaining();
        uint64_t crossed = remaining >= (double)f->bytes ? 0 : f->bytes - (uint64_t)std::ceil(remaining);
        f->comm->cancel();
        cancelled_.push_back(f->comm);
        finish(f, now_, crossed);
        if (levels_)
            relevel_now();
    }
    reply_status(not_active, nullptr, 0);
}

/* The flows whose comm completed at the current date (note_completion saw them end), in start (id)
   order. SimGrid marked each comm finished on its s4u side (it does for comms maestro started). */
void Driver::collect_done(std::vector<Flow*>* done)
{
    done->insert(done->end(), ended_.begin(), ended_.end());
    ended_.clear();
    std::sort(done->begin(), done->end(), [](const Flow* a, const Flow* b) { return a->id < b->id; });
}

/* Moves the flows of latent_ whose latency is paid out of it, noting the clock (called at each solver
   step and after each wait, so a latency paid at the step that ended a wait is seen at that date
   whether SimGrid calls the hook before or after it updates its actions). */
void Driver::note_latency_paid()
{
    for (size_t i = 0; i < latent_.size();) {
        Flow* f = latent_[i];
        if (f->action->get_type() == ActionHeap::Type::latency) {
            i++;
            continue;
        }
        f->in_latency = false;
        latent_[i] = latent_.back();
        latent_.pop_back();
        latency_paid_at_ = sg4::Engine::get_clock();
    }
}

/* The horizon after a wait that ended on its timeout: the date of SimGrid's next event (a completion
   or a latency paid) less twice precision/timing (SimGrid handles events that close to the clock
   at once), when that date is sure: a lazy LMM model, no flow held (levels), and nothing changed in
   the solver's system since its last solve. The solver runs at every step before the clock moves,
   so only a change at the step that ended the wait could be missed: a latency paid there (its flow
   joins the solve and gets its penalty; latency_paid_at_ is then the clock). A flow still paying its
   latency is fine: its variable is out of the solve and the date it joins is in the heap. Until the
   horizon, with no flow started or cancelled, an ADVANCE ends on its timeout with no completion and
   changes nothing in SimGrid but its clock (sg_proto.h); -inf otherwise. */
double Driver::horizon_after_timeout() const
{
    if (!lmm_ok_ || precision_timing_ < 0 || model_->get_action_heap().empty() ||
        !(latency_paid_at_ < sg4::Engine::get_clock()))
        return -INFINITY;
    for (const Flow* f : active_)
        if (f->action == nullptr || f->held)
            return -INFINITY;
    for (const Flow* f : pending_)
        if (f->action->get_type() != ActionHeap::Type::latency)
            return -INFINITY; /* its penalty is still to be set */
    double top = model_->get_action_heap().top_date();
    double h = top - 2 * precision_timing_;
    return h > now_ ? h : -INFINITY;
}

void Driver::advance(double t_limit)
{
    std::vector<Flow*>& done = done_;
    done.clear();
    if (error_code_ != KV_OK) {
        reply_status(0, nullptr, 0); /* a request failed: the run stops here */
        return;
    }
    if (t_limit > now_) {
        if (active_.empty()) {
            if (std::isfinite(t_limit))
                wait_until(t_limit);
        } else {
            double clock = sg4::Engine::get_clock();
            bool ended = run_to(std::isfinite(t_limit) ? clock + exact_delta(clock, t_limit) : -1.0);
            if (ended)
                collect_done(&done);
            if (done.empty() && !std::isfinite(t_limit)) {
                fail(KV_EFAIL, "net simgrid: " + std::to_string(active_.size()) +
                                   " flows in flight and none can complete (SimGrid has no next event)");
                reply_status(0, nullptr, 0);
                return;
            }
            if (done.empty()) {
                now_ = t_limit;
                note_latency_paid();
                horizon_ = horizon_after_timeout();
            } else {
                /* SimGrid's completion date, kept inside [now_, t_limit] against 1-ulp drift. */
                now_ = std::min(std::max(sg4::Engine::get_clock(), now_), t_limit);
            }
        }
    } else if (!ended_.empty()) {
        collect_done(&done); /* completions exactly at now_ not yet reported */
    }
    std::vector<kv_sg_done>& items = done_items_;
    items.clear();
    for (Flow* f : done) {
        items.push_back({f->id, f->tag, now_});
        finish(f, now_, f->bytes);
    }
    if (levels_ && !done.empty())
        relevel_now();
    reply_status((uint32_t)items.size(), items.data(), items.size() * sizeof(kv_sg_done));
}

void Driver::stats()
{
    std::vector<kv_link_stats> out(platform_.links.size());
    for (size_t i = 0; i < out.size(); i++) {
        const sg4::Link* l = platform_.links[i];
        const LinkUse& u = uses_[i];
        std::snprintf(out[i].name, sizeof out[i].name, "%s", l->get_cname());
        out[i].bytes = u.bytes;
        out[i].busy_s = u.busy_s + (u.flows > 0 ? now_ - u.since_s : 0.0);
        out[i].bandwidth_gbps = l->get_bandwidth() * 8.0 / 1e9;
    }
    reply_status((uint32_t)out.size(), out.data(), out.size() * sizeof(kv_link_stats));
}

void Driver::send_ready()
{
    kv_sg_reply ready{};
    ready.code = KV_OK;
    ready.count = (uint32_t)platform_.links.size();
    reply(ready, nullptr, 0, "");
}

void Driver::serve()
{
    send_ready();
    for (;;) {
        kv_sg_request rq;
        read_buffered(fd_, &in_, &rq, sizeof rq);
        dispatch(rq);
    }
}

/* One request, from the socket (serve) or from kvsim in this process (kv_sg_local_send): the same
   code computes both, so both give the same bytes. */
void Driver::dispatch(const kv_sg_request& rq)
{
    switch (rq.op) {
    case KV_SG_START:
        start(rq);
        break;
    case KV_SG_SYNC:
        if (error_code_ == KV_OK && !wait_until(rq.t_s))
            fail(KV_EFAIL, "net simgrid: a flow completed before the time kvsim moved to without asking "
                           "(t_next_s was wrong)");
        break;
    case KV_SG_CANCEL:
        cancel(rq);
        break;
    case KV_SG_ADVANCE:
        advance(rq.t_s);
        break;
    case KV_SG_STATS:
        stats();
        break;
    case KV_SG_ROUTE:
        route(rq);
        break;
    case KV_SG_LINKSTATE:
        link_state();
        break;
    default:
        _exit(3);
    }
}

void send_error(int fd, int code, const kvsg::Error& err)
{
    kv_sg_reply h{};
    h.code = code;
    h.msg_len = (uint32_t)err.msg.size();
    std::snprintf(h.key, sizeof h.key, "%s", err.key.c_str());
    write_all(fd, &h, sizeof h);
    write_all(fd, err.msg.data(), err.msg.size());
}

/* SimGrid's routing can crash on a missing route (its Dijkstra zones dereference it;
   Floyd throws, Full returns an empty route). While routes are checked, a crash sends
   the answer prepared for the pair being checked. A signal handler has no other way to
   its data: this is the child's only global state, set before each route_to. */
struct RouteGuard {
    int fd;          /* the socket to kvsim */
    kv_sg_reply head; /* the answer: KV_EINPUT, msg_len, key */
    char msg[800];   /* its message */
};
RouteGuard route_guard;

extern "C" void route_crashed(int)
{
    ssize_t r = write(route_guard.fd, &route_guard.head, sizeof route_guard.head);
    if (r == (ssize_t)sizeof route_guard.head)
        r = write(route_guard.fd, route_guard.msg, route_guard.head.msg_len);
    (void)r;
    _exit(0);
}

/* "host 'A' (prefill node i) to host 'B' (decode node j)" */
std::string pair_name(const kv_net_config* cfg, const std::vector<sg4::Host*>& hosts, int i, int j)
{
    return "host '" + hosts[(size_t)i]->get_name() + "' (prefill node " + std::to_string(i) + ") to host '" +
           hosts[(size_t)j]->get_name() + "' (decode node " + std::to_string(j - cfg->prefill_hosts) + ")";
}

/* Prepares the answer route_crashed sends if SimGrid crashes routing this pair. */
void guard_pair(const kv_net_config* cfg, const std::vector<sg4::Host*>& hosts, int i, int j)
{
    int n = std::snprintf(route_guard.msg, sizeof route_guard.msg,
                          "%s: SimGrid cannot route %s: its routing crashed on this platform",
                          cfg->platform_file, pair_name(cfg, hosts, i, j).c_str());
    route_guard.head.msg_len = (uint32_t)std::min<size_t>((size_t)std::max(n, 0), sizeof route_guard.msg - 1);
}

/* A platform file must route every prefill host to every decode host (SimGrid aborts on
   the first transfer otherwise); with network/crosstraffic the way back is looked up too. */
int check_routes(const kv_net_config* cfg, const std::vector<sg4::Host*>& hosts, int fd, kvsg::Error* err)
{
    if (cfg->topology != KV_TOPO_PLATFORM || cfg->prefill_hosts <= 0)
        return KV_OK;
    bool cross = simgrid::config::get_value<bool>("network/crosstraffic");
    route_guard.fd = fd;
    route_guard.head = kv_sg_reply{};
    route_guard.head.code = KV_EINPUT;
    std::snprintf(route_guard.head.key, sizeof route_guard.head.key, "network.platform_file");
    struct sigaction sa {};
    sa.sa_handler = route_crashed;
    const int sigs[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE};
    struct sigaction old[4];
    for (int k = 0; k < 4; k++)
        sigaction(sigs[k], &sa, &old[k]);
    int rc = KV_OK;
    for (int i = 0; rc == KV_OK && i < cfg->prefill_hosts; i++) {
        for (int j = cfg->prefill_hosts; rc == KV_OK && j < cfg->hosts; j++) {
            guard_pair(cfg, hosts, i, j);
            for (int back = 0; back <= (cross ? 1 : 0); back++) {
                std::vector<sg4::Link*> route;
                double latency = 0;
                bool none = false;
                try {
                    if (back)
                        hosts[(size_t)j]->route_to(hosts[(size_t)i], route, &latency);
                    else
                        hosts[(size_t)i]->route_to(hosts[(size_t)j], route, &latency);
                    /* SimGrid's own test before it aborts a transfer (the way back may be empty). */
                    none = !back && route.empty() && !(latency > 0);
                } catch (const std::exception&) {
                    none = true;
                }
                if (none) {
                    err->key = "network.platform_file";
                    err->msg = std::string(cfg->platform_file) +
                               (back ? ": no return route (network/crosstraffic needs one) for " : ": no route from ") +
                               pair_name(cfg, hosts, i, j);
                    rc = KV_EINPUT;
                    break;
                }
            }
        }
    }
    for (int k = 0; k < 4; k++)
        sigaction(sigs[k], &old[k], nullptr);
    return rc;
}

} // namespace

/* In-child mode: the driver seen from kvsim's C side in the same process (sg_proto.h). */
struct kv_sg_local {
    Driver* driver;
    std::vector<char> replies; /* answers not yet read by sg_net.c: [pos, size) */
    size_t pos = 0;
};

namespace {

/* The child's life in both modes (kv_sg_child_main: body NULL, serve the socket; kv_sg_child_run). */
void child(const kv_net_config* cfg, int fd, int log_fd, kv_sg_body_fn body, void* arg)
{
    char name[] = "kvsim-net";
    char quiet[] = "--log=xbt_cfg.thres:warning"; /* no "Configuration change" line in SimGrid's log */
    char* argv[] = {name, quiet, nullptr};
    int argc = body == nullptr ? 1 : 2;
    argv[argc] = nullptr;
    /* SimGrid flushes stdout and stderr at every run_until (two or three per flow). Only this
       thread writes to them here (the CPU backend's helper threads never print), so their locks
       go: an uncontended lock costs as much as the flush of an empty stream. */
    __fsetlocking(stdout, FSETLOCKING_BYCALLER);
    __fsetlocking(stderr, FSETLOCKING_BYCALLER);
    try {
        sg4::Engine engine(&argc, argv);
        kvsg::Platform platform;
        kvsg::Error err;
        int rc = kvsg::build_platform(cfg, engine, &platform, &err);
        if (rc == KV_OK)
            rc = check_routes(cfg, platform.hosts, fd, &err);
        if (rc != KV_OK) {
            send_error(fd, rc, err);
            _exit(0);
        }
        engine.seal_platform(); /* comms start from maestro before the first run_until */
        Driver driver(cfg, fd, std::move(platform));
        rc = driver.prepare(&err);
        if (rc != KV_OK) {
            send_error(fd, rc, err);
            _exit(0);
        }
        kv_sg_local local;
        local.driver = &driver;
        if (body == nullptr) {
            driver.serve(); /* until kvsim closes the socket */
        } else {
            if (log_fd >= 0) {
                /* SimGrid's words stay in the file kvsim reads when the child fails (body gives the
                   run kvsim's own stderr back); unbuffered, so an abort loses none of them. */
                FILE* log = fdopen(dup(log_fd), "a");
                if (log != nullptr) {
                    setvbuf(log, nullptr, _IONBF, 0);
                    xbt_log_appender_set(&_XBT_LOGV(XBT_LOG_ROOT_CAT), xbt_log_appender_stream(log));
                }
            }
            driver.send_ready();
            driver.set_local(&local.replies);
            body(arg, &local); /* the whole run, here in maestro */
        }
        _exit(0); /* body ends the process itself; never tear SimGrid down */
    } catch (const std::exception& e) {
        send_error(fd, KV_EFAIL, kvsg::Error{"", std::string("net simgrid: ") + e.what()});
    }
    _exit(0);
}

} // namespace

extern "C" void kv_sg_child_main(const kv_net_config* cfg, int fd)
{
    child(cfg, fd, -1, nullptr, nullptr);
}

extern "C" void kv_sg_child_run(const kv_net_config* cfg, int fd, int log_fd, kv_sg_body_fn body, void* arg)
{
    child(cfg, fd, log_fd, body, arg);
}

extern "C" int kv_sg_local_configure(kv_sg_local* l, const kv_net_config* cfg, uint32_t* links, char* key,
                                     size_t key_size, char* msg, size_t msg_size)
{
    kvsg::Error err;
    int rc = l->driver->configure(cfg, &err);
    *links = l->driver->link_count();
    std::snprintf(key, key_size, "%s", rc == KV_OK ? "" : err.key.c_str());
    std::snprintf(msg, msg_size, "%s", rc == KV_OK ? "" : err.msg.c_str());
    return rc;
}

extern "C" void kv_sg_local_send(kv_sg_local* l, const kv_sg_request* rq, size_t n)
{
    try {
        for (size_t i = 0; i < n; i++)
            l->driver->dispatch(rq[i]);
    } catch (const std::exception& e) {
        /* Nothing may unwind through kvsim's C frames: the run ends here, as a crash of the child would. */
        send_error(l->driver->socket(), KV_EFAIL, kvsg::Error{"", std::string("net simgrid: ") + e.what()});
        _exit(0);
    }
}

extern "C" int kv_sg_local_read(kv_sg_local* l, void* buf, size_t n)
{
    if (l->replies.size() - l->pos < n)
        return -1;
    std::memcpy(buf, l->replies.data() + l->pos, n);
    l->pos += n;
    if (l->pos == l->replies.size()) {
        l->replies.clear();
        l->pos = 0;
    }
    return 0;
}
