"""Ratios to the machine's reference, the results file and its plot."""

from __future__ import annotations

import json
import os
from pathlib import Path


def reference_summary(before: dict | None, after: dict | None) -> dict | None:
    """Average the reference measured before and after the scenarios; keep both and the spread."""
    measured = [r for r in (before, after) if r]
    if not measured:
        return None
    summary: dict = {"runs": measured}
    for key, field in (("pgbench", "tps"), ("redis", "ops_per_s")):
        values = [r[key][field] for r in measured if r.get(key)]
        if not values:
            continue
        mean = sum(values) / len(values)
        summary[f"{key}_{field}"] = round(mean, 1)
        summary[f"{key}_spread_pct"] = round(100 * (max(values) - min(values)) / mean, 1)
    return summary


def add_ratios(scenarios: dict, reference: dict | None) -> None:
    """Write each run's requests/s as a ratio to pgbench TPS and redis-benchmark ops/s."""
    tps = (reference or {}).get("pgbench_tps")
    ops = (reference or {}).get("redis_ops_per_s")
    for result in scenarios.values():
        for run in result.get("runs", []):
            run["rps_per_pgbench_tps"] = round(run["rps"] / tps, 5) if tps else None
            run["rps_per_redis_ops"] = round(run["rps"] / ops, 6) if ops else None


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _runs(scenarios: dict) -> list[tuple[str, dict]]:
    return [
        (f"{name}\n{run['label']} c={run['concurrency']}", run)
        for name, result in scenarios.items()
        for run in result.get("runs", [])
    ]


def plot(path: Path, data: dict) -> None:
    """Draw requests/s per run beside pgbench TPS, and p50/p99 latencies, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _runs(data["scenarios"])
    reference = data.get("reference") or {}
    tps = reference.get("pgbench_tps")
    ops = reference.get("redis_ops_per_s")
    pg_latency = [
        r["pgbench"]["latency_avg_ms"] for r in reference.get("runs", []) if r.get("pgbench")
    ]

    width = max(8.0, 1.1 * (len(runs) + 1) + 2)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 9), constrained_layout=True)

    labels = [label for label, _ in runs]
    values = [run["rps"] for _, run in runs]
    colors = ["tab:blue"] * len(runs)
    if tps:
        labels.append("pgbench\ntpcb-like 8 clients")
        values.append(tps)
        colors.append("tab:gray")
    bars = top.bar(range(len(values)), values, color=colors)
    for bar, (_, run) in zip(bars, runs, strict=False):
        ratio = run.get("rps_per_pgbench_tps")
        if ratio is not None:
            top.annotate(
                f"{ratio:.3f}× pgbench",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    top.set_xticks(range(len(values)), labels, fontsize=8)
    top.set_ylabel("requests/s (pgbench: transactions/s)")
    title = "Throughput"
    if ops:
        title += f" — redis-benchmark {ops:,.0f} ops/s (off scale)"
    top.set_title(title)
    top.grid(axis="y", alpha=0.3)

    x = range(len(runs))
    p50 = [run["latency_ms"]["p50"] or 0 for _, run in runs]
    p99 = [run["latency_ms"]["p99"] or 0 for _, run in runs]
    bottom.bar([i - 0.2 for i in x], p50, width=0.4, label="p50", color="tab:green")
    bottom.bar([i + 0.2 for i in x], p99, width=0.4, label="p99", color="tab:red")
    if pg_latency:
        bottom.axhline(
            sum(pg_latency) / len(pg_latency),
            color="tab:gray",
            linestyle="--",
            label="pgbench latency avg",
        )
    bottom.set_xticks(list(x), [label for label, _ in runs], fontsize=8)
    bottom.set_ylabel("latency (ms)")
    bottom.set_title("Latency per request")
    bottom.legend()
    bottom.grid(axis="y", alpha=0.3)

    machine = data.get("machine", {})
    fig.suptitle(
        f"make bench {data['started_at']} — {machine.get('cpus')} CPUs shared by "
        f"load generator and {data['config']['workers']} gunicorn workers",
        fontsize=10,
    )
    tmp = path.with_suffix(".png.tmp")
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    os.replace(tmp, path)
