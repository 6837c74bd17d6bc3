"""The headline of `make bench`: the sustained rate, Oscar's beside it, their ratio.

`text` is what a run prints first (bench/run.py) and `plot` the first row of
its plot (bench/report.py): orders/s offered against checkout latency and
against every consumer's lag (bench/scenarios/sustained.py), with Oscar's
checkout on the same axis of rates (bench/scenarios/oscar_sustained.py).
`target_rows` are the first rows of the targets table: the sustained rate
(issue 34, ≥ SUSTAINED_TARGET) and ours ÷ Oscar at the sustained rate
(≥ OSCAR_RATIO_TARGET).
"""

from __future__ import annotations

SUSTAINED_TARGET = 80.0  # orders/s with every consumer keeping up (issue 34)
OSCAR_RATIO_TARGET = 2.5  # ours ÷ django-oscar, each at its own sustained rate (issue 34)
SUSTAINED_ROW = "sustained orders/s, every consumer keeping up (whole shop)"
RATIO_ROW = "ours ÷ django-oscar whole checkout, each at its sustained rate"


def not_measured(ax, title: str, why: str) -> None:
    """An empty panel that says why it is empty."""
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=12, wrap=True, color="dimgray")
    ax.set_xticks([])
    ax.set_yticks([])


def error_of(result: dict | None) -> str:
    """Why a scenario has no figures: its error, or that it did not run."""
    error = (result or {}).get("error")
    return f"not measured: {error[:90]}" if error else "not measured in this run"


def rate_of(result: dict | None, key: str) -> tuple[bool, float | None]:
    """(measured, the sustained rate) of a sustained scenario's result under `key`."""
    if not result or "steps" not in result:
        return False, None
    return True, result.get(key)


def ratio(scenarios: dict) -> float | None:
    """Ours ÷ Oscar, each at its own sustained rate; None unless both kept up a rate."""
    _, ours = rate_of(scenarios.get("sustained"), "sustained_orders_per_s")
    _, oscar = rate_of(scenarios.get("oscar_sustained"), "oscar_sustained_orders_per_s")
    return round(ours / oscar, 2) if ours and oscar else None


def summary(scenarios: dict) -> dict:
    """The headline's figures, the first key of the results file."""
    _, ours = rate_of(scenarios.get("sustained"), "sustained_orders_per_s")
    _, oscar = rate_of(scenarios.get("oscar_sustained"), "oscar_sustained_orders_per_s")
    return {
        "sustained_orders_per_s": ours,
        "oscar_sustained_orders_per_s": oscar,
        "ours_vs_oscar_sustained": ratio(scenarios),
        "targets": {
            "sustained_orders_per_s": SUSTAINED_TARGET,
            "ours_vs_oscar": OSCAR_RATIO_TARGET,
        },
    }


def _oscar_lines(result: dict) -> list[str]:
    measured, rate = rate_of(result, "oscar_sustained_orders_per_s")
    if not measured:
        return [f"django-oscar: not measured ({error_of(result)})"]
    lines = [
        f"django-oscar 4.2 whole checkout: {'none' if rate is None else f'{rate:g}'} orders/s "
        "kept up (every order placed; p99 and growth within the same budget per request)"
    ]
    for step in result["steps"]:
        lat = step["checkout_ms"]
        lines.append(
            f"  {step['rate']:>6g}/s: {step['orders_per_s']} orders/s "
            f"({step['requests_per_checkout']} requests each), checkout p50 {lat['p50']} / p99 "
            f"{lat['p99']} ms (growth {lat['growth']} ms; limits {step['limits_ms']}): "
            + ("kept up" if step["verdict"]["kept_up"] else "NOT kept up")
        )
    return lines


def text(result: dict | None, oscar: dict | None = None) -> str:
    """The headline and its steps (and Oscar's, and the ratio), as the run prints it first."""
    if result is None or "steps" not in result:
        lines = [f"SUSTAINED: not measured ({error_of(result)})"]
        return "\n".join(lines + (_oscar_lines(oscar) if oscar is not None else []))
    rate = result.get("sustained_orders_per_s")
    crit = result.get("criteria", {})
    lines = [
        f"SUSTAINED: {'none' if rate is None else f'{rate:g}'} orders/s on this machine with "
        f"every consumer keeping up (checkout p99 < {crit.get('checkout_p99_ms', 0):g} ms, "
        f"lag p99 < {crit.get('lag_p99_s', 0):g} s, neither growing over a "
        f"{result.get('step_seconds', 0):g} s step; target ≥ {SUSTAINED_TARGET:g})",
    ]
    for step in result["steps"]:
        lat = step["checkout_ms"]
        worst = max(
            step["lag_s"].items(), key=lambda item: item[1]["p99"] or 0.0, default=(None, None)
        )
        lag = (
            "no effects"
            if worst[0] is None
            else f"worst lag {worst[0]} p50 {worst[1]['p50']} / p99 {worst[1]['p99']} s "
            f"(growth {worst[1]['growth']} s)"
        )
        lines.append(
            f"  {step['rate']:>6g}/s: {step['orders_per_s']} orders/s, checkout p50 "
            f"{lat['p50']} / p99 {lat['p99']} ms (growth {lat['growth']} ms), {lag}, CPU "
            f"{step.get('cpu_ms_per_order_total')} ms per order: "
            + ("kept up" if step["verdict"]["kept_up"] else "NOT kept up")
        )
    if oscar is not None:
        lines += _oscar_lines(oscar)
        both = ratio({"sustained": result, "oscar_sustained": oscar})
        lines.append(
            f"ours ÷ django-oscar at the sustained rate: {'—' if both is None else both} "
            f"(target ≥ {OSCAR_RATIO_TARGET:g})"
        )
    return "\n".join(lines)


def target_rows(scenarios: dict) -> list[dict]:
    """The headline's rows of the targets table (name, issue, value, goal, met)."""
    measured, rate = rate_of(scenarios.get("sustained"), "sustained_orders_per_s")
    rows = [
        {
            "name": SUSTAINED_ROW,
            "issue": "#34",
            "value": ("none" if rate is None else f"{rate:g}") if measured else "not measured",
            "goal": f"≥ {SUSTAINED_TARGET:g}",
            "met": (rate is not None and rate >= SUSTAINED_TARGET) if measured else None,
        }
    ]
    oscar_measured, oscar = rate_of(
        scenarios.get("oscar_sustained"), "oscar_sustained_orders_per_s"
    )
    both = ratio(scenarios)
    if measured and oscar_measured:
        shown = " ÷ ".join("none" if r is None else f"{r:g}" for r in (rate, oscar))
        value = f"{'—' if both is None else f'{both:.2f}'} ({shown} orders/s)"
        if both is not None:
            met = both >= OSCAR_RATIO_TARGET
        else:  # one side kept up no rate: ours alone did is met, Oscar alone did is not
            met = None if rate is None and oscar is None else oscar is None
    else:
        value, met = "not measured", None
    rows.append(
        {
            "name": RATIO_ROW,
            "issue": "#34",
            "value": value,
            "goal": f"≥ {OSCAR_RATIO_TARGET:g}",
            "met": met,
        }
    )
    return rows


def plot(fig, cell, result: dict, oscar: dict | None = None) -> None:
    """Orders/s offered against checkout latency (left) and each consumer's lag (right).

    Oscar's whole checkout goes on the left as its p99 per request of the
    checkout (the walk's p99 ÷ the requests it took), beside our one request.
    """
    steps = result.get("steps") or []
    if not steps:
        not_measured(fig.add_subplot(cell), "Sustained: the whole shop", error_of(result))
        return
    left, right = cell.subgridspec(1, 2).subplots()
    rates = [s["rate"] for s in steps]
    crit = result.get("criteria", {})
    for key, style in (("p50", "o-"), ("p99", "s-"), ("last_window_p99", "^:")):
        left.plot(rates, [s["checkout_ms"][key] for s in steps], style, label=f"ours {key}")
    oscar_steps = (oscar or {}).get("steps") or []
    if oscar_steps:
        left.plot(
            [s["rate"] for s in oscar_steps],
            [
                s["checkout_ms"]["p99"] / (s["requests_per_checkout"] or 1)
                if s["checkout_ms"]["p99"] is not None
                else None
                for s in oscar_steps
            ],
            "d--",
            color="tab:purple",
            label="django-oscar p99 per request",
        )
    left.axhline(crit.get("checkout_p99_ms", 500), color="tab:red", linestyle="--")
    highest = max((s["checkout_ms"]["p99"] or 0) for s in steps)
    if highest > 10 * crit.get("checkout_p99_ms", 500):
        left.set_yscale("log")
    left.set_xlabel("orders/s offered (open loop)")
    left.set_ylabel("checkout latency from due time (ms)")
    both = ratio({"sustained": result, "oscar_sustained": oscar})
    left.set_title(
        "Sustained: checkout latency"
        + (f" (ours ÷ django-oscar at the sustained rate: {both:g})" if both else "")
    )
    consumers = sorted({name for s in steps for name in s["lag_s"]})
    for name in consumers:
        right.plot(
            rates, [s["lag_s"].get(name, {}).get("p99") for s in steps], "o-", label=f"{name} p99"
        )
    right.axhline(crit.get("lag_p99_s", 2), color="tab:red", linestyle="--", label="target")
    right.set_xlabel("orders/s offered (open loop)")
    right.set_ylabel("lag, outbox row written → effect committed (s)")
    sustained = result.get("sustained_orders_per_s")
    right.set_title(f"Sustained: {sustained if sustained is not None else 'none'} orders/s kept up")
    for ax in (left, right):
        if sustained is not None:
            ax.axvline(sustained, color="tab:green", linestyle=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="upper left")
