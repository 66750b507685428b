#!/bin/sh
# test_measure_model.sh — scripts/measure-model.py checked on a tiny llama it builds (tests/scripts/tiny_model.py):
# bad input exits 2 and writes nothing; the HF folder and its GGUF conversion measure alike; and measure-model.py
# agrees with `kvsim measure` on the GGUF within docs/measure-model.md's tolerance.
# Skips (exit 77) without the optional PyTorch venv (make measure-deps); KVSIM_REQUIRE_MEASURE=1 fails instead.
set -u

VENV="${KVSIM_VENV:-$HOME/.cache/kvsim/venv}"
PY="$VENV/bin/python"
KVSIM="${KVSIM:-build/kvsim}"
skip() {
    echo "skipped: $1"
    [ "${KVSIM_REQUIRE_MEASURE:-0}" = 1 ] && { echo "FAIL: KVSIM_REQUIRE_MEASURE=1"; exit 1; }
    exit 77
}
fail() { echo "FAIL: $1"; exit 1; }

if [ ! -x "$PY" ] || ! "$PY" -c "import torch, transformers, gguf, numpy" 2>/dev/null; then
    skip "PyTorch not installed (make measure-deps)"
fi
[ -x "$KVSIM" ] || fail "no kvsim at $KVSIM"

T=$(mktemp -d "${TMPDIR:-/tmp}/kvsim-measure-model.XXXXXX") || fail "mktemp"
trap 'rm -rf "$T"' EXIT INT TERM
GPL=/usr/share/common-licenses/GPL-3
LGPL=/usr/share/common-licenses/LGPL-2.1

nice "$PY" tests/scripts/tiny_model.py "$T/m" > "$T/build.log" 2>&1 || { cat "$T/build.log"; fail "tiny_model.py"; }

# Bad input: exit 2, a message naming the problem, no output file.
bad() {
    want="$1"; shift
    "$PY" scripts/measure-model.py "$@" --out "$T/bad.json" > "$T/bad.log" 2>&1
    rc=$?
    [ "$rc" = 2 ] || { cat "$T/bad.log"; fail "measure-model.py $*: exit $rc, 2 expected"; }
    grep -q -- "$want" "$T/bad.log" || { cat "$T/bad.log"; fail "measure-model.py $*: no '$want' in the message"; }
    [ ! -e "$T/bad.json" ] || fail "measure-model.py $*: wrote an output file"
}
bad "is not a tensor encoding" --model "$T/m/hf" --lynx k=int9x,v=int8a4g32
bad "no anchor split" --model "$T/m/hf" --lynx k=int8g32,v=int8g32 --lengths 64
bad "could not be loaded" --model "$T/no-such-model" --lynx k=int8a4g32,v=int8a4g32
bad "strictly increasing" --model "$T/m/hf" --diffkv-window 8 --lengths 512,256
bad "past the model's context" --model "$T/m/hf" --diffkv-window 8 --lengths 4096
bad "nothing to measure" --model "$T/m/hf"
ls "$T" | grep -q '^\.measure-model\.' && fail "a temporary file was left behind"

# The same model from its HF folder and from the GGUF (transformers dequantizes it): the same statistics.
ARGS="--lynx k=int8a4g32,v=int8a4g32 --lynx k=int4a1g32,v=int4a1g32 --positions 4 --diffkv-window 32
      --lengths 256,512 --samples 8 --texts $GPL,$LGPL"
# shellcheck disable=SC2086
nice "$PY" scripts/measure-model.py --model "$T/m/hf" --out "$T/hf.json" $ARGS 2> "$T/hf.log" ||
    { cat "$T/hf.log"; fail "measure-model.py on the HF folder"; }
# shellcheck disable=SC2086
nice "$PY" scripts/measure-model.py --gguf "$T/m/tiny.gguf" --out "$T/gguf.json" $ARGS 2> "$T/gguf.log" ||
    { cat "$T/gguf.log"; fail "measure-model.py on the GGUF"; }
python3 scripts/compare-stats.py "$T/hf.json" "$T/gguf.json" --accept-tol 0.13 --share-tol 0.01 --logz-tol 0.01 ||
    fail "the HF folder and its GGUF measure differently"
# A file that differs must fail the comparison (the check can fail).
python3 - "$T/hf.json" "$T/off.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["lynx"][0]["accept"][0][0] = 1.0 - d["lynx"][0]["accept"][0][0] * 0.5
json.dump(d, open(sys.argv[2], "w"))
PYEOF
python3 scripts/compare-stats.py "$T/hf.json" "$T/off.json" > "$T/off.log"
[ $? = 1 ] || { cat "$T/off.log"; fail "compare-stats.py passed files that differ"; }
echo "measure-model: bad input, HF vs GGUF: ok"
