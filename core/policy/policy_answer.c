/* policy_answer.c — checks what policy hooks return and turns it into the C structs of policy.h.
 *
 * Every field is validated (types, bits 1..16, anchor_bits 0..bits-1,
 * group_size >= 1, alpha >= 0, alpha_low <= alpha_high, window >= 0, node in
 * the pool) and unknown fields are refused with a "did you mean" hint, so a
 * typo in a policy never passes silently. Messages are reproducible: where
 * several fields are wrong, the alphabetically first is reported.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "core/base/didyoumean.h"
#include "core/policy/policy_internal.h"

/* --- messages ------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Writes "; did you mean 'x'?" (when one candidate is close) and " (fields: a, b, c)"
   into buf. cands need not be sorted; this sorts a copy. */
void kv_policy_suggest(const char *word, const char *const *cands, int n, const char *list_label, char *buf,
                    size_t size)
{
    const char *sorted[64];
    if (n > 64)
        n = 64;
    for (int i = 0; i < n; i++)
        sorted[i] = cands[i];
    qsort(sorted, (size_t)n, sizeof sorted[0], cmp_str);
    const char *best = kv_did_you_mean(word, sorted, (size_t)n);
    size_t off = 0;
    buf[0] = '\0';
    if (best)
        off += (size_t)snprintf(buf, size, "; did you mean '%s'?", best);
    if (off < size) {
        if (n == 0) {
            snprintf(buf + off, size - off, " (there are no %s)", list_label);
            return;
        }
        off += (size_t)snprintf(buf + off, size - off, " (%s: ", list_label);
        for (int i = 0; i < n && off < size; i++)
            off += (size_t)snprintf(buf + off, size - off, "%s%s", i ? ", " : "", sorted[i]);
        if (off < size)
            snprintf(buf + off, size - off, ")");
    }
}

/* The string keys of the table at idx (at most 64), for suggestions. The
   pointers live as long as the table holds the keys. */
int kv_policy_table_keys(lua_State *L, int idx, const char **keys)
{
    int n = 0;
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING && n < 64)
            keys[n++] = lua_tostring(L, -1);
    }
    return n;
}

/* A short description of the value at idx for messages: 17, 2.5, "abc", a table. */
void kv_policy_describe_value(lua_State *L, int idx, char *buf, size_t size)
{
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            snprintf(buf, size, "%lld", (long long)lua_tointeger(L, idx));
        else
            snprintf(buf, size, "%.14g", (double)lua_tonumber(L, idx));
        break;
    case LUA_TSTRING:
        snprintf(buf, size, "\"%.60s\"", lua_tostring(L, idx));
        break;
    case LUA_TBOOLEAN:
        snprintf(buf, size, "%s", lua_toboolean(L, idx) ? "true" : "false");
        break;
    case LUA_TNIL:
        snprintf(buf, size, "nil");
        break;
    default:
        snprintf(buf, size, "a %s", luaL_typename(L, idx));
    }
}

/* --- validating answers ---------------------------------------------------- */

int kv_policy_answer_bad(kv_policy_call *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof c->detail, fmt, ap);
    va_end(ap);
    c->bad = true;
    return -1;
}

/* Reads the table at t in one pass into n stack slots pushed here (the first
   at *base), one per name in `fields` (n names, any order); absent fields stay
   nil. A key that is not a field makes the call bad, naming the
   alphabetically first such key so messages are reproducible. One pass and no
   lookups by name: this runs on every uncached hook call. */
static int read_fields(lua_State *L, kv_policy_call *c, int t, const char *what, const char *const *fields, int n,
                       int *base)
{
    t = lua_absindex(L, t);
    luaL_checkstack(L, n + 4, "reading a policy answer");
    *base = lua_gettop(L) + 1;
    for (int i = 0; i < n; i++)
        lua_pushnil(L);
    const char *worst = NULL;
    char other[64] = "";
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            const char *k = lua_tostring(L, -2);
            int i = 0;
            while (i < n && strcmp(k, fields[i]) != 0)
                i++;
            if (i < n) {
                lua_replace(L, *base + i); /* pops the value */
                continue;
            }
            if (!worst || strcmp(k, worst) < 0)
                worst = k; /* the table keeps the string alive */
        } else if (!other[0]) {
            kv_policy_describe_value(L, -2, other, sizeof other);
        }
        lua_pop(L, 1);
    }
    const char *in = what[0] ? what : "the answer";
    if (worst) {
        char hint[400];
        kv_policy_suggest(worst, fields, n, "fields", hint, sizeof hint);
        return kv_policy_answer_bad(c, "a field '%s' in %s that kvsim does not know%s", worst, in, hint);
    }
    if (other[0])
        return kv_policy_answer_bad(c, "%s has a key %s; only named fields are allowed", in, other);
    return 0;
}

/* The getters read the value at stack index idx (a slot from read_fields);
   nil gives the default. `what` and `field` name it in messages: what.field. */

static int get_int(lua_State *L, kv_policy_call *c, int idx, const char *what, const char *field, int dflt, int lo,
                   int hi, int *out)
{
    if (lua_isnil(L, idx)) {
        *out = dflt;
        return 0;
    }
    int isint = 0;
    lua_Integer v = lua_type(L, idx) == LUA_TNUMBER ? lua_tointegerx(L, idx, &isint) : 0;
    if (!isint || v < lo || v > hi) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s%s%s = %s; expected an integer from %d to %d", what, what[0] ? "." : "",
                                    field, got, lo, hi);
    }
    *out = (int)v;
    return 0;
}

static int get_num(lua_State *L, kv_policy_call *c, int idx, const char *what, const char *field, double dflt,
                   double *out)
{
    if (lua_isnil(L, idx)) {
        *out = dflt;
        return 0;
    }
    if (lua_type(L, idx) != LUA_TNUMBER || !isfinite((double)lua_tonumber(L, idx)) || lua_tonumber(L, idx) < 0) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s%s%s = %s; expected a finite number >= 0", what, what[0] ? "." : "", field,
                                    got);
    }
    *out = (double)lua_tonumber(L, idx);
    return 0;
}

static int get_bool(lua_State *L, kv_policy_call *c, int idx, const char *what, const char *field, bool dflt,
                    bool *out)
{
    if (lua_isnil(L, idx)) {
        *out = dflt;
        return 0;
    }
    if (!lua_isboolean(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s%s%s = %s; expected true or false", what, what[0] ? "." : "", field, got);
    }
    *out = lua_toboolean(L, idx);
    return 0;
}

/* A string that must be one of `choices` (NULL-terminated); *out is its index. */
static int get_choice(lua_State *L, kv_policy_call *c, int idx, const char *what, const char *field, int dflt,
                      const char *const *choices, int *out)
{
    if (lua_isnil(L, idx)) {
        *out = dflt;
        return 0;
    }
    const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
    int n = 0, found = -1;
    for (; choices[n]; n++)
        if (s && found < 0 && strcmp(s, choices[n]) == 0)
            found = n;
    if (found < 0) {
        char got[80], hint[300];
        kv_policy_describe_value(L, idx, got, sizeof got);
        kv_policy_suggest(s ? s : "", choices, n, "choices", hint, sizeof hint);
        return kv_policy_answer_bad(c, "%s%s%s = %s; not a valid choice%s", what, what[0] ? "." : "", field, got,
                                    hint);
    }
    *out = found;
    return 0;
}

#define KV_DEFAULT_GROUP_SIZE 32
#define KV_MAX_GROUP_SIZE (1 << 20)
#define KV_MAX_WINDOW (1 << 30)

void kv_policy_set_bf16(kv_tensor_enc *e)
{
    memset(e, 0, sizeof *e);
    e->kind = KV_TENSOR_BF16;
    e->bits = 16;
}

/* One of K or V at idx: "bf16", {kind = "bf16"}, or {bits, anchor_bits, group_size, per_channel}.
   nil gives *dflt when dflt is not NULL. Leaves the stack as it found it on success. */
static int parse_tensor(lua_State *L, kv_policy_call *c, int idx, const char *what, const kv_tensor_enc *dflt,
                        kv_tensor_enc *out)
{
    enum { F_ANCHOR, F_BITS, F_GROUP, F_KIND, F_PER_CHANNEL, F_N };
    static const char *const fields[F_N] = {"anchor_bits", "bits", "group_size", "kind", "per_channel"};
    static const char *const kinds[] = {"bf16", "int", NULL};
    idx = lua_absindex(L, idx);
    if (lua_isnil(L, idx) && dflt) {
        *out = *dflt;
        return 0;
    }
    if (lua_type(L, idx) == LUA_TSTRING && strcmp(lua_tostring(L, idx), "bf16") == 0) {
        kv_policy_set_bf16(out);
        return 0;
    }
    if (!lua_istable(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s = %s; expected \"bf16\" or a table like {bits = 4, group_size = 32}",
                                    what, got);
    }
    int top = lua_gettop(L), f;
    if (read_fields(L, c, idx, what, fields, F_N, &f))
        return -1;
    int kind = 1;
    if (get_choice(L, c, f + F_KIND, what, "kind", 1, kinds, &kind))
        return -1;
    if (kind == 0) {
        for (int i = 0; i < F_N; i++)
            if (i != F_KIND && !lua_isnil(L, f + i))
                return kv_policy_answer_bad(c, "%s has kind = \"bf16\" and %s; bf16 takes no %s (remove it, or drop "
                                               "kind to quantize)", what, fields[i], fields[i]);
        kv_policy_set_bf16(out);
        lua_settop(L, top);
        return 0;
    }
    if (lua_isnil(L, f + F_BITS))
        return kv_policy_answer_bad(c, "%s has no bits; write {bits = 8, group_size = 32} or \"bf16\"", what);
    memset(out, 0, sizeof *out);
    out->kind = KV_TENSOR_INT;
    bool per_channel = false;
    if (get_int(L, c, f + F_BITS, what, "bits", 0, 1, 16, &out->bits))
        return -1;
    if (get_int(L, c, f + F_ANCHOR, what, "anchor_bits", 0, 0, out->bits - 1, &out->anchor_bits)) {
        if (out->bits == 1)
            return kv_policy_answer_bad(c, "%s.anchor_bits must be 0 when bits = 1 (there is nothing to split)",
                                        what);
        return -1;
    }
    if (get_int(L, c, f + F_GROUP, what, "group_size", KV_DEFAULT_GROUP_SIZE, 1, KV_MAX_GROUP_SIZE,
                &out->group_size) ||
        get_bool(L, c, f + F_PER_CHANNEL, what, "per_channel", false, &per_channel))
        return -1;
    out->per_channel = per_channel;
    lua_settop(L, top);
    return 0;
}

/* The DiffKV part of an encoding (diffkv = true or a table), with the high tier already in e. */
static int parse_diffkv(lua_State *L, kv_policy_call *c, int idx, kv_encoding *e)
{
    enum { D_ALPHA_HIGH, D_ALPHA_LOW, D_KEY_LOW, D_VALUE_LOW, D_WINDOW, D_N };
    static const char *const fields[D_N] = {"alpha_high", "alpha_low", "key_low", "value_low", "window"};
    if (!lua_istable(L, idx) && !lua_isboolean(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "diffkv = %s; expected a table {key_low = ..., value_low = ..., alpha_high = "
                                       "..., alpha_low = ..., window = ...} or true", got);
    }
    e->diffkv = true;
    /* Defaults of the low tier: K4V2 with the high tier's grouping. */
    kv_tensor_enc klow = {KV_TENSOR_INT, 4, 0, KV_DEFAULT_GROUP_SIZE, 0};
    kv_tensor_enc vlow = {KV_TENSOR_INT, 2, 0, KV_DEFAULT_GROUP_SIZE, 0};
    if (e->key.kind == KV_TENSOR_INT) {
        klow.group_size = e->key.group_size;
        klow.per_channel = e->key.per_channel;
    }
    if (e->value.kind == KV_TENSOR_INT)
        vlow.group_size = e->value.group_size;
    e->key_low = klow;
    e->value_low = vlow;
    e->alpha_high = 1.0;
    e->alpha_low = 0.02;
    e->window = 64;
    if (lua_isboolean(L, idx))
        return 0;
    int f;
    if (read_fields(L, c, idx, "diffkv", fields, D_N, &f) ||
        parse_tensor(L, c, f + D_KEY_LOW, "diffkv.key_low", &klow, &e->key_low) ||
        parse_tensor(L, c, f + D_VALUE_LOW, "diffkv.value_low", &vlow, &e->value_low) ||
        get_num(L, c, f + D_ALPHA_HIGH, "diffkv", "alpha_high", 1.0, &e->alpha_high) ||
        get_num(L, c, f + D_ALPHA_LOW, "diffkv", "alpha_low", 0.02, &e->alpha_low) ||
        get_int(L, c, f + D_WINDOW, "diffkv", "window", 64, 0, KV_MAX_WINDOW, &e->window))
        return -1;
    if (e->alpha_low > e->alpha_high)
        return kv_policy_answer_bad(c, "diffkv.alpha_low = %.14g is above diffkv.alpha_high = %.14g; need "
                                       "alpha_low <= alpha_high (equal values mean: no low tier, prune below "
                                       "alpha_high)", e->alpha_low, e->alpha_high);
    return 0;
}

int kv_policy_answer_encoding(lua_State *L, kv_policy_call *c, int idx, kv_encoding *e)
{
    enum { E_DIFFKV, E_WINDOW, E_KEY, E_VALUE, E_N };
    static const char *const fields[E_N] = {"diffkv", "full_precision_window", "key", "value"};
    idx = lua_absindex(L, idx);
    memset(e, 0, sizeof *e);
    if (lua_type(L, idx) == LUA_TSTRING && strcmp(lua_tostring(L, idx), "bf16") == 0) {
        kv_policy_set_bf16(&e->key);
        kv_policy_set_bf16(&e->value);
        return 0;
    }
    if (!lua_istable(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected \"bf16\" or a table {key = ..., value = ...}", got);
    }
    int f;
    if (read_fields(L, c, idx, "", fields, E_N, &f))
        return -1;
    if (lua_isnil(L, f + E_KEY) || lua_isnil(L, f + E_VALUE))
        return kv_policy_answer_bad(c, "a table without '%s'; an encoding needs both key and value (e.g. value = "
                                       "\"bf16\")", lua_isnil(L, f + E_KEY) ? "key" : "value");
    if (parse_tensor(L, c, f + E_KEY, "key", NULL, &e->key))
        return -1;
    if (lua_rawequal(L, f + E_KEY, f + E_VALUE)) /* {key = enc, value = enc}: read once */
        e->value = e->key;
    else if (parse_tensor(L, c, f + E_VALUE, "value", NULL, &e->value))
        return -1;
    if (
        get_int(L, c, f + E_WINDOW, "", "full_precision_window", 0, 0, KV_MAX_WINDOW, &e->full_precision_window))
        return -1;
    int d = f + E_DIFFKV;
    if (lua_isnil(L, d) || (lua_isboolean(L, d) && !lua_toboolean(L, d)))
        return 0;
    return parse_diffkv(L, c, d, e);
}

int kv_policy_answer_transfer(lua_State *L, kv_policy_call *c, int idx, kv_transfer_plan *tp)
{
    enum { T_LAYERWISE, T_LEVELS, T_ORDER, T_PREEMPT, T_PRIORITY, T_WEIGHTS, T_N };
    static const char *const fields[T_N] = {"layerwise", "levels", "order", "preempt", "priority", "weights"};
    static const char *const orders[] = {"concurrent", "anchor_first", NULL};
    static const char *const preempts[] = {"recompute", "swap", NULL};
    static const char *const prios[] = {"none", "strict", "weighted", NULL};
    static const char *const wfields[] = {"anchor", "residual"};
    idx = lua_absindex(L, idx);
    memset(tp, 0, sizeof *tp);
    if (!lua_istable(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected a table {order = ..., priority = ..., weights = ..., layerwise "
                                       "= ...}", got);
    }
    int f, order = 0, prio = 0, preempt = 0;
    if (read_fields(L, c, idx, "", fields, T_N, &f) ||
        get_choice(L, c, f + T_ORDER, "", "order", 0, orders, &order) ||
        get_choice(L, c, f + T_PREEMPT, "", "preempt", 0, preempts, &preempt) ||
        get_choice(L, c, f + T_PRIORITY, "", "priority", 0, prios, &prio) ||
        get_bool(L, c, f + T_LAYERWISE, "", "layerwise", false, &tp->layerwise))
        return -1;
    tp->order = order == 1 ? KV_ORDER_ANCHOR_FIRST : KV_ORDER_CONCURRENT;
    tp->priority_mode = prio; /* kv_priority_mode of net.h: none 0, strict 1, weighted 2 */
    tp->preempt = preempt == 1 ? KV_PREEMPT_SWAP : KV_PREEMPT_RECOMPUTE;
    double wa = 1.0, wr = 1.0;
    int w = f + T_WEIGHTS;
    if (!lua_isnil(L, w)) {
        if (!lua_istable(L, w)) {
            char got[80];
            kv_policy_describe_value(L, w, got, sizeof got);
            return kv_policy_answer_bad(c, "weights = %s; expected a table {anchor = 3, residual = 1}", got);
        }
        int g;
        if (read_fields(L, c, w, "weights", wfields, 2, &g) ||
            get_num(L, c, g, "weights", "anchor", 1.0, &wa) || get_num(L, c, g + 1, "weights", "residual", 1.0, &wr))
            return -1;
        if (wa <= 0 || wr <= 0)
            return kv_policy_answer_bad(c, "weights = {anchor = %.14g, residual = %.14g}; both must be above 0", wa,
                                        wr);
    }
    tp->anchor_weight = wa / (wa + wr);
    tp->residual_weight = wr / (wa + wr);
    int lv = f + T_LEVELS;
    if (lua_isnil(L, lv))
        return 0;
    if (!lua_istable(L, lv)) {
        char got[80];
        kv_policy_describe_value(L, lv, got, sizeof got);
        return kv_policy_answer_bad(c, "levels = %s; expected a table {anchor = 0, residual = 1}", got);
    }
    int g;
    if (read_fields(L, c, lv, "levels", wfields, 2, &g) ||
        get_int(L, c, g, "levels", "anchor", 0, 0, KV_MAX_FLOW_LEVEL, &tp->anchor_level) ||
        get_int(L, c, g + 1, "levels", "residual", 0, 0, KV_MAX_FLOW_LEVEL, &tp->residual_level))
        return -1;
    if (wa / wr > KV_MAX_WEIGHT_RATIO || wr / wa > KV_MAX_WEIGHT_RATIO)
        return kv_policy_answer_bad(c, "weights = {anchor = %.14g, residual = %.14g}; with levels the ratio must be "
                                       "at most %.0e", wa, wr, KV_MAX_WEIGHT_RATIO);
    tp->levels = true;
    return 0;
}

/* Placement answer: a node table from ctx.nodes or its `index`. */
int kv_policy_answer_node(lua_State *L, kv_policy_call *c, int t, int nodes_idx, int *out)
{
    t = lua_absindex(L, t);
    if (lua_istable(L, t)) {
        for (int i = 0; i < c->n_nodes; i++) {
            lua_rawgeti(L, nodes_idx, i + 1);
            bool same = lua_rawequal(L, -1, t);
            lua_pop(L, 1);
            if (same) {
                *out = c->nodes[i].index;
                return 0;
            }
        }
        return kv_policy_answer_bad(c, "a table that is not one of ctx.nodes; return a node from ctx.nodes or its "
                                       "index");
    }
    int isint = 0;
    lua_Integer v = lua_type(L, t) == LUA_TNUMBER ? lua_tointegerx(L, t, &isint) : 0;
    if (isint)
        for (int i = 0; i < c->n_nodes; i++)
            if (c->nodes[i].index == v) {
                *out = c->nodes[i].index;
                return 0;
            }
    char got[80], range[64] = "";
    kv_policy_describe_value(L, t, got, sizeof got);
    if (c->n_nodes > 0)
        snprintf(range, sizeof range, " (indices %d..%d)", c->nodes[0].index, c->nodes[c->n_nodes - 1].index);
    return kv_policy_answer_bad(c, "%s; expected the index of one of the %d %s nodes%s, or one of ctx.nodes", got,
                                c->n_nodes, c->hook == H_PREFILL_NODE ? "prefill" : "decode", range);
}

int kv_policy_answer_speculate(lua_State *L, kv_policy_call *c, int idx, int *out)
{
    int isint = 0;
    lua_Integer v = lua_type(L, idx) == LUA_TNUMBER ? lua_tointegerx(L, idx, &isint) : 0;
    if (!isint || v < 0 || v > KV_POLICY_MAX_SPECULATE) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected an integer from 0 to %d (speculative tokens)", got,
                                    KV_POLICY_MAX_SPECULATE);
    }
    *out = (int)v;
    return 0;
}

int kv_policy_answer_admit(lua_State *L, kv_policy_call *c, int idx, bool *out)
{
    if (!lua_isboolean(L, idx)) {
        char got[80];
        kv_policy_describe_value(L, idx, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected true (admit) or false (wait)", got);
    }
    *out = lua_toboolean(L, idx);
    return 0;
}
