"""What every part of the harness shares: the log, result-line parsing, started programs."""
from __future__ import annotations

import os
import subprocess
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/
MIB = 1 << 20


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

    def __init__(self, argv, env, work_dir, tag, stdin_pipe=False, uid=None):
        self.argv = argv
        self.tag = tag
        self.out_path = os.path.join(work_dir, tag + ".out")
        self.err_path = os.path.join(work_dir, tag + ".err")
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.popen = subprocess.Popen(
            argv, env=env, stdout=self._out, stderr=self._err,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            user=uid, group=uid, extra_groups=[] if uid is not None else None)
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
