"""bench/startup_client.py: how long a PyTorch program takes from its start to its first result,
as the first client after its mode's daemon started and as the next one.

Three clients one after the other:
- "first": the daemon was just started again; for mpsshim with a new, empty
  --image-verdict-dir, so its server scans every library image the client loads, as on the
  first start on a machine;
- "cold": the daemon was started again once more; mpsshim's server finds the verdicts the last
  one kept (the installed unit keeps them in /var/cache/mpsshim), as after any later restart;
- "warm": the next client of the same daemon.
NVIDIA MPS's control daemon starts its server with its first client, so it is started again
before "first" and "cold" as well; natively there is nothing to restart. Once per harness run,
before any timed client, one untimed native run reads PyTorch and the CUDA libraries into the
page cache: "first" and "cold" mean a fresh daemon, not a cold disk.

Two figures per client: from the process's start, and from the end of `import torch,
torchvision` (their import alone takes seconds and varies with the machine, not with the
mode)."""
from __future__ import annotations

import os
import shutil
import time

from ..common import HERE, log, parse_result_line
from ..modes import is_shim

TITLE = "PyTorch start to first result (bench/startup_client.py)"
ESTIMATE_S = (60, 60)  # seconds per mode and repetition: --quick, --full
PROGRAM = "startup_client"

CLIENTS = ("first", "cold", "warm")
# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "first_s": ("first client after the first start: process start to first result", "s",
                "lower"),
    "cold_s": ("first client after a restart: process start to first result", "s", "lower"),
    "warm_s": ("the next client: process start to first result", "s", "lower"),
    "first_cuda_s": ("first client after the first start: torch imported to first result", "s",
                     "lower"),
    "cold_cuda_s": ("first client after a restart: torch imported to first result", "s",
                    "lower"),
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


def restart(h, mode, rep) -> str:
    """Stops and starts the mode's daemon (nothing natively); "" or why it did not start."""
    h.stop_mode(mode)
    return h.start_mode(mode, rep)


def run(h, mode, rep):
    if not getattr(h, "startup_disk_warm", False) and not h.args.dry_run:
        one_client(h, "native", f"startup.disk.{rep}")
        h.startup_disk_warm = True
    if is_shim(mode):  # a new, empty directory: the first start scans every image
        verdicts = os.path.join(h.work, f"verdicts.{mode}.{rep}")
        shutil.rmtree(verdicts, ignore_errors=True)
        os.makedirs(verdicts, mode=0o755)
        h.extra_shim_args = ["--image-verdict-dir", verdicts]
    try:
        for which in CLIENTS:
            if which != "warm":
                why = restart(h, mode, rep)
                if why:
                    h.fail("startup", list(METRICS), mode, rep, "daemon did not restart: " + why)
                    log(f"  startup {mode}: daemon did not restart: {why}")
                    return
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
            log(f"  startup {mode} {which}: {total:.2f} s to the first result, {cuda:.2f} s "
                f"after the import")
    finally:
        h.extra_shim_args = []  # the daemon running now keeps them until the mode stops
