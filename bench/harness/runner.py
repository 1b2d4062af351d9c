"""The Harness: the run's settings and paths, the schedule (repetitions x modes x workloads
under a time budget), running groups of client processes, and the outputs (results.csv,
summary.csv, results.json, report.md, plots). The workloads are in workloads/, the modes'
daemons in modes.py, the report in report.py."""
from __future__ import annotations

import csv
import datetime
import json
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict

from .common import HERE, Interrupted, Proc, error_text, log, parse_result_line
from .config import PRESETS
from .dry_run import dry_run_argv
from .machine_cpu import CpuSampler, process_ticks
from .modes import ALL_MODES, MODE_LABEL, ModeControl, client_uid, is_shim
from .ops_snapshot import OpsSnapshot
from .report import is_skip, make_plots, render_report
from .workloads import ALL_WORKLOADS, METRICS, WORKLOADS


class Harness(ModeControl, OpsSnapshot):
    def __init__(self, args):
        self.args = args
        self.preset_name = "full" if args.full else "quick"
        self.cfg = dict(PRESETS[self.preset_name])
        if args.reps:
            self.cfg["reps"] = args.reps
        if args.budget_s:
            self.cfg["budget_s"] = args.budget_s
        if args.concurrency_n:
            self.cfg["concurrency_n"] = [int(n) for n in args.concurrency_n.split(",")]
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
        self.cpu: CpuSampler | None = None  # the whole machine's CPU during the last group
        self.notes: list[str] = []
        self.t0 = time.monotonic()
        self.item_cost: dict = {}
        # small_kernels barrier: seconds per process to wait before the common start. Context
        # creation is serialised: ~0.1 s per process natively and under NVIDIA MPS on the H200
        # machine (gVisor), a few ms under mpsshim. Raised when a copy arrives late.
        self.start_delay = {m: 0.03 if is_shim(m) else 0.11 for m in ALL_MODES}
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
        for w in self.workloads:
            needed.update(WORKLOADS[w].programs(self))
        if self.args.dry_run:
            return  # nothing runs
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

    # ---- rows --------------------------------------------------------------------------------
    def add(self, workload, metric, mode, rep, value, n="", size=0, status="ok", error="",
            unit=None):
        if unit is None:
            unit = METRICS.get((workload, metric), ("", "", None))[1]
        self.rows.append({"workload": workload, "metric": metric, "n": n, "size_bytes": size,
                          "mode": mode, "rep": rep,
                          "value": "" if value is None else round(float(value), 6),
                          "unit": unit, "status": status, "error": error})

    def add_machine_cpu(self, workload, mode, rep, start_ns, end_ns, units, per_unit_metric,
                        scale, n="") -> None:
        """The whole machine's CPU over the last group's measured window (machine_cpu.py):
        `machine_cores_busy`, and `per_unit_metric` = CPU seconds x `scale` / `units`."""
        if self.cpu is None:
            return
        measured = self.cpu.over(start_ns, end_ns)
        if measured is None:
            return
        cores, cpu_s = measured
        self.add(workload, "machine_cores_busy", mode, rep, cores, n=n)
        if units > 0:
            self.add(workload, per_unit_metric, mode, rep, cpu_s * scale / units, n=n)

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
                  go_delay_s=0.25, extra_env=None, extra_envs=None, snapshot_after_s=None):
        """Starts every argv at once; with wait_go, waits for all "# ready", then sends one go
        instant to all. Returns the Procs (waited for; killed at the deadline). extra_envs: one
        dict per argv, added to that process's environment. snapshot_after_s: with
        --ops-snapshot, when (after go) to save the operator's view (ops_snapshot.py). With
        --dry-run each argv is run by dry_run.py, which makes up its output."""
        timer = None
        run_dir = os.path.join(self.work, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        env = self.env(mode, extra_env)
        envs = [dict(env, **(extra_envs[i] if extra_envs else {})) for i in range(len(argvs))]
        if self.args.dry_run:
            for i, (a, e) in enumerate(zip(argvs, envs)):
                extra = {k: v for k, v in e.items() if os.environ.get(k) != v}
                uid = client_uid(mode, i)
                log(f"  dry run: {'' if uid is None else f'(uid {uid}) '}"
                    f"{' '.join(f'{k}={v}' for k, v in sorted(extra.items()))} {' '.join(a)}")
            argvs = [dry_run_argv(a) for a in argvs]
        self.cpu = CpuSampler(self.broker_pids(mode)).start()
        procs = [Proc(a, envs[i], run_dir, f"{tag}.{i}", stdin_pipe=wait_go,
                      uid=None if self.args.dry_run else client_uid(mode, i))
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
            if snapshot_after_s is not None:
                timer = self.ops_timer(mode, tag, len(argvs), go_delay_s + snapshot_after_s)
            deadline = time.monotonic() + timeout_s
            for p in procs:
                p.wait(deadline)
        finally:
            self.cpu.stop()
            if timer:
                timer.cancel()
                timer.join()
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

    BROKER_COMMS = {**{m: ("mpsshimd", "mpsshim-server") for m in ALL_MODES if is_shim(m)},
                    "shim-groups-mps": ("mpsshimd", "mpsshim-server", "nvidia-cuda-mps"),
                    "mps": ("nvidia-cuda-mps",)}

    def broker_pids(self, mode) -> list[int]:
        """The broker's running processes (mpsshimd and its servers, or NVIDIA MPS's)."""
        prefixes = self.BROKER_COMMS.get(mode)
        if not prefixes or self.args.dry_run:
            return []
        pids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip().startswith(prefixes):
                        pids.append(int(pid))
            except OSError:
                continue
        return pids

    def broker_ticks(self, mode):
        """CPU clock ticks (user + system) of the broker's processes, all threads, so far; None
        when the mode has no broker or none of its processes runs."""
        pids = self.broker_pids(mode)
        return process_ticks(pids) if pids else None

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

    # ---- the schedule ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def estimate(self, workload, mode) -> float:
        if (workload, mode) in self.item_cost:
            return self.item_cost[(workload, mode)]
        quick, full = WORKLOADS[workload].ESTIMATE_S
        return full if self.preset_name == "full" else quick

    def once_only(self, workload, rep) -> bool:
        """True when the workload has nothing to do in this repetition."""
        once_only = getattr(WORKLOADS[workload], "once_only", None)
        return bool(once_only and once_only(self.cfg, rep))

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
            "dry_run": bool(self.args.dry_run),
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
                            WORKLOADS[w].run(self, mode, rep)
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
