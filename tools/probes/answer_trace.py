#!/usr/bin/env python3
"""Splits round trips into their hops from MPSSHIM_TRACE_ANSWERS files (libshim/answer_trace.hpp),
written by clients of a server run with MPSSHIM_SERVER_STAMP_ANSWERS=1 (all times
CLOCK_MONOTONIC, one clock for every process of the machine).

  python3 tools/probes/answer_trace.py TRACE.csv [TRACE2.csv ...] [--op 36] [--skip 100]

For the answers of one opcode (36: cuStreamSynchronize, 5: cuCtxSynchronize; proto/ops.hpp),
after the first --skip of them (warm-up), it prints the median and p99 of each hop, in
microseconds:

  launch -> worker    the last launch's record, committed by the client, taken by the worker
  worker's launch     taken -> its driver call returned (validation, batching, the driver)
  sync -> worker      the synchronize's record, committed, taken
  wait                taken -> the worker knew the answer (the GPU's work, the fence's write,
                      the worker's sight of it)
  answer write        knew -> wrote the slot
  answer -> client    wrote -> the waiting client saw it
  round trip          the launch's commit -> the client saw the answer

Beside each hop's p50 and p99 it prints the hop's mean over the slowest 1% of round trips
(those at or above the round trip's p99) and over the others: where the tail's extra time is,
then how many trips took over 50 us, 100 us, 500 us and 1 ms. With --slow-us T it lists every
trip over T us: when it began (ms after the first) and its hops.

Trips whose answer carries no server stamps (a server without the variable) are left out, and
so are early answers (column early = 1: the client returned on its fence's landing, before the
server's answer and its stamps); their count and round trip are printed on their own.
"""
import argparse
import csv
import statistics
import sys

HOPS = [
    ("launch -> worker", "launch_sent", "launch_taken"),
    ("worker's launch", "launch_taken", "launch_issued"),
    ("sync -> worker", "sent", "taken"),
    ("wait", "taken", "known"),
    ("answer write", "known", "answered"),
    ("answer -> client", "answered", "seen"),
    ("round trip", "launch_sent", "seen"),
]


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--op", type=int, default=36)
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--slow-us", type=float, default=0, help="list the trips over this")
    args = parser.parse_args()
    for path in args.traces:
        rows = [r for r in csv.DictReader(open(path)) if int(r["op"]) == args.op]
        rows = [{k: int(v) for k, v in r.items()} for r in rows[args.skip:]]
        early = [r for r in rows if r.get("early", 0)]
        if early:
            trips = [(r["seen"] - r["launch_sent"]) / 1000 for r in early if r["launch_sent"]]
            print(f"{path}: {len(early)} early answers of op {args.op}" +
                  (f", round trip p50 {statistics.median(trips):.2f} us, p99 "
                   f"{quantile(trips, 0.99):.2f} us" if trips else ""))
        rows = [r for r in rows if not r.get("early", 0)]
        rows = [r for r in rows if r["taken"] and r["launch_taken"] and r["launch_sent"]]
        print(f"{path}: {len(rows)} answers of op {args.op}")
        if not rows:
            continue
        trip = [r["seen"] - r["launch_sent"] for r in rows]
        cut = quantile(trip, 0.99)
        slow = [r for r, t in zip(rows, trip) if t >= cut]
        rest = [r for r, t in zip(rows, trip) if t < cut]
        for name, start, end in HOPS:
            us = [(r[end] - r[start]) / 1000 for r in rows]
            slow_mean = statistics.fmean((r[end] - r[start]) / 1000 for r in slow)
            rest_mean = statistics.fmean((r[end] - r[start]) / 1000 for r in rest) if rest else 0.0
            print(f"  {name:18} p50 {statistics.median(us):9.2f} us   p99 {quantile(us, 0.99):9.2f} us"
                  f"   mean: slowest 1% {slow_mean:8.2f} us, the rest {rest_mean:8.2f} us")
        over = ", ".join(f"{sum(t > us * 1000 for t in trip)} over {us} us" for us in (50, 100, 500, 1000))
        print(f"  trips: {over}; the longest {max(trip) / 1000:.1f} us")
        if args.slow_us > 0:
            first = rows[0]["launch_sent"]
            for r, t in zip(rows, trip):
                if t > args.slow_us * 1000:
                    hops = " ".join(f"{(r[end] - r[start]) / 1000:.1f}" for _, start, end in HOPS[:-1])
                    print(f"    at {(r['launch_sent'] - first) / 1e6:9.3f} ms: {t / 1000:8.1f} us = {hops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
