#!/usr/bin/env bash
# The GPU suite: every example and every CUDA-runtime program (tests/gpu/programs) natively and
# under the shim, the integrity check against the real driver, concurrency of small kernels, SM
# quotas and crash containment, on the real driver. Exits 77 (skipped) without an NVIDIA GPU,
# 0 when every check passed, 1 otherwise. Prints a summary table at the end. The CUDA libraries
# (cuFFT, cuBLASLt, ..., JAX, PyTorch: libraries.sh) run inside it against the same daemon.
#
# usage: gpu_suite.sh --build-dir BUILD
#        gpu_suite.sh --shim libmpsshim.so --daemon mpsshimd --ctl mpsshimctl
#                     [--server mpsshim-server] --examples-dir DIR
#                     [--programs-dir DIR] [--integrity integrity_vs_driver]
#                     [--libraries-dir DIR (tests/gpu/libraries' programs)]
#        [--work-dir DIR (kept; default a temporary one, removed on success)]
#        [--only PARTS (comma-separated, default all: examples, programs, integrity, libraries,
#                       multi, daemons, concurrency, quota, containment; the sections below)]
#        [--daemon-arg ARG]... (an mpsshimd option for the suite's daemon, e.g.
#                               --daemon-arg=--launch-batching=off: every check under the shim
#                               runs with it; the summary's first line names them)
# Environment: PROGRAM_TIMEOUT (seconds per example run, 300), RT_TIMEOUT (seconds per
# CUDA-runtime program run, 180).
set -u -o pipefail

SCRIPT_NAME=gpu_suite
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi

parse_paths "$@"
WORK_DIR=""
ONLY=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --daemon-arg) DAEMON_ARGS+=("$2"); shift 2 ;;
    --daemon-arg=*) DAEMON_ARGS+=("${1#--daemon-arg=}"); shift ;;
    *) die "unknown option $1" ;;
  esac
done
require_file shim "${SHIM:-}"
require_file daemon "${DAEMON:-}"
require_file ctl "${CTL:-}"
require_file examples-dir "${EXAMPLES_DIR:-}"
require_file examples-dir "$EXAMPLES_DIR/vector_add"  # not built when nvcc was missing
KEEP_WORK=1
if [ -z "$WORK_DIR" ]; then
  WORK_DIR=$(mktemp -d /tmp/mpsshim-gpu-suite.XXXXXX)
  KEEP_WORK=0
fi
mkdir -p "$WORK_DIR/logs"
LOGS=$WORK_DIR/logs

PARTS=",examples,programs,integrity,libraries,multi,daemons,concurrency,quota,containment,"
for part in ${ONLY//,/ }; do
  [[ $PARTS == *",$part,"* ]] || die "unknown part '$part' for --only (one of ${PARTS:1:-1})"
done
# wanted PART: whether this run checks PART (every part when --only was not given).
wanted() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

# ---- the summary table --------------------------------------------------------------------
ROWS=()
FAILURES=0
# add_row CHECK NATIVE SHIM VERDICT DETAIL (SKIP is not a failure)
add_row() {
  ROWS+=("$(printf '%-26s %-8s %-8s %-5s %s' "$1" "$2" "$3" "$4" "$5")")
  [ "$4" = PASS ] || [ "$4" = SKIP ] || FAILURES=$((FAILURES + 1))
  log "$4  $1: $5"
}

# shellcheck disable=SC2317  # called from the EXIT trap
print_summary() {
  echo
  echo "================================ mpsshim GPU suite ================================"
  nvidia-smi -L 2>/dev/null | head -n1 || true
  [ ${#DAEMON_ARGS[@]} -eq 0 ] || echo "mpsshimd options: ${DAEMON_ARGS[*]}"
  printf '%-26s %-8s %-8s %-5s %s\n' CHECK NATIVE SHIM RESULT DETAIL
  local row
  for row in "${ROWS[@]+"${ROWS[@]}"}"; do echo "$row"; done
  # What the programs reached that the shim does not implement (logged once per process at
  # warn level, so every shim run's stderr has it).
  local missing
  missing=$(grep -ahoE "[A-Za-z_0-9]+ is not implemented by mpsshim|its meaning is unknown.*|unknown table.*" \
    "$LOGS"/*.err 2>/dev/null | sort | uniq -c | sort -rn)
  echo "not implemented, reached by the programs under the shim: ${missing:+$'\n'}${missing:-none}"
  echo "logs: $LOGS"
  if [ "$FAILURES" -eq 0 ]; then echo "gpu_suite: ${#ROWS[@]} checks PASS or SKIP"; else
    echo "gpu_suite: $FAILURES of ${#ROWS[@]} checks FAIL"; fi
}

# shellcheck disable=SC2317  # the EXIT trap
cleanup() {
  daemon_stop
  print_summary
  [ "$KEEP_WORK" -eq 1 ] || [ "$FAILURES" -ne 0 ] || rm -rf "$WORK_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "work dir $WORK_DIR"
daemon_start "$WORK_DIR/run" "$LOGS/mpsshimd.log" || {
  add_row daemon_start - - FAIL "mpsshimd did not become ready; see $LOGS/mpsshimd.log"
  exit 1
}

# ---- 1. every example, natively and under the shim, same results -------------------------
# Fields that legitimately differ between the two runs (the SM count is the quota under the shim).
declare -A IGNORED=([smid_quota]="blocks distinct_sms reported_sms max_smid")

if wanted examples; then
  for name in vector_add matmul_tiled streams_events pinned_async small_kernels smid_quota; do
    exe=$EXAMPLES_DIR/$name
    read -ra ignored <<<"${IGNORED[$name]:-}"
    run_mode native "$LOGS/$name.native" "$exe"
    native_line=$(result_line "$LOGS/$name.native.out" "$name")
    run_mode shim "$LOGS/$name.shim" "$exe"
    shim_line=$(result_line "$LOGS/$name.shim.out" "$name")
    native_verdict=$(verdict "$native_line")
    shim_verdict=$(verdict "$shim_line")
    difference=$(diff <(result_fields "$native_line" "${ignored[@]}") \
      <(result_fields "$shim_line" "${ignored[@]}") | grep '^[<>]' | tr '\n' ' ')
    if [ "$native_verdict" = PASS ] && [ "$shim_verdict" = PASS ] && [ -z "$difference" ]; then
      compared=$(result_fields "$native_line" "${ignored[@]}")
      add_row "$name" PASS PASS PASS "$(wc -l <<<"$compared") result fields equal $(grep -E \
        '^(checksum|max_abs_err)=' <<<"$compared" | tr '\n' ' ')"
    elif [ "$native_verdict" = PASS ] && [ "$shim_verdict" = PASS ]; then
      add_row "$name" PASS PASS FAIL "results differ (< native, > shim): $difference"
    else
      add_row "$name" "$native_verdict" "$shim_verdict" FAIL \
        "native: ${native_line:-no result line} | shim: ${shim_line:-no result line}"
    fi
  done
fi

# ---- 1b. CUDA-runtime programs (tests/gpu/programs), natively and under the shim ------------
# nvcc-built programs with static cudart: the runtime's own path through the shim (private
# tables, integrity check, cuGetProcAddress) and the features of docs/cuda-runtime.md. Their
# result fields must agree.
RT_TIMEOUT=${RT_TIMEOUT:-180}
RT_PROGRAMS=(rt_vector_add rt_matmul_shared rt_streams_events rt_host_threads rt_per_thread_stream
  rt_pinned_mapped rt_managed rt_graph rt_malloc_async rt_cooperative rt_copy_2d rt_host_callback
  rt_texture rt_vmm rt_capture_to_graph rt_child_graph rt_ipc rt_stream_mem rt_vmm_share
  rt_stream_attributes rt_graph_nodes rt_copy_batch rt_control rt_tma_copy rt_profiler rt_pool_ipc
  rt_ctx_events rt_mipmap rt_green_ctx rt_decompress rt_sparse_array)
# Two GPUs at once (one device address space across their servers): only where there are two.
GPU_COUNT=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
if [ "$GPU_COUNT" -ge 2 ]; then
  RT_PROGRAMS+=(rt_two_gpus)
elif wanted programs; then
  add_row rt_two_gpus - - SKIP "one GPU: the multi-GPU programs need two"
fi
# The grid of a cooperative launch follows the SM count, which is the client's quota under the shim.
declare -A RT_IGNORED=([rt_cooperative]="blocks sms")

# why_no_line PREFIX STATUS: a short reason a run printed no result line.
why_no_line() {
  local reason="exit $2"
  [ "$2" = 124 ] && reason="timed out after ${RT_TIMEOUT}s"
  [ "$2" -gt 128 ] && [ "$2" != 124 ] && reason="killed by signal $(($2 - 128))"
  local last
  last=$(grep -av '^\s*$' "$1.err" 2>/dev/null | tail -n1 | cut -c1-200)
  echo "$reason${last:+; stderr: $last}"
}

# run_rt MODE NAME: runs one program; sets RT_LINE (result line or "") and RT_WHY.
run_rt() {
  local status=0
  PROGRAM_TIMEOUT=$RT_TIMEOUT run_mode "$1" "$LOGS/$2.$1" "$PROGRAMS_DIR/$2" || status=$?
  RT_LINE=$(result_line "$LOGS/$2.$1.out" "$2")
  RT_WHY=""
  [ -n "$RT_LINE" ] || RT_WHY="$1: no result line ($(why_no_line "$LOGS/$2.$1" "$status"))"
  [ "$status" = 0 ] || [ "$(verdict "$RT_LINE")" != PASS ] ||
    RT_WHY="$1: printed PASS but exited $status"
}

if ! wanted programs; then
  :
elif [ -z "${PROGRAMS_DIR:-}" ] || [ ! -x "$PROGRAMS_DIR/rt_vector_add" ]; then
  add_row "cuda runtime programs" - - FAIL \
    "not built in ${PROGRAMS_DIR:-?} (nvcc missing at configure time?)"
else
  for name in "${RT_PROGRAMS[@]}"; do
    if [ ! -x "$PROGRAMS_DIR/$name" ]; then
      add_row "$name" - - FAIL "$PROGRAMS_DIR/$name not built"
      continue
    fi
    read -ra ignored <<<"${RT_IGNORED[$name]:-}"
    run_rt native "$name"
    native_line=$RT_LINE native_why=$RT_WHY
    run_rt shim "$name"
    shim_line=$RT_LINE shim_why=$RT_WHY
    native_verdict=$(verdict "$native_line")
    shim_verdict=$(verdict "$shim_line")
    [ -z "$native_why" ] || native_verdict=FAIL
    [ -z "$shim_why" ] || shim_verdict=FAIL
    difference=$(diff <(result_fields "$native_line" "${ignored[@]}") \
      <(result_fields "$shim_line" "${ignored[@]}") | grep '^[<>]' | tr '\n' ' ')
    if [ "$native_verdict$shim_verdict" = PASSPASS ] && [ -z "$difference" ]; then
      compared=$(result_fields "$native_line" "${ignored[@]}")
      add_row "$name" PASS PASS PASS "$(wc -l <<<"$compared") result fields equal $(grep -E \
        '^checksum=' <<<"$compared" | tr '\n' ' ')"
    elif [ "$native_verdict$shim_verdict" = PASSPASS ]; then
      add_row "$name" PASS PASS FAIL "results differ (< native, > shim): $difference"
    else
      add_row "$name" "$native_verdict" "$shim_verdict" FAIL \
        "native: ${native_why:-$native_line} | shim: ${shim_why:-$shim_line}"
    fi
  done
fi

# ---- 1c. the integrity check: mpsshim's algorithm against the real driver (private-tables.md) --
if ! wanted integrity; then
  :
elif [ -z "${INTEGRITY:-}" ] || [ ! -x "$INTEGRITY" ]; then
  add_row "integrity vs driver" - - FAIL "integrity_vs_driver not built (${INTEGRITY:-?})"
else
  status=0
  PROGRAM_TIMEOUT=60 run_mode native "$LOGS/integrity" "$INTEGRITY" || status=$?
  line=$(result_line "$LOGS/integrity.out" integrity_vs_driver)
  detail="cases=$(field "$line" cases) mismatches=$(field "$line" mismatches)"
  detail+=" devices=$(field "$line" devices) driver_version=$(field "$line" driver_version)"
  if [ "$status" = 0 ] && [ "$(verdict "$line")" = PASS ]; then
    add_row "integrity vs driver" PASS - PASS "$detail: byte for byte"
  elif [ "$status" = "$SKIP_STATUS" ]; then
    add_row "integrity vs driver" SKIP - FAIL "skipped on a GPU machine: $(tail -n1 "$LOGS/integrity.out")"
  else
    add_row "integrity vs driver" "$(verdict "$line")" - FAIL \
      "${line:+$detail; }$(grep -a -m3 MISMATCH "$LOGS/integrity.out" | cut -c1-160 | tr '\n' ' ')$(
        [ -n "$line" ] || why_no_line "$LOGS/integrity" "$status")"
  fi
fi

# ---- 1d. the CUDA libraries (tests/gpu/libraries.sh): cuFFT, cuBLASLt, cuSPARSE, cuRAND, cuDNN,
# JAX, PyTorch, CuPy, numba, natively and under this daemon; their logs join ours, so the
# "not implemented" summary covers them. SKIP rows (a Python module not installed) do not fail.
if wanted libraries; then
  library_rows=$WORK_DIR/library_rows.tsv
  : >"$library_rows"
  bash "$(dirname "${BASH_SOURCE[0]}")/libraries.sh" --shim "$SHIM" --ctl "$CTL" \
    ${LIBRARIES_DIR:+--libraries-dir "$LIBRARIES_DIR"} --runtime-dir "$SHIM_RUNTIME_DIR" \
    --logs-dir "$LOGS" --rows "$library_rows" 2>>"$LOGS/libraries.log"
  while IFS=$'\t' read -r check native shim result detail; do
    if [ "$result" = SKIP ]; then
      ROWS+=("$(printf '%-26s %-8s %-8s %-5s %s' "$check" "$native" "$shim" SKIP "$detail")")
      log "SKIP  $check: $detail"
    else
      add_row "$check" "$native" "$shim" "$result" "$detail"
    fi
  done <"$library_rows"
  [ -s "$library_rows" ] || add_row "cuda libraries" - - FAIL \
    "libraries.sh gave no rows; see $LOGS/libraries.log"
fi

# ---- 1e. several GPUs (--multi-gpu; skipped on one GPU): PyTorch on two GPUs in one process, ---
# NCCL collectives and DDP between processes (one GPU each), natively and under the shim; result
# fields must agree (figures such as gbps, busbw and latency are left out).
MULTI_DIR="$(dirname "${BASH_SOURCE[0]}")/multi"
MULTI_TIMEOUT=${MULTI_TIMEOUT:-240}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
multi_check() {  # NAME SCRIPT [ARGS...]
  local name=$1 script=$2
  shift 2
  local native_line shim_line status=0
  PROGRAM_TIMEOUT=$MULTI_TIMEOUT run_mode native "$LOGS/$name.native" python3 "$MULTI_DIR/$script" "$@"
  PROGRAM_TIMEOUT=$MULTI_TIMEOUT run_mode shim "$LOGS/$name.shim" python3 "$MULTI_DIR/$script" "$@" ||
    status=$?
  native_line=$(grep -a "^${script%.py}: " "$LOGS/$name.native.out" | sort | tr '\n' ' ')
  shim_line=$(grep -a "^${script%.py}: " "$LOGS/$name.shim.out" | sort | tr '\n' ' ')
  local native_fields shim_fields
  native_fields=$(result_fields "$native_line" gbps busbw_256mib lat_8kib_us)
  shim_fields=$(result_fields "$shim_line" gbps busbw_256mib lat_8kib_us)
  if [ -n "$shim_line" ] && [ "$status" = 0 ] && [ "$native_fields" = "$shim_fields" ] &&
    ! grep -q FAIL <<<"$native_line$shim_line"; then
    add_row "$name" PASS PASS PASS "shim: $(cut -c1-200 <<<"$shim_line")"
  else
    add_row "$name" "$(grep -q PASS <<<"$native_line" && echo PASS || echo FAIL)" \
      "$(grep -q PASS <<<"$shim_line" && [ "$status" = 0 ] && echo PASS || echo FAIL)" FAIL \
      "native: ${native_line:-none} | shim (exit $status): ${shim_line:-$(why_no_line "$LOGS/$name.shim" "$status")}"
  fi
}
if ! wanted multi; then
  :
elif [ "$GPU_COUNT" -ge 2 ] && python3 -c "import torch" 2>/dev/null; then
  multi_check "torch two GPUs" torch_two_gpus.py
  # The same with PyTorch's stream-ordered allocator (cudaMallocAsync pools on both GPUs).
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync multi_check "torch two GPUs, async allocator" \
    torch_two_gpus.py
  multi_check "nccl collectives + ddp" nccl_collectives.py
  # NCCL's P2P buffers through cudaIpc handles instead of VMM fds: IPC across GPUs' servers.
  NCCL_CUMEM_ENABLE=0 multi_check "nccl over cuda ipc" nccl_collectives.py
  # One GPU per rank: each imports memory of a GPU it does not see.
  multi_check "nccl, one gpu per rank" nccl_collectives.py --one-gpu-each
else
  add_row "several GPUs" - - SKIP "$GPU_COUNT GPU(s) or no PyTorch: the multi-GPU checks need two"
fi

# ---- 1f. checks that start their own daemon from the build tree: a live quota change, static SM
# partitions, host functions and stream-ordered allocation (each exits 0 when it held, 77 when
# it cannot run here, else 1; its output is in $LOGS).
BUILD_ROOT=$(cd "$(dirname "$SHIM")/.." 2>/dev/null && pwd)
if wanted daemons; then
  for script in live_quota_check partition_check hostfn_check suspend_check preemption_check; do
    if [ ! -x "$BUILD_ROOT/broker/daemon/mpsshimd" ]; then
      add_row "$script" - - FAIL "no build tree around $SHIM (run with --build-dir)"
      continue
    fi
    status=0
    timeout 600 bash "$(dirname "${BASH_SOURCE[0]}")/$script.sh" "$BUILD_ROOT" "$WORK_DIR/$script" \
      >"$LOGS/$script.out" 2>&1 || status=$?
    last=$(grep -av '^\s*$' "$LOGS/$script.out" | tail -n1 | cut -c1-160)
    case "$status" in
      0) add_row "$script" - PASS PASS "$last" ;;
      77) add_row "$script" - SKIP SKIP "$last" ;;
      *) add_row "$script" - FAIL FAIL "exit $status: $last (see $LOGS/$script.out)" ;;
    esac
  done

  # Isolation groups on the real driver (one client's kernel reading another's memory, per
  # placement), out of memory (the library programs beside a hog and under a memory limit) and
  # NVML as a client sees its share (nvidia-smi and pynvml with libmpsshim-nvml.so): each starts
  # its own daemons and prints its table in $LOGS.
  for script in isolation_check oom_matrix nvml_view; do
    status=0
    timeout 600 bash "$(dirname "${BASH_SOURCE[0]}")/$script.sh" --build-dir "$BUILD_ROOT" \
      --work-dir "$WORK_DIR/$script" >"$LOGS/$script.out" 2>&1 || status=$?
    last=$(grep -av '^\s*$' "$LOGS/$script.out" | tail -n1 | cut -c1-160)
    case "$status" in
      0) add_row "$script" - PASS PASS "$last" ;;
      77) add_row "$script" - SKIP SKIP "$last" ;;
      *) add_row "$script" - FAIL FAIL "exit $status: $last (see $LOGS/$script.out)" ;;
    esac
  done
fi

# ---- 2. 8 concurrent copies of small_kernels: the shim must overlap them ---------------------
if wanted concurrency; then
  COPIES=8
  run_small_kernel_copies native 1 "$LOGS/small1.native"
  native_one=$COPIES_MEAN_S
  run_small_kernel_copies native "$COPIES" "$LOGS/small$COPIES.native"
  native_ok=$COPIES_OK native_wall=$COPIES_WALL_S native_mean=$COPIES_MEAN_S
  run_small_kernel_copies shim 1 "$LOGS/small1.shim"
  shim_one_ok=$COPIES_OK shim_one=$COPIES_MEAN_S
  run_small_kernel_copies shim "$COPIES" "$LOGS/small$COPIES.shim"
  shim_ok=$COPIES_OK shim_wall=$COPIES_WALL_S shim_mean=$COPIES_MEAN_S shim_late=$COPIES_LATE_MS
  detail="1 copy: native ${native_one}s shim ${shim_one}s; $COPIES copies wall:"
  detail+=" native ${native_wall}s (per-process ${native_mean}s)"
  detail+=" shim ${shim_wall}s (per-process ${shim_mean}s)"
  [ "$shim_late" = "0.0" ] || detail+="; a shim copy started ${shim_late} ms late"
  overlap=$(awk -v w="$shim_wall" -v one="$shim_one" 'BEGIN { print (w < 4 * one) ? "yes" : "no" }')
  if [ "$native_ok$shim_ok$shim_one_ok" = 111 ] && [ "$overlap" = yes ]; then
    add_row "small_kernels x$COPIES overlap" PASS PASS PASS "$detail; shim wall < 4 x 1-copy"
  else
    add_row "small_kernels x$COPIES overlap" "$([ "$native_ok" = 1 ] && echo PASS || echo FAIL)" \
      "$([ "$shim_ok" = 1 ] && echo PASS || echo FAIL)" FAIL \
      "$detail; need all PASS and shim wall < 4 x shim 1-copy"
  fi
fi

# ---- 3. SM quota: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 --------------------------------------
if wanted quota; then
  run_mode native "$LOGS/smid_quota.full" "$EXAMPLES_DIR/smid_quota"
  native_sms=$(field "$(result_line "$LOGS/smid_quota.full.out" smid_quota)" reported_sms)
  run_mode shim "$LOGS/smid_quota.q25" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 "$EXAMPLES_DIR/smid_quota"
  quota_line=$(result_line "$LOGS/smid_quota.q25.out" smid_quota)
  distinct=$(field "$quota_line" distinct_sms)
  reported=$(field "$quota_line" reported_sms)
  quota_check=$(awk -v d="${distinct:-x}" -v r="${reported:-x}" -v n="${native_sms:-x}" 'BEGIN {
    if (d == "x" || r == "x" || n == "x" || n <= 0) { print "no figures"; exit }
    share = r / n
    ok = (d <= r) && (r <= 0.35 * n) && (share >= 0.15)
    printf "%s %.1f%%\n", ok ? "ok" : "bad", 100 * share }')
  detail="25% quota: distinct_sms=${distinct:-?} reported_sms=${reported:-?} of ${native_sms:-?}"
  detail+=" native (${quota_check#* })"
  if [ "$(verdict "$quota_line")" = PASS ] && [ "${quota_check%% *}" = ok ]; then
    add_row "smid_quota 25%" - PASS PASS "$detail"
  else
    add_row "smid_quota 25%" - "$(verdict "$quota_line")" FAIL \
      "$detail; need distinct <= reported <= 0.35 x native, reported >= 0.15 x native"
  fi

  # ---- 3b. graph kernels stay in the quota: captured and hand-built kernel nodes -------------
  if [ -x "$PROGRAMS_DIR/rt_graph_quota" ]; then
    run_mode shim "$LOGS/rt_graph_quota.q25" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 \
      "$PROGRAMS_DIR/rt_graph_quota"
    graph_line=$(result_line "$LOGS/rt_graph_quota.q25.out" rt_graph_quota)
    g_reported=$(field "$graph_line" reported_sms)
    g_captured=$(field "$graph_line" distinct_captured)
    g_node=$(field "$graph_line" distinct_node)
    graph_check=$(awk -v r="${g_reported:-x}" -v n="${native_sms:-x}" 'BEGIN {
      if (r == "x" || n == "x" || n <= 0) { print "no"; exit }
      print (r <= 0.35 * n) ? "ok" : "no" }')
    detail="25% quota: reported_sms=${g_reported:-?} of ${native_sms:-?}; captured kernel on"
    detail+=" ${g_captured:-?} SMs, hand-built node on ${g_node:-?} SMs"
    if [ "$(verdict "$graph_line")" = PASS ] && [ "$graph_check" = ok ]; then
      add_row "graph quota 25%" - PASS PASS "$detail"
    else
      add_row "graph quota 25%" - "$(verdict "$graph_line")" FAIL \
        "$detail; need each <= reported <= 0.35 x native | ${graph_line:-no result line}"
    fi
  fi

  # ---- 3c. a client's own green contexts are carved out of its quota --------------------------
  if [ -x "$PROGRAMS_DIR/rt_green_ctx" ]; then
    run_mode shim "$LOGS/rt_green_ctx.q50" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 \
      "$PROGRAMS_DIR/rt_green_ctx"
    green_line=$(result_line "$LOGS/rt_green_ctx.q50.out" rt_green_ctx)
    green_device=$(field "$green_line" device_sms)
    green_check=$(awk -v r="${green_device:-x}" -v n="${native_sms:-x}" 'BEGIN {
      if (r == "x" || n == "x" || n <= 0) { print "no"; exit }
      print (r <= 0.6 * n) ? "ok" : "no" }')
    detail="50% quota: the device's SM resource ${green_device:-?} of ${native_sms:-?} SMs; a green"
    detail+=" context of $(field "$green_line" green_sms) ran on $(field "$green_line" seen) SMs,"
    detail+=" within the quota's: $(field "$green_line" within)"
    if [ "$(verdict "$green_line")" = PASS ] && [ "$green_check" = ok ]; then
      add_row "green contexts in a 50% quota" - PASS PASS "$detail"
    else
      add_row "green contexts in a 50% quota" - "$(verdict "$green_line")" FAIL \
        "$detail; need the resource <= 0.6 x native | ${green_line:-no result line}"
    fi
  fi
fi

# ---- 4. crash containment: a faulting client, then a fresh client --------------------------
# fault_check NAME TAG [fault's arguments]: the fault example natively and under the shim; both
# must report the sticky error at the synchronize, and under the shim the client must be told
# that its own work returned the fault first (docs/isolation.md, "Which client faulted").
fault_check() {
  local name=$1 tag=$2
  shift 2
  run_mode native "$LOGS/$tag.native" "$EXAMPLES_DIR/fault" "$@"
  local native_fault shim_fault detail
  native_fault=$(result_line "$LOGS/$tag.native.out" fault)
  run_mode shim "$LOGS/$tag.shim" "$EXAMPLES_DIR/fault" "$@"
  shim_fault=$(result_line "$LOGS/$tag.shim.out" fault)
  detail="native sync=$(field "$native_fault" sync), shim sync=$(field "$shim_fault" sync)"
  local named=no
  grep -q "this process's own work (fault) returned it first" "$LOGS/$tag.shim.err" && named=yes
  detail+="; culprit named to itself: $named"
  if [ "$(verdict "$shim_fault")" = PASS ] && [ "$(verdict "$native_fault")" = PASS ] &&
    [ "$named" = yes ]; then
    add_row "$name" PASS PASS PASS "$detail"
  else
    add_row "$name" "$(verdict "$native_fault")" "$(verdict "$shim_fault")" FAIL \
      "$detail | native: ${native_fault:-no result line} | shim: ${shim_fault:-no result line}"
  fi
}

# fresh_client_check NAME TAG: the daemon replaces the poisoned server; a new client must work.
# Retries show how long that took (each try is a whole new process).
fresh_client_check() {
  local name=$1 tag=$2 attempt=0 after_line=""
  while [ "$attempt" -lt 10 ]; do
    attempt=$((attempt + 1))
    run_mode shim "$LOGS/$tag.$attempt" "$EXAMPLES_DIR/vector_add"
    after_line=$(result_line "$LOGS/$tag.$attempt.out" vector_add)
    [ "$(verdict "$after_line")" = PASS ] && break
    sleep 1
  done
  if [ "$(verdict "$after_line")" = PASS ] &&
    "$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" server_list >"$LOGS/server_list.$tag" 2>&1; then
    add_row "$name" - PASS PASS "vector_add PASS on attempt $attempt; mpsshimctl server_list answers"
  else
    add_row "$name" - "$(verdict "$after_line")" FAIL \
      "after $attempt attempts: ${after_line:-no result line}; see $LOGS/mpsshimd.log"
  fi
}

if wanted containment; then
  fault_check "fault (sticky error)" fault
  fresh_client_check "fresh client after fault" after_fault
  # The fault comes after a 20 ms kernel: the server's wait for the synchronize's fence word has
  # asked about a fault several times by then, ever less often (host_fences.hpp).
  fault_check "fault after 20 ms of work" fault_late --spin-ns 20000000
  fresh_client_check "fresh client after that" after_fault_late
fi

exit $((FAILURES == 0 ? 0 : 1))
