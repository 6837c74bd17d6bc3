"""Oscar's whole checkout at its sustained rate: the verdicts, the ratio, the headline rows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from bench import headline, oscar_peer
from bench.loadgen import OpenLoadResult
from bench.report import targets
from bench.run import parse_args
from bench.scenarios import discover, oscar_sustained
from bench.server import ROOT
from tests.bench.test_run import _bench_env, _existing_databases


def _load(latency_of, statuses=None) -> OpenLoadResult:
    samples = [
        (t / 4, latency_of(t / 4), (statuses or {}).get(t, 302)) for t in range(40)
    ]  # 4/s for 10 s
    return OpenLoadResult(
        rate=4, duration_s=10, samples=samples, errors=Counter(), late_starts=0, client_cpu_s=0
    )


def test_it_runs_right_after_the_headline_and_takes_its_own_rates():
    names = [s.name for s in discover()]
    assert names.index("oscar_sustained") == names.index("sustained") + 1
    args = parse_args(["--oscar-sustained-rates", "1,2,3"])
    assert args.oscar_sustained_rates == (1.0, 2.0, 3.0)


def test_the_latency_budget_is_per_request_of_the_checkout():
    requests = [10] * 40
    # 3 s for a ten-request checkout is within 10 x 500 ms; flat.
    calm = oscar_sustained.step_figures(
        rate=4, seconds=10, load=_load(lambda t: 3000.0), requests=requests
    )
    assert calm["verdict"]["kept_up"] is True
    assert calm["limits_ms"] == {"p99": 5000.0, "growth": 2500.0}
    assert calm["orders_per_s"] == 4.0 and calm["requests_per_checkout"] == 10

    # The same with a backlog: latency grows 1 s every second of the step.
    behind = oscar_sustained.step_figures(
        rate=4, seconds=10, load=_load(lambda t: 1000.0 + 1000 * t), requests=requests
    )
    assert behind["verdict"]["checkout_flat"] is False and behind["verdict"]["kept_up"] is False

    # An order refused (Oscar's redirect back to the basket) is not kept up either.
    refused = oscar_sustained.step_figures(
        rate=4, seconds=10, load=_load(lambda t: 3000.0, {7: 303}), requests=requests
    )
    assert refused["verdict"]["all_placed"] is False

    assert oscar_sustained.headline([calm, {**calm, "rate": 8.0}, behind]) == 8.0
    assert oscar_sustained.headline([behind]) is None


def _ours(rate):
    return {"steps": [{}], "sustained_orders_per_s": rate}


def _oscar(rate):
    return {"steps": [{}], "oscar_sustained_orders_per_s": rate}


def test_the_ratio_of_the_sustained_rates_is_a_headline_row():
    scenarios = {"sustained": _ours(60.0), "oscar_sustained": _oscar(20.0)}
    assert headline.ratio(scenarios) == 3.0

    rows = [row for row in targets({"scenarios": scenarios}) if row["issue"] == "#34"]

    assert [row["target"] for row in rows[:2]] == [headline.SUSTAINED_ROW, headline.RATIO_ROW]
    assert (rows[0]["value"], rows[0]["met"]) == ("60", False)
    assert (rows[1]["value"], rows[1]["met"]) == ("3.00 (60 ÷ 20 orders/s)", True)
    below = headline.target_rows({"sustained": _ours(20.0), "oscar_sustained": _oscar(10.0)})
    assert below[1]["met"] is False
    # Ours kept up no rate at all: the ratio is no better than zero.
    none = headline.target_rows({"sustained": _ours(None), "oscar_sustained": _oscar(10.0)})
    assert none[1]["met"] is False and none[1]["value"].startswith("—")
    alone = headline.target_rows({"sustained": _ours(60.0)})
    assert (alone[1]["value"], alone[1]["met"]) == ("not measured", None)
    assert headline.summary(scenarios)["ours_vs_oscar_sustained"] == 3.0
    printed = headline.text(None, {"steps": [], "oscar_sustained_orders_per_s": None})
    assert printed.splitlines()[0] == "SUSTAINED: not measured (not measured in this run)"
    assert printed.splitlines()[1].startswith("django-oscar 4.2 whole checkout: none")


@pytest.mark.tcp_servers  # make bench needs TCP PostgreSQL and Redis
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_oscar_ladder_places_orders_and_drops_its_database(tmp_path):
    if oscar_peer.venv_python() is None:
        pytest.skip(
            f"Oscar's environment {oscar_peer.VENV.relative_to(ROOT)} is not installed "
            "(python -m bench.run --scenario oscar_sustained makes it)"
        )
    env, base = _bench_env()

    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--no-reference"]
        + ["--scenario", "oscar_sustained", "--oscar-sustained-rates", "1,2"]
        + ["--sustained-seconds", "3", "--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    data = json.loads(result_file.read_text())
    result = data["scenarios"]["oscar_sustained"]
    assert result["rates"] == [1.0, 2.0] and 1 <= len(result["steps"]) <= 2
    step = result["steps"][0]
    assert step["sent"] == 3 and step["placed"] + sum(step["errors"].values()) <= 3
    assert step["requests_per_checkout"] > 10  # the browser's walk, not one POST
    assert set(step["cpu_s"]) == {"web", "postgres", "postgres-backends"}
    assert (
        data["headline"]["oscar_sustained_orders_per_s"] == result["oscar_sustained_orders_per_s"]
    )
    assert data["headline"]["ours_vs_oscar_sustained"] is None  # ours did not run
    assert "\nSUSTAINED: not measured" in proc.stdout and "django-oscar 4.2 whole" in proc.stdout
    assert _existing_databases(base) == set()
