"""The whole machine's CPU over a measured window: every process (clients, the daemon and its
servers, NVIDIA MPS's, the harness itself) from the first line of /proc/stat, sampled every
20 ms by a thread while a group runs, and read over the window the programs report
(start_ns..end_ns, CLOCK_REALTIME), so that process start-up outside the window is not counted.

  cores busy       = busy ticks in the window / ticks per second / the window's seconds
  CPU per unit     = busy ticks in the window / ticks per second / units of work done

Busy ticks: user, nice, system, irq, softirq and steal (not idle, not iowait)."""
from __future__ import annotations

import bisect
import os
import threading
import time

SAMPLE_S = 0.02


def busy_ticks(stat_text: str) -> int:
    """Busy ticks of the "cpu" line of /proc/stat's text."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
            return user + nice + system + irq + softirq + steal
    raise ValueError("no cpu line in /proc/stat")


def read_busy_ticks() -> int:
    with open("/proc/stat") as f:
        return busy_ticks(f.read())


class CpuSampler:
    """Samples (time_ns, busy ticks) from start() to stop()."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.ticks: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-cpu", daemon=True)

    def _sample(self) -> None:
        self.times.append(time.time_ns())
        self.ticks.append(read_busy_ticks())

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def start(self) -> "CpuSampler":
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def over(self, start_ns: int, end_ns: int) -> tuple[float, float] | None:
        """(cores busy, CPU seconds) from the last sample at or before start_ns to the first at
        or after end_ns (at most SAMPLE_S wider than the window); None when the samples do not
        cover it."""
        first = bisect.bisect_right(self.times, start_ns) - 1
        last = bisect.bisect_left(self.times, end_ns)
        if first < 0 or last >= len(self.times) or last <= first:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        cpu_s = (self.ticks[last] - self.ticks[first]) / hz
        wall_s = (self.times[last] - self.times[first]) / 1e9
        return cpu_s / wall_s, cpu_s
