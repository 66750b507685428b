#!/bin/sh
# Runs the libFuzzer harnesses of tests/fuzz (built in <build>/fuzz/tests/fuzz).
#
#   run.sh short HARNESS_DIR NAME RUNS      one harness, deterministic: replays its seed
#                                           corpus, then RUNS mutations from seed 1, in a
#                                           fresh scratch corpus (ctest's fuzz_NAME)
#   run.sh long  HARNESS_DIR "NAMES" SECONDS each harness for SECONDS (make fuzz), keeping
#                                           what it finds in HARNESS_DIR/corpus/NAME
#
# Seeds are tests/fuzz/corpus/NAME (read only); a crash, UB report, leak, timeout
# or out-of-memory writes its input to HARNESS_DIR/artifacts/ and fails the run.
# Replay one with: HARNESS_DIR/fuzz_NAME HARNESS_DIR/artifacts/NAME-crash-...
set -eu

mode=$1 dir=$2 names=$3 amount=$4
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/artifacts"
# halt on the first UB report with a stack; leaks are checked by libFuzzer itself
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
common="-timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1"

failed=""
for name in $names; do
    bin="$dir/fuzz_$name"
    seeds="$src/corpus/$name"
    if [ ! -x "$bin" ]; then
        echo "run.sh: $bin is not built (configure with clang present, then build)" >&2
        exit 1
    fi
    dict=""
    [ -f "$src/$name.dict" ] && dict="-dict=$src/$name.dict"
    case $mode in
    short)
        work="$dir/work-$name"
        rm -rf "$work"
        mkdir -p "$work"
        # shellcheck disable=SC2086
        if ! "$bin" $common $dict -seed=1 -runs="$amount" -artifact_prefix="$dir/artifacts/$name-" \
            "$work" "$seeds"; then
            failed="$failed $name"
        fi
        rm -rf "$work"
        ;;
    long)
        work="$dir/corpus/$name"
        mkdir -p "$work"
        echo "=== fuzz_$name for $amount s (corpus $work) ==="
        # shellcheck disable=SC2086
        if ! "$bin" $common $dict -max_total_time="$amount" -artifact_prefix="$dir/artifacts/$name-" \
            "$work" "$seeds"; then
            failed="$failed $name"
        fi
        ;;
    *)
        echo "run.sh: mode is short or long, not '$mode'" >&2
        exit 2
        ;;
    esac
done
if [ -n "$failed" ]; then
    echo "run.sh: findings in:$failed (inputs in $dir/artifacts/)" >&2
    exit 1
fi
