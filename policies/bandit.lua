-- bandit.lua — an epsilon-greedy bandit over a few encodings, learning from finished requests.
--
-- What it shows. A policy that does not know the network in advance can learn which
-- compression pays, as KVServe picks a scheme under bandwidth and SLO limits. The arms are
-- INT8, INT4 and KIVI-2 (the shipped int8.lua, int4.lua and kivi2.lua encodings). Each
-- request, when its prefill ends, pulls one arm: the first requests try each arm in turn;
-- afterwards, with probability `epsilon` a random arm (math.random: seeded when the policy
-- loads, so the same scenario and seed give the same choices and bytes), else the arm with
-- the best mean reward so far (an arm not yet rewarded counts as best, the lowest first).
-- When a request completes (hook complete), its arm is rewarded with
--     reward = quality[arm] - ttft_s / (ttft_target_ms / 1000) - bytes_weight * bytes / 1e9
-- quality: how much an arm's accuracy is worth (int8 1, int4 0.8, kivi2 0.5 by default).
-- So when requests are fast INT8 wins on quality; when the network is slow, the TTFT term
-- pushes it to the arms that send fewer bytes. Feedback arrives only when requests finish:
-- a burst's requests are all chosen on what the earlier ones taught.
-- ctx.state keeps the statistics (pulls, reward sums) and each request's arm until it ends.

-- The numbers to change:
local params = {
  epsilon = 0.1,            -- chance of a random arm after the first round
  ttft_target_ms = 1000.0,  -- a TTFT of this much costs 1 reward
  bytes_weight = 0.0,       -- reward lost per GB on the wire (0: TTFT and quality only)
  quality_int8 = 1.0,       -- what each arm's accuracy is worth
  quality_int4 = 0.8,
  quality_kivi2 = 0.5,
}

local arms = {
  { name = "int8", enc = function() local e = { bits = 8, group_size = 32 }; return { key = e, value = e } end },
  { name = "int4", enc = function() local e = { bits = 4, group_size = 32 }; return { key = e, value = e } end },
  { name = "kivi2", enc = function()
      return { key = { bits = 2, group_size = 32, per_channel = true }, value = { bits = 2, group_size = 32 },
               full_precision_window = 128 }
    end },
}

local function state(ctx)
  local s = ctx.state
  if not s.arm_of then
    s.arm_of, s.pulls, s.rewarded, s.sum = {}, {}, {}, {}
    for i = 1, #arms do s.pulls[i], s.rewarded[i], s.sum[i] = 0, 0, 0 end
    s.requests = 0
  end
  return s
end

local function choose(ctx, s)
  local p = ctx.params
  s.requests = s.requests + 1
  if s.requests <= #arms then return s.requests end -- the first round: each arm once
  if math.random() < p.epsilon then return math.random(#arms) end
  local best, best_mean = 1, nil
  for i = 1, #arms do
    local mean = s.rewarded[i] > 0 and s.sum[i] / s.rewarded[i] or math.huge
    if best_mean == nil or mean > best_mean then best, best_mean = i, mean end
  end
  return best
end

return {
  name = "bandit",
  describe = "epsilon-greedy bandit over int8, int4, kivi2, rewarded by quality, TTFT and bytes",
  params = params,

  encode = function(ctx)
    local s = state(ctx)
    local id = ctx.request.id
    local arm = s.arm_of[id]
    if not arm then -- the request's first (layer, KV head) call pulls an arm
      arm = choose(ctx, s)
      s.arm_of[id] = arm
      s.pulls[arm] = s.pulls[arm] + 1
    end
    return arms[arm].enc()
  end,

  complete = function(ctx)
    local s = state(ctx)
    local p = ctx.params
    local id = ctx.request.id
    local arm = s.arm_of[id]
    if not arm then return end -- never encoded (no KV to send)
    s.arm_of[id] = nil
    local r = ctx.result
    local quality = ({ p.quality_int8, p.quality_int4, p.quality_kivi2 })[arm]
    local reward = quality - r.ttft_s / (p.ttft_target_ms / 1000) - p.bytes_weight * r.bytes / 1e9
    s.rewarded[arm] = s.rewarded[arm] + 1
    s.sum[arm] = s.sum[arm] + reward
  end,
}
