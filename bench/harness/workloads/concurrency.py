"""N copies of examples/small_kernels (2 blocks x 32 threads, ~10 us kernels, sync every 64)
started together (--start-at-ns): per-process seconds, aggregate kernels/s, and the broker's CPU
per kernel (its processes' utime + stime from /proc over the group, clients' setup included; MPS
and mpsshim modes), the whole machine's CPU over the loops (machine_cpu.py; every mode), and the
aggregate as a fraction of N times one process's rate alone, natively (one_stream_rate)."""
from __future__ import annotations

import os
import statistics
import time

from ..common import log, parse_result_line
from ..modes import STARTS_SERVERS

TITLE = "Concurrency: N x examples/small_kernels"
ESTIMATE_S = (12, 30)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "agg_kernels_per_s": ("small kernels, aggregate", "kernels/s", "higher"),
    "per_proc_s": ("small kernels, per-process loop", "s", "lower"),
    "slowest_proc_s": ("small kernels, slowest process", "s", "lower"),
    "late_ms": ("small kernels, latest start after the barrier", "ms", None),
    "of_ceiling": ("small kernels, aggregate / (N x one native process alone)", "x", "higher"),
    "broker_cpu_us_per_kernel": ("small kernels, broker CPU per kernel, clients' start and end "
                                 "included (/proc)", "us", "lower"),
    "broker_window_cpu_us_per_kernel": ("small kernels, broker CPU per kernel while they run "
                                        "(/proc)", "us", "lower"),
    "machine_cores_busy": ("small kernels, whole machine: CPU cores busy (/proc/stat)", "cores",
                           None),
    "machine_cpu_us_per_kernel": ("small kernels, whole machine: CPU per kernel (/proc/stat)",
                                  "us", "lower"),
}


def one_stream_rate(h):
    """The hardware's ceiling for one process: examples/small_kernels alone, natively (N = 1),
    kernels/s, the mean of what this run measured so far (the modes rotate per repetition and the
    first starts with the first mode given, so "native" first gives every mode the figure), or
    None. N processes, each running its kernels back to back on its own stream, cannot pass N
    times it."""
    values = [r["value"] for r in h.rows
              if r["workload"] == "concurrency" and r["metric"] == "agg_kernels_per_s"
              and r["mode"] == "native" and r["n"] == 1 and r["status"] == "ok"
              and r["value"] != ""]
    return statistics.mean(values) if values else None


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"small_kernels": h.small_kernels}


def run(h, mode, rep):
    metrics = ["agg_kernels_per_s", "per_proc_s", "slowest_proc_s", "late_ms"]
    kernels = h.cfg["small_kernels"]
    for n in h.cfg["concurrency_n"]:
        if n >= 16 and rep >= h.cfg.get("concurrency_big_reps", 99):
            continue  # the large N cost most: fewer repetitions (the preset says how many)
        key = ("concurrency", mode, n)
        if key in h.failed_once:
            h.fail("concurrency", metrics, mode, rep, "not run: failed in an earlier "
                   "repetition: " + h.failed_once[key], n=n, status="skipped")
            continue
        delay = 0.6 + h.start_delay[mode] * n
        start_at = time.time_ns() + int(delay * 1e9)
        argv = [h.small_kernels, "--kernels", str(kernels), "--start-at-ns", str(start_at)]
        ticks_before = h.broker_ticks(mode)
        procs = h.run_group(mode, [argv] * n, f"concurrency.{mode}.{rep}.n{n}",
                            timeout_s=delay + 60 + 0.5 * n)
        ticks_after = h.broker_ticks(mode)
        err = h.group_error(procs, "small_kernels")
        results = [parse_result_line(p.stdout(), "small_kernels")[0] for p in procs]
        results = [r for r in results if "start_ns" in r]
        if err:
            h.failed_once[key] = err
            h.fail("concurrency", metrics, mode, rep, err, n=n)
            log(f"  concurrency {mode} n={n}: FAILED {err[:160]}")
            continue
        starts = [int(r["start_ns"]) for r in results]
        ends = [int(r["end_ns"]) for r in results]
        seconds = [float(r["seconds"]) for r in results]
        late = max(float(r.get("late_ms", 0)) for r in results)
        span = (max(ends) - min(starts)) / 1e9
        h.add("concurrency", "agg_kernels_per_s", mode, rep, n * kernels / span, n=n)
        one = one_stream_rate(h)
        if one:
            h.add("concurrency", "of_ceiling", mode, rep, n * kernels / span / (n * one), n=n)
        for s in seconds:
            h.add("concurrency", "per_proc_s", mode, rep, s, n=n)
        h.add("concurrency", "slowest_proc_s", mode, rep, max(seconds), n=n)
        h.add("concurrency", "late_ms", mode, rep, late, n=n)
        h.add_machine_cpu("concurrency", mode, rep, min(starts), max(ends), n * kernels,
                          "machine_cpu_us_per_kernel", 1e6, n=n)
        broker_s = h.cpu.processes_over(min(starts), max(ends)) if h.cpu else None
        if broker_s is not None:
            # Over the window the programs report, as the whole machine's: the broker's cost
            # per kernel while kernels run, not what attaching and leaving clients cost it.
            h.add("concurrency", "broker_window_cpu_us_per_kernel", mode, rep,
                  1e6 * broker_s / (n * kernels), n=n)
        if ticks_before is not None and ticks_after is not None:
            # The broker's CPU (every thread of the daemon and the server, or of NVIDIA MPS's
            # processes) over the whole group, clients' setup included, per kernel launched.
            hz = os.sysconf("SC_CLK_TCK")
            h.add("concurrency", "broker_cpu_us_per_kernel", mode, rep,
                  1e6 * (ticks_after - ticks_before) / hz / (n * kernels), n=n)
        if late > 0:
            # Some copy was still initialising at the barrier: give the next run more room.
            cap = 3.0 if mode in STARTS_SERVERS else 1.0  # seconds per client
            h.start_delay[mode] = min(cap, max(h.start_delay[mode] * 1.5,
                                               1.25 * (delay + late / 1000) / n))
        log(f"  concurrency {mode} n={n}: {n * kernels / span:,.0f} kernels/s, "
            f"per-process {statistics.median(seconds):.3f} s, late {late:.0f} ms")
