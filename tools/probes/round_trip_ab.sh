#!/usr/bin/env bash
# The launch + synchronize round trip (bench/launch_latency) natively and under mpsshim with
# several daemon settings, rounds interleaved so that drift hits each mode alike. Issue #9 and
# #15 ask it within 1.05x native; the spread between runs is of the same order as the gap, so
# compare modes only within one call. On the GPU machine, with a tools/gpu_pack.sh tree:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/round_trip_ab.sh .carry/gpu OUT ROUNDS \
#       "native:" "shim:" "nofence:--host-fences off" ...
#
# A mode is LABEL:ARGS, as in small_kernels_ab.sh: daemon arguments, except that words of the
# form NAME=VALUE are set in the client's environment (e.g. "sleep:MPSSHIM_WAIT_SPIN_US=0");
# the label "native" runs without the shim. Each shim mode gets a fresh daemon per round.
# OUT/results.csv: round,mode,figure,value; OUT/summary.txt: the median and range per mode and
# figure. LATENCY_ARGS overrides launch_latency's arguments.
set -uo pipefail
build=$(realpath "$1")
out=$2
rounds=$3
shift 3
modes=("$@")
args=${LATENCY_ARGS:---quick --trips 5000}
mkdir -p "$out"
csv=$out/results.csv
echo "round,mode,figure,value" >"$csv"
rt=$out/rt
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"

for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    label=${mode%%:*}
    read -r -a words <<<"${mode#*:}"
    daemon_args=()
    client_env=()
    for word in "${words[@]+"${words[@]}"}"; do
      if [[ $word =~ ^[A-Z_][A-Z0-9_]*= ]]; then client_env+=("$word"); else daemon_args+=("$word"); fi
    done
    log=$out/launch_latency.$label.$round.txt
    if [ "$label" = native ]; then
      # shellcheck disable=SC2086 # args is a list
      timeout 120 "$build/bench/launch_latency" $args >"$log" 2>&1
    else
      start_daemon "${daemon_args[@]+"${daemon_args[@]}"}" || continue
      # shellcheck disable=SC2086 # args is a list
      env "${client_env[@]+"${client_env[@]}"}" LD_PRELOAD="$build/libshim/libmpsshim.so" \
        CUDA_MPS_PIPE_DIRECTORY="$rt" timeout 120 "$build/bench/launch_latency" $args >"$log" 2>&1
      stop_daemon
    fi
    # The result line: "launch_latency: PASS launch_cpu_us=... launch_stream_sync_us=...".
    for figure in launch_cpu_us launch_stream_sync_us launch_ctx_sync_us ctx_sync_idle_us; do
      value=$(grep -o "$figure=[0-9.]*" "$log" | tail -1 | cut -d= -f2)
      echo "$round,$label,$figure,${value:-nan}" >>"$csv"
    done
  done
done

python3 - "$csv" >"$out/summary.txt" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
modes = list(dict.fromkeys(r["mode"] for r in rows))
figures = list(dict.fromkeys(r["figure"] for r in rows))
def values(mode, figure):
    return [float(r["value"]) for r in rows
            if r["mode"] == mode and r["figure"] == figure and r["value"] != "nan"]
for figure in figures:
    native = values("native", figure)
    base = statistics.median(native) if native else None
    print(figure)
    for mode in modes:
        v = values(mode, figure)
        if not v:
            print(f"  {mode:12} no result")
            continue
        med = statistics.median(v)
        ratio = f"  {med / base:.3f}x native" if base else ""
        print(f"  {mode:12} median {med:8.3f}  range {min(v):.3f}-{max(v):.3f}{ratio}")
PY
cat "$out/summary.txt"
