-- lynx-adaptive.lua — Lynx whose anchor/residual split is chosen per request from the link state.
--
-- What it shows. The anchor is what the decode node waits for before it can speculate. When
-- the network is quiet a thick anchor (4 of 8 bits) arrives soon enough and its speculated
-- tokens are accepted more often; when the decode node's link is busy, a thinner anchor
-- (2 of 8 bits: about 3/9 of the bytes instead of 5/9, with the groups' scales and zeros)
-- reaches it sooner, and the residual (the other 6 bits) follows. When a request's prefill
-- ends (encode runs then) the policy estimates how long its KV would queue behind bytes
-- already travelling to the decode nodes:
--     wait = ahead / capacity
--     ahead = the most of: its prefill NIC's bytes in flight and queued (ctx.route), the
--             least-loaded decode node's kv_reserved_bytes (requests still in flight to it)
-- and takes busy_anchor_bits when wait >= busy_wait_ms, else quiet_anchor_bits. Flows travel
-- as in lynx-ordered.lua: request r's anchor at level 2r, its residual at 2r + 1.
-- Acceptance (the chance that each speculated token survives): kvsim keeps one acceptance
-- per policy. With lynx.from: reference-model (the default) it is measured on the split this
-- policy answers on an idle system (quiet_anchor_bits), and the busy requests use it too:
-- their thinner anchor is likely accepted less often, so the figure is optimistic for them.
-- Measure the thin split alone with lynx.lua and --set policy.lynx.anchor_bits=2, or fix
-- both with lynx.from: scenario and lynx.acceptance (the tutorial does).

-- The numbers to change:
local params = {
  bits = 8,                 -- b: total bits per value
  quiet_anchor_bits = 4,    -- the anchor when the link is quiet (residual: bits - 4)
  busy_anchor_bits = 2,     -- the anchor when it is busy (residual: bits - 2)
  busy_wait_ms = 100.0,     -- queueing estimate from which the link counts as busy
  group_size = 32,          -- G: values per quantization group
  speculate = 8,            -- k: at most k tokens decoded on anchor-only KV
}

local function wait_s(ctx)
  local ahead, gbps = 0, 0
  for _, link in ipairs(ctx.route) do
    ahead = math.max(ahead, link.bytes_in_flight + link.bytes_queued)
    gbps = math.max(gbps, link.capacity_gbps)
  end
  local least
  for _, n in ipairs(ctx.decode_nodes) do
    local load = n.queued + n.running + n.incoming
    if not least or load < least.load then least = { load = load, reserved = n.kv_reserved_bytes } end
  end
  if least then ahead = math.max(ahead, least.reserved) end
  if gbps <= 0 then return 0 end -- no route (colocated, or no system to look at)
  return ahead / (gbps * 1e9 / 8)
end

return {
  name = "lynx-adaptive",
  describe = "Lynx 8 bits, anchor 4 when the link is quiet, 2 when busy; per-request priority levels",
  params = params,

  encode = function(ctx)
    local p = ctx.params
    local s = ctx.state
    local id = ctx.request.id
    if s.id ~= id then -- the request's first (layer, KV head) call decides
      s.id = id
      s.anchor = wait_s(ctx) * 1000 >= p.busy_wait_ms and p.busy_anchor_bits or p.quiet_anchor_bits
    end
    local enc = { bits = p.bits, anchor_bits = s.anchor, group_size = p.group_size }
    return { key = enc, value = enc }
  end,

  transfer = function(ctx)
    local a = 2 * ctx.request.id
    return { order = "anchor_first", levels = { anchor = a, residual = a + 1 } }
  end,

  speculate = function(ctx)
    return ctx.params.speculate
  end,
}
