#!/usr/bin/env bash
# What each PyTorch client loads into the server: N bench/resnet_client.py processes under one
# fresh mpsshimd, `mpsshimctl stats` (IMAGES: shared/private, PRIVATE: the private images' bytes)
# and `ps`, and the server's RSS, sampled once after SECONDS (default 25) while they run.
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/image_stats.sh .carry/gpu OUT [N] [SECONDS]
#
# Written 2026-11-28 after that session's device time was used up: not yet run on a GPU. Its
# question: the 8-minute soak still grows ~300 MiB of server RSS per live PyTorch session with
# shared images (docs/benchmarks.md); are those the private images' bytes?
set -uo pipefail
build=$(realpath "$1")
out=$2
clients=${3:-2}
seconds=${4:-25}
python=${PYTHON:-python3}
rt="$out/rt"
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/probe_daemon.sh"
start_daemon || exit 1
ctl() { "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" "$@"; }
for i in $(seq "$clients"); do
  CUDA_MPS_PIPE_DIRECTORY="$rt" LD_PRELOAD="$build/libshim/libmpsshim.so" \
    timeout 300 "$python" "$(dirname "${BASH_SOURCE[0]}")/../../bench/resnet_client.py" \
    --iters 100000 --no-wait >"$out/client.$i.txt" 2>&1 &
done
sleep "$seconds"
ctl stats
ctl ps
server=$(pgrep -f mpsshim-server | head -1)
grep -E "VmRSS|RssAnon|RssFile" "/proc/$server/status"
pkill -f resnet_client.py
wait 2>/dev/null
sleep 1
grep -E "VmRSS|RssAnon" "/proc/$server/status"
stop_daemon
grep -h "library images" "$out/mpsshimd.log" | tail -1
