"""The django-oscar peer (bench/scenarios/oscar.py): found, kept apart, a real --quick run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import oscar_peer
from bench.report import targets
from bench.scenarios import discover
from bench.scenarios import oscar as scenario
from bench.server import ROOT
from tests.bench.test_run import _bench_env, _existing_databases


def test_the_oscar_scenario_is_discovered_after_the_other_peer():
    scenarios = {s.name: s for s in discover()}

    assert scenarios["oscar"].module is scenario
    assert scenarios["oscar"].description
    assert scenarios["oscar"].order > scenarios["peer"].order


def test_oscar_is_installed_only_in_its_own_environment():
    pins = (ROOT / "bench" / "oscar" / "requirements.txt").read_text()
    assert "django-oscar==4.2." in pins
    for shop_requirements in ("requirements.txt", "requirements/dev.txt", "requirements/bench.txt"):
        assert "oscar" not in (ROOT / shop_requirements).read_text().lower()
    assert oscar_peer.VENV.relative_to(ROOT).parts[0] == "var"  # git-ignored, not .venv


def test_the_scenario_rows_join_the_run_targets():
    ratios = {
        "4": {"ours_vs_oscar_place_order": 2.5, "ours_vs_oscar_checkout": 9.0},
        "16": {"ours_vs_oscar_place_order": 1.9, "ours_vs_oscar_checkout": 8.5},
    }
    hot = {"oversold_units": 3, "num_in_stock": 100, "placed": 103, "attempts": 150}
    data = {"scenarios": {"oscar": {"target_rows": scenario.target_rows(ratios, hot)}}}

    rows = {row["target"]: row for row in targets(data) if row["issue"] == "#21"}

    post = rows["ours ÷ django-oscar place-order POST, orders/s"]
    assert (post["value"], post["met"]) == ("c4: 2.50 / c16: 1.90", False)  # every level must meet
    assert rows["ours ÷ django-oscar whole checkout, orders/s"]["met"] is True
    oversold = rows["django-oscar oversold units (hot product, observation)"]
    assert oversold["value"].startswith("3 of 100") and oversold["met"] is None


def test_the_rows_with_orders_preloaded_in_both_stand_beside_the_fresh_ones():
    fresh = {"4": {"ours_vs_oscar_place_order": 2.5, "ours_vs_oscar_checkout": 9.0}}
    full = {"4": {"ours_vs_oscar_place_order": 1.5, "ours_vs_oscar_checkout": 8.5}}
    hot = {"oversold_units": 0, "num_in_stock": 100, "placed": 100, "attempts": 150}

    rows = {row["target"]: row for row in scenario.target_rows(fresh, hot, full, 100_000)}

    assert rows["ours ÷ django-oscar place-order POST, orders/s"]["met"] is True
    in_both = rows[
        "ours ÷ django-oscar place-order POST, orders/s, 100,000 orders in both databases"
    ]
    assert (in_both["value"], in_both["met"]) == ("c4: 1.50", False)
    assert rows["ours ÷ django-oscar whole checkout, orders/s, 100,000 orders in both databases"][
        "met"
    ]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_run_measures_oscar_beside_ours_and_drops_its_database(tmp_path):
    if oscar_peer.venv_python() is None:
        pytest.skip(
            f"Oscar's environment {oscar_peer.VENV.relative_to(ROOT)} is not installed "
            "(python -m bench.run --scenario oscar makes it from bench/oscar/requirements.txt)"
        )
    env, base = _bench_env()

    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--no-reference", "--duration", "2"]
        + ["--scenario", "oscar", "--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    result = json.loads(result_file.read_text())["scenarios"]["oscar"]
    labels = {run["label"] for run in result["runs"]}
    base_labels = {"ours", "oscar checkout", "oscar place order"}
    assert labels == base_labels | {label + scenario.FULL_TAG for label in base_labels}
    for run in result["runs"]:
        assert run["rps"] > 0 and run["errors"] == {} and run["unexpected"] == 0
    whole = next(run for run in result["runs"] if run["label"] == "oscar checkout")
    assert whole["http_requests_per_order"] > 10  # the browser's walk, not one POST
    # The second round ran with the preloaded orders in both databases, Oscar's read by its ORM.
    full = result["full"]
    assert full["orders_preloaded_in_each"] == scenario.QUICK_FULL_ORDERS
    assert full["oscar"]["orm_preloaded_orders"] == scenario.QUICK_FULL_ORDERS
    assert full["oscar"]["orm_last_copy"]["lines"] >= 1
    assert full["ours_rows_added"]["orders_order"] == scenario.QUICK_FULL_ORDERS
    [full_figures] = result["ratios_full"].values()
    assert full_figures["ours_vs_oscar_place_order"] > 0
    [figures] = result["ratios"].values()
    assert figures["ours_vs_oscar_place_order"] > 0
    assert figures["ours_vs_oscar_checkout"] > figures["ours_vs_oscar_place_order"]
    assert (
        figures["oscar_checkout_cpu_ms_per_order"] > figures["oscar_place_order_cpu_ms_per_order"]
    )
    hot = result["hot"]
    assert hot["placed"] + hot["refused"] == hot["attempts"]
    assert hot["num_allocated"] == hot["units_ordered"] == hot["placed"]
    assert _existing_databases(base) == set()
