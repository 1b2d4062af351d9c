#!/usr/bin/env bash
# What looking a library's kernels up at their first use (libshim/kernel_lookup.hpp) saves a
# PyTorch client's start: N bench/resnet_client.py processes started together (each --iters
# ITERS), natively and under a fresh mpsshimd per shim mode: lazy lookups (the default) and
# MPSSHIM_KERNEL_LOOKUP=eager. Prints per mode the clients' start (init_s: import to the end of
# warm-up) median and longest, their ms per iteration, the server's RSS and its GPU memory once
# the clients ended (the libraries they loaded are still kept then: --image-idle-timeout), and
# each session's records by operation (and with PROFILE=1 the heap growth by operation).
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/kernel_lookup_ab.sh .carry/gpu OUT [N] [ITERS]
set -uo pipefail
build=$(realpath "$1")
out=$2
clients=${3:-1}
iters=${4:-100}
rt="$out/rt"
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/probe_daemon.sh"
client_py="$(dirname "${BASH_SOURCE[0]}")/../../bench/resnet_client.py"

# run_clients MODE [ENV...]: N clients together, under the shim unless MODE is native.
run_clients() {
  local mode=$1
  shift
  local pids=()
  for i in $(seq "$clients"); do
    if [ "$mode" = native ]; then
      timeout 240 "${PYTHON:-python3}" "$client_py" --iters "$iters" --no-wait \
        >"$out/$mode.$i.txt" 2>"$out/$mode.$i.err" &
    else
      env "$@" CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" \
        timeout 240 "${PYTHON:-python3}" "$client_py" --iters "$iters" --no-wait \
        >"$out/$mode.$i.txt" 2>"$out/$mode.$i.err" &
    fi
    pids+=($!)
  done
  wait "${pids[@]}"
}

summary() {  # MODE
  local mode=$1
  cat "$out/$mode".*.txt | "${PYTHON:-python3}" -c '
import re, statistics, sys
rows = [l for l in sys.stdin if l.startswith("resnet_client:")]
ok = [l for l in rows if l.rstrip().endswith("PASS")]
init = sorted(float(re.search(r"init_s=([0-9.]+)", l).group(1)) for l in ok)
ms = [float(re.search(r"ms_per_iter=([0-9.]+)", l).group(1)) for l in ok]
sums = sorted({re.search(r"out_sum=(\S+)", l).group(1) for l in ok})
print(f"{sys.argv[1]}: {len(ok)}/{len(rows)} PASS, init_s median {statistics.median(init):.2f} "
      f"max {max(init):.2f}, ms_per_iter median {statistics.median(ms):.3f}, out_sum {sums}"
      if ok else f"{sys.argv[1]}: no client passed")' "$mode"
}

shim_mode() {  # MODE ENV...
  local mode=$1
  shift
  : >"$out/mpsshimd.log"
  # The heap profile reads glibc's figures around every record: on only when asked (PROFILE=1),
  # as it costs more where there are more records. --log-level debug logs the record counts.
  MPSSHIM_SERVER_HEAP_PROFILE=${PROFILE:-0} start_daemon --log-level debug || return 1
  run_clients "$mode" "$@"
  local server
  server=$(pgrep -x mpsshim-server | head -1)
  summary "$mode"
  echo "$mode: server $(grep VmRSS "/proc/$server/status" | tr -s ' '), GPU memory" \
    "$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep "^$server," |
      cut -d, -f2)"
  stop_daemon
  grep -o "\(heap growth\|records\) by operation: .*" "$out/mpsshimd.log" | sed "s/^/$mode: /"
  cp "$out/mpsshimd.log" "$out/mpsshimd.$mode.log"
}

run_clients native
summary native
shim_mode lazy
shim_mode eager MPSSHIM_KERNEL_LOOKUP=eager
