-- cachegen.lua — adaptive bit width in the manner of CacheGen: the most bits that meet a TTFT target.
--
-- What it shows. CacheGen streams the KV cache at the highest quality level whose transfer
-- still meets the time-to-first-token target, given the bandwidth it sees now. Here, when a
-- request's prefill has ended (encode runs then), the policy estimates, for each bit width in
-- `bit_choices` (most bits first), when the KV would arrive:
--     elapsed  = ctx.now - ctx.request.arrival_s           (queueing and prefill so far)
--     ahead    = bytes already travelling over the route or into the least-loaded decode
--                node (its link's bytes in flight and queued; the decode node's
--                kv_reserved_bytes of requests still in flight to it)
--     estimate = elapsed + (ahead + bytes(b)) / capacity + per_request_overhead_ms
-- and takes the first b with estimate <= ttft_target_ms; when none meets it, the fewest bits.
-- bytes(b) counts (b + 32 / group_size) bits per value: the fp16 scale and zero of a group.
-- So in a quiet phase every request gets the most bits; during a burst, when transfers pile up
-- on the decode node's link, fewer. One decision per request, kept in ctx.state for its other
-- (layer, KV head) calls.
-- Try: --set policy.cachegen.ttft_target_ms=2000 (a looser target: more bits in the burst).

-- The numbers to change:
local params = {
  ttft_target_ms = 800.0,   -- the TTFT the bit width should meet
  bit_choices = "8,6,4,3",  -- the bit widths to choose from, most first (comma-separated)
  group_size = 32,          -- G: values per quantization group
  per_request_overhead_ms = 20.0, -- time after the transfer before token 1 (latency, first step)
}

local choices_cache = {}
local function bit_choices(text)
  local c = choices_cache[text]
  if c then return c end
  c = {}
  for w in string.gmatch(text, "[^,]+") do
    local b = math.tointeger(tonumber(w))
    assert(b and b >= 1 and b <= 16, "cachegen: bit_choices: '" .. w .. "' is not an integer from 1 to 16")
    c[#c + 1] = b
  end
  assert(#c > 0, "cachegen: bit_choices is empty")
  table.sort(c, function(x, y) return x > y end)
  choices_cache[text] = c
  return c
end

-- Bytes already on the way that this request's KV will queue behind.
local function bytes_ahead(ctx)
  local ahead = 0
  for _, link in ipairs(ctx.route) do
    ahead = math.max(ahead, link.bytes_in_flight + link.bytes_queued)
  end
  local least -- the decode node the default placement would pick (least loaded)
  for _, n in ipairs(ctx.decode_nodes) do
    local load = n.queued + n.running + n.incoming
    if not least or load < least.load then least = { load = load, reserved = n.kv_reserved_bytes } end
  end
  if least then ahead = math.max(ahead, least.reserved) end
  return ahead
end

local function decide(ctx)
  local p = ctx.params
  local m = ctx.model
  local values = ctx.context_length * m.layers * m.kv_heads * m.head_dim * 2 -- K and V
  local gbps = ctx.route[1] and ctx.route[1].capacity_gbps or 0
  local choices = bit_choices(p.bit_choices)
  if gbps <= 0 then return choices[1] end -- colocated, or no route yet: nothing to send
  local bytes_per_s = gbps * 1e9 / 8
  local elapsed = ctx.now - ctx.request.arrival_s
  local ahead = bytes_ahead(ctx)
  local target = p.ttft_target_ms / 1000
  for _, b in ipairs(choices) do
    local bytes = values * (b + 32 / p.group_size) / 8
    local estimate = elapsed + (ahead + bytes) / bytes_per_s + p.per_request_overhead_ms / 1000
    if estimate <= target then return b end
  end
  return choices[#choices]
end

return {
  name = "cachegen",
  describe = "CacheGen-style: per request the most bits whose estimated TTFT meets ttft_target_ms",
  params = params,

  encode = function(ctx)
    local s = ctx.state
    local id = ctx.request.id
    if s.id ~= id then -- the request's first (layer, KV head) call decides
      s.id = id
      s.bits = decide(ctx)
    end
    local e = { bits = s.bits, group_size = ctx.params.group_size }
    return { key = e, value = e }
  end,
}
