/* policy_report.c — failure reports of the policy host: what was called, where, and which limit or
 * answer failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "core/base/alloc.h"
#include "core/policy/policy_internal.h"
#include "core/policy/policy_sandbox.h"

/* --- reporting ------------------------------------------------------------- */

static void describe_call(const kv_policy *p, char *buf, size_t size)
{
    const kv_policy_call *c = &p->cur;
    int off = c->r ? snprintf(buf, size, "request %llu", (unsigned long long)c->r->id)
                   : snprintf(buf, size, "no request");
    if (off < 0 || (size_t)off >= size)
        return;
    switch (c->hook) {
    case H_ENCODE:
        snprintf(buf + off, size - (size_t)off, ", layer %d, head %d", c->layer, c->head);
        break;
    case H_PREFILL_NODE:
    case H_DECODE_NODE:
        snprintf(buf + off, size - (size_t)off, ", %d %s nodes", c->n_nodes,
                 c->hook == H_PREFILL_NODE ? "prefill" : "decode");
        break;
    case H_ADMIT:
        snprintf(buf + off, size - (size_t)off, ", node %d, %.0f KV bytes needed", c->node->index,
                 c->kv_bytes_needed);
        break;
    default:
        break;
    }
}

/* "\n  scenario overrides: a=1 (x.yaml:3:5), ..." or "" */
static void describe_overrides(const kv_policy *p, char *buf, size_t size)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n_params && off < size; i++) {
        const policy_param *q = &p->params[i];
        if (!q->set_where)
            continue;
        off += (size_t)snprintf(buf + off, size - off, "%s%s=%s%s%s%s", off ? ", " : "\n  scenario overrides: ",
                                q->key, q->value, q->set_where[0] ? " (" : "", q->set_where,
                                q->set_where[0] ? ")" : "");
    }
}

/* "file:line" where the limit hit, or `fallback` when it is not known. */
const char *kv_policy_limit_where(const kv_policy *p, const char *fallback)
{
    return p->sb.where[0] && strcmp(p->sb.where, "?") != 0 ? p->sb.where : fallback;
}

/* Turns a failed or rejected hook call into err (the Lua error, if any, is on top). */
int kv_policy_hook_failure(kv_policy *p, int status, kv_error *err)
{
    lua_State *L = p->sb.L;
    const kv_policy_call *c = &p->cur;
    const char *hook = kv_policy_hook_names[c->hook];
    char call[160], over[400], cap[32], defined[4200];
    describe_call(p, call, sizeof call);
    describe_overrides(p, over, sizeof over);
    kv_sandbox_format_bytes(p->sb.lim.mem_cap_bytes, cap, sizeof cap);
    snprintf(defined, sizeof defined, "%s:%d", p->path, p->hook_line[c->hook]);
    bool refused = p->sb.mem_refused || p->sb.str_refused;
    if (status == LUA_ERRMEM && !refused && p->sb.limit == KV_SB_OK)
        return kv_error_set(err, KV_EFAIL, "policy '%s': out of host memory in hook '%s' (%s)", p->name, hook, call);
    /* Split "message\nstack traceback:..." without touching the Lua heap (it may be full). */
    size_t len = 0;
    const char *msg = status != LUA_OK && lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : "";
    const char *tb = strstr(msg, "\nstack traceback:");
    int msg_len = tb ? (int)(tb - msg) : (int)len;
    int tb_len = tb ? (int)(len - (size_t)(tb - msg)) : 0;
    static const char host_frame[] = "\n\t[C]: in ?"; /* the host's own frame ends every traceback */
    if (tb_len >= (int)sizeof host_frame - 1 &&
        memcmp(tb + tb_len - (sizeof host_frame - 1), host_frame, sizeof host_frame - 1) == 0)
        tb_len -= (int)sizeof host_frame - 1;
    if (!tb)
        tb = "";
    if (p->sb.limit == KV_SB_INSTRUCTIONS)
        return kv_error_set(err, KV_EINPUT,
                            "%s: policy '%s' used up its instruction budget (%d per call) in hook '%s' "
                            "(defined at %s), %s; is there an endless loop? (limit: policy_limits.instructions)"
                            "%s%.*s",
                            kv_policy_limit_where(p, defined), p->name, p->sb.call_instructions, hook, defined, call,
                            over, tb_len, tb);
    if (p->sb.limit != KV_SB_OK) {
        char what[300];
        kv_sandbox_describe_limit(&p->sb, what, sizeof what);
        return kv_error_set(err, KV_EINPUT, "%s: policy '%s' hit %s in hook '%s' (defined at %s), %s%s%.*s",
                            kv_policy_limit_where(p, defined), p->name, what, hook, defined, call, over, tb_len, tb);
    }
    if (status == LUA_ERRMEM || (refused && status == LUA_ERRERR)) {
        if (p->sb.last_refusal == 2) {
            char got[32], scap[32];
            kv_sandbox_format_bytes(p->sb.str_refused_bytes, got, sizeof got);
            kv_sandbox_format_bytes(p->sb.lim.string_cap_bytes, scap, sizeof scap);
            return kv_error_set(err, KV_EINPUT,
                                "%s: policy '%s' tried to make a string of %s, over its limit of %s per string "
                                "(policy_limits.string_kib), in hook '%s' (defined at %s), %s%s",
                                p->sb.where[0] ? p->sb.where : p->path, p->name, got, scap, hook, defined, call,
                                over);
        }
        return kv_error_set(err, KV_EINPUT,
                            "%s: policy '%s' exceeded its memory cap of %s in hook '%s' (defined at %s), %s%s",
                            p->sb.where[0] ? p->sb.where : p->path, p->name, cap, hook, defined, call, over);
    }
    if (status != LUA_OK)
        return kv_error_set(err, KV_EINPUT, "%.*s\n  in hook '%s' of policy '%s' (defined at %s), %s%s%.*s",
                            msg_len, msg, hook, p->name, defined, call, over, tb_len, tb);
    return kv_error_set(err, KV_EINPUT, "%s: hook '%s' of policy '%s' returned %s (%s)%s", defined, hook, p->name,
                        c->detail, call, over);
}

/* Calls hook cur.hook (cur filled by the caller); parses into cur.out. */
