"""--ops-snapshot: what an operator sees of a busy run. For the shim modes the daemon also serves
Prometheus metrics (--metrics-listen 127.0.0.1:0, the port read from its log), and partway through
each multi-client group the harness saves `mpsshimctl ps`, `mpsshimctl ps --json` and one scrape of
/metrics under OUT/ops/, named after the group. Mixed into the Harness (runner.py)."""
from __future__ import annotations

import os
import re
import subprocess
import threading
import urllib.request

from .common import log
from .modes import is_shim

METRICS_ARGS = ["--metrics-listen", "127.0.0.1:0"]
_PORT_LINE = re.compile(rb"metrics: listening on 127\.0\.0\.1:(\d+)")


class OpsSnapshot:
    def ops_daemon_args(self) -> list[str]:
        return METRICS_ARGS if self.args.ops_snapshot else []

    def _metrics_port(self) -> int:
        """The port the daemon bound, from its log; 0 if it has not said."""
        path = getattr(self.shim_log, "name", "")
        try:
            with open(path, "rb") as f:
                found = _PORT_LINE.search(f.read())
        except OSError:
            return 0
        return int(found.group(1)) if found else 0

    def _save_ops(self, tag: str) -> None:
        where = os.path.join(self.out, "ops")
        os.makedirs(where, exist_ok=True)
        for name, argv in (("ps.txt", ["ps"]), ("ps.json", ["ps", "--json"])):
            try:
                r = subprocess.run([self.ctl, "--runtime-dir", self.shim_dir] + argv,
                                   capture_output=True, text=True, timeout=10,
                                   env=self.env("native"))
                text = r.stdout + (f"\n# stderr ({r.returncode}): {r.stderr}" if r.returncode else "")
            except subprocess.SubprocessError as e:
                text = f"# mpsshimctl {' '.join(argv)}: {e}\n"
            with open(os.path.join(where, f"{tag}.{name}"), "w") as f:
                f.write(text)
        port = self._metrics_port()
        try:
            if not port:
                raise OSError("the daemon's log names no metrics port")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode("utf-8", "replace")
        except OSError as e:
            text = f"# scrape failed: {e}\n"
        with open(os.path.join(where, f"{tag}.metrics.txt"), "w") as f:
            f.write(text)
        log(f"  ops snapshot: {os.path.join('ops', tag)}.{{ps.txt,ps.json,metrics.txt}}")

    def ops_timer(self, mode: str, tag: str, clients: int, after_s: float):
        """A started timer that saves the snapshot after_s seconds into a group, or None where no
        snapshot is wanted (not asked for, not a shim mode, a single client, a dry run)."""
        if not self.args.ops_snapshot or not is_shim(mode) or clients < 2 or self.args.dry_run:
            return None
        timer = threading.Timer(after_s, self._save_ops, args=(tag,))
        timer.daemon = True
        timer.start()
        return timer
