#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for SECONDS each, starting from its checked-in seed
# corpus (docs/testing.md, "Fuzzing"). The build directory must be configured with -Dfuzz=true
# on clang; the targets are built here if they are not yet.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
#
# New corpus entries go to BUILD_DIR/fuzz-corpus/<target> (not the source tree), findings
# (crash-*, leak-*, oom-*, timeout-*) to BUILD_DIR/fuzz-findings/<target>. Exits 1 if any target
# found something. Extra libFuzzer flags: FUZZ_FLAGS="-jobs=2 -workers=2" tests/fuzz/run.sh ...
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_ring_records fuzz_control_messages fuzz_image fuzz_limits)
fi

ninja -C "$build" "${targets[@]/#/tests/fuzz/}" >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
status=0
for target in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$target
  findings=$build/fuzz-findings/$target
  mkdir -p "$corpus" "$findings"
  log=$build/fuzz-findings/$target.log
  echo "== $target: ${seconds}s (log: $log)"
  # From the findings directory: with -jobs, libFuzzer writes each job's log (fuzz-N.log) to the
  # current directory.
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  if ! (cd "$findings" && "$build/tests/fuzz/$target" -max_total_time="$seconds" \
      -print_final_stats=1 -artifact_prefix="$findings/" ${FUZZ_FLAGS:-} "$corpus" \
      "$here/corpus/$target") >"$log" 2>&1; then
    status=1
    echo "   FOUND SOMETHING: see $log and $findings"
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" |
    sed 's/^/   /' || true
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | sed 's/^/   /' || true
done
exit $status
