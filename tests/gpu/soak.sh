#!/usr/bin/env bash
# The soak: N clients (default 64) of mixed work under one mpsshimd for a given time, clients
# coming and going and some SIGKILLed, while the server's resident memory, open fds and the GPU's
# memory are sampled into a CSV (and a PNG plot when matplotlib imports). Exits 77 without an
# NVIDIA GPU (unless --test-driver), 0 when it held, 1 on any client error, a server restart, or
# growth beyond the tolerances below. docs/testing.md ("Soak") says how to run it for hours.
#
# usage: soak.sh --build-dir BUILD [--minutes M (8)] [--clients N (64)] [--interval S (5)]
#                [--kill-percent P (10)] [--resnet-clients R (8)] [--gpu INDEX (0)]
#                [--daemon-arg ARG]... (passed to mpsshimd, e.g. --daemon-arg --host-fences=off)
#                [--work-dir DIR (kept)] [--test-driver LIBMPSSHIM_TESTDRIVER.so]
#                [--no-warm-up]
#                [--pressure [--pressure-clients K (CLIENTS/8, at least 2)] [--hog-leave SIZE (24G;
#                 15G on the test driver)] [--oom-limit SIZE (256M; 128M on the test driver)]
#                 [--small-limit SIZE (256M)]]
#
# Each client slot runs one program after another, each picked at random: examples/small_kernels
# (small kernels), examples/vector_add and examples/pinned_async (pageable and pinned copies),
# examples/streams_events, examples/matmul_tiled and, in the first R slots when torch and
# torchvision import, bench/resnet_client.py (ResNet-50 inference). A run passes when it exits 0
# and prints its PASS line; P % of runs are SIGKILLed at a random instant (0.2 to 3.2 s in) and
# count as killed, not as errors. Before the slots start, one run of each program alone warms the
# server up (--no-warm-up skips it): its runs count like the others, its samples are not read,
# and --minutes counts from its end.
#
# Checks, on the samples taken while the clients run: each figure less what the clients attached
# at that instant account for (a least-squares fit of the figure on the client count, and on the
# count of --pressure oom clients apart, over the whole run, so that a quarter with more clients
# attached is no growth), the median of the last quarter against the median of the first:
#   server RSS     growth <= max(RSS_TOLERANCE_MIB (64), RSS_TOLERANCE_PCT (10) % of the first)
#   server fds     growth <= FD_TOLERANCE (16)
#   GPU memory     growth <= GPU_TOLERANCE_MIB (512)  (nvidia-smi --query-gpu=memory.used)
# and after the last client left: server fds <= FD_TOLERANCE over the count before the first
# client, every client run passed or was killed (or, a --pressure limit run, ran out of memory),
# the server is the same process, never restarted. The tolerances are environment variables of
# the same names.
#
# --pressure adds memory pressure beside that mix (off by default):
#   - a memory hog, tests/gpu/python/memory_hog.py --leave SIZE, a client of the same server that
#     holds all of GPU 0 but --hog-leave bytes from before the warm-up to the end, when it must
#     find its bytes intact (anything else fails the soak);
#   - K more slots, each running one of these after another, picked at random:
#       oom    examples/oom_then_work under CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=--oom-limit:
#              allocates until cuMemAlloc returns CUDA_ERROR_OUT_OF_MEMORY (any other error fails
#              it), frees everything, runs a kernel and checks it; it must pass;
#       limit  one of the example programs above under CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=
#              --small-limit: it passes, or fails with CUDA_ERROR_OUT_OF_MEMORY (counted apart,
#              no error); any other failure is an error;
#       jax    tests/gpu/python/jax_check.py, on a GPU where jax imports and finds the GPU
#              natively (never on the test driver); it must pass.
#     The oom clients run out of their own limit, not of the GPU: one that emptied the whole GPU
#     would make the other clients' allocations fail at random, and those must all pass.
#     The warm-up runs each kind once. The summary gives runs and errors per kind.
#
# --test-driver runs the same on the host-memory test driver (no GPU; its device memory in use,
# read from its query socket, stands for the GPU's): how the script's own logic is tested on CPU.
set -u -o pipefail

SCRIPT_NAME=soak
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SOURCE_DIR=$(realpath "$(dirname "${BASH_SOURCE[0]}")/../..")

RSS_TOLERANCE_MIB=${RSS_TOLERANCE_MIB:-64}
RSS_TOLERANCE_PCT=${RSS_TOLERANCE_PCT:-10}
FD_TOLERANCE=${FD_TOLERANCE:-16}
GPU_TOLERANCE_MIB=${GPU_TOLERANCE_MIB:-512}
PROGRAM_TIMEOUT=${PROGRAM_TIMEOUT:-300}

parse_paths "$@"
MINUTES=8 CLIENTS=64 INTERVAL=5 KILL_PERCENT=10 RESNET_CLIENTS=8 GPU_INDEX=0 WORK_DIR="" WARM_UP=1
TEST_DRIVER=""
PRESSURE=0 PRESSURE_CLIENTS="" HOG_LEAVE="" OOM_LIMIT="" SMALL_LIMIT=256M
PRESSURE_OPTIONS=()  # the --pressure-only options given, so that one without --pressure is refused
DAEMON_ARGS=()
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --interval) INTERVAL=$2; shift 2 ;;
    --kill-percent) KILL_PERCENT=$2; shift 2 ;;
    --resnet-clients) RESNET_CLIENTS=$2; shift 2 ;;
    --gpu) GPU_INDEX=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --test-driver) TEST_DRIVER=$(realpath "$2"); shift 2 ;;
    --daemon-arg) DAEMON_ARGS+=("$2"); shift 2 ;;
    --no-warm-up) WARM_UP=0; shift ;;
    --pressure) PRESSURE=1; shift ;;
    --pressure-clients) PRESSURE_CLIENTS=$2; PRESSURE_OPTIONS+=("$1"); shift 2 ;;
    --hog-leave) HOG_LEAVE=$2; PRESSURE_OPTIONS+=("$1"); shift 2 ;;
    --oom-limit) OOM_LIMIT=$2; PRESSURE_OPTIONS+=("$1"); shift 2 ;;
    --small-limit) SMALL_LIMIT=$2; PRESSURE_OPTIONS+=("$1"); shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
if [ "$PRESSURE" = 0 ] && [ "${#PRESSURE_OPTIONS[@]}" -gt 0 ]; then
  die "${PRESSURE_OPTIONS[*]} given without --pressure, the only case they apply to"
fi
# A size as memory_hog.py and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT read it: bytes, or a number with
# K, M or G.
is_size() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?[KMG]?$ ]]; }
if [ "$PRESSURE" = 1 ]; then
  # The test driver's device has 16 GiB of host memory behind it: 15G left free holds 1 GiB,
  # enough to be a bystander without weighing on the machine running the CPU test.
  [ -n "$HOG_LEAVE" ] || HOG_LEAVE=$([ -n "$TEST_DRIVER" ] && echo 15G || echo 24G)
  # What an oom client holds at its peak is noise on the GPU memory samples (GPU_TOLERANCE_MIB
  # 512): the CPU test's quarters are a sample or two, and its 2 pressure slots may both be at
  # their peak in one.
  [ -n "$OOM_LIMIT" ] || OOM_LIMIT=$([ -n "$TEST_DRIVER" ] && echo 128M || echo 256M)
  [ -n "$PRESSURE_CLIENTS" ] || PRESSURE_CLIENTS=$((CLIENTS / 8 > 2 ? CLIENTS / 8 : 2))
  [[ "$PRESSURE_CLIENTS" =~ ^[0-9]+$ ]] || die "--pressure-clients $PRESSURE_CLIENTS is not a count"
  for size in "$HOG_LEAVE" "$OOM_LIMIT" "$SMALL_LIMIT"; do
    is_size "$size" || die "$size is not a size (bytes, or a number with K, M or G: 512M, 24G)"
  done
fi

if [ -z "$TEST_DRIVER" ] && ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi
require_file shim "${SHIM:-}"
require_file daemon "${DAEMON:-}"
require_file ctl "${CTL:-}"
require_file examples-dir "$EXAMPLES_DIR/small_kernels"
[ -z "$TEST_DRIVER" ] || require_file test-driver "$TEST_DRIVER"
HOG_SCRIPT=$SOURCE_DIR/tests/gpu/python/memory_hog.py
JAX_SCRIPT=$SOURCE_DIR/tests/gpu/python/jax_check.py
if [ "$PRESSURE" = 1 ]; then
  [ -x "$EXAMPLES_DIR/oom_then_work" ] ||
    die "--pressure runs $EXAMPLES_DIR/oom_then_work, which is not there (a build without it?)"
  [ -f "$HOG_SCRIPT" ] || die "--pressure runs $HOG_SCRIPT, which is not there"
fi
DURATION_S=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 }')
[ "$DURATION_S" -gt 0 ] || die "--minutes $MINUTES is not a positive duration"

[ -n "$WORK_DIR" ] || WORK_DIR=$(mktemp -d /tmp/mpsshim-soak.XXXXXX)
mkdir -p "$WORK_DIR/logs"
LOGS=$WORK_DIR/logs
CSV=$WORK_DIR/soak.csv
RESULTS=$WORK_DIR/runs.txt    # one line per client run: pass|killed|error NAME [details]
STOP_FILE=$WORK_DIR/stop
rm -f "$STOP_FILE" "$RESULTS"
: >"$RESULTS"

# ---- JAX, for --pressure ---------------------------------------------------------------------
# Natively and before mpsshimd starts, so that the answer is about JAX and the GPU alone: a JAX
# that imports but has no CUDA backend would otherwise fail every run under the shim (jax_check.py
# exits 77 then).
HAVE_JAX=0
if [ "$PRESSURE" = 1 ]; then
  if [ -n "$TEST_DRIVER" ]; then
    log "no JAX clients: --test-driver (XLA needs a real GPU)"
  elif env -u LD_PRELOAD -u CUDA_MPS_PIPE_DIRECTORY XLA_PYTHON_CLIENT_PREALLOCATE=false \
    timeout 300 python3 -c 'import jax; jax.devices("gpu")' >/dev/null 2>&1; then
    HAVE_JAX=1
  else
    log "no JAX clients: jax does not import or finds no GPU natively" \
      "(python3 -c 'import jax; jax.devices(\"gpu\")')"
  fi
fi

# ---- the daemon -----------------------------------------------------------------------------
if [ -n "$TEST_DRIVER" ]; then
  DAEMON_ARGS+=(--driver "$TEST_DRIVER")
  export MPSSHIM_TESTDRIVER_QUERY_SOCKET=$WORK_DIR/testdriver-query
fi
SLOT_PIDS=()
HOG_PID=""
# shellcheck disable=SC2317  # the EXIT trap
cleanup() {
  touch "$STOP_FILE"
  local pid
  for pid in "${SLOT_PIDS[@]+"${SLOT_PIDS[@]}"}"; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ -n "$HOG_PID" ]; then  # a soak that died before checking it
    kill "$HOG_PID" 2>/dev/null
    wait "$HOG_PID" 2>/dev/null
  fi
  daemon_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "work dir $WORK_DIR; $CLIENTS clients for $MINUTES min, a sample every $INTERVAL s"
daemon_start "$WORK_DIR/run" "$LOGS/mpsshimd.log" || die "mpsshimd did not become ready"

ctl() { "$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" "$@"; }

# GPU 0's server: "PID RESTARTS" from server_list (GPU PID STATE RESTARTS ...).
server_pid_restarts() {
  ctl server_list 2>/dev/null | awk -v g="$GPU_INDEX" '$1 == g { print $2, $4; exit }'
}

# The GPU memory in use, MiB: nvidia-smi's, or the test driver's device memory in use.
gpu_memory_mib() {
  if [ -n "$TEST_DRIVER" ]; then
    python3 - "$MPSSHIM_TESTDRIVER_QUERY_SOCKET" <<'EOF' 2>/dev/null || echo nan
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
line = s.makefile().readline()
fields = dict(kv.split("=") for kv in line.split())
print(f"{int(fields['device_bytes']) / 2**20:.1f}")
EOF
  else
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" 2>/dev/null |
      head -n1 | tr -d ' ' || echo nan
  fi
}

# One CSV line: phase,t_s,server_pid,restarts,clients,rss_kib,fds,gpu_mem_mib,anon_kib,heap_kib,
# driver_kib,torch_clients,oom_clients (phase: idle before the first client, hog once the
# --pressure memory hog holds its memory, warm after the warm-up, run, after the last client left;
# anon/heap/driver split the server's resident memory by mapping, from /proc/PID/smaps:
# anonymous mappings (glibc's per-thread arenas among them), the main [heap], and what the
# driver mapped through /dev/nvidia* (its pinned host memory), so that growth can be told apart;
# torch_clients: the attached clients that are Python (PyTorch, and JAX under --pressure)
# programs, whose kernel images cost the server far more than an example's, less the --pressure
# memory hog (ctypes alone, no kernels), told by its command line; oom_clients: the attached
# oom_then_work clients, each of which holds up to --oom-limit of device memory at its peak).
sample() {
  local pid_restarts pid restarts rss fds clients split torch oom gpu
  pid_restarts=$(server_pid_restarts)
  pid=${pid_restarts% *}
  restarts=${pid_restarts#* }
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
  fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  read -r clients torch oom < <(ctl ps --json 2>/dev/null | python3 -c '
import json, os, sys

def cmdline(pid):
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except Exception:  # gone since the table was made: not the hog, which stays
        return ""

try:
    c = json.load(sys.stdin)["clients"]
    python = [x for x in c if str(x.get("program", "")).startswith("python")]
    torch = [x for x in python if "memory_hog.py" not in cmdline(x.get("pid"))]
    oom = [x for x in c
           if os.path.basename(str(x.get("program", ""))).startswith("oom_then_work")]
    print(len(c), len(torch), len(oom))
except Exception:
    print("nan nan nan")')
  # Right after the client table: an oom_then_work client holds its --oom-limit for a fraction of
  # a second, so the GPU memory read later would often not match the oom_clients count.
  gpu=$(gpu_memory_mib)
  split=$(awk '/^[0-9a-f]+-[0-9a-f]+ / { name = $6 }
               /^Rss:/ { if (name == "") a += $2; else if (name == "[heap]") h += $2;
                         else if (name ~ /^\/dev\/nvidia/) d += $2 }
               END { printf "%d,%d,%d", a, h, d }' "/proc/$pid/smaps" 2>/dev/null)
  printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$1" "$((SECONDS - START_S))" "${pid:-nan}" \
    "${restarts:-nan}" "${clients:-nan}" "${rss:-nan}" "$fds" "$gpu" \
    "${split:-nan,nan,nan}" "${torch:-nan}" "${oom:-nan}"
}

# ---- the client slots -----------------------------------------------------------------------
HAVE_TORCH=0
if [ -z "$TEST_DRIVER" ] && [ "$RESNET_CLIENTS" -gt 0 ] &&
  env -u LD_PRELOAD python3 -c 'import torch, torchvision' 2>/dev/null; then
  HAVE_TORCH=1
else
  log "no ResNet clients (torch/torchvision not importable, --test-driver or --resnet-clients 0)"
fi

# pick_program SLOT: sets the next run of an ordinary slot (program_command says what).
# shellcheck disable=SC2317  # called by name, through run_slot's PICK
pick_program() {
  local choices=(small_kernels small_kernels vector_add pinned_async streams_events matmul_tiled)
  [ "$HAVE_TORCH" = 1 ] && [ "$1" -lt "$RESNET_CLIENTS" ] && choices+=(resnet resnet resnet)
  program_command "${choices[$((RANDOM % ${#choices[@]}))]}"
}

# program_command CHOICE: sets, for one run of that program, NAME (the name its result line
# starts with), LABEL (its name in RESULTS and the summary), COMMAND (argv), RUN_ENV (extra
# NAME=VALUE words for its environment) and ALLOW_OOM (1: a failure with CUDA_ERROR_OUT_OF_MEMORY
# is no error).
program_command() {
  NAME=$1 RUN_ENV=() ALLOW_OOM=0
  case "$NAME" in
    small_kernels) COMMAND=("$EXAMPLES_DIR/small_kernels" --kernels 2000 --ns 20000) ;;
    vector_add) COMMAND=("$EXAMPLES_DIR/vector_add" --n $((1 << 22))) ;;
    pinned_async) COMMAND=("$EXAMPLES_DIR/pinned_async") ;;
    streams_events) COMMAND=("$EXAMPLES_DIR/streams_events") ;;
    matmul_tiled) COMMAND=("$EXAMPLES_DIR/matmul_tiled") ;;
    resnet)
      NAME=resnet_client
      COMMAND=(python3 "$SOURCE_DIR/bench/resnet_client.py" --no-wait --warmup 3 --iters 60)
      ;;
    oom_then_work) COMMAND=("$EXAMPLES_DIR/oom_then_work") ;;  # --pressure's
    jax_check) COMMAND=(python3 "$JAX_SCRIPT") ;;               # --pressure's
    *) die "program_command: no program $NAME" ;;
  esac
  LABEL=$NAME
}

# pick_pressure SLOT: sets the next run of a --pressure slot, a kind at random.
# shellcheck disable=SC2317  # called by name, through run_slot's PICK
pick_pressure() {
  local choices=(oom oom limit limit)
  [ "$HAVE_JAX" = 1 ] && choices+=(jax)
  pressure_command "${choices[$((RANDOM % ${#choices[@]}))]}"
}

# pressure_command KIND [PROGRAM]: as program_command, for one run of a --pressure kind (oom,
# limit, jax; limit runs PROGRAM, or an example at random). LABEL is KIND:NAME, so that the
# summary can count runs per kind.
pressure_command() {
  case "$1" in
    oom)
      program_command oom_then_work
      RUN_ENV=(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="$OOM_LIMIT")
      ;;
    limit)
      # The example programs only: each fits in the limit, so a run passes, or at worst meets
      # the limit (CUDA_ERROR_OUT_OF_MEMORY, allowed); a PyTorch client would meet it at its
      # model load on every run, which shows nothing the oom kind does not.
      local programs=(small_kernels vector_add pinned_async streams_events matmul_tiled)
      program_command "${2:-${programs[$((RANDOM % ${#programs[@]}))]}}"
      RUN_ENV=(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="$SMALL_LIMIT")
      ALLOW_OOM=1
      ;;
    jax) program_command jax_check ;;
    *) die "pressure_command: no kind $1" ;;
  esac
  LABEL=$1:$NAME
}

# run_program PREFIX LIMIT KILLED: one run of COMMAND under the shim, killed after LIMIT
# seconds; appends its line to RESULTS. A run killed where KILLED=1 planned it is no error.
run_program() {
  local prefix=$1 limit=$2 killed=$3 status=0 line
  timeout -s KILL "$limit" env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" \
    "${RUN_ENV[@]+"${RUN_ENV[@]}"}" "${COMMAND[@]}" >"$prefix.out" 2>"$prefix.err" || status=$?
  line=$(result_line "$prefix.out" "$NAME")
  if [ "$status" = 0 ] && [ "$(verdict "$line")" = PASS ]; then
    # A PyTorch client's start (init_s: import, model, its first use of the GPU), which the
    # summary gives per program.
    echo "pass $LABEL $(grep -o 'init_s=[0-9.]*\|ms_per_iter=[0-9.]*' <<<"$line" | tr '\n' ' ')" \
      >>"$RESULTS"
  elif [ "$killed" = 1 ] && { [ "$status" = 137 ] || [ "$status" = 124 ]; }; then
    echo "killed $LABEL after ${limit}s" >>"$RESULTS"
  elif [ "$ALLOW_OOM" = 1 ] && [ "$status" != 0 ] &&
    [ "$(field "$line" error)" = "CUDA_ERROR_OUT_OF_MEMORY(2)" ]; then
    # An example's failed call names its error in its FAIL line (examples/common/check.cpp).
    echo "oom $LABEL $(field "$line" failed_call)" >>"$RESULTS"
  else
    local why="status=$status"
    [ "$status" = 137 ] && [ "$killed" = 0 ] && why="status=137 (over PROGRAM_TIMEOUT=${limit}s)"
    echo "error $LABEL $why log=$prefix.{out,err}: ${line:-no result line}" >>"$RESULTS"
    return 1  # keep the logs of a failure
  fi
  rm -f "$prefix.out" "$prefix.err"
}

# run_slot SLOT PICK PREFIX: runs what PICK SLOT picks until the stop file appears, its logs
# named LOGS/PREFIX<slot>.<run>.<label>; appends one line per run to RESULTS.
run_slot() {
  local slot=$1 pick=$2 prefix=$3 run=0 limit killed
  # Not the hog's pipes: the programs would inherit them, and a hog whose stdin stays open
  # after the soak died would keep its memory until they all ended.
  [ -z "$HOG_PID" ] || exec {HOG_IN}>&- {HOG_OUT}<&-
  while [ ! -e "$STOP_FILE" ]; do
    run=$((run + 1))
    "$pick" "$slot"
    limit=$PROGRAM_TIMEOUT killed=0
    if [ $((RANDOM % 100)) -lt "$KILL_PERCENT" ]; then
      limit=$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.2 + 3 * r / 32768 }')
      killed=1
    fi
    run_program "$LOGS/$prefix$slot.$run.${LABEL/:/.}" "$limit" "$killed"
  done
}

# warm_up: one run of each program alone, before the slots start and before the first sample
# the checks read, so that what the server keeps while it has clients (the primary context, the
# shared library images, kept --image-idle-timeout after their last client) is loaded at the
# start of the measure. Without it the first PyTorch clients loaded PyTorch's libraries (~2.4 GiB
# of the server's heap on an H100) while 63 other clients ran, so slowly that it took most of a
# 6-minute soak, and the checks read the loading as growth (2026-11-28, docs/testing.md).
# With --pressure, each pressure kind once too (vector_add for limit: the example that holds
# the most), so that every kind has run whatever the random picks.
warm_up() {
  local choice
  local choices=(small_kernels vector_add pinned_async streams_events matmul_tiled)
  [ "$HAVE_TORCH" = 1 ] && choices+=(resnet)
  for choice in "${choices[@]}"; do
    program_command "$choice"
    run_program "$LOGS/warmup.$LABEL" "$PROGRAM_TIMEOUT" 0
  done
  [ "$PRESSURE" = 1 ] || return 0
  choices=(oom limit)
  [ "$HAVE_JAX" = 1 ] && choices+=(jax)
  for choice in "${choices[@]}"; do
    pressure_command "$choice" vector_add
    run_program "$LOGS/warmup.${LABEL/:/.}" "$PROGRAM_TIMEOUT" 0
  done
}

# ---- the memory hog (--pressure) ------------------------------------------------------------
HOG_FILE=$WORK_DIR/hog.txt  # its first line ("holding N free M"), its answer, its exit status
rm -f "$HOG_FILE"

# hog_start: memory_hog.py under the shim, a coprocess: its first line on stdout says what it
# holds, and a line on its stdin makes it check its bytes. Sets HOG_PID, and HOG_IN and HOG_OUT:
# the coprocess's pipes moved to fds of our own, because bash closes its own once it reaps the
# coprocess, which could lose the answer to the check.
hog_start() {
  local line="" fd
  coproc MEMORY_HOG {
    exec env LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" \
      python3 "$HOG_SCRIPT" --leave "$HOG_LEAVE" 2>"$LOGS/hog.err"
  }
  HOG_PID=$MEMORY_HOG_PID
  exec {HOG_IN}>&"${MEMORY_HOG[1]}" {HOG_OUT}<&"${MEMORY_HOG[0]}"
  # Closing bash's copies leaves HOG_IN the only write end: closing it is the hog's end of file.
  fd=${MEMORY_HOG[1]} && exec {fd}>&-
  fd=${MEMORY_HOG[0]} && exec {fd}<&-
  # It prints the line once it has allocated and filled all but --hog-leave: seconds, even for
  # an H200's 140 GB. Nothing within PROGRAM_TIMEOUT, or end of file, is a failed start.
  read -r -t "$PROGRAM_TIMEOUT" -u "$HOG_OUT" line
  echo "$line" >"$HOG_FILE"
  case "$line" in
    "holding 0 "*)
      log "warning: the memory hog holds nothing: the GPU had no more than --hog-leave" \
        "$HOG_LEAVE free ($line)"
      ;;
    "holding "*)
      log "memory hog (pid $HOG_PID) holds $(awk '{ printf "%.2f GiB of device 0, %.2f GiB left", \
        $2 / 2^30, $4 / 2^30 }' <<<"$line") free"
      ;;
    *)
      die "the memory hog ($HOG_SCRIPT --leave $HOG_LEAVE) did not start:" \
        "${line:-nothing on its stdout within ${PROGRAM_TIMEOUT}s}; its stderr ($LOGS/hog.err):" \
        "$(tail -n 3 "$LOGS/hog.err" 2>/dev/null | tr '\n' ' ')"
      ;;
  esac
}

# hog_check: the hog reads its bytes back and exits; its answer ("intact" required) and exit
# status go to HOG_FILE for the verdict.
hog_check() {
  local line="" status=0 read_status=0
  # In a subshell: were the hog gone, the write would kill this shell with SIGPIPE.
  (echo check >&"$HOG_IN") 2>/dev/null
  read -r -t "$PROGRAM_TIMEOUT" -u "$HOG_OUT" line || read_status=$?
  if [ "$read_status" -gt 128 ]; then
    line="no answer within ${PROGRAM_TIMEOUT}s (killed; its stderr: $LOGS/hog.err)"
    kill "$HOG_PID" 2>/dev/null
  elif [ "$read_status" != 0 ]; then
    line="${line:-it had ended without an answer (its stderr: $LOGS/hog.err)}"
  fi
  exec {HOG_IN}>&- {HOG_OUT}<&-
  wait "$HOG_PID" || status=$?
  HOG_PID=""
  printf '%s\nstatus %s\n' "$line" "$status" >>"$HOG_FILE"
  log "memory hog: $line, exit status $status"
}

read -r SERVER_PID RESTARTS_0 <<<"$(server_pid_restarts)"
[ -n "${SERVER_PID:-}" ] || die "no server for GPU $GPU_INDEX in server_list"
FDS_IDLE=$(find "/proc/$SERVER_PID/fd" -mindepth 1 -maxdepth 1 | wc -l)
START_S=$SECONDS
echo "phase,t_s,server_pid,restarts,clients,rss_kib,fds,gpu_mem_mib,anon_kib,heap_kib,driver_kib,torch_clients,oom_clients" >"$CSV"
sample idle >>"$CSV"
if [ "$PRESSURE" = 1 ]; then
  # Before the warm-up: the GPU memory it holds is then part of every sample the checks read.
  hog_start
  sample hog >>"$CSV"
fi
if [ "$WARM_UP" = 1 ]; then
  log "warm-up: one run of each program alone"
  warm_up
  sample warm >>"$CSV"
fi
RUN_START_S=$SECONDS  # --minutes counts from here: the warm-up is not part of it
for slot in $(seq 0 $((CLIENTS - 1))); do
  # The slot's stderr: bash's "Killed" notes of the runs it killed.
  run_slot "$slot" pick_program slot 2>>"$LOGS/slots.err" &
  SLOT_PIDS+=($!)
done
if [ "$PRESSURE" = 1 ]; then
  log "--pressure: $PRESSURE_CLIENTS more slots: oom (--oom-limit $OOM_LIMIT), limit" \
    "(--small-limit $SMALL_LIMIT)$([ "$HAVE_JAX" = 1 ] && echo ", jax")"
  for slot in $(seq 0 $((PRESSURE_CLIENTS - 1))); do
    run_slot "$slot" pick_pressure pressure 2>>"$LOGS/slots.err" &
    SLOT_PIDS+=($!)
  done
fi
while [ $((SECONDS - RUN_START_S)) -lt "$DURATION_S" ]; do
  sleep "$INTERVAL"
  sample run >>"$CSV"
done
touch "$STOP_FILE"
log "stopping: every slot ends its current run"
for pid in "${SLOT_PIDS[@]}"; do wait "$pid"; done
SLOT_PIDS=()
[ -z "$HOG_PID" ] || hog_check  # first: the hog is a client too, and the wait below is for none
for _ in $(seq 100); do  # the last sessions are freed
  [ "$(ctl ps 2>/dev/null | tail -n +2 | grep -c .)" = 0 ] && break
  sleep 0.2
done
for _ in $(seq 100); do  # a session's fds close once its queued work has drained
  FDS_END=$(find "/proc/$SERVER_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  [ "$FDS_END" -le "$FDS_IDLE" ] && break
  sleep 0.2
done
sample after >>"$CSV"

# ---- the verdict ----------------------------------------------------------------------------
PLOT=$WORK_DIR/soak.png
python3 - "$CSV" "$RESULTS" "$PLOT" "$SERVER_PID" "$RESTARTS_0" "$FDS_IDLE" "$FDS_END" \
  "$RSS_TOLERANCE_MIB" "$RSS_TOLERANCE_PCT" "$FD_TOLERANCE" "$GPU_TOLERANCE_MIB" \
  "$PRESSURE" "$HOG_FILE" "$HOG_LEAVE" "$OOM_LIMIT" "$SMALL_LIMIT" "$HAVE_JAX" <<'EOF'
import csv, os, statistics, sys
(csv_path, results_path, plot_path, server_pid, restarts_0, fds_idle, fds_end,
 rss_tol_mib, rss_tol_pct, fd_tol, gpu_tol_mib,
 pressure, hog_path, hog_leave, oom_limit, small_limit, have_jax) = sys.argv[1:]
rows = list(csv.DictReader(open(csv_path)))
samples = [r for r in rows if r["phase"] == "run"]
runs = [line.split()[0] for line in open(results_path) if line.strip()]
failures = []
errors = runs.count("error")
# "oom": a --pressure limit run that failed with CUDA_ERROR_OUT_OF_MEMORY, which is allowed.
oom_note = f", {runs.count('oom')} out of memory (allowed)" if runs.count("oom") else ""
print(f"soak: {len(runs)} client runs: {runs.count('pass')} passed, {runs.count('killed')} killed, "
      f"{errors} errors{oom_note}")
# Per program ("pass NAME", "killed NAME after ...", "error NAME status=..."): how often the
# PyTorch clients really came and went.
per_program = {}
for line in open(results_path):
    words = line.split()
    if len(words) >= 2:
        counts = per_program.setdefault(words[1], {"pass": 0, "killed": 0, "error": 0, "oom": 0})
        counts[words[0]] = counts.get(words[0], 0) + 1
init_s, ms_per_iter = {}, {}
for line in open(results_path):
    words = line.split()
    for word in words[2:]:
        if words[0] == "pass" and word.startswith("init_s="):
            init_s.setdefault(words[1], []).append(float(word.split("=", 1)[1]))
        if words[0] == "pass" and word.startswith("ms_per_iter="):
            ms_per_iter.setdefault(words[1], []).append(float(word.split("=", 1)[1]))
for name, counts in sorted(per_program.items()):
    starts = init_s.get(name)
    iters = ms_per_iter.get(name)
    start_note = (f"; start (init_s) median {statistics.median(starts):.1f} s, max "
                  f"{max(starts):.1f} s" if starts else "")
    if iters:
        start_note += (f"; ms per inference median {statistics.median(iters):.1f}, max "
                       f"{max(iters):.1f}")
    oom_note = f", {counts['oom']} out of memory" if counts["oom"] else ""
    print(f"soak:   {name}: {counts['pass']} passed, {counts['killed']} killed, "
          f"{counts['error']} errors{oom_note}{start_note}")
if errors:
    failures.append(f"{errors} client runs failed (runs.txt lists their logs)")

# --pressure: runs per kind (the label before the colon), and the memory hog's verdict.
if pressure == "1":
    kinds = [
        ("oom", f"oom_then_work, allocating until CUDA_ERROR_OUT_OF_MEMORY under a {oom_limit} "
                "limit, then a kernel"),
        ("limit", f"the examples under a {small_limit} limit"),
        ("jax", "jax_check.py"),
    ]
    for kind, what in kinds:
        counts = {"pass": 0, "killed": 0, "error": 0, "oom": 0}
        for name, c in per_program.items():
            if name.startswith(kind + ":"):
                for key in counts:
                    counts[key] += c.get(key, 0)
        total = sum(counts.values())
        if kind == "jax" and have_jax != "1":
            print(f"soak: pressure {kind} ({what}): not run (the test driver, or jax did not "
                  "import or find the GPU natively)")
            continue
        oom_note = f"{counts['oom']} out of memory (allowed), " if kind == "limit" else ""
        print(f"soak: pressure {kind} ({what}): {total} runs: {counts['pass']} passed, "
              f"{counts['killed']} killed, {oom_note}{counts['error']} errors")
        # A kind that never completed a run proved nothing (the warm-up runs each once).
        if counts["pass"] + counts["oom"] == 0:
            failures.append(f"pressure: no {kind} client completed a run")
    hog = [line.strip() for line in open(hog_path)] if os.path.exists(hog_path) else []
    held = hog[0].split() if hog else []
    if len(held) == 4 and held[0] == "holding":
        print(f"soak: pressure memory hog (--hog-leave {hog_leave}): held "
              f"{int(held[1]) / 2**30:.2f} GiB, {int(held[3]) / 2**30:.2f} GiB left free; at the "
              f"end: {hog[1] if len(hog) > 1 else 'not checked'}, "
              f"{hog[2] if len(hog) > 2 else 'no exit status'}")
    else:
        print(f"soak: pressure memory hog: did not start ({hog[0] if hog else 'no record'})")
    if hog[1:] != ["intact", "status 0"]:
        failures.append("pressure: the memory hog's bytes were not found intact at the end "
                        f"({' / '.join(hog[1:]) or 'not checked'})")
if any(r["server_pid"] != server_pid for r in rows):
    failures.append("the server changed (pids " + " ".join(sorted({r["server_pid"] for r in rows})) + ")")
if any(r["restarts"] != restarts_0 for r in rows):
    failures.append("the server was restarted")

def number(value):
    try:
        return float(value)
    except ValueError:
        return float("nan")

def fit(xs, ys):
    """Least-squares coefficients of ys on the columns of xs (rows of regressors), by the normal
    equations; a regressor that never varies gets 0."""
    k = len(xs[0])
    means = [statistics.fmean(x[j] for x in xs) for j in range(k)]
    my = statistics.fmean(ys)
    c = [[x[j] - means[j] for j in range(k)] for x in xs]
    keep = [j for j in range(k) if any(abs(row[j]) > 1e-9 for row in c)]
    a = [[sum(row[i] * row[j] for row in c) for j in keep] for i in keep]
    b = [sum(row[i] * (y - my) for row, y in zip(c, ys)) for i in keep]
    n = len(keep)
    for col in range(n):  # Gaussian elimination with partial pivoting
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return [0.0] * k, means
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
                b[r] -= f * b[col]
    coef = [0.0] * k
    for i, j in enumerate(keep):
        coef[j] = b[i] / a[i][i]
    return coef, means

# The attached clients, and apart from them the --pressure oom clients (always 0 without it),
# each of which holds up to --oom-limit of device memory at its peak, a sample's worth of noise
# on the GPU memory's median otherwise.
CLIENT_REGRESSORS = ("clients", "oom_clients")


def growth(key, regressors=CLIENT_REGRESSORS):
    """Medians of the first and last quarter of `key` less what the attached clients account for
    (a least-squares fit on the `regressors` columns over the run's samples)."""
    points = [([number(r[x]) for x in regressors], number(r[key])) for r in samples]
    points = [(x, v) for x, v in points if all(c == c for c in x) and v == v]
    if len(points) < 2:
        return None, None, None
    coef, means = fit([x for x, _ in points], [v for _, v in points])
    rest = [v - sum(cf * (c - m) for cf, c, m in zip(coef, x, means)) for x, v in points]
    q = max(1, len(rest) // 4)
    a, b = statistics.median(rest[:q]), statistics.median(rest[-q:])
    return a, b, b - a

checks = [
    ("server RSS (MiB)", "rss_kib", 1 / 1024,
     lambda a: max(float(rss_tol_mib), float(rss_tol_pct) / 100 * a)),
    ("server fds", "fds", 1, lambda a: float(fd_tol)),
    ("GPU memory (MiB)", "gpu_mem_mib", 1, lambda a: float(gpu_tol_mib)),
]
# Where the RSS went, for the reader (no verdict): the same growth measure per kind of mapping.
for title, key in [("anonymous", "anon_kib"), ("[heap]", "heap_kib"), ("driver (/dev/nvidia*)", "driver_kib")]:
    a, b, d = growth(key)
    if a is not None:
        print(f"soak: server RSS in {title} mappings (MiB): first quarter median {a / 1024:.1f}, "
              f"last quarter {b / 1024:.1f}, growth {d / 1024:+.1f}")
# The checks count every attached client alike (but the oom ones); a PyTorch client's kernel
# images cost the server ~2 GiB of RSS while it is attached (docs/benchmarks.md, "The soak's
# memory"). For the reader (no verdict): the same growth with the Python clients (PyTorch, JAX)
# counted apart.
for title, key, scale in [("server RSS (MiB)", "rss_kib", 1 / 1024),
                          ("GPU memory (MiB)", "gpu_mem_mib", 1)]:
    a, b, d = growth(key, CLIENT_REGRESSORS + ("torch_clients",))
    if a is not None:
        print(f"soak: {title} with Python (PyTorch, JAX) clients counted apart: first quarter "
              f"median {a * scale:.1f}, last quarter {b * scale:.1f}, growth {d * scale:+.1f}")
for title, key, scale, tolerance in checks:
    a, b, d = growth(key)
    if a is None:
        failures.append(f"{title}: no samples")
        continue
    a, b, d = a * scale, b * scale, d * scale
    allowed = tolerance(a)
    verdict = "ok" if d <= allowed else "GREW"
    print(f"soak: {title}: first quarter median {a:.1f}, last quarter {b:.1f}, "
          f"growth {d:+.1f} (tolerance {allowed:.1f}) {verdict}")
    if d > allowed:
        failures.append(f"{title} grew by {d:.1f} (tolerance {allowed:.1f})")
print(f"soak: server fds without clients: {fds_idle} before, {fds_end} after")
if int(fds_end) > int(fds_idle) + int(fd_tol):
    failures.append(f"server fds without clients {fds_idle} -> {fds_end}")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [number(r["t_s"]) / 60 for r in rows]
    fig, axes = plt.subplots(5, 1, sharex=True, figsize=(9, 11))
    # Every sample, the idle ones before and after included.
    for ax, (label, key, scale) in zip(axes, [
            ("server RSS (MiB)", "rss_kib", 1 / 1024), ("server fds", "fds", 1),
            ("GPU memory used (MiB)", "gpu_mem_mib", 1), ("clients attached", "clients", 1),
            ("PyTorch clients attached", "torch_clients", 1)]):
        ax.plot(t, [number(r[key]) * scale for r in rows], marker=".")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("minutes")
    axes[0].set_title(f"mpsshim soak: {len(runs)} client runs, {errors} errors")
    fig.tight_layout()
    fig.savefig(plot_path, dpi=100)
    print(f"soak: plot {plot_path}")
except ImportError:
    print("soak: matplotlib is not importable: no plot (the samples are in the CSV)")

for failure in failures:
    print(f"soak: FAIL {failure}")
print("soak: PASS" if not failures else "soak: FAIL")
sys.exit(1 if failures else 0)
EOF
status=$?
log "samples $CSV, client runs $RESULTS, logs $LOGS"
exit "$status"
