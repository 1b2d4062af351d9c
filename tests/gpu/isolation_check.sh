#!/usr/bin/env bash
# Isolation groups on the real driver (docs/isolation.md): a tenant holds a secret in GPU memory,
# an intruder's kernel copies the tenant's address into its own buffer.
#
#   placement              the intruder must            the tenant must
#   shim, one group        see the secret (one context: the documented risk; proves the probe)
#   shim, --isolation      not see it                   keep its bytes and run work; its server
#     client                                            is not restarted
#   native processes       not see it                   keep its bytes and run work
#   NVIDIA MPS (if found)  not see it                   (reported: MPS may end every client)
#   shim, --isolation      not see it                   (reported: a fault ends every NVIDIA MPS
#     client over NVIDIA MPS                            client of the GPU, so every group)
# and a culprit row: in one group, examples/fault faults beside the tenant, which is ended and
# must be told that the work of `fault` returned the fault first; `ps --json` must name it too.
#
# Exits 77 without a GPU, 0 when every row passed, 1 otherwise.
# usage: isolation_check.sh --build-dir BUILD [--work-dir DIR]
set -u -o pipefail

SCRIPT_NAME=isolation_check
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi
parse_paths "$@"
WORK_DIR=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) WORK_DIR=$2; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
PEEK=${EXAMPLES_DIR:-}/tenant_peek
require_file tenant_peek "$PEEK"
require_file daemon "${DAEMON:-}"
[ -n "$WORK_DIR" ] || WORK_DIR=$(mktemp -d /tmp/mpsshim-isolation.XXXXXX)
LOGS=$WORK_DIR/logs
mkdir -p "$LOGS"
PROGRAM_TIMEOUT=${PROGRAM_TIMEOUT:-120}
FAILURES=0
ROWS=()

# shellcheck disable=SC2317  # called from the EXIT trap
finish() {
  daemon_stop
  mps_stop
  echo
  echo "============================ mpsshim isolation on the GPU ============================"
  printf '%-22s %-5s %s\n' PLACEMENT RESULT "INTRUDER | TENANT"
  local row
  for row in "${ROWS[@]+"${ROWS[@]}"}"; do echo "$row"; done
  echo "logs: $LOGS"
  echo "isolation_check: $FAILURES of ${#ROWS[@]} rows FAIL"
}
trap finish EXIT
trap 'exit 130' INT TERM

# probe MODE TAG: the tenant holds, the intruder reads; sets INTRUDER and TENANT (result lines).
probe() {
  local mode=$1 tag=$2 fifo=$WORK_DIR/$2.stdin address="" i
  rm -f "$fifo"
  mkfifo "$fifo"
  run_mode "$mode" "$LOGS/$tag.tenant" "$PEEK" --hold <"$fifo" &
  local tenant_pid=$!
  exec {hold_fd}>"$fifo"  # the tenant's stdin stays open until its check
  for i in $(seq 600); do
    address=$(sed -n 's/^# address \(0x[0-9a-f]*\)$/\1/p' "$LOGS/$tag.tenant.out" 2>/dev/null)
    [ -n "$address" ] || ! kill -0 "$tenant_pid" 2>/dev/null || { sleep 0.1; continue; }
    break
  done
  if [ -n "$address" ]; then
    run_mode "$mode" "$LOGS/$tag.intruder" "$PEEK" --read "$address"
  else
    echo "no address from the tenant" >"$LOGS/$tag.intruder.out"
  fi
  echo check >&"$hold_fd"
  exec {hold_fd}>&-
  wait "$tenant_pid"
  INTRUDER=$(result_line "$LOGS/$tag.intruder.out" tenant_peek)
  TENANT=$(result_line "$LOGS/$tag.tenant.out" tenant_peek)
  [ -n "$INTRUDER" ] || INTRUDER="no result: $(tail -n1 "$LOGS/$tag.intruder.err" 2>/dev/null)"
  [ -n "$TENANT" ] || TENANT="no result: $(tail -n1 "$LOGS/$tag.tenant.err" 2>/dev/null)"
}

# row PLACEMENT OK: one line of the table.
row() {
  local verdict=PASS
  [ "$2" = 1 ] || { verdict=FAIL; FAILURES=$((FAILURES + 1)); }
  ROWS+=("$(printf '%-22s %-5s %s | %s' "$1" "$verdict" "${INTRUDER#tenant_peek: }" \
    "${TENANT#tenant_peek: }")")
  log "$verdict $1"
}

saw_secret() { [ "$(field "$INTRUDER" saw_secret)" = "$1" ]; }
tenant_ok() { [ "$(verdict "$TENANT")" = PASS ]; }


# One group: the intruder's kernel reads the tenant's memory.
daemon_start "$WORK_DIR/shared" "$LOGS/mpsshimd.shared.log" || die "mpsshimd did not start"
probe shim shared
ok=0
saw_secret 1 && tenant_ok && ok=1
row "shim, one group" "$ok"

# The same group, a client whose kernel faults: the tenant is ended and told who it was.
fifo=$WORK_DIR/culprit.stdin
rm -f "$fifo"
mkfifo "$fifo"
run_mode shim "$LOGS/culprit.tenant" "$PEEK" --hold <"$fifo" &
tenant_pid=$!
exec {hold_fd}>"$fifo"
for i in $(seq 600); do
  grep -q '^# address' "$LOGS/culprit.tenant.out" 2>/dev/null && break
  kill -0 "$tenant_pid" 2>/dev/null || break
  sleep 0.1
done
run_mode shim "$LOGS/culprit.fault" "$EXAMPLES_DIR/fault"
echo check >&"$hold_fd"
exec {hold_fd}>&-
wait "$tenant_pid"
for i in $(seq 100); do  # the daemon hears of the fault as the server exits
  "$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" ps --json >"$LOGS/culprit.ps.json" 2>/dev/null
  grep -q '"likely_culprit"' "$LOGS/culprit.ps.json" && break
  sleep 0.1
done
named=$(python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["faults"]; \
print(f[-1]["likely_culprit"]["program"] if f and f[-1]["likely_culprit"] else "none")' \
  "$LOGS/culprit.ps.json" 2>/dev/null)
told=$(grep -o "the work of another client, pid [0-9]* (fault), returned it first" \
  "$LOGS/culprit.tenant.err" | head -n1)
INTRUDER="$(result_line "$LOGS/culprit.fault.out" fault) | ps --json culprit: ${named:-none}"
TENANT="${told:-not told} $(tail -n1 "$LOGS/culprit.tenant.out")"
ok=0
[ "$named" = fault ] && [ -n "$told" ] && ok=1
row "shim, one group, a fault" "$ok"
daemon_stop

# A server per client: separate contexts.
DAEMON_ARGS=(--isolation=client)
daemon_start "$WORK_DIR/client" "$LOGS/mpsshimd.client.log" || die "mpsshimd did not start"
before=$(gpu0_restarts)
probe shim client
after=$(gpu0_restarts)
ok=0
saw_secret 0 && tenant_ok && [ "$before" = "$after" ] && ok=1
row "shim, --isolation client" "$ok"
grep -h "GPU fault\|group" "$LOGS/mpsshimd.client.log" | tail -n 4 >&2
daemon_stop
DAEMON_ARGS=()

probe native native
ok=0
saw_secret 0 && tenant_ok && ok=1
row "native processes" "$ok"

if mps_start "$WORK_DIR"; then
  probe mps mps
  ok=0
  saw_secret 0 && ok=1  # the tenant's fate is reported, not judged
  row "NVIDIA MPS" "$ok"
  # Every group's server a client of that NVIDIA MPS daemon (mpsshimd --nvidia-mps-pipe-directory).
  DAEMON_ARGS=(--isolation=client --nvidia-mps-pipe-directory "$MPS_PIPE_DIR")
  if daemon_start "$WORK_DIR/over-mps" "$LOGS/mpsshimd.over-mps.log"; then
    probe shim over-mps
    ok=0
    saw_secret 0 && ok=1  # the tenant's fate is reported, not judged
    row "shim over NVIDIA MPS" "$ok"
    daemon_stop
  else
    INTRUDER="mpsshimd did not start" TENANT="-"
    row "shim over NVIDIA MPS" 0
  fi
  DAEMON_ARGS=()
  mps_stop
fi
exit $((FAILURES == 0 ? 0 : 1))
