"""The workloads, one module each. A workload module has TITLE, ESTIMATE_S (seconds per mode and
repetition: --quick, --full), METRICS (metric -> (label, unit, better)), programs(h) (the
programs it needs: name -> path) and run(h, mode, rep) (adds rows to h); optionally
once_only(cfg, rep) (nothing to do in this repetition) and report_notes(summary, modes) (lines
under its table). A new workload is a new module listed here."""
from . import (bandwidth, concurrency, launch, memory, mixed, multigpu, priority, resnet,
               scaling, startup)

# In the order they run within a repetition (and appear in the report).
WORKLOADS = {m.__name__.rsplit(".", 1)[1]: m
             for m in (launch, bandwidth, concurrency, mixed, priority, memory, resnet, scaling,
                       multigpu, startup)}
ALL_WORKLOADS = list(WORKLOADS)
# What runs without --workloads: the workloads of the harness's first reference runs (the
# priority, multigpu and startup workloads run when asked for).
DEFAULT_WORKLOADS = ["launch", "bandwidth", "concurrency", "mixed", "memory", "resnet", "scaling"]
# (workload, metric) -> (label, unit, better: "lower" | "higher" | None)
METRICS = {(name, metric): spec for name, module in WORKLOADS.items()
           for metric, spec in module.METRICS.items()}
