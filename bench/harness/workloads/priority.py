"""Priorities that protect latency (docs/daemon.md, "Client priorities"): one
high-priority client launching small kernels with a synchronize after each (bench/kernel_latency,
10 us on 2 blocks: its p50/p99 latency) beside four low-priority clients saturating the GPU with
large kernels (2 ms on 528 blocks, 8 launches per synchronize: their aggregate kernels/s), with
CUDA_MPS_CLIENT_PRIORITY=0 and 1. Each group also runs alone, in the same mode and repetition,
so the report gives the high-priority p99 shared over alone (target <= 1.1) and the low-priority
throughput shared over alone (target >= 0.8). Natively the variable means nothing (time-slicing);
under NVIDIA MPS it is MPS's own priority; under mpsshim the server holds back the low-priority
clients while the high-priority one has work in flight and runs them without the SMs it reserves
for high-priority clients while one is connected (mpsshimd --priority-reserve-sms, 18% by
default; sweep it with --daemon-arg=--priority-reserve-sms=N). Mode shim-noreserve: held back
but on every SM (--priority-reserve-sms=0); shim-noprio: neither
(--priority-scheduling=off)."""
from __future__ import annotations

import os

from ..common import log, parse_result_line

TITLE = "Priorities: 1 high-priority latency client beside 4 low-priority batch clients"
ESTIMATE_S = (14, 20)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "high_p50_us": ("high-priority small kernel, launch+sync p50", "us", "lower"),
    "high_p99_us": ("high-priority small kernel, launch+sync p99", "us", "lower"),
    "low_kernels_per_s": ("low-priority large kernels, aggregate", "kernels/s", "higher"),
    "high_p99_vs_alone": ("high-priority p99, shared / alone (target <= 1.1)", "x", "lower"),
    "machine_cores_busy": ("priority, whole machine: CPU cores busy, shared (/proc/stat)", "cores",
                           None),
    "machine_cpu_us_per_kernel": ("priority, whole machine: CPU per kernel, shared (/proc/stat)",
                                  "us", "lower"),
    "low_tput_vs_alone": ("low-priority throughput, shared / alone (target >= 0.8)", "x",
                          "higher"),
}

HIGH = ["--ns", "10000", "--blocks", "2", "--threads", "32", "--batch", "1"]
LOW = ["--ns", "2000000", "--blocks", "528", "--threads", "256", "--batch", "8"]


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"kernel_latency": os.path.join(h.bench_bin, "kernel_latency")}


def _group(h, mode, rep, tag, high: bool, lows: int):
    """Runs the high-priority client and/or `lows` low-priority ones together; their result
    fields (high's first) or an error."""
    prog = os.path.join(h.bench_bin, "kernel_latency")
    dur = ["--duration-ms", str(h.cfg["priority_duration_ms"]), "--wait-go"]
    argvs, envs = [], []
    if high:
        argvs.append([prog] + HIGH + dur)
        envs.append({"CUDA_MPS_CLIENT_PRIORITY": "0"})
    for _ in range(lows):
        argvs.append([prog] + LOW + dur)
        envs.append({"CUDA_MPS_CLIENT_PRIORITY": "1"})
    procs = h.run_group(mode, argvs, f"priority.{mode}.{rep}.{tag}",
                        timeout_s=h.cfg["priority_duration_ms"] / 1000 + 60, wait_go=True,
                        ready_timeout_s=60, extra_envs=envs,
                        snapshot_after_s=h.cfg["priority_duration_ms"] / 2000)
    err = h.group_error(procs, "kernel_latency")
    if err:
        return None, err
    return [parse_result_line(p.stdout(), "kernel_latency")[0] for p in procs], ""


def _aggregate(results) -> float:
    span = (max(int(r["end_ns"]) for r in results) - min(int(r["start_ns"]) for r in results))
    return sum(int(r["kernels"]) for r in results) / (span / 1e9)


def run(h, mode, rep):
    lows = h.cfg["priority_low_clients"]
    shared_n = f"1H+{lows}L"
    alone_high, err_high = _group(h, mode, rep, "high-alone", True, 0)
    alone_low, err_low = _group(h, mode, rep, "low-alone", False, lows)
    shared, err_shared = _group(h, mode, rep, "shared", True, lows)
    if alone_high:
        h.add("priority", "high_p50_us", mode, rep, float(alone_high[0]["p50_us"]), n="alone")
        h.add("priority", "high_p99_us", mode, rep, float(alone_high[0]["p99_us"]), n="alone")
    else:
        h.fail("priority", ["high_p50_us", "high_p99_us"], mode, rep, err_high, n="alone")
    if alone_low:
        h.add("priority", "low_kernels_per_s", mode, rep, _aggregate(alone_low), n="alone")
    else:
        h.fail("priority", ["low_kernels_per_s"], mode, rep, err_low, n="alone")
    if not shared:
        h.fail("priority", list(METRICS), mode, rep, err_shared, n=shared_n)
        log(f"  priority {mode}: FAILED {err_shared[:160]}")
        return
    high, low = shared[0], shared[1:]
    h.add("priority", "high_p50_us", mode, rep, float(high["p50_us"]), n=shared_n)
    h.add("priority", "high_p99_us", mode, rep, float(high["p99_us"]), n=shared_n)
    h.add("priority", "low_kernels_per_s", mode, rep, _aggregate(low), n=shared_n)
    # The shared group ran last: the sampler still holds its window.
    h.add_machine_cpu("priority", mode, rep, min(int(r["start_ns"]) for r in shared),
                      max(int(r["end_ns"]) for r in shared), sum(int(r["kernels"]) for r in shared),
                      "machine_cpu_us_per_kernel", 1e6, n=shared_n)
    if alone_high:
        h.add("priority", "high_p99_vs_alone", mode, rep,
              float(high["p99_us"]) / float(alone_high[0]["p99_us"]), n=shared_n)
    if alone_low:
        h.add("priority", "low_tput_vs_alone", mode, rep, _aggregate(low) / _aggregate(alone_low),
              n=shared_n)
    log(f"  priority {mode}: high p99 {float(high['p99_us']):.1f} us shared"
        + (f", {float(alone_high[0]['p99_us']):.1f} us alone" if alone_high else "")
        + f"; low {_aggregate(low):,.0f} kernels/s shared"
        + (f", {_aggregate(alone_low):,.0f} alone" if alone_low else ""))


def report_notes(summary, modes) -> list[str]:
    """A sentence per mode on the targets (p99 ratio <= 1.1, throughput ratio >= 0.8)."""
    lines = []
    for mode in modes:
        got = {e["metric"]: e["median"] for e in summary
               if e["workload"] == "priority" and e["mode"] == mode and e["median"] is not None}
        p99, tput = got.get("high_p99_vs_alone"), got.get("low_tput_vs_alone")
        if p99 is None or tput is None:
            continue
        ok = p99 <= 1.1 and tput >= 0.8
        lines.append(f"- {mode}: high-priority p99 {p99:.2f}x alone, low-priority throughput "
                     f"{tput:.2f}x alone: {'meets' if ok else '**misses**'} the targets "
                     f"(<= 1.1x, >= 0.8x)")
    return lines
