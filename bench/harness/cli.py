"""The command line: measure (--build-dir), or re-render an earlier run (--render)."""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import time

from . import __doc__ as harness_doc
from .common import Interrupted, _on_signal, log
from .runner import Harness
from .workloads import ALL_WORKLOADS, DEFAULT_WORKLOADS


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
    parser = argparse.ArgumentParser(description=harness_doc.split("\n\n")[0],
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
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"any of {','.join(ALL_WORKLOADS)}")
    parser.add_argument("--reps", type=int, default=0, help="repetitions (preset's by default)")
    parser.add_argument("--budget-s", type=float, default=0,
                        help="stop starting new work after this many seconds (preset's)")
    parser.add_argument("--concurrency-n", default="",
                        help="client counts of the concurrency workload, e.g. 8 (preset's)")
    parser.add_argument("--python", default="", help="python for resnet_client.py")
    parser.add_argument("--dry-run", action="store_true",
                        help="run no GPU program: each client is bench/harness/dry_run.py, which "
                             "makes its output up, and no daemon starts (proves the plumbing)")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra mpsshimd argument (repeatable), e.g. --daemon-arg=--log-level=info")
    parser.add_argument("--ops-snapshot", action="store_true",
                        help="shim modes: serve /metrics and save `mpsshimctl ps`, `ps --json` "
                             "and a /metrics scrape from the middle of each multi-client group "
                             "under OUT/ops/")
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
