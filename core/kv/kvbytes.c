/* kvbytes.c — wire and memory sizes of encoded KV, from the kernels' layout arithmetic. */
#include "core/kv/kvbytes.h"

#include <math.h>

#include "backends/backend.h"

void kv_tensor_bytes(const kv_tensor_enc *t, int tokens, int head_dim, double *anchor, double *residual)
{
    *anchor = *residual = 0;
    if (tokens <= 0)
        return;
    if (t->kind == KV_TENSOR_BF16) {
        *anchor = 2.0 * tokens * head_dim;
        return;
    }
    kv_quant_layout l = {(uint32_t)tokens, (uint32_t)head_dim, (uint32_t)t->group_size,
                         t->per_channel ? KV_GROUP_CHANNEL : KV_GROUP_TOKEN};
    double meta = (double)kv_layout_meta_bytes(&l);
    if (t->anchor_bits > 0) {
        *anchor = (double)kv_layout_packed_bytes(&l, (unsigned)t->anchor_bits) + meta;
        *residual = (double)kv_layout_packed_bytes(&l, (unsigned)(t->bits - t->anchor_bits));
    } else {
        *anchor = (double)kv_layout_packed_bytes(&l, (unsigned)t->bits) + meta;
    }
}

static void add_pair(const kv_tensor_enc *k, const kv_tensor_enc *v, int tokens, int head_dim, kv_head_bytes *out)
{
    double a, r;
    kv_tensor_bytes(k, tokens, head_dim, &a, &r);
    out->anchor += a;
    out->residual += r;
    kv_tensor_bytes(v, tokens, head_dim, &a, &r);
    out->anchor += a;
    out->residual += r;
}

void kv_encoding_bytes(const kv_encoding *e, int tokens, int head_dim, const kv_tier_split *tiers,
                       kv_head_bytes *out)
{
    out->anchor = out->residual = 0;
    out->kept_tokens = tokens;
    if (tokens <= 0)
        return;
    const kv_tensor_enc bf16 = {.kind = KV_TENSOR_BF16};
    if (e->diffkv) {
        /* The recent window stays high; the rest splits by tier, pruned tokens cost nothing. */
        int window = e->window < tokens ? e->window : tokens;
        int rest = tokens - window;
        int high = (int)lround(rest * (tiers ? tiers->high : 1.0));
        int low = (int)lround(rest * (tiers ? tiers->low : 0.0));
        if (high + low > rest)
            low = rest - high;
        add_pair(&e->key, &e->value, window + high, head_dim, out);
        add_pair(&e->key_low, &e->value_low, low, head_dim, out);
        out->kept_tokens = window + high + low;
        return;
    }
    /* KIVI: the most recent R tokens stay in bf16, the older ones are quantized. */
    int recent = e->full_precision_window < tokens ? e->full_precision_window : tokens;
    add_pair(&e->key, &e->value, tokens - recent, head_dim, out);
    add_pair(&bf16, &bf16, recent, head_dim, out);
}
