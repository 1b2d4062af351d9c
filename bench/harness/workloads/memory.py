"""bench/idle_client: N idle clients each holding 256 MiB; nvidia-smi memory.used."""
from __future__ import annotations

import os
import shutil
import time

from ..common import MIB, error_text, log
from ..modes import is_shim

TITLE = "GPU memory per client (bench/idle_client, 256 MiB each)"
ESTIMATE_S = (6, 6)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "mem_used_mib": ("GPU memory in use (nvidia-smi)", "MiB", "lower"),
    "mem_per_client_mib": ("(in use - idle GPU) / N", "MiB", "lower"),
    "mem_marginal_mib": ("marginal memory per extra client", "MiB", "lower"),
    "mem_daemon_idle_mib": ("in use with the daemon up, no client (at rest)", "MiB",
                                        "lower"),
}


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"idle_client": os.path.join(h.bench_bin, "idle_client")}


def once_only(cfg, rep) -> bool:
    return rep >= cfg["memory_reps"]


def run(h, mode, rep):
    if rep >= h.cfg["memory_reps"]:
        return
    used_by_n = {}
    run_dir = os.path.join(h.work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    env = h.env(mode)
    if mode != "native":
        idle = h.mem_used_mib()
        if is_shim(mode):
            # mpsshim's server releases its primary context --context-idle-timeout (60 s by
            # default) after the last client left or after its start: at rest is after that.
            t0 = time.monotonic()
            while idle is not None and idle > 150 and time.monotonic() - t0 < 75:
                time.sleep(0.5)
                idle = h.mem_used_mib()
            log(f"  memory shim: {idle} MiB at rest after {time.monotonic() - t0:.1f} s")
        if idle is not None:
            h.add("memory", "mem_daemon_idle_mib", mode, rep, idle, n=0)
    for n in h.cfg["memory_n"]:
        procs = h.start_idle_clients(mode, n, 256 * MIB, f"memory.{mode}.{rep}.n{n}",
                                     run_dir, env)
        try:
            ready = [p for p in procs if p.popen.poll() is None and p.is_ready()]
            if len(ready) == n:
                time.sleep(0.3)
                samples = [h.mem_used_mib() for _ in range(2)]
                samples = [s for s in samples if s is not None]
            else:
                samples = []
        finally:
            h.release(procs)
        h.keep_logs(procs, f"memory.{mode}.{rep}.n{n}")
        if len(ready) != n or not samples:
            bad = [p for p in procs if p not in ready] or procs
            err = (f"{n - len(ready)} of {n} clients not ready; first: "
                   + error_text(bad[0].stdout(), bad[0].stderr(), bad[0].rc, bad[0].timed_out)
                   if len(ready) != n else "nvidia-smi gave no memory.used")
            h.fail("memory", ["mem_used_mib", "mem_per_client_mib"], mode, rep, err, n=n)
            log(f"  memory {mode} n={n}: FAILED {err[:160]}")
            continue
        used = max(samples)
        used_by_n[n] = used
        h.add("memory", "mem_used_mib", mode, rep, used, n=n)
        if h.gpu_idle_mib is not None:
            h.add("memory", "mem_per_client_mib", mode, rep,
                  (used - h.gpu_idle_mib) / n, n=n)
        log(f"  memory {mode} n={n}: {used:.0f} MiB in use")
    if len(used_by_n) >= 2:
        lo, hi = min(used_by_n), max(used_by_n)
        h.add("memory", "mem_marginal_mib", mode, rep,
              (used_by_n[hi] - used_by_n[lo]) / (hi - lo), n=f"{lo}->{hi}")
