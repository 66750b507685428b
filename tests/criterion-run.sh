#!/bin/sh
# Runs one Criterion test executable for ctest (tests/CMakeLists.txt):
#   criterion-run.sh EXECUTABLE [ARGS...]
# It exits with the executable's status, except that a run without failures in
# which a test skipped (cr_skip_test: "[SKIP] suite::test: why") exits 77, which
# ctest shows as Skipped (SKIP_RETURN_CODE), after one line
# "kvsim skipped: suite::test: why; ...". A skip is never shown as Passed, and it
# never hides a failure. Tests left out by --filter ("Test is disabled") do not count.
# A run in which no test ran at all (a --filter that matches nothing) fails.
out=$(mktemp "${TMPDIR:-/tmp}/kvsim-ctest-XXXXXX") || exit 1
"$@" >"$out" 2>&1
rc=$?
cat "$out"
skips=$(grep '^\[SKIP\] ' "$out" | grep -v ': Test is disabled$' | sed 's/^\[SKIP\] //')
tested0=$(grep -c 'Synthesis: Tested: 0 ' "$out")
rm -f "$out"
if [ "$rc" -eq 0 ] && [ "$tested0" -gt 0 ] && [ -z "$skips" ]; then
    echo "kvsim: no test ran (does the --filter match any test?): $*"
    exit 1
fi
if [ "$rc" -eq 0 ] && [ -n "$skips" ]; then
    echo "kvsim skipped: $(printf '%s\n' "$skips" | paste -sd ';' - | sed 's/;/; /g')"
    exit 77
fi
exit "$rc"
