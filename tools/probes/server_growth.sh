#!/usr/bin/env bash
# Which client programs make the server grow, and in which mappings? Starts a private mpsshimd,
# keeps one client connected (so the context and the green-context pool stay up), runs each
# example 60 times one after another and a small PyTorch model 20 times (when torch imports),
# and after each group prints the server's RSS, the GPU's memory in use, its fds and mappings,
# and its resident memory per mapping (anonymous, [heap], /dev/nvidiactl, memfd, ...).
#
# usage (GPU machine): bash tools/probes/server_growth.sh BUILD_DIR [mpsshimd args...]
#   STEPS (environment; default all but the ResNet ones): any of examples torch torch-killed
#   torch-concurrent resnet resnet-concurrent
#     examples          60 sequential runs of each example
#     torch             20 sequential PyTorch MLP clients
#     torch-killed      20 PyTorch MLP clients SIGKILLed 1-3 s in (while they load libraries)
#     torch-concurrent  64 PyTorch MLP clients, 8 at a time
#     resnet            10 sequential bench/resnet_client.py runs (cuDNN convolutions), twice
#     resnet-concurrent 32 resnet_client.py runs, 8 at a time, twice
#     resnet-slots      the soak's PyTorch part alone: 8 slots each running resnet_client.py
#                       one run after another (so ~8 are attached throughout, as in the soak),
#                       KILL_PERCENT (10) of the runs SIGKILLed 0.2-3.2 s in, for SLOTS_S (240)
#                       seconds, a sample every 30 s with the runs so far: does the server
#                       grow with the PyTorch clients' turnover at a constant population?
# Each sample also sizes the anonymous mappings (count, and RSS by mapping size).
# Findings (H100, driver 580.159.04, 2026-11-25): docs/benchmarks.md, "Where the soak's memory goes".
set -euo pipefail
build=$(cd "${1:?usage: server_growth.sh BUILD_DIR [mpsshimd args...]}" && pwd)
shift
rt=$(mktemp -d /tmp/server-growth.XXXXXX)
log=$rt/mpsshimd.log
"$build/broker/daemon/mpsshimd" --runtime-dir "$rt/run" --server "$build/broker/server/mpsshim-server" \
  "$@" >"$log" 2>&1 &
daemon=$!
trap 'kill "$holder" 2>/dev/null || true; "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt/run" quit >/dev/null 2>&1 || kill "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt/run" server_list 2>/dev/null | grep -q running && break
  sleep 0.1
done

sample() {
  local pid
  pid=$(pgrep -x mpsshim-server | head -n1)
  echo "$1: rss_kib=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")" \
    "gpu_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n1)" \
    "fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 | wc -l) maps=$(wc -l <"/proc/$pid/maps")"
  awk '/^[0-9a-f]+-[0-9a-f]+ /{name=$6; if (name=="") name="[anon]"; sub(/ \(deleted\)/,"",name)
         if (name ~ /^\/memfd:/) name="memfd"; if (name ~ /^\/dev\/shm/) name="shm"}
       /^Rss:/{r[name]+=$2}
       END{for (n in r) if (r[n] > 4096) printf "    %-48s %9d KiB\n", n, r[n]}' "/proc/$pid/smaps" |
    sort -k2 -n -r | head -n 8
  python3 - "/proc/$pid/smaps" <<'PY'
import re, sys
count, rss, size, anon = 0, {}, 0, False
for line in open(sys.argv[1]):
    m = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+ *(\S*)", line)
    if m:
        size = (int(m.group(2), 16) - int(m.group(1), 16)) >> 10
        anon = m.group(3) == ""
        count += anon
    elif anon and line.startswith("Rss:"):
        c = "<1M" if size < 1024 else "1-16M" if size < 16384 else "16-64M" if size < 65536 else ">=64M"
        rss[c] = rss.get(c, 0) + int(line.split()[1])
print(f"    anonymous mappings: {count}; RSS KiB by mapping size: " +
      " ".join(f"{k}={v}" for k, v in sorted(rss.items())))
PY
}
run() { CUDA_MPS_PIPE_DIRECTORY=$rt/run LD_PRELOAD=$build/libshim/libmpsshim.so "$@"; }
# 32 runs of a client command under the shim, 8 at a time.
thirty_two_by_eight() {
  local pids
  for _ in $(seq 4); do
    pids=()
    for _ in $(seq 8); do
      run "$@" >/dev/null 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" || true
  done
}

run "$build/examples/small_kernels" --kernels 100000000 >/dev/null 2>&1 &
holder=$!
sleep 2
sample "one client connected"
steps=" ${STEPS:-examples torch torch-killed torch-concurrent} "
wants() { [[ $steps == *" $1 "* ]]; }
if wants examples; then
  for program in vector_add small_kernels streams_events pinned_async matmul_tiled; do
    for _ in $(seq 60); do run "$build/examples/$program" >/dev/null 2>&1 || true; done
    sample "after 60 x $program"
  done
fi
if python3 -c 'import torch' 2>/dev/null; then
  cat >"$rt/mlp.py" <<'PY'
import torch
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
x = torch.randn(32, 256, device="cuda")
for _ in range(20):
    y = m(x)
torch.cuda.synchronize()
print(float(y.sum()))
PY
  if wants torch; then
    for round in 1 2; do
      for _ in $(seq 10); do run python3 "$rt/mlp.py" >/dev/null 2>&1 || true; done
      sample "after $((round * 10)) x a PyTorch MLP"
    done
  fi
  if wants torch-killed; then
    for round in 1 2; do
      for _ in $(seq 10); do
        run python3 "$rt/mlp.py" >/dev/null 2>&1 &
        victim=$!
        sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 1 + (r % 200) / 100 }')"
        kill -9 "$victim" 2>/dev/null || true
        wait "$victim" 2>/dev/null || true
      done
      sleep 2  # what a victim held is freed once its queued work drained
      sample "after $((round * 10)) x a PyTorch MLP SIGKILLed 1-3 s in"
    done
  fi
  resnet=$(dirname "$0")/../../bench/resnet_client.py
  if wants resnet; then
    for round in 1 2; do
      for _ in $(seq 10); do run python3 "$resnet" --no-wait --iters 50 --warmup 5 >/dev/null 2>&1 || true; done
      sample "after $((round * 10)) x ResNet-50 (resnet_client.py), one at a time"
    done
  fi
  if wants resnet-concurrent; then
    for round in 1 2; do
      thirty_two_by_eight python3 "$resnet" --no-wait --iters 50 --warmup 5
      sample "after $((round * 32)) x ResNet-50, 8 at a time"
    done
  fi
  if wants resnet-slots; then
    : >"$rt/slot-runs"
    resnet_slot() {  # runs until $rt/stop exists; one line per run in $rt/slot-runs
      local victim limit
      while [ ! -e "$rt/stop" ]; do
        limit=600
        if [ $((RANDOM % 100)) -lt "${KILL_PERCENT:-10}" ]; then
          limit=$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.2 + 3 * r / 32768 }')
        fi
        if timeout -s KILL "$limit" env CUDA_MPS_PIPE_DIRECTORY="$rt/run" \
          LD_PRELOAD="$build/libshim/libmpsshim.so" python3 "$resnet" --no-wait --iters 50 \
          --warmup 5 >/dev/null 2>&1; then
          echo pass >>"$rt/slot-runs"
        else
          echo "ended $?" >>"$rt/slot-runs"
        fi
      done
    }
    slot_pids=()
    for _ in $(seq 8); do
      resnet_slot &
      slot_pids+=($!)
    done
    for t in $(seq 30 30 "${SLOTS_S:-240}"); do
      sleep 30
      sample "ResNet-50 slots, ${t} s: $(grep -c pass "$rt/slot-runs") runs passed, $(grep -c ended "$rt/slot-runs") ended otherwise"
    done
    touch "$rt/stop"
    wait "${slot_pids[@]}" || true
    sleep 2
    sample "ResNet-50 slots ended"
  fi
  if wants torch-concurrent; then
    for round in 1 2; do
      thirty_two_by_eight python3 "$rt/mlp.py"
      sample "after $((round * 32)) x a PyTorch MLP, 8 at a time"
    done
  fi
fi
grep -h "green context\|gave .* back" "$log" | tail -n 3 || true
