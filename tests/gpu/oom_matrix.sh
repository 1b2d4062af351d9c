#!/usr/bin/env bash
# Out of memory on the real driver: the CUDA library programs (tests/gpu/libraries) and the
# Python checks (JAX, PyTorch, CuPy) run
#   hog     beside a process holding all of GPU 0 but --leave bytes (memory_hog.py), natively and
#           under the shim (the hog then a client of the same server);
#   limit   under the shim with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=--limit and no hog, beside a
#           small client of the same server (tenant_peek --hold) that must stay unharmed.
# A shim cell passes when: no GPU fault (the shared server was not restarted, the daemon logged
# no fault), the program's outcome is the native one or better (the native run passed: the same
# result fields; it failed: the shim run passes, or fails with an error that is not a fault),
# and a limit cell's failure names memory. The hog and the tenant check their own bytes at the
# end of their block. Prints the matrix; exits 77 without a GPU, 0 when every cell passed.
#
# usage: oom_matrix.sh --build-dir BUILD [--leave 1G] [--limit 512M] [--work-dir DIR]
#                      [--only NAME,NAME]
# Environment: PYTHON (python3), LIB_TIMEOUT (seconds per run, 240).
set -u -o pipefail

SCRIPT_NAME=oom_matrix
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi
parse_paths "$@"
WORK_DIR="" LEAVE=1G LIMIT=512M ONLY=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --leave) LEAVE=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
require_file shim "${SHIM:-}"
require_file daemon "${DAEMON:-}"
require_file tenant_peek "${EXAMPLES_DIR:-}/tenant_peek"
PYTHON=${PYTHON:-python3}
PROGRAM_TIMEOUT=${LIB_TIMEOUT:-240}
[ -n "$WORK_DIR" ] || WORK_DIR=$(mktemp -d /tmp/mpsshim-oom.XXXXXX)
LOGS=$WORK_DIR/logs
mkdir -p "$LOGS"

# name -> command
declare -A COMMAND=()
NAMES=()
for name in lib_cufft lib_cublaslt lib_cusparse lib_curand lib_cudnn; do
  [ -x "${LIBRARIES_DIR:-}/$name" ] || { log "$name not built: left out"; continue; }
  COMMAND[$name]="$LIBRARIES_DIR/$name"
  NAMES+=("$name")
done
for name in jax_check torch_transformer_check cupy_fft_check; do
  COMMAND[$name]="$PYTHON $HERE/python/$name.py"
  NAMES+=("$name")
done
if [ -n "$ONLY" ]; then
  kept=()
  for name in "${NAMES[@]}"; do [[ ",$ONLY," == *",$name,"* ]] && kept+=("$name"); done
  NAMES=("${kept[@]+"${kept[@]}"}")
fi

declare -A CELL=()   # "name/column" -> text shown
declare -A LINE=()   # "name/column" -> result line
FAILURES=0
BYSTANDERS=()

# shellcheck disable=SC2317  # called from the EXIT trap
finish() {
  daemon_stop
  echo
  echo "=================== mpsshim out of memory: hog leaves $LEAVE, limit $LIMIT ==================="
  printf '%-24s %-28s %-34s %-34s\n' PROGRAM "native, hog" "shim, hog" "shim, limit"
  local name
  for name in "${NAMES[@]+"${NAMES[@]}"}"; do
    printf '%-24s %-28s %-34s %-34s\n' "$name" "${CELL[$name/native-hog]:--}" \
      "${CELL[$name/shim-hog]:--}" "${CELL[$name/shim-limit]:--}"
  done
  local b
  for b in "${BYSTANDERS[@]+"${BYSTANDERS[@]}"}"; do echo "bystander: $b"; done
  echo "logs: $LOGS"
  echo "oom_matrix: $FAILURES cells or bystanders FAIL"
}
trap finish EXIT
trap 'exit 130' INT TERM

faults_logged() { grep -c "GPU fault" "$LOGS/mpsshimd.log" 2>/dev/null || true; }

# outcome PREFIX NAME STATUS: "PASS", "fault: ...", "oom: ..." or "error: ..." (short).
outcome() {
  local prefix=$1 name=$2 status=$3 line last
  line=$(result_line "$prefix.out" "$name")
  if [ "$status" = 0 ] && [ "$(verdict "$line")" = PASS ]; then
    echo PASS
    return
  fi
  last=$(grep -av '^\s*$' "$prefix.err" "$prefix.out" 2>/dev/null | tail -n1 | cut -d: -f2- |
    cut -c1-60 | tr -s ' ')
  if grep -aqiE "ILLEGAL_ADDRESS|illegal memory access|unspecified launch failure|LAUNCH_FAILED" \
    "$prefix.err" "$prefix.out"; then
    echo "fault:$last"
  elif grep -aqiE "out of memory|OUT_OF_MEMORY|RESOURCE_EXHAUSTED|ALLOC_FAILED|MemoryAllocation|failed to allocate" \
    "$prefix.err" "$prefix.out"; then
    echo "oom(exit $status)"
  elif [ "$status" = 124 ]; then
    echo "timeout"
  else
    echo "error(exit $status):$last"
  fi
}

# cell MODE COLUMN NAME [ENV=VALUE...]: runs NAME, records its cell.
cell() {
  local mode=$1 column=$2 name=$3 status=0
  shift 3
  local prefix=$LOGS/$name.$column
  local restarts_before faults_before
  if [ "$mode" = shim ]; then
    restarts_before=$(gpu0_restarts)
    faults_before=$(faults_logged)
  fi
  # shellcheck disable=SC2086  # COMMAND holds a program and its arguments
  run_mode "$mode" "$prefix" env "$@" ${COMMAND[$name]} || status=$?
  local result
  result=$(outcome "$prefix" "$name" "$status")
  LINE[$name/$column]=$(result_line "$prefix.out" "$name")
  local ok=1 why=""
  if [ "$mode" = shim ]; then
    if [ "$(gpu0_restarts)" != "$restarts_before" ] || [ "$(faults_logged)" != "$faults_before" ]; then
      ok=0 why=" GPU-FAULT"
    fi
    case "$result" in fault:*) ok=0 ;; esac
    local native=${CELL[$name/native-hog]:-}
    if [ "$result" = PASS ] && [ "${native%% *}" = PASS ]; then
      local difference
      difference=$(diff <(result_fields "${LINE[$name/native-hog]}") \
        <(result_fields "${LINE[$name/$column]}") | grep -c '^[<>]')
      [ "$difference" = 0 ] || { ok=0 why=" results-differ"; }
    elif [ "$result" != PASS ] && [ "$column" = shim-hog ] && [ "${native%% *}" = PASS ]; then
      ok=0 why=" native-passed"
    elif [ "$column" = shim-limit ] && [ "$result" != PASS ] && [[ "$result" != oom* ]]; then
      ok=0 why=" not-an-oom-error"
    fi
    [ "$ok" = 1 ] || FAILURES=$((FAILURES + 1))
    CELL[$name/$column]="$([ "$ok" = 1 ] && echo ok || echo FAIL) $result$why"
  else
    CELL[$name/$column]="$result"
  fi
  log "$name $column: ${CELL[$name/$column]}"
}

# hog_start MODE: the hog in MODE; sets HOG_PID and HOG_FD (its stdin).
hog_start() {
  local fifo=$WORK_DIR/hog.$1.stdin
  rm -f "$fifo"
  mkfifo "$fifo"
  run_mode "$1" "$LOGS/hog.$1" "$PYTHON" "$HERE/python/memory_hog.py" --leave "$LEAVE" <"$fifo" &
  HOG_PID=$!
  exec {HOG_FD}>"$fifo"
  local i
  for i in $(seq 1200); do
    grep -q '^holding' "$LOGS/hog.$1.out" 2>/dev/null && return 0
    kill -0 "$HOG_PID" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

# hog_check LABEL: tells the hog to check its bytes; records the bystander line.
hog_check() {
  echo check >&"$HOG_FD"
  exec {HOG_FD}>&-
  local status=0
  wait "$HOG_PID" || status=$?
  local said
  said=$(tail -n1 "$LOGS/hog.$2.out")
  [ "$status" = 0 ] || FAILURES=$((FAILURES + 1))
  BYSTANDERS+=("$1 ($(head -n1 "$LOGS/hog.$2.out")): $said")
}

# ---- native beside the hog --------------------------------------------------------------------
if hog_start native; then
  for name in "${NAMES[@]}"; do cell native native-hog "$name"; done
  hog_check "native hog" native
else
  BYSTANDERS+=("native hog did not start: $(tail -n1 "$LOGS/hog.native.out" "$LOGS/hog.native.err")")
  FAILURES=$((FAILURES + 1))
fi

daemon_start "$WORK_DIR/run" "$LOGS/mpsshimd.log" || die "mpsshimd did not start"

# ---- under the shim, beside the hog (a client of the same server) ----------------------------
if hog_start shim; then
  for name in "${NAMES[@]}"; do cell shim shim-hog "$name"; done
  hog_check "shim hog" shim
else
  BYSTANDERS+=("shim hog did not start: $(tail -n1 "$LOGS/hog.shim.out" "$LOGS/hog.shim.err")")
  FAILURES=$((FAILURES + 1))
fi

# ---- under the shim with a memory limit, beside a tenant ----------------------------------------
fifo=$WORK_DIR/tenant.stdin
rm -f "$fifo"
mkfifo "$fifo"
run_mode shim "$LOGS/tenant" "$EXAMPLES_DIR/tenant_peek" --hold <"$fifo" &
tenant_pid=$!
exec {tenant_fd}>"$fifo"
for name in "${NAMES[@]}"; do
  cell shim shim-limit "$name" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=$LIMIT"
done
echo check >&"$tenant_fd"
exec {tenant_fd}>&-
tenant_status=0
wait "$tenant_pid" || tenant_status=$?
[ "$tenant_status" = 0 ] || FAILURES=$((FAILURES + 1))
BYSTANDERS+=("tenant beside the limited clients: $(result_line "$LOGS/tenant.out" tenant_peek)")
exit $((FAILURES == 0 ? 0 : 1))
