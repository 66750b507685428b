/* model.h — the reference model: a llama-architecture transformer loaded from GGUF.
 *
 * kv_model_load reads the hyper-parameters, the tokenizer and the weights
 * (dequantized once to fp32: SmolLM2-135M takes about 540 MB) and checks
 * every tensor's shape. kv_model_forward runs a batch of rows — a row is one
 * token at one position of one sequence, each sequence with its own KV store
 * (kvstore.h) — through RMSNorm, RoPE, grouped-query attention and SwiGLU;
 * matrix products go through OpenBLAS, attention through the KV stores.
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/base/error.h"
#include "core/refmodel/kvstore.h"
#include "core/refmodel/tokenizer.h"

typedef struct kv_model kv_model;

typedef struct kv_model_config {
    char name[128];     /* general.name */
    int n_layers;       /* transformer blocks */
    int dim;            /* embedding width */
    int hidden;         /* feed-forward width */
    int n_heads;        /* query heads */
    int n_kv_heads;     /* key/value heads (GQA) */
    int head_dim;       /* dim / n_heads */
    int vocab;          /* tokens */
    int context_length; /* trained context, tokens */
    float rope_base;    /* RoPE frequency base */
    float norm_eps;     /* RMSNorm epsilon */
    double parameters;  /* weight count */
} kv_model_config;

/* Loads a llama GGUF. KV_EINPUT (message naming the file and the key or tensor)
   for a missing, malformed or unsupported model. *out is the caller's. */
int kv_model_load(const char *path, kv_model **out, kv_error *err);
void kv_model_destroy(kv_model *m); /* NULL is fine */

/* Stops OpenBLAS's worker threads, which its pthread build starts as it loads (one per core)
   and which then spin for about 2^28 cycles each waiting for work: 0.1 CPU-s of every kvsim
   run on 2 cores, seconds on a many-core machine, in runs that never multiply a matrix.
   OpenBLAS starts them again at its next threaded call (its own path after a fork), and
   openblas_get_num_threads() is unchanged. Nothing happens with a BLAS that has no such pool. */
void kv_model_blas_park(void);
/* Reads only the hyper-parameters from the file's metadata (no weights, no
   tokenizer; vocab and parameters are 0). Errors as kv_model_load. */
int kv_model_read_config(const char *path, kv_model_config *out, kv_error *err);

const kv_model_config *kv_model_get_config(const kv_model *m);
const kv_tokenizer *kv_model_tokenizer(const kv_model *m);
/* The shape a KV store for this model needs. */
kv_kvstore_shape kv_model_kv_shape(const kv_model *m);

/* A batch: n rows; rows of one sequence are contiguous, in increasing
   position, and come after every position already in its store. */
typedef struct kv_batch {
    int n;                 /* rows */
    const int32_t *tokens; /* [n] token ids */
    const int32_t *pos;    /* [n] positions */
    const int32_t *seq;    /* [n] index into stores[] */
    const uint8_t *want;   /* [n] nonzero: write this row's logits; NULL: every row */
} kv_batch;

/* Runs the batch; appends every row's K/V to its store. logits receives
   [rows wanted][vocab] in row order. KV_EINPUT for a token id out of range or
   a position past the context length (stores unchanged); a backend's
   attention error comes back as it is (the stores then hold the batch's KV). */
int kv_model_forward(kv_model *m, const kv_batch *b, kv_kvstore **stores, float *logits, kv_error *err);

/* Index of the largest logit (the lowest index on ties). */
int32_t kv_argmax(const float *logits, int n);

#endif
