#!/usr/bin/env bash
# Aggregate kernels/s of N concurrent examples/small_kernels clients (the harness's concurrency
# workload, without its other sizes) under NVIDIA MPS and under mpsshim with several daemon
# settings, in interleaved rounds, so that one lease compares a server setting with MPS:
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/small_kernels_ab.sh .carry/gpu OUT \
#     ROUNDS "8 32" "default:" "poll5:--event-poll-us 5" ...
#
# Each LABEL:ARGS is one mpsshim mode (a fresh daemon with ARGS per group; words of the form
# NAME=VALUE are set in the clients' environment instead, e.g. "sleep:MPSSHIM_WAIT_SPIN_US=0");
# "mps" is always run
# (as root, nvidia-cuda-mps-control on PATH or in /usr/local/nvidia/bin); the label "native"
# runs the clients on the driver itself (time-slicing). OUT/results.csv:
# round,mode,clients,kernels_per_s; OUT/summary.txt: medians (min-max) and the ratio to MPS.
# SK_ARGS (environment) adds arguments to every small_kernels, e.g. SK_ARGS=--gaps: the summary
# then also gives, per mode and size, the clients' median idle time between kernels (gap_us),
# across a synchronization (sync_gap_us), by position in the run of 64 and before each of its
# first 16 kernels. OUT/lines.txt keeps
# every client's result line.
set -uo pipefail
build=$(realpath "$1")
out=$2
rounds=$3
sizes=$4
shift 4
python=${PYTHON:-python3}
mkdir -p "$out"
csv="$out/results.csv"
echo "round,mode,clients,kernels_per_s" >"$csv"
rt="$out/rt"
export PATH="$PATH:/usr/local/nvidia/bin"
# shellcheck source=tools/probes/probe_daemon.sh
source "$(dirname "$0")/probe_daemon.sh"  # parse_mode

group() {  # ROUND MODE N: N clients started together in the current environment
  local go=$(( $(date +%s%N) + 1500000000 + $3 * 100000000 )) i
  rm -f "$out"/group.*.txt
  for i in $(seq "$3"); do
    # shellcheck disable=SC2086 # SK_ARGS is a list of arguments
    timeout 120 "$build/examples/small_kernels" --start-at-ns "$go" ${SK_ARGS:-} >"$out/group.$i.txt" 2>&1 &
  done
  wait
  sed "s/^/$1,$2,$3: /" "$out"/group.*.txt >>"$out/lines.txt"
  local rate
  rate=$(cat "$out"/group.*.txt | "$python" -c '
import re, sys
starts, ends, n, ok = [], [], 0, 0
for line in sys.stdin:
    s = re.search(r"start_ns=(\d+)", line); e = re.search(r"end_ns=(\d+)", line); k = re.search(r"kernels=(\d+)", line)
    if s and e and k and "PASS" in line:
        starts.append(int(s.group(1))); ends.append(int(e.group(1))); n += int(k.group(1)); ok += 1
print(f"{n / ((max(ends) - min(starts)) / 1e9):.0f}" if ok == int(sys.argv[1]) else "nan")' "$3")
  echo "$1,$2,$3,$rate" >>"$csv"
}

for round in $(seq "$rounds"); do
  for n in $sizes; do
    # NVIDIA MPS
    mkdir -p "$out/mps-pipe" "$out/mps-log"
    export CUDA_MPS_PIPE_DIRECTORY="$out/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps-log"
    nvidia-cuda-mps-control -d && sleep 0.5
    group "$round" mps "$n"
    echo quit | nvidia-cuda-mps-control
    sleep 0.5
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    for spec in "$@"; do
      label=${spec%%:*}
      if [ "$label" = native ]; then
        group "$round" native "$n"
        continue
      fi
      parse_mode "$spec"
      rm -rf "$rt"
      "$build/broker/daemon/mpsshimd" --runtime-dir "$rt" \
        --server "$build/broker/server/mpsshim-server" "${daemon_args[@]+"${daemon_args[@]}"}" \
        >>"$out/mpsshimd.$label.log" 2>&1 &
      daemon=$!
      for _ in $(seq 200); do
        "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" server_list 2>/dev/null | grep -q running && break
        sleep 0.05
      done
      (export CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" \
         "${client_env[@]+"${client_env[@]}"}"; group "$round" "$label" "$n")
      "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" quit >/dev/null 2>&1 || kill "$daemon"
      wait "$daemon" 2>/dev/null
    done
  done
done

"$python" - "$csv" >"$out/summary.txt" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
modes = list(dict.fromkeys(r["mode"] for r in rows))
for n in dict.fromkeys(r["clients"] for r in rows):
    med = {}
    for m in modes:
        v = [float(r["kernels_per_s"]) for r in rows if r["mode"] == m and r["clients"] == n and r["kernels_per_s"] != "nan"]
        if v:
            med[m] = statistics.median(v)
            ratio = f" {med[m] / med['mps']:.2f}x MPS" if "mps" in med else ""
            print(f"N={n:>3} {m:>12}: {med[m]:>10,.0f} ({min(v):,.0f}-{max(v):,.0f}){ratio}")
EOF
if [ -s "$out/lines.txt" ] && grep -q "gap_us=" "$out/lines.txt"; then
  "$python" - "$out/lines.txt" >>"$out/summary.txt" <<'EOF'
import re, statistics, sys
groups = {}
for line in open(sys.argv[1]):
    head, _, rest = line.partition(": ")
    if "gap_us=" not in rest:
        continue
    _, mode, n = head.split(",")
    fields = dict(re.findall(r"(\w+)=(\S+)", rest))
    groups.setdefault((int(n), mode), []).append(fields)
print("median over all clients of all rounds (us): run, gap inside a run (p50, p99), across a sync, by position")
for (n, mode), rows in sorted(groups.items()):
    med = lambda k: statistics.median(float(r[k]) for r in rows)
    positions = [statistics.median(float(r["gap_by_position_us"].split("/")[b]) for r in rows)
                 for b in range(len(rows[0]["gap_by_position_us"].split("/")))]
    print(f"N={n:>3} {mode:>12}: run {med('run_us'):6.2f} gap {med('gap_us'):6.2f}"
          f" ({med('gap_p50_us'):.2f}, {med('gap_p99_us'):.2f}) sync {med('sync_gap_us'):7.2f}"
          f"  by position {'/'.join(f'{p:.2f}' for p in positions)}")
    if "gap_head_us" in rows[0]:
        head = [statistics.median(float(r["gap_head_us"].split("/")[b]) for r in rows)
                for b in range(len(rows[0]["gap_head_us"].split("/")))]
        print(f"{'':>18} before kernels 1-16: {'/'.join(f'{p:.2f}' for p in head)}")
EOF
fi
cat "$out/summary.txt"
