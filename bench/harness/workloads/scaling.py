"""Idle clients (1 MiB each) added in batches until one is refused, up to a cap; the broker's
CPU with 64 idle clients, from /proc."""
from __future__ import annotations

import os
import shutil
import time

from ..common import MIB, error_text, log

TITLE = "Client scaling (idle clients, 1 MiB each)"
ESTIMATE_S = (25, 45)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "max_clients": ("concurrent idle clients accepted", "clients", "higher"),
    "scaling_mem_mib": ("memory in use with N idle clients (1 MiB each)", "MiB", None),
    "idle_cpu_pct": ("broker CPU with N idle clients, % of one core", "%", "lower"),
}


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"idle_client": os.path.join(h.bench_bin, "idle_client")}


def once_only(cfg, rep) -> bool:
    return rep != 0


def run(h, mode, rep):
    if rep != 0:
        return
    cap, batch = h.cfg["scaling_cap"], h.cfg["scaling_batch"]
    run_dir = os.path.join(h.work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    env = h.env(mode)
    held, refusal = [], ""
    cpu_measured = False
    t_start = time.monotonic()
    try:
        while len(held) < cap and not refusal:
            count = min(batch, cap - len(held))
            procs = h.start_idle_clients(mode, count, MIB, f"scaling.{mode}.{len(held)}",
                                         run_dir, env, ready_timeout_s=45)
            for p in procs:
                if p.popen.poll() is None and p.is_ready():
                    held.append(p)
                else:
                    if not refusal:
                        if p.popen.poll() is None:
                            p.timed_out = True
                        refusal = error_text(p.stdout(), p.stderr(), p.popen.poll(),
                                             p.timed_out)
                    p.close_stdin()
                    p.kill()
                    h.keep_logs([p], f"scaling.{mode}.refused")
            used = h.mem_used_mib()
            if used is not None:
                h.add("scaling", "scaling_mem_mib", mode, rep, used, n=len(held))
            if len(held) == 64 and not cpu_measured:
                # Idle clients must cost the broker nothing: its workers park.
                cpu_measured = True
                pct = h.broker_cpu_pct(mode)
                if pct is not None:
                    h.add("scaling", "idle_cpu_pct", mode, rep, pct, n=64)
    finally:
        h.release(held)
    capped = not refusal and len(held) >= cap
    note = (f"cap {cap} reached, none refused" if capped else f"client {len(held) + 1} "
            f"refused: {refusal}")
    h.add("scaling", "max_clients", mode, rep, len(held), error=note)
    log(f"  scaling {mode}: {len(held)} clients ({note[:160]}) in "
        f"{time.monotonic() - t_start:.0f} s")
