/* policy_ctx.c — the tables a policy hook sees: strict and read-only tables, ctx and its fields, the call body. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "core/base/alloc.h"
#include "core/policy/policy_internal.h"
#include "core/policy/policy_sandbox.h"

/* Fields of ctx, per hook. request, context_length and the live fields (now, prefill_nodes, decode_nodes,
   route, state) are lazy: ctx's __index fills them on first read and notes the read (policy.c's cache). */
#define LIVE_FIELDS "now", "prefill_nodes", "decode_nodes", "route", "state"
static const char *const ctx_fields[H_COUNT][16] = {
    [H_ENCODE] = {"layer", "head", "model", "params", "policy", "request", "context_length", LIVE_FIELDS, NULL},
    [H_TRANSFER] = {"model", "params", "policy", "request", "context_length", LIVE_FIELDS, NULL},
    [H_SPECULATE] = {"model", "params", "policy", "request", "context_length", LIVE_FIELDS, NULL},
    [H_PREFILL_NODE] = {"nodes", "pool", "model", "params", "policy", "request", "context_length", LIVE_FIELDS,
                        NULL},
    [H_DECODE_NODE] = {"nodes", "pool", "model", "params", "policy", "request", "context_length", LIVE_FIELDS,
                       NULL},
    [H_ADMIT] = {"node", "kv_bytes_needed", "model", "params", "policy", "request", "context_length", LIVE_FIELDS,
                 NULL},
    [H_COMPLETE] = {"result", "model", "params", "policy", "request", "context_length", LIVE_FIELDS, NULL},
};

kv_policy *kv_policy_of(lua_State *L)
{
    return (kv_policy *)kv_sandbox_of(L);
}

/* --- strict and read-only tables ----------------------------------------- */

static int strict_error(lua_State *L, int t, const char *what)
{
    const char *keys[64];
    int n = kv_policy_table_keys(L, t, keys);
    char hint[512];
    const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (!key)
        return luaL_error(L, "%s has no field [%s]", what, luaL_tolstring(L, 2, NULL));
    kv_policy_suggest(key, keys, n, "fields", hint, sizeof hint);
    return luaL_error(L, "%s has no field '%s'%s", what, key, hint);
}

/* __index of request and node tables: every field is raw, so any miss is a typo. */
static int strict_index(lua_State *L)
{
    return strict_error(L, 1, lua_tostring(L, lua_upvalueindex(1)));
}

/* __index of the table behind a read-only view (reached only for missing
   keys): upvalue 1 is that table, 2 its name. */
static int ro_missing(lua_State *L)
{
    return strict_error(L, lua_upvalueindex(1), lua_tostring(L, lua_upvalueindex(2)));
}

static int ro_newindex(lua_State *L)
{
    return luaL_error(L, "%s is read-only (tried to set '%s')", lua_tostring(L, lua_upvalueindex(1)),
                      luaL_tolstring(L, 2, NULL));
}

/* __pairs of a read-only view: the real table (upvalue 1) in the sandbox's fixed key order. */
static int ro_pairs(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    kv_sandbox_push_pairs(L, -1);
    return 3;
}

/* Pushes a read-only view of the table at idx, named `what` in messages.
   Reads go proxy → real table through a table __index (no C call on the hot
   path); the real table itself gets a strict metatable, so reading a missing
   key is an error with a hint, also through a policy's own upvalue. */
void kv_policy_push_readonly(lua_State *L, int idx, const char *what)
{
    idx = lua_absindex(L, idx);
    if (!lua_getmetatable(L, idx)) {
        lua_createtable(L, 0, 2);
        lua_pushvalue(L, idx);
        lua_pushstring(L, what);
        lua_pushcclosure(L, ro_missing, 2);
        lua_setfield(L, -2, "__index");
        lua_pushstring(L, what);
        lua_setfield(L, -2, "__name");
        lua_setmetatable(L, idx);
    } else {
        lua_pop(L, 1);
    }
    lua_newtable(L);
    lua_createtable(L, 0, 5);
    lua_pushvalue(L, idx);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, what);
    lua_pushcclosure(L, ro_newindex, 1);
    lua_setfield(L, -2, "__newindex");
    lua_pushvalue(L, idx);
    lua_pushcclosure(L, ro_pairs, 1);
    lua_setfield(L, -2, "__pairs");
    lua_pushstring(L, what);
    lua_setfield(L, -2, "__name");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
}

int kv_policy_make_strict_mt(lua_State *L, const char *what)
{
    lua_createtable(L, 0, 2);
    lua_pushstring(L, what);
    lua_pushcclosure(L, strict_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, what);
    lua_setfield(L, -2, "__name");
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* --- ctx ------------------------------------------------------------------ */

/* t[k] = v on the table at the top of the stack. */
static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void push_request(lua_State *L, kv_policy *p, const kv_policy_request *r)
{
    lua_createtable(L, 0, 6);
    set_int(L, "id", (lua_Integer)r->id);
    set_int(L, "prompt_tokens", r->prompt_tokens);
    set_int(L, "output_tokens", r->output_tokens);
    set_num(L, "arrival_s", r->arrival_s);
    set_num(L, "prefill_start_s", r->prefill_start_s);
    set_num(L, "prefill_end_s", r->prefill_end_s);
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->request_mt_ref);
    lua_setmetatable(L, -2);
}

static void push_node(lua_State *L, kv_policy *p, const kv_policy_node *n)
{
    lua_createtable(L, 0, 7);
    set_int(L, "index", n->index);
    set_int(L, "queued", n->queued);
    set_int(L, "running", n->running);
    set_num(L, "kv_free_bytes", n->kv_free_bytes);
    set_num(L, "kv_used_bytes", n->kv_used_bytes);
    set_int(L, "incoming", n->incoming);
    set_num(L, "kv_reserved_bytes", n->kv_reserved_bytes);
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->node_mt_ref);
    lua_setmetatable(L, -2);
}


/* ctx.prefill_nodes / ctx.decode_nodes: the pool's nodes now, from the engine's view (empty without one). */
static void push_pool(lua_State *L, kv_policy *p, int pool)
{
    const kv_policy_node *nodes = NULL;
    int n = p->view.nodes ? p->view.nodes(p->view.user, pool, &nodes) : 0;
    lua_createtable(L, n > 0 ? n : 0, 0);
    for (int i = 0; i < n; i++) {
        push_node(L, p, &nodes[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

/* ctx.route: the links of the request's route now (empty without a view or a request). */
static void push_route(lua_State *L, kv_policy *p)
{
    kv_policy_link links[KV_POLICY_MAX_ROUTE];
    int n = p->view.route && p->cur.r ? p->view.route(p->view.user, p->cur.r->id, links, KV_POLICY_MAX_ROUTE) : 0;
    if (n > KV_POLICY_MAX_ROUTE)
        n = KV_POLICY_MAX_ROUTE;
    lua_createtable(L, n > 0 ? n : 0, 0);
    for (int i = 0; i < n; i++) {
        const kv_policy_link *l = &links[i];
        lua_createtable(L, 0, 6);
        set_num(L, "capacity_gbps", l->capacity_gbps);
        set_num(L, "rate_gbps", l->rate_gbps);
        set_num(L, "utilisation", l->utilisation);
        lua_pushinteger(L, l->flows);
        lua_setfield(L, -2, "flows");
        set_num(L, "bytes_in_flight", l->bytes_in_flight);
        set_num(L, "bytes_queued", l->bytes_queued);
        lua_rawgeti(L, LUA_REGISTRYINDEX, p->link_mt_ref);
        lua_setmetatable(L, -2);
        lua_rawseti(L, -2, i + 1);
    }
}

/* ctx.result of hook complete. */
static void push_result(lua_State *L, kv_policy *p, const kv_policy_finished *o)
{
    lua_createtable(L, 0, 10);
    set_num(L, "ttft_s", o->ttft_s);
    set_num(L, "ttft_spec_s", o->ttft_spec_s);
    set_num(L, "ttkt_s", o->ttkt_s);
    set_num(L, "tpot_s", o->tpot_s);
    set_num(L, "done_s", o->done_s);
    set_num(L, "anchor_bytes", o->anchor_bytes);
    set_num(L, "residual_bytes", o->residual_bytes);
    set_num(L, "bytes", o->anchor_bytes + o->residual_bytes);
    set_num(L, "bits", o->bits);
    set_int(L, "preemptions", o->preemptions);
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->result_mt_ref);
    lua_setmetatable(L, -2);
}

/* Pushes live field `key` (and notes the read), or returns false when key is not one. */
static bool push_live(lua_State *L, kv_policy *p, const char *key)
{
    if (strcmp(key, "now") == 0)
        lua_pushnumber(L, p->view.now ? p->view.now(p->view.user) : 0.0);
    else if (strcmp(key, "prefill_nodes") == 0)
        push_pool(L, p, 0);
    else if (strcmp(key, "decode_nodes") == 0)
        push_pool(L, p, 1);
    else if (strcmp(key, "route") == 0)
        push_route(L, p);
    else if (strcmp(key, "state") == 0)
        lua_rawgeti(L, LUA_REGISTRYINDEX, p->state_ref);
    else
        return false;
    p->cur.read_live = true;
    return true;
}

/* __index of ctx: fills the request-dependent and live fields on first read (and notes
   the read), answers nil for known-but-absent fields, errors on typos. */
int kv_policy_ctx_index(lua_State *L)
{
    kv_policy *p = kv_policy_of(L);
    const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    const char *const *fields = ctx_fields[p->cur.hook];
    if (key && strcmp(key, "request") == 0) {
        p->cur.read_request = true;
        if (!p->cur.r)
            return 0;
        push_request(L, p, p->cur.r);
        lua_pushvalue(L, -1);
        lua_setfield(L, 1, "request"); /* raw from now on (ctx has no __newindex) */
        return 1;
    }
    if (key && strcmp(key, "context_length") == 0) {
        p->cur.read_request = true;
        if (!p->cur.r)
            return 0;
        lua_pushinteger(L, p->cur.r->prompt_tokens);
        lua_pushvalue(L, -1);
        lua_setfield(L, 1, "context_length");
        return 1;
    }
    if (key && push_live(L, p, key)) {
        lua_pushvalue(L, -1);
        lua_setfield(L, 1, key); /* raw from now on: one view per call */
        return 1;
    }
    int n = 0;
    while (fields[n])
        n++;
    for (int i = 0; key && i < n; i++)
        if (strcmp(key, fields[i]) == 0)
            return 0; /* known field, absent in this call (e.g. ctx.model before a model is set) */
    char hint[512];
    if (!key)
        return luaL_error(L, "ctx has no field [%s] in hook '%s'", luaL_tolstring(L, 2, NULL),
                          kv_policy_hook_names[p->cur.hook]);
    kv_policy_suggest(key, fields, n, "fields", hint, sizeof hint);
    return luaL_error(L, "ctx has no field '%s' in hook '%s'%s", key, kv_policy_hook_names[p->cur.hook], hint);
}

static void build_model(lua_State *L, kv_policy *p)
{
    if (p->model_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, p->model_ref);
    p->model_ref = LUA_NOREF;
    lua_createtable(L, 0, 5);
    lua_pushstring(L, p->model.name ? p->model.name : "");
    lua_setfield(L, -2, "name");
    set_int(L, "layers", p->model.layers);
    set_int(L, "heads", p->model.heads);
    set_int(L, "kv_heads", p->model.kv_heads);
    set_int(L, "head_dim", p->model.head_dim);
    kv_policy_push_readonly(L, -1, "ctx.model");
    p->model_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    p->model_dirty = false;
}

static void push_ctx(lua_State *L, kv_policy *p)
{
    const kv_policy_call *c = &p->cur;
    lua_createtable(L, 0, 8);
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->params_ref);
    lua_setfield(L, -2, "params");
    if (p->model_ref != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, p->model_ref);
        lua_setfield(L, -2, "model");
    }
    lua_pushstring(L, p->name);
    lua_setfield(L, -2, "policy");
    switch (c->hook) {
    case H_ENCODE:
        lua_pushinteger(L, c->layer);
        lua_setfield(L, -2, "layer");
        lua_pushinteger(L, c->head);
        lua_setfield(L, -2, "head");
        break;
    case H_PREFILL_NODE:
    case H_DECODE_NODE:
        lua_pushstring(L, c->hook == H_PREFILL_NODE ? "prefill" : "decode");
        lua_setfield(L, -2, "pool");
        lua_createtable(L, c->n_nodes, 0);
        for (int i = 0; i < c->n_nodes; i++) {
            push_node(L, p, &c->nodes[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "nodes");
        break;
    case H_ADMIT:
        push_node(L, p, c->node);
        lua_setfield(L, -2, "node");
        lua_pushnumber(L, c->kv_bytes_needed);
        lua_setfield(L, -2, "kv_bytes_needed");
        break;
    case H_COMPLETE:
        push_result(L, p, c->outcome);
        lua_setfield(L, -2, "result");
        break;
    default:
        break;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->ctx_mt_ref);
    lua_setmetatable(L, -2);
}

/* Runs inside lua_pcall: calls the hook on a fresh ctx and parses its answer into cur.out. */
int kv_policy_call_body(lua_State *L)
{
    kv_policy *p = kv_policy_of(L);
    kv_policy_call *c = &p->cur;
    if (p->model_dirty)
        build_model(L, p);
    push_ctx(L, p);
    int ctx_idx = lua_gettop(L); /* kept below the call: placement answers are checked against ctx.nodes */
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->hook_ref[c->hook]);
    lua_pushvalue(L, ctx_idx);
    lua_call(L, 1, 1);
    int res = lua_gettop(L);
    if (c->hook == H_COMPLETE)
        return 0; /* told, not asked: its answer is ignored */
    if (lua_isnil(L, res)) {
        kv_policy_answer_bad(c, "nothing (nil); the hook must return an answer (or be removed to get the default)");
        return 0;
    }
    switch (c->hook) {
    case H_ENCODE:
        kv_policy_answer_encoding(L, c, res, c->out);
        break;
    case H_TRANSFER:
        kv_policy_answer_transfer(L, c, res, c->out);
        break;
    case H_SPECULATE:
        kv_policy_answer_speculate(L, c, res, c->out);
        break;
    case H_PREFILL_NODE:
    case H_DECODE_NODE:
        lua_getfield(L, ctx_idx, "nodes");
        kv_policy_answer_node(L, c, res, lua_gettop(L), c->out);
        break;
    case H_ADMIT:
        kv_policy_answer_admit(L, c, res, c->out);
        break;
    }
    return 0;
}
