#!/bin/bash
# Where the broker's CPU goes: runs N x examples/small_kernels (K kernels each) under mpsshim and
# prints the CPU time of each kind of thread of the GPU's server (by thread name, /proc/PID/task)
# and of the clients, over the run: the clients' start and end included (the coordinator's CPU
# is mostly their admission), unlike the harness's "while they run".
#   usage: tools/probes/thread_cpu.sh BUILD N K [mpsshimd options...]
# The clients' environment passes through (MPSSHIM_WAIT_PACING, MPSSHIM_EARLY_ANSWERS, ...).
set -euo pipefail
B=$(realpath "$1") N=$2 K=$3
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/gpu/lib.sh"
RT=$(mktemp -d)
trap 'kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; rm -rf "$RT"' EXIT
start_build_daemon "$B" "$RT" "$RT/daemon.log" "$@"
SERVER=$( (pgrep -x -P "$DPID" mpsshim-server || pgrep -x mpsshim-server) | head -n1)
[ -n "$SERVER" ] || { echo "no mpsshim-server under mpsshimd $DPID" >&2; exit 1; }
# CPU ticks by thread name: utime + stime (fields 14 and 15 after the name's parentheses).
ticks() {
  for t in /proc/"$SERVER"/task/*; do
    name=$(cat "$t/comm" 2>/dev/null) || continue
    stat=$(cat "$t/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    set -- $rest
    echo "${t##*/} ${name%%[0-9]*} $((${12} + ${13}))"
  done | sort
}
# By name: threads the driver starts without naming them carry their creator's name.
by_name() { awk '{s[$2] += $3} END {for (k in s) print k, s[k]}' "$1" | sort; }
# A warm-up client, so the primary context and the images are loaded before the measured run.
env LD_PRELOAD="$B/libshim/libmpsshim.so" CUDA_MPS_PIPE_DIRECTORY="$RT" \
  "$B/examples/small_kernels" --kernels 1000 >/dev/null
ticks >"$RT/before"
start=$(date +%s%N)
/usr/bin/time -f "%U %S" -o "$RT/clients" bash -c "
  for i in \$(seq $N); do
    env LD_PRELOAD=$B/libshim/libmpsshim.so CUDA_MPS_PIPE_DIRECTORY=$RT \
      $B/examples/small_kernels --kernels $K >/dev/null &
  done
  wait"
end=$(date +%s%N)
ticks >"$RT/after"
hz=$(getconf CLK_TCK)
wall_ms=$(((end - start) / 1000000))
kernels=$((N * K))
echo "$N clients x $K kernels in $wall_ms ms: $((kernels * 1000 / wall_ms)) kernels/s"
join -a2 -e0 -o 0,1.2,2.2 <(by_name "$RT/before") <(by_name "$RT/after") | awk -v hz="$hz" -v k="$kernels" -v w="$wall_ms" '
  {d = ($3 - $2) / hz; printf "server %-12s %7.3f s  %6.2f cores  %6.3f us/kernel\n", $1, d, d * 1000 / w, d * 1e6 / k}'
echo "the server's busiest threads (tid, name, CPU s):"
join -a2 -e0 -o 0,2.2,1.3,2.3 "$RT/before" "$RT/after" |
  awk -v hz="$hz" '{printf "  %s %s %.3f\n", $1, $2, ($4 - $3) / hz}' | sort -k3 -nr | head -n 5
grep -ho "idle strategy: .*" "$RT/daemon.log" | head -n1 || true
read -r u s <"$RT/clients"
awk -v u="$u" -v s="$s" -v k="$kernels" -v w="$wall_ms" \
  'BEGIN {printf "clients (user %.2f + sys %.2f s)  %6.2f cores  %6.3f us/kernel\n", u, s, (u + s) * 1000 / w, (u + s) * 1e6 / k}'
