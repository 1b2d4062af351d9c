"""The whole machine's CPU over a measured window: every process (clients, the daemon and its
servers, NVIDIA MPS's, the harness itself) from the first line of /proc/stat, sampled every
20 ms by a thread while a group runs, and read over the window the programs report
(start_ns..end_ns, CLOCK_REALTIME), so that process start-up outside the window is not counted.

  cores busy       = busy ticks in the window / ticks per second / the window's seconds
  CPU per unit     = busy ticks in the window / ticks per second / units of work done

Busy ticks: user, nice, system, irq, softirq and steal (not idle, not iowait).

The same samples can follow a set of processes (CpuSampler(pids)): the broker's, from the
nanoseconds each of their threads ran (/proc/<pid>/task/<tid>/schedstat), read over the same
window, so the broker's CPU per unit of work excludes what its clients' start and end cost it.
Nanoseconds, not /proc/<pid>/stat's clock ticks: a window of 60 ms (5,000 small kernels) is six
ticks, so one tick more or less moved the broker's CPU per kernel by 2 us at one client. A thread
that exits inside the window is not counted (a server's workers live as long as it)."""
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


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except (OSError, ValueError):
        pass
    return kids


def _tree_sum(pids: list[int], count) -> int | None:
    """The sum of count(pid, stat fields after the name) over the processes and their children,
    found again at each call: a server its daemon starts meanwhile (NVIDIA MPS's, at its first
    client) counts from then on. None when one of `pids` is gone."""
    total, seen = 0, set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += count(pid, fields)
        except (OSError, IndexError, ValueError):
            if pid in pids:
                return None
            continue  # a child that just exited
        todo.extend(_children(pid))
    return total


def process_ticks(pids: list[int]) -> int | None:
    """utime + stime of the processes and of their children (all their threads), and of the
    children they reaped (cutime + cstime: a child that exits in the window, a server or a
    helper, leaves its CPU to its parent's), in clock ticks."""
    return _tree_sum(pids, lambda _pid, fields: sum(int(v) for v in fields[11:15]))


def _task_ns(pid: int) -> int | None:
    """Nanoseconds every live thread of `pid` ran (schedstat's first field); None when the
    kernel does not say (no schedstat) or the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            continue  # a thread that just exited
        except (OSError, IndexError, ValueError):
            return None
    return total


def process_cpu_ns(pids: list[int]) -> int | None:
    """CPU nanoseconds of the processes and of their children (every live thread), and of the
    children they reaped (cutime + cstime, in ticks); a process whose threads the kernel does
    not time counts its own utime + stime ticks."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def count(pid: int, fields: list[str]) -> int:
        own = _task_ns(pid)
        if own is None:
            own = sum(int(v) for v in fields[11:13]) * tick_ns
        return own + sum(int(v) for v in fields[13:15]) * tick_ns

    return _tree_sum(pids, count)


class CpuSampler:
    """Samples (time_ns, busy ticks, and the followed processes' CPU ns) from start() to stop()."""

    def __init__(self, pids: list[int] | None = None) -> None:
        self.times: list[int] = []
        self.ticks: list[int] = []
        self.pids = list(pids or [])
        self.process: list[int | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-cpu", daemon=True)

    def _sample(self) -> None:
        self.times.append(time.time_ns())
        self.ticks.append(read_busy_ticks())
        self.process.append(process_cpu_ns(self.pids) if self.pids else None)

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

    def processes_over(self, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds of the followed processes while the window runs: their rate between the
        first and the last sample inside it, times its length, when two or more samples lie
        inside it a quarter of it or more apart. The samples just outside it (as over() reads
        them) would add up to SAMPLE_S on each side, when the clients start and end, which
        costs a broker milliseconds that a window of tens of milliseconds cannot dilute; they
        are the fallback for a shorter window. None without processes, when the samples do not
        cover it or one of the followed processes ended."""
        inner_first = bisect.bisect_left(self.times, start_ns)
        inner_last = bisect.bisect_right(self.times, end_ns) - 1
        if inner_last > inner_first:
            span = self.times[inner_last] - self.times[inner_first]
            if 4 * span >= end_ns - start_ns:
                a, b = self.process[inner_first], self.process[inner_last]
                if a is None or b is None:
                    return None
                return (b - a) / 1e9 * (end_ns - start_ns) / span
        first = bisect.bisect_right(self.times, start_ns) - 1
        last = bisect.bisect_left(self.times, end_ns)
        if first < 0 or last >= len(self.times) or last <= first:
            return None
        a, b = self.process[first], self.process[last]
        if a is None or b is None:
            return None
        return (b - a) / 1e9
