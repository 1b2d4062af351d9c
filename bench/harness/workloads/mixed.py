"""bench/kernel_latency: a few clients with large kernels (many blocks, 2 ms) and many with
small ones (10 us, sync after each): small kernels' p50/p99 latency and the aggregate throughput
of both."""
from __future__ import annotations

import os
import statistics

from ..common import log, parse_result_line

TITLE = "Mixed sizes: large + small kernels (bench/kernel_latency)"
ESTIMATE_S = (5, 5)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "small_p50_us": ("small-kernel latency p50 (launch+sync)", "us", "lower"),
    "small_p99_us": ("small-kernel latency p99 (launch+sync)", "us", "lower"),
    "small_agg_kernels_per_s": ("small kernels, aggregate", "kernels/s", "higher"),
    "large_agg_kernels_per_s": ("large kernels, aggregate", "kernels/s", "higher"),
    "machine_cores_busy": ("mixed, whole machine: CPU cores busy (/proc/stat)", "cores", None),
    "machine_cpu_us_per_kernel": ("mixed, whole machine: CPU per kernel, small and large "
                                  "(/proc/stat)", "us", "lower"),
}


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"kernel_latency": os.path.join(h.bench_bin, "kernel_latency")}


def run(h, mode, rep):
    metrics = ["small_p50_us", "small_p99_us", "small_agg_kernels_per_s",
               "large_agg_kernels_per_s"]
    c = h.cfg
    prog = os.path.join(h.bench_bin, "kernel_latency")
    dur = str(c["mixed_duration_ms"])
    large = [prog, "--ns", "2000000", "--blocks", "528", "--threads", "256",
             "--duration-ms", dur, "--wait-go"]
    small = [prog, "--ns", "10000", "--blocks", "2", "--threads", "32", "--duration-ms", dur,
             "--wait-go"]
    n_large, n_small = c["mixed_large"], c["mixed_small"]
    n = f"{n_large}L+{n_small}S"
    procs = h.run_group(mode, [large] * n_large + [small] * n_small,
                        f"mixed.{mode}.{rep}", timeout_s=c["mixed_duration_ms"] / 1000 + 60,
                        wait_go=True, ready_timeout_s=60)
    err = h.group_error(procs, "kernel_latency")
    if err:
        h.fail("mixed", metrics, mode, rep, err, n=n)
        log(f"  mixed {mode}: FAILED {err[:160]}")
        return
    res = [parse_result_line(p.stdout(), "kernel_latency")[0] for p in procs]
    lg, sm = res[:n_large], res[n_large:]

    def agg(group):
        span = (max(int(r["end_ns"]) for r in group) - min(int(r["start_ns"]) for r in group))
        return sum(int(r["kernels"]) for r in group) / (span / 1e9)

    for r in sm:
        h.add("mixed", "small_p50_us", mode, rep, float(r["p50_us"]), n=n)
        h.add("mixed", "small_p99_us", mode, rep, float(r["p99_us"]), n=n)
    h.add("mixed", "small_agg_kernels_per_s", mode, rep, agg(sm), n=n)
    h.add("mixed", "large_agg_kernels_per_s", mode, rep, agg(lg), n=n)
    h.add_machine_cpu("mixed", mode, rep, min(int(r["start_ns"]) for r in res),
                      max(int(r["end_ns"]) for r in res), sum(int(r["kernels"]) for r in res),
                      "machine_cpu_us_per_kernel", 1e6, n=n)
    log(f"  mixed {mode}: small p50 {statistics.median(float(r['p50_us']) for r in sm):.1f} us"
        f" p99 {statistics.median(float(r['p99_us']) for r in sm):.1f} us, small "
        f"{agg(sm):,.0f}/s, large {agg(lg):,.0f}/s")
