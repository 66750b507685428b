#!/bin/sh
# Installs the Debian packages kvsim needs, if any are missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
set -eu

PACKAGES="build-essential cmake pkg-config libsimgrid-dev liblua5.4-dev libyaml-dev \
libcriterion-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libopenblas-dev python3 python3-pip python3-matplotlib \
clang libclang-rt-14-dev parallel help2man libssl-dev"
# libssl-dev: libcrypto's SHA-256, which kvsim measure records of the measured model file.
# help2man: the man page make install writes from kvsim --help (scripts/gen-man.sh; without it, a plainer one).
# parallel: GNU parallel, which tests/study/test_safety_sweep.c runs kvsim sweep's jobs.txt with.
# clang + libclang-rt-14-dev (libFuzzer; only a Recommends of clang on Debian 12,
# and apt-get runs without recommends below): the fuzz harnesses of tests/fuzz.

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

echo "kvsim setup: missing Debian packages:$missing"
if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing
else
    echo "kvsim setup: run this, then try again:"
    echo "    sudo apt-get update && sudo apt-get install -y$missing"
    exit 1
fi
