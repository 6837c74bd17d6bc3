"""Ratios to the reference, and the plot, from made-up figures."""

from __future__ import annotations

from bench import report


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


def test_plot_writes_a_png(tmp_path):
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
