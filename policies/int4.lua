-- int4.lua — uniform 4-bit group quantization of keys and values.
--
-- Like int8.lua with half the bits: 4 + 32/32 = 5 bits per value with G = 32
-- (about 0.31x of bf16). The smallest transfer among the simple baselines,
-- and the least accurate; Lynx aims for this transfer time at bf16 accuracy.

-- The numbers to change:
local params = {
  bits = 4,          -- b: bits per value (1..16)
  group_size = 32,   -- G: values per group (one fp16 scale + one fp16 zero each)
}

return {
  name = "int4",
  describe = "INT4 keys and values, per-token groups",
  params = params,

  encode = function(ctx)
    local p = ctx.params
    local enc = { bits = p.bits, group_size = p.group_size }
    return { key = enc, value = enc }
  end,
}
