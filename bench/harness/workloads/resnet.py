"""bench/resnet_client.py: PyTorch ResNet-50 batch 1 inference, N processes."""
from __future__ import annotations

import statistics

from ..common import log, parse_result_line

TITLE = "PyTorch ResNet-50 batch 1 (bench/resnet_client.py)"
ESTIMATE_S = (40, 60)  # seconds per mode and repetition: --quick, --full

# metric -> (label, unit, better: "lower" | "higher" | None)
METRICS = {
    "ms_per_iter": ("ResNet-50 b1, per-process", "ms/iter", "lower"),
    "agg_iters_per_s": ("ResNet-50 b1, aggregate", "iters/s", "higher"),
    "out_sum": ("output check: sum of the logits (same seed in every mode)", "", None),
    "machine_cores_busy": ("ResNet-50 b1, whole machine: CPU cores busy (/proc/stat)", "cores",
                           None),
    "machine_cpu_ms_per_iter": ("ResNet-50 b1, whole machine: CPU per iteration (/proc/stat)",
                                "ms", "lower"),
}


def programs(h) -> dict:
    """The programs it runs: name -> path."""
    return {}


def once_only(cfg, rep) -> bool:
    return rep >= cfg["resnet_reps"]


def run(h, mode, rep):
    if rep >= h.cfg["resnet_reps"]:
        return
    iters = h.cfg["resnet_iters"]
    metrics = ["ms_per_iter", "agg_iters_per_s"]
    argv = [h.python, h.resnet_script, "--iters", str(iters), "--warmup", "10",
            "--windows", "5"]
    for n in h.cfg["resnet_n"]:
        key = ("resnet", mode)
        if key in h.failed_once:
            h.fail("resnet", metrics, mode, rep, "not run: " + h.failed_once[key], n=n,
                   status="skipped")
            continue
        ready_s = h.cfg["resnet_ready_s"]
        procs = h.run_group(mode, [argv] * n, f"resnet.{mode}.{rep}.n{n}",
                            timeout_s=60 + iters * 0.05 * n, wait_go=True,
                            ready_timeout_s=ready_s, go_delay_s=0.5,
                            extra_env={"NCCL_NVLS_ENABLE": "0",
                                       "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
        err = h.group_error(procs, "resnet_client")
        if err:
            h.failed_once[key] = f"N={n} failed: {err}"
            h.fail("resnet", metrics, mode, rep, err, n=n)
            log(f"  resnet {mode} n={n}: FAILED {err[:240]}")
            continue
        res = [parse_result_line(p.stdout(), "resnet_client")[0] for p in procs]
        span = (max(int(r["end_ns"]) for r in res) - min(int(r["start_ns"]) for r in res)) / 1e9
        for r in res:
            # One sample per timed window of each process.
            for w in r["window_ms"].split(","):
                h.add("resnet", "ms_per_iter", mode, rep, float(w), n=n)
            if "out_sum" in r:
                h.add("resnet", "out_sum", mode, rep, float(r["out_sum"]), n=n)
        h.add("resnet", "agg_iters_per_s", mode, rep, n * iters / span, n=n)
        h.add_machine_cpu("resnet", mode, rep, min(int(r["start_ns"]) for r in res),
                          max(int(r["end_ns"]) for r in res), n * iters,
                          "machine_cpu_ms_per_iter", 1e3, n=n)
        log(f"  resnet {mode} n={n}: "
            f"{statistics.median(float(r['ms_per_iter']) for r in res):.2f} ms/iter, "
            f"{n * iters / span:.0f} iters/s")
