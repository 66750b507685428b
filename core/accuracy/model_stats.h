/* model_stats.h — a real model's measured statistics in one versioned file (docs/stats-format.md).
 *
 * Read by `lynx.from: file` and `diffkv.scores: file` (the scenario's `stats:`
 * path), written by `kvsim measure` and by scripts/measure-model.py. The
 * reader checks every member (type, range, shape against the model's layers
 * and KV heads, lengths increasing, quantiles increasing) and names the file,
 * line and member of the first problem (KV_EINPUT). Written numbers
 * round-trip exactly (17 significant digits), so write + read gives the same
 * run byte for byte.
 *
 * Ownership: kv_model_stats_read allocates everything; kv_model_stats_free
 * frees it. The curves handed to the engine (core/kv/curves.h) borrow from it.
 */
#ifndef KV_MODEL_STATS_H
#define KV_MODEL_STATS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/base/error.h"
#include "core/kv/curves.h"
#include "core/kv/encoding.h"

#define KV_MODEL_STATS_FORMAT "kvsim-model-stats"
#define KV_MODEL_STATS_VERSION 1

typedef struct kv_stats_model {
    char name[128], file[256], sha256[65];
    int layers, heads, kv_heads, head_dim, context;
} kv_stats_model;

/* A set of encodings: one for every (layer, KV head) (n = 1) or one each
   (n = layers x kv_heads, layer-major). */
typedef struct kv_stats_encodings {
    int n;
    kv_encoding *enc; /* [n], owned */
} kv_stats_encodings;

typedef struct kv_stats_lynx {
    kv_stats_encodings encodings;
    kv_accept_curve curve;
} kv_stats_lynx;

typedef struct kv_stats_diffkv {
    kv_diffkv_curve curve; /* its tables' z point into z below */
    int points;            /* quantiles per head (KV_DIFFKV_TABLE_POINTS when used by the engine) */
    double *z;             /* [n_lengths][2: prefill, exit][layers * kv_heads][points], owned */
} kv_stats_diffkv;

typedef struct kv_stats_accuracy {
    kv_stats_encodings encodings;
    int context_tokens;
    long scored_tokens;
    double delta_ppl, delta_ppl_ci95[2];
    double top1_agree, top1_agree_ci95[2];
    double needle_recall, needle_recall_ci95[2]; /* NaN when absent */
    double accepted_share, accepted_share_ci95[2]; /* speculating encodings: mean share of the k speculated
                                                    tokens accepted; NaN when absent */
    int n_layers;
    double *attention_error; /* [n_layers] or NULL, owned */
} kv_stats_accuracy;

typedef struct kv_model_stats {
    kv_stats_model model;
    char tool[128], command[1024];
    int measurement;
    size_t n_texts;
    struct kv_stats_text { char name[128], sha256[65]; long tokens; } *texts; /* owned */
    size_t n_lynx, n_diffkv, n_accuracy;
    kv_stats_lynx *lynx;         /* owned */
    kv_stats_diffkv *diffkv;     /* owned */
    kv_stats_accuracy *accuracy; /* owned */
} kv_model_stats;

/* Reads and checks path into *out (zeroed first). KV_EINPUT with file:line
   and member for a missing file, bad JSON, wrong format/version, or any
   member out of shape or range. */
int kv_model_stats_read(const char *path, kv_model_stats *out, kv_error *err);

/* Writes s to path atomically (temporary file + rename; nothing is left on
   failure). */
int kv_model_stats_write(const char *path, const kv_model_stats *s, kv_error *err);

void kv_model_stats_free(kv_model_stats *s);

/* Records a step that changed s in producer.command: "kvsim WORD ARGS" after what is there
   ("…; then kvsim WORD ARGS"), argv[1..argc) joined by spaces, cut at the field's size. */
void kv_model_stats_add_command(kv_model_stats *s, const char *word, int argc, char **argv); /* frees what s owns; s itself is the caller's */

/* The entry whose encodings equal enc[0..n) (n = layers x kv_heads, the
   policy's per-(layer, KV head) encodings of the measured model's shape, or
   1), NULL when none does. */
const kv_stats_lynx *kv_model_stats_find_lynx(const kv_model_stats *s, const kv_encoding *enc, int n);
const kv_stats_diffkv *kv_model_stats_find_diffkv(const kv_model_stats *s, int window);
const kv_stats_accuracy *kv_model_stats_find_accuracy(const kv_model_stats *s, const kv_encoding *enc, int n);

/* An encoding's text ("k=int8a4g32,v=int8a4g32", docs/stats-format.md) into
   buf; and back (KV_EINPUT naming the text on a syntax error). */
int kv_encoding_text(const kv_encoding *e, char *buf, size_t len);
int kv_encoding_parse(const char *text, kv_encoding *out, kv_error *err);

#endif
