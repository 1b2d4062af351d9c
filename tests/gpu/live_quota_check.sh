#!/usr/bin/env bash
# GPU check of a live SM quota change (mpsshimctl set_active_thread_percentage): smid_quota runs
# under the shim at 100%, counts the distinct %smid of a wide grid, waits; the operator lowers its
# quota to 25%; its second round must stay within the new green context (the SMs `ps --json`
# reports), while MULTIPROCESSOR_COUNT still answers the start value.
# usage: live_quota_check.sh BUILD_DIR [OUT_DIR]   (exits 77 without a GPU; 0 when it held)
set -u
B=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d /tmp/live-quota.XXXX)}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU || exit 77
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # start_build_daemon
SHIM=$B/libshim/libmpsshim.so
CTL=$B/broker/daemon/mpsshimctl
RT=$(mktemp -d /tmp/live-quota-rt.XXXX)
start_build_daemon "$B" "$RT" "$OUT/daemon.log"  # sets DPID
fail=0
coproc PROBE { exec env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$RT" \
  "$B/examples/smid_quota" --rounds 2 2>&1; }
# Copies of the coprocess's pipes: bash unsets PROBE as soon as the program exits, which may be
# before its last lines are read.
probe_pid=$PROBE_PID
exec {probe_out}<&"${PROBE[0]}" {probe_in}>&"${PROBE[1]}"
read -r -t 120 line <&"$probe_out"
while [ -n "${line:-}" ] && [[ "$line" != WAITING* ]]; do
  echo "$line" >>"$OUT/probe.out"
  read -r -t 120 line <&"$probe_out" || break
done
echo "$line" >>"$OUT/probe.out"
pid=$(sed -n 's/.*pid=\([0-9]*\).*/\1/p' <<<"$line")
if [ -z "$pid" ]; then echo "FAIL: smid_quota did not reach its second round"; fail=1; fi
"$CTL" --runtime-dir "$RT" set_active_thread_percentage 0 "$pid" 25 | tee "$OUT/change.out"
"$CTL" --runtime-dir "$RT" ps --json >"$OUT/ps.json"
echo >&"$probe_in"
exec {probe_in}>&-
while read -r -t 120 line <&"$probe_out"; do echo "$line" >>"$OUT/probe.out"; done
wait "$probe_pid" 2>/dev/null
result=$(grep 'smid_quota' "$OUT/probe.out" | tail -1)
echo "$result"
granted=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clients"][0]["sms"])' \
  "$OUT/ps.json")
python3 - "$result" "$granted" <<'PY' || fail=1
import re, sys
fields = dict(re.findall(r"(\w+)=(\S+)", sys.argv[1]))
granted = int(sys.argv[2])
before, after = int(fields["distinct_sms"]), int(fields["distinct_sms_r2"])
reported = int(fields["reported_sms"])
print(f"before: {before} SMs (reported {reported}); after the change to 25%: {after} SMs, "
      f"granted {granted}")
ok = after <= granted < before and reported >= before
print("PASS" if ok else "FAIL: need after <= granted < before and the reported count unchanged")
sys.exit(0 if ok else 1)
PY
"$CTL" --runtime-dir "$RT" quit >/dev/null 2>&1
sleep 2
kill "$DPID" 2>/dev/null
grep -E "SM quota changed|error" "$OUT/daemon.log" | tail -5
exit $fail
