#!/usr/bin/env bash
# Which operations of a PyTorch client grow the server's heap (broker/server/accounting/heap_profile.hpp):
# one fresh mpsshimd with MPSSHIM_SERVER_HEAP_PROFILE=1, then N bench/resnet_client.py processes
# one after another (the first pays for the shared library images), each killed after SECONDS;
# prints each session's "heap growth by operation" line and the server's RSS after each. With
# KEEP=1 every client runs until the last has had its SECONDS (each later one then loads what the
# first shares), and all are killed together.
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/heap_profile.sh .carry/gpu OUT [N] [SECONDS]
set -uo pipefail
build=$(realpath "$1")
out=$2
clients=${3:-2}
seconds=${4:-30}
rt="$out/rt"
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/probe_daemon.sh"
MPSSHIM_SERVER_HEAP_PROFILE=1 start_daemon ${DAEMON_ARGS:-} || exit 1
started=()
for i in $(seq "$clients"); do
  start_resnet_client "$out/client.$i.txt"
  started+=($!)
  sleep "$seconds"
  server=$(pgrep -x mpsshim-server | head -1)
  echo "client $i running: $(grep VmRSS "/proc/$server/status")"
  [ "${KEEP:-0}" = 1 ] && [ "$i" -lt "$clients" ] && continue
  kill "${started[@]}"
  wait "${started[@]}" 2>/dev/null
  started=()
  sleep 3  # the session's end, then the coordinator's heap trim (at most every 2 s)
  echo "client $i gone: $(grep VmRSS "/proc/$server/status")"
done
stop_daemon
grep -h "heap growth\|library images" "$out/mpsshimd.log"
