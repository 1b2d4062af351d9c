#!/usr/bin/env bash
# GPU check of mpsshimctl suspend / resume (docs/suspend.md). A PyTorch training loop holding
# 4 GiB beside its model is suspended mid-run and resumed, once with PyTorch's caching allocator
# and once with its expandable segments (cuMemCreate memory): while suspended, `ps` shows it
# suspended with its memory parked and it makes no progress; its final weights, its inference
# output and the held bytes must equal those of an uninterrupted run under the shim. Then, for
# each size in SUSPEND_SIZES_GIB (default "1"), a client holding that much is suspended and
# resumed, its bytes checked: the copy rates the server reports, beside bench/bandwidth's pinned
# figures measured in the same run.
# usage: suspend_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU or PyTorch; 0 when it held)
set -u -o pipefail
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/suspend-check.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
  { echo "SKIP: no PyTorch with CUDA"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # start_build_daemon
CLIENT=$(dirname "${BASH_SOURCE[0]}")/python/suspend_client.py
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/suspend-rt.XXXX)
# MPSSHIMD_ARGS: more mpsshimd options (word-split), e.g. "--park-pool 51539607552".
# shellcheck disable=SC2086
start_build_daemon "$B" "$RT" "$OUT/daemon.log" ${MPSSHIMD_ARGS:-}  # sets DPID
ctl() { "$CTL" --runtime-dir "$RT" "$@"; }
shim() { env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" "$@"; }
fail=0
STEPS=8000

# ---- a training loop suspended mid-run, with each of PyTorch's allocators ----------------------
# train_check NAME ALLOC_CONF: the caching allocator ("" : cuMemAlloc memory) or expandable
# segments (cuMemCreate physical allocations mapped into reserved ranges, docs/vmm.md).
train_check() {
  local name=$1 conf=$2 pid
  local o=$OUT/$name
  mkdir -p "$o"
  PYTORCH_CUDA_ALLOC_CONF=$conf shim python3 "$CLIENT" train "$STEPS" 4 >"$o/uninterrupted.out" 2>&1
  PYTORCH_CUDA_ALLOC_CONF=$conf shim python3 "$CLIENT" train "$STEPS" 4 >"$o/suspended.out" 2>&1 &
  local train=$!
  for _ in $(seq 600); do grep -q '^STEP 400 ' "$o/suspended.out" && break; sleep 0.05; done
  pid=$(sed -n 's/^STEP .* pid=\([0-9]*\).*/\1/p' "$o/suspended.out" | head -1)
  if [ -z "$pid" ]; then
    echo "FAIL ($name): the training loop did not start"; fail=1
  else
    ctl suspend 0 "$pid" | tee "$o/suspend-train.out" || fail=1
    ctl ps --json >"$o/ps-suspended.json"
    local steps_then steps_later
    steps_then=$(grep -c '^STEP' "$o/suspended.out")
    sleep 1  # a window in which an unsuspended loop prints dozens of STEP lines
    steps_later=$(grep -c '^STEP' "$o/suspended.out")
    # A client left suspended would never finish: it is killed instead.
    ctl resume 0 "$pid" | tee "$o/resume-train.out" || { fail=1; kill -9 "$train"; }
    python3 - "$o/ps-suspended.json" "$pid" "$steps_then" "$steps_later" "$name" <<'PY' || fail=1
import json, sys
clients = json.load(open(sys.argv[1]))["clients"]
me = [c for c in clients if c["pid"] == int(sys.argv[2])][0]
then, later = int(sys.argv[3]), int(sys.argv[4])
print(f"{sys.argv[5]}: while suspended: state={me['state']} "
      f"parked={me['parked_bytes'] / 2**30:.2f} GiB memory={me['memory_used_bytes'] / 2**30:.2f} "
      f"GiB; STEP lines {then} -> {later} over 1 s")
ok = me["state"] == "suspended" and me["parked_bytes"] >= 4 << 30 and then == later
print("PASS" if ok else "FAIL: expected suspended, >= 4 GiB parked and no progress")
sys.exit(0 if ok else 1)
PY
  fi
  wait "$train" || { echo "FAIL ($name): the suspended run exited $?"; fail=1; }
  local a b
  a=$(grep '^RESULT' "$o/uninterrupted.out")
  b=$(grep '^RESULT' "$o/suspended.out")
  echo "$name uninterrupted: $a"
  echo "$name suspended:     $b"
  if [ -z "$a" ] || [ "$a" != "$b" ] || [[ "$b" != *held_ok=True* ]]; then
    echo "FAIL ($name): the suspended run's weights, output or held bytes differ"; fail=1
  else
    echo "PASS ($name): identical weights, output and held bytes"
  fi
}
train_check caching ""
train_check expandable "expandable_segments:True"

# ---- copy rates by size --------------------------------------------------------------------------
echo "size_gib suspend_s suspend_rate resume_s resume_rate bytes_ok"
for gib in ${SUSPEND_SIZES_GIB:-1}; do
  coproc HOLD { exec env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" \
    python3 "$CLIENT" hold "$gib" 2>&1; }
  hold_pid=$HOLD_PID
  exec {hold_out}<&"${HOLD[0]}" {hold_in}>&"${HOLD[1]}"
  read -r -t 300 line <&"$hold_out"
  pid=$(sed -n 's/^READY pid=\([0-9]*\).*/\1/p' <<<"$line")
  [ -z "$pid" ] && { echo "FAIL: the $gib GiB client did not start: $line"; fail=1; continue; }
  s=$(ctl suspend 0 "$pid") || { echo "FAIL: $s"; fail=1; }
  r=$(ctl resume 0 "$pid") || { echo "FAIL: $r"; fail=1; kill -9 "$hold_pid"; }
  echo "$s" >>"$OUT/sizes.out"
  echo "$r" >>"$OUT/sizes.out"
  echo >&"$hold_in"
  read -r -t 300 result <&"$hold_out"
  exec {hold_in}>&-
  wait "$hold_pid" 2>/dev/null
  [[ "$result" == *held_ok=True* ]] || { echo "FAIL: $gib GiB came back changed: $result"; fail=1; }
  sed -n 's/.* in \([0-9.]*\) s (\([0-9.]*\) GB\/s).*/\1 \2/p' <<<"$s" | head -1 |
    { read -r st sr; sed -n 's/.* in \([0-9.]*\) s (\([0-9.]*\) GB\/s).*/\1 \2/p' <<<"$r" |
      { read -r rt rr; echo "$gib $st $sr $rt $rr ${result#RESULT }"; }; }
done
env -u LD_PRELOAD -u CUDA_MPS_PIPE_DIRECTORY "$B/bench/bandwidth" --sizes 256M,1G --repeats 3 \
  --bytes-per-repeat 4G >"$OUT/bandwidth.out" 2>&1
grep '^#' "$OUT/bandwidth.out"

ctl quit >/dev/null 2>&1
wait "$DPID" 2>/dev/null
grep -E "suspended|resumed|error" "$OUT/daemon.log" | tail -8
[ $fail = 0 ] && echo "PASS: suspend and resume held" || echo "FAIL: see $OUT"
exit $fail
