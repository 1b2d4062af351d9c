#!/usr/bin/env python3
"""packaging/grafana/mpsshim.json names only metrics mpsshimd serves: a real mpsshimd on the
host-memory test driver (--metrics-listen 127.0.0.1:0, --busy-time on), after a client's kernel
faulted (so that the fault families have samples), with a client holding a memory limit, so that
every per-client family has a sample; every metric name in every panel's
PromQL and every template variable's query must be a sample name of its /metrics.

usage: dashboard_test.py DASHBOARD (MPSSHIMD, MPSSHIMCTL, MPSSHIM_SERVER, MPSSHIM_TESTDRIVER,
  E2E_CLIENT, LIBMPSSHIM from the environment, as for the e2e suite)"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

from mpsshimd_run import Daemon, client_env, fail

# PromQL words that are not metric names (operators, modifiers, clause keywords).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan", "atan2", "start", "end"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label matchers,
    ranges and by/on/... label lists are removed, and not called as functions."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for found in re.finditer(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = found.group(1), found.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every target of every panel (rows' panels too) and every templating
    query (label_values(METRIC..., label) names METRIC)."""
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel `{panel.get('title')}`", target["expr"]))
            walk(panel.get("panels", []))
    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        selector = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
        found.append((f"variable `{variable.get('name')}`",
                      selector.group(1) if selector else query))
    return found


def served_names(scrape: str) -> set[str]:
    """Sample names of a scrape (a histogram's are its _bucket, _sum and _count), plus the
    family name of a histogram or summary that has samples."""
    names, kinds = set(), {}
    for line in scrape.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            kinds[family] = kind
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][\w:]*", line).group(0))
    for family, kind in kinds.items():
        suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
        if any(family + s in names for s in suffixes.get(kind, ())):
            names.add(family)  # the family itself, as histogram_quantile's argument names it
    return names


def missing(dashboard: dict, served: set[str]) -> list[str]:
    return [f"{where}: {name} (in `{expr}`)" for where, expr in dashboard_queries(dashboard)
            for name in sorted(metric_names(expr)) if name not in served]


def self_check() -> None:
    """The check itself fails on a name /metrics does not serve."""
    expr = ('sum by (instance, gpu) (rate(mpsshim_client_busy_secs_total{gpu=~"$gpu",'
            'program="a{b}"}[$__rate_interval])) / on (gpu) group_left(name) '
            'mpsshim_gpu_info offset 5m > bool 0.5 and time() - mpsshim_x_bucket')
    if metric_names(expr) != {"mpsshim_client_busy_secs_total", "mpsshim_gpu_info",
                              "mpsshim_x_bucket"}:
        fail(f"metric_names() of the self-check expression: {sorted(metric_names(expr))}")
    wrong = {"panels": [{"title": "wrong", "targets": [{"expr": expr}]}]}
    if len(missing(wrong, {"mpsshim_gpu_info", "mpsshim_x_bucket"})) != 1:
        fail("a dashboard naming mpsshim_client_busy_secs_total passes the check")


def fault_once(daemon: Daemon, env: dict) -> None:
    """A client's kernel reads address 0 (e2e_client peek 0): the GPU's server exits after the
    fault, the daemon names the client and starts a fresh server, which must be up again."""
    culprit = subprocess.Popen([os.environ["E2E_CLIENT"], "peek", "0"], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if not any(line.startswith("READY") for line in culprit.stdout):
        fail(f"e2e_client peek exited {culprit.wait()} before READY")
    culprit.stdin.close()
    culprit.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        servers = daemon.ctl_json("server_list")["servers"]
        if servers and servers[0]["restarts"] >= 1 and servers[0]["state"] == "running":
            return
        time.sleep(0.1)
    fail(f"GPU 0's server is not running again after the fault:\n{daemon.log()}")


def main() -> int:
    self_check()
    with open(sys.argv[1]) as f:
        dashboard = json.load(f)
    queries = dashboard_queries(dashboard)
    if len(queries) < 10:
        fail(f"only {len(queries)} queries found in the dashboard")
    with tempfile.TemporaryDirectory(prefix="mpsshim-grafana-") as runtime:
        daemon = Daemon(os.environ["MPSSHIMD"], os.environ["MPSSHIMCTL"], runtime,
                        os.environ["MPSSHIM_TESTDRIVER"],
                        ["--server", os.environ["MPSSHIM_SERVER"],
                         "--metrics-listen", "127.0.0.1:0", "--busy-time", "on"])
        client = None
        try:
            port = re.search(r"metrics: listening on 127\.0\.0\.1:(\d+)", daemon.log())
            if not port:
                fail(f"mpsshimd's log names no metrics port:\n{daemon.log()}")
            fault_once(daemon, client_env(runtime, LD_PRELOAD=os.environ["LIBMPSSHIM"]))
            env = client_env(runtime, LD_PRELOAD=os.environ["LIBMPSSHIM"],
                             CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="1G")
            # Launches and copies done; it stays connected until its stdin closes.
            client = subprocess.Popen([os.environ["E2E_CLIENT"], "account", "2"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if not any(line.startswith("READY") for line in client.stdout):
                fail(f"e2e_client account exited {client.wait()} before READY")
            url = f"http://127.0.0.1:{port.group(1)}/metrics"
            # A server that does not answer within 2 s leaves its clients out of that scrape.
            for _ in range(3):
                with urllib.request.urlopen(url, timeout=30) as answer:
                    scrape = answer.read().decode()
                if f'pid="{client.pid}"' in scrape:
                    break
            else:
                fail(f"three scrapes without client {client.pid}:\n{scrape}")
            served = served_names(scrape)
            problems = missing(dashboard, served)
            if problems:
                fail("the dashboard names metrics /metrics does not serve:\n  " +
                     "\n  ".join(problems))
            used = set().union(*(metric_names(e) for _, e in queries))
            unused = sorted(n for n in served if n.startswith("mpsshim_") and n not in used)
            print(f"{len(queries)} queries, {len(used)} metrics, all served; not on the "
                  f"dashboard: {', '.join(unused) or 'none'}")
        finally:
            if client is not None:
                client.stdin.close()
                client.wait(timeout=60)
            daemon.quit()
    print("PASS grafana dashboard")
    return 0


if __name__ == "__main__":
    sys.exit(main())
