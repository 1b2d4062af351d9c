"""Several GPUs (needs two; skipped with fewer): bench/peer_copy (256 MiB GPU 0 -> 1, back, and
a unified-address copy), NCCL all-reduce between 2 processes through torch.distributed (bus
bandwidth at 256 MiB, latency at 8 KiB) and a DDP training step
(tests/gpu/multi/nccl_collectives.py --bench), and N x examples/small_kernels on GPU 0 alone and
then N on each of GPU 0 and GPU 1 at once (CUDA_VISIBLE_DEVICES per process): the aggregate on
two GPUs over one GPU's. NCCL's NVLink multicast stays off in every mode."""
from __future__ import annotations

import os
import re
import time

from ..common import HERE, log, parse_bench_csv, parse_result_line

TITLE = "Several GPUs: peer copies, NCCL between processes, DDP, small kernels on two GPUs"
ESTIMATE_S = (60, 90)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "peer_copy_gbps": ("cuMemcpyPeerAsync 256 MiB, GPU 0 -> 1", "GB/s", "higher"),
    "peer_copy_back_gbps": ("cuMemcpyPeerAsync 256 MiB, GPU 1 -> 0", "GB/s", "higher"),
    "unified_copy_gbps": ("cuMemcpyAsync 256 MiB between the GPUs' pointers", "GB/s", "higher"),
    "allreduce_busbw_gbps": ("NCCL all-reduce 256 MiB, 2 processes, bus bandwidth", "GB/s",
                             "higher"),
    "allreduce_8kib_us": ("NCCL all-reduce 8 KiB, 2 processes, latency", "us", "lower"),
    "ddp_step_ms": ("DDP step, 4 x Linear(4096) batch 256, 2 processes", "ms", "lower"),
    "one_gpu_kernels_per_s": ("small kernels, N clients on GPU 0", "kernels/s", "higher"),
    "two_gpu_kernels_per_s": ("small kernels, N clients on each of 2 GPUs", "kernels/s",
                              "higher"),
    "two_over_one_gpu": ("small kernels, aggregate on 2 GPUs / on 1", "x", "higher"),
    "machine_cores_busy": ("small kernels, whole machine: CPU cores busy (/proc/stat)", "cores",
                           None),
    "machine_cpu_us_per_kernel": ("small kernels, whole machine: CPU per kernel (/proc/stat)",
                                  "us", "lower"),
}
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
NCCL_SCRIPT = os.path.join(os.path.dirname(HERE), "tests", "gpu", "multi", "nccl_collectives.py")


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"peer_copy": os.path.join(h.bench_bin, "peer_copy"),
            "small_kernels": h.small_kernels, "nccl_collectives.py": NCCL_SCRIPT}


def gpu_count(h) -> int:
    return 2 if h.args.dry_run else h.gpus_listed()


def run(h, mode, rep):
    if gpu_count(h) < 2:
        h.fail("multigpu", list(METRICS), mode, rep, "fewer than two GPUs", status="skipped")
        return
    peer_copies(h, mode, rep)
    nccl(h, mode, rep)
    small_kernels(h, mode, rep)


def peer_copies(h, mode, rep):
    metrics = ["peer_copy_gbps", "peer_copy_back_gbps", "unified_copy_gbps"]
    argv = [os.path.join(h.bench_bin, "peer_copy")] + (["--quick"] if h.preset_name == "quick"
                                                       else [])
    procs = h.run_group(mode, [argv], f"multigpu.peer.{mode}.{rep}", timeout_s=120)
    rows = [r for r in parse_bench_csv(procs[0].stdout()) if r[0] == "peer_copy"]
    for _bench, metric, size, value, unit in rows:
        h.add("multigpu", metric, mode, rep, value, size=size, unit=unit)
    err = h.group_error(procs, "peer_copy")
    if err:
        got = {r[1] for r in rows}
        h.fail("multigpu", [m for m in metrics if m not in got] or metrics[:1], mode, rep, err)
        log(f"  multigpu peer copies {mode}: FAILED {err[:200]}")


def nccl(h, mode, rep):
    metrics = ["allreduce_busbw_gbps", "allreduce_8kib_us", "ddp_step_ms"]
    argv = [h.python, NCCL_SCRIPT, "--ranks", "2", "--bench"]
    procs = h.run_group(mode, [argv], f"multigpu.nccl.{mode}.{rep}", timeout_s=240,
                        extra_env=NCCL_ENV)
    # Each rank prints its own result line into the one stdout; rank 0's figures are the
    # report's (found wherever its line landed among the other rank's output).
    lines = re.findall(r"nccl_collectives: rank=0 [^\n]*?(?:PASS|FAIL)", procs[0].stdout())
    fields, verdict = parse_result_line(lines[-1] if lines else "", "nccl_collectives")
    err = h.group_error(procs, "nccl_collectives")
    if err or verdict != "PASS":
        h.fail("multigpu", metrics, mode, rep, err or f"rank 0's result: {verdict}")
        log(f"  multigpu nccl {mode}: FAILED {(err or verdict)[:200]}")
        return
    for metric, key in (("allreduce_busbw_gbps", "busbw_256mib"),
                        ("allreduce_8kib_us", "lat_8kib_us"), ("ddp_step_ms", "ddp_step_ms")):
        if key in fields:
            h.add("multigpu", metric, mode, rep, float(fields[key]))
    log(f"  multigpu nccl {mode}: busbw {fields.get('busbw_256mib')} GB/s, 8 KiB "
        f"{fields.get('lat_8kib_us')} us, DDP step {fields.get('ddp_step_ms')} ms")


def small_kernels(h, mode, rep):
    n = h.cfg["multigpu_small_n"]
    kernels = h.cfg["small_kernels"]
    rates = {}
    for label, gpus in (("one_gpu_kernels_per_s", [0]), ("two_gpu_kernels_per_s", [0, 1])):
        count = n * len(gpus)
        delay = 0.6 + h.start_delay[mode] * count
        start_at = time.time_ns() + int(delay * 1e9)
        argv = [h.small_kernels, "--kernels", str(kernels), "--start-at-ns", str(start_at)]
        envs = [{"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} for i in range(count)]
        procs = h.run_group(mode, [argv] * count, f"multigpu.small.{mode}.{rep}.{len(gpus)}",
                            timeout_s=delay + 60 + 0.5 * count, extra_envs=envs)
        err = h.group_error(procs, "small_kernels")
        results = [parse_result_line(p.stdout(), "small_kernels")[0] for p in procs]
        results = [r for r in results if "start_ns" in r and "end_ns" in r]
        if err or len(results) != count:
            h.fail("multigpu", [label, "two_over_one_gpu"], mode, rep, err or "results missing",
                   n=n)
            log(f"  multigpu small kernels {mode} on {len(gpus)} GPU(s): FAILED {err[:200]}")
            return
        span = (max(int(r["end_ns"]) for r in results)
                - min(int(r["start_ns"]) for r in results)) / 1e9
        rates[label] = count * kernels / span
        h.add("multigpu", label, mode, rep, rates[label], n=n)
        h.add_machine_cpu("multigpu", mode, rep, min(int(r["start_ns"]) for r in results),
                          max(int(r["end_ns"]) for r in results), count * kernels,
                          "machine_cpu_us_per_kernel", 1e6, n=f"{n} on {len(gpus)} GPU(s)")
    ratio = rates["two_gpu_kernels_per_s"] / rates["one_gpu_kernels_per_s"]
    h.add("multigpu", "two_over_one_gpu", mode, rep, ratio, n=n)
    log(f"  multigpu small kernels {mode}: {rates['one_gpu_kernels_per_s']:,.0f} kernels/s on one "
        f"GPU, {rates['two_gpu_kernels_per_s']:,.0f} on two ({ratio:.2f}x)")
