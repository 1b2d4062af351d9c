"""--dry-run: the harness runs every step (modes, groups, barriers, parsing, summary, report)
but each client program is replaced by this file, which prints what the program would print
with made-up figures. It proves the plumbing on a machine without a GPU; no figure of a dry run
means anything (the report says so).

Simulated: bench/kernel_latency (the mixed and priority workloads), bench/peer_copy,
examples/small_kernels, tests/gpu/multi/nccl_collectives.py (the multigpu workload) and
bench/startup_client.py (the startup workload). Other
programs exit 1 with "dry run: <program> is not simulated", which the harness reports as a
failed run."""
from __future__ import annotations

import os
import random
import sys
import time


def dry_run_argv(argv: list[str]) -> list[str]:
    """The command that stands in for `argv`."""
    return [sys.executable, os.path.abspath(__file__)] + argv


def _option(argv, name, default):
    return float(argv[argv.index(name) + 1]) if name in argv else default


def _kernel_latency(argv) -> int:
    spin_us = _option(argv, "--ns", 10000) / 1000
    batch = int(_option(argv, "--batch", 1))
    seconds = min(_option(argv, "--duration-ms", 2000) / 1000, 0.2)
    if "--wait-go" in argv:
        print("# ready", flush=True)
        sys.stdin.readline()
    start = time.time_ns()
    time.sleep(seconds)
    end = time.time_ns()
    # Made up: a batch takes its kernels' time plus ~10 us, with some spread.
    per_batch = batch * spin_us + 10
    batches = max(1, int(seconds * 1e6 / per_batch))
    p50 = per_batch * random.uniform(1.0, 1.1)
    p99 = p50 * random.uniform(1.1, 1.5)
    print(f"kernel_latency: kernels={batches * batch} batches={batches} seconds={seconds:.3f} "
          f"kernels_per_s={batches * batch / seconds:.1f} p50_us={p50:.2f} "
          f"p90_us={p50 * 1.05:.2f} p99_us={p99:.2f} max_us={p99 * 1.2:.2f} start_ns={start} "
          f"end_ns={end} PASS")
    return 0


def _peer_copy(_argv) -> int:
    print("benchmark,metric,size_bytes,value,unit")
    for metric in ("peer_copy_gbps", "peer_copy_back_gbps", "unified_copy_gbps"):
        print(f"peer_copy,{metric},268435456,{random.uniform(300, 400):.4f},GB/s")
    print("peer_copy: peer_access=1 PASS")
    return 0


def _small_kernels(argv) -> int:
    kernels = int(_option(argv, "--kernels", 5000))
    start_at = int(_option(argv, "--start-at-ns", 0))
    time.sleep(max(0.0, (start_at - time.time_ns()) / 1e9))
    start = time.time_ns()
    time.sleep(0.05)
    end = time.time_ns()
    print(f"small_kernels: kernels={kernels} seconds={(end - start) / 1e9:.3f} start_ns={start} "
          f"end_ns={end} late_ms=0 PASS")
    return 0


def _nccl_collectives(_argv) -> int:
    for rank in (1, 0):
        print(f"nccl_collectives: rank={rank} world=2 all_reduce=True ddp=True "
              f"busbw_256mib={random.uniform(280, 300):.1f} "
              f"lat_8kib_us={random.uniform(25, 45):.1f} "
              f"ddp_step_ms={random.uniform(3, 4):.3f} PASS")
    return 0


def _startup_client(_argv) -> int:
    stamps = []
    for _ in range(4):  # imported, CUDA context, model on the GPU, first result
        time.sleep(0.01)
        stamps.append(time.monotonic_ns())
    print(f"startup_client: imported_ns={stamps[0]} cuda_ns={stamps[1]} model_ns={stamps[2]} "
          f"result_ns={stamps[3]} out_sum=1027.849731 PASS")
    return 0


def main(argv: list[str]) -> int:
    program = os.path.basename(argv[0]) if argv else ""
    if program.startswith("python") and len(argv) > 1:
        program = os.path.basename(argv[1])  # a script: the script is the program
    if program == "kernel_latency":
        return _kernel_latency(argv)
    if program == "peer_copy":
        return _peer_copy(argv)
    if program == "small_kernels":
        return _small_kernels(argv)
    if program == "nccl_collectives.py":
        return _nccl_collectives(argv)
    if program == "startup_client.py":
        return _startup_client(argv)
    print(f"dry run: {program} is not simulated", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
