#!/usr/bin/env python3
"""The harness's --ops-snapshot (bench/harness/ops_snapshot.py) against a real daemon on the
host-memory test driver: with two clients holding known work, the saved `ps`, `ps --json` and
/metrics scrape name both clients with their launches and bytes, and a daemon that serves no
metrics gives a snapshot that says so instead of failing the run.
usage: ops_snapshot_test.py SOURCE_DIR (artefacts from the environment, as for the e2e suite)"""
import json
import os
import subprocess
import sys
import tempfile
import time
import types


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


class Daemon:
    """mpsshimd with the test driver, its output in DIR/daemon.out (where the harness keeps it)."""

    def __init__(self, where: str, extra: list[str]):
        self.dir = where
        self.out = open(os.path.join(where, "daemon.out"), "wb")
        env = dict(os.environ, MPSSHIM_TESTDRIVER_QUERY_SOCKET=os.path.join(where, "tdq"))
        self.proc = subprocess.Popen(
            [os.environ["MPSSHIMD"], "--runtime-dir", where, "--server",
             os.environ["MPSSHIM_SERVER"], "--driver", os.environ["MPSSHIM_TESTDRIVER"],
             "--log-level", "info"] + extra,
            stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run([os.environ["MPSSHIMCTL"], "--runtime-dir", where, "server_list"],
                               capture_output=True, text=True)
            if r.returncode == 0 and "running" in r.stdout:
                return
            time.sleep(0.05)
        fail("mpsshimd did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.out.close()


def start_client(where: str) -> subprocess.Popen:
    """An e2e_client holding 2 launches' and known bytes' worth of work until stdin closes."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=where, LD_PRELOAD=os.environ["LIBMPSSHIM"])
    if os.environ.get("SANITIZER_PRELOAD"):
        env["LD_PRELOAD"] = os.environ["SANITIZER_PRELOAD"] + ":" + env["LD_PRELOAD"]
    client = subprocess.Popen([os.environ["E2E_CLIENT"], "account", "2"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in client.stdout:
        if line.startswith("READY"):
            return client
    fail(f"e2e_client account exited {client.wait()} before READY")
    raise AssertionError


def snapshotter(source: str, daemon: Daemon, out: str, ops_snapshot: bool):
    """The harness's OpsSnapshot with just the state it reads."""
    sys.path.insert(0, os.path.join(source, "bench"))
    from harness.ops_snapshot import OpsSnapshot  # noqa: E402
    snap = OpsSnapshot()
    snap.args = types.SimpleNamespace(ops_snapshot=ops_snapshot, dry_run=False)
    snap.shim_log, snap.shim_dir, snap.out = daemon.out, daemon.dir, out
    snap.ctl = os.environ["MPSSHIMCTL"]
    snap.env = lambda mode: dict(os.environ)
    return snap


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def main() -> int:
    source = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="mpsshim-ops-") as where:
        # Served metrics: the daemon gets what ops_daemon_args() says.
        probe = snapshotter(source, types.SimpleNamespace(out=None, dir=where), where, True)
        daemon = Daemon(where, probe.ops_daemon_args())
        clients = [start_client(where) for _ in range(2)]
        try:
            snap = snapshotter(source, daemon, os.path.join(where, "r"), True)
            timer = snap.ops_timer("shim", "priority.shim.0.shared", 2, 0.0)
            if timer is None:
                fail("no snapshot timer for a two-client shim group")
            timer.join(30)
            if snap.ops_timer("native", "t", 2, 0.0) or snap.ops_timer("shim", "t", 1, 0.0):
                fail("a snapshot timer for a native group or a single client")
            base = os.path.join(where, "r", "ops", "priority.shim.0.shared")
            ps, metrics = read(base + ".ps.txt"), read(base + ".metrics.txt")
            listed = json.loads(read(base + ".ps.json"))
            for c in clients:
                if str(c.pid) not in ps:
                    fail(f"ps.txt lacks client {c.pid}:\n{ps}")
                if f'pid="{c.pid}"' not in metrics:
                    fail(f"metrics.txt lacks pid=\"{c.pid}\":\n{metrics}")
            text = json.dumps(listed)
            if not all(str(c.pid) in text for c in clients):
                fail(f"ps.json lacks a client:\n{text}")
            for name in ("mpsshim_client_launches_total", "mpsshim_client_busy_seconds_total",
                         "mpsshim_server_clients"):
                if name not in metrics:
                    fail(f"metrics.txt lacks {name}:\n{metrics}")
        finally:
            for c in clients:
                c.stdin.close()
                c.wait(timeout=30)
            daemon.stop()
    with tempfile.TemporaryDirectory(prefix="mpsshim-ops-") as where:
        # No metrics served: the snapshot still has ps and says why it has no scrape.
        daemon = Daemon(where, [])
        try:
            snap = snapshotter(source, daemon, where, True)
            snap._save_ops("g")
            if "names no metrics port" not in read(os.path.join(where, "ops", "g.metrics.txt")):
                fail("a snapshot without metrics does not say why")
            if "PID" not in read(os.path.join(where, "ops", "g.ps.txt")).upper():
                fail("ps.txt without a header")
        finally:
            daemon.stop()
    print("PASS ops snapshot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
