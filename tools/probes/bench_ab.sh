#!/usr/bin/env bash
# One bench program (bench/launch_latency by default) natively and under mpsshim with several
# daemon settings or client environments, rounds interleaved so that drift hits each mode alike.
# The spread between runs is of the same order as the gaps this is for (the round trip within
# 1.05x native, copies within 0.95x), so compare modes only within one call. On the GPU machine,
# with a tools/gpu_pack.sh tree:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/bench_ab.sh .carry/gpu OUT ROUNDS \
#       "native:" "shim:" "nofence:--host-fences off" ...
#   BENCH=bandwidth BENCH_ARGS="--quick --sizes 4M,16M,256M" FIGURES=pageable \
#       bash tools/probes/bench_ab.sh .carry/gpu OUT 3 "native:" "shim:" "one:MPSSHIM_COPY_THREADS=1"
#
# A mode is LABEL:ARGS, as in small_kernels_ab.sh: daemon arguments, except that words of the
# form NAME=VALUE are set in the client's environment (e.g. "sleep:MPSSHIM_WAIT_SPIN_US=0");
# the label "native" runs without the shim. Each shim mode gets a fresh daemon per round.
# A figure is a CSV line of the program (benchmark,metric,size_bytes,value,unit), named
# METRIC or METRIC@SIZE; FIGURES (an extended regular expression) keeps those it matches.
# OUT/results.csv: round,mode,figure,value; OUT/summary.txt: the median and range per mode and
# figure.
set -uo pipefail
build=$(realpath "$1")
out=$2
rounds=$3
shift 3
modes=("$@")
bench=${BENCH:-launch_latency}
if [ "$bench" = launch_latency ]; then
  args=${BENCH_ARGS:---quick --trips 5000}
  figures=${FIGURES:-^(launch_async_cpu|launch_stream_sync|launch_ctx_sync|ctx_sync_idle)$}
else
  args=${BENCH_ARGS:---quick}
  figures=${FIGURES:-.}
fi
mkdir -p "$out"
csv=$out/results.csv
echo "round,mode,figure,value" >"$csv"
rt=$out/rt
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"

for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    parse_mode "$mode"
    log=$out/$bench.$label.$round.txt
    if [ "$label" = native ]; then
      # shellcheck disable=SC2086 # args is a list
      timeout 300 "$build/bench/$bench" $args >"$log" 2>&1
    else
      start_daemon "${daemon_args[@]+"${daemon_args[@]}"}" || continue
      # shellcheck disable=SC2086 # args is a list
      env "${client_env[@]+"${client_env[@]}"}" LD_PRELOAD="$build/libshim/libmpsshim.so" \
        CUDA_MPS_PIPE_DIRECTORY="$rt" timeout 300 "$build/bench/$bench" $args >"$log" 2>&1
      stop_daemon
    fi
    # The program's CSV lines: benchmark,metric,size_bytes,value,unit.
    awk -F, -v bench="$bench" -v round="$round" -v label="$label" -v keep="$figures" '
      $1 == bench && NF == 5 && $4 ~ /^[0-9.]+$/ {
        figure = $3 == 0 ? $2 : $2 "@" $3
        if (figure ~ keep) { print round "," label "," figure "," $4; found = 1 }
      }
      END { if (!found) print round "," label ",no_result,nan" }' "$log" >>"$csv"
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
