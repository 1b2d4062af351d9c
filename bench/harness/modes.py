"""The modes (native, NVIDIA MPS, mpsshim and its variants): each one's environment for clients
and how its daemon starts and stops. Mixed into the Harness (runner.py)."""
from __future__ import annotations

import os
import subprocess
import time

from .common import log

MODE_LABEL = {"native": "native (time-slicing)", "mps": "NVIDIA MPS", "shim": "mpsshim",
              "shim-eager": "mpsshim, launch batching off",
              "shim-runs": "mpsshim, batches in power-of-two runs",
              "shim-noprio": "mpsshim, priority scheduling off",
              "shim-noreserve": "mpsshim, no SMs reserved for priority",
              "shim-groups": "mpsshim, two isolation groups",
              "shim-solo": "mpsshim, a server per client",
              "shim-groups-mps": "mpsshim, two isolation groups over NVIDIA MPS"}
ALL_MODES = ["native", "mps", "shim", "shim-eager", "shim-runs", "shim-noprio", "shim-noreserve",
             "shim-groups", "shim-solo", "shim-groups-mps"]
# The mpsshim modes and what each adds to mpsshimd's command line (after --daemon-arg):
# "shim-eager" measures the daemon's defaults without launch batching, side by side
# (docs/launch-batching.md).
# "shim-runs" sends each batch as power-of-two runs, the last few launches eagerly, instead of
# one padded graph launch (the shape before 2026-11-28; docs/launch-batching.md).
# "shim-noprio" the same without holding back low-priority clients (docs/daemon.md).
# "shim-noreserve" holds them back but reserves no SMs for high-priority clients (docs/daemon.md,
# "SMs reserved for normal-priority clients"): what the reserve gives. Its argument comes after
# --daemon-arg, so a --daemon-arg=--priority-reserve-sms=N sweep leaves it at 0.
# "shim-groups" puts the clients in two isolation groups (docs/isolation.md): a group per uid,
# every other client run as GROUPS_OTHER_UID (the harness must run as root). "shim-solo" gives
# every client a server of its own (--isolation client). Both measure what isolation costs
# beside "shim" (one group) and NVIDIA MPS. "shim-groups-mps" is "shim-groups" with every
# mpsshim-server a client of NVIDIA MPS (started first; mpsshimd --nvidia-mps-pipe-directory):
# the groups' kernels may then overlap on the GPU, each group still in an address space of its
# own.
SHIM_MODES = {"shim": [], "shim-eager": ["--launch-batching=off"],
              "shim-runs": ["--launch-batch-graphs=runs"],
              "shim-noprio": ["--priority-scheduling=off"],
              "shim-noreserve": ["--priority-reserve-sms=0"],
              "shim-groups": ["--isolation=user", "--multiuser"],
              "shim-solo": ["--isolation=client"],
              "shim-groups-mps": ["--isolation=user", "--multiuser"]}
OVER_MPS = {"shim-groups-mps"}
# Modes whose clients may each wait for a server to start: more room before the common start.
STARTS_SERVERS = {"shim-groups", "shim-solo", "shim-groups-mps"}
GROUPS_OTHER_UID = 65534  # nobody


def client_uid(mode: str, index: int) -> int | None:
    """The uid client number `index` of a group runs as (None: the harness's own)."""
    if mode in ("shim-groups", "shim-groups-mps") and index % 2 == 1:
        return GROUPS_OTHER_UID
    return None


def is_shim(mode: str) -> bool:
    return mode in SHIM_MODES


class ModeControl:
    """The daemons of the modes; needs the Harness's paths (self.work, self.logs, ...)."""

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
        if self.args.dry_run:
            return self.dry_start(mode, rep)
        if mode == "mps":
            return self.mps_start(rep)
        if is_shim(mode):
            if client_uid(mode, 1) is not None:
                why = self.other_uid_blocked(os.path.join(self.work, f"shim.{rep}"))
                if why:
                    return why
            mode_args = list(SHIM_MODES[mode])
            if mode in OVER_MPS:
                why = self.mps_start(rep)
                if why:
                    return "NVIDIA MPS under the servers: " + why
                mode_args += ["--nvidia-mps-pipe-directory", self.mps_dirs[0]]
            return self.shim_start(rep, mode_args, mode)
        return ""

    def other_uid_blocked(self, shim_dir: str) -> str:
        """Why clients run as GROUPS_OTHER_UID could not reach the shim, the programs or the
        daemon's socket, or ""."""
        if os.geteuid() != 0:
            return "not root: clients cannot run as another uid"
        for path in (self.shim_lib, self.small_kernels, shim_dir):
            parent = os.path.dirname(path)
            while parent and parent != "/":
                if not os.stat(parent).st_mode & 0o001:
                    return (f"{parent} is not searchable by other users: a client of uid "
                            f"{GROUPS_OTHER_UID} could not reach {path}")
                parent = os.path.dirname(parent)
        for path in (self.shim_lib, self.small_kernels):
            if not os.stat(path).st_mode & 0o004:
                return f"{path} is not readable by other users"
        return ""

    def dry_start(self, mode: str, rep: int) -> str:
        """--dry-run: says what would start, starts nothing."""
        if mode == "mps":
            self.mps_dirs = (os.path.join(self.work, f"mps.{rep}", "pipe"),
                             os.path.join(self.work, f"mps.{rep}", "log"))
            log(f"  dry run: CUDA_MPS_PIPE_DIRECTORY={self.mps_dirs[0]} "
                f"{self.mps_control} -d")
        elif is_shim(mode):
            self.shim_dir = os.path.join(self.work, f"shim.{rep}")
            log(f"  dry run: {' '.join(self.shim_command() + SHIM_MODES[mode])}")
        return ""

    def shim_command(self) -> list[str]:
        # extra_shim_args: what a workload adds while it starts daemons of its own (startup.py).
        return [self.daemon, "--runtime-dir", self.shim_dir, "--server",
                self.server] + self.ops_daemon_args() + self.args.daemon_arg + getattr(
                    self, "extra_shim_args", [])

    def stop_mode(self, mode: str) -> None:
        if self.args.dry_run:
            return
        if mode == "mps":
            self.mps_stop()
        elif is_shim(mode):
            self.shim_stop()
            if mode in OVER_MPS:
                self.mps_stop()
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
        if self.args.dry_run:
            self.mps_dirs = None
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
        # Every GPU's server (the daemon starts them one after another; a client asking for a
        # GPU whose server is still starting is refused).
        running = sum(1 for line in text.splitlines() if "running" in line.split())
        return r.returncode == 0 and running >= max(1, self.gpus_listed()), text

    def gpus_listed(self) -> int:
        """The GPUs nvidia-smi lists, or fewer when CUDA_VISIBLE_DEVICES names fewer (the
        daemon's driver then sees only those)."""
        try:
            out = subprocess.run([self.smi, "-L"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return 1
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            count = min(count, sum(1 for entry in visible.split(",") if entry.strip()))
        return count

    def shim_start(self, rep: int, mode_args: list[str], mode: str = "shim") -> str:
        """Starts mpsshimd with the mode's arguments; its log is logs/mpsshimd.MODE.REP.log."""
        self.shim_dir = os.path.join(self.work, f"shim.{rep}")
        os.makedirs(self.shim_dir, exist_ok=True)
        log_path = os.path.join(self.logs, f"mpsshimd.{mode}.{rep}.log")
        self.shim_log = open(log_path, "wb")
        self.shim_proc = subprocess.Popen(
            self.shim_command() + mode_args,
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
        if self.args.dry_run:
            return True
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
