#!/usr/bin/env bash
# One PyTorch ResNet-50 client (bench/resnet_client.py, batch 1) at a time, natively and under
# one mpsshimd with several client environments, rounds interleaved so that drift hits each mode
# alike. One daemon serves every shim mode and keeps its primary context for its life
# (--context-idle-timeout -1), so the shared library images the first client loaded stay for the
# later ones (--image-idle-timeout): only round 1's first shim mode starts cold. (Without it the
# context went during each native run, and the first shim mode of every round started cold:
# 21 s against 8 s, 2026-11-28.) On the GPU machine, with a tools/gpu_pack.sh tree:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/resnet_ab.sh .carry/gpu OUT ROUNDS ITERS \
#       "native:" "shim:" "unbatched:MPSSHIM_LAUNCH_BATCHING=off"
#
# A mode is LABEL:ENV, the words NAME=VALUE set in the client's environment; the label "native"
# runs without the shim. OUT/results.csv: round,mode,init_s,ms_per_iter; OUT/summary.txt: the
# median and range per mode.
set -uo pipefail
build=$(realpath "$1")
out=$2
rounds=$3
iters=$4
shift 4
modes=("$@")
rt="$out/rt"
mkdir -p "$out"
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "${BASH_SOURCE[0]}")/probe_daemon.sh"
client_py="$(dirname "${BASH_SOURCE[0]}")/../../bench/resnet_client.py"

start_daemon --context-idle-timeout -1 --image-idle-timeout 600 || exit 1
csv=$out/results.csv
echo "round,mode,init_s,ms_per_iter" >"$csv"
for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    label=${mode%%:*}
    read -r -a client_env <<<"${mode#*:}"
    log=$out/$label.$round.txt
    if [ "$label" = native ]; then
      timeout 240 "${PYTHON:-python3}" "$client_py" --iters "$iters" --no-wait >"$log" 2>&1
    else
      env "${client_env[@]+"${client_env[@]}"}" CUDA_MPS_PIPE_DIRECTORY="$rt" \
        LD_PRELOAD="$build/libshim/libmpsshim.so" \
        timeout 240 "${PYTHON:-python3}" "$client_py" --iters "$iters" --no-wait >"$log" 2>&1
    fi
    line=$(grep -E "^resnet_client: .*PASS$" "$log")
    init=$(grep -o "init_s=[0-9.]*" "$log" | head -1 | cut -d= -f2)
    ms=$(grep -o "ms_per_iter=[0-9.]*" <<<"$line" | cut -d= -f2)
    echo "$round,$label,${init:-nan},${ms:-nan}" >>"$csv"
  done
done
stop_daemon

python3 - "$csv" >"$out/summary.txt" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
modes = list(dict.fromkeys(r["mode"] for r in rows))
def values(mode, key):
    return [float(r[key]) for r in rows if r["mode"] == mode and r[key] != "nan"]
native = values("native", "ms_per_iter")
base = statistics.median(native) if native else None
for mode in modes:
    ms, init = values(mode, "ms_per_iter"), values(mode, "init_s")
    if not ms:
        print(f"{mode:12} no result")
        continue
    med = statistics.median(ms)
    ratio = f"  {med / base:.3f}x native" if base else ""
    print(f"{mode:12} ms per inference median {med:.3f} range {min(ms):.3f}-{max(ms):.3f}"
          f"{ratio}; start median {statistics.median(init):.1f} s")
PY
cat "$out/summary.txt"
