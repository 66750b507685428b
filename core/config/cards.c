/* cards.c — load model cards and device profiles through their schemas. */
#include "core/config/cards.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/config/schema.h"
#include "core/config/ytree.h"

#define M(f) offsetof(kv_model_card, f)
static const kv_key_spec model_keys[] = {
    {"name", KV_KEY_STRING, M(name), NULL, 0, 0, NULL, "model name"},
    {"layers", KV_KEY_INT, M(layers), NULL, 1, 1000, NULL, "transformer layers"},
    {"hidden", KV_KEY_INT, M(hidden), NULL, 1, 1 << 20, NULL, "model width"},
    {"heads", KV_KEY_INT, M(heads), NULL, 1, 4096, NULL, "query heads"},
    {"kv_heads", KV_KEY_INT, M(kv_heads), NULL, 1, 4096, NULL, "key/value heads (GQA)"},
    {"head_dim", KV_KEY_INT, M(head_dim), NULL, 1, 4096, NULL, "dimension of one head"},
    {"ffn", KV_KEY_INT, M(ffn), NULL, 1, 1 << 22, NULL, "MLP intermediate size"},
    {"vocab", KV_KEY_INT, M(vocab), NULL, 1, 1 << 24, NULL, "vocabulary size"},
    {"params", KV_KEY_POSITIVE, M(params), NULL, 0, 1e15, NULL, "parameter count"},
    {"weight_bytes_per_param", KV_KEY_POSITIVE, M(weight_bytes_per_param), "2", 0, 8, NULL,
     "bytes a weight takes when served (2 = bf16)"},
    {"max_context", KV_KEY_INT, M(max_context), NULL, 1, 1 << 24, NULL, "longest context, tokens"},
    {"source", KV_KEY_STRING, M(source), "\"\"", 0, 0, NULL, "where the figures come from"},
};
#undef M
static const kv_schema model_schema = {"model card", model_keys, sizeof model_keys / sizeof model_keys[0]};

#define D(f) offsetof(kv_device_profile, f)
static const kv_key_spec device_keys[] = {
    {"name", KV_KEY_STRING, D(name), NULL, 0, 0, NULL, "device name"},
    {"vendor", KV_KEY_STRING, D(vendor), NULL, 0, 0, NULL, "vendor"},
    {"memory_gb", KV_KEY_POSITIVE, D(memory_gb), NULL, 0, 1e6, NULL, "device memory, GB (1e9 bytes)"},
    {"hbm_bandwidth_gbs", KV_KEY_POSITIVE, D(hbm_bandwidth_gbs), NULL, 0, 1e6, NULL, "peak memory bandwidth, GB/s"},
    {"bf16_tflops", KV_KEY_POSITIVE, D(bf16_tflops), NULL, 0, 1e6, NULL, "dense bf16 TFLOP/s"},
    {"fp32_tflops", KV_KEY_POSITIVE, D(fp32_tflops), NULL, 0, 1e6, NULL, "fp32 TFLOP/s"},
    {"int8_tops", KV_KEY_POSITIVE, D(int8_tops), NULL, 0, 1e6, NULL, "dense int8 TOP/s"},
    {"compute_efficiency", KV_KEY_POSITIVE, D(compute_efficiency), "0.6", 0, 1, NULL,
     "fraction of peak FLOP/s large GEMMs reach"},
    {"memory_efficiency", KV_KEY_POSITIVE, D(memory_efficiency), "0.8", 0, 1, NULL,
     "fraction of peak bandwidth streaming kernels reach"},
    {"kernel_overhead_us", KV_KEY_DOUBLE, D(kernel_overhead_s), "20", 0, 1e6, NULL,
     "fixed cost of one forward step, microseconds"},
    {"nic_bandwidth_gbps", KV_KEY_POSITIVE, D(nic_bandwidth_gbps), "400", 0, 1e6, NULL,
     "typical NIC, Gbit/s (informative)"},
    {"interconnect_gbs", KV_KEY_POSITIVE, D(interconnect_gbs), "450", 0, 1e6, NULL,
     "scale-up link bandwidth per device and direction, GB/s (tensor-parallel all-reduces)"},
    {"allreduce_latency_us", KV_KEY_DOUBLE, D(allreduce_latency_s), "10", 0, 1e6, NULL,
     "fixed cost of one all-reduce across the node's devices, microseconds"},
    {"source", KV_KEY_STRING, D(source), "\"\"", 0, 0, NULL, "datasheet the figures come from"},
    {"roofline", KV_KEY_SECTION, 0, NULL, 0, 0, NULL,
     "roofline calibration per tensor-parallel degree, written by kvsim calibrate (docs/timing.md); parallel "
     "lists, one item per tp; a pool whose tp is listed uses these instead of timing.roofline.*"},
    {"roofline.tp", KV_KEY_INTLIST, D(roofline_tp), "[]", 1, 4096, NULL, "the tp degrees calibrated"},
    {"roofline.prefill_floor_ms", KV_KEY_DOUBLELIST, D(roofline_lists[0]), "[]", 0, 1e6, NULL,
     "least time of a step with prompts, ms"},
    {"roofline.prefill_efficiency", KV_KEY_DOUBLELIST, D(roofline_lists[1]), "[]", 1e-6, 100, NULL,
     "a step with prompts costs its roofline time / this"},
    {"roofline.prefill_token_us", KV_KEY_DOUBLELIST, D(roofline_lists[2]), "[]", 0, 1e6, NULL,
     "plus this per prompt token, microseconds"},
    {"roofline.decode_floor_ms", KV_KEY_DOUBLELIST, D(roofline_lists[3]), "[]", 0, 1e6, NULL,
     "least time of a decode step, ms"},
    {"roofline.decode_efficiency", KV_KEY_DOUBLELIST, D(roofline_lists[4]), "[]", 1e-6, 100, NULL,
     "a decode step costs its roofline time / this"},
    {"roofline.decode_token_us", KV_KEY_DOUBLELIST, D(roofline_lists[5]), "[]", 0, 1e6, NULL,
     "plus this per decode token, microseconds"},
    {"roofline.prefill_knee_tokens", KV_KEY_DOUBLELIST, D(roofline_lists[6]), "[]", 0, 1e9, NULL,
     "step tokens above which prefill_knee_token_us is added per token (absent: no knee)"},
    {"roofline.prefill_knee_token_us", KV_KEY_DOUBLELIST, D(roofline_lists[7]), "[]", 0, 1e6, NULL,
     "plus this per prompt token above the knee, microseconds (0: no knee)"},
};
#undef D
static const kv_schema device_schema = {"device profile", device_keys, sizeof device_keys / sizeof device_keys[0]};

/* Resolves a name to a file: a path as given, else <dir>/<sub>/<name>.yaml. */
static int resolve(const char *name, const char *sub, const char *const *dirs, int n_dirs, const char *where,
                   const char *what, char *path, size_t size, kv_error *err)
{
    size_t len = strlen(name);
    if (strchr(name, '/') || (len > 5 && strcmp(name + len - 5, ".yaml") == 0)) {
        /* Relative paths are relative to the first search dir (the scenario's folder). */
        if (name[0] != '/' && n_dirs > 0)
            snprintf(path, size, "%s/%s", dirs[0], name);
        else
            snprintf(path, size, "%s", name);
        if (access(path, R_OK) == 0)
            return KV_OK;
        return kv_error_set(err, KV_EINPUT, "%s: %s file '%s' not found (looked at %s)", where, what, name, path);
    }
    for (int i = 0; i < n_dirs; i++) {
        snprintf(path, size, "%s/%s/%s.yaml", dirs[i], sub, name);
        if (access(path, R_OK) == 0)
            return KV_OK;
    }
    return kv_error_set(err, KV_EINPUT, "%s: no %s named '%s' (looked for %s/%s.yaml under %s%s)", where, what, name,
                        sub, name, n_dirs ? dirs[0] : ".", n_dirs > 1 ? " and the kvsim data folder" : "");
}

/* Checks the device profile's roofline lists (one item per tp, no tp twice; the knee lists may be absent)
   and builds its entries. */
static int device_roofline(const kv_ynode *tree, kv_device_profile *d, kv_error *err)
{
    static const char *const names[KV_DEVICE_ROOFLINE_LISTS] = {
        "prefill_floor_ms", "prefill_efficiency", "prefill_token_us",
        "decode_floor_ms",  "decode_efficiency",  "decode_token_us",
        "prefill_knee_tokens", "prefill_knee_token_us"};
    char key[64], w[512];
    size_t n = d->roofline_tp.count;
    for (int j = 0; j < KV_DEVICE_ROOFLINE_LISTS; j++) {
        snprintf(key, sizeof key, "roofline.%s", names[j]);
        const kv_ynode *at = kv_ytree_path(tree, key);
        if (d->roofline_lists[j].count == n || (j >= 6 && !at))
            continue;
        return kv_error_set(err, KV_EINPUT, "%s: %s: %zu items, but roofline.tp has %zu (one per tp)",
                            kv_ytree_where(at ? at : tree, w, sizeof w), key, d->roofline_lists[j].count, n);
    }
    const kv_ynode *knee = kv_ytree_path(tree, "roofline.prefill_knee_tokens");
    const kv_ynode *knee_us = kv_ytree_path(tree, "roofline.prefill_knee_token_us");
    if (!knee != !knee_us) /* a knee is its token count and its cost: both or neither */
        return kv_error_set(err, KV_EINPUT, "%s: roofline.%s is given without roofline.%s (both or neither)",
                            kv_ytree_where(knee ? knee : knee_us, w, sizeof w),
                            knee ? "prefill_knee_tokens" : "prefill_knee_token_us",
                            knee ? "prefill_knee_token_us" : "prefill_knee_tokens");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < i; k++)
            if (d->roofline_tp.items[i] == d->roofline_tp.items[k]) {
                const kv_ynode *at = kv_ytree_path(tree, "roofline.tp");
                return kv_error_set(err, KV_EINPUT, "%s: roofline.tp: tp %d is listed twice",
                                    kv_ytree_where(at ? at : tree, w, sizeof w), d->roofline_tp.items[i]);
            }
    if (n == 0)
        return KV_OK;
    d->roofline = kv_calloc(n, sizeof *d->roofline);
    d->n_roofline = n;
    for (size_t i = 0; i < n; i++) {
        kv_device_roofline *r = &d->roofline[i];
        r->tp = d->roofline_tp.items[i];
        for (int ph = 0; ph < 2; ph++) {
            r->floor_s[ph] = d->roofline_lists[3 * ph].items[i] * 1e-3;
            r->efficiency[ph] = d->roofline_lists[3 * ph + 1].items[i];
            r->token_s[ph] = d->roofline_lists[3 * ph + 2].items[i] * 1e-6;
        }
        if (d->roofline_lists[6].count == n && d->roofline_lists[7].count == n) {
            r->knee_tokens[0] = d->roofline_lists[6].items[i];
            r->knee_token_s[0] = d->roofline_lists[7].items[i] * 1e-6;
        }
    }
    return KV_OK;
}

static int load(const kv_schema *s, const char *sub, const char *name, const char *const *dirs, int n_dirs,
                const char *where, void *out, kv_error *err)
{
    char path[4096];
    int rc = resolve(name, sub, dirs, n_dirs, where, s->what, path, sizeof path, err);
    if (rc)
        return rc;
    kv_ynode *tree = NULL;
    rc = kv_ytree_load_file(path, &tree, err);
    if (!rc)
        rc = kv_schema_bind(s, tree, out, err);
    if (!rc && s == &device_schema)
        rc = device_roofline(tree, out, err);
    if (rc)
        kv_schema_free(s, out); /* a failed load owns nothing (the free NULLs what it frees: freeing again is fine) */
    kv_ytree_free(tree);
    return rc;
}

int kv_model_card_load(const char *name, const char *const *dirs, int n_dirs, const char *where, kv_model_card *out,
                       kv_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = load(&model_schema, "models", name, dirs, n_dirs, where, out, err);
    if (!rc && out->heads % out->kv_heads != 0)
        rc = kv_error_set(err, KV_EINPUT, "%s: model card '%s': heads (%d) must be a multiple of kv_heads (%d)",
                          where, name, out->heads, out->kv_heads);
    return rc;
}

void kv_model_card_free(kv_model_card *m)
{
    if (m)
        kv_schema_free(&model_schema, m);
}

int kv_device_profile_load(const char *name, const char *const *dirs, int n_dirs, const char *where,
                           kv_device_profile *out, kv_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = load(&device_schema, "devices", name, dirs, n_dirs, where, out, err);
    out->kernel_overhead_s *= 1e-6; /* the file says microseconds */
    out->allreduce_latency_s *= 1e-6;
    return rc;
}

void kv_device_profile_free(kv_device_profile *d)
{
    if (!d)
        return;
    kv_free(d->roofline);
    d->roofline = NULL;
    d->n_roofline = 0;
    kv_schema_free(&device_schema, d);
}

const kv_device_roofline *kv_device_roofline_find(const kv_device_profile *d, int tp)
{
    for (size_t i = 0; d && i < d->n_roofline; i++)
        if (d->roofline[i].tp == tp)
            return &d->roofline[i];
    return NULL;
}

void kv_cards_print_reference(FILE *out)
{
    fprintf(out, "# Model card (scenarios/models/<name>.yaml)\n");
    kv_schema_print(&model_schema, out);
    fprintf(out, "\n# Device profile (scenarios/devices/<name>.yaml)\n");
    kv_schema_print(&device_schema, out);
}

double kv_model_kv_values_per_token(const kv_model_card *m)
{
    return 2.0 * m->layers * m->kv_heads * m->head_dim;
}

double kv_model_weight_bytes(const kv_model_card *m)
{
    return m->params * m->weight_bytes_per_param;
}
