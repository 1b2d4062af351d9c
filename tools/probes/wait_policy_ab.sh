#!/usr/bin/env bash
# How the client's wait policy (libshim/wait_policy.hpp) moves the figures that end in a wait:
# pinned sync copies, 8 concurrent small_kernels clients (a synchronize every 64 kernels),
# PyTorch ResNet-50 b1 (a synchronize per iteration) and the launch + synchronize round trip.
# Rounds interleave the modes so drift hits each alike:
#   native     the real driver
#   sleep      mpsshim, MPSSHIM_WAIT_SPIN_US=0: 60 us of spin, then a futex sleep (the old way)
#   spin       mpsshim, the default plan (spin, then yield, for up to 20 ms)
#   spin-w1    the default plan with one server worker (--server-workers 1), ResNet only
# Each shim mode gets a fresh daemon. On the GPU machine, with a tools/gpu_pack.sh tree:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/wait_policy_ab.sh .carry/gpu 3 OUT
#
# OUT/results.csv: round,mode,figure,value; OUT/summary.txt: the median per mode and figure.
set -uo pipefail
build=$(realpath "$1")
rounds=${2:-3}
out=${3:-/tmp/wait_ab}
python=${PYTHON:-python3}
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
csv="$out/results.csv"
echo "round,mode,figure,value" >"$csv"
rt="$out/rt"
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"

field() {  # NAME LINE: the value of NAME=... in a result line
  sed -n "s/.*[ :]$1=\([^ ]*\).*/\1/p" <<<"$2" | head -1
}

record() { echo "$1,$2,$3,$4" >>"$csv"; }

run_mode() {  # ROUND MODE: runs every figure with the environment of MODE exported
  local round=$1 mode=$2 line
  # Pinned sync copies: the figures expected at >= 0.97x native.
  line=$(timeout 120 "$build/bench/bandwidth" --sizes 16M,256M --repeats 5 2>&1)
  echo "$line" >"$out/bandwidth.$mode.$round.txt"
  # Rows "#     16 MiB  h2d_pinned_sync h2d_pageable_sync d2h_pinned_sync ...".
  while read -r size h2dp d2hp; do
    record "$round" "$mode" "h2d_pinned_${size}M" "$h2dp"
    record "$round" "$mode" "d2h_pinned_${size}M" "$d2hp"
  done < <(awk '$1 == "#" && $3 == "MiB" && ($2 == 16 || $2 == 256) {print $2, $4, $6}' <<<"$line")
  # Launch + synchronize round trips.
  line=$(timeout 120 "$build/bench/launch_latency" --quick --trips 5000 2>&1 | grep -E '^launch_latency' | tail -1)
  record "$round" "$mode" launch_stream_sync_us "$(field launch_stream_sync_us "$line")"
  # 8 concurrent small_kernels clients, started together; aggregate kernels/s over the span.
  local go=$(( $(date +%s%N) + 2500000000 )) i
  for i in $(seq 8); do
    timeout 120 "$build/examples/small_kernels" --start-at-ns "$go" >"$out/small.$mode.$round.$i.txt" 2>&1 &
  done
  wait
  local agg
  agg=$(cat "$out"/small."$mode"."$round".*.txt | "$python" -c '
import re, sys
starts, ends, n = [], [], 0
for line in sys.stdin:
    s = re.search(r"start_ns=(\d+)", line); e = re.search(r"end_ns=(\d+)", line); k = re.search(r"kernels=(\d+)", line)
    if s and e and k and "PASS" in line:
        starts.append(int(s.group(1))); ends.append(int(e.group(1))); n += int(k.group(1))
print(f"{n / ((max(ends) - min(starts)) / 1e9):.0f}" if len(starts) == 8 else "nan")')
  record "$round" "$mode" small_kernels_x8_per_s "$agg"
  resnet "$round" "$mode"
}

resnet() {  # ROUND MODE
  local line
  line=$(timeout 180 "$python" "$src/bench/resnet_client.py" --no-wait --iters 200 --warmup 20 2>>"$out/resnet.$2.$1.err" | tail -1)
  echo "$line" >"$out/resnet.$2.$1.txt"
  local ms
  ms=$(field ms_per_iter "$line")
  record "$1" "$2" resnet_iters_per_s "$("$python" -c "print(f'{1000/$ms:.1f}' if '$ms' else 'nan')")"
}

for round in $(seq "$rounds"); do
  for mode in native sleep spin spin-w1; do
    case $mode in
      native) (run_mode "$round" native) ;;
      sleep | spin)
        start_daemon || continue
        if [ $mode = sleep ]; then export MPSSHIM_WAIT_SPIN_US=0; else unset MPSSHIM_WAIT_SPIN_US; fi
        (CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" run_mode "$round" $mode)
        unset MPSSHIM_WAIT_SPIN_US
        stop_daemon ;;
      spin-w1)
        start_daemon --server-workers 1 || continue
        (CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" resnet "$round" $mode)
        stop_daemon ;;
    esac
  done
done

"$python" - "$csv" >"$out/summary.txt" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
modes = ["native", "sleep", "spin", "spin-w1"]
figures = sorted({r["figure"] for r in rows})
print(f"{'figure':28}" + "".join(f"{m:>22}" for m in modes))
for f in figures:
    cells = []
    for m in modes:
        v = [float(r["value"]) for r in rows if r["figure"] == f and r["mode"] == m and r["value"] not in ("", "nan")]
        cells.append(f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g})" if v else "-")
    print(f"{f:28}" + "".join(f"{c:>22}" for c in cells))
EOF
cat "$out/summary.txt"
