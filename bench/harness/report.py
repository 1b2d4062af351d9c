"""report.md (tables per workload, where mpsshim is behind, failures, notes) and the plots."""
from __future__ import annotations

import json
import os

from .common import MIB, size_label
from .modes import MODE_LABEL, is_shim
from .workloads import METRICS, WORKLOADS


def fmt(value, unit="") -> str:
    if value is None:
        return "-"
    if unit == "":
        return f"{value:.7g}"
    a = abs(value)
    if unit == "clients" or (unit == "MiB" and float(value).is_integer()):
        return f"{value:,.0f}"
    if unit in ("kernels/s", "iters/s") or a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def is_skip(error: str) -> bool:
    return error.startswith(("skipped", "not run"))


def cell(entry) -> str:
    if entry is None:
        return "n/a"
    if entry["median"] is None:
        err = entry["error"] or "failed"
        word = "skipped" if is_skip(err) else "FAILED"
        return f"**{word}**: {err[:160]}".replace("|", "/")
    unit = entry["unit"]
    text = fmt(entry["median"], unit)
    if entry["samples"] > 1 and entry["min"] != entry["max"]:
        text += f" ({fmt(entry['min'], unit)}–{fmt(entry['max'], unit)})"
    if entry["failures"]:
        text += f" [{entry['failures']} run(s) failed]"
    if entry.get("skipped"):
        text += f" [{entry['skipped']} skipped]"
    return text


def ratio(a, b):
    if not a or not b or a["median"] is None or b["median"] is None or b["median"] == 0:
        return None
    return a["median"] / b["median"]


def verdict(r, better, other) -> str:
    """Plain words: is mpsshim behind `other`?"""
    if r is None or better is None:
        return ""
    worse = r > 1.05 if better == "lower" else r < 0.95
    ahead = r < 0.95 if better == "lower" else r > 1.05
    if worse:
        factor = r if better == "lower" else (1 / r if r else float("inf"))
        return f"**behind {other} ({factor:.2f}x worse)**"
    if ahead:
        # A lower-is-better figure of 0 (no server CPU measured in a short run) is ahead by
        # any factor.
        factor = (1 / r if r else float("inf")) if better == "lower" else r
        return f"ahead of {other} ({factor:.2f}x better)"
    return f"on par with {other}"


def index(summary):
    table = {}
    for e in summary:
        table[(e["workload"], e["metric"], e["n"], e["size_bytes"], e["mode"])] = e
    return table


def column_order(modes):
    """The modes as table columns: mpsshim's own (the daemon's defaults, "shim") last, right before
    the ratios computed from it, so that no comparison mode (shim-eager, ...) stands there."""
    return [m for m in modes if m != "shim"] + (["shim"] if "shim" in modes else [])


def table_rows(summary, modes, keys, idx, label_fn):
    shims = [m for m in modes if is_shim(m)]
    modes = column_order(modes)
    cols = [MODE_LABEL[m] for m in modes]
    others = [(o, name) for o, name in (("mps", "MPS"), ("native", "native")) if o in modes]
    has_ratio = bool(shims) and bool(others)
    head = ["figure", "unit"] + cols
    if has_ratio:
        for shim_mode in shims:
            tag = "mpsshim" if shim_mode == "shim" else shim_mode
            head += [f"{tag}/{name}" for _, name in others]
        head.append("mpsshim is")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    behind = []
    for key in keys:
        w, m, n, size = key
        label, unit, better = METRICS.get((w, m), (m, "", None))
        entries = {mode: idx.get((w, m, n, size, mode)) for mode in modes}
        row = [label_fn(key, label), unit] + [cell(entries[mode]) for mode in modes]
        if has_ratio:
            words = []
            for shim_mode in shims:
                for other, name in others:
                    r = ratio(entries.get(shim_mode), entries.get(other))
                    row.append(f"{r:.2f}" if r is not None else "-")
                    # The verdict speaks of the first mpsshim mode (the daemon's defaults).
                    v = verdict(r, better, name) if shim_mode == shims[0] else ""
                    if v:
                        words.append(v)
            shim = entries.get(shims[0])
            if shim is not None and shim["median"] is None:
                words = ["not run" if is_skip(shim["error"]) else "**failed**"]
            row.append("; ".join(words))
            if better is not None and any("behind" in x or "failed" in x for x in words):
                behind.append((key, label_fn(key, label), unit, words, shim))
        lines.append("| " + " | ".join(row) + " |")
    return lines, behind


def render_report(summary, meta, modes) -> str:
    idx = index(summary)
    L = []
    L.append(f"# mpsshim benchmark: {meta['gpu']}, driver {meta['driver']}, {meta['date_utc']}")
    L.append("")
    L.append(f"Command: `{meta['command']}` (preset {meta['preset']}, {meta['reps']} repetitions, "
             f"modes {', '.join(modes)}, {meta.get('elapsed_s', '?')} s). Idle GPU: "
             f"{meta.get('gpu_memory_idle_mib')} MiB in use of {meta.get('gpu_memory_total_mib')} MiB.")
    L.append("")
    if meta.get("dry_run"):
        L.append("**Dry run** (`--dry-run`): no GPU program ran; every figure below was made up by "
                 "bench/harness/dry_run.py. Only the commands, environments, parsing and this "
                 "report are real.")
        L.append("")
    if meta.get("build_info"):
        L.append(f"Build: {meta['build_info'].splitlines()[0]}")
        L.append("")
    L.append("Each cell: median (min–max) over repetitions, and over the processes of a run where "
             "a figure is per process. Ratios are mpsshim's median over the other mode's; "
             "\"behind\" means more than 5% worse in the figure's direction (lower time, higher "
             "throughput).")
    L.append("")
    all_behind = []

    def plain(key, label):
        w, m, n, size = key
        extra = []
        if n not in ("", "None"):
            extra.append(f"N={n}")
        if size:
            extra.append(size_label(size))
        return label + (f", {', '.join(extra)}" if extra else "")

    # Headline
    cn = [int(e["n"]) for e in summary if e["workload"] == "concurrency" and e["n"].isdigit()]
    n8 = "8" if 8 in cn else (str(max(cn)) if cn else "8")
    bw_sizes = sorted({e["size_bytes"] for e in summary if e["workload"] == "bandwidth"})
    big = 64 * MIB if 64 * MIB in bw_sizes else (bw_sizes[-1] if bw_sizes else 0)
    rn = [e["n"] for e in summary if e["workload"] == "resnet"]
    mem_marg = [e["n"] for e in summary if e["metric"] == "mem_marginal_mib"]
    largest = bw_sizes[-1] if bw_sizes else 0
    mixed_n = f"{meta['config']['mixed_large']}L+{meta['config']['mixed_small']}S"
    n_max = str(max(cn)) if cn else ""
    prio_n = f"1H+{meta['config'].get('priority_low_clients', 4)}L"
    head_keys = [
        ("concurrency", "agg_kernels_per_s", "1", 0),
        ("concurrency", "agg_kernels_per_s", n8, 0),
        ("concurrency", "per_proc_s", n8, 0),
        ("concurrency", "agg_kernels_per_s", n_max, 0),
        ("launch", "launch_async_cpu", "", 0),
        ("launch", "launch_ctx_sync", "", 0),
        ("launch", "launch_stream_sync", "", 0),
        ("launch", "ctx_sync_idle", "", 0),
        ("launch", "mem_alloc_free", "", 0),
        ("bandwidth", "h2d_pinned_sync", "", big),
        ("bandwidth", "h2d_pinned_sync", "", largest),
        ("bandwidth", "h2d_pageable_sync", "", largest),
        ("bandwidth", "d2h_pageable_sync", "", largest),
        ("mixed", "small_p50_us", mixed_n, 0),
        ("mixed", "small_p99_us", mixed_n, 0),
        ("mixed", "large_agg_kernels_per_s", mixed_n, 0),
        ("memory", "mem_marginal_mib", mem_marg[0] if mem_marg else "", 0),
        ("memory", "mem_daemon_idle_mib", "0", 0),
        ("scaling", "max_clients", "", 0),
        ("priority", "high_p99_vs_alone", prio_n, 0),
        ("priority", "low_tput_vs_alone", prio_n, 0),
        ("resnet", "agg_iters_per_s", "1", 0),
        ("resnet", "agg_iters_per_s", "8" if "8" in rn else (rn[-1] if rn else "8"), 0),
    ]
    seen_keys = []
    for k in head_keys:
        if k not in seen_keys:
            seen_keys.append(k)
    head_keys = seen_keys
    head_keys = [k for k in head_keys if any((k + (m,)) in idx for m in modes)]
    lines, behind = table_rows(summary, modes, head_keys, idx, plain)
    head_behind = list(behind)
    L.append("## Headline")
    L.append("")
    L += lines
    L.append("")
    all_behind += behind

    sections = [(name, module.TITLE) for name, module in WORKLOADS.items()]
    for w, title in sections:
        keys = []
        for e in summary:
            if e["workload"] != w:
                continue
            k = (e["workload"], e["metric"], e["n"], e["size_bytes"])
            if k not in keys:
                keys.append(k)
        if not keys:
            continue

        def sort_key(k):
            metric_order = [m for (ww, m) in METRICS if ww == w]
            mi = metric_order.index(k[1]) if k[1] in metric_order else 99
            n = int(k[2]) if str(k[2]).isdigit() else 0
            return (mi, k[3], n)

        keys.sort(key=sort_key)
        if w == "scaling":
            keys = [k for k in keys if k[1] in ("max_clients", "idle_cpu_pct")]
        if w == "bandwidth":
            largest = max(k[3] for k in keys)
            keys = [k for k in keys if k[1].endswith("_sync") or k[3] == largest]
        lines, behind = table_rows(summary, modes, keys, idx, plain)
        L.append(f"## {title}")
        L.append("")
        L += lines
        L.append("")
        if w == "resnet":
            sums = {mode: [e for e in summary if e["workload"] == "resnet"
                           and e["metric"] == "out_sum" and e["mode"] == mode
                           and e["median"] is not None] for mode in modes}
            ref = sums.get("native") or sums.get("mps") or []
            if ref:
                r0 = ref[0]["median"]
                for mode in modes:
                    if mode == "native" or not sums.get(mode):
                        continue
                    worst = max(abs(e[k] - r0) for e in sums[mode] for k in ("min", "max"))
                    rel = worst / max(abs(r0), 1e-12)
                    L.append(f"- {MODE_LABEL[mode]}: output {'matches' if rel < 1e-3 else '**differs from**'}"
                             f" the reference (largest relative difference {rel:.1e})")
                L.append("")
        notes_of = getattr(WORKLOADS[w], "report_notes", None)
        if notes_of:
            L += notes_of(summary, modes) + [""]
        if w == "scaling":
            for mode in modes:
                e = idx.get(("scaling", "max_clients", "", 0, mode))
                if e and e["error"]:
                    L.append(f"- {MODE_LABEL[mode]}: {e['error']}".replace("|", "/"))
            L.append("")
        all_behind += [b for b in behind if b[0] not in {x[0] for x in all_behind}]

    L.append("## Where mpsshim is behind")
    L.append("")
    if not all_behind:
        L.append("Nowhere by more than 5% in these runs.")
    else:
        L.append("Headline figures first, then every other figure of the tables above.")
        L.append("")
    seen = set()
    failed_runs = {}
    head_set = {b[0] for b in head_behind}
    ordered = head_behind + [b for b in all_behind if b[0] not in head_set]
    for key, label, unit, words, shim in ordered:
        if "**failed**" in words:
            # One line per failed run (workload, N), not per figure.
            failed_runs.setdefault((key[0], key[2]), shim["error"] if shim else "")
            continue
        if label in seen:
            continue
        seen.add(label)
        L.append(f"- {label} ({unit}): {'; '.join(words)}")
    for (w, n), err in failed_runs.items():
        L.append(f"- {w}{f' N={n}' if n else ''}: **mpsshim failed**: {err[:300]}"
                 .replace("|", "/"))
    L.append("")
    failures = [e for e in summary if (e["failures"] or e["skipped"]) and e["median"] is None]
    if failures:
        L.append("## Failed or skipped runs")
        L.append("")
        seen_runs = set()
        for e in failures:
            run = (e["mode"], e["workload"], e["n"])
            if run in seen_runs:
                continue
            seen_runs.add(run)
            what = e["workload"] + (f" N={e['n']}" if e["n"] else "")
            L.append(f"- {MODE_LABEL[e['mode']]}, {what}: {e['error'][:300]}".replace("|", "/"))
        L.append("")
    if meta.get("notes"):
        L.append("## Notes")
        L.append("")
        for note in meta["notes"]:
            L.append(f"- {note}")
        L.append("")
    plots = meta.get("plots") or []
    if plots and plots[0].endswith(".png"):
        L.append("## Plots")
        L.append("")
        for p in plots:
            L.append(f"![{p}]({p})")
        L.append("")
    elif plots:
        L.append("Plots: matplotlib could not be imported; the plotted data is in plot_data.json.")
        L.append("")
    return "\n".join(L)


# ---- plots -----------------------------------------------------------------------------------
COLORS = {"native": "#7f7f7f", "mps": "#76b900", "shim": "#1f77b4", "shim-eager": "#d62728",
          "shim-noprio": "#9467bd", "shim-runs": "#17becf", "shim-noreserve": "#8c564b",
          "shim-groups": "#ff7f0e", "shim-solo": "#e377c2",
          "shim-groups-mps": "#bcbd22"}


def series(summary, workload, metric, mode, by="n"):
    xs, med, lo, hi = [], [], [], []
    for e in summary:
        if e["workload"] == workload and e["metric"] == metric and e["mode"] == mode \
                and e["median"] is not None:
            x = int(e["n"]) if by == "n" and str(e["n"]).isdigit() else e["size_bytes"]
            xs.append(x)
            med.append(e["median"])
            lo.append(e["median"] - e["min"])
            hi.append(e["max"] - e["median"])
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    return ([xs[i] for i in order], [med[i] for i in order], [lo[i] for i in order],
            [hi[i] for i in order])


def make_plots(summary, out, modes, meta) -> list[str]:
    plot_specs = {
        "concurrency.png": [("concurrency", "agg_kernels_per_s", "n", "processes N",
                             "aggregate kernels/s", True),
                            ("concurrency", "per_proc_s", "n", "processes N",
                             "per-process loop s (5000 kernels), log scale", True, True)],
        "bandwidth.png": [("bandwidth", m, "size", "bytes", m + " GB/s", True)
                          for m in ["h2d_pinned_sync", "h2d_pageable_sync", "d2h_pinned_sync",
                                    "d2h_pageable_sync"]],
        "resnet.png": [("resnet", "agg_iters_per_s", "n", "processes N", "aggregate iters/s",
                        False),
                       ("resnet", "ms_per_iter", "n", "processes N", "per-process ms/iter",
                        False)],
        "memory.png": [("memory", "mem_used_mib", "n", "idle clients (256 MiB each)",
                        "GPU memory in use, MiB", False),
                       ("scaling", "scaling_mem_mib", "n", "idle clients (1 MiB each)",
                        "GPU memory in use, MiB", False)],
    }
    bar_specs = {
        "launch.png": [("launch", m) for m in ["launch_async_cpu", "launch_stream_sync",
                                                "launch_ctx_sync", "mem_alloc_free"]],
        "mixed_scaling.png": [("mixed", "small_p50_us"), ("mixed", "small_p99_us"),
                              ("mixed", "small_agg_kernels_per_s"),
                              ("mixed", "large_agg_kernels_per_s"),
                              ("scaling", "max_clients")],
    }
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - plots are optional
        data = {}
        for name, specs in plot_specs.items():
            for w, m, by, *_ in specs:
                for mode in modes:
                    data[f"{w}/{m}/{mode}"] = series(summary, w, m, mode, by)
        for name, specs in bar_specs.items():
            for w, m in specs:
                for mode in modes:
                    data[f"{w}/{m}/{mode}"] = [[e["median"], e["min"], e["max"]] for e in summary
                                               if e["workload"] == w and e["metric"] == m
                                               and e["mode"] == mode]
        with open(os.path.join(out, "plot_data.json"), "w") as f:
            json.dump(data, f, indent=1)
        return ["plot_data.json"]

    title_tail = f"{meta['gpu']}, driver {meta['driver']}, {meta['date_utc']}"
    written = []
    for name, specs in plot_specs.items():
        if not any(e["workload"] == specs[0][0] for e in summary):
            continue
        cols = 2
        rows = (len(specs) + 1) // 2
        fig, axes = plt.subplots(rows, cols, figsize=(11, 4.2 * rows), squeeze=False)
        for ax, (w, m, by, xlabel, ylabel, logx, *logy) in zip(axes.flat, specs):
            for mode in modes:
                xs, med, lo, hi = series(summary, w, m, mode, by)
                if xs:
                    ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3,
                                color=COLORS[mode], label=MODE_LABEL[mode])
            if logx:
                ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[len(specs):]:
            ax.set_visible(False)
        fig.suptitle(f"{name[:-4]}: {title_tail}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)
        written.append(name)
    for name, specs in bar_specs.items():
        specs = [s for s in specs if any(e["workload"] == s[0] and e["metric"] == s[1]
                                         for e in summary)]
        if not specs:
            continue
        fig, axes = plt.subplots(1, len(specs), figsize=(3.2 * len(specs), 3.8), squeeze=False)
        for ax, (w, m) in zip(axes.flat, specs):
            label, unit, _better = METRICS[(w, m)]
            for i, mode in enumerate(modes):
                es = [e for e in summary if e["workload"] == w and e["metric"] == m
                      and e["mode"] == mode]
                e = es[0] if es else None
                if e and e["median"] is not None:
                    ax.bar(i, e["median"], color=COLORS[mode],
                           yerr=[[e["median"] - e["min"]], [e["max"] - e["median"]]], capsize=3)
                    ax.text(i, e["median"], fmt(e["median"], unit), ha="center", va="bottom",
                            fontsize=7)
                else:
                    word = ("skipped" if is_skip(e["error"]) else "failed") if e else "n/a"
                    ax.text(i, 0, word, ha="center", va="bottom",
                            fontsize=8, color="red", rotation=90)
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels([MODE_LABEL[x].split(" (")[0] for x in modes], fontsize=8)
            ax.set_title(f"{label}\n({unit})", fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"{name[:-4]}: {title_tail}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)
        written.append(name)
    return written
