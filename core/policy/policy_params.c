/* policy_params.c — a policy's declared parameters: their defaults and types, the scenario's
 * `policy.<name>.<key>` overrides checked and converted to the declared type, and their accessors. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <lauxlib.h>
#include <lua.h>

#include "core/base/alloc.h"
#include "core/policy/policy.h"
#include "core/policy/policy_internal.h"

void kv_policy_params_free(kv_policy *p)
{
    for (int i = 0; i < p->n_params; i++) {
        kv_free(p->params[i].key);
        kv_free(p->params[i].value);
        kv_free(p->params[i].set_where);
    }
    kv_free(p->params);
    p->params = NULL;
    p->n_params = 0;
}

static int cmp_param(const void *a, const void *b)
{
    return strcmp(((const policy_param *)a)->key, ((const policy_param *)b)->key);
}

/* Renders the value at idx like tostring (needs the state; runs protected). */
static char *render(lua_State *L, int idx)
{
    const char *s = luaL_tolstring(L, idx, NULL);
    char *out = kv_strdup(s);
    lua_pop(L, 1);
    return out;
}

static bool parse_bool_word(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return (*out = true, true);
        if (strcasecmp(s, no[i]) == 0)
            return (*out = false, true);
    }
    return false;
}

/* Converts an override to the declared type and pushes it; -1 with a message on failure. */
static int push_override(lua_State *L, const policy_param *q, const char *text, char *why, size_t size)
{
    char *end = NULL;
    errno = 0;
    switch (q->type) {
    case PT_INT: {
        long long v = strtoll(text, &end, 10);
        if (end != text && *end == '\0' && errno == 0) {
            lua_pushinteger(L, (lua_Integer)v);
            return 0;
        }
        errno = 0;
        double d = strtod(text, &end);
        if (end != text && *end == '\0' && errno == 0 && isfinite(d) && d == floor(d) && fabs(d) < 9e15) {
            lua_pushinteger(L, (lua_Integer)d);
            return 0;
        }
        snprintf(why, size, "expected an integer (the policy declares %s = %s), got '%s'", q->key, q->value, text);
        return -1;
    }
    case PT_NUM: {
        double d = strtod(text, &end);
        if (end != text && *end == '\0' && errno == 0 && isfinite(d)) {
            lua_pushnumber(L, d);
            return 0;
        }
        snprintf(why, size, "expected a number (the policy declares %s = %s), got '%s'", q->key, q->value, text);
        return -1;
    }
    case PT_BOOL: {
        bool b;
        if (parse_bool_word(text, &b)) {
            lua_pushboolean(L, b);
            return 0;
        }
        snprintf(why, size, "expected true or false (the policy declares %s = %s), got '%s'", q->key, q->value,
                 text);
        return -1;
    }
    case PT_STR:
        lua_pushstring(L, text);
        return 0;
    }
    return -1;
}

int kv_policy_params_setup(lua_State *L, kv_policy *p, int t, const kv_policy_param *params, int n_params,
                           kv_error *err)
{
    /* params: scalars with defaults; the type of each default is the declared type. */
    lua_getfield(L, t, "params");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, t, "params");
    }
    int pt = lua_gettop(L);
    if (!lua_istable(L, pt))
        return kv_error_set(err, KV_EINPUT, "%s: policy '%s': params must be a table of defaults, got %s", p->path,
                            p->name, luaL_typename(L, pt));
    int count = 0;
    lua_pushnil(L);
    while (lua_next(L, pt)) {
        lua_pop(L, 1);
        count++;
    }
    p->params = kv_calloc((size_t)count + 1, sizeof *p->params);
    lua_pushnil(L);
    while (lua_next(L, pt)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            char k[80];
            kv_policy_describe_value(L, -2, k, sizeof k);
            return kv_error_set(err, KV_EINPUT, "%s: policy '%s': params has a key %s; parameter names must be "
                                "strings", p->path, p->name, k);
        }
        const char *k = lua_tostring(L, -2);
        param_type type;
        switch (lua_type(L, -1)) {
        case LUA_TNUMBER:
            type = lua_isinteger(L, -1) ? PT_INT : PT_NUM;
            break;
        case LUA_TBOOLEAN:
            type = PT_BOOL;
            break;
        case LUA_TSTRING:
            type = PT_STR;
            break;
        default:
            return kv_error_set(err, KV_EINPUT, "%s: policy '%s': params.%s is %s; a parameter's default must be a "
                                "number, a boolean or a string", p->path, p->name, k, luaL_typename(L, -1));
        }
        policy_param *q = &p->params[p->n_params++];
        q->key = kv_strdup(k);
        q->type = type;
        q->value = render(L, -1);
        lua_pop(L, 1);
    }
    qsort(p->params, (size_t)p->n_params, sizeof *p->params, cmp_param);

    for (int i = 0; i < n_params; i++) {
        const kv_policy_param *o = &params[i];
        const char *where = o->where && o->where[0] ? o->where : NULL;
        const char *key = o->key ? o->key : "";
        policy_param *q = NULL;
        for (int j = 0; j < p->n_params; j++)
            if (strcmp(p->params[j].key, key) == 0)
                q = &p->params[j];
        if (!q) {
            const char *names[64];
            int n = p->n_params < 64 ? p->n_params : 64;
            for (int j = 0; j < n; j++)
                names[j] = p->params[j].key;
            char hint[600];
            kv_policy_suggest(key, names, n, "its parameters", hint, sizeof hint);
            return kv_error_set(err, KV_EINPUT, "%s%spolicy.%s.%s: policy '%s' (%s) has no parameter '%s'%s",
                                where ? where : "", where ? ": " : "", p->name, key, p->name, p->path, key, hint);
        }
        char why[300];
        if (push_override(L, q, o->value ? o->value : "", why, sizeof why))
            return kv_error_set(err, KV_EINPUT, "%s%spolicy.%s.%s: %s", where ? where : "", where ? ": " : "",
                                p->name, key, why);
        lua_setfield(L, pt, q->key);
        lua_getfield(L, pt, q->key);
        kv_free(q->value);
        q->value = render(L, -1);
        lua_pop(L, 1);
        kv_free(q->set_where);
        q->set_where = kv_strdup(where ? where : "");
    }
    kv_policy_push_readonly(L, pt, "ctx.params");
    p->params_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return KV_OK;
}

int kv_policy_param_count(const kv_policy *p)
{
    return p ? p->n_params : 0;
}

const char *kv_policy_param_key(const kv_policy *p, int i)
{
    return p && i >= 0 && i < p->n_params ? p->params[i].key : NULL;
}

const char *kv_policy_param_value(const kv_policy *p, int i)
{
    return p && i >= 0 && i < p->n_params ? p->params[i].value : NULL;
}

const char *kv_policy_params_string(const kv_policy *p, char *buf, size_t size)
{
    size_t off = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; p && i < p->n_params && off < size; i++)
        off += (size_t)snprintf(buf + off, size - off, "%s%s=%s", i ? " " : "", p->params[i].key,
                                p->params[i].value);
    return buf;
}
