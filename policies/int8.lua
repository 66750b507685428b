-- int8.lua — uniform 8-bit group quantization of keys and values.
--
-- Each group of G consecutive values of one token (along head_dim) is stored
-- as 8-bit codes plus one fp16 scale and one fp16 zero point (4 bytes of
-- metadata per group). With G = 32 that is 8 + 32/32 = 9 bits per value,
-- i.e. about 0.56x of bf16. Lynx sends the same 8 bits, split in two streams.

-- The numbers to change:
local params = {
  bits = 8,          -- b: bits per value (1..16)
  group_size = 32,   -- G: values per group; 64 halves the metadata (8.5 bits/value)
}

return {
  name = "int8",
  describe = "INT8 keys and values, per-token groups",
  params = params,   -- `--set policy.int8.group_size=64` changes this table before any hook runs

  encode = function(ctx)
    local p = ctx.params
    local enc = { bits = p.bits, group_size = p.group_size }
    return { key = enc, value = enc }
  end,
}
