"""--dry-run: the harness runs every step (modes, groups, barriers, parsing, summary, report)
but each client program is replaced by this file, which prints what the program would print
with made-up figures. It proves the plumbing on a machine without a GPU; no figure of a dry run
means anything (the report says so).

Simulated: bench/kernel_latency (the mixed and priority workloads). Other programs exit 1 with
"dry run: <program> is not simulated", which the harness reports as a failed run."""
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


def main(argv: list[str]) -> int:
    program = os.path.basename(argv[0]) if argv else ""
    if program == "kernel_latency":
        return _kernel_latency(argv)
    print(f"dry run: {program} is not simulated", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
