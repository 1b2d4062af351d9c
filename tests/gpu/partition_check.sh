#!/usr/bin/env bash
# GPU check of static SM partitions (docs/daemon.md, "Static SM partitions"): two partitions of
# 32 SMs each are cut with mpsshimctl sm_partition add; examples/smid_quota runs in each at the
# same time (CUDA_MPS_SM_PARTITION) and lists the %smid of a wide grid. The two sets of SMs must
# be disjoint, each at most its partition's size, and each client must report its partition's
# SM count; removing a partition while its client runs must be refused. A third run without a
# partition shows the whole GPU (for the record).
# usage: partition_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU; 0 when it held)
set -u
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/partition-check.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # start_build_daemon
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/partition-rt.XXXX)
start_build_daemon "$B" "$RT" "$OUT/daemon.log"  # sets DPID
fail=0
"$CTL" --runtime-dir "$RT" sm_partition add 0 32 | tee "$OUT/add1.out"
"$CTL" --runtime-dir "$RT" sm_partition add 0 32 | tee "$OUT/add2.out"
id1=$(sed -n 's/.*partition=\([0-9]*\).*/\1/p' "$OUT/add1.out")
id2=$(sed -n 's/.*partition=\([0-9]*\).*/\1/p' "$OUT/add2.out")
if [ -z "$id1" ] || [ -z "$id2" ]; then echo "FAIL: sm_partition add"; fail=1; fi

# Both at once, each with a second round held at its WAITING line, so that `rm` is tried while
# they run.
exec {in1}> >(env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" CUDA_MPS_SM_PARTITION="$id1" \
  "$B/examples/smid_quota" --rounds 2 >"$OUT/probe1.out" 2>&1)
exec {in2}> >(env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" CUDA_MPS_SM_PARTITION="$id2" \
  "$B/examples/smid_quota" --rounds 2 >"$OUT/probe2.out" 2>&1)
for _ in $(seq 600); do
  grep -q WAITING "$OUT/probe1.out" 2>/dev/null && grep -q WAITING "$OUT/probe2.out" 2>/dev/null && break
  sleep 0.1
done
"$CTL" --runtime-dir "$RT" lspart | tee "$OUT/lspart.out"
if "$CTL" --runtime-dir "$RT" sm_partition rm "$id1" >"$OUT/rm_busy.out" 2>&1; then
  echo "FAIL: a partition with a client in it was removed"; fail=1
fi
cat "$OUT/rm_busy.out"
echo >&"$in1"; exec {in1}>&-
echo >&"$in2"; exec {in2}>&-
for _ in $(seq 600); do
  grep -q 'smid_quota:' "$OUT/probe1.out" && grep -q 'smid_quota:' "$OUT/probe2.out" && break
  sleep 0.1
done
env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" "$B/examples/smid_quota" >"$OUT/probe_all.out" 2>&1
python3 - "$OUT/probe1.out" "$OUT/probe2.out" "$OUT/probe_all.out" "$OUT/add1.out" "$OUT/add2.out" <<'PY' || fail=1
import re, sys
def fields(path):
    lines = [l for l in open(path) if l.startswith("smid_quota:")]
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1])) if lines else {}
a, b, whole = fields(sys.argv[1]), fields(sys.argv[2]), fields(sys.argv[3])
sizes = [int(re.search(r"sms=(\d+)", open(p).read()).group(1)) for p in sys.argv[4:6]]
ok = bool(a) and bool(b)
if ok:
    sa = set(map(int, a["sm_ids"].split(","))) if a["sm_ids"] != "none" else set()
    sb = set(map(int, b["sm_ids"].split(","))) if b["sm_ids"] != "none" else set()
    print(f"partition 1: {len(sa)} SMs (reported {a['reported_sms']}, size {sizes[0]}): {sorted(sa)}")
    print(f"partition 2: {len(sb)} SMs (reported {b['reported_sms']}, size {sizes[1]}): {sorted(sb)}")
    print(f"without a partition: {whole.get('distinct_sms')} SMs")
    ok = (not (sa & sb) and 0 < len(sa) <= sizes[0] and 0 < len(sb) <= sizes[1]
          and int(a["reported_sms"]) == sizes[0] and int(b["reported_sms"]) == sizes[1])
    if sa & sb:
        print(f"shared SMs: {sorted(sa & sb)}")
print("PASS" if ok else "FAIL: the partitions' SMs must be disjoint and within their sizes")
sys.exit(0 if ok else 1)
PY
# Once the server freed the client's session, the partition can go.
removed=0
for _ in $(seq 50); do
  "$CTL" --runtime-dir "$RT" sm_partition rm "$id1" >/dev/null 2>&1 && { removed=1; break; }
  sleep 0.1
done
[ $removed = 1 ] || { echo "FAIL: rm after the client left"; fail=1; }
"$CTL" --runtime-dir "$RT" quit >/dev/null 2>&1
sleep 2
kill "$DPID" 2>/dev/null
grep -E "refused|error" "$OUT/daemon.log" | tail -5
exit $fail
