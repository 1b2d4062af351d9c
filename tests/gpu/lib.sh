# shellcheck shell=bash disable=SC2034  # sets globals its callers read
# Helpers shared by gpu_suite.sh and bench_summary.sh; sourced, not run.
#
# Modes a program runs in:
#   native  the real driver, no MPS (LD_PRELOAD and CUDA_MPS_PIPE_DIRECTORY removed)
#   shim    LD_PRELOAD=libmpsshim.so, CUDA_MPS_PIPE_DIRECTORY=<our daemon's runtime dir>
#   mps     the real driver as a client of NVIDIA MPS (CUDA_MPS_PIPE_DIRECTORY=<its pipe dir>)
# A native or MPS run must never see our runtime directory in CUDA_MPS_PIPE_DIRECTORY: the real
# driver would take our "control" socket for an MPS daemon's.

SKIP_STATUS=77  # meson: test skipped
export LC_ALL=C  # decimal points in awk and printf

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# True when this machine has a usable NVIDIA GPU.
# The GPUs a daemon started from here serves: those nvidia-smi lists, or fewer when
# CUDA_VISIBLE_DEVICES names fewer (its driver then sees only those); at least 1.
gpu_count() {
  local smi count visible
  smi=$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)
  count=$("$smi" -L 2>/dev/null | grep -c '^GPU ')
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    [ "$visible" -lt "$count" ] && count=$visible
  fi
  echo $((count > 0 ? count : 1))
}

# Starts the mpsshimd of build tree $1 with runtime directory $2, its log in $3 and any further
# arguments as its options (LD_PRELOAD and CUDA_MPS_PIPE_DIRECTORY removed), then waits until
# every GPU's server runs: the daemon starts them one after another. Sets DPID.
start_build_daemon() {
  local build=$1 rt=$2 log=$3
  shift 3
  env -u LD_PRELOAD -u CUDA_MPS_PIPE_DIRECTORY "$build/broker/daemon/mpsshimd" --runtime-dir "$rt" \
    --server "$build/broker/server/mpsshim-server" "$@" >"$log" 2>&1 &
  DPID=$!
  for _ in $(seq 300); do
    [ -S "$rt/control" ] && [ "$("$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" \
      server_list 2>/dev/null | grep -cw running)" -ge "$(gpu_count)" ] && break
    sleep 0.1
  done
}

have_gpu() {
  [ -e /dev/nvidiactl ] || return 1
  local smi
  smi=$(command -v nvidia-smi || true)
  [ -n "$smi" ] || smi=/usr/local/nvidia/bin/nvidia-smi
  [ -x "$smi" ] || return 1
  "$smi" -L 2>/dev/null | grep -q '^GPU '
}

# Parses the options both scripts take; sets SHIM DAEMON CTL SERVER EXAMPLES_DIR BENCH_DIR
# PROGRAMS_DIR INTEGRITY LIBRARIES_DIR (absolute paths; SERVER may stay empty: mpsshimd then uses its default).
# Unknown options are left in REST_ARGS for the caller.
parse_paths() {
  local build_dir=""
  REST_ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --build-dir) build_dir=$2; shift 2 ;;
      --shim) SHIM=$2; shift 2 ;;
      --daemon) DAEMON=$2; shift 2 ;;
      --ctl) CTL=$2; shift 2 ;;
      --server) SERVER=$2; shift 2 ;;
      --examples-dir) EXAMPLES_DIR=$2; shift 2 ;;
      --bench-dir) BENCH_DIR=$2; shift 2 ;;
      --programs-dir) PROGRAMS_DIR=$2; shift 2 ;;
      --integrity) INTEGRITY=$2; shift 2 ;;
      --libraries-dir) LIBRARIES_DIR=$2; shift 2 ;;
      *) REST_ARGS+=("$1"); shift ;;
    esac
  done
  if [ -n "$build_dir" ]; then
    # Where meson puts them; broker/'s programs are found by name wherever it builds them.
    : "${SHIM:=$build_dir/libshim/libmpsshim.so}"
    : "${DAEMON:=$(find_program_in "$build_dir" mpsshimd)}"
    : "${CTL:=$(find_program_in "$build_dir" mpsshimctl)}"
    : "${SERVER:=$(find_program_in "$build_dir" mpsshim-server)}"
    : "${EXAMPLES_DIR:=$build_dir/examples}"
    : "${BENCH_DIR:=$build_dir/bench}"
    : "${PROGRAMS_DIR:=$build_dir/tests/gpu/programs}"
    : "${INTEGRITY:=$build_dir/tests/gpu/integrity_vs_driver}"
    : "${LIBRARIES_DIR:=$build_dir/tests/gpu/libraries}"
  fi
  local var
  for var in SHIM DAEMON CTL SERVER EXAMPLES_DIR BENCH_DIR PROGRAMS_DIR INTEGRITY LIBRARIES_DIR; do
    [ -n "${!var:-}" ] && printf -v "$var" '%s' "$(realpath -m "${!var}")"
  done
  return 0
}

find_program_in() {  # DIR NAME: the first executable file called NAME under DIR
  find "$1" -name "$2" -type f -perm -u+x 2>/dev/null | head -n1
}

require_file() {  # NAME PATH
  if [ -z "$2" ] || [ ! -e "$2" ]; then
    die "$1 not found (${2:-not given}); pass --build-dir or --$1"
  fi
}

# ---- our daemon ---------------------------------------------------------------------------

SHIM_RUNTIME_DIR=""
DAEMON_PID=""
DAEMON_ARGS=()  # extra mpsshimd options (soak.sh: --driver for the test driver)

# daemon_start RUNTIME_DIR LOG_FILE: starts mpsshimd on the real driver and waits until its
# control socket answers server_list with every GPU nvidia-smi lists "running" (the daemon
# starts the servers one after another, and a client that asks for a GPU whose server is still
# starting is refused with CUDA_ERROR_MPS_SERVER_NOT_READY).
daemon_start() {
  SHIM_RUNTIME_DIR=$1
  local log_file=$2 deadline=$((SECONDS + 30)) status servers
  local -a server_arg=()
  [ -z "${SERVER:-}" ] || server_arg=(--server "$SERVER")
  mkdir -p "$SHIM_RUNTIME_DIR"
  env -u CUDA_MPS_PIPE_DIRECTORY -u LD_PRELOAD -u NOTIFY_SOCKET \
    "$DAEMON" --runtime-dir "$SHIM_RUNTIME_DIR" "${server_arg[@]}" \
    "${DAEMON_ARGS[@]+"${DAEMON_ARGS[@]}"}" >"$log_file" 2>&1 &
  DAEMON_PID=$!
  while :; do
    if [ -S "$SHIM_RUNTIME_DIR/control" ] &&
      servers=$("$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" server_list 2>&1) &&
      [ "$(grep -cw running <<<"$servers")" -ge "$(gpu_count)" ]; then
      return 0
    fi
    if [ -n "$DAEMON_PID" ] && ! kill -0 "$DAEMON_PID" 2>/dev/null; then
      wait "$DAEMON_PID"
      status=$?
      DAEMON_PID=""
      # Status 0 may mean it forked into the background: keep polling for the socket.
      [ "$status" -eq 0 ] || {
        log "mpsshimd exited with status $status; its log ($log_file):"
        tail -n 30 "$log_file" >&2
        return 1
      }
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "mpsshimd not ready after 30 s; server_list said: ${servers:-nothing}"
      log "its log ($log_file):"
      tail -n 30 "$log_file" >&2
      return 1
    fi
    sleep 0.1
  done
}

# Stops the daemon: mpsshimctl quit, then SIGTERM, then SIGKILL, by its pid only.
daemon_stop() {
  [ -n "$SHIM_RUNTIME_DIR" ] || return 0
  timeout 10 "$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" quit >/dev/null 2>&1 || true
  if [ -n "$DAEMON_PID" ]; then
    # mpsshimd itself waits up to --stop-timeout (10 s) for its servers: give it longer.
    local i
    for i in $(seq 250); do
      kill -0 "$DAEMON_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
      log "mpsshimd ($DAEMON_PID) ignored quit; sending SIGTERM"
      kill -TERM "$DAEMON_PID" 2>/dev/null
      sleep 2
      kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  DAEMON_PID=""
  SHIM_RUNTIME_DIR=""
}

# gpu0_restarts: how many times the running daemon restarted GPU 0's server (gpu_states).
gpu0_restarts() {
  "$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" gpu_states 2>/dev/null |
    sed -n 's/^gpu=0 .*restarts=\([0-9]*\).*/\1/p'
}

# ---- NVIDIA MPS ---------------------------------------------------------------------------

MPS_CONTROL=""
MPS_PIPE_DIR=""
MPS_LOG_DIR=""

# mps_start WORK_DIR: starts nvidia-cuda-mps-control -d with private directories. Fails (with a
# reason on stderr) when MPS is not installed or we are not root.
mps_start() {
  MPS_CONTROL=$(command -v nvidia-cuda-mps-control || true)
  [ -n "$MPS_CONTROL" ] || MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
  if [ ! -x "$MPS_CONTROL" ]; then
    log "nvidia-cuda-mps-control not found: no NVIDIA MPS column"
    MPS_CONTROL=""
    return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    log "not root: NVIDIA MPS is not started, no NVIDIA MPS column"
    MPS_CONTROL=""
    return 1
  fi
  MPS_PIPE_DIR=$1/mps-pipe
  MPS_LOG_DIR=$1/mps-log
  mkdir -p "$MPS_PIPE_DIR" "$MPS_LOG_DIR"
  # The control daemon starts nvidia-cuda-mps-server from its own directory or PATH.
  if ! env -u LD_PRELOAD PATH="$(dirname "$MPS_CONTROL"):$PATH" \
    CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE_DIR" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG_DIR" \
    "$MPS_CONTROL" -d; then
    log "nvidia-cuda-mps-control -d failed"
    MPS_PIPE_DIR=""
    return 1
  fi
  local i
  for i in $(seq 100); do
    [ -e "$MPS_PIPE_DIR/control" ] && return 0
    sleep 0.1
  done
  log "NVIDIA MPS control pipe did not appear in $MPS_PIPE_DIR"
  return 1
}

mps_stop() {
  [ -n "$MPS_PIPE_DIR" ] || return 0
  echo quit | env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE_DIR" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG_DIR" \
    timeout 20 "$MPS_CONTROL" >/dev/null 2>&1 || log "echo quit | nvidia-cuda-mps-control failed"
  local i
  for i in $(seq 100); do  # quit returns at once; the daemon removes its pipe when gone
    [ -e "$MPS_PIPE_DIR/control" ] || break
    sleep 0.1
  done
  MPS_PIPE_DIR=""
}

# ---- running programs ---------------------------------------------------------------------

PROGRAM_TIMEOUT=${PROGRAM_TIMEOUT:-300}

# run_mode MODE OUT_PREFIX [NAME=VALUE...] PROGRAM [ARGS...]
# Runs PROGRAM in MODE with stdout in OUT_PREFIX.out and stderr in OUT_PREFIX.err; returns its
# exit status. NAME=VALUE words before the program are extra environment.
run_mode() {
  local mode=$1 prefix=$2
  shift 2
  local -a mode_env
  case "$mode" in
    native) mode_env=(-u LD_PRELOAD -u CUDA_MPS_PIPE_DIRECTORY) ;;
    shim) mode_env=(LD_PRELOAD="$SHIM" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR") ;;
    mps) mode_env=(-u LD_PRELOAD CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE_DIR") ;;
    *) die "unknown mode $mode" ;;
  esac
  timeout "$PROGRAM_TIMEOUT" env "${mode_env[@]}" "$@" >"$prefix.out" 2>"$prefix.err"
}

# result_line FILE PROGRAM_NAME: the program's "name: ... PASS|FAIL" line ("" if none).
result_line() {
  grep -a "^$2: " "$1" 2>/dev/null | tail -n1
}

# verdict LINE: PASS, FAIL, or NONE when the program printed no result line (crash, timeout).
verdict() {
  case "$1" in
    *" PASS") echo PASS ;;
    *" FAIL") echo FAIL ;;
    *) echo NONE ;;
  esac
}

# field LINE KEY: the value of key=value in a result line.
field() {
  tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n1
}

# result_fields LINE [IGNORED_KEY...]: the fields that must agree between runs, one per line,
# sorted. Measurements ("seconds", *_s, *_ms, *_us, *_ns, *_gbps) and the given keys are left out.
result_fields() {
  local line=$1
  shift
  local ignore="^(seconds|[^=]*_(s|ms|us|ns|gbps))="
  local key
  for key in "$@"; do ignore="$ignore|^$key="; done
  tr ' ' '\n' <<<"$line" | grep '=' | grep -Ev "$ignore" | sort
}

# csv_value FILE BENCHMARK METRIC [SIZE]: value column of a benchmark CSV line ("" if absent).
csv_value() {
  local pattern="^$2,$3,"
  [ -n "${4:-}" ] && pattern="$pattern$4,"
  grep -a "$pattern" "$1" 2>/dev/null | tail -n1 | cut -d, -f4
}

# run_small_kernel_copies MODE COUNT OUT_PREFIX [SMALL_KERNELS_ARGS...]
# Runs COUNT copies of small_kernels at once, all starting their launch loops at the same
# instant (--start-at-ns, after every copy's initialisation). Sets:
#   COPIES_OK      1 when every copy printed PASS
#   COPIES_WALL_S  seconds from the common start to the last copy's end
#   COPIES_MEAN_S  mean per-process loop seconds (the anchors' "per-process seconds")
#   COPIES_MAX_S   slowest copy's loop seconds
#   COPIES_LATE_MS the most any copy started after the common instant (0 = all on time)
run_small_kernel_copies() {
  local mode=$1 count=$2 prefix=$3
  shift 3
  # Room for COUNT concurrent context creations before the common start.
  local delay_ns=$(((3000 + 500 * count) * 1000000))
  local start_at=$(($(date +%s%N) + delay_ns))
  local -a pids=()
  local i
  for i in $(seq "$count"); do
    run_mode "$mode" "$prefix.$i" "$EXAMPLES_DIR/small_kernels" --start-at-ns "$start_at" "$@" &
    pids+=($!)
  done
  COPIES_OK=1
  for i in "${pids[@]}"; do wait "$i" || COPIES_OK=0; done
  local lines=""
  for i in $(seq "$count"); do
    local line
    line=$(result_line "$prefix.$i.out" small_kernels)
    [ "$(verdict "$line")" = PASS ] || COPIES_OK=0
    lines+="$line"$'\n'
  done
  read -r COPIES_WALL_S COPIES_MEAN_S COPIES_MAX_S COPIES_LATE_MS < <(awk '
    { delete v; for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    v["start_ns"] != "" {
      if (n == 0 || v["start_ns"] < first) first = v["start_ns"]
      if (n == 0 || v["end_ns"] > last) last = v["end_ns"]
      sum += v["seconds"]; if (v["seconds"] > max) max = v["seconds"]
      if (v["late_ms"] > late) late = v["late_ms"]
      ++n
    }
    END {
      if (n == 0) { print "nan nan nan nan"; exit }
      printf "%.4f %.4f %.4f %.1f\n", (last - first) / 1e9, sum / n, max, late + 0
    }' <<<"$lines")
}
