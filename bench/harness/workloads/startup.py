"""bench/startup_client.py: how long a PyTorch program takes from its start to its first result,
as the first client after its mode's daemon started ("cold") and as the next one ("warm").

Before each mode's cold client the workload restarts that mode's daemon (mpsshimd, or NVIDIA
MPS's control daemon, whose server starts with its first client), so the cold figure includes
everything the first client after a daemon start pays. Natively there is nothing to restart.
Once per harness run, before any timed client, one untimed native run reads PyTorch and the
CUDA libraries into the page cache: a cold figure means a cold daemon, not a cold disk.

Two figures per run: from the process's start, and from the end of `import torch, torchvision`
(their import alone takes seconds and varies with the machine, not with the mode)."""
from __future__ import annotations

import os
import time

from ..common import HERE, log, parse_result_line

TITLE = "PyTorch start to first result (bench/startup_client.py)"
ESTIMATE_S = (60, 60)  # seconds per mode and repetition: --quick, --full
PROGRAM = "startup_client"

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "cold_s": ("first client after the daemon starts: process start to first result", "s",
               "lower"),
    "warm_s": ("the next client: process start to first result", "s", "lower"),
    "cold_cuda_s": ("first client: torch imported to first result", "s", "lower"),
    "warm_cuda_s": ("the next client: torch imported to first result", "s", "lower"),
    "out_sum": ("output check: sum of the logits (same seed in every mode)", "", None),
}


def programs(h) -> dict:
    return {}


def one_client(h, mode, tag):
    """Runs the client once; (its result fields and the instant it was started, in ns) or
    (None, why it failed)."""
    argv = [h.python, os.path.join(HERE, "startup_client.py")]
    started_ns = time.monotonic_ns()
    procs = h.run_group(mode, [argv], tag, timeout_s=180)
    err = h.group_error(procs, PROGRAM)
    if err:
        return None, err
    return parse_result_line(procs[0].stdout(), PROGRAM)[0], started_ns


def run(h, mode, rep):
    metrics = list(METRICS)
    if not getattr(h, "startup_disk_warm", False) and not h.args.dry_run:
        one_client(h, "native", f"startup.disk.{rep}")
        h.startup_disk_warm = True
    # The harness started the mode's daemon for this repetition and may have run other
    # workloads on it: start it again (nothing for native).
    h.stop_mode(mode)
    why = h.start_mode(mode, rep)
    if why:
        h.fail("startup", metrics, mode, rep, "daemon did not restart: " + why)
        log(f"  startup {mode}: daemon did not restart: {why}")
        return
    for which in ("cold", "warm"):
        fields, started = one_client(h, mode, f"startup.{mode}.{rep}.{which}")
        if fields is None:
            h.fail("startup", [f"{which}_s", f"{which}_cuda_s"], mode, rep, started)
            log(f"  startup {mode} {which}: FAILED {started[:240]}")
            continue
        total = (int(fields["result_ns"]) - started) / 1e9
        cuda = (int(fields["result_ns"]) - int(fields["imported_ns"])) / 1e9
        h.add("startup", f"{which}_s", mode, rep, total)
        h.add("startup", f"{which}_cuda_s", mode, rep, cuda)
        h.add("startup", "out_sum", mode, rep, float(fields["out_sum"]))
        log(f"  startup {mode} {which}: {total:.2f} s to the first result, {cuda:.2f} s after "
            f"the import")
