/* encset.h — a request's encodings for every (layer, KV head), fetched once per run when no request changes them.
 *
 * plan_request needs the policy's encoding of each of layers x KV heads and
 * the bytes a prompt takes in them. When every answer is fixed (the policy
 * host serves it from its cache: kv_policy_encoding_fixed), the set keeps the
 * answers and the distinct encodings among them, and later requests cost one
 * kv_encoding_bytes per distinct encoding instead of a policy call and a
 * kv_encoding_bytes per head. Byte totals are integers below 2^53, so
 * count x bytes summed over distinct encodings equals the per-head sum
 * exactly (checked; the per-head sum is used otherwise).
 */
#ifndef KV_ENCSET_H
#define KV_ENCSET_H

#include "core/base/error.h"
#include "core/policy/policy.h"

typedef struct kv_encset kv_encset;

kv_encset *kv_encset_create(int layers, int kv_heads);
void kv_encset_destroy(kv_encset *s); /* NULL is fine */

/* The encodings of request r, [layer * kv_heads + head], in *out (owned by the set, valid until the next
   fill). Asks the policy for each (layer, head) unless the last fill found them all fixed for this
   policy and model and the policy's cache epoch is unchanged. On error returns the policy's error;
   *out is then undefined. */
int kv_encset_fill(kv_encset *s, kv_policy *p, const kv_policy_model *m, const kv_policy_request *r,
                   const kv_encoding **out, kv_error *err);
/* Whether the last fill's encodings are fixed (reused by later fills). */
bool kv_encset_fixed(const kv_encset *s);
/* Counts fills that asked the policy: unchanged while fills reuse the same fixed encodings. */
uint64_t kv_encset_generation(const kv_encset *s);

/* Sums over the non-DiffKV heads of the last fill of kv_encoding_bytes(enc, tokens, head_dim, NULL):
   anchor and residual bytes, kept tokens. Equal, bit for bit, to summing head by head. */
void kv_encset_bytes(const kv_encset *s, int tokens, int head_dim, double *anchor, double *residual, double *kept);

#endif
