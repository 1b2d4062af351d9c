#!/usr/bin/env bash
# The headline figures side by side: natively, under mpsshim, and under NVIDIA MPS when
# nvidia-cuda-mps-control is available (and we are root), with NVIDIA MPS's figures on an H200
# as anchors (docs/benchmarks.md, "The quick summary"). Exits 77 (skipped) without an NVIDIA
# GPU, 1 if a program failed in some mode, else 0.
#
# usage: bench_summary.sh --build-dir BUILD [--modes native,shim,mps] [--procs 8] [--work-dir DIR]
#        bench_summary.sh --shim libmpsshim.so --daemon mpsshimd --ctl mpsshimctl
#                         [--server mpsshim-server] --examples-dir DIR --bench-dir DIR [...]
set -u -o pipefail

SCRIPT_NAME=bench_summary
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi

parse_paths "$@"
MODES=native,shim,mps PROCS=8 WORK_DIR=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --modes) MODES=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
require_file examples-dir "${EXAMPLES_DIR:-}"
require_file bench-dir "${BENCH_DIR:-}"
require_file bench-dir "$BENCH_DIR/launch_latency"  # not built when nvcc was missing
if [[ ",$MODES," == *,shim,* ]]; then
  require_file shim "${SHIM:-}"
  require_file daemon "${DAEMON:-}"
  require_file ctl "${CTL:-}"
fi
[ -n "$WORK_DIR" ] || WORK_DIR=$(mktemp -d /tmp/mpsshim-bench.XXXXXX)
LOGS=$WORK_DIR/logs
mkdir -p "$LOGS"
SIZE_64M=67108864
FAILED_RUNS=0

# shellcheck disable=SC2317  # the EXIT trap
cleanup() {
  daemon_stop
  mps_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run_failed() {  # WHAT
  log "failed: $1"
  FAILED_RUNS=$((FAILED_RUNS + 1))
}

# Figures per mode, in associative arrays keyed by figure name.
declare -A NATIVE=() SHIM_FIG=() MPS=()

# measure MODE ARRAY_NAME: runs the benchmarks in MODE and fills the array.
# shellcheck disable=SC2034  # "out" is the caller's array, through a nameref
measure() {
  local mode=$1
  local -n out=$2
  log "measuring: $mode"
  run_mode "$mode" "$LOGS/launch_latency.$mode" "$BENCH_DIR/launch_latency" --quick ||
    run_failed "launch_latency in $mode: see $LOGS/launch_latency.$mode.*"
  local f=$LOGS/launch_latency.$mode.out
  out["launch_cpu"]=$(csv_value "$f" launch_latency launch_async_cpu)
  out["stream_sync"]=$(csv_value "$f" launch_latency launch_stream_sync)
  out["ctx_sync"]=$(csv_value "$f" launch_latency launch_ctx_sync)

  run_mode "$mode" "$LOGS/bandwidth.$mode" "$BENCH_DIR/bandwidth" --quick --sizes "$SIZE_64M" ||
    run_failed "bandwidth in $mode: see $LOGS/bandwidth.$mode.*"
  f=$LOGS/bandwidth.$mode.out
  out["h2d_pinned"]=$(csv_value "$f" bandwidth h2d_pinned_sync "$SIZE_64M")
  out["h2d_pageable"]=$(csv_value "$f" bandwidth h2d_pageable_sync "$SIZE_64M")
  out["d2h_pinned"]=$(csv_value "$f" bandwidth d2h_pinned_sync "$SIZE_64M")
  out["d2h_pageable"]=$(csv_value "$f" bandwidth d2h_pageable_sync "$SIZE_64M")

  if [ -x "$BENCH_DIR/runtime_paths" ]; then  # a CUDA-runtime program (graphs, host functions)
    run_mode "$mode" "$LOGS/runtime_paths.$mode" "$BENCH_DIR/runtime_paths" ||
      run_failed "runtime_paths in $mode: see $LOGS/runtime_paths.$mode.*"
    f=$LOGS/runtime_paths.$mode.out
    out["is_capturing"]=$(csv_value "$f" runtime_paths is_capturing_cpu)
    out["graph_issue"]=$(csv_value "$f" runtime_paths graph_launch_issue_cpu)
    out["graph_launch"]=$(csv_value "$f" runtime_paths graph_launch_10_kernels)
    out["host_func"]=$(csv_value "$f" runtime_paths host_func_round_trip_median)
  fi

  run_small_kernel_copies "$mode" 1 "$LOGS/small1.$mode"
  [ "$COPIES_OK" = 1 ] || run_failed "small_kernels in $mode: see $LOGS/small1.$mode.*"
  out["small_one"]=$COPIES_MEAN_S
  run_small_kernel_copies "$mode" "$PROCS" "$LOGS/small$PROCS.$mode"
  [ "$COPIES_OK" = 1 ] || run_failed "small_kernels x$PROCS in $mode: see $LOGS/small$PROCS.$mode.*"
  out["small_wall"]=$COPIES_WALL_S
  out["small_mean"]=$COPIES_MEAN_S
  out["small_max"]=$COPIES_MAX_S
}

NOTES=()
if [[ ",$MODES," == *,native,* ]]; then measure native NATIVE; fi
if [[ ",$MODES," == *,shim,* ]]; then
  if daemon_start "$WORK_DIR/run" "$LOGS/mpsshimd.log"; then
    measure shim SHIM_FIG
  else
    NOTES+=("mpsshim: the daemon did not start (see $LOGS/mpsshimd.log)")
    FAILED_RUNS=$((FAILED_RUNS + 1))
  fi
  daemon_stop
fi
# NVIDIA MPS last, after our daemon is gone, so that nothing else shares the GPU with it.
if [[ ",$MODES," == *,mps,* ]]; then
  if mps_start "$WORK_DIR"; then
    measure mps MPS
  else
    NOTES+=("NVIDIA MPS: not measured (see the messages above)")
  fi
  mps_stop
fi

cell() {  # VALUE: three decimals, or "-" when not measured
  if [ -n "$1" ] && [ "$1" != nan ]; then printf '%.3f' "$1"; else echo -; fi
}

row() {  # LABEL KEY ANCHOR
  printf '%-44s %12s %12s %12s %14s\n' "$1" "$(cell "${NATIVE[$2]:-}")" \
    "$(cell "${SHIM_FIG[$2]:-}")" "$(cell "${MPS[$2]:-}")" "$3"
}

echo
echo "=============================== mpsshim bench summary ==============================="
nvidia-smi -L 2>/dev/null | head -n1 || true
printf '%-44s %12s %12s %12s %14s\n' FIGURE native mpsshim nvidia-mps "anchor(MPS)"
row "empty-kernel async launch, client CPU, us" launch_cpu 2.51
row "launch + cuStreamSynchronize, us" stream_sync -
row "launch + cuCtxSynchronize, us" ctx_sync 7.3
row "H2D pinned 64 MiB, GB/s" h2d_pinned 55.5
row "H2D pageable 64 MiB, GB/s" h2d_pageable 12.0
row "D2H pinned 64 MiB, GB/s" d2h_pinned -
row "D2H pageable 64 MiB, GB/s" d2h_pageable -
row "cudaStreamIsCapturing, client CPU, ns" is_capturing -
row "cudaGraphLaunch (10 kernels), client CPU, us" graph_issue -
row "cudaGraphLaunch (10 kernels), throughput, us" graph_launch -
row "cudaLaunchHostFunc + sync round trip, us" host_func -
row "small kernels, 1 proc, s" small_one 0.058
row "small kernels, $PROCS procs, wall s" small_wall -
row "small kernels, $PROCS procs, per-process s" small_mean "0.067-0.071"
row "small kernels, $PROCS procs, slowest proc s" small_max -
echo "(small kernels: 5000 launches of 2x32-thread ~10 us spin kernels, sync every 64;"
echo " anchors: NVIDIA MPS on an H200 (docs/benchmarks.md); time-slicing: 0.48-0.53 s per process)"
for note in "${NOTES[@]+"${NOTES[@]}"}"; do echo "note: $note"; done
echo "logs: $LOGS"

# Machine-readable copy: figure,mode,value
{
  echo "figure,mode,value"
  for key in launch_cpu stream_sync ctx_sync h2d_pinned h2d_pageable d2h_pinned d2h_pageable \
    small_one small_wall small_mean small_max; do
    echo "$key,native,${NATIVE[$key]:-}"
    echo "$key,shim,${SHIM_FIG[$key]:-}"
    echo "$key,mps,${MPS[$key]:-}"
  done
} >"$WORK_DIR/summary.csv"
echo "csv: $WORK_DIR/summary.csv"

if [ "$FAILED_RUNS" -ne 0 ]; then
  echo "bench_summary: $FAILED_RUNS runs failed"
  exit 1
fi
echo "bench_summary: done"
exit 0
