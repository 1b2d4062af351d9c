#!/usr/bin/env bash
# The README's first command: sets up and builds (tools/setup.sh), starts mpsshimd in the
# background, runs examples/vector_add through the shim, and stops the daemon. On the GPU when
# this machine has one (nvidia-smi lists it); otherwise on the host-memory test driver, so that
# the whole path (shim -> mpsshimd -> mpsshim-server -> driver) runs on any machine. It says
# which one ran. Exit status: the example's.
#
#   bash tools/try.sh [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=build
[ "${1:-}" != --build-dir ] || BUILD_DIR=$2
bash tools/setup.sh --build-dir "$BUILD_DIR"

RUNTIME_DIR=/tmp/mpsshim-try-$(id -u)
DAEMON=("$BUILD_DIR/broker/daemon/mpsshimd" --runtime-dir "$RUNTIME_DIR"
  --server "$BUILD_DIR/broker/server/mpsshim-server")
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  WHERE="the GPU ($(nvidia-smi -L | head -n1 | cut -d'(' -f1 | sed 's/ *$//'), real driver)"
else
  DAEMON+=(--driver "$BUILD_DIR/tests/testdriver/libmpsshim-testdriver.so")
  WHERE="the host-memory test driver (no NVIDIA GPU here: tests/testdriver)"
fi

CTL=("$BUILD_DIR/broker/daemon/mpsshimctl" --runtime-dir "$RUNTIME_DIR")
"${CTL[@]}" quit >/dev/null 2>&1 || true  # an earlier try's daemon
"${DAEMON[@]}" -d
trap '"${CTL[@]}" quit >/dev/null 2>&1 || true' EXIT

echo "try: running examples/vector_add through libmpsshim.so on $WHERE"
status=0
CUDA_MPS_PIPE_DIRECTORY=$RUNTIME_DIR LD_PRELOAD=$PWD/$BUILD_DIR/libshim/libmpsshim.so \
  "$BUILD_DIR/examples/vector_add" || status=$?
echo "try: the daemon's servers:"
"${CTL[@]}" server_list
echo "try: vector_add exited $status on $WHERE; the daemon's log: $RUNTIME_DIR/mpsshimd.log"
exit "$status"
