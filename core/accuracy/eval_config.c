/* eval_config.c — what `kvsim eval` takes from a loaded scenario: its policies and the `accuracy` section. */
#include "core/accuracy/eval_config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/didyoumean.h"
#include "core/config/scenario.h"
#include "core/config/ytree.h"
#include "core/policy/policy_spec.h"

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct akey {
    const char *name; /* dotted below accuracy */
    int lo, hi;       /* integer range; lo > hi for non-integers */
} akey;

static const akey accuracy_keys[] = {
    {"model", 1, 0},
    {"texts", 1, 0},
    {"context_tokens", 1, 1 << 20},
    {"score_tokens", 0, 1 << 20},
    {"generate_tokens", 0, 1 << 20},
    {"needle", 1, 0},
    {"speculative_positions", 0, 256},
    {"speculation_points", 1, 64},
    {"backend", 1, 0},
};
static const akey needle_keys[] = {
    {"count", 0, 1000},
    {"context_tokens", 64, 1 << 20},
};

static int unknown_key(const kv_ynode *map, size_t k, const char *section, const akey *keys, size_t n,
                       kv_error *err)
{
    const char *word = map->keys[k], *names_v[16];
    char names[512] = "";
    for (size_t i = 0; i < n; i++) {
        if (i < sizeof names_v / sizeof names_v[0])
            names_v[i] = keys[i].name;
        strncat(names, keys[i].name, sizeof names - strlen(names) - 3);
        if (i + 1 < n)
            strcat(names, ", ");
    }
    const char *best = kv_did_you_mean(word, names_v, n < 16 ? n : 16);
    char hint[160] = "";
    if (best)
        snprintf(hint, sizeof hint, "; did you mean '%s'?", best);
    return kv_error_set(err, KV_EINPUT, "%s:%d:%d: %s.%s: unknown key%s (known: %s)", map->file, map->key_lines[k],
                        map->key_cols[k], section, word, hint, names);
}

static int get_int(const kv_ynode *v, const char *key, int lo, int hi, int *out, kv_error *err)
{
    char w[512];
    if (v->kind != KV_YSCALAR || v->quoted)
        return kv_error_set(err, KV_EINPUT, "%s: %s: expected an integer", kv_ytree_where(v, w, sizeof w), key);
    char *end;
    errno = 0;
    long x = strtol(v->value, &end, 10);
    if (end == v->value || *end || errno)
        return kv_error_set(err, KV_EINPUT, "%s: %s: '%s' is not an integer", kv_ytree_where(v, w, sizeof w), key,
                            v->value);
    if (x < lo || x > hi)
        return kv_error_set(err, KV_EINPUT, "%s: %s: %ld is out of range (%d..%d)", kv_ytree_where(v, w, sizeof w),
                            key, x, lo, hi);
    *out = (int)x;
    return KV_OK;
}

/* Records where the key's value is written (owned by the scenario). */
static void set_where(const char **slot, const kv_ynode *v)
{
    char w[512];
    kv_free((char *)*slot);
    *slot = kv_strdup(kv_ytree_where(v, w, sizeof w));
}

/* A file named in the accuracy section, resolved as every scenario path is (kv_scenario_find_file). */
static bool find_file(const kv_scenario *sc, const char *name, const char *key, char *out, size_t size)
{
    kv_error ignored;
    kv_error_clear(&ignored);
    return kv_scenario_find_file(sc, name, key, out, size, &ignored) == KV_OK;
}

int kv_eval_model_path(const char *model, char *out, size_t size, kv_error *err)
{
    if (strcmp(model, "smollm2-135m") == 0) {
        const char *dir = getenv("KVSIM_MODEL_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (dir && dir[0])
            snprintf(out, size, "%s/%s", dir, MODEL_FILE);
        else if (xdg && xdg[0])
            snprintf(out, size, "%s/kvsim/models/%s", xdg, MODEL_FILE);
        else
            snprintf(out, size, "%s/.cache/kvsim/models/%s", home ? home : ".", MODEL_FILE);
        if (access(out, R_OK) != 0)
            return kv_error_set(err, KV_EINPUT,
                                "accuracy.model: smollm2-135m is not in the cache ('%s' is missing); run "
                                "scripts/fetch-model.sh to download and check it",
                                out);
        return KV_OK;
    }
    snprintf(out, size, "%s", model);
    if (access(out, R_OK) != 0)
        return kv_error_set(err, KV_EINPUT, "accuracy.model: model file '%s' not found: %s", model, strerror(errno));
    return KV_OK;
}

static int load_accuracy(kv_eval_scenario *s, const kv_ynode *acc, const kv_scenario *sc, kv_error *err)
{
    char w[512];
    if (acc->kind != KV_YMAP)
        return kv_error_set(err, KV_EINPUT, "%s: accuracy: expected a mapping", kv_ytree_where(acc, w, sizeof w));
    for (size_t k = 0; k < acc->count; k++) {
        const char *key = acc->keys[k];
        const kv_ynode *v = acc->items[k];
        size_t i = 0;
        while (i < sizeof accuracy_keys / sizeof accuracy_keys[0] && strcmp(accuracy_keys[i].name, key))
            i++;
        if (i == sizeof accuracy_keys / sizeof accuracy_keys[0])
            return unknown_key(acc, k, "accuracy", accuracy_keys, sizeof accuracy_keys / sizeof accuracy_keys[0], err);
        char full[128];
        snprintf(full, sizeof full, "accuracy.%s", key);
        int rc = KV_OK;
        if (strcmp(key, "backend") == 0) {
            if (v->kind != KV_YSCALAR || !v->value[0])
                return kv_error_set(err, KV_EINPUT, "%s: accuracy.backend: expected a backend name or none",
                                    kv_ytree_where(v, w, sizeof w));
            kv_free(s->backend);
            s->backend = kv_strdup(v->value);
        } else if (strcmp(key, "model") == 0) {
            if (v->kind != KV_YSCALAR || !v->value[0])
                return kv_error_set(err, KV_EINPUT, "%s: accuracy.model: expected smollm2-135m or a .gguf path",
                                    kv_ytree_where(v, w, sizeof w));
            kv_free(s->model);
            char path[4096];
            if (strcmp(v->value, "smollm2-135m") != 0 && find_file(sc, v->value, "accuracy.model", path, sizeof path))
                s->model = kv_strdup(path);
            else
                s->model = kv_strdup(v->value);
        } else if (strcmp(key, "texts") == 0) {
            if (v->kind != KV_YSEQ)
                return kv_error_set(err, KV_EINPUT, "%s: accuracy.texts: expected a list of file paths",
                                    kv_ytree_where(v, w, sizeof w));
            for (int t = 0; t < s->n_texts; t++)
                kv_free(s->texts[t]);
            kv_free(s->texts);
            s->texts = kv_calloc(v->count + 1, sizeof *s->texts);
            s->n_texts = 0;
            for (size_t t = 0; t < v->count; t++) {
                const kv_ynode *item = v->items[t];
                char path[4096];
                if (item->kind != KV_YSCALAR || !item->value[0])
                    return kv_error_set(err, KV_EINPUT, "%s: accuracy.texts[%zu]: expected a file path",
                                        kv_ytree_where(item, w, sizeof w), t);
                if (!find_file(sc, item->value, "accuracy.texts", path, sizeof path))
                    return kv_error_set(err, KV_EINPUT, "%s: accuracy.texts[%zu]: file '%s' not found",
                                        kv_ytree_where(item, w, sizeof w), t, item->value);
                s->texts[s->n_texts++] = kv_strdup(path);
            }
        } else if (strcmp(key, "needle") == 0) {
            if (v->kind != KV_YMAP)
                return kv_error_set(err, KV_EINPUT, "%s: accuracy.needle: expected {count: N, context_tokens: N}",
                                    kv_ytree_where(v, w, sizeof w));
            for (size_t j = 0; j < v->count && !rc; j++) {
                const char *nk = v->keys[j];
                if (strcmp(nk, "count") == 0)
                    rc = get_int(v->items[j], "accuracy.needle.count", needle_keys[0].lo, needle_keys[0].hi,
                                 &s->needle_count, err);
                else if (strcmp(nk, "context_tokens") == 0) {
                    rc = get_int(v->items[j], "accuracy.needle.context_tokens", needle_keys[1].lo, needle_keys[1].hi,
                                 &s->needle_context_tokens, err);
                    set_where(&s->where.needle_context_tokens, v->items[j]);
                }
                else
                    rc = unknown_key(v, j, "accuracy.needle", needle_keys, 2, err);
            }
        } else {
            int *dst = strcmp(key, "context_tokens") == 0    ? &s->context_tokens
                       : strcmp(key, "score_tokens") == 0    ? &s->score_tokens
                       : strcmp(key, "generate_tokens") == 0 ? &s->generate_tokens
                       : strcmp(key, "speculation_points") == 0 ? &s->speculation_points
                                                             : &s->speculative_positions;
            rc = get_int(v, full, accuracy_keys[i].lo, accuracy_keys[i].hi, dst, err);
            const char **slot = strcmp(key, "context_tokens") == 0    ? &s->where.context_tokens
                                : strcmp(key, "score_tokens") == 0    ? &s->where.score_tokens
                                : strcmp(key, "generate_tokens") == 0 ? &s->where.generate_tokens
                                : strcmp(key, "speculative_positions") == 0 ? &s->where.speculative_positions
                                                                      : NULL;
            if (slot)
                set_where(slot, v);
        }
        if (rc)
            return rc;
    }
    return KV_OK;
}

int kv_eval_scenario_from(const kv_scenario *sc, kv_eval_scenario **out, kv_error *err)
{
    *out = NULL;
    kv_eval_scenario *s = kv_calloc(1, sizeof *s);
    const char *path = sc->path;
    s->path = kv_strdup(path);
    s->seed = (uint64_t)sc->seed;
    s->model = kv_strdup("smollm2-135m");
    s->context_tokens = 1024;
    s->score_tokens = 128;
    s->generate_tokens = 64;
    s->needle_count = 4;
    s->needle_context_tokens = 1024;
    s->speculation_points = 4;
    s->backend = kv_strdup("cpu");
    /* Keys left at their default are named with the scenario's path. */
    s->where.context_tokens = kv_strdup(path);
    s->where.score_tokens = kv_strdup(path);
    s->where.generate_tokens = kv_strdup(path);
    s->where.needle_context_tokens = kv_strdup(path);
    s->where.speculative_positions = kv_strdup(path);
    kv_policy_limits_from_scenario(&sc->policy_limits, &s->policy_limits);
    const kv_ynode *acc = sc->accuracy;
    int rc = KV_OK;
    if (!acc)
        rc = kv_error_set(err, KV_EINPUT,
                          "%s: accuracy: missing; kvsim eval needs an accuracy section (see docs/accuracy.md)", path);
    if (!rc) {
        /* Texts default to a licence that ships with Debian. */
        const char *gpl = "/usr/share/common-licenses/GPL-3";
        if (!kv_ytree_get(acc, "texts", NULL) && access(gpl, R_OK) == 0) {
            s->texts = kv_calloc(1, sizeof *s->texts);
            s->texts[s->n_texts++] = kv_strdup(gpl);
        }
        rc = load_accuracy(s, acc, sc, err);
    }
    s->policies = kv_calloc(sc->policies.count + 1, sizeof *s->policies);
    for (size_t i = 0; !rc && i < sc->policies.count; i++) {
        rc = kv_policy_spec_read(sc, i, &s->policies[i], err);
        if (!rc)
            s->n_policies++;
    }
    if (rc) {
        kv_eval_scenario_destroy(s);
        return rc;
    }
    *out = s;
    return KV_OK;
}

void kv_eval_scenario_destroy(kv_eval_scenario *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_policies; i++)
        kv_policy_spec_free(&s->policies[i]);
    kv_free(s->policies);
    for (int t = 0; t < s->n_texts; t++)
        kv_free(s->texts[t]);
    kv_free(s->texts);
    kv_free(s->model);
    kv_free(s->backend);
    kv_free((char *)s->where.context_tokens);
    kv_free((char *)s->where.score_tokens);
    kv_free((char *)s->where.generate_tokens);
    kv_free((char *)s->where.needle_context_tokens);
    kv_free((char *)s->where.speculative_positions);
    kv_free(s->path);
    kv_free(s);
}
