"""Ratios to the machine's reference, the results file and its plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench import headline
from bench.headline import error_of, not_measured

# pgbench's before / after spread above which every figure of a run is "noisy" (issue 21).
NOISY_SPREAD_PCT = 10.0


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


def noisy(reference: dict | None) -> bool | None:
    """Whether pgbench moved more than NOISY_SPREAD_PCT between its before and after runs.

    None when it was not measured twice (--quick, --no-reference): the run cannot say.
    """
    if not reference or len(reference.get("runs", [])) < 2:
        return None
    spread = reference.get("pgbench_spread_pct")
    return None if spread is None else spread > NOISY_SPREAD_PCT


def add_ratios(scenarios: dict, reference: dict | None) -> None:
    """Write each run's requests/s as a ratio to pgbench TPS and redis-benchmark ops/s."""
    tps = (reference or {}).get("pgbench_tps")
    ops = (reference or {}).get("redis_ops_per_s")
    for result in scenarios.values():
        for run in result.get("runs", []):
            run["rps_per_pgbench_tps"] = round(run["rps"] / tps, 5) if tps else None
            run["rps_per_redis_ops"] = round(run["rps"] / ops, 6) if ops else None


# The keyed checkout's statements and round trips: pg_stat_statements is not loaded on the
# bench's server (it needs shared_preload_libraries and a restart), so the model takes the
# figures tests/orders/test_checkout_statements.py pins (docs/performance.md).
CHECKOUT_STATEMENTS, CHECKOUT_ROUND_TRIPS = 27, 37
STATEMENTS_SOURCE = (
    "tests/orders/test_checkout_statements.py (pinned; pg_stat_statements not loaded on the server)"
)


def capacity(scenarios: dict, cores: int | None) -> dict | None:
    """The capacity model's inputs and what they say, from the checkout and relay scenarios.

    Per order: gunicorn (web) and PostgreSQL CPU ms from the keyed checkout at
    its best level (`checkout.capacity`); per delivery: Celery worker, relay
    and PostgreSQL CPU ms from the end-to-end burst; an order makes `fanout`
    deliveries, so its pipeline share is fanout x per delivery. Orders/s a
    budget of `cores` sustains = cores x 1000 / CPU ms per order of that part.
    """
    per_level = (scenarios.get("checkout") or {}).get("capacity") or {}
    burst = _find(scenarios.get("relay") or {}, "end to end burst")
    if not per_level and not burst:
        return None
    level, checkout = max(
        per_level.items(), key=lambda item: item[1].get("orders_per_s") or 0, default=(None, {})
    )
    per_delivery = (burst or {}).get("cpu_ms_per_delivery") or {}
    fanout = (scenarios.get("relay") or {}).get("fanout")
    profile = (scenarios.get("checkout") or {}).get("profile") or {}

    def times(value: float | None) -> float | None:
        return round(value * fanout, 3) if value is not None and fanout else None

    order = {
        "web_ms": checkout.get("web_ms"),
        "postgres_checkout_ms": checkout.get("postgres_ms"),
        "worker_ms": times(per_delivery.get("worker")),
        "relay_ms": times(per_delivery.get("relay")),
        "postgres_pipeline_ms": times(per_delivery.get("postgres")),
    }
    parts = list(order.values())
    order["postgres_ms"] = (
        round(order["postgres_checkout_ms"] + order["postgres_pipeline_ms"], 3)
        if order["postgres_checkout_ms"] is not None and order["postgres_pipeline_ms"] is not None
        else None
    )
    order["total_ms"] = round(sum(parts), 3) if all(v is not None for v in parts) else None
    budgets = {
        "web": order["web_ms"],
        "worker": order["worker_ms"],
        "relay": order["relay_ms"],
        "postgres": order["postgres_ms"],
        "all_on_one_machine": order["total_ms"],
    }
    sustained = {
        name: round(cores * 1000 / ms, 1) if cores and ms else None for name, ms in budgets.items()
    }
    parts_only = {k: v for k, v in sustained.items() if k != "all_on_one_machine" and v}
    return {
        "cores": cores,
        "checkout_level": int(level) if level is not None else None,
        "checkout_orders_per_s": checkout.get("orders_per_s"),
        "deliveries_per_order": fanout,
        "per_delivery_ms": {
            "worker": per_delivery.get("worker"),
            "relay": per_delivery.get("relay"),
            "postgres": per_delivery.get("postgres"),
        },
        "per_order_ms": order,
        "statements_per_order": CHECKOUT_STATEMENTS,
        "round_trips_per_order": CHECKOUT_ROUND_TRIPS,
        "statements_source": STATEMENTS_SOURCE,
        "profile_statements_per_order": profile.get("sql_statements"),
        "orders_per_s_per_core": {
            name: round(1000 / ms, 1) if ms else None for name, ms in budgets.items()
        },
        "orders_per_s_sustained_by_all_cores": sustained,
        "saturates_first": min(parts_only, key=parts_only.get) if parts_only else None,
    }


def capacity_text(model: dict | None) -> str:
    """The capacity model as the run prints it (the JSON's `capacity`)."""
    if not model:
        return "Capacity model: not measured (needs the checkout and relay scenarios)."
    order, sustained = model["per_order_ms"], model["orders_per_s_sustained_by_all_cores"]

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f} ms"

    lines = [
        f"Capacity model (checkout at {model['checkout_level']} in flight, "
        f"{model['checkout_orders_per_s']} orders/s; {model['deliveries_per_order']} deliveries "
        "per order from the end-to-end burst):",
        f"  per delivery: worker {ms(model['per_delivery_ms']['worker'])}, relay "
        f"{ms(model['per_delivery_ms']['relay'])}, PostgreSQL "
        f"{ms(model['per_delivery_ms']['postgres'])}",
        f"  per order: web {ms(order['web_ms'])}, worker {ms(order['worker_ms'])}, relay "
        f"{ms(order['relay_ms'])}, PostgreSQL {ms(order['postgres_ms'])} (checkout "
        f"{ms(order['postgres_checkout_ms'])} + pipeline {ms(order['postgres_pipeline_ms'])}); "
        f"total {ms(order['total_ms'])}",
        f"  statements / round trips per order: {model['statements_per_order']} / "
        f"{model['round_trips_per_order']} ({model['statements_source']}; this run's profile "
        f"counted {model['profile_statements_per_order']})",
        f"  orders/s that {model['cores']} cores sustain if given wholly to: "
        + ", ".join(f"{name} {value}" for name, value in sustained.items())
        + f"; saturates first: {model['saturates_first']}",
    ]
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


# --- the plot: one panel per question, a 2 x 2 grid a screen shows whole ------------------

PLOT_SIZE_IN = (16, 12)  # at PLOT_DPI: 1,600 x 1,200 pixels
PLOT_DPI = 100
# The peer scenario's runs are labelled "ours" / "peer"; the Oscar scenario's
# (bench/scenarios/oscar.py) by what they measure, each its own series.
# The scenarios of the headline (bench/headline.py): run alone, their row is the plot.
HEADLINE_SCENARIOS = ("sustained", "oscar_sustained")
PEER_SERIES = {"ours": "ours (peer scenario)", "peer": "drf-idempotencykey peer"}


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _label_bars(ax, bars, fmt: str = "{:,.1f}", fontsize: int = 9) -> None:
    """Write each bar's value above it (`fmt`: a format string, or "s" for seconds)."""
    for bar in bars:
        height = bar.get_height()
        if height:
            ax.annotate(
                _seconds(height) if fmt == "s" else fmt.format(height),
                (bar.get_x() + bar.get_width() / 2, height),
                ha="center",
                va="bottom",
                fontsize=fontsize,
            )


def orders_series(scenarios: dict) -> dict[str, dict[int, float]]:
    """Orders/s by concurrency level, per series: ours keyed and unkeyed, the peers."""
    series: dict[str, dict[int, float]] = {}

    def put(name: str, run: dict) -> None:
        series.setdefault(name, {})[run["concurrency"]] = run["rps"]

    for run in scenarios.get("checkout", {}).get("runs", []):
        if run["label"] in ("order", "unkeyed"):
            put("ours, keyed" if run["label"] == "order" else "ours, unkeyed", run)
    for run in scenarios.get("peer", {}).get("runs", []):
        put(PEER_SERIES.get(run["label"], run["label"]), run)
    for run in scenarios.get("oscar", {}).get("runs", []):
        # "ours" / "ours 100k" are our side of the Oscar scenario; the rest Oscar's.
        label = run["label"]
        if label.startswith("ours"):
            put(f"ours beside Oscar{label[len('ours') :]}", run)
        else:
            put(f"Oscar: {label.removeprefix('oscar ')}", run)
    return series


def _plot_orders(ax, scenarios: dict) -> None:
    title = "Checkout orders/s by requests in flight, beside the peers"
    series = orders_series(scenarios)
    if not series:
        not_measured(ax, title, error_of(scenarios.get("checkout")))
        return
    levels = sorted({level for values in series.values() for level in values})
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(levels))]
        # The round with 100k orders in both databases: hatched, beside its fresh twin.
        bars = ax.bar(
            xs,
            [values.get(level, 0) for level in levels],
            width=width,
            label=name,
            hatch="//" if name.endswith("100k") else None,
        )
        _label_bars(ax, bars)
    ax.set_xticks(range(len(levels)), [f"{level} in flight" for level in levels])
    ax.set_ylabel("orders/s")
    ax.set_title(title)
    ax.legend(fontsize=9, loc="upper left", ncols=2)
    ax.margins(y=0.2)
    ax.grid(axis="y", alpha=0.3)


def _plot_pipeline(fig, cell, scenarios: dict) -> None:
    """Left: the burst against its targets; right: the steady lag against 2 s."""
    relay = scenarios.get("relay", {})
    burst = _find(relay, "end to end burst")
    if burst is None:
        not_measured(
            fig.add_subplot(cell),
            "Event pipeline: burst and lag against the targets",
            error_of(relay),
        )
        return
    left, right = cell.subgridspec(1, 2, width_ratios=(1, 1.2)).subplots()
    orders = [
        r["rps"] for r in scenarios.get("checkout", {}).get("runs", []) if r["label"] == "order"
    ]
    names, values = ["end to end\nburst"], [burst["rps"]]
    publish = _find(relay, "relay publish")
    if publish:
        names.insert(0, "relay\npublish")
        values.insert(0, publish["rps"])
    bars = left.bar(names, values, color=["tab:gray", "tab:blue"][-len(values) :])
    _label_bars(left, bars, "{:,.0f}")
    left.axhline(1000, color="tab:red", linestyle="--", label="target: 1,000 deliveries/s")
    if orders:
        left.axhline(
            10 * max(orders),
            color="tab:purple",
            linestyle=":",
            label=f"target: 10 × checkout ({max(orders):.1f} orders/s)",
        )
    left.set_ylabel("deliveries/s")
    left.set_title("Pipeline throughput")
    left.set_ylim(0, 1.5 * max(values + [1000, 10 * max(orders, default=0)]))
    left.legend(fontsize=9, loc="upper left")
    left.grid(axis="y", alpha=0.3)

    steady = relay.get("steady") or {}
    if "lag_p99_s" in steady:
        steady = {"fixed": steady}
    phases = [
        (
            ("fixed" if name == "fixed" else "½ burst")
            + f": {figures.get('offered_events_per_s', 0):,.0f}/s"
            + f"\nover {figures.get('seconds', 0):.0f} s",
            figures,
        )
        for name, figures in steady.items()
    ]
    if not phases:
        not_measured(right, "Steady lag", "not measured in this run")
        return
    xs = range(len(phases))
    p50 = [f.get("lag_p50_s", 0) for _, f in phases]
    p99 = [f.get("lag_p99_s", 0) for _, f in phases]
    last = [f.get("last_window_p99_s", 0) for _, f in phases]
    for offset, values_, label in (
        (-0.27, p50, "p50"),
        (0, p99, "p99"),
        (0.27, last, "p99, last window"),
    ):
        bars = right.bar([x + offset for x in xs], values_, 0.27, label=label)
        _label_bars(right, bars, "s", fontsize=8)
    right.axhline(2, color="tab:red", linestyle="--", label="target: p99 < 2 s")
    right.set_xticks(list(xs), [name for name, _ in phases])
    right.set_ylabel("lag, row written → effect committed (s)")
    top = max(p99 + last + [2])
    if top > 20:
        right.set_yscale("log")
        right.set_ylim(0.1, top * 20)
    else:
        right.set_ylim(0, top * 1.5)
    right.set_title("Steady lag (p99 target < 2 s)")
    right.legend(fontsize=9, loc="upper left")
    right.grid(axis="y", alpha=0.3)


def _plot_cpu(ax, scenarios: dict) -> None:
    """gunicorn CPU ms per request at 4 in flight (or what was run), with the 5 × read line."""
    title = "gunicorn CPU per request"
    picks = [
        ("product read", "catalog_reads", "detail"),
        ("product list", "catalog_reads", "list"),
        ("checkout, keyed", "checkout", "order"),
        ("checkout, unkeyed", "checkout", "unkeyed"),
        ("checkout, replay", "checkout", "replay"),
    ]
    names, values, levels = [], [], []
    for name, scenario, label in picks:
        result = scenarios.get(scenario, {})
        run = _find(result, label, 4) or _find(result, label)
        cpu = _cpu_ms(run)
        if cpu is not None:
            names.append(name)
            values.append(cpu)
            levels.append(run["concurrency"])
    if not values:
        not_measured(ax, title, error_of(scenarios.get("checkout")))
        return
    colors = ["tab:red" if n == "checkout, keyed" else "tab:blue" for n in names]
    bars = ax.bar(
        [f"{n}\n({lvl} in flight)" for n, lvl in zip(names, levels, strict=True)],
        values,
        color=colors,
    )
    _label_bars(ax, bars, "{:.1f} ms")
    if "product read" in names:
        read = values[names.index("product read")]
        ax.axhline(
            CPU_RATIO_TARGET * read,
            color="tab:red",
            linestyle="--",
            label=f"target: keyed checkout ≤ {CPU_RATIO_TARGET:g} × product read "
            f"= {CPU_RATIO_TARGET * read:.1f} ms",
        )
        if "checkout, keyed" in names:
            ratio = values[names.index("checkout, keyed")] / read
            title += f": keyed checkout = {ratio:.1f} × a product read"
        ax.legend(fontsize=9, loc="upper left")
    ax.set_ylabel("CPU ms per request (all gunicorn workers)")
    ax.set_title(title)
    ax.margins(y=0.2)
    ax.grid(axis="y", alpha=0.3)


def _plot_rss(ax, rss: dict) -> None:
    """RSS of the largest gunicorn worker and Celery process over the checkouts answered."""
    samples = rss.get("samples") or []
    if not samples:
        not_measured(ax, "RSS over checkouts", error_of(rss))
        return
    x = [s["checkouts"] for s in samples]
    for series, label, color in (
        ("gunicorn_worker_max_mb", "gunicorn worker (largest of 4)", "tab:blue"),
        ("celery_max_mb", "Celery process (largest)", "tab:orange"),
    ):
        figures = rss.get(series.replace("_mb", "")) or {}
        ax.plot(
            x,
            [s[series] for s in samples],
            label=f"{label}: peak {figures.get('peak_mb')} MB, fitted rise "
            f"{figures.get('fitted_rise_mb')} MB",
            color=color,
        )
    ax.set_xlabel("checkouts answered")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(f"RSS over {rss.get('checkouts', 0):,} checkouts (target: fitted rise < 2 MB)")
    ax.legend(fontsize=9, loc="lower right")
    ax.grid(alpha=0.3)


def web_summary(data: dict) -> str:
    """The gunicorn each scenario ran: the sustained scenario starts its own (`web`)."""
    web = f"{data.get('config', {}).get('workers')} gunicorn sync workers"
    sustained = (data.get("scenarios", {}).get("sustained") or {}).get("web")
    if sustained:
        web += f" (sustained: {sustained['workers']} × {sustained['threads']} threads)"
    return web


def subtitle(data: dict) -> str:
    machine = data.get("machine", {})
    reference = data.get("reference") or {}
    parts = [
        f"make bench {data.get('started_at', '')}"
        + (" --quick" if data.get("quick") else "")
        + f" — {machine.get('cpus')} CPUs, {web_summary(data)}",
        f"load average {machine.get('loadavg_at_start')} → {machine.get('loadavg_at_end')}",
    ]
    if reference.get("pgbench_tps"):
        parts.append(
            f"pgbench {reference['pgbench_tps']:,.0f} TPS (before/after spread "
            f"{reference.get('pgbench_spread_pct')} %)"
        )
    title = "; ".join(parts)
    if data.get("noisy"):
        title = "NOISY RUN (pgbench moved > 10 %): every figure is noisy\n" + title
    return title


def plot(path: Path, data: dict) -> None:
    """Draw the run for a person: orders/s beside the peers, the pipeline, CPU, RSS (2 x 2).

    With the sustained scenario in the run, its row comes first (3 x 2,
    taller); a run of the headline's scenarios alone is that row alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = data.get("scenarios", {})
    sustained = "sustained" in scenarios
    alone = sustained and set(scenarios) <= set(HEADLINE_SCENARIOS)
    width, height = PLOT_SIZE_IN
    rows = 1 if alone else 3 if sustained else 2
    fig = plt.figure(figsize=(width, height * rows / 2), layout="constrained")
    grid = fig.add_gridspec(rows, 2)
    top = 0
    if sustained:
        headline.plot(fig, grid[0, :], scenarios["sustained"], scenarios.get("oscar_sustained"))
        top = 1
    if not alone:
        _plot_orders(fig.add_subplot(grid[top, 0]), scenarios)
        _plot_pipeline(fig, grid[top, 1], scenarios)
        _plot_cpu(fig.add_subplot(grid[top + 1, 0]), scenarios)
        _plot_rss(fig.add_subplot(grid[top + 1, 1]), scenarios.get("rss", {}))
    fig.suptitle(subtitle(data), fontsize=11, color="tab:red" if data.get("noisy") else "black")
    tmp = path.with_suffix(".png.tmp")
    fig.savefig(tmp, dpi=PLOT_DPI, format="png")
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


CPU_RATIO_TARGET = 5.0  # gunicorn CPU per keyed checkout ÷ per product read (issue 21)


def targets(data: dict) -> list[dict]:
    """Every target of the issues, with this run's value and met / not met / not measured.

    A target measured at several concurrency levels is met only if it is met at every level.
    Every row of a noisy run (`noisy(...)`) carries `noisy`: True.
    """
    scenarios = data.get("scenarios", {})
    rows: list[dict] = []

    is_noisy = bool(data.get("noisy"))

    def add(name: str, issue: str, value: str, goal: str, met: bool | None) -> None:
        rows.append(
            {
                "target": name,
                "issue": issue,
                "value": value,
                "goal": goal,
                "met": met,
                "noisy": is_noisy,
            }
        )

    def per_level(name: str, issue: str, result: dict, key: str, goal: str, test) -> None:
        levels = _levels(result.get("ratios", {}), key)
        if not levels:
            add(name, issue, "not measured", goal, None)
            return
        value = " / ".join(f"c{lvl.lstrip('c')}: {_fmt(v, 2)}" for lvl, v in levels)
        add(name, issue, value, goal, all(test(v) for _, v in levels))

    for row in headline.target_rows(scenarios):
        add(**row)
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
        "POST /orders/: replay ÷ first", "#21", checkout, "replay_vs_first", "≥ 5", lambda v: v >= 5
    )
    per_level(
        "POST /orders/: keyed ÷ unkeyed",
        "#21",
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
    burst = _find(relay, "end to end burst")
    burst_rps = burst["rps"] if burst else None
    add(
        "end to end burst: applied deliveries/s",
        "#21",
        _fmt(burst_rps, 0),
        "≥ 1,000",
        None if burst_rps is None else burst_rps >= 1000,
    )
    checkout_rps = max((r["rps"] for r in orders), default=None)
    per_order = burst_rps / checkout_rps if burst_rps is not None and checkout_rps else None
    add(
        "end to end burst ÷ the run's best checkout orders/s",
        "#21",
        "not measured"
        if per_order is None
        else f"{per_order:.1f}× ({burst_rps:,.0f} ÷ {checkout_rps:.1f})",
        "≥ 10×",
        None if per_order is None else per_order >= 10,
    )
    steady = relay.get("steady") or {}
    if "lag_p99_s" in steady:  # a run from before the half-burst phase
        steady = {"fixed": steady}
    for phase, label in (("fixed", "steady 300 deliveries/s"), ("half_burst", "steady ½ burst")):
        figures = steady.get(phase) or {}
        lag = figures.get("lag_p99_s")
        rate = figures.get("offered_events_per_s")
        add(
            f"{label}: lag p99 (s)",
            "#21",
            "not measured" if lag is None else f"{lag:,.2f} (at {rate:,.0f}/s)",
            "< 2",
            None if lag is None else lag < 2,
        )
        bounded = figures.get("bounded")
        add(
            f"{label}: lag bounded (p99 of the last window − first)",
            "#21",
            "not measured"
            if bounded is None
            else f"{figures['first_window_p99_s']:.2f} → {figures['last_window_p99_s']:.2f} s "
            f"over {figures['seconds']:.0f} s (slope {figures['lag_slope_s_per_s']:+.4f} s/s)",
            "rise ≤ 0.5 s",
            bounded,
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
        "#21",
        "not measured"
        if cpu_ratio is None
        else f"{cpu_ratio:.1f}× ({order_ms:.1f} ms at c{keyed['concurrency']} ÷ "
        f"{read_ms:.2f} ms at c{detail['concurrency']})",
        f"≤ {CPU_RATIO_TARGET:g}×",
        None if cpu_ratio is None else cpu_ratio <= CPU_RATIO_TARGET,
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
        if row.get("noisy"):
            shown += " (noisy)"
        lines.append(
            f"| {row['target']} | {row['issue']} | {row['value']} | {row['goal']} | {shown} |"
        )
    return "\n".join(lines)
