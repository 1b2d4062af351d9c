#!/usr/bin/env python3
"""mpsshim benchmark harness: every workload natively (time-slicing), under NVIDIA MPS and under
mpsshim, interleaved, with a CSV, a Markdown report and PNG plots.

usage (on a machine with an NVIDIA GPU, as root for NVIDIA MPS):

    python3 bench/harness.py --build-dir build --out bench-results --quick   # < 5 minutes
    python3 bench/harness.py --build-dir build --out bench-results --full    # <= 9 minutes
      [--modes native,mps,shim,shim-eager] [--workloads launch,bandwidth,concurrency,mixed,memory,resnet,scaling]
      [--reps R] [--budget-s S] [--python PYTHON] [--daemon-arg=--log-level=debug ...]
    python3 bench/harness.py --render RESULTS_DIR --out DIR   # re-render from results.csv/json

The programs come from --build-dir (libshim/, broker/, examples/small_kernels, bench/); a build
copied to another machine needs its shared libraries there too (libfmt.so.9: LD_LIBRARY_PATH).
--quick: 3 repetitions, small_kernels N in {1,8,32}, memory N in {1,4}, ResNet N in {1,8}, scaling
up to 256 clients (the broker's CPU with 64 idle clients measured from /proc on the way). --full:
N in {1,2,...,64}, memory N in {1,4,16}, ResNet N in {1,4,8}, scaling up to 256. Both stop
starting new work when their time budget (265 s / 500 s) would be exceeded and
say what was skipped. See docs/benchmarks.md.

Modes:
  native  the real driver, no MPS: processes time-slice the GPU
  mps     NVIDIA MPS: nvidia-cuda-mps-control -d with private CUDA_MPS_PIPE_DIRECTORY and
          CUDA_MPS_LOG_DIRECTORY under --out; always quit ("echo quit | nvidia-cuda-mps-control")
  shim    mpsshim: mpsshimd --runtime-dir DIR --server BUILD/.../mpsshim-server; clients get
          CUDA_MPS_PIPE_DIRECTORY=DIR LD_PRELOAD=BUILD/libshim/libmpsshim.so; stopped with
          "mpsshimctl --runtime-dir DIR quit"
  shim-eager  mpsshim as above with mpsshimd --launch-batching=off: every kernel launch goes
          out on its own (docs/launch-batching.md), to measure what batching gives
Only one daemon runs at a time. Each repetition runs the modes in a rotated order (native, mps,
shim; then mps, shim, native; ...) so that drift hits every mode alike.

Workloads:
  launch       bench/launch_latency: async empty-kernel launch (client CPU), launch+sync round
               trips, cuMemAlloc+cuMemFree
  bandwidth    bench/bandwidth: H2D/D2H, pageable and pinned, 4 KiB .. 256 MiB
  concurrency  N copies of examples/small_kernels (2 blocks x 32 threads, ~10 us kernels, sync
               every 64) started together (--start-at-ns): per-process seconds, aggregate kernels/s,
               and the broker's CPU per kernel (its processes' utime + stime from /proc over the
               group, clients' setup included; MPS and mpsshim modes)
  mixed        bench/kernel_latency: a few clients with large kernels (many blocks, 2 ms) and many
               with small ones (10 us, sync after each): small kernels' p50/p99 latency and the
               aggregate throughput of both
  memory       bench/idle_client: N idle clients each holding 256 MiB; nvidia-smi memory.used
  resnet       bench/resnet_client.py: PyTorch ResNet-50 batch 1 inference, N processes
  scaling      idle clients (1 MiB each) added in batches until one is refused, up to a cap

Every figure is the median over repetitions (and, where a run has several processes, over those
processes) with min and max beside it. Nothing here asserts a timing: a failed run is reported as
failed with the first lines of its error, never dropped. Exit status: 0 when the harness ran
(whatever failed inside), 2 on bad usage or missing programs.

Outputs in --out: results.csv (every sample), summary.csv (median/min/max per figure),
report.md, results.json, *.png (when matplotlib can be imported; else plot_data.json), logs/.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
MODE_LABEL = {"native": "native (time-slicing)", "mps": "NVIDIA MPS", "shim": "mpsshim",
              "shim-eager": "mpsshim, launch batching off"}
ALL_MODES = ["native", "mps", "shim", "shim-eager"]
# The mpsshim modes and what each adds to mpsshimd's command line (after --daemon-arg):
# "shim-eager" measures the daemon's defaults without launch batching, side by side
# (docs/launch-batching.md).
SHIM_MODES = {"shim": [], "shim-eager": ["--launch-batching=off"]}


def is_shim(mode: str) -> bool:
    return mode in SHIM_MODES
ALL_WORKLOADS = ["launch", "bandwidth", "concurrency", "mixed", "memory", "resnet", "scaling"]
MIB = 1 << 20

PRESETS = {
    "quick": {
        "reps": 3,
        "budget_s": 265,
        "launch_args": ["--quick"],
        "bandwidth_args": ["--quick", "--sizes", "4K,64K,1M,16M,256M"],
        "concurrency_n": [1, 8, 32],
        "concurrency_big_reps": 2,
        "small_kernels": 5000,
        "mixed_large": 2,
        "mixed_small": 8,
        "mixed_duration_ms": 1500,
        "memory_n": [1, 4],
        "memory_reps": 2,
        "scaling_cap": 256,
        "scaling_batch": 32,
        "resnet_n": [1, 8],
        "resnet_iters": 100,
        "resnet_reps": 1,
        "resnet_ready_s": 75,
    },
    "full": {
        "reps": 3,
        "budget_s": 500,
        "launch_args": ["--launches", "50000", "--repeats", "5", "--trips", "5000",
                        "--allocs", "5000"],
        "bandwidth_args": ["--repeats", "3", "--bytes-per-repeat", "32M"],
        "concurrency_n": [1, 2, 4, 8, 16, 32, 64],
        "concurrency_big_reps": 2,
        "small_kernels": 5000,
        "mixed_large": 2,
        "mixed_small": 8,
        "mixed_duration_ms": 1500,
        "memory_n": [1, 4, 16],
        "memory_reps": 2,
        "scaling_cap": 256,
        "scaling_batch": 32,
        "resnet_n": [1, 4, 8],
        "resnet_iters": 200,
        "resnet_reps": 1,
        "resnet_ready_s": 90,
    },
}

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    ("launch", "launch_async_cpu"): ("empty-kernel async launch, client CPU", "us", "lower"),
    ("launch", "launch_stream_sync"): ("launch + cuStreamSynchronize round trip", "us", "lower"),
    ("launch", "launch_stream_sync_p99"): ("launch + cuStreamSynchronize, p99", "us", "lower"),
    ("launch", "launch_ctx_sync"): ("launch + cuCtxSynchronize round trip", "us", "lower"),
    ("launch", "launch_ctx_sync_p99"): ("launch + cuCtxSynchronize, p99", "us", "lower"),
    ("launch", "ctx_sync_idle"): ("cuCtxSynchronize, idle", "us", "lower"),
    ("launch", "mem_alloc_free"): ("cuMemAlloc + cuMemFree (1 MiB)", "us", "lower"),
    ("launch", "ctx_get_device"): ("cuCtxGetDevice", "ns", "lower"),
    ("concurrency", "agg_kernels_per_s"): ("small kernels, aggregate", "kernels/s", "higher"),
    ("concurrency", "per_proc_s"): ("small kernels, per-process loop", "s", "lower"),
    ("concurrency", "slowest_proc_s"): ("small kernels, slowest process", "s", "lower"),
    ("concurrency", "late_ms"): ("small kernels, latest start after the barrier", "ms", None),
    ("concurrency", "broker_cpu_us_per_kernel"): ("small kernels, broker CPU per kernel (/proc)", "us",
                                                  "lower"),
    ("mixed", "small_p50_us"): ("small-kernel latency p50 (launch+sync)", "us", "lower"),
    ("mixed", "small_p99_us"): ("small-kernel latency p99 (launch+sync)", "us", "lower"),
    ("mixed", "small_agg_kernels_per_s"): ("small kernels, aggregate", "kernels/s", "higher"),
    ("mixed", "large_agg_kernels_per_s"): ("large kernels, aggregate", "kernels/s", "higher"),
    ("memory", "mem_used_mib"): ("GPU memory in use (nvidia-smi)", "MiB", "lower"),
    ("memory", "mem_per_client_mib"): ("(in use - idle GPU) / N", "MiB", "lower"),
    ("memory", "mem_marginal_mib"): ("marginal memory per extra client", "MiB", "lower"),
    ("memory", "mem_daemon_idle_mib"): ("in use with the daemon up, no client (at rest)", "MiB",
                                        "lower"),
    ("resnet", "ms_per_iter"): ("ResNet-50 b1, per-process", "ms/iter", "lower"),
    ("resnet", "agg_iters_per_s"): ("ResNet-50 b1, aggregate", "iters/s", "higher"),
    ("resnet", "out_sum"): ("output check: sum of the logits (same seed in every mode)", "", None),
    ("scaling", "max_clients"): ("concurrent idle clients accepted", "clients", "higher"),
    ("scaling", "scaling_mem_mib"): ("memory in use with N idle clients (1 MiB each)", "MiB", None),
    ("scaling", "idle_cpu_pct"): ("broker CPU with N idle clients, % of one core", "%", "lower"),
}
for _series in ["h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable"]:
    for _kind in ["sync", "async"]:
        METRICS[("bandwidth", f"{_series}_{_kind}")] = (
            f"{_series.replace('_', ' ').upper().replace('PINNED', 'pinned').replace('PAGEABLE', 'pageable')}"
            f" ({_kind})", "GB/s", "higher")


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[harness {stamp}] {message}", flush=True)


def size_label(size: int) -> str:
    if size >= MIB and size % MIB == 0:
        return f"{size // MIB} MiB"
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


def parse_result_line(text: str, program: str) -> tuple[dict, str]:
    """The last "<program>: k=v ... PASS|FAIL" line: (fields, verdict PASS|FAIL|NONE)."""
    line = ""
    for candidate in text.splitlines():
        if candidate.startswith(program + ": "):
            line = candidate
    if not line:
        return {}, "NONE"
    words = line[len(program) + 2:].split()
    verdict = words[-1] if words and words[-1] in ("PASS", "FAIL") else "NONE"
    fields = {}
    for word in words:
        if "=" in word:
            key, value = word.split("=", 1)
            fields[key] = value
    return fields, verdict


def parse_bench_csv(text: str) -> list[tuple[str, str, int, float, str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) != 5 or parts[0] == "benchmark":
            continue
        try:
            rows.append((parts[0], parts[1], int(parts[2]), float(parts[3]), parts[4]))
        except ValueError:
            continue
    return rows


def error_text(stdout: str, stderr: str, rc, timed_out: bool) -> str:
    """What went wrong, in a line: the FAIL line and the first lines of stderr."""
    pieces = []
    if timed_out:
        pieces.append("timed out")
    fail = [line for line in stdout.splitlines() if line.endswith(" FAIL")]
    if fail:
        pieces.append(fail[-1].strip())
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        # Python: the exception (last line) says more than the traceback's first lines.
        tail = [line for line in lines if not line.startswith(("File ", "Traceback", "^", "~"))]
        pieces.extend(tail[-2:])
    else:
        pieces.extend(lines[:3])
    if not pieces:
        pieces.append(f"exit status {rc}, no output")
    text = " | ".join(pieces)
    return text[:400]


class Proc:
    """A started program with stdout/stderr in files (no pipe can fill up)."""

    def __init__(self, argv, env, work_dir, tag, stdin_pipe=False):
        self.argv = argv
        self.tag = tag
        self.out_path = os.path.join(work_dir, tag + ".out")
        self.err_path = os.path.join(work_dir, tag + ".err")
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.popen = subprocess.Popen(
            argv, env=env, stdout=self._out, stderr=self._err,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL)
        self.timed_out = False

    def stdout(self) -> str:
        with open(self.out_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stderr(self) -> str:
        with open(self.err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def is_ready(self) -> bool:
        return "# ready" in self.stdout()

    def send(self, text: str) -> None:
        if self.popen.stdin is None:
            return
        try:
            self.popen.stdin.write(text.encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close_stdin(self) -> None:
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def wait(self, deadline: float):
        try:
            self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
        self._out.close()
        self._err.close()
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.kill()  # this pid only
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    @property
    def rc(self):
        return self.popen.returncode


class Harness:
    def __init__(self, args):
        self.args = args
        self.preset_name = "full" if args.full else "quick"
        self.cfg = dict(PRESETS[self.preset_name])
        if args.reps:
            self.cfg["reps"] = args.reps
        if args.budget_s:
            self.cfg["budget_s"] = args.budget_s
        self.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        self.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
        for m in self.modes:
            if m not in ALL_MODES:
                sys.exit(f"harness: unknown mode {m} ({', '.join(ALL_MODES)})")
        for w in self.workloads:
            if w not in ALL_WORKLOADS:
                sys.exit(f"harness: unknown workload {w} ({', '.join(ALL_WORKLOADS)})")
        self.out = os.path.abspath(args.out)
        self.work = os.path.join(self.out, "work")
        self.logs = os.path.join(self.out, "logs")
        for d in (self.out, self.work, self.logs):
            os.makedirs(d, exist_ok=True)
        build = os.path.abspath(args.build_dir)
        self.build = build
        self.shim_lib = os.path.join(build, "libshim", "libmpsshim.so")
        self.daemon = self._find(build, "mpsshimd")
        self.ctl = self._find(build, "mpsshimctl")
        self.server = self._find(build, "mpsshim-server")
        self.small_kernels = os.path.join(build, "examples", "small_kernels")
        self.bench_bin = os.path.join(build, "bench")
        self.resnet_script = os.path.join(HERE, "resnet_client.py")
        self.python = args.python or sys.executable
        self.smi = shutil.which("nvidia-smi") or "/usr/local/nvidia/bin/nvidia-smi"
        self.mps_control = (shutil.which("nvidia-cuda-mps-control")
                            or "/usr/local/nvidia/bin/nvidia-cuda-mps-control")
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.t0 = time.monotonic()
        self.item_cost: dict = {}
        # small_kernels barrier: seconds per process to wait before the common start. Context
        # creation is serialised: ~0.1 s per process natively and under NVIDIA MPS on the H200
        # machine (gVisor), a few ms under mpsshim. Raised when a copy arrives late.
        self.start_delay = {"native": 0.11, "mps": 0.11, "shim": 0.03, "shim-eager": 0.03}
        self.shim_dir = ""
        self.shim_proc = None
        self.mps_dirs = None
        self.gpu_idle_mib = None
        self.failed_once: dict = {}
        self.meta: dict = {}

    # ---- paths -------------------------------------------------------------------------------
    @staticmethod
    def _find(root: str, name: str) -> str:
        for dirpath, _dirs, files in os.walk(root):
            if name in files:
                path = os.path.join(dirpath, name)
                if os.access(path, os.X_OK):
                    return path
        return ""

    def check_programs(self) -> None:
        needed = {}
        if "concurrency" in self.workloads:
            needed["small_kernels"] = self.small_kernels
        for w, prog in [("launch", "launch_latency"), ("bandwidth", "bandwidth"),
                        ("mixed", "kernel_latency"), ("memory", "idle_client"),
                        ("scaling", "idle_client")]:
            if w in self.workloads:
                needed[prog] = os.path.join(self.bench_bin, prog)
        if any(is_shim(m) for m in self.modes):
            needed.update({"libmpsshim.so": self.shim_lib, "mpsshimd": self.daemon,
                           "mpsshimctl": self.ctl, "mpsshim-server": self.server})
        missing = [f"{k} ({v or 'not found'})" for k, v in needed.items()
                   if not v or not os.path.exists(v)]
        if missing:
            print("harness: missing programs: " + ", ".join(missing)
                  + f"; build with: meson setup {self.build} && ninja -C {self.build}",
                  file=sys.stderr)
            sys.exit(2)

    # ---- environment per mode ----------------------------------------------------------------
    def env(self, mode: str, extra: dict | None = None) -> dict:
        env = dict(os.environ)
        for key in ("LD_PRELOAD", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                    "NOTIFY_SOCKET"):
            env.pop(key, None)
        if mode == "mps":
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_dirs[0]
            env["CUDA_MPS_LOG_DIRECTORY"] = self.mps_dirs[1]
        elif is_shim(mode):
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.shim_dir
            env["LD_PRELOAD"] = self.shim_lib
        env.setdefault("PYTHONUNBUFFERED", "1")
        if extra:
            env.update(extra)
        return env

    # ---- nvidia-smi --------------------------------------------------------------------------
    def smi_query(self, fields: str) -> list[str]:
        try:
            out = subprocess.run([self.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20).stdout
            return [x.strip() for x in out.splitlines()[0].split(",")]
        except (OSError, subprocess.SubprocessError, IndexError):
            return []

    def mem_used_mib(self) -> float | None:
        values = self.smi_query("memory.used")
        try:
            return float(values[0])
        except (IndexError, ValueError):
            return None

    def wait_gpu_idle(self, timeout_s: float = 8.0) -> None:
        """After a daemon stops: wait until memory.used is back near the idle GPU's."""
        if self.gpu_idle_mib is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            used = self.mem_used_mib()
            if used is None or used <= self.gpu_idle_mib + 64:
                return
            time.sleep(0.25)
        log(f"GPU memory still {self.mem_used_mib()} MiB (idle {self.gpu_idle_mib}) after {timeout_s} s")

    # ---- daemons -----------------------------------------------------------------------------
    def start_mode(self, mode: str, rep: int) -> str:
        """Starts the mode's daemon; returns "" or why it did not start."""
        if mode == "mps":
            return self.mps_start(rep)
        if is_shim(mode):
            return self.shim_start(rep, SHIM_MODES[mode])
        return ""

    def stop_mode(self, mode: str) -> None:
        if mode == "mps":
            self.mps_stop()
        elif is_shim(mode):
            self.shim_stop()
        self.wait_gpu_idle()

    def mps_start(self, rep: int) -> str:
        if not os.access(self.mps_control, os.X_OK):
            return f"nvidia-cuda-mps-control not found ({self.mps_control})"
        if os.geteuid() != 0:
            return "not root: NVIDIA MPS not started"
        base = os.path.join(self.work, f"mps.{rep}")
        pipe, logd = os.path.join(base, "pipe"), os.path.join(base, "log")
        os.makedirs(pipe, exist_ok=True)
        os.makedirs(logd, exist_ok=True)
        self.mps_dirs = (pipe, logd)
        env = self.env("mps")
        env["PATH"] = os.path.dirname(self.mps_control) + ":" + env.get("PATH", "")
        try:
            r = subprocess.run([self.mps_control, "-d"], env=env, capture_output=True, text=True,
                               timeout=30)
        except subprocess.SubprocessError as e:
            return f"nvidia-cuda-mps-control -d: {e}"
        if r.returncode != 0:
            return f"nvidia-cuda-mps-control -d failed ({r.returncode}): {r.stderr.strip()[:200]}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(pipe, "control")):
                return ""
            time.sleep(0.05)
        return f"NVIDIA MPS control pipe did not appear in {pipe}"

    def mps_stop(self) -> None:
        if not self.mps_dirs:
            return
        pipe, logd = self.mps_dirs
        env = self.env("mps")
        control_log = os.path.join(logd, "control.log")

        def exits_logged() -> int:
            try:
                with open(control_log, "rb") as f:
                    return f.read().count(b"Exit with status")
            except OSError:
                return 0

        before = exits_logged()
        try:
            subprocess.run([self.mps_control], input="quit\n", env=env, capture_output=True,
                           text=True, timeout=30)
        except subprocess.SubprocessError as e:
            log(f"echo quit | nvidia-cuda-mps-control failed: {e}")
        # Gone when its log says so (the control pipe itself may stay behind) or the pipe went.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if exits_logged() > before or not os.path.exists(os.path.join(pipe, "control")):
                break
            time.sleep(0.05)
        else:
            log("NVIDIA MPS control daemon: no exit logged 15 s after quit")
        for name in ("control.log", "server.log"):
            src = os.path.join(logd, name)
            if os.path.exists(src):
                with open(src, "rb") as f, open(os.path.join(self.logs, "mps." + name), "ab") as g:
                    g.write(f.read())
        self.mps_dirs = None

    def shim_servers_running(self) -> tuple[bool, str]:
        try:
            r = subprocess.run([self.ctl, "--runtime-dir", self.shim_dir, "server_list"],
                               capture_output=True, text=True, timeout=5, env=self.env("native"))
        except subprocess.SubprocessError as e:
            return False, str(e)
        text = (r.stdout + r.stderr).strip()
        return r.returncode == 0 and "running" in text.split(), text

    def shim_start(self, rep: int, mode_args: list[str]) -> str:
        self.shim_dir = os.path.join(self.work, f"shim.{rep}")
        os.makedirs(self.shim_dir, exist_ok=True)
        log_path = os.path.join(self.logs, f"mpsshimd.{rep}.log")
        self.shim_log = open(log_path, "wb")
        self.shim_proc = subprocess.Popen(
            [self.daemon, "--runtime-dir", self.shim_dir, "--server", self.server]
            + self.args.daemon_arg + mode_args,
            env=self.env("native"), stdout=self.shim_log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        said = ""
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(self.shim_dir, "control")):
                ok, said = self.shim_servers_running()
                if ok:
                    return ""
            if self.shim_proc.poll() is not None and self.shim_proc.returncode != 0:
                break
            time.sleep(0.1)
        with open(log_path, "rb") as f:
            tail = f.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        return f"mpsshimd not ready: server_list said {said[:120]!r}; log: {' | '.join(tail)}"[:400]

    def shim_wait_ready(self, timeout_s: float = 15) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.shim_servers_running()[0]:
                return True
            time.sleep(0.2)
        return False

    def shim_stop(self) -> None:
        if not self.shim_proc:
            return
        try:
            subprocess.run([self.ctl, "--runtime-dir", self.shim_dir, "quit"], capture_output=True,
                           timeout=15, env=self.env("native"))
        except subprocess.SubprocessError:
            pass
        try:
            self.shim_proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            log(f"mpsshimd ({self.shim_proc.pid}) ignored quit: SIGTERM")
            self.shim_proc.terminate()
            try:
                self.shim_proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.shim_proc.kill()
                self.shim_proc.wait(timeout=10)
        self.shim_log.close()
        self.shim_proc = None

    # ---- rows --------------------------------------------------------------------------------
    def add(self, workload, metric, mode, rep, value, n="", size=0, status="ok", error="",
            unit=None):
        if unit is None:
            unit = METRICS.get((workload, metric), ("", "", None))[1]
        self.rows.append({"workload": workload, "metric": metric, "n": n, "size_bytes": size,
                          "mode": mode, "rep": rep,
                          "value": "" if value is None else round(float(value), 6),
                          "unit": unit, "status": status, "error": error})

    def fail(self, workload, metrics, mode, rep, error, n="", size=0, status="failed"):
        for metric in metrics:
            self.add(workload, metric, mode, rep, None, n=n, size=size, status=status, error=error)

    def keep_logs(self, procs, tag) -> None:
        """Copies the output of failed processes (and the first process) into logs/."""
        for i, p in enumerate(procs):
            if i == 0 or p.rc != 0 or p.timed_out:
                for src, ext in ((p.out_path, "out"), (p.err_path, "err")):
                    if os.path.exists(src) and os.path.getsize(src) > 0:
                        shutil.copyfile(src, os.path.join(self.logs, f"{tag}.{i}.{ext}"))

    # ---- running groups ----------------------------------------------------------------------
    def run_group(self, mode, argvs, tag, timeout_s, wait_go=False, ready_timeout_s=60.0,
                  go_delay_s=0.25, extra_env=None):
        """Starts every argv at once; with wait_go, waits for all "# ready", then sends one go
        instant to all. Returns the Procs (waited for; killed at the deadline)."""
        run_dir = os.path.join(self.work, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        env = self.env(mode, extra_env)
        procs = [Proc(a, env, run_dir, f"{tag}.{i}", stdin_pipe=wait_go)
                 for i, a in enumerate(argvs)]
        try:
            if wait_go:
                deadline = time.monotonic() + ready_timeout_s
                while time.monotonic() < deadline:
                    pending = [p for p in procs if p.popen.poll() is None and not p.is_ready()]
                    if not pending:
                        break
                    time.sleep(0.05)
                go = time.time_ns() + int(go_delay_s * 1e9)
                for p in procs:
                    if p.popen.poll() is None and not p.is_ready():
                        p.timed_out = True  # not ready in time
                        p.kill()
                for p in procs:
                    p.send(f"{go}\n")
                    p.close_stdin()
            deadline = time.monotonic() + timeout_s
            for p in procs:
                p.wait(deadline)
        finally:
            for p in procs:
                p.kill()
        self.keep_logs(procs, tag)
        return procs

    @staticmethod
    def group_error(procs, program) -> str:
        bad = [p for p in procs if p.rc != 0 or p.timed_out
               or parse_result_line(p.stdout(), program)[1] != "PASS"]
        if not bad:
            return ""
        first = bad[0]
        text = error_text(first.stdout(), first.stderr(), first.rc, first.timed_out)
        return f"{len(bad)} of {len(procs)} processes failed; first: {text}"

    # ---- workloads ---------------------------------------------------------------------------
    def w_launch(self, mode, rep):
        argv = [os.path.join(self.bench_bin, "launch_latency")] + self.cfg["launch_args"]
        procs = self.run_group(mode, [argv], f"launch.{mode}.{rep}", timeout_s=120)
        p = procs[0]
        out = p.stdout()
        rows = [r for r in parse_bench_csv(out) if r[0] == "launch_latency"]
        for _bench, metric, size, value, unit in rows:
            self.add("launch", metric, mode, rep, value, size=0, unit=unit)
        err = self.group_error(procs, "launch_latency")
        if err:
            got = {r[1] for r in rows}
            missing = [m for (w, m) in METRICS if w == "launch" and m not in got]
            self.fail("launch", missing or ["launch_async_cpu"], mode, rep, err)

    def w_bandwidth(self, mode, rep):
        argv = [os.path.join(self.bench_bin, "bandwidth")] + self.cfg["bandwidth_args"]
        procs = self.run_group(mode, [argv], f"bandwidth.{mode}.{rep}", timeout_s=180)
        rows = [r for r in parse_bench_csv(procs[0].stdout()) if r[0] == "bandwidth"]
        for _bench, metric, size, value, unit in rows:
            self.add("bandwidth", metric, mode, rep, value, size=size, unit=unit)
        err = self.group_error(procs, "bandwidth")
        if err:
            self.fail("bandwidth", ["h2d_pinned_sync"], mode, rep, err, size=0)

    def w_concurrency(self, mode, rep):
        metrics = ["agg_kernels_per_s", "per_proc_s", "slowest_proc_s", "late_ms"]
        kernels = self.cfg["small_kernels"]
        for n in self.cfg["concurrency_n"]:
            if n >= 16 and rep >= self.cfg.get("concurrency_big_reps", 99):
                continue  # the large N cost most: fewer repetitions (the preset says how many)
            key = ("concurrency", mode, n)
            if key in self.failed_once:
                self.fail("concurrency", metrics, mode, rep, "not run: failed in an earlier "
                          "repetition: " + self.failed_once[key], n=n, status="skipped")
                continue
            delay = 0.6 + self.start_delay[mode] * n
            start_at = time.time_ns() + int(delay * 1e9)
            argv = [self.small_kernels, "--kernels", str(kernels), "--start-at-ns", str(start_at)]
            ticks_before = self.broker_ticks(mode)
            procs = self.run_group(mode, [argv] * n, f"concurrency.{mode}.{rep}.n{n}",
                                   timeout_s=delay + 60 + 0.5 * n)
            ticks_after = self.broker_ticks(mode)
            err = self.group_error(procs, "small_kernels")
            results = [parse_result_line(p.stdout(), "small_kernels")[0] for p in procs]
            results = [r for r in results if "start_ns" in r]
            if err:
                self.failed_once[key] = err
                self.fail("concurrency", metrics, mode, rep, err, n=n)
                log(f"  concurrency {mode} n={n}: FAILED {err[:160]}")
                continue
            starts = [int(r["start_ns"]) for r in results]
            ends = [int(r["end_ns"]) for r in results]
            seconds = [float(r["seconds"]) for r in results]
            late = max(float(r.get("late_ms", 0)) for r in results)
            span = (max(ends) - min(starts)) / 1e9
            self.add("concurrency", "agg_kernels_per_s", mode, rep, n * kernels / span, n=n)
            for s in seconds:
                self.add("concurrency", "per_proc_s", mode, rep, s, n=n)
            self.add("concurrency", "slowest_proc_s", mode, rep, max(seconds), n=n)
            self.add("concurrency", "late_ms", mode, rep, late, n=n)
            if ticks_before is not None and ticks_after is not None:
                # The broker's CPU (every thread of the daemon and the server, or of NVIDIA MPS's
                # processes) over the whole group, clients' setup included, per kernel launched.
                hz = os.sysconf("SC_CLK_TCK")
                self.add("concurrency", "broker_cpu_us_per_kernel", mode, rep,
                         1e6 * (ticks_after - ticks_before) / hz / (n * kernels), n=n)
            if late > 0:
                # Some copy was still initialising at the barrier: give the next run more room.
                self.start_delay[mode] = min(1.0, max(self.start_delay[mode] * 1.5,
                                                      1.25 * (delay + late / 1000) / n))
            log(f"  concurrency {mode} n={n}: {n * kernels / span:,.0f} kernels/s, "
                f"per-process {statistics.median(seconds):.3f} s, late {late:.0f} ms")

    def w_mixed(self, mode, rep):
        metrics = ["small_p50_us", "small_p99_us", "small_agg_kernels_per_s",
                   "large_agg_kernels_per_s"]
        c = self.cfg
        prog = os.path.join(self.bench_bin, "kernel_latency")
        dur = str(c["mixed_duration_ms"])
        large = [prog, "--ns", "2000000", "--blocks", "528", "--threads", "256",
                 "--duration-ms", dur, "--wait-go"]
        small = [prog, "--ns", "10000", "--blocks", "2", "--threads", "32", "--duration-ms", dur,
                 "--wait-go"]
        n_large, n_small = c["mixed_large"], c["mixed_small"]
        n = f"{n_large}L+{n_small}S"
        procs = self.run_group(mode, [large] * n_large + [small] * n_small,
                               f"mixed.{mode}.{rep}", timeout_s=c["mixed_duration_ms"] / 1000 + 60,
                               wait_go=True, ready_timeout_s=60)
        err = self.group_error(procs, "kernel_latency")
        if err:
            self.fail("mixed", metrics, mode, rep, err, n=n)
            log(f"  mixed {mode}: FAILED {err[:160]}")
            return
        res = [parse_result_line(p.stdout(), "kernel_latency")[0] for p in procs]
        lg, sm = res[:n_large], res[n_large:]

        def agg(group):
            span = (max(int(r["end_ns"]) for r in group) - min(int(r["start_ns"]) for r in group))
            return sum(int(r["kernels"]) for r in group) / (span / 1e9)

        for r in sm:
            self.add("mixed", "small_p50_us", mode, rep, float(r["p50_us"]), n=n)
            self.add("mixed", "small_p99_us", mode, rep, float(r["p99_us"]), n=n)
        self.add("mixed", "small_agg_kernels_per_s", mode, rep, agg(sm), n=n)
        self.add("mixed", "large_agg_kernels_per_s", mode, rep, agg(lg), n=n)
        log(f"  mixed {mode}: small p50 {statistics.median(float(r['p50_us']) for r in sm):.1f} us"
            f" p99 {statistics.median(float(r['p99_us']) for r in sm):.1f} us, small "
            f"{agg(sm):,.0f}/s, large {agg(lg):,.0f}/s")

    def start_idle_clients(self, mode, count, alloc, tag, run_dir, env, ready_timeout_s=60):
        prog = os.path.join(self.bench_bin, "idle_client")
        procs = [Proc([prog, "--alloc-bytes", str(alloc), "--hold-s", "300"], env, run_dir,
                      f"{tag}.{i}", stdin_pipe=True) for i in range(count)]
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if all(p.popen.poll() is not None or p.is_ready() for p in procs):
                break
            time.sleep(0.05)
        return procs

    def release(self, procs) -> None:
        for p in procs:
            p.close_stdin()
        deadline = time.monotonic() + 30
        for p in procs:
            p.wait(deadline)

    def w_memory(self, mode, rep):
        if rep >= self.cfg["memory_reps"]:
            return
        used_by_n = {}
        run_dir = os.path.join(self.work, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        env = self.env(mode)
        if mode != "native":
            idle = self.mem_used_mib()
            if is_shim(mode):
                # mpsshim's server releases its primary context --context-idle-timeout (10 s by
                # default) after the last client left: at rest is after that.
                t0 = time.monotonic()
                while idle is not None and idle > 150 and time.monotonic() - t0 < 15:
                    time.sleep(0.5)
                    idle = self.mem_used_mib()
                log(f"  memory shim: {idle} MiB at rest after {time.monotonic() - t0:.1f} s")
            if idle is not None:
                self.add("memory", "mem_daemon_idle_mib", mode, rep, idle, n=0)
        for n in self.cfg["memory_n"]:
            procs = self.start_idle_clients(mode, n, 256 * MIB, f"memory.{mode}.{rep}.n{n}",
                                            run_dir, env)
            try:
                ready = [p for p in procs if p.popen.poll() is None and p.is_ready()]
                if len(ready) == n:
                    time.sleep(0.3)
                    samples = [self.mem_used_mib() for _ in range(2)]
                    samples = [s for s in samples if s is not None]
                else:
                    samples = []
            finally:
                self.release(procs)
            self.keep_logs(procs, f"memory.{mode}.{rep}.n{n}")
            if len(ready) != n or not samples:
                bad = [p for p in procs if p not in ready] or procs
                err = (f"{n - len(ready)} of {n} clients not ready; first: "
                       + error_text(bad[0].stdout(), bad[0].stderr(), bad[0].rc, bad[0].timed_out)
                       if len(ready) != n else "nvidia-smi gave no memory.used")
                self.fail("memory", ["mem_used_mib", "mem_per_client_mib"], mode, rep, err, n=n)
                log(f"  memory {mode} n={n}: FAILED {err[:160]}")
                continue
            used = max(samples)
            used_by_n[n] = used
            self.add("memory", "mem_used_mib", mode, rep, used, n=n)
            if self.gpu_idle_mib is not None:
                self.add("memory", "mem_per_client_mib", mode, rep,
                         (used - self.gpu_idle_mib) / n, n=n)
            log(f"  memory {mode} n={n}: {used:.0f} MiB in use")
        if len(used_by_n) >= 2:
            lo, hi = min(used_by_n), max(used_by_n)
            self.add("memory", "mem_marginal_mib", mode, rep,
                     (used_by_n[hi] - used_by_n[lo]) / (hi - lo), n=f"{lo}->{hi}")

    BROKER_COMMS = {"shim": ("mpsshimd", "mpsshim-server"), "shim-eager": ("mpsshimd", "mpsshim-server"),
                    "mps": ("nvidia-cuda-mps",)}

    def broker_ticks(self, mode):
        """CPU clock ticks (user + system) of the broker's processes, all threads, so far; None
        when the mode has no broker or none of its processes runs."""
        prefixes = self.BROKER_COMMS.get(mode)
        if not prefixes:
            return None
        total, matched = 0, 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if not f.read().strip().startswith(prefixes):
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
                matched += 1
            except (OSError, IndexError, ValueError):
                continue
        return total if matched else None

    def broker_cpu_pct(self, mode, seconds=5.0):
        """CPU the broker's processes (all threads) used over `seconds`, in % of one core."""
        if not self.BROKER_COMMS.get(mode):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        t0, c0 = time.monotonic(), self.broker_ticks(mode)
        time.sleep(seconds)
        t1, c1 = time.monotonic(), self.broker_ticks(mode)
        if c0 is None or c1 is None:
            log(f"  broker CPU: no process named {'/'.join(self.BROKER_COMMS[mode])} found")
            return None
        return 100.0 * (c1 - c0) / hz / (t1 - t0)

    def w_scaling(self, mode, rep):
        if rep != 0:
            return
        cap, batch = self.cfg["scaling_cap"], self.cfg["scaling_batch"]
        run_dir = os.path.join(self.work, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        env = self.env(mode)
        held, refusal = [], ""
        cpu_measured = False
        t_start = time.monotonic()
        try:
            while len(held) < cap and not refusal:
                count = min(batch, cap - len(held))
                procs = self.start_idle_clients(mode, count, MIB, f"scaling.{mode}.{len(held)}",
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
                        self.keep_logs([p], f"scaling.{mode}.refused")
                used = self.mem_used_mib()
                if used is not None:
                    self.add("scaling", "scaling_mem_mib", mode, rep, used, n=len(held))
                if len(held) == 64 and not cpu_measured:
                    # Idle clients must cost the broker nothing: its workers park.
                    cpu_measured = True
                    pct = self.broker_cpu_pct(mode)
                    if pct is not None:
                        self.add("scaling", "idle_cpu_pct", mode, rep, pct, n=64)
        finally:
            self.release(held)
        capped = not refusal and len(held) >= cap
        note = (f"cap {cap} reached, none refused" if capped else f"client {len(held) + 1} "
                f"refused: {refusal}")
        self.add("scaling", "max_clients", mode, rep, len(held), error=note)
        log(f"  scaling {mode}: {len(held)} clients ({note[:160]}) in "
            f"{time.monotonic() - t_start:.0f} s")

    def w_resnet(self, mode, rep):
        if rep >= self.cfg["resnet_reps"]:
            return
        iters = self.cfg["resnet_iters"]
        metrics = ["ms_per_iter", "agg_iters_per_s"]
        argv = [self.python, self.resnet_script, "--iters", str(iters), "--warmup", "10",
                "--windows", "5"]
        for n in self.cfg["resnet_n"]:
            key = ("resnet", mode)
            if key in self.failed_once:
                self.fail("resnet", metrics, mode, rep, "not run: " + self.failed_once[key], n=n,
                          status="skipped")
                continue
            ready_s = self.cfg["resnet_ready_s"]
            procs = self.run_group(mode, [argv] * n, f"resnet.{mode}.{rep}.n{n}",
                                   timeout_s=60 + iters * 0.05 * n, wait_go=True,
                                   ready_timeout_s=ready_s, go_delay_s=0.5,
                                   extra_env={"NCCL_NVLS_ENABLE": "0",
                                              "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
            err = self.group_error(procs, "resnet_client")
            if err:
                self.failed_once[key] = f"N={n} failed: {err}"
                self.fail("resnet", metrics, mode, rep, err, n=n)
                log(f"  resnet {mode} n={n}: FAILED {err[:240]}")
                continue
            res = [parse_result_line(p.stdout(), "resnet_client")[0] for p in procs]
            span = (max(int(r["end_ns"]) for r in res) - min(int(r["start_ns"]) for r in res)) / 1e9
            for r in res:
                # One sample per timed window of each process.
                for w in r["window_ms"].split(","):
                    self.add("resnet", "ms_per_iter", mode, rep, float(w), n=n)
                if "out_sum" in r:
                    self.add("resnet", "out_sum", mode, rep, float(r["out_sum"]), n=n)
            self.add("resnet", "agg_iters_per_s", mode, rep, n * iters / span, n=n)
            log(f"  resnet {mode} n={n}: "
                f"{statistics.median(float(r['ms_per_iter']) for r in res):.2f} ms/iter, "
                f"{n * iters / span:.0f} iters/s")

    # ---- the schedule ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def estimate(self, workload, mode) -> float:
        if (workload, mode) in self.item_cost:
            return self.item_cost[(workload, mode)]
        guesses = {"launch": 4, "bandwidth": 5, "concurrency": 12, "mixed": 5, "memory": 6,
                   "resnet": 40, "scaling": 25}
        if self.preset_name == "full":
            guesses.update({"launch": 6, "bandwidth": 8, "concurrency": 30, "resnet": 60,
                            "scaling": 45})
        return guesses[workload]

    def once_only(self, workload, rep) -> bool:
        """True when the workload has nothing to do in this repetition."""
        if workload == "scaling":
            return rep != 0
        if workload == "resnet":
            return rep >= self.cfg["resnet_reps"]
        if workload == "memory":
            return rep >= self.cfg["memory_reps"]
        return False

    def run(self) -> None:
        info = self.smi_query("name,driver_version,memory.total,memory.used")
        self.gpu_idle_mib = float(info[3]) if len(info) > 3 else None
        self.meta = {
            "gpu": info[0] if info else "unknown (nvidia-smi gave nothing)",
            "driver": info[1] if len(info) > 1 else "unknown",
            "gpu_memory_total_mib": info[2] if len(info) > 2 else "",
            "gpu_memory_idle_mib": self.gpu_idle_mib,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": os.uname().nodename,
            "preset": self.preset_name,
            "reps": self.cfg["reps"],
            "modes": self.modes,
            "workloads": self.workloads,
            "config": {k: v for k, v in self.cfg.items()},
            "command": " ".join([os.path.relpath(sys.argv[0]) if sys.argv else "bench/harness.py"]
                                + sys.argv[1:]),
            "python": sys.version.split()[0],
        }
        info_path = os.path.join(self.build, "BUILD_INFO")
        if os.path.exists(info_path):  # written by whoever copied the build (optional)
            with open(info_path) as f:
                self.meta["build_info"] = f.read().strip()[:500]
        log(f"{self.meta['gpu']}, driver {self.meta['driver']}, idle GPU memory "
            f"{self.gpu_idle_mib} MiB; preset {self.preset_name}, {self.cfg['reps']} repetitions, "
            f"budget {self.cfg['budget_s']} s")
        reserve = 20.0  # stopping a daemon, the report
        budget = self.cfg["budget_s"]
        order = [w for w in ALL_WORKLOADS if w in self.workloads]
        for rep in range(self.cfg["reps"]):
            k = rep % len(self.modes)
            rotated = self.modes[k:] + self.modes[:k]
            for mode in rotated:
                todo = [w for w in order if not self.once_only(w, rep)]
                todo = [w for w in todo
                        if self.elapsed() + self.estimate(w, mode) + reserve <= budget
                        or not self.skip_for_budget(w, mode, rep)]
                if not todo:
                    continue
                log(f"rep {rep} {MODE_LABEL[mode]}: {', '.join(todo)}")
                why = self.start_mode(mode, rep)
                try:
                    if why:
                        log(f"  {mode} did not start: {why}")
                        self.notes.append(f"rep {rep}: {MODE_LABEL[mode]} did not start: {why}")
                        for w in todo:
                            self.add(w, "mode_start", mode, rep, None, status="failed", error=why)
                        continue
                    for w in todo:
                        if self.elapsed() + self.estimate(w, mode) + reserve > budget:
                            self.skip_for_budget(w, mode, rep)
                            continue
                        if is_shim(mode) and not self.shim_wait_ready():
                            self.notes.append(f"rep {rep}: mpsshim server not running before {w}")
                        t = time.monotonic()
                        try:
                            getattr(self, "w_" + w)(mode, rep)
                        except Interrupted:
                            raise
                        except Exception as e:  # noqa: BLE001 - a harness bug must not stop MPS
                            log(f"  {w} {mode}: harness error {e!r}")
                            self.add(w, "harness_error", mode, rep, None, status="failed",
                                     error=repr(e)[:300])
                        cost = time.monotonic() - t
                        self.item_cost[(w, mode)] = max(cost, self.item_cost.get((w, mode), 0))
                        log(f"  {w} {mode}: {cost:.1f} s (elapsed {self.elapsed():.0f} s)")
                finally:
                    self.stop_mode(mode)

    def skip_for_budget(self, workload, mode, rep) -> bool:
        self.add(workload, "budget_skip", mode, rep, None, status="skipped",
                 error=f"skipped: time budget ({self.cfg['budget_s']} s) would be exceeded")
        log(f"  {workload} {mode} rep {rep}: skipped for the time budget")
        return True

    # ---- output ------------------------------------------------------------------------------
    def summarize(self) -> list[dict]:
        groups = defaultdict(list)
        errors = defaultdict(list)
        notes = {}
        order = []
        for r in self.rows:
            if r["metric"] in ("budget_skip", "mode_start", "harness_error"):
                continue
            key = (r["workload"], r["metric"], str(r["n"]), int(r["size_bytes"]), r["mode"])
            if key not in groups and key not in errors:
                order.append(key)
            if r["status"] == "ok" and r["value"] != "":
                groups[key].append(float(r["value"]))
                if r["error"]:
                    notes[key] = r["error"]
            else:
                errors[key].append(r["error"])
        # A mode that did not start, a harness error or the time budget: the figures the
        # other modes have get this mode's reason instead of a silent gap.
        for r in self.rows:
            if r["metric"] not in ("budget_skip", "mode_start", "harness_error"):
                continue
            mine_keys = {(w, m, n, size, r["mode"]) for (w, m, n, size, _mode) in order
                         if w == r["workload"]}
            for mine in sorted(mine_keys):
                if mine not in order:
                    order.append(mine)
                errors[mine].append(r["error"])
        out = []
        for key in order:
            values = groups.get(key, [])
            w, m, n, size, mode = key
            out.append({
                "workload": w, "metric": m, "n": n, "size_bytes": size, "mode": mode,
                "median": statistics.median(values) if values else None,
                "min": min(values) if values else None,
                "max": max(values) if values else None,
                "samples": len(values),
                "failures": sum(1 for x in errors.get(key, []) if not is_skip(x)),
                "skipped": sum(1 for x in errors.get(key, []) if is_skip(x)),
                "error": (errors.get(key) or [""])[0] or notes.get(key, ""),
                "unit": METRICS.get((w, m), ("", "", None))[1],
            })
        return out

    def write_outputs(self) -> None:
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["workload", "metric", "n", "size_bytes", "mode",
                                               "rep", "value", "unit", "status", "error"])
            wr.writeheader()
            wr.writerows(self.rows)
        summary = self.summarize()
        with open(os.path.join(self.out, "summary.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=["workload", "metric", "n", "size_bytes", "mode",
                                               "median", "min", "max", "samples", "failures",
                                               "skipped", "unit", "error"])
            wr.writeheader()
            wr.writerows(summary)
        self.meta["elapsed_s"] = round(self.elapsed(), 1)
        skips = sorted({f"{r['workload']} ({MODE_LABEL[r['mode']]}, repetition {int(r['rep']) + 1})"
                        for r in self.rows if r["metric"] == "budget_skip"})
        budget_note = ("not run for the time budget (figures have one repetition fewer): "
                       + ", ".join(skips)) if skips else ""
        self.notes = [n for n in self.notes if not n.startswith("not run for the time budget")]
        if budget_note:
            self.notes.append(budget_note)
        self.meta["notes"] = self.notes
        plots = make_plots(summary, self.out, self.modes, self.meta)
        self.meta["plots"] = plots
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": self.meta, "summary": summary}, f, indent=1)
        report = render_report(summary, self.meta, self.modes)
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write(report)
        log(f"wrote {self.out}/report.md, results.csv, summary.csv, results.json"
            + (f", {len(plots)} plots" if plots and plots[0].endswith(".png") else
               ", plot_data.json (no matplotlib)"))


# ---- report ----------------------------------------------------------------------------------
def fmt(value, unit="") -> str:
    if value is None:
        return "-"
    if unit == "":
        return f"{value:.7g}"
    a = abs(value)
    if unit == "clients" or (unit == "MiB" and float(value).is_integer()):
        return f"{value:,.0f}"
    if unit in ("kernels/s", "iters/s") or a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def is_skip(error: str) -> bool:
    return error.startswith(("skipped", "not run"))


def cell(entry) -> str:
    if entry is None:
        return "n/a"
    if entry["median"] is None:
        err = entry["error"] or "failed"
        word = "skipped" if is_skip(err) else "FAILED"
        return f"**{word}**: {err[:160]}".replace("|", "/")
    unit = entry["unit"]
    text = fmt(entry["median"], unit)
    if entry["samples"] > 1 and entry["min"] != entry["max"]:
        text += f" ({fmt(entry['min'], unit)}–{fmt(entry['max'], unit)})"
    if entry["failures"]:
        text += f" [{entry['failures']} run(s) failed]"
    if entry.get("skipped"):
        text += f" [{entry['skipped']} skipped]"
    return text


def ratio(a, b):
    if not a or not b or a["median"] is None or b["median"] is None or b["median"] == 0:
        return None
    return a["median"] / b["median"]


def verdict(r, better, other) -> str:
    """Plain words: is mpsshim behind `other`?"""
    if r is None or better is None:
        return ""
    worse = r > 1.05 if better == "lower" else r < 0.95
    ahead = r < 0.95 if better == "lower" else r > 1.05
    if worse:
        factor = r if better == "lower" else (1 / r if r else float("inf"))
        return f"**behind {other} ({factor:.2f}x worse)**"
    if ahead:
        factor = 1 / r if better == "lower" else r
        return f"ahead of {other} ({factor:.2f}x better)"
    return f"on par with {other}"


def index(summary):
    table = {}
    for e in summary:
        table[(e["workload"], e["metric"], e["n"], e["size_bytes"], e["mode"])] = e
    return table


def table_rows(summary, modes, keys, idx, label_fn):
    cols = [MODE_LABEL[m] for m in modes]
    shims = [m for m in modes if is_shim(m)]
    others = [(o, name) for o, name in (("mps", "MPS"), ("native", "native")) if o in modes]
    has_ratio = bool(shims) and bool(others)
    head = ["figure", "unit"] + cols
    if has_ratio:
        for shim_mode in shims:
            tag = "mpsshim" if shim_mode == "shim" else shim_mode
            head += [f"{tag}/{name}" for _, name in others]
        head.append("mpsshim is")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    behind = []
    for key in keys:
        w, m, n, size = key
        label, unit, better = METRICS.get((w, m), (m, "", None))
        entries = {mode: idx.get((w, m, n, size, mode)) for mode in modes}
        row = [label_fn(key, label), unit] + [cell(entries[mode]) for mode in modes]
        if has_ratio:
            words = []
            for shim_mode in shims:
                for other, name in others:
                    r = ratio(entries.get(shim_mode), entries.get(other))
                    row.append(f"{r:.2f}" if r is not None else "-")
                    # The verdict speaks of the first mpsshim mode (the daemon's defaults).
                    v = verdict(r, better, name) if shim_mode == shims[0] else ""
                    if v:
                        words.append(v)
            shim = entries.get(shims[0])
            if shim is not None and shim["median"] is None:
                words = ["not run" if is_skip(shim["error"]) else "**failed**"]
            row.append("; ".join(words))
            if better is not None and any("behind" in x or "failed" in x for x in words):
                behind.append((key, label_fn(key, label), unit, words, shim))
        lines.append("| " + " | ".join(row) + " |")
    return lines, behind


def render_report(summary, meta, modes) -> str:
    idx = index(summary)
    L = []
    L.append(f"# mpsshim benchmark: {meta['gpu']}, driver {meta['driver']}, {meta['date_utc']}")
    L.append("")
    L.append(f"Command: `{meta['command']}` (preset {meta['preset']}, {meta['reps']} repetitions, "
             f"modes {', '.join(modes)}, {meta.get('elapsed_s', '?')} s). Idle GPU: "
             f"{meta.get('gpu_memory_idle_mib')} MiB in use of {meta.get('gpu_memory_total_mib')} MiB.")
    L.append("")
    if meta.get("build_info"):
        L.append(f"Build: {meta['build_info'].splitlines()[0]}")
        L.append("")
    L.append("Each cell: median (min–max) over repetitions, and over the processes of a run where "
             "a figure is per process. Ratios are mpsshim's median over the other mode's; "
             "\"behind\" means more than 5% worse in the figure's direction (lower time, higher "
             "throughput).")
    L.append("")
    all_behind = []

    def plain(key, label):
        w, m, n, size = key
        extra = []
        if n not in ("", "None"):
            extra.append(f"N={n}")
        if size:
            extra.append(size_label(size))
        return label + (f", {', '.join(extra)}" if extra else "")

    # Headline
    cn = [int(e["n"]) for e in summary if e["workload"] == "concurrency" and e["n"].isdigit()]
    n8 = "8" if 8 in cn else (str(max(cn)) if cn else "8")
    bw_sizes = sorted({e["size_bytes"] for e in summary if e["workload"] == "bandwidth"})
    big = 64 * MIB if 64 * MIB in bw_sizes else (bw_sizes[-1] if bw_sizes else 0)
    rn = [e["n"] for e in summary if e["workload"] == "resnet"]
    mem_marg = [e["n"] for e in summary if e["metric"] == "mem_marginal_mib"]
    largest = bw_sizes[-1] if bw_sizes else 0
    mixed_n = f"{meta['config']['mixed_large']}L+{meta['config']['mixed_small']}S"
    n_max = str(max(cn)) if cn else ""
    head_keys = [
        ("concurrency", "agg_kernels_per_s", "1", 0),
        ("concurrency", "agg_kernels_per_s", n8, 0),
        ("concurrency", "per_proc_s", n8, 0),
        ("concurrency", "agg_kernels_per_s", n_max, 0),
        ("launch", "launch_async_cpu", "", 0),
        ("launch", "launch_ctx_sync", "", 0),
        ("launch", "launch_stream_sync", "", 0),
        ("launch", "ctx_sync_idle", "", 0),
        ("launch", "mem_alloc_free", "", 0),
        ("bandwidth", "h2d_pinned_sync", "", big),
        ("bandwidth", "h2d_pinned_sync", "", largest),
        ("bandwidth", "h2d_pageable_sync", "", largest),
        ("bandwidth", "d2h_pageable_sync", "", largest),
        ("mixed", "small_p50_us", mixed_n, 0),
        ("mixed", "small_p99_us", mixed_n, 0),
        ("mixed", "large_agg_kernels_per_s", mixed_n, 0),
        ("memory", "mem_marginal_mib", mem_marg[0] if mem_marg else "", 0),
        ("memory", "mem_daemon_idle_mib", "0", 0),
        ("scaling", "max_clients", "", 0),
        ("resnet", "agg_iters_per_s", "1", 0),
        ("resnet", "agg_iters_per_s", "8" if "8" in rn else (rn[-1] if rn else "8"), 0),
    ]
    seen_keys = []
    for k in head_keys:
        if k not in seen_keys:
            seen_keys.append(k)
    head_keys = seen_keys
    head_keys = [k for k in head_keys if any((k + (m,)) in idx for m in modes)]
    lines, behind = table_rows(summary, modes, head_keys, idx, plain)
    head_behind = list(behind)
    L.append("## Headline")
    L.append("")
    L += lines
    L.append("")
    all_behind += behind

    sections = [
        ("launch", "Launch path (bench/launch_latency)"),
        ("bandwidth", "Copy bandwidth (bench/bandwidth)"),
        ("concurrency", "Concurrency: N x examples/small_kernels"),
        ("mixed", "Mixed sizes: large + small kernels (bench/kernel_latency)"),
        ("memory", "GPU memory per client (bench/idle_client, 256 MiB each)"),
        ("resnet", "PyTorch ResNet-50 batch 1 (bench/resnet_client.py)"),
        ("scaling", "Client scaling (idle clients, 1 MiB each)"),
    ]
    for w, title in sections:
        keys = []
        for e in summary:
            if e["workload"] != w:
                continue
            k = (e["workload"], e["metric"], e["n"], e["size_bytes"])
            if k not in keys:
                keys.append(k)
        if not keys:
            continue

        def sort_key(k):
            metric_order = [m for (ww, m) in METRICS if ww == w]
            mi = metric_order.index(k[1]) if k[1] in metric_order else 99
            n = int(k[2]) if str(k[2]).isdigit() else 0
            return (mi, k[3], n)

        keys.sort(key=sort_key)
        if w == "scaling":
            keys = [k for k in keys if k[1] in ("max_clients", "idle_cpu_pct")]
        if w == "bandwidth":
            largest = max(k[3] for k in keys)
            keys = [k for k in keys if k[1].endswith("_sync") or k[3] == largest]
        lines, behind = table_rows(summary, modes, keys, idx, plain)
        L.append(f"## {title}")
        L.append("")
        L += lines
        L.append("")
        if w == "resnet":
            sums = {mode: [e for e in summary if e["workload"] == "resnet"
                           and e["metric"] == "out_sum" and e["mode"] == mode
                           and e["median"] is not None] for mode in modes}
            ref = sums.get("native") or sums.get("mps") or []
            if ref:
                r0 = ref[0]["median"]
                for mode in modes:
                    if mode == "native" or not sums.get(mode):
                        continue
                    worst = max(abs(e[k] - r0) for e in sums[mode] for k in ("min", "max"))
                    rel = worst / max(abs(r0), 1e-12)
                    L.append(f"- {MODE_LABEL[mode]}: output {'matches' if rel < 1e-3 else '**differs from**'}"
                             f" the reference (largest relative difference {rel:.1e})")
                L.append("")
        if w == "scaling":
            for mode in modes:
                e = idx.get(("scaling", "max_clients", "", 0, mode))
                if e and e["error"]:
                    L.append(f"- {MODE_LABEL[mode]}: {e['error']}".replace("|", "/"))
            L.append("")
        all_behind += [b for b in behind if b[0] not in {x[0] for x in all_behind}]

    L.append("## Where mpsshim is behind")
    L.append("")
    if not all_behind:
        L.append("Nowhere by more than 5% in these runs.")
    else:
        L.append("Headline figures first, then every other figure of the tables above.")
        L.append("")
    seen = set()
    failed_runs = {}
    head_set = {b[0] for b in head_behind}
    ordered = head_behind + [b for b in all_behind if b[0] not in head_set]
    for key, label, unit, words, shim in ordered:
        if "**failed**" in words:
            # One line per failed run (workload, N), not per figure.
            failed_runs.setdefault((key[0], key[2]), shim["error"] if shim else "")
            continue
        if label in seen:
            continue
        seen.add(label)
        L.append(f"- {label} ({unit}): {'; '.join(words)}")
    for (w, n), err in failed_runs.items():
        L.append(f"- {w}{f' N={n}' if n else ''}: **mpsshim failed**: {err[:300]}"
                 .replace("|", "/"))
    L.append("")
    failures = [e for e in summary if (e["failures"] or e["skipped"]) and e["median"] is None]
    if failures:
        L.append("## Failed or skipped runs")
        L.append("")
        seen_runs = set()
        for e in failures:
            run = (e["mode"], e["workload"], e["n"])
            if run in seen_runs:
                continue
            seen_runs.add(run)
            what = e["workload"] + (f" N={e['n']}" if e["n"] else "")
            L.append(f"- {MODE_LABEL[e['mode']]}, {what}: {e['error'][:300]}".replace("|", "/"))
        L.append("")
    if meta.get("notes"):
        L.append("## Notes")
        L.append("")
        for note in meta["notes"]:
            L.append(f"- {note}")
        L.append("")
    plots = meta.get("plots") or []
    if plots and plots[0].endswith(".png"):
        L.append("## Plots")
        L.append("")
        for p in plots:
            L.append(f"![{p}]({p})")
        L.append("")
    elif plots:
        L.append("Plots: matplotlib could not be imported; the plotted data is in plot_data.json.")
        L.append("")
    return "\n".join(L)


# ---- plots -----------------------------------------------------------------------------------
COLORS = {"native": "#7f7f7f", "mps": "#76b900", "shim": "#1f77b4", "shim-eager": "#d62728"}


def series(summary, workload, metric, mode, by="n"):
    xs, med, lo, hi = [], [], [], []
    for e in summary:
        if e["workload"] == workload and e["metric"] == metric and e["mode"] == mode \
                and e["median"] is not None:
            x = int(e["n"]) if by == "n" and str(e["n"]).isdigit() else e["size_bytes"]
            xs.append(x)
            med.append(e["median"])
            lo.append(e["median"] - e["min"])
            hi.append(e["max"] - e["median"])
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    return ([xs[i] for i in order], [med[i] for i in order], [lo[i] for i in order],
            [hi[i] for i in order])


def make_plots(summary, out, modes, meta) -> list[str]:
    plot_specs = {
        "concurrency.png": [("concurrency", "agg_kernels_per_s", "n", "processes N",
                             "aggregate kernels/s", True),
                            ("concurrency", "per_proc_s", "n", "processes N",
                             "per-process loop s (5000 kernels), log scale", True, True)],
        "bandwidth.png": [("bandwidth", m, "size", "bytes", m + " GB/s", True)
                          for m in ["h2d_pinned_sync", "h2d_pageable_sync", "d2h_pinned_sync",
                                    "d2h_pageable_sync"]],
        "resnet.png": [("resnet", "agg_iters_per_s", "n", "processes N", "aggregate iters/s",
                        False),
                       ("resnet", "ms_per_iter", "n", "processes N", "per-process ms/iter",
                        False)],
        "memory.png": [("memory", "mem_used_mib", "n", "idle clients (256 MiB each)",
                        "GPU memory in use, MiB", False),
                       ("scaling", "scaling_mem_mib", "n", "idle clients (1 MiB each)",
                        "GPU memory in use, MiB", False)],
    }
    bar_specs = {
        "launch.png": [("launch", m) for m in ["launch_async_cpu", "launch_stream_sync",
                                                "launch_ctx_sync", "mem_alloc_free"]],
        "mixed_scaling.png": [("mixed", "small_p50_us"), ("mixed", "small_p99_us"),
                              ("mixed", "small_agg_kernels_per_s"),
                              ("mixed", "large_agg_kernels_per_s"),
                              ("scaling", "max_clients")],
    }
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - plots are optional
        data = {}
        for name, specs in plot_specs.items():
            for w, m, by, *_ in specs:
                for mode in modes:
                    data[f"{w}/{m}/{mode}"] = series(summary, w, m, mode, by)
        for name, specs in bar_specs.items():
            for w, m in specs:
                for mode in modes:
                    data[f"{w}/{m}/{mode}"] = [[e["median"], e["min"], e["max"]] for e in summary
                                               if e["workload"] == w and e["metric"] == m
                                               and e["mode"] == mode]
        with open(os.path.join(out, "plot_data.json"), "w") as f:
            json.dump(data, f, indent=1)
        return ["plot_data.json"]

    title_tail = f"{meta['gpu']}, driver {meta['driver']}, {meta['date_utc']}"
    written = []
    for name, specs in plot_specs.items():
        if not any(e["workload"] == specs[0][0] for e in summary):
            continue
        cols = 2
        rows = (len(specs) + 1) // 2
        fig, axes = plt.subplots(rows, cols, figsize=(11, 4.2 * rows), squeeze=False)
        for ax, (w, m, by, xlabel, ylabel, logx, *logy) in zip(axes.flat, specs):
            for mode in modes:
                xs, med, lo, hi = series(summary, w, m, mode, by)
                if xs:
                    ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3,
                                color=COLORS[mode], label=MODE_LABEL[mode])
            if logx:
                ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[len(specs):]:
            ax.set_visible(False)
        fig.suptitle(f"{name[:-4]}: {title_tail}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)
        written.append(name)
    for name, specs in bar_specs.items():
        specs = [s for s in specs if any(e["workload"] == s[0] and e["metric"] == s[1]
                                         for e in summary)]
        if not specs:
            continue
        fig, axes = plt.subplots(1, len(specs), figsize=(3.2 * len(specs), 3.8), squeeze=False)
        for ax, (w, m) in zip(axes.flat, specs):
            label, unit, _better = METRICS[(w, m)]
            for i, mode in enumerate(modes):
                es = [e for e in summary if e["workload"] == w and e["metric"] == m
                      and e["mode"] == mode]
                e = es[0] if es else None
                if e and e["median"] is not None:
                    ax.bar(i, e["median"], color=COLORS[mode],
                           yerr=[[e["median"] - e["min"]], [e["max"] - e["median"]]], capsize=3)
                    ax.text(i, e["median"], fmt(e["median"], unit), ha="center", va="bottom",
                            fontsize=7)
                else:
                    word = ("skipped" if is_skip(e["error"]) else "failed") if e else "n/a"
                    ax.text(i, 0, word, ha="center", va="bottom",
                            fontsize=8, color="red", rotation=90)
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels([MODE_LABEL[x].split(" (")[0] for x in modes], fontsize=8)
            ax.set_title(f"{label}\n({unit})", fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"{name[:-4]}: {title_tail}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)
        written.append(name)
    return written


def render_only(src: str, out: str) -> int:
    """Re-renders the outputs of an earlier run (the report's format may have changed since)."""
    with open(os.path.join(src, "results.json")) as f:
        meta = json.load(f)["meta"]
    rows = []
    with open(os.path.join(src, "results.csv"), newline="") as f:
        for r in csv.DictReader(f):
            r["size_bytes"] = int(r["size_bytes"] or 0)
            r["rep"] = int(r["rep"])
            rows.append(r)
    os.makedirs(out, exist_ok=True)
    h = Harness.__new__(Harness)
    h.rows, h.out, h.modes, h.meta = rows, os.path.abspath(out), meta["modes"], meta
    h.notes = meta.get("notes", [])
    h.t0 = time.monotonic() - float(meta.get("elapsed_s", 0))
    h.write_outputs()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", help="meson build directory (not with --render)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--render", metavar="DIR",
                        help="measure nothing: re-render report.md, summary.csv and the plots "
                             "into --out from DIR/results.csv and DIR/results.json")
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="< 5 minutes (default)")
    preset.add_argument("--full", action="store_true", help="<= 9 minutes")
    parser.add_argument("--modes", default="native,mps,shim")
    parser.add_argument("--workloads", default=",".join(ALL_WORKLOADS))
    parser.add_argument("--reps", type=int, default=0, help="repetitions (preset's by default)")
    parser.add_argument("--budget-s", type=float, default=0,
                        help="stop starting new work after this many seconds (preset's)")
    parser.add_argument("--python", default="", help="python for resnet_client.py")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra mpsshimd argument (repeatable), e.g. --daemon-arg=--log-level=info")
    args = parser.parse_args()
    if args.render:
        return render_only(args.render, args.out)
    if not args.build_dir:
        parser.error("--build-dir is required (or --render DIR)")
    harness = Harness(args)
    harness.check_programs()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    try:
        harness.run()
    except Interrupted as e:
        log(f"interrupted ({e}): writing what was measured")
        harness.notes.append(f"interrupted ({e}) after {harness.elapsed():.0f} s")
    finally:
        # Whatever happened, no daemon outlives the harness.
        for stop in (harness.mps_stop, harness.shim_stop):
            try:
                stop()
            except Exception as e:  # noqa: BLE001
                log(f"cleanup: {e!r}")
        harness.write_outputs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
