#!/bin/sh
# gen-man.sh — kvsim's man page (kvsim.1) from `kvsim --help` and `kvsim --version`.
# Usage: gen-man.sh KVSIM OUT.1
# help2man (Debian: help2man, in scripts/setup.sh) writes it when present; otherwise the help text
# is wrapped in a minimal page here, so `make install` always installs one.
set -eu
kvsim=$1
out=$2
if command -v help2man >/dev/null 2>&1; then
    help2man --no-info --no-discard-stderr --name="disaggregated LLM inference simulator (KV compression and transfer)" \
        --output="$out" "$kvsim"
    exit 0
fi
version=$("$kvsim" --version | head -n 1)
{
    printf '.TH KVSIM 1 "" "%s" "User Commands"\n' "$version"
    printf '.SH NAME\nkvsim \\- disaggregated LLM inference simulator (KV compression and transfer)\n'
    printf '.SH DESCRIPTION\n.nf\n'
    "$kvsim" --help | sed -e 's/\\/\\\\/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"
    printf '.fi\n.SH FILES\n.nf\n'
    "$kvsim" --version | sed -e '1d' -e 's/\\/\\\\/g' -e 's/^\./\\\&./'
    printf '.fi\n'
} > "$out"
