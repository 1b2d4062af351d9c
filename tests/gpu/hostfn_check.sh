#!/usr/bin/env bash
# Quick GPU check of host functions and stream-ordered allocation: cudart_async_alloc natively
# and under the shim (three sizes, a 64 MiB limit, four clients at once), then the daemon's log.
# usage: hostfn_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU, 1 when a run fails:
# its exit status or its missing PASS line)
set -u
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/hostfn-check.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # start_build_daemon
P=$B/tests/cudart/cudart_async_alloc
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/hostfn-rt.XXXX)
start_build_daemon "$B" "$RT" "$OUT/daemon.log"  # sets DPID
# `timeout` runs programs, not shell functions: the shim's environment is a prefix of env args.
SHIM_ENV=(env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT")
FAILED=0
# check LABEL COMMAND...: runs it; a failure is one that does not exit 0 with a PASS line.
check() {
  local label=$1 log
  shift
  log=$(timeout 120 "$@" 2>&1)
  local rc=$?
  echo "== $label: rc=$rc"
  echo "$log" | tail -n 3
  if [ "$rc" != 0 ] || ! grep -q "PASS" <<<"$log"; then
    echo "FAILED: $label"
    FAILED=$((FAILED + 1))
  fi
}
for args in "" 1 1000003; do
  check "native $args" env -u LD_PRELOAD "$P" $args
  check "shim $args" "${SHIM_ENV[@]}" MPSSHIM_LOG_LEVEL=info "$P" $args
done
check "shim, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=64M" "${SHIM_ENV[@]}" \
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=64M "$P" 100000
echo "== four clients at once"
pids=()
for i in 1 2 3 4; do timeout 120 "${SHIM_ENV[@]}" "$P" $((20000 * i)) >"$OUT/c$i.out" 2>&1 & pids+=($!); done
for i in 1 2 3 4; do
  if ! wait "${pids[$((i - 1))]}" || ! grep -q PASS "$OUT/c$i.out"; then
    echo "FAILED: client $i of four"
    FAILED=$((FAILED + 1))
  fi
done
cat "$OUT"/c*.out
"$CTL" --runtime-dir "$RT" quit >/dev/null 2>&1
wait "$DPID" 2>/dev/null
echo "== daemon log"; tail -40 "$OUT/daemon.log"
echo "hostfn_check: $FAILED failed"
exit $((FAILED == 0 ? 0 : 1))
