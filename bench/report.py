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


def _plot_rss(ax, rss: dict) -> None:
    """RSS of the largest gunicorn worker and Celery process over the checkouts answered."""
    samples = rss["samples"]
    x = [s["checkouts"] for s in samples]
    for series, label, color in (
        ("gunicorn_worker_max_mb", "gunicorn worker (largest of 4)", "tab:blue"),
        ("celery_max_mb", "Celery process (largest)", "tab:orange"),
    ):
        figures = rss.get(series.replace("_mb", "")) or {}
        slope = figures.get("slope_mb_per_1000_checkouts")
        ax.plot(
            x,
            [s[series] for s in samples],
            label=f"{label}: peak {figures.get('peak_mb')} MB, slope {slope} MB / 1,000",
            color=color,
        )
    ax.set_xlabel("checkouts answered")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(f"RSS over {rss.get('checkouts', 0):,} checkouts")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


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
    samples = (data["scenarios"].get("rss") or {}).get("samples") or []
    panels = 3 if samples else 2
    fig, axes = plt.subplots(
        panels, 1, figsize=(width, 4.5 * panels), constrained_layout=True, squeeze=False
    )
    top, bottom = axes[0][0], axes[1][0]
    if samples:
        _plot_rss(axes[2][0], data["scenarios"]["rss"])

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


# --- the targets of the issues, each read from this run's figures ------------------------


def _cpu_ms(run: dict | None) -> float | None:
    if not run or not run.get("requests"):
        return None
    return 1000 * run["server_cpu_s"] / run["requests"]


def _find(result: dict, label: str, concurrency: int | None = None) -> dict | None:
    for run in result.get("runs", []):
        if run.get("label") == label and concurrency in (None, run.get("concurrency")):
            return run
    return None


def _levels(ratios: dict, key: str) -> list[tuple[str, float]]:
    return [
        (level, values[key])
        for level, values in ratios.items()
        if isinstance(values, dict) and values.get(key) is not None
    ]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def targets(data: dict) -> list[dict]:
    """Every target of the issues, with this run's value and met / not met / not measured.

    A target measured at several concurrency levels is met only if it is met at every level.
    """
    scenarios = data.get("scenarios", {})
    rows: list[dict] = []

    def add(name: str, issue: str, value: str, goal: str, met: bool | None) -> None:
        rows.append({"target": name, "issue": issue, "value": value, "goal": goal, "met": met})

    def per_level(name: str, issue: str, result: dict, key: str, goal: str, test) -> None:
        levels = _levels(result.get("ratios", {}), key)
        if not levels:
            add(name, issue, "not measured", goal, None)
            return
        value = " / ".join(f"c{lvl.lstrip('c')}: {_fmt(v, 2)}" for lvl, v in levels)
        add(name, issue, value, goal, all(test(v) for _, v in levels))

    checkout = scenarios.get("checkout", {})
    tps = (data.get("reference") or {}).get("pgbench_tps")
    orders = [r for r in checkout.get("runs", []) if r.get("label") == "order"]
    if orders and tps:
        value = " / ".join(f"c{r['concurrency']}: {r['rps'] / tps:.3f}" for r in orders)
        add(
            "checkout orders/s ÷ pgbench TPS",
            "#6",
            value,
            "≥ 0.08",
            all(r["rps"] / tps >= 0.08 for r in orders),
        )
    else:
        add("checkout orders/s ÷ pgbench TPS", "#6", "not measured", "≥ 0.08", None)
    hot = checkout.get("hot") or {}
    ratio = hot.get("hot_vs_uncontended")
    add(
        "hot sku: sales/s ÷ uncontended orders/s (exactly 100 of 100 sold)",
        "#6",
        _fmt(ratio, 2) + (" (100 sold)" if hot.get("exactly_100_sold") else ""),
        "≥ 0.5",
        None if ratio is None else bool(ratio >= 0.5 and hot.get("exactly_100_sold")),
    )
    per_level(
        "POST /orders/: replay ÷ first", "#4", checkout, "replay_vs_first", "≥ 3", lambda v: v >= 3
    )
    per_level(
        "POST /orders/: keyed ÷ unkeyed",
        "#4",
        checkout,
        "keyed_vs_unkeyed",
        "≥ 0.9",
        lambda v: v >= 0.9,
    )
    probe = scenarios.get("idempotency", {})
    per_level("probe: replay ÷ first", "#4", probe, "replay_vs_first", "≥ 3", lambda v: v >= 3)
    per_level(
        "probe: keyed ÷ unkeyed", "#4", probe, "keyed_vs_unkeyed", "≥ 0.9", lambda v: v >= 0.9
    )
    per_level(
        "webhooks: duplicate ÷ fresh events/s",
        "#11",
        scenarios.get("webhooks", {}),
        "duplicate_vs_fresh",
        "> 1",
        lambda v: v > 1,
    )
    relay = scenarios.get("relay", {})
    publish = _find(relay, "relay publish")
    add(
        "relay publish events/s",
        "#12",
        _fmt(publish["rps"] if publish else None, 0),
        "≥ 2,000",
        None if publish is None else publish["rps"] >= 2000,
    )
    steady = relay.get("steady") or {}
    lag = steady.get("lag_p99_s")
    add(
        "steady 300 events/s: lag p99 (s)",
        "#12",
        _fmt(lag, 2),
        "< 2",
        None if lag is None else lag < 2,
    )
    tracking = scenarios.get("tracking", {}).get("ratios", {}).get("duplicated_vs_deduplicated")
    add(
        "tracking read with 10 % duplicates ÷ without",
        "#13",
        " / ".join(f"{k}: {v:.2f}" for k, v in (tracking or {}).items()) or "not measured",
        "reported (no target)",
        None,
    )
    # Both at 4 in flight (= the sync workers) when measured there; --quick: what was run.
    catalog = scenarios.get("catalog_reads", {})
    detail = _find(catalog, "detail", 4) or _find(catalog, "detail")
    keyed = _find(checkout, "order", 4) or _find(checkout, "order")
    read_ms, order_ms = _cpu_ms(detail), _cpu_ms(keyed)
    cpu_ratio = order_ms / read_ms if read_ms and order_ms else None
    add(
        "gunicorn CPU per keyed checkout ÷ per product read",
        "#16",
        "not measured"
        if cpu_ratio is None
        else f"{cpu_ratio:.1f}× ({order_ms:.1f} ms at c{keyed['concurrency']} ÷ "
        f"{read_ms:.2f} ms at c{detail['concurrency']})",
        "≤ 7×",
        None if cpu_ratio is None else cpu_ratio <= 7,
    )
    growth = scenarios.get("growth", {})
    for phase in ("full", "purging"):
        ratios = growth.get("ratios", {}).get(phase) or {}
        rps, cpu = ratios.get("orders_per_s_vs_fresh"), ratios.get("cpu_per_order_vs_fresh")
        measured = rps is not None and cpu is not None
        add(
            f"growth: {phase} tables ÷ fresh (orders/s, CPU per order)",
            "#16",
            f"{_fmt(rps, 2)}, {_fmt(cpu, 2)}" if measured else "not measured",
            "both within ±10 %",
            None if not measured else bool(0.9 <= rps <= 1.1 and 0.9 <= cpu <= 1.1),
        )
    rss = scenarios.get("rss", {})
    for series, label in (
        ("gunicorn_worker_max", "gunicorn worker"),
        ("celery_max", "Celery worker"),
    ):
        figures = rss.get(series) or {}
        slope = figures.get("slope_mb_per_1000_checkouts")
        add(
            f"RSS of a {label} over {rss.get('checkouts', 0):,} checkouts: flat",
            "#16",
            "not measured"
            if slope is None
            else f"peak {figures['peak_mb']:.1f} MB, slope {slope:+.3f} MB/1k",
            "fitted rise < 2 MB",
            None if slope is None else bool(figures.get("flat")),
        )
    peer = scenarios.get("peer", {})
    ours_dups = []
    for case in ("same_key", "crash"):
        for label, figures in (peer.get(case) or {}).items():
            if label == "ours":
                ours_dups.append(
                    figures.get("duplicate_orders", 0) + figures.get("duplicate_charges", 0)
                )
    add(
        "ours: duplicate orders/charges (20 same-key requests; crash before answer)",
        "#16",
        "not measured" if not ours_dups else " / ".join(str(d) for d in ours_dups),
        "0",
        None if not ours_dups else all(d == 0 for d in ours_dups),
    )
    # Rows a scenario reads from its own figures (bench/scenarios/oscar.py).
    for result in scenarios.values():
        rows.extend(result.get("target_rows", []))
    return rows


def targets_table(rows: list[dict]) -> str:
    """The targets as a Markdown table (printed at the end of a run, pasted into the docs)."""
    verdict = {True: "**met**", False: "**not met**", None: "not measured"}
    lines = ["| target | issue | this run | target | |", "|---|---|---|---|---|"]
    for row in rows:
        shown = "no target" if row["goal"].startswith("reported") else verdict[row["met"]]
        lines.append(
            f"| {row['target']} | {row['issue']} | {row['value']} | {row['goal']} | {shown} |"
        )
    return "\n".join(lines)
