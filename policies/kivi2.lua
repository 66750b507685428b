-- kivi2.lua — KIVI-style 2-bit KV cache (Liu et al., "KIVI", 2024).
--
-- KIVI's observation: keys have a few outlier *channels*, values do not.
-- So keys are quantized per channel (a group runs across G tokens of one
-- channel) and values per token (a group runs along head_dim of one token).
-- The most recent R tokens stay in full precision: per-channel groups need G
-- tokens to fill, and recent tokens matter most to attention.

-- The numbers to change:
local params = {
  key_bits = 2,        -- bits per key value
  value_bits = 2,      -- bits per value value
  group_size = 32,     -- G: KIVI's group size (tokens per key group, values per value group)
  residual_window = 128, -- R: the most recent R tokens stay bf16 (KIVI's default)
}

return {
  name = "kivi2",
  describe = "KIVI 2-bit: per-channel keys, per-token values, recent window in bf16",
  params = params,

  encode = function(ctx)
    local p = ctx.params
    return {
      key = { bits = p.key_bits, group_size = p.group_size, per_channel = true },
      value = { bits = p.value_bits, group_size = p.group_size, per_channel = false },
      full_precision_window = p.residual_window,
    }
  end,
}
