#!/bin/sh
# Creates the optional PyTorch environment scripts/measure-model.py runs in (make measure-deps).
# The venv goes to ${KVSIM_VENV:-$HOME/.cache/kvsim/venv}; nothing else is touched. make run and
# make test never call this: the measurement script and its test (tests/scripts) are optional.
set -eu

VENV="${KVSIM_VENV:-$HOME/.cache/kvsim/venv}"
PYTHON="${PYTHON:-python3}"
# torch from PyPI (CPU works with it; CUDA where a GPU is present), transformers with its GGUF
# reader (gguf; accelerate, which it needs for GGUF files), numpy. Versions are lower bounds: the script uses only long-stable APIs.
PACKAGES="torch>=2.1 transformers>=4.45 accelerate gguf>=0.10 numpy>=1.24 sentencepiece protobuf"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "setup-measure: $PYTHON not found (install python3 and python3-venv)" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup-measure: creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" || {
        echo "setup-measure: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)" >&2
        exit 1
    }
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet $PACKAGES
"$VENV/bin/python" -c "import torch, transformers, gguf, numpy; print('setup-measure: torch', torch.__version__, '| transformers', transformers.__version__, '| gguf', gguf.__version__ if hasattr(gguf, '__version__') else '?', '| cuda', torch.cuda.is_available())"
echo "setup-measure: ready; run scripts/measure-model.py with $VENV/bin/python"
