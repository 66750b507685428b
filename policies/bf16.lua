-- bf16.lua — the uncompressed baseline: every key and value travels as bf16.
--
-- Each value costs 2 bytes on the wire and in memory. This is what the
-- compressed policies are compared against: it has the largest KV transfer
-- and, by definition, no accuracy loss.
--
-- A policy file returns a table. Every hook is optional (see docs/policies.md);
-- this one only says how the KV cache is encoded. With no `transfer` hook the
-- KV travels as one stream, with no `speculate` hook the decode node waits for
-- the whole cache, and placement and admission use kvsim's defaults.

return {
  name = "bf16",
  describe = "BF16 keys and values (2 bytes each), no compression",

  -- encode(ctx) is asked once per (layer, KV head) of a request. It may return
  -- the string "bf16" as a shorthand for { key = "bf16", value = "bf16" }.
  encode = function(ctx)
    return { key = { kind = "bf16" }, value = { kind = "bf16" } }
  end,
}
