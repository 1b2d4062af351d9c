"""An mpsshimd on the host-memory test driver for the packaging tests, started in the foreground
and known ready by systemd's notify protocol (READY=1 once every GPU's server is up), as the
systemd unit runs it: no polling."""
import json
import os
import select
import socket
import subprocess
import sys
import time


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


class Daemon:
    def __init__(self, mpsshimd: str, mpsshimctl: str, runtime_dir: str, driver: str,
                 extra: list[str]):
        self.ctl, self.dir = mpsshimctl, runtime_dir
        self.log_path = os.path.join(runtime_dir, "mpsshimd.out")
        notify_path = os.path.join(runtime_dir, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify_path)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [mpsshimd, "--runtime-dir", runtime_dir, "--driver", driver,
                 "--log-level", "info"] + extra,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while True:
            readable, _, _ = select.select([self.notify], [], [], 1.0)
            if readable and b"READY=1" in self.notify.recv(4096):
                break
            if self.proc.poll() is not None:
                fail(f"mpsshimd exited {self.proc.returncode} before READY=1:\n{self.log()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                fail(f"mpsshimd sent no READY=1 in 60 s:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def ctl_json(self, *command: str) -> dict:
        r = subprocess.run([self.ctl, "--runtime-dir", self.dir, "--json", *command],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            fail(f"mpsshimctl {' '.join(command)} exited {r.returncode}: {r.stdout}{r.stderr}")
        return json.loads(r.stdout)

    def quit(self) -> None:
        """mpsshimctl quit, then the daemon must exit 0."""
        r = subprocess.run([self.ctl, "--runtime-dir", self.dir, "quit"], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            self.proc.kill()
            fail(f"mpsshimctl quit exited {r.returncode}: {r.stdout}{r.stderr}")
        try:
            status = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"mpsshimd still runs 60 s after quit:\n{self.log()}")
        self.notify.close()
        if status != 0:
            fail(f"mpsshimd exited {status} after quit:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def client_env(runtime_dir: str, **extra: str) -> dict:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=runtime_dir)
    env.pop("LD_PRELOAD", None)
    env.pop("LD_LIBRARY_PATH", None)
    env.update(extra)
    # A sanitizer build's client needs the sanitizer's runtime first (tests/e2e).
    if os.environ.get("SANITIZER_PRELOAD"):
        env["LD_PRELOAD"] = ":".join(p for p in (os.environ["SANITIZER_PRELOAD"],
                                                 env.get("LD_PRELOAD")) if p)
    return env
