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

#include "core/policy_internal.h"

/* --- messages ------------------------------------------------------------ */

static int levenshtein(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

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
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < n; i++) {
        int d = levenshtein(word, sorted[i]);
        if (d < best_d) {
            best_d = d;
            best = sorted[i];
        }
    }
    size_t len = strlen(word);
    int limit = len <= 4 ? 1 : (len <= 8 ? 2 : 3);
    size_t off = 0;
    buf[0] = '\0';
    if (best && best_d <= limit)
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

/* Rejects keys of the table at t that are not in `allowed` (NULL-terminated);
   reports the alphabetically first offender, so messages are reproducible. */
static int check_keys(lua_State *L, kv_policy_call *c, int t, const char *what, const char *const *allowed)
{
    const char *worst = NULL;
    char other[64] = "";
    t = lua_absindex(L, t);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            if (!other[0])
                kv_policy_describe_value(L, -1, other, sizeof other);
            continue;
        }
        const char *k = lua_tostring(L, -1);
        bool ok = false;
        for (int i = 0; allowed[i]; i++)
            if (strcmp(k, allowed[i]) == 0)
                ok = true;
        if (!ok && (!worst || strcmp(k, worst) < 0))
            worst = k;
    }
    int n = 0;
    while (allowed[n])
        n++;
    if (worst) {
        char hint[400];
        kv_policy_suggest(worst, allowed, n, "fields", hint, sizeof hint);
        return kv_policy_answer_bad(c, "a field '%s' in %s that kvsim does not know%s", worst, what[0] ? what : "the answer", hint);
    }
    if (other[0])
        return kv_policy_answer_bad(c, "%s has a key %s; only named fields are allowed", what[0] ? what : "the answer", other);
    return 0;
}

/* Reads an integer field (integral floats are accepted) in [lo, hi]; dflt when nil. */
static int get_int(lua_State *L, kv_policy_call *c, int t, const char *field, const char *what, int dflt, int lo,
                   int hi, int *out)
{
    lua_getfield(L, t, field);
    int rc = 0;
    if (lua_isnil(L, -1)) {
        *out = dflt;
    } else {
        int isint = 0;
        lua_Integer v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint || v < lo || v > hi) {
            char got[80];
            kv_policy_describe_value(L, -1, got, sizeof got);
            rc = kv_policy_answer_bad(c, "%s%s%s = %s; expected an integer from %d to %d", what, what[0] ? "." : "", field, got, lo, hi);
        } else {
            *out = (int)v;
        }
    }
    lua_pop(L, 1);
    return rc;
}

static int get_num(lua_State *L, kv_policy_call *c, int t, const char *field, const char *what, double dflt,
                   double *out)
{
    lua_getfield(L, t, field);
    int rc = 0;
    if (lua_isnil(L, -1)) {
        *out = dflt;
    } else if (lua_type(L, -1) != LUA_TNUMBER || !isfinite((double)lua_tonumber(L, -1)) ||
               lua_tonumber(L, -1) < 0) {
        char got[80];
        kv_policy_describe_value(L, -1, got, sizeof got);
        rc = kv_policy_answer_bad(c, "%s.%s = %s; expected a finite number >= 0", what, field, got);
    } else {
        *out = (double)lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return rc;
}

static int get_bool(lua_State *L, kv_policy_call *c, int t, const char *field, const char *what, bool dflt, bool *out)
{
    lua_getfield(L, t, field);
    int rc = 0;
    if (lua_isnil(L, -1)) {
        *out = dflt;
    } else if (!lua_isboolean(L, -1)) {
        char got[80];
        kv_policy_describe_value(L, -1, got, sizeof got);
        rc = kv_policy_answer_bad(c, "%s%s%s = %s; expected true or false", what, what[0] ? "." : "", field, got);
    } else {
        *out = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return rc;
}

/* Reads a string field that must be one of `choices`; returns its index. */
static int get_choice(lua_State *L, kv_policy_call *c, int t, const char *field, int dflt, const char *const *choices,
                      int *out)
{
    lua_getfield(L, t, field);
    int rc = 0;
    if (lua_isnil(L, -1)) {
        *out = dflt;
    } else {
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int n = 0, found = -1;
        while (choices[n]) {
            if (s && strcmp(s, choices[n]) == 0)
                found = n;
            n++;
        }
        if (found < 0) {
            char got[80], hint[300];
            kv_policy_describe_value(L, -1, got, sizeof got);
            kv_policy_suggest(s ? s : "", choices, n, "choices", hint, sizeof hint);
            rc = kv_policy_answer_bad(c, "%s = %s; not a valid choice%s", field, got, hint);
        } else {
            *out = found;
        }
    }
    lua_pop(L, 1);
    return rc;
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

/* One of K or V: "bf16", {kind = "bf16"}, or {bits, anchor_bits, group_size, per_channel}. */
static int parse_tensor(lua_State *L, kv_policy_call *c, int t, const char *what, const kv_tensor_enc *dflt,
                        kv_tensor_enc *out)
{
    static const char *const fields[] = {"anchor_bits", "bits", "group_size", "kind", "per_channel", NULL};
    static const char *const kinds[] = {"bf16", "int", NULL};
    t = lua_absindex(L, t);
    if (lua_isnil(L, t) && dflt) {
        *out = *dflt;
        return 0;
    }
    if (lua_type(L, t) == LUA_TSTRING) {
        if (strcmp(lua_tostring(L, t), "bf16") == 0) {
            kv_policy_set_bf16(out);
            return 0;
        }
        char got[80];
        kv_policy_describe_value(L, t, got, sizeof got);
        return kv_policy_answer_bad(c, "%s = %s; expected \"bf16\" or a table like {bits = 4, group_size = 32}", what, got);
    }
    if (!lua_istable(L, t)) {
        char got[80];
        kv_policy_describe_value(L, t, got, sizeof got);
        return kv_policy_answer_bad(c, "%s = %s; expected \"bf16\" or a table like {bits = 4, group_size = 32}", what, got);
    }
    if (check_keys(L, c, t, what, fields))
        return -1;
    lua_getfield(L, t, "kind");
    bool has_kind = !lua_isnil(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, t, "bits");
    bool has_bits = !lua_isnil(L, -1);
    lua_pop(L, 1);
    int kind = 1;
    char kwhat[96];
    snprintf(kwhat, sizeof kwhat, "%s.kind", what);
    if (has_kind && get_choice(L, c, t, "kind", 1, kinds, &kind)) {
        char tmp[sizeof c->detail];
        snprintf(tmp, sizeof tmp, "%s.%s", what, c->detail);
        return kv_policy_answer_bad(c, "%s", tmp);
    }
    if (kind == 0) {
        static const char *const extra[] = {"anchor_bits", "bits", "group_size", "per_channel"};
        for (int i = 0; i < 4; i++) {
            lua_getfield(L, t, extra[i]);
            bool present = !lua_isnil(L, -1);
            lua_pop(L, 1);
            if (present)
                return kv_policy_answer_bad(c, "%s has kind = \"bf16\" and %s; bf16 takes no %s (remove it, or drop kind to "
                              "quantize)", what, extra[i], extra[i]);
        }
        kv_policy_set_bf16(out);
        return 0;
    }
    if (!has_bits)
        return kv_policy_answer_bad(c, "%s has no bits; write {bits = 8, group_size = 32} or \"bf16\"", what);
    memset(out, 0, sizeof *out);
    out->kind = KV_TENSOR_INT;
    bool per_channel = false;
    if (get_int(L, c, t, "bits", what, 0, 1, 16, &out->bits))
        return -1;
    if (get_int(L, c, t, "anchor_bits", what, 0, 0, out->bits - 1, &out->anchor_bits)) {
        if (out->bits == 1)
            return kv_policy_answer_bad(c, "%s.anchor_bits must be 0 when bits = 1 (there is nothing to split)", what);
        return -1;
    }
    if (get_int(L, c, t, "group_size", what, KV_DEFAULT_GROUP_SIZE, 1, KV_MAX_GROUP_SIZE, &out->group_size))
        return -1;
    if (get_bool(L, c, t, "per_channel", what, false, &per_channel))
        return -1;
    out->per_channel = per_channel;
    return 0;
}

int kv_policy_answer_encoding(lua_State *L, kv_policy_call *c, int t, kv_encoding *e)
{
    static const char *const fields[] = {"diffkv", "full_precision_window", "key", "value", NULL};
    static const char *const dfields[] = {"alpha_high", "alpha_low", "key_low", "value_low", "window", NULL};
    t = lua_absindex(L, t);
    memset(e, 0, sizeof *e);
    if (lua_type(L, t) == LUA_TSTRING && strcmp(lua_tostring(L, t), "bf16") == 0) {
        kv_policy_set_bf16(&e->key);
        kv_policy_set_bf16(&e->value);
        return 0;
    }
    if (!lua_istable(L, t)) {
        char got[80];
        kv_policy_describe_value(L, t, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected \"bf16\" or a table {key = ..., value = ...}", got);
    }
    if (check_keys(L, c, t, "", fields))
        return -1;
    lua_getfield(L, t, "key");
    lua_getfield(L, t, "value");
    if (lua_isnil(L, -2) || lua_isnil(L, -1))
        return kv_policy_answer_bad(c, "a table without '%s'; an encoding needs both key and value (e.g. value = \"bf16\")",
                   lua_isnil(L, -2) ? "key" : "value");
    if (parse_tensor(L, c, -2, "key", NULL, &e->key) || parse_tensor(L, c, -1, "value", NULL, &e->value))
        return -1;
    lua_pop(L, 2);
    if (get_int(L, c, t, "full_precision_window", "", 0, 0, KV_MAX_WINDOW, &e->full_precision_window))
        return -1;
    lua_getfield(L, t, "diffkv");
    int d = lua_gettop(L);
    if (lua_isnil(L, d) || (lua_isboolean(L, d) && !lua_toboolean(L, d))) {
        lua_pop(L, 1);
        return 0;
    }
    if (!lua_istable(L, d) && !lua_isboolean(L, d)) {
        char got[80];
        kv_policy_describe_value(L, d, got, sizeof got);
        return kv_policy_answer_bad(c, "diffkv = %s; expected a table {key_low = ..., value_low = ..., alpha_high = ..., "
                      "alpha_low = ..., window = ...} or true", got);
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
    e->alpha_high = 1.0;
    e->alpha_low = 0.02;
    e->window = 64;
    e->key_low = klow;
    e->value_low = vlow;
    if (lua_isboolean(L, d)) {
        lua_pop(L, 1);
        return 0;
    }
    if (check_keys(L, c, d, "diffkv", dfields))
        return -1;
    lua_getfield(L, d, "key_low");
    if (parse_tensor(L, c, -1, "diffkv.key_low", &klow, &e->key_low))
        return -1;
    lua_pop(L, 1);
    lua_getfield(L, d, "value_low");
    if (parse_tensor(L, c, -1, "diffkv.value_low", &vlow, &e->value_low))
        return -1;
    lua_pop(L, 1);
    if (get_num(L, c, d, "alpha_high", "diffkv", 1.0, &e->alpha_high) ||
        get_num(L, c, d, "alpha_low", "diffkv", 0.02, &e->alpha_low) ||
        get_int(L, c, d, "window", "diffkv", 64, 0, KV_MAX_WINDOW, &e->window))
        return -1;
    if (e->alpha_low > e->alpha_high)
        return kv_policy_answer_bad(c, "diffkv.alpha_low = %.14g is above diffkv.alpha_high = %.14g; need alpha_low <= alpha_high "
                      "(equal values mean: no low tier, prune below alpha_high)", e->alpha_low, e->alpha_high);
    lua_pop(L, 1);
    return 0;
}

int kv_policy_answer_transfer(lua_State *L, kv_policy_call *c, int t, kv_transfer_plan *tp)
{
    static const char *const fields[] = {"layerwise", "order", "preempt", "priority", "weights", NULL};
    static const char *const orders[] = {"concurrent", "anchor_first", NULL};
    static const char *const preempts[] = {"recompute", "swap", NULL};
    static const char *const prios[] = {"none", "strict", "weighted", NULL};
    static const char *const wfields[] = {"anchor", "residual", NULL};
    t = lua_absindex(L, t);
    memset(tp, 0, sizeof *tp);
    if (!lua_istable(L, t)) {
        char got[80];
        kv_policy_describe_value(L, t, got, sizeof got);
        return kv_policy_answer_bad(c, "%s; expected a table {order = ..., priority = ..., weights = ..., layerwise = ...}", got);
    }
    if (check_keys(L, c, t, "", fields))
        return -1;
    int order = 0, prio = 0, preempt = 0;
    if (get_choice(L, c, t, "order", 0, orders, &order) || get_choice(L, c, t, "priority", 0, prios, &prio) ||
        get_choice(L, c, t, "preempt", 0, preempts, &preempt) ||
        get_bool(L, c, t, "layerwise", "", false, &tp->layerwise))
        return -1;
    tp->order = order == 1 ? KV_ORDER_ANCHOR_FIRST : KV_ORDER_CONCURRENT;
    tp->priority_mode = prio; /* kv_priority_mode: none 0, strict 1, weighted 2 */
    tp->preempt = preempt == 1 ? KV_PREEMPT_SWAP : KV_PREEMPT_RECOMPUTE;
    double wa = 1.0, wr = 1.0;
    lua_getfield(L, t, "weights");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1)) {
            char got[80];
            kv_policy_describe_value(L, -1, got, sizeof got);
            return kv_policy_answer_bad(c, "weights = %s; expected a table {anchor = 3, residual = 1}", got);
        }
        if (check_keys(L, c, -1, "weights", wfields) || get_num(L, c, -1, "anchor", "weights", 1.0, &wa) ||
            get_num(L, c, -1, "residual", "weights", 1.0, &wr))
            return -1;
        if (wa <= 0 || wr <= 0)
            return kv_policy_answer_bad(c, "weights = {anchor = %.14g, residual = %.14g}; both must be above 0", wa, wr);
    }
    lua_pop(L, 1);
    tp->anchor_weight = wa / (wa + wr);
    tp->residual_weight = wr / (wa + wr);
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
        return kv_policy_answer_bad(c, "a table that is not one of ctx.nodes; return a node from ctx.nodes or its index");
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
    return kv_policy_answer_bad(c, "%s; expected the index of one of the %d %s nodes%s, or one of ctx.nodes", got, c->n_nodes,
               c->hook == H_PREFILL_NODE ? "prefill" : "decode", range);
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
