#!/usr/bin/env bash
# Where a launch + synchronize round trip spends its time, natively and under mpsshim, alone and
# beside busy clients: bench/kernel_latency --stamps splits each trip into launch call -> kernel
# start, the kernel's run, and kernel end -> the synchronize's return (GPU %globaltimer against
# CLOCK_REALTIME, whose offset moves between runs: each part is given as its p50 over the run's
# fastest trip). Rounds are interleaved; each shim mode gets a fresh daemon per round.
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/latency_split.sh .carry/gpu OUT ROUNDS \
#       "native:" "shim:" "noreserve:--priority-reserve-sms 0" ...
#
# A mode is LABEL:ARGS as in bench_ab.sh (daemon arguments; NAME=VALUE words go to the
# clients' environment, low.NAME=VALUE to the busy clients' only; "native" runs without the
# shim). Each round runs, per mode, the probe
# client alone and then beside BUSY (4) low-priority clients of the priority workload (2 ms
# kernels on 528 blocks, CUDA_MPS_CLIENT_PRIORITY=1; the probe client has priority 0).
# PROBE_ARGS (default: the priority workload's latency client, 10 us on 2 blocks) sets the
# probe client's kernel; SPLIT_GROUPS (default "alone shared") which groups run, e.g. "alone"
# with PROBE_ARGS="--ns 0 --blocks 1" for the bare round trip. OUT/results.csv:
# round,mode,group,figure,value; OUT/summary.txt: medians; OUT/tail.txt: the trips over SLOW_US
# (default 100) us and which part of them was slow (tools/probes/stamp_tail.py). ANSWER_TRACE=1 also has the servers
# stamp their answers and the probe client trace them (MPSSHIM_SERVER_STAMP_ANSWERS,
# MPSSHIM_TRACE_ANSWERS): OUT/LABEL.GROUP.ROUND.txt.answers.csv, split into the server's hops by
# tools/probes/answer_trace.py at the end (OUT/answers.txt).
set -uo pipefail
build=$(realpath "$1")
out=$2
rounds=$3
shift 3
modes=("$@")
busy=${BUSY:-4}
read -r -a split_groups <<<"${SPLIT_GROUPS:-alone shared}"
probe_args=${PROBE_ARGS:---ns 10000 --blocks 2 --threads 32}
low_args="--ns 2000000 --blocks 528 --threads 256 --batch 8"
slow_us=${SLOW_US:-100}
mkdir -p "$out"
[ "${ANSWER_TRACE:-0}" = 1 ] && export MPSSHIM_SERVER_STAMP_ANSWERS=1  # the daemons' servers
csv=$out/results.csv
echo "round,mode,group,figure,value" >"$csv"
rt=$out/rt
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"

# run_group LABEL GROUP LOG: the probe client (and, for "shared", the busy ones) with the
# environment in client_env / under the shim unless LABEL is native.
run_group() {
  local label=$1 group=$2 log=$3 pre=()
  [ "$label" = native ] || pre=(env "${client_env[@]+"${client_env[@]}"}" LD_PRELOAD="$build/libshim/libmpsshim.so" CUDA_MPS_PIPE_DIRECTORY="$rt")
  local lows=()
  if [ "$group" = shared ]; then
    for i in $(seq "$busy"); do
      # shellcheck disable=SC2086 # low_args is a list
      "${pre[@]}" env "${low_env[@]+"${low_env[@]}"}" CUDA_MPS_CLIENT_PRIORITY=1 timeout 60 "$build/bench/kernel_latency" $low_args \
        --duration-ms 5000 >"$log.low$i" 2>&1 &
      lows+=($!)
    done
    sleep 1.5  # the busy clients are running before the probe starts
  fi
  local trace=()
  [ "${ANSWER_TRACE:-0}" = 1 ] && [ "$label" != native ] && trace=(MPSSHIM_TRACE_ANSWERS="$log.answers.csv")
  # shellcheck disable=SC2086 # probe_args is a list
  "${pre[@]}" env "${trace[@]+"${trace[@]}"}" CUDA_MPS_CLIENT_PRIORITY=0 timeout 60 "$build/bench/kernel_latency" $probe_args \
    --stamps --stamps-csv "$log.stamps.csv" --duration-ms 2500 >"$log" 2>&1
  for pid in "${lows[@]+"${lows[@]}"}"; do wait "$pid"; done
}

for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    parse_mode "$mode"
    for group in "${split_groups[@]}"; do
      log=$out/$label.$group.$round.txt
      if [ "$label" != native ]; then start_daemon "${daemon_args[@]+"${daemon_args[@]}"}" || continue; fi
      run_group "$label" "$group" "$log"
      [ "$label" = native ] || stop_daemon
      # The result line: key=value fields.
      tr ' ' '\n' <"$log" | awk -F= -v r="$round" -v m="$label" -v g="$group" '
        $1 ~ /^(p50_us|p99_us|stamp_[a-z]+_p50_over_min_us|stamp_run_p50_us)$/ { print r "," m "," g "," $1 "," $2; found = 1 }
        END { if (!found) print r "," m "," g ",no_result,nan" }' >>"$csv"
    done
  done
done

python3 - "$csv" >"$out/summary.txt" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["value"] != "nan"]
keys = list(dict.fromkeys((r["mode"], r["group"]) for r in rows))
figures = list(dict.fromkeys(r["figure"] for r in rows))
print("mode/group " + " ".join(figures))
for mode, group in keys:
    cells = []
    for f in figures:
        v = [float(r["value"]) for r in rows if (r["mode"], r["group"], r["figure"]) == (mode, group, f)]
        cells.append(f"{statistics.median(v):.2f}" if v else "-")
    print(f"{mode}/{group} " + " ".join(cells))
PY
cat "$out/summary.txt"
python3 "$(dirname "$0")/stamp_tail.py" --slow-us "$slow_us" "$out"/*.stamps.csv >"$out/tail.txt" 2>&1
if [ "${ANSWER_TRACE:-0}" = 1 ]; then
  python3 "$(dirname "$0")/answer_trace.py" --slow-us "$slow_us" "$out"/*.answers.csv >"$out/answers.txt" 2>&1
  cat "$out/answers.txt"
fi
