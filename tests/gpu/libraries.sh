#!/usr/bin/env bash
# The CUDA libraries under the shim: the programs of tests/gpu/libraries (cuFFT,
# cuBLASLt bf16/fp8, cuSPARSE, cuRAND, cuDNN) and the Python scripts of tests/gpu/python (JAX,
# a PyTorch bf16 transformer block, CuPy FFT, numba.cuda, Triton through TMA descriptors, JAX
# beside a process holding most of the GPU), each natively and under the shim.
# A check passes when both runs print PASS and every result field (digests included) is equal.
# A program that exits 77 natively (a Python module not installed, no CUDA backend) is SKIP; one
# that passes natively and skips under the shim FAILs.
#
# Alone (starts its own mpsshimd; exit 77 without a GPU, 0 when no check failed):
#   tests/gpu/libraries.sh --build-dir BUILD [--work-dir DIR]
# From gpu_suite.sh (its daemon, its log directory; rows appended to FILE as
# "check<TAB>native<TAB>shim<TAB>verdict<TAB>detail"):
#   libraries.sh --shim SO --ctl CTL --libraries-dir DIR --runtime-dir DIR --logs-dir DIR --rows FILE
# Environment: PYTHON (python3), LIB_TIMEOUT (seconds per run, 300).
set -u -o pipefail

SCRIPT_NAME=libraries
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi

parse_paths "$@"
WORK_DIR="" RUNTIME_DIR="" LOGS="" ROWS_FILE=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --runtime-dir) RUNTIME_DIR=$2; shift 2 ;;
    --logs-dir) LOGS=$2; shift 2 ;;
    --rows) ROWS_FILE=$2; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
require_file shim "${SHIM:-}"
require_file ctl "${CTL:-}"
PYTHON=${PYTHON:-python3}
LIB_TIMEOUT=${LIB_TIMEOUT:-300}

KEEP_WORK=1
if [ -z "$WORK_DIR" ]; then
  WORK_DIR=$(mktemp -d /tmp/mpsshim-libraries.XXXXXX)
  KEEP_WORK=0
fi
: "${LOGS:=$WORK_DIR/logs}"
mkdir -p "$LOGS"

ROWS=()
FAILURES=0
# add_row CHECK NATIVE SHIM VERDICT DETAIL (SKIP is not a failure)
add_row() {
  ROWS+=("$(printf '%-26s %-8s %-8s %-5s %s' "$1" "$2" "$3" "$4" "$5")")
  [ -z "$ROWS_FILE" ] || printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$ROWS_FILE"
  case "$4" in PASS | SKIP) ;; *) FAILURES=$((FAILURES + 1)) ;; esac
  log "$4  $1: $5"
}

# shellcheck disable=SC2317  # called from the EXIT trap
finish() {
  [ -n "$RUNTIME_DIR" ] || daemon_stop
  [ -z "$ROWS_FILE" ] || return 0  # the suite prints the table
  echo
  echo "=============================== mpsshim CUDA libraries ==============================="
  printf '%-26s %-8s %-8s %-5s %s\n' CHECK NATIVE SHIM RESULT DETAIL
  local row
  for row in "${ROWS[@]+"${ROWS[@]}"}"; do echo "$row"; done
  local missing
  missing=$(grep -ahoE "[A-Za-z_0-9]+ is not implemented by mpsshim|its meaning is unknown.*|unknown table.*" \
    "$LOGS"/*.shim.err 2>/dev/null | sort | uniq -c | sort -rn)
  echo "not implemented, reached by the programs under the shim: ${missing:+$'\n'}${missing:-none}"
  echo "logs: $LOGS"
  echo "libraries: $FAILURES of ${#ROWS[@]} checks FAIL"
  [ "$KEEP_WORK" -eq 1 ] || [ "$FAILURES" -ne 0 ] || rm -rf "$WORK_DIR"
}
trap finish EXIT
trap 'exit 130' INT TERM

if [ -n "$RUNTIME_DIR" ]; then
  SHIM_RUNTIME_DIR=$RUNTIME_DIR  # the caller's daemon, already running
else
  require_file daemon "${DAEMON:-}"
  daemon_start "$WORK_DIR/run" "$LOGS/mpsshimd.libraries.log" || {
    add_row daemon_start - - FAIL "mpsshimd did not become ready; see $LOGS/mpsshimd.libraries.log"
    exit 1
  }
fi

# run_one MODE NAME COMMAND...: sets LINE (the result line or "") and STATUS.
run_one() {
  local mode=$1 name=$2
  shift 2
  STATUS=0
  PROGRAM_TIMEOUT=$LIB_TIMEOUT run_mode "$mode" "$LOGS/$name.$mode" "$@" || STATUS=$?
  LINE=$(result_line "$LOGS/$name.$mode.out" "$name")
}

# why MODE NAME: a short reason a run did not pass.
why() {
  local reason="exit $STATUS"
  [ "$STATUS" = 124 ] && reason="timed out after ${LIB_TIMEOUT}s"
  [ "$STATUS" -gt 128 ] && [ "$STATUS" != 124 ] && reason="killed by signal $((STATUS - 128))"
  local last
  last=$(grep -av '^\s*$' "$LOGS/$2.$1.err" "$LOGS/$2.$1.out" 2>/dev/null | tail -n1 | cut -c1-200)
  echo "$1: ${LINE:-no result line} ($reason${last:+; last: ${last#*:}})"
}

# check NAME COMMAND...: one row.
check() {
  local name=$1
  shift
  run_one native "$name" "$@"
  local native_line=$LINE native_status=$STATUS native_why
  native_why=$(why native "$name")
  if [ "$native_status" = "$SKIP_STATUS" ]; then
    add_row "$name" SKIP - SKIP "native: $(tail -n1 "$LOGS/$name.native.out" | cut -c1-160)"
    return
  fi
  run_one shim "$name" "$@"
  local shim_line=$LINE shim_status=$STATUS shim_why
  shim_why=$(why shim "$name")
  local native_verdict shim_verdict
  native_verdict=$(verdict "$native_line")
  shim_verdict=$(verdict "$shim_line")
  [ "$native_status" = 0 ] || native_verdict=FAIL
  [ "$shim_status" = 0 ] || shim_verdict=FAIL
  [ "$shim_status" = "$SKIP_STATUS" ] && shim_verdict=SKIP
  if [ "$native_verdict$shim_verdict" != PASSPASS ]; then
    add_row "$name" "$native_verdict" "$shim_verdict" FAIL \
      "$([ "$native_verdict" = PASS ] || echo "$native_why | ")$shim_why"
    return
  fi
  local difference
  difference=$(diff <(result_fields "$native_line") <(result_fields "$shim_line") |
    grep '^[<>]' | tr '\n' ' ')
  if [ -z "$difference" ]; then
    local compared
    compared=$(result_fields "$native_line")
    add_row "$name" PASS PASS PASS "$(wc -l <<<"$compared") result fields equal $(grep -E \
      '^digest=' <<<"$compared")"
  else
    add_row "$name" PASS PASS FAIL "results differ (< native, > shim): $difference"
  fi
}

for name in lib_cufft lib_cublaslt lib_cusparse lib_curand lib_cudnn; do
  if [ -z "${LIBRARIES_DIR:-}" ] || [ ! -x "$LIBRARIES_DIR/$name" ]; then
    add_row "$name" - - FAIL \
      "${LIBRARIES_DIR:-?}/$name not built (nvcc, the library or its header missing at configure time)"
    continue
  fi
  check "$name" "$LIBRARIES_DIR/$name"
done

for name in jax_check torch_transformer_check cupy_fft_check cupy_link_check numba_check \
  triton_check triton_tma_check jax_beside_hog_check; do
  check "$name" "$PYTHON" "$HERE/python/$name.py"
done
# PyTorch's expandable-segments allocator: the VMM path (docs/vmm.md), natively and under the shim.
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  check expandable_check "$PYTHON" "$HERE/python/expandable_check.py"
# The stream-ordered allocator's tensors shared between processes (docs/memory-pools.md).
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
  check torch_pool_share_check "$PYTHON" "$HERE/python/torch_pool_share_check.py"

exit $((FAILURES == 0 ? 0 : 1))
