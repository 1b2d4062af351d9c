"""bench/bandwidth: H2D/D2H, pageable and pinned, 4 KiB .. 256 MiB."""
from __future__ import annotations

import os

from ..common import parse_bench_csv

TITLE = "Copy bandwidth (bench/bandwidth)"
ESTIMATE_S = (5, 8)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {}
for _series in ["h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable"]:
    for _kind in ["sync", "async"]:
        METRICS[f"{_series}_{_kind}"] = (
            f"{_series.replace('_', ' ').upper().replace('PINNED', 'pinned').replace('PAGEABLE', 'pageable')}"
            f" ({_kind})", "GB/s", "higher")


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {"bandwidth": os.path.join(h.bench_bin, "bandwidth")}


def run(h, mode, rep):
    argv = [os.path.join(h.bench_bin, "bandwidth")] + h.cfg["bandwidth_args"]
    procs = h.run_group(mode, [argv], f"bandwidth.{mode}.{rep}", timeout_s=180)
    rows = [r for r in parse_bench_csv(procs[0].stdout()) if r[0] == "bandwidth"]
    for _bench, metric, size, value, unit in rows:
        h.add("bandwidth", metric, mode, rep, value, size=size, unit=unit)
    err = h.group_error(procs, "bandwidth")
    if err:
        h.fail("bandwidth", ["h2d_pinned_sync"], mode, rep, err, size=0)
