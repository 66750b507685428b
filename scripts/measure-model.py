#!/usr/bin/env python3
"""measure-model.py — a model statistics file (docs/stats-format.md, format 1) from any Hugging Face causal LM, with PyTorch.

Measures what `kvsim measure` measures on its reference model, by kvsim's definitions
(core/accuracy/feed_lynx.c, core/accuracy/eval.c, core/accuracy/diffkv_scores.c), on the
model's own forward pass (transformers) with kvsim's KV numerics (docs/kernels.md "Numerics")
applied to the keys and values the model attends to, through a custom attention function:

  * Lynx: one exact prefill per text; at each sampled prompt prefix, k greedy tokens on
    anchor-only KV (each prompt value at the middle of its anchor bin, the new tokens' KV
    encoded on write), then one verification pass of the k tokens on merged KV; the longest
    agreeing prefix is accepted.
  * DiffKV: z = N x (mean probability a token received from the queries at and after it,
    per query the max over its KV head's GQA group) at the end of an exact N-token prefill,
    over the tokens outside the last W; and z = L x (mean over its W + 1 queries) when a token
    leaves the window (L = position + W + 1), over the tokens with L >= N/2; 129 quantiles.

Usage: docs/measure-model.md. Needs the optional environment of scripts/setup-measure.sh.
Bad flags or models: a message and exit 2, nothing written; the output is written atomically.
"""
import argparse
import hashlib
import json
import math
import os
import re
import shlex
import sys
import tempfile

MEASUREMENT = 303        # producer.measurement: kvsim measure's KV_FEED_LYNX_VERSION * 100 + KV_DIFFKV_SCORES_VERSION (3, 3)
TOOL_VERSION = "1"
POINTS = 129             # DiffKV quantiles per (layer, KV head): KV_DIFFKV_TABLE_POINTS
DEFAULT_TEXTS = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/LGPL-2.1",
                 "/usr/share/common-licenses/MPL-1.1", "/usr/share/common-licenses/GFDL-1.3"]
QUERY_CHUNK = 1024       # prefill query rows per attention block


class InputError(Exception):
    """Bad input: the message is printed and the script exits 2."""


# ---- Encodings (docs/stats-format.md "Encodings") ------------------------------------------------

TENSOR_RE = re.compile(r"^(bf16|int([0-9]+)(?:a([0-9]+))?g([0-9]+)(c?))$")


def parse_tensor(text, whole):
    m = TENSOR_RE.match(text)
    if not m:
        raise InputError(f"encoding '{whole}': '{text}' is not a tensor encoding (bf16 or intB[aA]gG[c])")
    if m.group(1) == "bf16":
        return {"kind": "bf16"}
    bits, anchor, group = int(m.group(2)), int(m.group(3) or 0), int(m.group(4))
    if not 1 <= bits <= 16:
        raise InputError(f"encoding '{whole}': {text}: bits {bits} must be 1..16")
    if anchor and anchor >= bits:
        raise InputError(f"encoding '{whole}': {text}: anchor bits {anchor} must be 1..bits-1")
    if group < 1:
        raise InputError(f"encoding '{whole}': {text}: group size must be at least 1")
    return {"kind": "int", "bits": bits, "anchor": anchor, "group": group, "per_channel": m.group(5) == "c"}


def parse_encoding(text):
    """The grammar of docs/stats-format.md; returns a dict, InputError naming the text otherwise."""
    m = re.match(r"^k=([^,]+),v=([^,]+)(?:,window=([0-9]+))?"
                 r"(?:,low=([^,/]+)/([^,]+),alpha=([^,/]+)/([^,]+),recent=([0-9]+))?$", text)
    if not m:
        raise InputError(f"encoding '{text}': not of the form k=T,v=T[,window=R][,low=T/T,alpha=X/Y,recent=W] "
                         "(docs/stats-format.md)")
    enc = {"text": text, "key": parse_tensor(m.group(1), text), "value": parse_tensor(m.group(2), text),
           "window": int(m.group(3) or 0), "diffkv": m.group(4) is not None}
    return enc


def has_split(enc):
    return any(t["kind"] == "int" and t["anchor"] > 0 for t in (enc["key"], enc["value"]))


def check_lynx_encoding(enc, head_dim):
    """The encodings this script applies: per-token groups (bf16 or intB[aA]gG), no window, no DiffKV."""
    if enc["diffkv"] or enc["window"]:
        raise InputError(f"--lynx '{enc['text']}': window= and DiffKV tiers are not supported by measure-model.py "
                         "(Lynx acceptance is measured for encodings of per-token groups)")
    for what in ("key", "value"):
        t = enc[what]
        if t["kind"] == "int" and t["per_channel"]:
            raise InputError(f"--lynx '{enc['text']}': per-channel groups (c) are not supported by measure-model.py")
        if t["kind"] == "int" and head_dim % t["group"] and t["group"] > head_dim:
            raise InputError(f"--lynx '{enc['text']}': group {t['group']} does not fit head_dim {head_dim}")
    if not has_split(enc):
        raise InputError(f"--lynx '{enc['text']}': no anchor split (intBaAgG): Lynx speculates on the anchor")


# ---- Numerics (docs/kernels.md "Numerics", backends/numerics.h) -----------------------------------

def f16_sat(torch, x):
    """fp32 -> fp16 (round to nearest even, N1) -> fp32, +-Inf saturating to +-65504 (N2)."""
    h = x.to(torch.float16).to(torch.float32)
    return torch.where(torch.isinf(h), torch.sign(h) * 65504.0, h)


def quantize_groups(torch, x, bits, anchor, group):
    """x [..., n]: b-bit groups of G values along the last axis. Returns (merged, anchor-only) fp32."""
    n = x.shape[-1]
    pad = (-n) % group
    xs = torch.nn.functional.pad(x, (0, pad), value=float("nan")) if pad else x
    g = xs.reshape(*xs.shape[:-1], -1, group)
    finite = torch.isfinite(g)
    inf = torch.tensor(float("inf"), dtype=torch.float32, device=x.device)
    mn = torch.where(finite, g, inf).amin(-1, keepdim=True)
    mx = torch.where(finite, g, -inf).amax(-1, keepdim=True)
    have = finite.any(-1, keepdim=True)
    mn = torch.where(have, mn, torch.zeros_like(mn)) + 0.0   # N3: -0 -> +0
    mx = torch.where(have, mx, torch.zeros_like(mx)) + 0.0
    qmax = float((1 << bits) - 1)
    s = f16_sat(torch, (mx - mn) / qmax)
    z = f16_sat(torch, mn)
    s = torch.where(have, s, torch.zeros_like(s))
    z = torch.where(have, z, torch.zeros_like(z))
    safe_s = torch.where(s == 0, torch.ones_like(s), s)
    v = ((g - z) / safe_s).clamp(0.0, qmax)                  # correctly rounded fp32 division (N4)
    q = torch.round(v)                                       # round half to even
    q = torch.where(s == 0, torch.zeros_like(q), q)
    q = torch.where(torch.isnan(g), torch.zeros_like(q), q)
    q = torch.where(torch.isinf(g), torch.where(g > 0, torch.full_like(q, qmax), torch.zeros_like(q)), q)
    # fmaf(q, s, z): q * s is exact in double, the sum is rounded once to fp32
    merged = (q.double() * s.double() + z.double()).float()
    if anchor:
        r = bits - anchor
        a = torch.floor(q / float(1 << r))
        mid = float((1 << r) - 1) / 2.0
        anchor_only = ((a * float(1 << r) + mid).double() * s.double() + z.double()).float()
    else:
        anchor_only = merged
    merged = merged.reshape(xs.shape)[..., :n]
    anchor_only = anchor_only.reshape(xs.shape)[..., :n]
    return merged, anchor_only


def encode_tensor(torch, x, t):
    """x [..., head_dim] per token: (merged, anchor-only) reconstructions of tensor encoding t."""
    if t["kind"] == "bf16":
        b = x.to(torch.bfloat16).to(torch.float32)           # N6
        return b, b
    return quantize_groups(torch, x, t["bits"], t["anchor"], t["group"])


# ---- The model ----------------------------------------------------------------------------------

class Measurer:
    """One loaded model, with the attention function that holds each layer's KV the way kvsim stores it.

    Modes: "prefill" keeps exact fp32 K/V and attends exactly (fp32), gathering DiffKV's
    significance when asked; "decode" encodes each new token's K/V on write and attends in
    double over the stored reconstructions. Keys are grouped in the channel order kvsim (and
    llama.cpp's GGUF) stores them: interleaved RoPE pairs, i.e. HF's channels i and i + d/2
    side by side.
    """

    def __init__(self, torch, model, device):
        self.torch = torch
        self.model = model
        self.device = device
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        hd = self.head_dim
        self.perm = torch.tensor([i // 2 + (hd // 2) * (i % 2) for i in range(hd)], device=device)
        self.inv_perm = torch.argsort(self.perm)
        self.mode = "prefill"
        self.enc = None
        self.k = [None] * self.layers   # per layer [kv_heads, n, hd] fp32 (HF channel order)
        self.v = [None] * self.layers
        self.stats = None               # DiffKV gathering (prefill), see DiffkvStats

    def reset(self):
        self.k = [None] * self.layers
        self.v = [None] * self.layers

    def encode_kv(self, k, v, enc):
        """Merged and anchor-only reconstructions of k, v [kv_heads, n, hd] (keys grouped in GGUF order)."""
        kg = k[..., self.perm]
        km, ka = encode_tensor(self.torch, kg, enc["key"])
        vm, va = encode_tensor(self.torch, v, enc["value"])
        return km[..., self.inv_perm], ka[..., self.inv_perm], vm, va

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        torch = self.torch
        layer = module.layer_idx
        q = query[0].float()                                  # [H, T, hd]
        k_new, v_new = key[0].float(), value[0].float()       # [KVH, T, hd], after RoPE
        T = q.shape[1]
        if self.mode == "decode":
            km, _, vm, _ = self.encode_kv(k_new, v_new, self.enc)
            k_new, v_new = km, vm
        self.k[layer] = k_new if self.k[layer] is None else torch.cat([self.k[layer], k_new], 1)
        self.v[layer] = v_new if self.v[layer] is None else torch.cat([self.v[layer], v_new], 1)
        K, V = self.k[layer], self.v[layer]
        n = K.shape[1]
        past = n - T
        scale = scaling if scaling is not None else 1.0 / math.sqrt(self.head_dim)
        G = self.heads // self.kv_heads
        dtype = torch.float32 if self.mode == "prefill" else torch.float64
        out = torch.empty((T, self.heads, self.head_dim), dtype=torch.float32, device=q.device)
        for g in range(self.kv_heads):
            Kg, Vg = K[g].to(dtype), V[g].to(dtype)
            for r0 in range(0, T, QUERY_CHUNK):
                r1 = min(T, r0 + QUERY_CHUNK)
                qs = q[g * G:(g + 1) * G, r0:r1].to(dtype)     # [G, rows, hd]
                s = torch.matmul(qs, Kg[:past + r1].transpose(0, 1)) * scale
                rows = torch.arange(past + r0, past + r1, device=q.device)
                cols = torch.arange(past + r1, device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
                p = torch.softmax(s, -1)
                o = torch.matmul(p, Vg[:past + r1])
                out[r0:r1, g * G:(g + 1) * G] = o.transpose(0, 1).float()
                if self.stats is not None and self.mode == "prefill":
                    self.stats.add(layer, g, r0, p.amax(0).double())
        return out.unsqueeze(0).to(query.dtype), None

    def hidden(self, ids, start):
        """Runs tokens ids (list) at positions start.. through the model; the last hidden states [T, dim]."""
        torch = self.torch
        inp = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)
        with torch.no_grad():
            base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
            h = base(input_ids=inp, position_ids=pos, use_cache=False).last_hidden_state
        return h[0]

    def argmax_at(self, h, rows):
        """Greedy tokens (the lowest index on ties) of hidden-state rows."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model.get_output_embeddings()(h[rows]).float()
        best = logits.max(-1, keepdim=True).values
        idx = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
        return torch.where(logits == best, idx, logits.shape[-1]).amin(-1).tolist()


# ---- DiffKV significance -------------------------------------------------------------------------

class DiffkvStats:
    """Per (layer, KV head): the probability each token received summed over the queries before
    each measured length N, and over its first W + 1 queries, from one exact prefill."""

    def __init__(self, torch, layers, kv_heads, T, lengths, windows, device):
        self.torch = torch
        self.lengths, self.windows = lengths, windows
        self.acc = {(l, g, N): torch.zeros(T, dtype=torch.float64, device=device)
                    for l in range(layers) for g in range(kv_heads) for N in lengths}
        self.band = {(l, g, W): torch.zeros(T, dtype=torch.float64, device=device)
                     for l in range(layers) for g in range(kv_heads) for W in windows}

    def add(self, layer, g, r0, p):
        """p [rows, keys]: per query row r0.., the max over the group of each key's probability."""
        rows, keys = p.shape
        for N in self.lengths:
            if r0 < N:
                self.acc[(layer, g, N)][:keys] += p[:min(rows, N - r0)].sum(0)
        for W in self.windows:
            b = self.band[(layer, g, W)]
            for d in range(W + 1):
                diag = self.torch.diagonal(p, offset=r0 - d)  # p[t - r0, t - d] for the rows t of the block
                i0 = max(r0 - d, 0)
                if diag.numel():
                    b[i0:i0 + diag.numel()] += diag


def quantiles(values):
    """Quantiles at u = k / (P - 1), linear between order statistics (diffkv_scores.c)."""
    v = sorted(values)
    n = len(v)
    out = []
    for k in range(POINTS):
        x = k / (POINTS - 1) * (n - 1)
        i = int(math.floor(x))
        f = x - i
        out.append(v[i] + f * (v[i + 1] - v[i]) if i + 1 < n else v[n - 1])
    return out


# ---- Measurements --------------------------------------------------------------------------------

def spread(lengths, per_text):
    """Speculation prefixes: per length L, per_text of them at L - j x (L / 8) / per_text, all distinct
    (feed_lynx.c's spread); owner[i] is the index of the length prefix i belongs to."""
    spec, owner = [], []
    for i, L in enumerate(lengths):
        for j in range(per_text):
            l = L - int(j * (L // 8) / per_text)
            while l > 1 and l in spec:
                l -= 1
            spec.append(max(l, 1))
            owner.append(i)
    return spec, owner


def measure_lynx(M, texts, lengths, lynx, samples, log):
    """lynx: [(enc, k)]; samples speculations per length (rounded up to a multiple of the texts), every
    text giving its share at the same prefixes. Returns the lynx[] entries of the file."""
    per_text = max(1, -(-samples // len(texts)))
    spec, owner = spread(lengths, per_text)
    if len(spec) > 64:
        raise InputError(f"--samples {samples} with {len(lengths)} lengths and {len(texts)} texts: {len(spec)} "
                         "prefixes per text, at most 64")
    res = [{"accepted": [[0] * k for _ in lengths], "spec": [0] * len(lengths)} for _, k in lynx]
    longest = lengths[-1]
    for name, ids in texts:
        log(f"measure-model: lynx: {name}: prefill of {longest} tokens, {len(spec)} speculations per encoding")
        M.reset()
        M.mode, M.stats = "prefill", None
        h = M.hidden(ids[:longest], 0)
        first = dict(zip(spec, M.argmax_at(h, [n - 1 for n in spec])))
        exact_k, exact_v = list(M.k), list(M.v)
        for e, (enc, k) in enumerate(lynx):
            coded = [M.encode_kv(exact_k[l], exact_v[l], enc) for l in range(M.layers)]  # per-token groups
            for li, n in zip(owner, spec):
                if n + k > M.context:
                    continue
                # speculation: k greedy tokens on anchor-only prompt KV
                M.k = [coded[l][1][:, :n] for l in range(M.layers)]
                M.v = [coded[l][3][:, :n] for l in range(M.layers)]
                M.mode, M.enc = "decode", enc
                fed, picks = [first[n]], []
                for i in range(k):
                    t = M.argmax_at(M.hidden([fed[i]], n + i), [0])[0]
                    picks.append(t)
                    if i + 1 < k:
                        fed.append(t)
                # verification: the residual has arrived; the k fed tokens at once on merged KV
                M.k = [coded[l][0][:, :n] for l in range(M.layers)]
                M.v = [coded[l][2][:, :n] for l in range(M.layers)]
                verify = M.argmax_at(M.hidden(fed, n), list(range(k)))
                a = 0
                while a < k and verify[a] == picks[a]:
                    a += 1
                for j in range(a):
                    res[e]["accepted"][li][j] += 1
                res[e]["spec"][li] += 1
        M.reset()
    out = []
    for e, (enc, k) in enumerate(lynx):
        acc = []
        for li in range(len(lengths)):
            before, row = res[e]["spec"][li], []
            for j in range(k):
                row.append(res[e]["accepted"][li][j] / before if before > 0 else 0.0)
                before = res[e]["accepted"][li][j]
            acc.append(row)
        out.append({"encodings": [enc["text"]], "positions": k, "lengths": lengths, "accept": acc,
                    "samples": res[e]["spec"]})
    return out


def measure_diffkv(M, ids, lengths, windows, log):
    """One exact pass of the longest length over ids (the first text, joined with the next ones while
    short); each length's tables are those a pass of that length gives (diffkv_scores.c)."""
    torch = M.torch
    T = lengths[-1]
    log(f"measure-model: diffkv: prefill of {T} tokens")
    M.reset()
    M.mode = "prefill"
    M.stats = DiffkvStats(torch, M.layers, M.kv_heads, T, lengths, windows, M.device)
    M.hidden(ids[:T], 0)
    st, M.stats = M.stats, None
    M.reset()
    out = []
    for W in windows:
        entry = {"window": W, "points": POINTS, "lengths": lengths, "prefill": [], "exit": []}
        for N in lengths:
            pre, ex = [], []
            outside, pos = N - W, torch.arange(N, dtype=torch.float64, device=M.device)
            first = outside // 2
            i = torch.arange(first, outside, dtype=torch.float64, device=M.device)
            for l in range(M.layers):
                pre.append([quantiles((N * st.acc[(l, g, N)][:N] / (N - pos))[:outside].tolist())
                            for g in range(M.kv_heads)])
                ex.append([quantiles(((i + W + 1) * st.band[(l, g, W)][first:outside] / (W + 1)).tolist())
                           for g in range(M.kv_heads)])
            entry["prefill"].append(pre)
            entry["exit"].append(ex)
        out.append(entry)
    return out


# ---- Command line ----------------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def positive_list(text, what):
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{what} '{text}': comma-separated whole numbers expected")
    if not v or any(x < 1 for x in v) or v != sorted(set(v)):
        raise InputError(f"{what} '{text}': positive and strictly increasing lengths expected")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="measure-model.py",
                                 description="Writes a kvsim model statistics file (docs/stats-format.md) "
                                             "for a Hugging Face causal LM.")
    ap.add_argument("--model", help="Hugging Face model id or local folder (with --gguf: the folder of the file)")
    ap.add_argument("--gguf", help="a GGUF file, loaded dequantized by transformers (the weights kvsim uses)")
    ap.add_argument("--out", required=True, help="the statistics file to write (atomically)")
    ap.add_argument("--lynx", action="append", default=[], metavar="ENC",
                    help="an encoding with an anchor split, e.g. k=int8a4g32,v=int8a4g32 (repeatable)")
    ap.add_argument("--positions", action="append", type=int, default=[], metavar="K",
                    help="speculative positions k of each --lynx (one value: all of them)")
    ap.add_argument("--diffkv-window", action="append", type=int, default=[], metavar="W",
                    help="a DiffKV recent window to measure significance quantiles for (repeatable)")
    ap.add_argument("--lengths", default="1024,2048", help="prompt lengths, tokens (default 1024,2048)")
    ap.add_argument("--texts", default=",".join(DEFAULT_TEXTS), help="comma-separated text files")
    ap.add_argument("--samples", type=int, default=32, help="Lynx speculations per length (default 32)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--name", help="model name written to the file (default: the model's)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's)")
    a = ap.parse_args(argv)
    if not a.model and not a.gguf:
        raise InputError("--model or --gguf is required")
    if not a.lynx and not a.diffkv_window:
        raise InputError("nothing to measure: give --lynx ENC and/or --diffkv-window W")
    a.lengths = positive_list(a.lengths, "--lengths")
    if len(a.lengths) > 16:
        raise InputError("--lengths: at most 16 lengths (KV_CURVE_MAX_LENGTHS)")
    if a.positions and len(a.positions) not in (1, len(a.lynx)):
        raise InputError(f"--positions: give one value or one per --lynx ({len(a.lynx)})")
    ks = (a.positions * len(a.lynx) if len(a.positions) == 1 else a.positions) or [4] * len(a.lynx)
    if any(not 1 <= k <= 64 for k in ks):
        raise InputError("--positions: k must be 1..64")
    a.lynx = [(parse_encoding(t), k) for t, k in zip(a.lynx, ks)]
    if any(w < 0 for w in a.diffkv_window) or len(set(a.diffkv_window)) != len(a.diffkv_window):
        raise InputError("--diffkv-window: distinct windows of 0 or more tokens expected")
    if any(w >= a.lengths[0] for w in a.diffkv_window):
        raise InputError(f"--diffkv-window: a window must be shorter than the shortest length ({a.lengths[0]})")
    if a.samples < 1:
        raise InputError("--samples must be at least 1")
    a.texts = [t for t in a.texts.split(",") if t]
    for t in a.texts:
        if not os.path.isfile(t):
            raise InputError(f"--texts: '{t}' is not a readable file")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        raise InputError(f"--out: folder '{out_dir}' does not exist")
    return a


def match_gguf_pretokenizer(tok, path):
    """transformers reads a GGUF's byte-level BPE with the plain GPT-2 pre-tokenizer; llama.cpp's (and kvsim's)
    "smollm" pre-tokenizer first isolates every digit, as SmolLM2's own tokenizer.json does."""
    import gguf
    from tokenizers import pre_tokenizers
    field = gguf.GGUFReader(path).fields.get("tokenizer.ggml.pre")
    pre = bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field else "default"
    if pre == "smollm":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre not in ("gpt2", "default"):
        raise InputError(f"--gguf: pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not one kvsim reads "
                         "(smollm, gpt2, default)")


def load_model(a, torch, log):
    try:
        import transformers
        from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise InputError(f"transformers is not installed ({e}): run `make measure-deps`")
    if a.gguf:
        if not os.path.isfile(a.gguf):
            raise InputError(f"--gguf: '{a.gguf}' is not a file")
        where, kw = (a.model or os.path.dirname(os.path.abspath(a.gguf))), {"gguf_file": os.path.basename(a.gguf)}
        if not a.model:
            kw["gguf_file"] = os.path.abspath(a.gguf)
            where = os.path.dirname(os.path.abspath(a.gguf))
    else:
        where, kw = a.model, {}
    try:
        log(f"measure-model: loading {a.gguf or a.model} (transformers {transformers.__version__})")
        tok = AutoTokenizer.from_pretrained(where, **kw)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw)
    except Exception as e:  # transformers raises many kinds for a missing or unsupported model
        raise InputError(f"model '{a.gguf or a.model}' could not be loaded: {type(e).__name__}: {e}")
    if a.gguf:
        match_gguf_pretokenizer(tok, a.gguf)
    model.to(a.device).eval()
    M = Measurer(torch, model, a.device)
    AttentionInterface.register("kvsim", M.attention)
    model.config._attn_implementation = "kvsim"
    for sub in model.modules():
        if hasattr(sub, "config") and hasattr(sub.config, "_attn_implementation"):
            sub.config._attn_implementation = "kvsim"
    if not M.context:
        raise InputError("the model's config has no max_position_embeddings (its trained context)")
    return tok, model, M


def main(argv):
    a = parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        import torch
    except ImportError:
        raise InputError("PyTorch is not installed: run `make measure-deps` (scripts/setup-measure.sh), then run "
                         "this script with that venv's python")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available to PyTorch")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    tok, model, M = load_model(a, torch, log)
    for enc, _ in a.lynx:
        check_lynx_encoding(enc, M.head_dim)
    k_max = max([k for _, k in a.lynx] or [0])
    if a.lengths[-1] + k_max > M.context:
        raise InputError(f"--lengths: {a.lengths[-1]} (+ k = {k_max}) is past the model's context of {M.context}")
    raws = []
    for path in a.texts:
        with open(path, "rb") as f:
            raws.append(f.read())
    encode = lambda raw: tok(raw.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]  # noqa
    text_meta = [{"name": os.path.basename(p), "sha256": hashlib.sha256(r).hexdigest(), "tokens": len(encode(r))}
                 for p, r in zip(a.texts, raws)]

    def joined(t, need, cyclic):
        """Text t, continued with the next texts after a blank line while shorter than need tokens."""
        raw, ids, j = raws[t], encode(raws[t]), 1
        while len(ids) < need and j < len(raws) and (cyclic or t + j < len(raws)):
            raw += b"\n\n" + raws[(t + j) % len(raws)]
            ids, j = encode(raw), j + 1
        if len(ids) < need:
            raise InputError(f"--texts: '{a.texts[t]}' has {len(ids)} tokens (joined with the texts after it), "
                             f"fewer than the {need} needed")
        return ids
    model_file = a.gguf or ""
    stats = {
        "format": "kvsim-model-stats",
        "version": 1,
        "model": {"name": (a.name or os.path.basename((a.gguf or a.model).rstrip("/")))[:127],
                  "file": os.path.basename(model_file)[:255],
                  "sha256": sha256_file(model_file) if model_file else "",
                  "layers": M.layers, "heads": M.heads, "kv_heads": M.kv_heads, "head_dim": M.head_dim,
                  "context": M.context},
        "producer": {"tool": f"measure-model.py {TOOL_VERSION} (torch {torch.__version__})"[:127],
                     "command": " ".join(shlex.quote(x) for x in ["scripts/measure-model.py"] + argv)[:1023],
                     "measurement": MEASUREMENT},
        "texts": text_meta,
        "lynx": measure_lynx(M, [(text_meta[t]["name"], joined(t, a.lengths[-1] + 1, True))
                                 for t in range(len(raws))], a.lengths, a.lynx, a.samples, log) if a.lynx else [],
        "diffkv": measure_diffkv(M, joined(0, a.lengths[-1], False), a.lengths, a.diffkv_window, log)
                  if a.diffkv_window else [],
    }
    out = os.path.abspath(a.out)
    fd, tmp = tempfile.mkstemp(prefix=".measure-model.", dir=os.path.dirname(out))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=1)
            f.write("\n")
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    log(f"measure-model: wrote {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as e:
        print(f"measure-model.py: {e}", file=sys.stderr)
        sys.exit(2)
