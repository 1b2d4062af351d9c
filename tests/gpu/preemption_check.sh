#!/usr/bin/env bash
# GPU check and benchmark of --memory-preemption (docs/suspend.md, "Memory policies"). Two idle
# below-normal PyTorch clients (CUDA_MPS_CLIENT_PRIORITY=1) hold VICTIM_GIB each (default 30);
# then a normal-priority client allocates nearly the whole GPU and runs a kernel on it. Its
# allocation must suspend both (checked). Its first kernel's time is compared with the time their
# suspends took plus 50 ms plus what the same allocation and kernel take with the GPU free
# (measured first in the same run): printed as met or missed, a benchmark target, not a failure.
# Its new memory must come cleared (it was the victims'); with a second GPU, GPU 1 must read all
# of it. When it has ended, both must be resumed by themselves, their bytes unchanged.
# usage: preemption_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU or PyTorch)
set -u -o pipefail
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/preemption-check.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
  { echo "SKIP: no PyTorch with CUDA"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # start_build_daemon
CLIENT=$(dirname "${BASH_SOURCE[0]}")/python/suspend_client.py
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/preemption-rt.XXXX)
VICTIM_GIB=${VICTIM_GIB:-30}
TOTAL_GIB=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits |
  awk '{print int($1 / 1024)}')
# Fits only with both victims off the GPU; leaves room for the three processes' contexts.
WANT_GIB=$((TOTAL_GIB - VICTIM_GIB + 6))
# Idle after 0 ms: a victim is idle as soon as no call of it waits; the check needs no sleep.
# MPSSHIMD_ARGS: more mpsshimd options (word-split), e.g. "--park-pool 68719476736".
# shellcheck disable=SC2086
start_build_daemon "$B" "$RT" "$OUT/daemon.log" --memory-preemption on --preemption-idle-ms 0 \
  ${MPSSHIMD_ARGS:-}
ctl() { "$CTL" --runtime-dir "$RT" "$@"; }
fail=0
echo "GPU: $TOTAL_GIB GiB; victims: 2 x $VICTIM_GIB GiB; the normal client wants $WANT_GIB GiB"

# VICTIM_ALLOC_CONF / WANT_ALLOC_CONF: PYTORCH_CUDA_ALLOC_CONF of the victims and of the normal
# client, e.g. "expandable_segments:True" (their memory then comes from cuMemCreate).
# Starts `suspend_client.py ARGS` under the shim as a coprocess named $1 with priority $2 and
# PYTORCH_CUDA_ALLOC_CONF $3; sets ${1}_PID and fds ${1}_OUT / ${1}_IN.
start() {
  local name=$1 env_priority=$2 alloc_conf=$3
  shift 3
  eval "coproc $name { exec env LD_PRELOAD=\"$SHIM\" CUDA_MPS_PIPE_DIRECTORY=\"$RT\" \
    CUDA_MPS_CLIENT_PRIORITY=$env_priority PYTORCH_CUDA_ALLOC_CONF=\"$alloc_conf\" \
    python3 \"$CLIENT\" $* 2>&1; }"
  eval "exec {${name}_OUT}<&\"\${${name}[0]}\" {${name}_IN}>&\"\${${name}[1]}\""
}
# Reads lines of coprocess fd $1 until one starts with $2 (at most $3 s); prints it.
read_until() {
  local fd=$1 prefix=$2 limit=$3 line
  while read -r -t "$limit" line <&"$fd"; do
    [[ "$line" == "$prefix"* ]] && { echo "$line"; return 0; }
  done
  return 1
}

# ---- the same allocation and kernel with the GPU free ------------------------------------------
start FREE 0 "${WANT_ALLOC_CONF:-}" want "$WANT_GIB"
free_line=$(read_until "$FREE_OUT" WANT 300) || { echo "FAIL: the uncontested client"; fail=1; }
echo >&"$FREE_IN"
wait "$FREE_PID" 2>/dev/null
free_s=$(sed -n 's/^WANT seconds=\([0-9.]*\).*/\1/p' <<<"$free_line")
echo "uncontested: $WANT_GIB GiB allocated and filled in ${free_s:-?} s"

# ---- two idle below-normal clients in the way -----------------------------------------------------
start V1 1 "${VICTIM_ALLOC_CONF:-}" hold "$VICTIM_GIB"
v1=$(read_until "$V1_OUT" READY 300 | sed -n 's/^READY pid=//p')
start V2 1 "${VICTIM_ALLOC_CONF:-}" hold "$VICTIM_GIB"
v2=$(read_until "$V2_OUT" READY 300 | sed -n 's/^READY pid=//p')
[ -n "$v1" ] && [ -n "$v2" ] || { echo "FAIL: the below-normal clients did not start"; exit 1; }

start WANTER 0 "${WANT_ALLOC_CONF:-}" want "$WANT_GIB"
want_line=$(read_until "$WANTER_OUT" WANT 600) || { echo "FAIL: the normal client got no memory"; fail=1; }
want_s=$(sed -n 's/^WANT seconds=\([0-9.]*\).*/\1/p' <<<"$want_line")
# Its memory was the victims' (handed over, device_heap.hpp): none of their bytes may show.
if [[ "$want_line" == *" largest_byte=0" ]]; then
  echo "PASS: the normal client's new memory came cleared"
else
  echo "FAIL: the normal client's new memory held other bytes: $want_line"
  fail=1
fi
grep -a "taken from preempted clients" "$OUT/daemon.log" | tail -1
# With a second GPU, the client copies it all there (suspend_client.py).
if [ "$(nvidia-smi -L | grep -c GPU)" -gt 1 ]; then
  peer_line=$(read_until "$WANTER_OUT" PEER 300)
  if [ "$peer_line" = "PEER min=7 max=7" ]; then
    echo "PASS: GPU 1 read all of it"
  else
    echo "FAIL: GPU 1's copy: ${peer_line:-none}"
    fail=1
  fi
fi
ctl ps --json >"$OUT/ps-preempted.json"
# The suspends' own time: the copy and the wait for issued work, from the server's log lines.
suspend_s=$(grep -a ": suspended; " "$OUT/daemon.log" |
  sed -n 's/.* in \([0-9.]*\) s (.*after \([0-9.]*\) s waiting.*/\1 \2/p' |
  awk '{s += $1 + $2} END {printf "%.4f", s}')
python3 - "$OUT/ps-preempted.json" "$v1" "$v2" "${want_s:-nan}" "$suspend_s" "${free_s:-nan}" \
  "$OUT/daemon.log" \
  <<'PY' || fail=1
import json, sys
# GPU 0's sessions: on a host with more GPUs PyTorch opens one on each.
clients = {c["pid"]: c for c in json.load(open(sys.argv[1]))["clients"] if c["gpu"] == 0}
victims = [clients.get(int(p), {}) for p in sys.argv[2:4]]
want_s, suspend_s, free_s = (float(x) for x in sys.argv[4:7])
for p, v in zip(sys.argv[2:4], victims):
    print(f"victim pid {p}: state={v.get('state')} parked={v.get('parked_bytes', 0) / 2**30:.2f} GiB")
over = want_s - suspend_s - free_s
print(f"preempted: first kernel after {want_s:.3f} s; the suspends took {suspend_s:.3f} s, "
      f"the uncontested allocation and kernel {free_s:.3f} s: {over * 1000:+.1f} ms beyond both")
# From the server's log: the allocation's answer after the end of the last suspend.
import datetime, re
def stamp(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
log = open(sys.argv[7], errors="replace").read().splitlines()
ends = [stamp(l) for l in log if ": suspended; " in l]
answers = [stamp(l) for l in log if re.search(r"its (cuMemAlloc|cuMemCreate) of .* fits after", l)]
if ends and answers:
    gap = (answers[-1] - ends[-1]).total_seconds()
    print(f"the allocation was answered {gap * 1000:.0f} ms after the last suspend ended")
ok = all(v.get("state") == "preempted" for v in victims)
print("PASS: both preempted" if ok else "FAIL: both victims should be preempted")
print("target met: within the suspends + 50 ms (+ the uncontested time)" if over <= 0.05
      else "target missed: more than the suspends + 50 ms (+ the uncontested time)")
sys.exit(0 if ok else 1)
PY

# ---- the normal client leaves: both come back by themselves ---------------------------------------
echo >&"$WANTER_IN"
wait "$WANTER_PID" 2>/dev/null
back=0
for _ in $(seq 1200); do
  back=$(ctl ps --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["clients"]
print(sum(1 for x in c if x["pid"] in (int(sys.argv[1]), int(sys.argv[2])) and x["gpu"] == 0
          and x["state"] == "active"))' "$v1" "$v2")
  [ "$back" = 2 ] && break
  sleep 0.1
done
[ "$back" = 2 ] && echo "PASS: both resumed by themselves" || { echo "FAIL: $back of 2 resumed"; fail=1; }
for v in V1 V2; do
  in_fd=${v}_IN out_fd=${v}_OUT
  echo >&"${!in_fd}"
  result=$(read_until "${!out_fd}" RESULT 300)
  echo "$v: $result"
  [[ "$result" == *held_ok=True* ]] || { echo "FAIL: $v's bytes changed"; fail=1; }
done
ctl quit >/dev/null 2>&1
wait "$DPID" 2>/dev/null
grep -a "memory policy" "$OUT/daemon.log" | tail -8
[ $fail = 0 ] && echo "PASS: preemption held" || echo "FAIL: see $OUT"
exit $fail
