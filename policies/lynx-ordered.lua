-- lynx-ordered.lua — request-aware Lynx: each flow gets a priority level from its request's order.
--
-- What it shows. The shipped lynx.lua gives every anchor one strict class and every residual
-- a lower one. Under a burst that is the wrong order for the user: the anchors of requests
-- that arrived later starve the residuals of earlier requests on the decode node's link, so
-- every request waits for all anchors before any residual moves, and its committed tokens
-- (TTKT) come late. Here request r's anchor gets level stride * r and its residual level
-- stride * r + residual_offset (0 is the highest level; strict between levels):
--   stride = 2, residual_offset = 1 (the default): request r's anchor, then r's residual,
--     then request r+1's anchor ...: earlier requests are served first, whole (FIFO).
--   residual_offset = 2 * lookahead + 1 with stride = 2: the residual of r yields to the
--     anchors of the next `lookahead` requests (an earlier first speculative token for them,
--     a later committed one for r).
-- Encoding and speculation are lynx.lua's: 8 bits split 4 + 4, speculate 8 tokens.
-- On the ideal network (no link is shared) levels change nothing: it behaves as lynx.lua.
-- Levels go up to 2^30 (docs/network.md "Per-flow priority"): with stride 2, request ids up to
-- about 5e8; a level past that is an error naming this file.
-- Acceptance: one bit split for every request, measured like lynx's (lynx.from), or the
-- scenario's lynx.acceptance with lynx.from: scenario.

-- The numbers to change:
local params = {
  bits = 8,                 -- b: total bits per value (1..16)
  anchor_bits = 4,          -- a: bits in the anchor; the residual gets b - a
  group_size = 32,          -- G: values per quantization group
  stride = 2,               -- levels between consecutive requests (anchor level = stride * id)
  residual_offset = 1,      -- the residual's level above its anchor's (must be >= 1)
  speculate = 8,            -- k: at most k tokens decoded on anchor-only KV before verification
}

return {
  name = "lynx-ordered",
  describe = "Lynx 8=4+4, per-request priority levels: earlier requests' anchor and residual first",
  params = params,

  encode = function(ctx)
    local p = ctx.params
    local enc = { bits = p.bits, anchor_bits = p.anchor_bits, group_size = p.group_size }
    return { key = enc, value = enc }
  end,

  -- Reads ctx.request (its id), so it runs for every request.
  transfer = function(ctx)
    local p = ctx.params
    assert(p.stride >= 1 and p.residual_offset >= 1, "lynx-ordered: stride and residual_offset must be >= 1")
    local a = p.stride * ctx.request.id
    return {
      order = "anchor_first",
      levels = { anchor = a, residual = a + p.residual_offset },
    }
  end,

  speculate = function(ctx)
    return ctx.params.speculate
  end,
}
