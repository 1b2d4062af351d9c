# shellcheck shell=bash disable=SC2034,SC2154  # sourced: the caller sets build/rt/out and reads label
# Sourced by the probe scripts (bench_ab.sh, latency_split.sh, small_kernels_ab.sh, wait_policy_ab.sh,
# concurrent_copies.sh): parse_mode, and a fresh mpsshimd per mode. Before sourcing, set `build`
# (a tools/gpu_pack.sh tree), `rt` (the runtime directory each daemon gets, removed first) and
# `out` (its log goes to $out/mpsshimd.log). Stops the daemon when the script exits.
daemon_pid=""

# parse_mode MODE: a mode LABEL:ARGS into `label`, `daemon_args` (mpsshimd options),
# `client_env` (the NAME=VALUE words: the clients' environment) and `low_env` (low.NAME=VALUE:
# latency_split.sh's busy clients only).
parse_mode() {
  label=${1%%:*}
  local words word
  read -r -a words <<<"${1#*:}"
  daemon_args=()
  client_env=()
  low_env=()
  for word in "${words[@]+"${words[@]}"}"; do
    if [[ $word =~ ^low\.[A-Z_][A-Z0-9_]*= ]]; then
      low_env+=("${word#low.}")
    elif [[ $word =~ ^[A-Z_][A-Z0-9_]*= ]]; then
      client_env+=("$word")
    else
      daemon_args+=("$word")
    fi
  done
}

start_daemon() {  # daemon arguments
  rm -rf "$rt"
  "$build/broker/daemon/mpsshimd" --runtime-dir "$rt" \
    --server "$build/broker/server/mpsshim-server" "$@" >>"$out/mpsshimd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 200); do
    "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" server_list 2>/dev/null |
      grep -q running && return 0
    sleep 0.05
  done
  echo "daemon did not come up" >&2
  return 1
}

# start_resnet_client LOG: one bench/resnet_client.py under the shim of `build`, connected to the
# daemon at `rt`, inferring until killed (at most 300 s), its output in LOG; its pid in $!.
start_resnet_client() {
  CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" \
    timeout 300 "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../../bench/resnet_client.py" \
    --iters 100000 --no-wait >"$1" 2>&1 &
}

stop_daemon() {
  [ -n "$daemon_pid" ] || return 0
  "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" quit >/dev/null 2>&1 || kill "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=""
}
trap stop_daemon EXIT
