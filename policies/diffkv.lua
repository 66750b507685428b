-- diffkv.lua — DiffKV: differentiated precision per token and head (Zhang et al., 2412.03131).
--
-- Three observations drive it: keys matter more than values (a key shapes the
-- softmax for every query, a value only weights its own token), tokens differ
-- by orders of magnitude in the attention they receive, and every head needs
-- a different number of important tokens. So each (layer, KV head, token)
-- gets one of three tiers:
--   high   K8V4  (8-bit keys, 4-bit values)   significance >= alpha_high / L
--   low    K4V2  (4-bit keys, 2-bit values)   alpha_low / L <= significance < alpha_high / L
--   pruned       (not stored, not sent)       significance < alpha_low / L
-- where L is the current context length and a token's significance is the
-- mean attention probability it receives from every later query (in prefill:
-- every later query of the prompt), maximised over the query heads of its GQA
-- group; a token is decided once, when it leaves the recent window (core/kv/diffkv.h).
-- The W most recent tokens always stay high.
--
-- Special cases: alpha_low = 0 never prunes; alpha_low = alpha_high has no low
-- tier (the paper's "K8V4-Prune").

-- The numbers to change:
local params = {
  high_key_bits = 8,     -- high tier: K8 ...
  high_value_bits = 4,   -- ... V4
  low_key_bits = 4,      -- low tier: K4 ...
  low_value_bits = 2,    -- ... V2
  group_size = 32,       -- G: values per group along head_dim (0 = one group per head vector)
  alpha_high = 1.0,      -- the paper's value for Llama-3-8B/70B (3.0 for Qwen2.5-32B, QwQ-32B)
  alpha_low = 0.02,      -- the paper's value for Llama-3-8B (0.04 for Qwen2.5-7B, 0 for the others)
  window = 64,           -- W: the most recent W tokens stay in the high tier
}

return {
  name = "diffkv",
  describe = "DiffKV: K8V4 / K4V2 / pruned per token by attention, alpha_h = 1, alpha_l = 0.02, W = 64",
  params = params,

  encode = function(ctx)
    local p = ctx.params
    local g = p.group_size
    if g == 0 then g = ctx.model.head_dim end   -- reading ctx.model keeps the answer cacheable
    return {
      -- key and value are the high tier
      key = { bits = p.high_key_bits, group_size = g },
      value = { bits = p.high_value_bits, group_size = g },
      diffkv = {
        key_low = { bits = p.low_key_bits, group_size = g },
        value_low = { bits = p.low_value_bits, group_size = g },
        alpha_high = p.alpha_high,
        alpha_low = p.alpha_low,
        window = p.window,
      },
    }
  end,
}
