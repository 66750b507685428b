#!/usr/bin/env python3
"""compare-stats.py — compares two model statistics files (docs/stats-format.md) member by member.

  compare-stats.py A B [--accept-tol X] [--share-tol X] [--logz-tol X] [--alpha H/L]...

Lynx: each entry of A is matched with B's entry of the same encodings (compared as parsed) and
positions; over the lengths both measured, the absolute difference of the conditional acceptance
of every position. DiffKV: entries of the same window; over common lengths and every (layer, KV
head), the tier shares DiffKV's rule gives at each --alpha H/L (high: z >= H, low: L <= z < H,
pruned: z < L, read off the 129 quantiles), absolute difference, and the difference of the
quantiles in log z (u in 0.05..0.95, where both are positive). Prints the worst difference per
section and where it is; exits 0 within every tolerance, 1 beyond one (or when the measurement
methods differ), 2 for unreadable files or nothing in common. Standard library only.
"""
import argparse
import bisect
import json
import math
import re
import sys


class InputError(Exception):
    pass


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not JSON: {e.msg}")
    if not isinstance(d, dict) or d.get("format") != "kvsim-model-stats" or d.get("version") != 1:
        raise InputError(f"{path}: not a kvsim model statistics file of format 1 (members 'format', 'version')")
    if not isinstance(d.get("model"), dict):
        raise InputError(f"{path}: member 'model' is missing")
    return d


def canon_tensor(t):
    m = re.match(r"^(?:bf16|int([0-9]+)(?:a([0-9]+))?g([0-9]+)(c?))$", t)
    if not m:
        return ("?", t)
    if t == "bf16":
        return ("bf16",)
    return ("int", int(m.group(1)), int(m.group(2) or 0), int(m.group(3)), m.group(4) == "c")


def canon_encoding(text):
    """An encoding text as a comparable tuple (numbers parsed, so 1 and 1.0 are one alpha)."""
    parts = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
    key = (canon_tensor(parts.get("k", "")), canon_tensor(parts.get("v", "")), int(parts.get("window", 0)))
    if "low" in parts:
        lo_k, lo_v = parts["low"].split("/", 1)
        ah, al = parts["alpha"].split("/", 1)
        key += (canon_tensor(lo_k), canon_tensor(lo_v), float(ah), float(al), int(parts["recent"]))
    return key


def canon_set(encodings):
    if isinstance(encodings, str):
        encodings = [encodings]
    c = tuple(canon_encoding(e) for e in encodings)
    return c if len(set(c)) > 1 else c[:1]


def cdf(q, x):
    """P(z < x) from quantiles q at u = k / (P - 1) (linear between them)."""
    P = len(q)
    if x <= q[0]:
        return 0.0
    if x > q[-1]:
        return 1.0
    i = bisect.bisect_left(q, x) - 1        # q[i] < x <= q[i + 1]
    lo, hi = q[i], q[i + 1]
    f = (x - lo) / (hi - lo) if hi > lo else 1.0
    return (i + f) / (P - 1)


def shares(q, high, low):
    p_low = cdf(q, low)
    p_high = cdf(q, high)
    return (1.0 - p_high, p_high - p_low, p_low)


class Worst:
    def __init__(self, name):
        self.name, self.value, self.where, self.count = name, 0.0, "", 0

    def add(self, value, where):
        if self.count == 0 or value > self.value:
            self.value, self.where = value, where
        self.count += 1


def compare(a, b, args, out):
    ok = True
    ma, mb = a["model"], b["model"]
    shape = ("layers", "heads", "kv_heads", "head_dim")
    if any(ma.get(k) != mb.get(k) for k in shape):
        raise InputError("the files describe models of different shapes: " +
                         ", ".join(f"{k} {ma.get(k)} / {mb.get(k)}" for k in shape))
    out.write(f"A: {args.a} ({a.get('producer', {}).get('tool', '?')}, model {ma.get('name')})\n")
    out.write(f"B: {args.b} ({b.get('producer', {}).get('tool', '?')}, model {mb.get('name')})\n")
    va, vb = a.get("producer", {}).get("measurement"), b.get("producer", {}).get("measurement")
    if va != vb:
        out.write(f"measurement methods differ ({va} / {vb}): the figures are not comparable\n")
        ok = False
    ta = [t.get("name") for t in a.get("texts", [])]
    tb = [t.get("name") for t in b.get("texts", [])]
    if ta != tb:
        out.write(f"note: texts differ: {ta} / {tb}\n")
    compared = 0

    acc = Worst("lynx acceptance |A - B|")
    for ea in a.get("lynx", []):
        ca = canon_set(ea["encodings"])
        eb = next((e for e in b.get("lynx", []) if canon_set(e["encodings"]) == ca and
                   e["positions"] == ea["positions"]), None)
        label = ea["encodings"] if isinstance(ea["encodings"], str) else ea["encodings"][0]
        if eb is None:
            out.write(f"lynx {label} k={ea['positions']}: only in A\n")
            continue
        common = [L for L in ea["lengths"] if L in eb["lengths"]]
        if not common:
            out.write(f"lynx {label}: no length measured in both\n")
        for L in common:
            ra, rb = ea["accept"][ea["lengths"].index(L)], eb["accept"][eb["lengths"].index(L)]
            for j in range(ea["positions"]):
                acc.add(abs(ra[j] - rb[j]), f"{label}, length {L}, position {j + 1}: {ra[j]:.4f} / {rb[j]:.4f}")
                compared += 1
    share = Worst("diffkv tier share |A - B|")
    logz = Worst("diffkv quantile |log zA - log zB| (u 0.05..0.95)")
    for ea in a.get("diffkv", []):
        eb = next((e for e in b.get("diffkv", []) if e["window"] == ea["window"]), None)
        if eb is None:
            out.write(f"diffkv window {ea['window']}: only in A\n")
            continue
        if ea["points"] != eb["points"]:
            out.write(f"diffkv window {ea['window']}: {ea['points']} / {eb['points']} quantiles: not compared\n")
            continue
        P = ea["points"]
        common = [L for L in ea["lengths"] if L in eb["lengths"]]
        for L in common:
            ia, ib = ea["lengths"].index(L), eb["lengths"].index(L)
            for kind in ("prefill", "exit"):
                for l, (la, lb) in enumerate(zip(ea[kind][ia], eb[kind][ib])):
                    for h, (qa, qb) in enumerate(zip(la, lb)):
                        where = f"window {ea['window']}, length {L}, {kind}, layer {l}, KV head {h}"
                        for high, low in args.alpha:
                            sa, sb = shares(qa, high, low), shares(qb, high, low)
                            for tier, x, y in zip(("high", "low", "pruned"), sa, sb):
                                share.add(abs(x - y), f"{where}, alpha {high:g}/{low:g}, {tier}: {x:.4f} / {y:.4f}")
                        for k in range(P):
                            u = k / (P - 1)
                            if 0.05 <= u <= 0.95 and qa[k] > 0 and qb[k] > 0:
                                logz.add(abs(math.log(qa[k]) - math.log(qb[k])),
                                         f"{where}, u {u:.3f}: {qa[k]:.4g} / {qb[k]:.4g}")
                        compared += 1
    for eb in b.get("lynx", []):
        if not any(canon_set(e["encodings"]) == canon_set(eb["encodings"]) and e["positions"] == eb["positions"]
                   for e in a.get("lynx", [])):
            out.write(f"lynx {eb['encodings']} k={eb['positions']}: only in B\n")
    for eb in b.get("diffkv", []):
        if not any(e["window"] == eb["window"] for e in a.get("diffkv", [])):
            out.write(f"diffkv window {eb['window']}: only in B\n")
    if compared == 0:
        raise InputError("the files have no Lynx entry or DiffKV window with a length in common")
    for w, tol in ((acc, args.accept_tol), (share, args.share_tol), (logz, args.logz_tol)):
        if w.count == 0:
            continue
        verdict = "not checked" if tol is None else ("within" if w.value <= tol else "BEYOND")
        out.write(f"{w.name}: worst {w.value:.4f} over {w.count} ({verdict}"
                  f"{'' if tol is None else f' tolerance {tol:g}'}) at {w.where}\n")
        if tol is not None and w.value > tol:
            ok = False
    return ok


def alpha_pair(text):
    try:
        h, l = (float(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': H/L expected, e.g. 1/0.02")
    if not (0 <= l <= h):
        raise argparse.ArgumentTypeError(f"'{text}': 0 <= L <= H expected")
    return (h, l)


def main(argv):
    ap = argparse.ArgumentParser(prog="compare-stats.py", description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--accept-tol", type=float, default=0.15,
                    help="largest |A - B| of a conditional acceptance (default 0.15)")
    ap.add_argument("--share-tol", type=float, default=0.05,
                    help="largest |A - B| of a DiffKV tier share (default 0.05)")
    ap.add_argument("--logz-tol", type=float, default=None,
                    help="largest |log zA - log zB| of a quantile (default: printed, not checked)")
    ap.add_argument("--alpha", type=alpha_pair, action="append", default=None,
                    help="DiffKV thresholds H/L for the tier shares (repeatable; default 1/0.02)")
    args = ap.parse_args(argv)
    args.alpha = args.alpha or [(1.0, 0.02)]
    try:
        ok = compare(load(args.a), load(args.b), args, sys.stdout)
    except InputError as e:
        print(f"compare-stats.py: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, IndexError, ValueError) as e:
        print(f"compare-stats.py: a member is missing or out of shape ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print("compare-stats: " + ("within tolerance" if ok else "beyond tolerance"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
