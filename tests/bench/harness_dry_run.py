#!/usr/bin/env python3
"""The benchmark harness's plumbing without a GPU (bench/harness/, --dry-run): the priority
workload runs in every mode with the right environments and daemon arguments, its output is
parsed, summarised and reported with its ratios against the targets; and --render still renders
the committed reference run. usage: harness_dry_run.py SOURCE_DIR"""
import csv
import os
import subprocess
import sys
import tempfile
import time

MODES = ["native", "mps", "shim", "shim-noreserve", "shim-noprio"]


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


def dry_run(harness: str, out: str, results: str, workload: str, modes: list[str]) -> str:
    """Runs the harness with --dry-run on one workload; its log (stdout and stderr)."""
    run = subprocess.run(
        [sys.executable, harness, "--build-dir", out, "--out", results, "--dry-run",
         "--workloads", workload, "--modes", ",".join(modes), "--reps", "1"],
        capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        fail(f"harness ({workload}) exited {run.returncode}:\n{log}")
    return log


def check_multigpu(harness: str, out: str) -> None:
    """The multigpu workload: peer copies, NCCL with multicast off, small kernels split over two
    GPUs by CUDA_VISIBLE_DEVICES; every figure parsed in every mode, the ratio computed."""
    modes = ["native", "mps", "shim"]
    results = os.path.join(out, "multigpu")
    log = dry_run(harness, out, results, "multigpu", modes)
    for needed in ["CUDA_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES=0", "NCCL_NVLS_ENABLE=0",
                   "nccl_collectives.py --ranks 2 --bench", "peer_copy"]:
        if needed not in log:
            fail(f"the multigpu dry run's commands lack {needed!r}:\n{log}")
    with open(os.path.join(results, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    for mode in modes:
        for metric in ["peer_copy_gbps", "peer_copy_back_gbps", "unified_copy_gbps",
                       "allreduce_busbw_gbps", "allreduce_8kib_us", "ddp_step_ms",
                       "one_gpu_kernels_per_s", "two_gpu_kernels_per_s", "two_over_one_gpu",
                       "machine_cores_busy", "machine_cpu_us_per_kernel"]:
            got = [r for r in rows if r["mode"] == mode and r["metric"] == metric
                   and r["status"] == "ok" and r["value"]]
            if not got:
                fail(f"no {metric} for {mode} in the multigpu results.csv:\n{log}")
    with open(os.path.join(results, "report.md")) as f:
        if "Several GPUs" not in f.read():
            fail("report.md has no multigpu section")


def check_machine_cpu(source: str, harness: str, out: str) -> None:
    """The whole machine's CPU (bench/harness/machine_cpu.py): /proc/stat's busy ticks, a window
    read from samples, and both columns for every mode of the concurrency workload; and its
    figure against the ceiling of N native processes alone."""
    sys.path.insert(0, os.path.join(source, "bench"))
    from harness.machine_cpu import (CpuSampler, busy_ticks, process_cpu_ns,  # noqa: E402
                                     process_ticks)
    stat = "cpu  100 5 50 1000 40 3 2 1 0 0\ncpu0 50 2 25 500 20 1 1 0 0 0\n"
    if busy_ticks(stat) != 100 + 5 + 50 + 3 + 2 + 1:
        fail(f"busy_ticks of a fixed /proc/stat: {busy_ticks(stat)}")
    sampler = CpuSampler()
    hz = os.sysconf("SC_CLK_TCK")
    # Samples a second apart with 2 cores busy, then 1: the window 1..3 s averages 1.5.
    sampler.times = [0, 1_000_000_000, 2_000_000_000, 3_000_000_000]
    sampler.ticks = [0, 2 * hz, 4 * hz, 5 * hz]
    if sampler.over(1_000_000_000, 3_000_000_000) != (1.5, 3.0):
        fail(f"CpuSampler.over: {sampler.over(1_000_000_000, 3_000_000_000)}")
    if sampler.over(500_000_000, 3_500_000_000) is not None:
        fail("a window the samples do not cover was measured")
    # The followed processes' CPU over the same window: 1 s between samples 1 and 3.
    sampler.process = [0, 10**9, 10**9, 2 * 10**9]
    if sampler.processes_over(1_000_000_000, 3_000_000_000) != 1.0:
        fail(f"CpuSampler.processes_over: {sampler.processes_over(1_000_000_000, 3_000_000_000)}")
    sampler.process[3] = None  # a followed process ended
    if sampler.processes_over(1_000_000_000, 3_000_000_000) is not None:
        fail("a window with a followed process gone was measured")
    # Clients starting and ending cost the broker 5 s each just outside the window 0.5..3.5 s:
    # the rate inside it (1 core) times its length, not the outer samples' 12 s.
    sampler.times = [0, 1_000_000_000, 2_000_000_000, 3_000_000_000, 4_000_000_000]
    sampler.ticks = [0] * 5
    sampler.process = [0, 5 * 10**9, 6 * 10**9, 7 * 10**9, 12 * 10**9]
    if sampler.processes_over(500_000_000, 3_500_000_000) != 3.0:
        fail(f"processes_over counted the window's edges: "
             f"{sampler.processes_over(500_000_000, 3_500_000_000)}")
    # One sample inside a window: the outer samples, the only reading there is.
    if sampler.processes_over(1_900_000_000, 2_100_000_000) != 2.0:
        fail(f"processes_over of a short window: "
             f"{sampler.processes_over(1_900_000_000, 2_100_000_000)}")
    # process_ticks and process_cpu_ns follow children: this process's CPU grows by a busy
    # child's.
    before = process_ticks([os.getpid()])
    before_ns = process_cpu_ns([os.getpid()])
    # It spins until it has used 0.3 s of CPU, not of wall time: on a loaded machine (CI's two
    # cores building) half a second of wall time gave it fewer ticks than the check needs.
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nwhile time.process_time() < 0.3: pass\n"
                              "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/stat") as f:
            child_ticks = sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13])
        if child_ticks >= hz // 4:
            break
        time.sleep(0.05)
    during = process_ticks([os.getpid()])
    during_ns = process_cpu_ns([os.getpid()])
    child.communicate(b"")
    if during is None or before is None or during - before < hz // 4:
        fail(f"process_ticks did not count a busy child: {before} -> {during}")
    if during_ns is None or before_ns is None or during_ns - before_ns < 250_000_000:
        fail(f"process_cpu_ns did not count a busy child: {before_ns} -> {during_ns}")
    # Nanoseconds, not ticks: this process's own threads, summed, agree with what the kernel
    # says of the process within a tick, and a pid that is not there gives None.
    own_ticks = sum(int(v) for v in open(f"/proc/{os.getpid()}/stat").read()
                    .rsplit(")", 1)[1].split()[11:13])
    own_ns = sum(int(open(f"/proc/self/task/{t}/schedstat").read().split()[0])
                 for t in os.listdir("/proc/self/task"))
    if abs(own_ns - own_ticks * 1_000_000_000 // hz) > 2 * 1_000_000_000 // hz:
        fail(f"this process's threads ran {own_ns} ns, its stat says {own_ticks} ticks")
    if process_cpu_ns([2**22 + 1]) is not None:
        fail("process_cpu_ns of a pid that does not exist was not None")
    modes = ["native", "mps", "shim"]
    results = os.path.join(out, "concurrency")
    log = dry_run(harness, out, results, "concurrency", modes)
    with open(os.path.join(results, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    for mode in modes:
        for metric in ["machine_cores_busy", "machine_cpu_us_per_kernel"]:
            got = [r for r in rows if r["mode"] == mode and r["metric"] == metric
                   and r["status"] == "ok" and r["value"] and float(r["value"]) >= 0]
            if not got:
                fail(f"no {metric} for {mode} in the concurrency results.csv:\n{log}")
    # The ceiling: N x one native process alone; native's own N = 1 is that process, exactly 1.
    ceiling = {(r["mode"], r["n"]): float(r["value"]) for r in rows
               if r["metric"] == "of_ceiling" and r["status"] == "ok" and r["value"]}
    for mode in modes:
        if not any(m == mode and n != "1" for m, n in ceiling):
            fail(f"no of_ceiling for {mode} at N > 1 in the concurrency results.csv:\n{log}")
    if abs(ceiling.get(("native", "1"), 0) - 1.0) > 1e-6:
        fail(f"native N = 1 is not its own ceiling: {ceiling.get(('native', '1'))}")


def check_startup(harness: str, out: str) -> None:
    """The startup workload: each daemon is started again before the first and the cold client
    (three times in the log: the repetition's start, then the workload's two), mpsshimd's two
    with a verdict directory of the workload's; the first, cold and warm figures of every mode
    parsed from the client's stamps and reported."""
    modes = ["native", "mps", "shim"]
    results = os.path.join(out, "startup")
    log = dry_run(harness, out, results, "startup", modes)
    for daemon in ("--runtime-dir", "nvidia-cuda-mps-control -d"):  # mpsshimd's, MPS's
        starts = sum(1 for line in log.splitlines() if "dry run:" in line and daemon in line)
        if starts != 3:
            fail(f"{daemon} started {starts} times in the startup dry run, not 3:\n{log}")
    verdict_starts = [line for line in log.splitlines()
                      if "dry run:" in line and "--image-verdict-dir" in line]
    if len(verdict_starts) != 2 or not verdict_starts[0].rstrip().endswith("verdicts.shim.0"):
        fail(f"mpsshimd was not started twice with the workload's verdict directory:\n{log}")
    with open(os.path.join(results, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    for mode in modes:
        for metric in ["first_s", "cold_s", "warm_s", "first_cuda_s", "cold_cuda_s",
                       "warm_cuda_s", "out_sum"]:
            got = [float(r["value"]) for r in rows if r["mode"] == mode
                   and r["metric"] == metric and r["status"] == "ok" and r["value"]]
            if not got:
                fail(f"no {metric} for {mode} in the startup results.csv:\n{log}")
            # Made-up stamps 10 ms apart: 30 ms from the import to the result, more from the
            # process's start.
            if metric.endswith("cuda_s") and not 0.025 < got[0] < 1.0:
                fail(f"{metric} for {mode} is {got[0]} s, not the stamps' 0.03")
            if metric in ("first_s", "cold_s", "warm_s") and not got[0] > 0.03:
                fail(f"{metric} for {mode} is {got[0]} s: not counted from the process's start")
    with open(os.path.join(results, "report.md")) as f:
        if "PyTorch start to first result" not in f.read():
            fail("report.md has no startup section")


def main() -> int:
    source = os.path.abspath(sys.argv[1])
    harness = os.path.join(source, "bench", "harness.py")
    with tempfile.TemporaryDirectory() as out:
        log = dry_run(harness, out, os.path.join(out, "r"), "priority", MODES)
        # The commands it would have run: low-priority clients with CUDA_MPS_CLIENT_PRIORITY=1,
        # the high-priority one with 0, shim-noprio's daemon without priority scheduling and
        # shim-noreserve's without SMs reserved for the high-priority client.
        for needed in ["CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_CLIENT_PRIORITY=0",
                       "--priority-scheduling=off", "--priority-reserve-sms=0", "--batch 8",
                       "--batch 1"]:
            if needed not in log:
                fail(f"the dry run's commands lack {needed!r}:\n{log}")
        with open(os.path.join(out, "r", "results.csv")) as f:
            rows = list(csv.DictReader(f))
        for mode in MODES:
            for metric in ["high_p99_us", "low_kernels_per_s", "high_p99_vs_alone",
                           "low_tput_vs_alone", "machine_cores_busy",
                           "machine_cpu_us_per_kernel"]:
                got = [r for r in rows if r["mode"] == mode and r["metric"] == metric
                       and r["status"] == "ok" and r["value"]]
                if not got:
                    fail(f"no {metric} for {mode} in results.csv")
        with open(os.path.join(out, "r", "report.md")) as f:
            report = f.read()
        for needed in ["**Dry run**", "## Priorities", "high-priority p99, shared / alone",
                       "- shim-noprio: high-priority p99", "- shim-noreserve: high-priority p99"]:
            if needed not in report:
                fail(f"report.md lacks {needed!r}:\n{report}")
        # The committed reference run still renders.
        render = subprocess.run(
            [sys.executable, harness, "--render", os.path.join(source, "docs", "benchmarks"),
             "--out", os.path.join(out, "rendered")], capture_output=True, text=True, timeout=120)
        if render.returncode != 0:
            fail(f"--render exited {render.returncode}: {render.stdout}{render.stderr}")
        with open(os.path.join(out, "rendered", "report.md")) as f:
            if "## Headline" not in f.read():
                fail("the re-rendered reference report has no headline")
        check_multigpu(harness, out)
        check_machine_cpu(source, harness, out)
        check_startup(harness, out)
    print("PASS harness dry run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
