"""bench/launch_latency: async empty-kernel launch (client CPU), launch+sync round trips,
cuMemAlloc+cuMemFree, cuMemAllocAsync+cuMemFreeAsync."""
from __future__ import annotations

import os

from ..common import parse_bench_csv

TITLE = "Launch path (bench/launch_latency)"
ESTIMATE_S = (4, 6)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "launch_async_cpu": ("empty-kernel async launch, client CPU", "us", "lower"),
    "launch_stream_sync": ("launch + cuStreamSynchronize round trip", "us", "lower"),
    "launch_stream_sync_p99": ("launch + cuStreamSynchronize, p99", "us", "lower"),
    "launch_ctx_sync": ("launch + cuCtxSynchronize round trip", "us", "lower"),
    "launch_ctx_sync_p99": ("launch + cuCtxSynchronize, p99", "us", "lower"),
    "ctx_sync_idle": ("cuCtxSynchronize, idle", "us", "lower"),
    "mem_alloc_free": ("cuMemAlloc + cuMemFree (1 MiB)", "us", "lower"),
    "mem_alloc_async_free": ("cuMemAllocAsync + cuMemFreeAsync + sync (1 MiB)", "us", "lower"),
    "ctx_get_device": ("cuCtxGetDevice", "ns", "lower"),
}


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"launch_latency": os.path.join(h.bench_bin, "launch_latency")}


def run(h, mode, rep):
    argv = [os.path.join(h.bench_bin, "launch_latency")] + h.cfg["launch_args"]
    procs = h.run_group(mode, [argv], f"launch.{mode}.{rep}", timeout_s=120)
    p = procs[0]
    out = p.stdout()
    rows = [r for r in parse_bench_csv(out) if r[0] == "launch_latency"]
    for _bench, metric, size, value, unit in rows:
        h.add("launch", metric, mode, rep, value, size=0, unit=unit)
    err = h.group_error(procs, "launch_latency")
    if err:
        got = {r[1] for r in rows}
        missing = [m for m in METRICS if m not in got]
        h.fail("launch", missing or ["launch_async_cpu"], mode, rep, err)
