/* table_args.c — the profiled-table flags of bench roofline and calibrate (table_args.h). */
#include "core/cli/table_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/datadir.h"

void kv_table_args_init(kv_table_args *t)
{
    memset(t, 0, sizeof *t);
    t->model = "llama-2-70b";
    t->device = "h100-sxm";
}

int kv_table_args_take(kv_table_args *t, const char *cmd, const char *flag, const char *value)
{
    const char **slot = strcmp(flag, "--profile") == 0         ? &t->profile
                        : strcmp(flag, "--profile-model") == 0 ? &t->profile_model
                        : strcmp(flag, "--hardware") == 0      ? &t->hardware
                        : strcmp(flag, "--model") == 0         ? &t->model
                        : strcmp(flag, "--device") == 0        ? &t->device
                                                               : NULL;
    if (slot) {
        *slot = value;
        return 1;
    }
    if (strcmp(flag, "--tp") != 0)
        return 0;
    char *end = NULL;
    long tp = strtol(value, &end, 10);
    if (!*value || *end || tp < 1 || tp > 4096) {
        fprintf(stderr, "kvsim %s: --tp: expected an integer 1-4096, got '%s'\n", cmd, value);
        return 2;
    }
    if (t->n_tp == KV_TABLE_MAX_TP) {
        fprintf(stderr, "kvsim %s: --tp: at most %d degrees\n", cmd, KV_TABLE_MAX_TP);
        return 2;
    }
    for (int k = 0; k < t->n_tp; k++)
        if (t->tps[k] == (int)tp) {
            fprintf(stderr, "kvsim %s: --tp: %ld given twice\n", cmd, tp);
            return 2;
        }
    t->tps[t->n_tp++] = (int)tp;
    return 1;
}

int kv_table_args_parse(kv_table_args *t, const char *cmd, int argc, char **argv, const char *extra,
                        const char **extra_value, void (*usage)(FILE *))
{
    kv_table_args_init(t);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvsim %s: %s needs a value\n", cmd, a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int taken = kv_table_args_take(t, cmd, a, v);
        if (taken == 2)
            return 2;
        if (taken)
            continue;
        if (extra && strcmp(a, extra) == 0) {
            *extra_value = v;
        } else {
            fprintf(stderr, "kvsim %s: unknown option '%s'\n", cmd, a);
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

int kv_table_args_load(const kv_table_args *t, const char *cmd, kv_model_card *m, kv_device_profile *d)
{
    char root[KV_DATA_PATH_MAX], data[KV_DATA_PATH_MAX + 16];
    snprintf(data, sizeof data, "%s/scenarios", kv_data_dir(root, sizeof root) ? root : ".");
    const char *dirs[] = {".", data};
    kv_error err = {0};
    if (kv_model_card_load(t->model, dirs, 2, "--model", m, &err)) {
        fprintf(stderr, "kvsim %s: %s\n", cmd, err.msg);
        return 2;
    }
    if (kv_device_profile_load(t->device, dirs, 2, "--device", d, &err)) {
        fprintf(stderr, "kvsim %s: %s\n", cmd, err.msg);
        kv_model_card_free(m);
        return 2;
    }
    return 0;
}
