#!/usr/bin/env bash
# What each PyTorch client loads into the server: N bench/resnet_client.py processes under one
# fresh mpsshimd, `mpsshimctl stats` (IMAGES: shared/private, PRIVATE: the private images' bytes)
# and `ps`, and the server's RSS, sampled once after SECONDS (default 25) while they run.
#
#   LD_LIBRARY_PATH=$PWD/.carry/gpu/lib bash tools/probes/image_stats.sh .carry/gpu OUT [N] [SECONDS]
#
# Also prints where the server's RSS lives (its mappings by resident size, anonymous ones by
# size: glibc's worker arenas are ~64 MiB each). DAEMON_ARGS adds mpsshimd arguments.
# Run 2026-11-28 on an H100 (docs/benchmarks.md, "Where a PyTorch client's server memory goes"):
# 13 private images (31.1 MiB) per ResNet-50 client; 3 clients: 2.85 GiB RSS, 2.15 GiB in arenas.
set -uo pipefail
build=$(realpath "$1")
out=$2
clients=${3:-2}
seconds=${4:-25}
rt="$out/rt"
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/probe_daemon.sh"
start_daemon ${DAEMON_ARGS:-} || exit 1
ctl() { timeout 10 "$build/broker/daemon/mpsshimctl" --runtime-dir "$rt" "$@"; }
clients_pids=()
for i in $(seq "$clients"); do
  start_resnet_client "$out/client.$i.txt"
  clients_pids+=($!)
done
sleep "$seconds"
ctl stats
ctl ps
server=$(pgrep -x mpsshim-server | head -1)
grep -E "VmRSS|RssAnon|RssFile|RssShmem" "/proc/$server/status"
# Where the RSS lives: the server's mappings by resident size (largest first), anonymous ones
# grouped by their size, which tells the driver's per-context pools from the heap.
"${PYTHON:-python3}" - "/proc/$server/smaps" <<'PY'
import collections, re, sys
by_name, anon_n, anon_rss = collections.Counter(), collections.Counter(), collections.Counter()
name = size = None
for line in open(sys.argv[1]):
    m = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)", line)
    if m:
        size = (int(m.group(2), 16) - int(m.group(1), 16)) // 1024
        name = m.group(3).strip() or "[anon]"
    elif line.startswith("Rss:"):
        kib = int(line.split()[1])
        by_name[name] += kib
        if name == "[anon]":
            anon_n[size] += 1
            anon_rss[size] += kib
for k, v in by_name.most_common(15):
    print(f"rss_by_mapping {v // 1024:7d} MiB {k}")
for k, v in anon_rss.most_common(15):
    print(f"anon_by_size {k:9d} KiB x{anon_n[k]}: {v // 1024} MiB resident")
PY
kill "${clients_pids[@]}" 2>/dev/null
wait "${clients_pids[@]}" 2>/dev/null  # not a bare wait: the daemon is a child too
sleep 1
grep -E "VmRSS|RssAnon" "/proc/$server/status"
stop_daemon
grep -h "library images" "$out/mpsshimd.log" | tail -1
