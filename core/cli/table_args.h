/* table_args.h — the flags of the commands that set a profiled table beside a model card and device
 * profile (kvsim bench roofline, kvsim calibrate): --profile, --profile-model, --hardware, --model,
 * --device and --tp, parsed and loaded in one place. */
#ifndef KV_TABLE_ARGS_H
#define KV_TABLE_ARGS_H

#include <stdio.h>

#include "core/config/cards.h"

#define KV_TABLE_MAX_TP 16 /* --tp degrees at most */

typedef struct kv_table_args {
    const char *profile, *profile_model, *hardware; /* the table and which of its rows */
    const char *model, *device;                     /* card and device profile (defaults: llama-2-70b, h100-sxm) */
    int tps[KV_TABLE_MAX_TP], n_tp;                 /* --tp degrees, in the order given, each once */
} kv_table_args;

void kv_table_args_init(kv_table_args *t);

/* Takes `flag value` when it is one of the flags above: 1 taken, 0 not one of them, 2 a bad value (the
   message, prefixed "kvsim CMD: ", is on stderr). */
int kv_table_args_take(kv_table_args *t, const char *cmd, const char *flag, const char *value);

/* Parses argv[1..argc): --help/-h (usage(stdout), returns -1), these flags, and one more flag `extra`
   whose value goes to *extra_value (NULL: none); 0, or 2 after a message and usage(stderr). */
int kv_table_args_parse(kv_table_args *t, const char *cmd, int argc, char **argv, const char *extra,
                        const char **extra_value, void (*usage)(FILE *));

/* Loads the model card and device profile (looked for in the working folder, then kvsim's data folder):
   0, or 2 with the message on stderr and nothing to free. */
int kv_table_args_load(const kv_table_args *t, const char *cmd, kv_model_card *m, kv_device_profile *d);

#endif
