#!/usr/bin/env bash
# Eight bench/bandwidth processes (64 MiB copies) started together, natively, under mpsshim with
# the default copy helper threads, and with MPSSHIM_COPY_THREADS=1; per mode, each process's sync
# figures and their sum. Do many clients copying at once lose to the helpers' extra threads? On
# the GPU machine, with a tools/gpu_pack.sh tree:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/concurrent_copies.sh .carry/gpu [ROUNDS]
#
# The processes' copies do not overlap evenly, so a sum says how much moved while they all ran,
# not a steady rate.
set -uo pipefail
build=$(realpath "$1")
rounds=${2:-2}
out=$(mktemp -d /tmp/concurrent-copies.XXXXXX)
rt=$out/rt
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"
for round in $(seq "$rounds"); do
  for mode in native shim one; do
    if [ "$mode" != native ]; then start_daemon || continue; fi
    pids=()
    for i in $(seq 8); do
      if [ "$mode" = native ]; then
        "$build/bench/bandwidth" --quick --sizes 64M >"$out/$mode.$i.txt" 2>&1 &
      else
        threads=()
        [ "$mode" = one ] && threads=(MPSSHIM_COPY_THREADS=1)
        env "${threads[@]+"${threads[@]}"}" LD_PRELOAD="$build/libshim/libmpsshim.so" \
          CUDA_MPS_PIPE_DIRECTORY="$rt" "$build/bench/bandwidth" --quick --sizes 64M \
          >"$out/$mode.$i.txt" 2>&1 &
      fi
      pids+=($!)
    done
    wait "${pids[@]}"
    [ "$mode" != native ] && stop_daemon
    for figure in h2d_pageable_sync d2h_pageable_sync h2d_pinned_sync d2h_pinned_sync; do
      values=$(grep -h "^bandwidth,$figure," "$out/$mode".*.txt | cut -d, -f4 | tr '\n' ' ')
      sum=$(echo "$values" | tr ' ' '\n' | awk '{s += $1} END {printf "%.1f", s}')
      echo "round $round $mode $figure sum=$sum each: $values"
    done
  done
done
