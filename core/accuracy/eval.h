/* eval.h — accuracy of KV policies on the reference model, measured against its BF16-KV run.
 *
 * For every prompt (long texts, synthetic needle-retrieval prompts) the model
 * prefills once, exactly; each policy's KV store is a copy of that prefill,
 * encoded ("transferred") per the policy, and all policies then decode in one
 * batch, step by step:
 *  - perplexity: teacher-forced on the text after the prompt (score_tokens);
 *    top-1 agreement: how often a policy's argmax equals the reference's there;
 *  - greedy agreement: each policy decodes greedily on its own; the share of
 *    positions equal to the reference's output, and the identical prefix;
 *  - needles: whether the policy's own greedy answer contains the number;
 *  - Lynx acceptance per speculative position: greedy decoding on anchor-only
 *    KV for k tokens, then one verification pass on merged KV; sampled at
 *    speculation_points prompt lengths per prompt (a causal model's prefill
 *    of a prefix is the prefix of its prefill, so one prefill serves all);
 *  - per layer: stored bytes against bf16 (compression ratio), DiffKV tier
 *    fractions, and the relative error of the attention output against the
 *    same queries over bf16 KV.
 * A policy whose K/V has an anchor split gets a second row, "<name>:anchor",
 * measured on anchor-only KV (what speculation runs on). Results are
 * deterministic: same model, inputs, config and seed → the same numbers.
 */
#ifndef KV_EVAL_H
#define KV_EVAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/refmodel/kvstore.h"
#include "core/refmodel/model.h"
#include "core/kv/encoding.h"

typedef struct kv_eval_policy {
    const char *name;
    const kv_encoding *enc; /* [n_layers * n_kv_heads], layer-major; borrowed */
    int speculate;          /* Lynx: speculative tokens k (0: none) */
} kv_eval_policy;

/* Where the scenario sets each length key, "file:line:col" (or the scenario's path when the key takes its
   default), for messages; NULL: no position (the C API). Borrowed. */
typedef struct kv_eval_where {
    const char *context_tokens, *score_tokens, *generate_tokens, *needle_context_tokens, *speculative_positions;
} kv_eval_where;

typedef struct kv_eval_config {
    const char *const *texts;  /* long texts (file paths), teacher-forced perplexity */
    int n_texts;
    int context_tokens;        /* prompt tokens cut from each text */
    int score_tokens;          /* scored tokens after the prompt (perplexity) */
    int generate_tokens;       /* greedy tokens per prompt */
    int needle_count;          /* synthetic needle prompts */
    int needle_context_tokens; /* their length */
    int speculative_positions; /* k for acceptance; 0: each policy's own speculate */
    int speculation_points;    /* Lynx samples per prompt: prompt prefixes spread over its second half */
    uint64_t seed;             /* needle numbers and depths */
    kv_backend *backend;       /* decode attention over the encoded pages runs here (borrowed);
                                  NULL: the KV store's own loop over the reconstructed values */
    FILE *progress;            /* one line per prompt; NULL: quiet */
    const int *speculation_lengths; /* [n_speculation_lengths] prompt prefixes (tokens, each 1..the text
                                       prompt's length) at which Lynx speculates instead (borrowed); NULL:
                                       speculation_points spread as above */
    int n_speculation_lengths; /* 0..64 */
    bool join_texts;           /* a text shorter than context_tokens + score_tokens + 1 tokens continues with
                                  the next texts of the list (cyclically, in order, each after a blank line)
                                  until it is long enough; false: such a text is an error */
    kv_eval_where where;       /* positions of the keys, for messages */
} kv_eval_config;

typedef struct kv_eval_row {
    char name[96];
    int policy;                /* index into the policies; -1: the internal bf16 reference */
    bool anchor_view;          /* measured on anchor-only KV */
    bool reference;            /* the bf16-KV run the others are compared with */
    double nll_sum;            /* teacher-forced negative log-likelihood, nats */
    long nll_count;
    long top1_agree, top1_total;   /* teacher-forced argmax equal to the reference's */
    long greedy_agree, greedy_total; /* free-running tokens equal to the reference's */
    double prefix_sum;         /* identical greedy prefix lengths, summed over prompts */
    long prefix_count;
    long needle_hits, needle_total;
    int spec_k;                /* speculative positions measured (0: none) */
    long *accepted;            /* [spec_k]: speculations whose first j+1 tokens were accepted */
    long spec_samples;         /* speculations (prompt prefixes) measured */
    long *accepted_at;         /* [n_speculation_lengths][spec_k]: accepted counted per entry of
                                  cfg->speculation_lengths (the first equal entry); NULL without them */
    long *samples_at;          /* [n_speculation_lengths]: speculations per entry; NULL without them */
    kv_kvstore_layer_stats *layers; /* [n_layers], summed over prompts */
} kv_eval_row;

typedef struct kv_eval_result {
    kv_model_config model;
    int n_rows;
    kv_eval_row *rows;
    int reference_row;
    int prompts_text, prompts_needle;
    long text_tokens_scored;   /* per row */
} kv_eval_result;

/* Runs the evaluation. KV_EINPUT for unreadable or too short texts, bad
   encodings, lengths past the context, a needle length that leaves no room
   for filler (all checked before any prompt runs, each naming its key and,
   when cfg->where has it, its position); KV_EFAIL for internal failures.
   *out is the caller's (kv_eval_result_destroy). */
int kv_eval_run(kv_model *m, const kv_eval_config *cfg, const kv_eval_policy *policies, int n_policies,
                kv_eval_result **out, kv_error *err);
void kv_eval_result_destroy(kv_eval_result *r); /* NULL is fine */

/* Whether any of n encodings splits its codes into anchor and residual planes (Lynx). */
bool kv_eval_encodings_split(const kv_encoding *e, size_t n);

/* Derived numbers of one row. */
double kv_eval_row_ppl(const kv_eval_row *row);            /* NaN if nothing was scored */
double kv_eval_row_ratio(const kv_eval_row *row, int n_layers); /* bf16 bytes / stored bytes */
double kv_eval_row_accept(const kv_eval_row *row, int j);  /* acceptance at position j (1-based) */
double kv_eval_layer_att_err(const kv_kvstore_layer_stats *l); /* relative L2 error */
/* Tier fractions over all layers: of the (token, KV head) pairs, the shares in
   the high tier (or the main encoding), the low tier, and pruned, as `kvsim eval`
   reports them (the simulator's DiffKV tiers come from core/accuracy/diffkv_scores.h
   and its Lynx acceptance from core/accuracy/feed_lynx.h). */
void kv_eval_row_tiers(const kv_eval_row *row, int n_layers, double *high, double *low, double *pruned);

/* The tables (main, Lynx acceptance, DiffKV tiers per layer, attention error per layer). */
void kv_eval_print(FILE *f, const kv_eval_result *r);
/* JSON (written to a temporary file, then renamed). */
int kv_eval_write_json(const kv_eval_result *r, const char *path, kv_error *err);

#endif
