#!/usr/bin/env bash
# Runs one program under a private mpsshimd and prints what the server measured for it
# (mpsshimctl stats: server time per operation, ring delays, launch batches), sampled every
# second while it runs; the last sample is printed at the end. For finding where a program's
# time goes under the shim, on the GPU machine:
#
#   tools/run_with_stats.sh BUILD [--daemon-arg ARG]... -- PROGRAM [ARGS...]
#
# BUILD is a build directory or a tools/gpu_pack.sh tree. The daemon's log goes to
# $TMPDIR/mpsshim-stats.XXXX/mpsshimd.log (its path is printed).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUILD [--daemon-arg ARG]... -- PROGRAM [ARGS...]" >&2; exit 2; }
build=$(realpath "$1")
shift
daemon_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  [ "$1" = "--daemon-arg" ] || { echo "$0: unexpected $1" >&2; exit 2; }
  daemon_args+=("$2")
  shift 2
done
shift  # --
work=$(mktemp -d "${TMPDIR:-/tmp}/mpsshim-stats.XXXX")
"$build/broker/daemon/mpsshimd" --runtime-dir "$work/rt" \
  --server "$build/broker/server/mpsshim-server" "${daemon_args[@]}" >"$work/mpsshimd.log" 2>&1 &
daemon=$!
trap '"$build/broker/daemon/mpsshimctl" --runtime-dir "$work/rt" quit >/dev/null 2>&1 || true; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$work/rt/control" ] && break; sleep 0.1; done
# The daemon refuses clients while its servers start.
for _ in $(seq 100); do
  "$build/broker/daemon/mpsshimctl" --runtime-dir "$work/rt" server_list 2>/dev/null |
    grep -q running && break
  sleep 0.1
done
CUDA_MPS_PIPE_DIRECTORY="$work/rt" LD_PRELOAD="$build/libshim/libmpsshim.so" "$@" &
program=$!
while kill -0 $program 2>/dev/null; do
  sample=$("$build/broker/daemon/mpsshimctl" --runtime-dir "$work/rt" stats 2>/dev/null || true)
  if [ "$(wc -l <<<"$sample")" -gt 1 ]; then printf '%s\n' "$sample" >"$work/last_stats"; fi
  sleep 1
done
status=0
wait $program || status=$?
echo "--- last mpsshimctl stats while the program ran ($work/mpsshimd.log):"
cat "$work/last_stats" 2>/dev/null || echo "(none: the program ended within a second)"
exit $status
