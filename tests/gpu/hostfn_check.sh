#!/usr/bin/env bash
# Quick GPU check of host functions and stream-ordered allocation: cudart_async_alloc natively
# and under the shim (three sizes, a 64 MiB limit, four clients at once), then the daemon's log.
# usage: hostfn_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU)
set -u
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/hostfn-check.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
P=$B/tests/cudart/cudart_async_alloc
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/hostfn-rt.XXXX)
env -u LD_PRELOAD -u CUDA_MPS_PIPE_DIRECTORY "$B/broker/daemon/mpsshimd" --runtime-dir "$RT" \
  --server "$B/broker/server/mpsshim-server" >"$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do
  [ -S "$RT/control" ] && "$CTL" --runtime-dir "$RT" server_list 2>/dev/null | grep -qw running && break
  sleep 0.1
done
# `timeout` runs programs, not shell functions: the shim's environment is a prefix of env args.
SHIM_ENV=(env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT")
for args in "" 1 1000003; do
  echo "== native $args"; timeout 120 env -u LD_PRELOAD "$P" $args; echo "rc=$?"
  echo "== shim $args"; timeout 120 "${SHIM_ENV[@]}" MPSSHIM_LOG_LEVEL=info "$P" $args; echo "rc=$?"
done
echo "== shim, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=64M"
timeout 120 "${SHIM_ENV[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=64M "$P" 100000; echo "rc=$?"
echo "== four clients at once"
pids=()
for i in 1 2 3 4; do timeout 120 "${SHIM_ENV[@]}" "$P" $((20000 * i)) >"$OUT/c$i.out" 2>&1 & pids+=($!); done
wait "${pids[@]}"
cat "$OUT"/c*.out
"$CTL" --runtime-dir "$RT" quit >/dev/null 2>&1
sleep 2
kill "$DPID" 2>/dev/null
echo "== daemon log"; tail -40 "$OUT/daemon.log"
