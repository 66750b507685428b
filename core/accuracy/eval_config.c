/* eval_config.c — reads `policies`, `policy.<name>.*`, `seed` and the `accuracy` section of a scenario. */
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

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? kv_strndup(path, (size_t)(slash - path)) : kv_strdup(".");
}

/* A readable file: absolute, or the first of the candidate folders that has it. */
static bool find_file(const char *name, const char *const *dirs, int n_dirs, char *out, size_t size)
{
    if (name[0] == '/') {
        snprintf(out, size, "%s", name);
        return access(out, R_OK) == 0;
    }
    for (int i = 0; i < n_dirs; i++) {
        if (!dirs[i])
            continue;
        snprintf(out, size, "%s/%s", dirs[i], name);
        if (access(out, R_OK) == 0)
            return true;
    }
    return false;
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

static int load_accuracy(kv_eval_scenario *s, const kv_ynode *acc, const char *const *dirs, int n_dirs,
                         kv_error *err)
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
            if (strcmp(v->value, "smollm2-135m") != 0 && find_file(v->value, dirs, n_dirs, path, sizeof path))
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
                if (!find_file(item->value, dirs, n_dirs, path, sizeof path))
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

static int load_policies(kv_eval_scenario *s, const kv_ynode *root, const char *const *dirs, int n_dirs,
                         kv_error *err)
{
    char w[512];
    const kv_ynode *list = kv_ytree_get(root, "policies", NULL);
    if (!list)
        return kv_error_set(err, KV_EINPUT, "%s: policies: missing (e.g. policies: [bf16, int8, int4])", s->path);
    if (list->kind != KV_YSEQ || list->count == 0)
        return kv_error_set(err, KV_EINPUT, "%s: policies: expected a non-empty list of names",
                            kv_ytree_where(list, w, sizeof w));
    const kv_ynode *settings = kv_ytree_get(root, "policy", NULL);
    if (settings && settings->kind != KV_YMAP)
        return kv_error_set(err, KV_EINPUT, "%s: policy: expected a mapping of policy names",
                            kv_ytree_where(settings, w, sizeof w));
    s->policies = kv_calloc(list->count, sizeof *s->policies);
    for (size_t i = 0; i < list->count; i++) {
        const kv_ynode *item = list->items[i];
        if (item->kind != KV_YSCALAR || !item->value[0])
            return kv_error_set(err, KV_EINPUT, "%s: policies[%zu]: expected a policy name",
                                kv_ytree_where(item, w, sizeof w), i);
        kv_eval_policy_spec *p = &s->policies[s->n_policies++];
        p->name = kv_strdup(item->value);
        const kv_ynode *mine = settings ? kv_ytree_get(settings, p->name, NULL) : NULL;
        if (mine && mine->kind != KV_YMAP)
            return kv_error_set(err, KV_EINPUT, "%s: policy.%s: expected a mapping", kv_ytree_where(mine, w, sizeof w),
                                p->name);
        const kv_ynode *file = mine ? kv_ytree_get(mine, "file", NULL) : NULL;
        char rel[1024], path[4096];
        if (file && (file->kind != KV_YSCALAR || !file->value[0]))
            return kv_error_set(err, KV_EINPUT, "%s: policy.%s.file: expected a path",
                                kv_ytree_where(file, w, sizeof w), p->name);
        snprintf(rel, sizeof rel, file ? "%s" : "policies/%s.lua", file ? file->value : p->name);
        if (!find_file(rel, dirs, n_dirs, path, sizeof path))
            return kv_error_set(err, KV_EINPUT, "%s: %s: policy file '%s' not found (looked in the working folder, "
                                                "beside the scenario and beside kvsim)",
                                kv_ytree_where(file ? file : item, w, sizeof w), file ? "policy file" : "policies",
                                rel);
        p->file = kv_strdup(path);
        size_t n = mine ? mine->count : 0;
        p->params = kv_calloc(n + 1, sizeof *p->params);
        for (size_t k = 0; k < n; k++) {
            if (strcmp(mine->keys[k], "file") == 0)
                continue;
            const kv_ynode *v = mine->items[k];
            if (v->kind != KV_YSCALAR)
                return kv_error_set(err, KV_EINPUT, "%s: policy.%s.%s: expected a number, boolean or string",
                                    kv_ytree_where(v, w, sizeof w), p->name, mine->keys[k]);
            char where[512];
            snprintf(where, sizeof where, "%s:%d:%d", mine->file, mine->key_lines[k], mine->key_cols[k]);
            p->params[p->n_params++] = (kv_policy_param){mine->keys[k], v->value, kv_strdup(where)};
        }
    }
    return KV_OK;
}

int kv_eval_scenario_load(const char *path, const char *exe_path, kv_eval_scenario **out, kv_error *err)
{
    *out = NULL;
    kv_ynode *root;
    int rc = kv_ytree_load_file(path, &root, err);
    if (rc)
        return rc;
    kv_eval_scenario *s = kv_calloc(1, sizeof *s);
    s->tree = root;
    s->path = kv_strdup(path);
    s->seed = 1;
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
    char *sdir = dir_of(path), *updir = kv_malloc(strlen(sdir) + 4), *exedir = NULL;
    sprintf(updir, "%s/..", sdir);
    if (exe_path && strchr(exe_path, '/')) {
        char *d = dir_of(exe_path);
        exedir = kv_malloc(strlen(d) + 4);
        sprintf(exedir, "%s/..", d);
        kv_free(d);
    }
    const char *dirs[] = {".", sdir, updir, exedir};
    char w[512];
    if (root->kind != KV_YMAP) {
        rc = kv_error_set(err, KV_EINPUT, "%s: a scenario is a mapping of keys", kv_ytree_where(root, w, sizeof w));
    } else {
        const kv_ynode *seed = kv_ytree_get(root, "seed", NULL);
        kv_scenario_limits limits;
        int sv = 1;
        if (seed)
            rc = get_int(seed, "seed", 0, INT_MAX, &sv, err);
        s->seed = (uint64_t)sv;
        if (!rc)
            rc = kv_scenario_read_policy_limits(root, &limits, err);
        if (!rc)
            kv_policy_limits_from_scenario(&limits, &s->policy_limits);
        const kv_ynode *acc = kv_ytree_get(root, "accuracy", NULL);
        if (!rc && !acc)
            rc = kv_error_set(err, KV_EINPUT,
                              "%s: accuracy: missing; kvsim eval needs an accuracy section (see docs/accuracy.md)",
                              path);
        if (!rc) {
            /* Texts default to a licence that ships with Debian. */
            const char *gpl = "/usr/share/common-licenses/GPL-3";
            if (!kv_ytree_get(acc, "texts", NULL) && access(gpl, R_OK) == 0) {
                s->texts = kv_calloc(1, sizeof *s->texts);
                s->texts[s->n_texts++] = kv_strdup(gpl);
            }
            rc = load_accuracy(s, acc, dirs, 4, err);
        }
        if (!rc)
            rc = load_policies(s, root, dirs, 4, err);
    }
    kv_free(sdir);
    kv_free(updir);
    kv_free(exedir);
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
    for (int i = 0; i < s->n_policies; i++) {
        kv_free(s->policies[i].name);
        kv_free(s->policies[i].file);
        for (int k = 0; k < s->policies[i].n_params; k++)
            kv_free((char *)s->policies[i].params[k].where);
        kv_free(s->policies[i].params);
    }
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
    kv_ytree_free(s->tree);
    kv_free(s);
}
