/* policy.c — the policy host: loads a Lua policy, applies scenario params, calls hooks, checks and caches answers.
 * The tables a hook sees are built by policy_ctx.c, failures reported by policy_report.c, the declared
 * params read and overridden by policy_params.c.
 *
 * Design notes.
 *  - One sandboxed lua_State per policy (policy_sandbox.c). Every Lua call,
 *    including building the ctx table and reading the answer, runs inside one
 *    lua_pcall, so a memory error anywhere is caught; the message handler adds a
 *    traceback.
 *  - A hook receives one fresh `ctx` table. Fields that do not depend on the
 *    request (layer, head, model, params, policy, nodes, ...) are set directly;
 *    `ctx.request` and `ctx.context_length` are filled in lazily by the ctx
 *    metatable, which notes that the call read the request. Reading a field
 *    that does not exist is an error with a "did you mean" hint.
 *  - Invariant: an answer is cached only when the call that produced it read
 *    nothing of the request, nothing live (ctx.now, the node lists, ctx.route,
 *    ctx.state: the host notes each read), called no math.random, the file did not say
 *    `cache = false`, and caching is switched on. A cached answer is then a
 *    function of (policy, params, model, layer, head) alone, which is what the
 *    cache is keyed by; changing the model empties the cache.
 *  - Every answer is validated before it is used or cached; a bad answer is
 *    reported with the hook's file:line, the hook, and the request.
 *  - Errors from the policy (syntax, runtime, limits, bad answers, bad params)
 *    are KV_EINPUT: they are the user's input. Host out-of-memory is KV_EFAIL.
 */
#include "core/policy/policy.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "core/config/scenario.h"
#include "core/policy/policy_internal.h"
#include "core/policy/policy_sandbox.h"

const char *const kv_policy_hook_names[H_COUNT] = {"encode",       "transfer",    "speculate",
                                                          "prefill_node", "decode_node", "admit", "complete"};

/* Fields a policy file's table may have (sorted, for messages). */
static const char *const file_fields[] = {"admit",  "cache",     "complete", "decode_node", "describe",
                                          "encode", "name",      "params",      "prefill_node",
                                          "speculate", "transfer", NULL};

static int run_hook(kv_policy *p, kv_error *err)
{
    lua_State *L = p->sb.L;
    kv_policy_call *c = &p->cur;
    c->read_request = false;
    c->read_live = false;
    c->bad = false;
    c->detail[0] = '\0';
    int base = lua_gettop(L);
    lua_pushcfunction(L, kv_sandbox_msgh);
    lua_pushcfunction(L, kv_policy_call_body);
    kv_sandbox_arm(&p->sb, p->sb.lim.instructions_per_call, p->sb.lim.hook_ns);
    int st = lua_pcall(L, 0, 0, base + 1);
    kv_sandbox_disarm(&p->sb);
    p->stats.lua_calls++;
    int rc = KV_OK;
    if (st != LUA_OK || p->sb.limit != KV_SB_OK || c->bad)
        rc = kv_policy_hook_failure(p, st, err);
    lua_settop(L, base);
    return rc;
}

static bool cacheable(const kv_policy *p)
{
    return p->cache_on && p->cache_file && !p->cur.read_request && !p->cur.read_live && !p->sb.impure;
}

static void call_start(kv_policy *p, int hook, const kv_policy_request *r, void *out)
{
    memset(&p->cur, 0, offsetof(kv_policy_call, detail));
    p->cur.hook = hook;
    p->cur.r = r;
    p->cur.out = out;
}

/* The one call path of every hook, after call_start (and the hook's own ctx fields) prepared p->cur:
   when `cached` (may be NULL: this hook's answers are never cached) holds a valid answer of `size`
   bytes, it is copied to `out` (a hit, the hook does not run); otherwise the hook runs, its checked
   answer (in p->cur.out) is copied to `out` and, when cacheable, kept in `cached`. `out` is left
   alone on failure. */
static int cached_call(kv_policy *p, void *out, size_t size, void *cached, bool *valid, kv_error *err)
{
    if (cached && *valid) {
        memcpy(out, cached, size);
        p->stats.cache_hits++;
        return KV_OK;
    }
    int rc = run_hook(p, err);
    if (rc != KV_OK)
        return rc;
    memcpy(out, p->cur.out, size);
    if (cached && cacheable(p)) {
        memcpy(cached, p->cur.out, size);
        *valid = true;
    }
    return KV_OK;
}

/* --- loading ---------------------------------------------------------------- */

typedef struct load_args {
    const kv_policy_param *params;
    int n_params;
    bool name_given;
    kv_error *err;
    int rc;
} load_args;

static int load_fail(load_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int load_fail(load_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kv_error_setv(a->err, KV_EINPUT, fmt, ap);
    va_end(ap);
    a->rc = KV_EINPUT;
    return 0;
}

static int function_line(lua_State *L, int idx)
{
    lua_Debug ar;
    lua_pushvalue(L, idx);
    if (!lua_getinfo(L, ">S", &ar))
        return 0;
    return ar.linedefined;
}

/* Runs inside lua_pcall with the file's table at index 1 and load_args as
   light userdata at index 2: reads fields, hooks and params, applies overrides. */
static int setup_body(lua_State *L)
{
    kv_policy *p = kv_policy_of(L);
    load_args *a = lua_touserdata(L, 2);
    const int t = 1;
    if (!lua_istable(L, t))
        return load_fail(a, "%s: policy '%s': the file must end with `return { ... }` (a table of hooks); it "
                            "returned %s", p->path, p->name, lua_isnil(L, t) ? "nothing" : luaL_typename(L, t));

    /* Unknown fields: report the alphabetically first, with its line if it is a function. */
    const char *worst = NULL;
    int worst_line = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            char k[80];
            kv_policy_describe_value(L, -2, k, sizeof k);
            return load_fail(a, "%s: policy '%s': the returned table has a key %s; only named fields are allowed",
                             p->path, p->name, k);
        }
        const char *k = lua_tostring(L, -2);
        bool ok = false;
        for (int i = 0; file_fields[i]; i++)
            if (strcmp(k, file_fields[i]) == 0)
                ok = true;
        if (!ok && (!worst || strcmp(k, worst) < 0)) {
            worst = k;
            worst_line = lua_isfunction(L, -1) ? function_line(L, -1) : 0;
        }
        lua_pop(L, 1);
    }
    if (worst) {
        char hint[400], line[24] = "";
        kv_policy_suggest(worst, file_fields, (int)(sizeof file_fields / sizeof file_fields[0]) - 1, "fields", hint,
                sizeof hint);
        if (worst_line > 0)
            snprintf(line, sizeof line, ":%d", worst_line);
        return load_fail(a, "%s%s: policy '%s': '%s' is not a policy field%s", p->path, line, p->name, worst, hint);
    }

    lua_getfield(L, t, "name");
    if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
        return load_fail(a, "%s: policy '%s': name must be a string, got %s", p->path, p->name, luaL_typename(L, -1));
    if (!a->name_given && lua_type(L, -1) == LUA_TSTRING) {
        kv_free(p->name);
        p->name = kv_strdup(lua_tostring(L, -1));
        p->sb.name = p->name;
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "describe");
    if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
        return load_fail(a, "%s: policy '%s': describe must be a string, got %s", p->path, p->name,
                         luaL_typename(L, -1));
    kv_free(p->describe);
    p->describe = kv_strdup(lua_isnil(L, -1) ? "" : lua_tostring(L, -1));
    lua_pop(L, 1);
    lua_getfield(L, t, "cache");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
        return load_fail(a, "%s: policy '%s': cache must be true or false, got %s", p->path, p->name,
                         luaL_typename(L, -1));
    p->cache_file = lua_isnil(L, -1) || lua_toboolean(L, -1);
    lua_pop(L, 1);

    for (int h = 0; h < H_COUNT; h++) {
        lua_getfield(L, t, kv_policy_hook_names[h]);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        if (!lua_isfunction(L, -1))
            return load_fail(a, "%s: policy '%s': %s must be a function, got %s", p->path, p->name,
                             kv_policy_hook_names[h], luaL_typename(L, -1));
        p->hook_line[h] = function_line(L, -1);
        p->hook_ref[h] = luaL_ref(L, LUA_REGISTRYINDEX);
    }

    a->rc = kv_policy_params_setup(L, p, t, a->params, a->n_params, a->err);
    if (a->rc != KV_OK)
        return 0;

    lua_createtable(L, 0, 3);
    lua_pushcfunction(L, kv_policy_ctx_index);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, "ctx");
    lua_setfield(L, -2, "__name");
    p->ctx_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    p->request_mt_ref = kv_policy_make_strict_mt(L, "ctx.request");
    p->node_mt_ref = kv_policy_make_strict_mt(L, "node");
    p->link_mt_ref = kv_policy_make_strict_mt(L, "link");
    p->result_mt_ref = kv_policy_make_strict_mt(L, "ctx.result");
    lua_newtable(L); /* ctx.state: the policy's own, plain and writable */
    p->state_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Reads the policy source: a regular file of at most KV_INPUT_MAX_TEXT bytes (infile.h). */
static char *read_file(const char *path, size_t *len, kv_error *err, const char *name)
{
    char *text = NULL;
    kv_error local = {0};
    if (kv_input_read_all(path, "the policy file", KV_INPUT_MAX_TEXT, &text, len, &local) == KV_OK)
        return text;
    /* "PATH: cannot open the policy file: ..." -> "PATH: policy 'NAME': cannot open the policy file: ..." */
    size_t plen = strlen(path);
    const char *rest = strncmp(local.msg, path, plen) == 0 && local.msg[plen] == ':' ? local.msg + plen + 2 : local.msg;
    kv_error_set(err, local.code, "%s: policy '%s': %s", path, name, rest);
    return NULL;
}

/* The name used when none is given: the file's base name without ".lua". */
static char *default_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".lua") == 0)
        n -= 4;
    return kv_strndup(base, n);
}

/* The sandbox's limits from the caller's (0: the default), clamped to what the sandbox takes. */
static void fill_limits(const kv_policy_limits *in, kv_sandbox_limits *out)
{
    kv_policy_limits l = in ? *in : (kv_policy_limits){0};
    uint64_t instr = l.instructions_per_call ? l.instructions_per_call : KV_POLICY_DEFAULT_INSTRUCTIONS;
    uint64_t mem = l.memory_bytes ? l.memory_bytes : KV_POLICY_DEFAULT_MEMORY_BYTES;
    uint64_t str = l.string_bytes ? l.string_bytes : KV_POLICY_DEFAULT_STRING_BYTES;
    uint64_t print = l.print_bytes ? l.print_bytes : KV_POLICY_DEFAULT_PRINT_BYTES;
    double hook_ms = l.hook_ms > 0 && isfinite(l.hook_ms) ? l.hook_ms : KV_POLICY_DEFAULT_HOOK_MS;
    double run_s = l.run_s > 0 && isfinite(l.run_s) ? l.run_s : KV_POLICY_DEFAULT_RUN_S;
    if (instr > INT_MAX)
        instr = INT_MAX;
    if (mem > SIZE_MAX / 2)
        mem = SIZE_MAX / 2;
    if (str > mem)
        str = mem;
    if (print > SIZE_MAX / 2)
        print = SIZE_MAX / 2;
    if (hook_ms > 1e9) /* 11 days: keeps 10x of it in int64 nanoseconds */
        hook_ms = 1e9;
    if (run_s > 1e9)
        run_s = 1e9;
    out->instructions_per_call = (int)instr;
    out->mem_cap_bytes = (size_t)mem;
    out->string_cap_bytes = (size_t)str;
    out->print_cap_bytes = (size_t)print;
    out->hook_ns = (int64_t)(hook_ms * 1e6);
    out->run_ns = (int64_t)(run_s * 1e9);
}

void kv_policy_limits_from_scenario(const kv_scenario_limits *l, kv_policy_limits *out)
{
    *out = (kv_policy_limits){
        .instructions_per_call = (uint64_t)l->instructions,
        .memory_bytes = (uint64_t)l->memory_mib << 20,
        .string_bytes = (uint64_t)l->string_kib << 10,
        .hook_ms = l->hook_ms,
        .run_s = l->run_s,
        .print_bytes = (uint64_t)l->print_kib << 10,
    };
}

int kv_policy_load(const char *name, const char *path, const kv_policy_param *params, int n_params,
                   const kv_policy_limits *limits, kv_policy **out, kv_error *err)
{
    if (!out)
        return kv_error_set(err, KV_EFAIL, "kv_policy_load: out is NULL");
    *out = NULL;
    if (!path || !path[0])
        return kv_error_set(err, KV_EINPUT, "policy '%s': no policy file given", name ? name : "?");
    if (n_params < 0 || (n_params > 0 && !params))
        return kv_error_set(err, KV_EFAIL, "kv_policy_load: bad params array");
    kv_sandbox_limits lim;
    fill_limits(limits, &lim);

    kv_policy *p = kv_calloc(1, sizeof *p);
    p->name = name && name[0] ? kv_strdup(name) : default_name(path);
    p->path = kv_strdup(path);
    p->describe = kv_strdup("");
    p->cache_on = true;
    p->cache_file = true;
    for (int h = 0; h < H_COUNT; h++)
        p->hook_ref[h] = LUA_NOREF;
    p->ctx_mt_ref = p->request_mt_ref = p->node_mt_ref = p->params_ref = p->model_ref = LUA_NOREF;
    p->link_mt_ref = p->result_mt_ref = p->state_ref = LUA_NOREF;

    size_t len = 0;
    char *text = read_file(path, &len, err, p->name);
    if (!text) {
        kv_policy_destroy(p);
        return err ? err->code : KV_EINPUT;
    }
    char msg[512];
    if (kv_sandbox_open(&p->sb, p->name, &lim, msg, sizeof msg) != 0) {
        kv_free(text);
        kv_error_set(err, KV_EINPUT, "%s: policy '%s': %s", path, p->name, msg);
        kv_policy_destroy(p);
        return KV_EINPUT;
    }
    if (len > 0 && text[0] == LUA_SIGNATURE[0]) {
        kv_free(text);
        kv_error_set(err, KV_EINPUT, "%s: policy '%s': this is a precompiled (binary) Lua chunk; kvsim loads "
                                     "policies from Lua source only", path, p->name);
        kv_policy_destroy(p);
        return KV_EINPUT;
    }

    lua_State *L = p->sb.L;
    char cap[32];
    kv_sandbox_format_bytes(p->sb.lim.mem_cap_bytes, cap, sizeof cap);
    int load_budget = lim.instructions_per_call > INT_MAX / 10 ? INT_MAX : lim.instructions_per_call * 10;
    int64_t load_ns = lim.hook_ns * 10;
    char *chunkname = kv_malloc(strlen(path) + 2);
    chunkname[0] = '@';
    strcpy(chunkname + 1, path);
    lua_pushcfunction(L, kv_sandbox_msgh);
    kv_sandbox_arm(&p->sb, load_budget, load_ns);
    int st = luaL_loadbufferx(L, text, len, chunkname, "t");
    kv_free(chunkname);
    kv_free(text);
    int rc = KV_OK;
    if (st == LUA_ERRSYNTAX) {
        rc = kv_error_set(err, KV_EINPUT, "%s\n  (syntax error while loading policy '%s')", lua_tostring(L, -1),
                          p->name);
    } else if (st != LUA_OK) {
        rc = kv_error_set(err, KV_EINPUT, "%s: policy '%s': the file does not fit the memory cap of %s", path,
                          p->name, cap);
    } else {
        st = lua_pcall(L, 0, 1, 1);
        kv_sandbox_disarm(&p->sb);
        const char *m = st != LUA_OK && lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        const char *tb = strstr(m, "\nstack traceback:");
        if (p->sb.limit == KV_SB_INSTRUCTIONS) {
            rc = kv_error_set(err, KV_EINPUT,
                              "%s: policy '%s' used up its instruction budget (%d) while loading; is there an "
                              "endless loop at the top level of the file? (limit: policy_limits.instructions, "
                              "10x while loading)%s",
                              kv_policy_limit_where(p, path), p->name, load_budget, tb ? tb : "");
        } else if (p->sb.limit != KV_SB_OK) {
            char what[300];
            kv_sandbox_describe_limit(&p->sb, what, sizeof what);
            rc = kv_error_set(err, KV_EINPUT, "%s: policy '%s' hit %s while loading%s", kv_policy_limit_where(p, path),
                              p->name, what, tb ? tb : "");
        } else if (st == LUA_ERRMEM || (st != LUA_OK && (p->sb.mem_refused || p->sb.str_refused))) {
            if (p->sb.last_refusal == 2) {
                char got[32], scap[32];
                kv_sandbox_format_bytes(p->sb.str_refused_bytes, got, sizeof got);
                kv_sandbox_format_bytes(p->sb.lim.string_cap_bytes, scap, sizeof scap);
                rc = kv_error_set(err, KV_EINPUT, "%s: policy '%s' tried to make a string of %s, over its limit of "
                                  "%s per string (policy_limits.string_kib), while loading",
                                  p->sb.where[0] ? p->sb.where : path, p->name, got, scap);
            } else {
                rc = kv_error_set(err, KV_EINPUT, "%s: policy '%s' exceeded its memory cap of %s while loading",
                                  p->sb.where[0] ? p->sb.where : path, p->name, cap);
            }
        } else if (st != LUA_OK) {
            if (lua_type(L, -1) != LUA_TSTRING)
                m = "(error object is not a string)";
            int mlen = tb ? (int)(tb - m) : (int)strlen(m);
            rc = kv_error_set(err, KV_EINPUT, "%.*s\n  while loading policy '%s' (%s)%s", mlen, m, p->name, path,
                              tb ? tb : "");
        }
    }
    kv_sandbox_disarm(&p->sb);
    if (rc != KV_OK) {
        kv_policy_destroy(p);
        return rc;
    }
    /* Stack: msgh, result. Run the setup protected, with the result at index 1. */
    load_args a = {params, n_params, name && name[0], err, KV_OK};
    lua_pushcfunction(L, setup_body);
    lua_insert(L, 2);
    lua_pushlightuserdata(L, &a);
    kv_sandbox_arm(&p->sb, load_budget, load_ns);
    st = lua_pcall(L, 2, 0, 1);
    kv_sandbox_disarm(&p->sb);
    if (st != LUA_OK || p->sb.limit != KV_SB_OK) {
        char what[300];
        kv_sandbox_describe_limit(&p->sb, what, sizeof what);
        if (p->sb.limit != KV_SB_OK)
            kv_error_set(err, KV_EINPUT, "%s: policy '%s' hit %s while loading (reading the returned table)",
                         kv_policy_limit_where(p, path), p->name, what);
        else if (st == LUA_ERRMEM && (p->sb.mem_refused || p->sb.str_refused))
            kv_error_set(err, KV_EINPUT, "%s: policy '%s' exceeded its memory cap of %s while loading", path,
                         p->name, cap);
        else
            kv_error_set(err, KV_EINPUT, "%s: policy '%s': %s", path, p->name,
                         lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "error while reading the policy table");
        a.rc = err ? err->code : KV_EINPUT;
        if (a.rc == KV_OK)
            a.rc = KV_EINPUT;
    }
    lua_settop(L, 0);
    if (a.rc != KV_OK) {
        kv_policy_destroy(p);
        return a.rc;
    }
    lua_gc(L, LUA_GCCOLLECT);
    *out = p;
    return KV_OK;
}

void kv_policy_destroy(kv_policy *p)
{
    if (!p)
        return;
    kv_sandbox_close(&p->sb);
    kv_policy_params_free(p);
    kv_free(p->name);
    kv_free(p->path);
    kv_free(p->describe);
    kv_free((char *)p->model.name);
    kv_free(p->enc_valid);
    kv_free(p->enc);
    kv_free(p);
}

const char *kv_policy_name(const kv_policy *p)
{
    return p ? p->name : NULL;
}

const char *kv_policy_path(const kv_policy *p)
{
    return p ? p->path : NULL;
}

const char *kv_policy_describe(const kv_policy *p)
{
    return p ? p->describe : NULL;
}

bool kv_policy_has_hook(const kv_policy *p, const char *hook)
{
    for (int h = 0; p && hook && h < H_COUNT; h++)
        if (strcmp(hook, kv_policy_hook_names[h]) == 0)
            return p->hook_ref[h] != LUA_NOREF;
    return false;
}

static void clear_caches(kv_policy *p)
{
    p->cache_epoch++;
    if (p->enc_valid)
        memset(p->enc_valid, 0, (size_t)p->cache_layers * (size_t)p->cache_heads * sizeof *p->enc_valid);
    p->transfer_valid = false;
    p->spec_valid = false;
}

void kv_policy_set_cache(kv_policy *p, bool on)
{
    if (!p)
        return;
    p->cache_on = on;
    clear_caches(p);
}

void kv_policy_get_stats(const kv_policy *p, kv_policy_stats *out)
{
    if (!p || !out)
        return;
    *out = p->stats;
    out->memory_bytes = p->sb.mem_bytes;
    out->memory_peak_bytes = p->sb.mem_peak_bytes;
}

static bool same_model(const kv_policy *p, const kv_policy_model *m)
{
    if (!p->model_known)
        return false;
    const kv_policy_model *a = &p->model;
    if (a->layers != m->layers || a->heads != m->heads || a->kv_heads != m->kv_heads || a->head_dim != m->head_dim)
        return false;
    return strcmp(a->name ? a->name : "", m->name ? m->name : "") == 0;
}

void kv_policy_set_model(kv_policy *p, const kv_policy_model *m)
{
    if (!p || !m || same_model(p, m))
        return;
    kv_free((char *)p->model.name);
    p->model = *m;
    p->model.name = kv_strdup(m->name ? m->name : "");
    p->model_known = true;
    p->model_dirty = true;
    p->cache_epoch++;
    kv_free(p->enc_valid);
    kv_free(p->enc);
    p->enc_valid = NULL;
    p->enc = NULL;
    p->cache_layers = p->cache_heads = 0;
    size_t cells;
    if (m->layers > 0 && m->kv_heads > 0 && m->layers <= (1 << 16) && m->kv_heads <= (1 << 16) &&
        kv_mul_size((size_t)m->layers, (size_t)m->kv_heads, &cells) == 0) {
        p->enc_valid = kv_calloc(cells, sizeof *p->enc_valid);
        p->enc = kv_calloc(cells, sizeof *p->enc);
        p->cache_layers = m->layers;
        p->cache_heads = m->kv_heads;
    }
    p->transfer_valid = false;
    p->spec_valid = false;
}

uint64_t kv_policy_cache_epoch(const kv_policy *p)
{
    return p ? p->cache_epoch : 0;
}

bool kv_policy_encoding_fixed(const kv_policy *p, const kv_policy_model *m, int layer, int kv_head)
{
    if (!p || !m || layer < 0 || layer >= m->layers || kv_head < 0 || kv_head >= m->kv_heads || !same_model(p, m))
        return false;
    if (p->hook_ref[H_ENCODE] == LUA_NOREF)
        return true; /* the default answer */
    return p->enc && p->enc_valid[(size_t)layer * (size_t)p->cache_heads + (size_t)kv_head];
}

/* --- the hooks ---------------------------------------------------------------- */

int kv_policy_encoding(kv_policy *p, const kv_policy_model *m, const kv_policy_request *r, int layer, int kv_head,
                       kv_encoding *out, kv_error *err)
{
    if (!p || !m || !out)
        return kv_error_set(err, KV_EFAIL, "kv_policy_encoding: NULL argument");
    if (layer < 0 || layer >= m->layers || kv_head < 0 || kv_head >= m->kv_heads)
        return kv_error_set(err, KV_EFAIL, "policy '%s': asked for layer %d, KV head %d of a model with %d layers "
                                           "and %d KV heads", p->name, layer, kv_head, m->layers, m->kv_heads);
    if (!same_model(p, m))
        kv_policy_set_model(p, m);
    if (p->hook_ref[H_ENCODE] == LUA_NOREF) {
        memset(out, 0, sizeof *out);
        kv_policy_set_bf16(&out->key);
        kv_policy_set_bf16(&out->value);
        p->stats.default_answers++;
        return KV_OK;
    }
    size_t cell = p->enc ? (size_t)layer * (size_t)p->cache_heads + (size_t)kv_head : 0;
    kv_encoding e;
    call_start(p, H_ENCODE, r, &e);
    p->cur.layer = layer;
    p->cur.head = kv_head;
    return cached_call(p, out, sizeof *out, p->enc ? &p->enc[cell] : NULL, p->enc ? &p->enc_valid[cell] : NULL,
                       err);
}

int kv_policy_transfer(kv_policy *p, const kv_policy_request *r, kv_transfer_plan *out, kv_error *err)
{
    if (!p || !out)
        return kv_error_set(err, KV_EFAIL, "kv_policy_transfer: NULL argument");
    if (p->hook_ref[H_TRANSFER] == LUA_NOREF) {
        memset(out, 0, sizeof *out);
        out->order = KV_ORDER_CONCURRENT;
        out->priority_mode = 0;
        out->anchor_weight = out->residual_weight = 0.5;
        p->stats.default_answers++;
        return KV_OK;
    }
    kv_transfer_plan tp;
    call_start(p, H_TRANSFER, r, &tp);
    return cached_call(p, out, sizeof *out, &p->transfer, &p->transfer_valid, err);
}

int kv_policy_speculation(kv_policy *p, const kv_policy_request *r, int *k, kv_error *err)
{
    if (!p || !k)
        return kv_error_set(err, KV_EFAIL, "kv_policy_speculation: NULL argument");
    if (p->hook_ref[H_SPECULATE] == LUA_NOREF) {
        *k = 0;
        p->stats.default_answers++;
        return KV_OK;
    }
    int v = 0;
    call_start(p, H_SPECULATE, r, &v);
    return cached_call(p, k, sizeof *k, &p->spec, &p->spec_valid, err);
}

static int place(kv_policy *p, int hook, const kv_policy_request *r, const kv_policy_node *nodes, int n_nodes,
                 int *node, kv_error *err)
{
    if (!p || !node || (n_nodes > 0 && !nodes))
        return kv_error_set(err, KV_EFAIL, "kv_policy_%s: NULL argument", kv_policy_hook_names[hook]);
    if (n_nodes <= 0)
        return kv_error_set(err, KV_EFAIL, "policy '%s': %s asked with no nodes", p->name, kv_policy_hook_names[hook]);
    if (p->hook_ref[hook] == LUA_NOREF) {
        /* Requests already travelling to a decode node count as its load: placement happens when the
           transfer starts, before the node has queued anything, so a burst would otherwise all go to one. */
        int best = 0;
        for (int i = 1; i < n_nodes; i++) {
            long load = (long)nodes[i].queued + nodes[i].running + nodes[i].incoming;
            long best_load = (long)nodes[best].queued + nodes[best].running + nodes[best].incoming;
            if (load < best_load || (load == best_load && nodes[i].index < nodes[best].index))
                best = i;
        }
        *node = nodes[best].index;
        p->stats.default_answers++;
        return KV_OK;
    }
    int v = 0;
    call_start(p, hook, r, &v);
    p->cur.nodes = nodes;
    p->cur.n_nodes = n_nodes;
    return cached_call(p, node, sizeof *node, NULL, NULL, err);
}

int kv_policy_prefill_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes, int n_nodes,
                           int *node, kv_error *err)
{
    return place(p, H_PREFILL_NODE, r, nodes, n_nodes, node, err);
}

int kv_policy_decode_node(kv_policy *p, const kv_policy_request *r, const kv_policy_node *nodes, int n_nodes,
                          int *node, kv_error *err)
{
    return place(p, H_DECODE_NODE, r, nodes, n_nodes, node, err);
}

int kv_policy_admit(kv_policy *p, const kv_policy_request *r, const kv_policy_node *node, double kv_bytes_needed,
                    bool *admit, kv_error *err)
{
    if (!p || !node || !admit)
        return kv_error_set(err, KV_EFAIL, "kv_policy_admit: NULL argument");
    if (p->hook_ref[H_ADMIT] == LUA_NOREF) {
        *admit = kv_bytes_needed <= node->kv_free_bytes;
        p->stats.default_answers++;
        return KV_OK;
    }
    bool v = false;
    call_start(p, H_ADMIT, r, &v);
    p->cur.node = node;
    p->cur.kv_bytes_needed = kv_bytes_needed;
    return cached_call(p, admit, sizeof *admit, NULL, NULL, err);
}

int kv_policy_complete(kv_policy *p, const kv_policy_request *r, const kv_policy_finished *o, kv_error *err)
{
    if (!p || !r || !o)
        return kv_error_set(err, KV_EFAIL, "kv_policy_complete: NULL argument");
    if (p->hook_ref[H_COMPLETE] == LUA_NOREF)
        return KV_OK;
    int v = 0;
    call_start(p, H_COMPLETE, r, &v);
    p->cur.outcome = o;
    return cached_call(p, &v, sizeof v, NULL, NULL, err);
}

void kv_policy_set_view(kv_policy *p, const kv_policy_view *v)
{
    if (!p)
        return;
    if (v)
        p->view = *v;
    else
        memset(&p->view, 0, sizeof p->view);
}
