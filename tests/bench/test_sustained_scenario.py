"""The sustained scenario: its verdicts, the open-loop generator, and a short real run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import headline as headline_of_run
from bench import processes
from bench.loadgen import OpenLoadResult, Request, run_open
from bench.run import parse_args
from bench.scenarios import discover, sustained
from bench.server import ROOT
from tests.bench.test_run import _bench_env, _existing_databases, _needs_tcp_servers_and_tools


def test_the_sustained_scenario_is_discovered_after_the_catalog_reads():
    names = [s.name for s in discover()]
    assert names[:2] == ["catalog_reads", "sustained"]


def test_rates_and_step_seconds_are_arguments():
    args = parse_args(["--sustained-rates", "5,10,20", "--sustained-seconds", "30"])
    assert (args.sustained_rates, args.sustained_seconds) == ((5.0, 10.0, 20.0), 30.0)
    assert parse_args([]).sustained_rates is None  # the scenario's own defaults
    for bad in ("20,10", "0,5", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--sustained-rates", bad])


def _load(samples) -> OpenLoadResult:
    from collections import Counter

    return OpenLoadResult(
        rate=10, duration_s=30, samples=samples, errors=Counter(), late_starts=0, client_cpu_s=0
    )


def _flat(value: float) -> list[tuple[float, float]]:
    return [(t / 10, value) for t in range(300)]


def test_a_step_is_kept_up_only_when_latency_and_every_lag_are_low_and_flat():
    quick = [(t, 40.0, 201) for t, _ in _flat(0)]
    kept = sustained.step_figures(
        rate=10, seconds=30, load=_load(quick), lags={"loyalty": _flat(0.3)}, missing=0
    )
    assert kept["verdict"]["kept_up"] is True
    assert kept["orders_per_s"] == 10.0 and kept["checkout_ms"]["p99"] == 40.0

    rising = [(t, 0.3 + t / 10) for t, _ in _flat(0)]  # +1 s of lag every 10 s
    growing = sustained.step_figures(
        rate=10,
        seconds=30,
        load=_load(quick),
        lags={"loyalty": _flat(0.3), "emails": rising},
        missing=0,
    )
    assert growing["verdict"]["lag_flat"] is False and growing["verdict"]["kept_up"] is False
    assert growing["lag_s"]["emails"]["growth"] > 1

    slow = [(t, 40.0 + 30 * t, 201) for t, _ in _flat(0)]
    late = sustained.step_figures(
        rate=10, seconds=30, load=_load(slow), lags={"loyalty": _flat(0.3)}, missing=0
    )
    assert late["verdict"]["checkout_p99"] is False and late["verdict"]["checkout_flat"] is False

    failed = sustained.step_figures(
        rate=10,
        seconds=30,
        load=_load(quick[:-1] + [(29.9, 40.0, None)]),
        lags={"loyalty": _flat(0.3)},
        missing=0,
    )
    assert failed["verdict"]["all_201"] is False

    assert sustained.headline([kept, {**kept, "rate": 20}, growing]) == 20
    assert sustained.headline([growing]) is None
    text = headline_of_run.text({"steps": [kept], "step_seconds": 30, "sustained_orders_per_s": 10})
    assert text.startswith("SUSTAINED: 10 orders/s") and "kept up" in text


class _Slow(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the handler's interface
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.05)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_open_loop_sends_at_its_rate_whatever_the_answers_take():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.perf_counter()
        result = run_open(
            f"http://127.0.0.1:{server.server_address[1]}",
            factory=lambda n: Request("POST", "/", {}, str(n).encode()),
            rate=40,
            duration=1.0,
            max_in_flight=8,
        )
        elapsed = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
    # 40 requests due over a second, each taking 50 ms: two in flight at a time, on time.
    assert len(result.samples) == 40 and result.statuses == {201: 40}
    assert [round(due, 3) for due, _, _ in result.samples[:3]] == [0.0, 0.025, 0.05]
    assert all(latency >= 50 for _, latency, _ in result.samples)
    assert elapsed < 2.5


@pytest.mark.tcp_servers  # make bench needs TCP PostgreSQL and Redis
@pytest.mark.slow
def test_a_short_sustained_run_reports_steps_lags_and_the_headline(tmp_path):
    _needs_tcp_servers_and_tools()
    env, base = _bench_env()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--no-reference"]
        + ["--scenario", "sustained", "--sustained-rates", "2,4", "--sustained-seconds", "4"]
        + ["--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "\nSUSTAINED: " in proc.stdout
    # The headline comes first: in the summary and as the results file's first key.
    summary = proc.stdout[proc.stdout.index("\nSUSTAINED: ") :]
    assert "Targets" in summary and "scenario sustained" not in summary
    [result_file] = tmp_path.glob("*-quick.json")
    data = json.loads(result_file.read_text())
    assert next(iter(data)) == "headline"
    result = data["scenarios"]["sustained"]
    assert data["headline"]["sustained_orders_per_s"] == result["sustained_orders_per_s"]
    assert result["rates"] == [2.0, 4.0] and result["step_seconds"] == 4.0
    assert 1 <= len(result["steps"]) <= 2
    step = result["steps"][0]
    assert step["sent"] == 8 and step["rate"] == 2.0
    assert set(step["checkout_ms"]) >= {"p50", "p99", "first_window_p99", "last_window_p99"}
    # Every consumer of order.confirmed, and the mail sender, measured from the database.
    assert {"loyalty", "purchase_history", "emails", "mail sender"} <= set(step["lag_s"])
    for figures in step["lag_s"].values():
        assert figures["count"] >= 1 and figures["p99"] is not None
    assert set(step["verdict"]) >= {"kept_up", "lag_p99", "lag_flat", "checkout_p99"}
    workers = {f"worker-{queue}" for queue in processes.QUEUES}
    assert set(step["cpu_s"]) >= {"web", "relay", "beat", "postgres"} | workers
    assert step["orders_committed"] >= step["answered_201"]
    headline = result["sustained_orders_per_s"]
    assert headline is None or headline in result["rates"]
    assert _existing_databases(base) == set()


def test_the_pipeline_runs_every_queue_of_the_procfile_as_it_does():
    procfile = (ROOT / "Procfile").read_text()
    queues = {
        line.split("--queues ")[1].split()[0]
        for line in procfile.splitlines()
        if "--queues" in line
    }
    assert set(processes.QUEUES) == queues
    argv = processes.worker_argv("events")
    assert argv[argv.index("--app") + 1] == "config.celery:app"
    assert argv[argv.index("--queues") + 1] == "events"
    assert "--concurrency" not in argv  # Celery's own, as in production


def test_each_spawned_process_names_its_database_sessions_after_its_log(tmp_path):
    proc = processes.spawn(
        [sys.executable, "-c", "import os; print(os.environ['PGAPPNAME'])"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "worker-events.log",
    )
    assert proc.wait(30) == 0
    assert (tmp_path / "worker-events.log").read_text().strip() == "worker-events"
