#!/usr/bin/env python3
"""Where the slow round trips of bench/kernel_latency --stamps --stamps-csv FILE lost their time:
before the kernel started, in its run, or after it ended.

  python3 tools/probes/stamp_tail.py FILE.csv [FILE2.csv ...] [--skip 100] [--slow-us 100]

Each trip is split into start (launch call -> kernel start), run and answer (kernel end -> the
synchronize returned). The GPU's %globaltimer and CLOCK_REALTIME are offset, so start and answer
are given over their medians: a slow trip's extra time shows up in the part it was lost in. For
each file it prints the trips over --slow-us: how many, their mean extra per part, and the first
20 (ms after the first trip; trip, start, run, answer in us).
"""
import argparse
import csv
import statistics
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--slow-us", type=float, default=100)
    args = parser.parse_args()
    for path in args.files:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(open(path))][args.skip:]
        if not rows:
            print(f"{path}: no trips")
            continue
        trip = [(r["done_ns"] - r["launch_ns"]) / 1000 for r in rows]
        start = [(r["gpu_start_ns"] - r["launch_ns"]) / 1000 for r in rows]
        run = [(r["gpu_end_ns"] - r["gpu_start_ns"]) / 1000 for r in rows]
        answer = [(r["done_ns"] - r["gpu_end_ns"]) / 1000 for r in rows]
        med = [statistics.median(v) for v in (start, run, answer)]
        slow = [i for i, t in enumerate(trip) if t > args.slow_us]
        print(f"{path}: {len(rows)} trips, median {statistics.median(trip):.2f} us "
              f"(run {med[1]:.2f} us), {len(slow)} over {args.slow_us:g} us")
        if not slow:
            continue
        extra = [statistics.fmean(v[i] - m for i in slow) for v, m in zip((start, run, answer), med)]
        print(f"  their mean extra: start {extra[0]:.1f} us, run {extra[1]:.1f} us, "
              f"answer {extra[2]:.1f} us")
        first = rows[0]["launch_ns"]
        for i in slow[:20]:
            print(f"    at {(rows[i]['launch_ns'] - first) / 1e6:9.3f} ms: {trip[i]:8.1f} us = "
                  f"start +{start[i] - med[0]:.1f}, run {run[i]:.1f}, answer +{answer[i] - med[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
