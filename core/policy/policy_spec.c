/* policy_spec.c — a scenario's policy entry turned into a file and parameters (policy_spec.h). */
#include "core/policy/policy_spec.h"

#include <stdio.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/config/ytree.h"

int kv_policy_spec_read(const kv_scenario *s, size_t i, kv_policy_spec *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    const char *name = s->policies.items[i];
    const kv_ynode *settings = s->policy_settings ? kv_ytree_get(s->policy_settings, name, NULL) : NULL;
    const kv_ynode *file_node = settings ? kv_ytree_get(settings, "file", NULL) : NULL;
    char rel[1024], path[4096], w[512], key[300];
    if (file_node && (file_node->kind != KV_YSCALAR || !file_node->value[0]))
        return kv_error_set(err, KV_EINPUT, "%s: policy.%s.file: expected a path",
                            kv_ytree_where(file_node, w, sizeof w), name);
    if (file_node)
        snprintf(rel, sizeof rel, "%s", file_node->value);
    else
        snprintf(rel, sizeof rel, "policies/%s.lua", name);
    snprintf(key, sizeof key, file_node ? "policy.%s.file" : "policies", name);
    int rc = kv_scenario_find_file(s, rel, key, path, sizeof path, err);
    if (rc)
        return rc;
    out->name = kv_strdup(name);
    out->file = kv_strdup(path);
    size_t n = settings ? settings->count : 0;
    out->params = kv_calloc(n + 1, sizeof *out->params);
    out->where = kv_calloc(n + 1, sizeof *out->where);
    for (size_t k = 0; k < n; k++) {
        if (strcmp(settings->keys[k], "file") == 0)
            continue;
        const kv_ynode *v = settings->items[k];
        char *where = out->where[out->n_params];
        if (strncmp(v->file, "--set", 5) == 0) /* given on the command line */
            snprintf(where, sizeof out->where[0], "%s", v->file);
        else
            snprintf(where, sizeof out->where[0], "%s:%d:%d", settings->file, settings->key_lines[k],
                     settings->key_cols[k]);
        if (v->kind != KV_YSCALAR) {
            rc = kv_error_set(err, KV_EINPUT, "%s: policy.%s.%s: expected a number, boolean or string", where, name,
                              settings->keys[k]);
            kv_policy_spec_free(out);
            return rc;
        }
        out->params[out->n_params++] = (kv_policy_param){settings->keys[k], v->value, where};
    }
    return KV_OK;
}

void kv_policy_spec_free(kv_policy_spec *spec)
{
    kv_free(spec->name);
    kv_free(spec->file);
    kv_free(spec->params);
    kv_free(spec->where);
    memset(spec, 0, sizeof *spec);
}

int kv_policy_spec_load(const kv_policy_spec *spec, const kv_scenario *s, kv_policy **out, kv_error *err)
{
    kv_policy_limits lim;
    kv_policy_limits_from_scenario(&s->policy_limits, &lim);
    return kv_policy_load(spec->name, spec->file, spec->params, spec->n_params, &lim, out, err);
}
