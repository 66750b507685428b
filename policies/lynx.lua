-- lynx.lua — Lynx: progressive anchor/residual KV transfer with speculative decoding.
--
-- Every key and value is quantized to b bits per group (like int8.lua). Each
-- b-bit code q is then split in two planes:
--   anchor   A = q >> (b - a)            the a most significant bits
--   residual R = q & (2^(b - a) - 1)     the b - a remaining bits
-- The anchor plane (plus the group metadata) travels first. As soon as it has
-- arrived, the decode node starts decoding speculatively on anchor-only KV
-- (each value reconstructed at the middle of its bin), up to k tokens, while
-- the residual is still in flight. When the residual arrives the planes are
-- merged back into q, and one verification pass keeps the speculated tokens
-- that full-precision decoding agrees with.
--
-- So the first token comes at about int4's transfer time (the anchor is 4 of
-- the 8 bits), and the final answer has int8's accuracy.

-- The numbers to change:
local params = {
  bits = 8,                 -- b: total bits per value (1..16)
  anchor_bits = 4,          -- a: bits in the anchor; the residual gets b - a (8 = 4 + 4)
  group_size = 32,          -- G: values per quantization group
  order = "anchor_first",   -- "anchor_first": residual starts once the anchor arrived;
                            -- "concurrent": both streams start together
  priority = "strict",      -- "strict": the residual only gets bandwidth the anchor leaves;
                            -- "weighted": share by weights below; "none": plain fair sharing
  anchor_weight = 3.0,      -- with priority = "weighted": anchor share 3/(3+1)
  residual_weight = 1.0,
  layerwise = false,        -- true: send each layer's KV as soon as prefill has produced it
  speculate = 8,            -- k: at most k tokens decoded on anchor-only KV before verification
}

return {
  name = "lynx",
  describe = "Lynx: 8-bit KV split 4 + 4, anchor first at strict priority, speculate 8",
  params = params,

  -- The same split for every layer and head. A per-layer variant could, e.g.,
  -- return a larger anchor for ctx.layer == 0; see docs/policies.md.
  encode = function(ctx)
    local p = ctx.params
    local enc = { bits = p.bits, anchor_bits = p.anchor_bits, group_size = p.group_size }
    return { key = enc, value = enc }
  end,

  -- How the two planes travel.
  transfer = function(ctx)
    local p = ctx.params
    return {
      order = p.order,
      priority = p.priority,
      weights = { anchor = p.anchor_weight, residual = p.residual_weight },
      layerwise = p.layerwise,
    }
  end,

  -- How many tokens to decode on the anchor before the residual has arrived.
  speculate = function(ctx)
    return ctx.params.speculate
  end,
}
