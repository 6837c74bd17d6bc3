"""Ratios to the reference, and the plot, from made-up figures."""

from __future__ import annotations

import pytest

from bench import report
from bench.scenarios import checkout as checkout_scenario


def _reference(tps: float, ops: float) -> dict:
    return {
        "pgbench": {"tps": tps, "latency_avg_ms": 3.6},
        "redis": {"ops_per_s": ops, "per_command": {"get": ops}},
    }


def _run(label: str, rps: float) -> dict:
    return {
        "label": label,
        "concurrency": 4,
        "rps": rps,
        "latency_ms": {"p50": 4.0, "p90": 6.0, "p99": 9.0, "max": 12.0, "mean": 4.5},
    }


def test_reference_is_the_mean_of_before_and_after_with_its_spread():
    summary = report.reference_summary(_reference(2000, 50000), _reference(2200, 60000))

    assert summary["pgbench_tps"] == 2100
    assert summary["pgbench_spread_pct"] == round(100 * 200 / 2100, 1)
    assert summary["redis_ops_per_s"] == 55000
    assert len(summary["runs"]) == 2
    assert report.reference_summary(None, None) is None
    assert report.reference_summary(_reference(2000, 50000), None)["pgbench_spread_pct"] == 0


def test_each_run_gets_ratios_and_missing_reference_gives_none():
    scenarios = {"catalog_reads": {"runs": [_run("list", 550.0)]}, "broken": {"error": "x"}}

    report.add_ratios(scenarios, {"pgbench_tps": 2200.0, "redis_ops_per_s": 55000.0})
    run = scenarios["catalog_reads"]["runs"][0]
    assert run["rps_per_pgbench_tps"] == 0.25
    assert run["rps_per_redis_ops"] == 0.01

    report.add_ratios(scenarios, None)
    assert run["rps_per_pgbench_tps"] is None


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_plot_of_a_published_run_is_one_screen_of_four_panels(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the tooling lock: make tools")
    import json

    from bench.server import ROOT

    data = json.loads((ROOT / "bench/results/20261201T123217Z.json").read_text())
    data["noisy"] = report.noisy(data["reference"])
    data["scenarios"]["relay"] = _relay(1200.0, 0.4, 1.5, 1.6)

    report.plot(tmp_path / "r.png", data)

    # 2 x 2 panels at 1,600 x 1,200 px: a screen shows it whole (the old strip was 5,700 wide).
    assert _png_size(tmp_path / "r.png") == (1600, 1200)
    assert list(tmp_path.iterdir()) == [tmp_path / "r.png"]


def test_orders_by_level_stand_beside_the_peer_and_oscar_when_measured():
    scenarios = {
        "checkout": {"runs": [_run("order", 57.7), _run("unkeyed", 60.0), _run("replay", 400.0)]},
        "peer": {"runs": [_run("ours", 56.0), _run("peer", 54.0)]},
    }
    assert set(report.orders_series(scenarios)) == {
        "ours, keyed",
        "ours, unkeyed",
        "ours (peer scenario)",
        "drf-idempotencykey peer",
    }

    scenarios["oscar"] = {"runs": [_run("place-order POST", 40.0)]}
    series = report.orders_series(scenarios)
    assert series["Oscar: place-order POST"] == {4: 40.0}
    assert series["ours, keyed"] == {4: 57.7}


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the tooling lock: make tools")
    reference = report.reference_summary(_reference(2000, 50000), None)
    scenarios = {"catalog_reads": {"runs": [_run("list", 500.0), _run("detail", 700.0)]}}
    report.add_ratios(scenarios, reference)
    data = {
        "started_at": "2026-01-01T00:00:00Z",
        "machine": {"cpus": 2},
        "config": {"workers": 4},
        "reference": reference,
        "scenarios": {**scenarios, "broken": {"error": "boom", "runs": []}},
    }

    report.plot(tmp_path / "r.png", data)

    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert list(tmp_path.iterdir()) == [tmp_path / "r.png"]


def _cpu_run(label: str, rps: float, requests: int, cpu_s: float, concurrency: int = 4) -> dict:
    return {
        **_run(label, rps),
        "concurrency": concurrency,
        "requests": requests,
        "server_cpu_s": cpu_s,
    }


def test_targets_are_read_from_the_run_met_not_met_or_not_measured():
    data = {
        "reference": {"pgbench_tps": 1000.0},
        "scenarios": {
            "catalog_reads": {"runs": [_cpu_run("detail", 500.0, 1000, 1.5)]},
            "checkout": {
                "runs": [_cpu_run("order", 90.0, 100, 1.2), _cpu_run("order", 70.0, 100, 1.3, 16)],
                "ratios": {
                    "4": {"replay_vs_first": 8.0, "keyed_vs_unkeyed": 0.95},
                    "16": {"replay_vs_first": 2.5, "keyed_vs_unkeyed": 0.91},
                },
            },
            "growth": {
                "ratios": {"full": {"orders_per_s_vs_fresh": 0.95, "cpu_per_order_vs_fresh": 1.02}}
            },
        },
    }
    rows = {row["target"]: row for row in report.targets(data)}
    # 90/1000 at c=4 meets 0.08, 70/1000 at c=16 does not: every level must meet it.
    assert rows["checkout orders/s ÷ pgbench TPS"]["met"] is False
    assert rows["POST /orders/: replay ÷ first"]["met"] is False
    assert rows["POST /orders/: keyed ÷ unkeyed"]["met"] is True
    # 12 ms per order ÷ 1.5 ms per read = 8×, above 7×.
    cpu = rows["gunicorn CPU per keyed checkout ÷ per product read"]
    assert cpu["met"] is False and cpu["value"].startswith("8.0×")
    assert rows["growth: full tables ÷ fresh (orders/s, CPU per order)"]["met"] is True
    assert rows["growth: purging tables ÷ fresh (orders/s, CPU per order)"]["met"] is None
    assert rows["relay publish events/s"]["met"] is None
    table = report.targets_table(report.targets(data))
    assert "**not met**" in table and "**met**" in table and "not measured" in table


def test_a_run_whose_pgbench_moved_more_than_10_percent_is_noisy_on_every_figure():
    steady = report.reference_summary(_reference(2000, 50000), _reference(2150, 50000))
    moved = report.reference_summary(_reference(2000, 50000), _reference(2300, 50000))

    assert report.noisy(steady) is False  # 7.2 %
    assert report.noisy(moved) is True  # 14.0 %
    assert report.noisy(report.reference_summary(_reference(2000, 50000), None)) is None
    assert report.noisy(None) is None
    rows = report.targets({"noisy": True, "scenarios": {}})
    assert rows and all(row["noisy"] for row in rows)
    table = report.targets_table(rows).splitlines()[2:]
    assert all(line.endswith("(noisy) |") for line in table)
    assert "(noisy)" not in report.targets_table(report.targets({"scenarios": {}}))


def _relay(burst: float, fixed_p99: float, half_p99: float, last_p99: float) -> dict:
    def phase(rate: float, p99: float, last: float) -> dict:
        return {
            "offered_events_per_s": rate,
            "lag_p99_s": p99,
            "first_window_p99_s": p99,
            "last_window_p99_s": last,
            "seconds": 300.0,
            "lag_slope_s_per_s": 0.0,
            "bounded": last - p99 <= 0.5,
        }

    return {
        "runs": [_run("end to end burst", burst)],
        "steady": {
            "fixed": phase(300, fixed_p99, fixed_p99),
            "half_burst": phase(burst / 2, half_p99, last_p99),
        },
    }


def test_pipeline_targets_burst_per_order_lag_at_both_rates_and_bounded():
    data = {
        "scenarios": {
            "checkout": {"runs": [_run("order", 90.0), _run("order", 110.0)]},
            "relay": _relay(1200.0, 0.4, 1.5, 1.6),
        }
    }
    rows = {row["target"]: row for row in report.targets(data)}

    assert rows["end to end burst: applied deliveries/s"]["met"] is True
    # 1,200 ÷ the best level's 110 orders/s = 10.9×.
    per_order = rows["end to end burst ÷ the run's best checkout orders/s"]
    assert per_order["met"] is True and per_order["value"].startswith("10.9×")
    assert rows["steady 300 deliveries/s: lag p99 (s)"]["met"] is True
    assert rows["steady ½ burst: lag p99 (s)"]["met"] is True
    assert rows["steady ½ burst: lag bounded (p99 of the last window − first)"]["met"] is True

    data["scenarios"]["relay"] = _relay(900.0, 0.4, 2.5, 9.0)
    rows = {row["target"]: row for row in report.targets(data)}
    assert rows["end to end burst: applied deliveries/s"]["met"] is False
    assert rows["end to end burst ÷ the run's best checkout orders/s"]["met"] is False
    assert rows["steady ½ burst: lag p99 (s)"]["met"] is False
    assert rows["steady ½ burst: lag bounded (p99 of the last window − first)"]["met"] is False


def test_cpu_per_checkout_target_is_five_product_reads():
    data = {
        "scenarios": {
            "catalog_reads": {"runs": [_cpu_run("detail", 500.0, 1000, 2.0)]},
            "checkout": {"runs": [_cpu_run("order", 90.0, 100, 1.0)]},
        }
    }
    # 10 ms per order ÷ 2 ms per read = 5×: met; 5.5× is not.
    cpu = {row["target"]: row for row in report.targets(data)}[
        "gunicorn CPU per keyed checkout ÷ per product read"
    ]
    assert cpu["met"] is True and cpu["goal"] == "≤ 5×"
    data["scenarios"]["checkout"]["runs"][0]["server_cpu_s"] = 1.1
    cpu = {row["target"]: row for row in report.targets(data)}[
        "gunicorn CPU per keyed checkout ÷ per product read"
    ]
    assert cpu["met"] is False


def test_the_capacity_model_adds_the_pipeline_share_of_an_order_to_the_checkout():
    order = _run("order", 50.0) | {"concurrency": 16, "requests": 500, "server_cpu_s": 10.0}
    order["cpu_s"] = {"postgres": 5.0}  # 20 ms web, 10 ms PostgreSQL per order
    slower = _run("order", 40.0) | {"concurrency": 4, "requests": 400, "server_cpu_s": 9.0}
    burst = _run("end to end burst", 500.0)
    burst["cpu_ms_per_delivery"] = {"worker": 2.0, "relay": 0.1, "postgres": 1.0}
    scenarios = {
        "checkout": {
            "capacity": checkout_scenario.capacity([order, slower]),
            "profile": {"sql_statements": 29.0},
        },
        "relay": {"runs": [burst], "fanout": 3},
    }

    model = report.capacity(scenarios, cores=2)

    assert model["checkout_level"] == 16  # the level with the most orders/s
    per_order = model["per_order_ms"]
    assert (per_order["web_ms"], per_order["worker_ms"], per_order["relay_ms"]) == (20.0, 6.0, 0.3)
    assert per_order["postgres_ms"] == 13.0  # 10 in the checkout + 3 x 1 per delivery
    assert per_order["total_ms"] == 39.3
    sustained = model["orders_per_s_sustained_by_all_cores"]
    assert sustained["web"] == 100.0 and sustained["postgres"] == round(2000 / 13, 1)
    assert model["saturates_first"] == "web"
    assert (model["statements_per_order"], model["round_trips_per_order"]) == (27, 37)
    assert "per order: web 20.00 ms" in report.capacity_text(model)
    assert report.capacity({}, cores=2) is None


def test_the_plots_subtitle_names_the_gunicorn_each_scenario_ran():
    data = {"machine": {"cpus": 2}, "config": {"workers": 4}, "scenarios": {}}
    assert "4 gunicorn sync workers;" in report.subtitle(data)
    data["scenarios"]["sustained"] = {"web": {"workers": 2, "threads": 8}}
    assert "4 gunicorn sync workers (sustained: 2 × 8 threads);" in report.subtitle(data)
