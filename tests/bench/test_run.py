"""`python -m bench.run`: scenario discovery, options, a real --quick run, Ctrl-C cleanup."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from bench.dbs import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, PgTarget, RedisTarget
from bench.run import Bench, parse_args
from bench.scenarios import discover
from bench.server import ROOT


def test_discovers_the_catalog_scenario_with_its_interface():
    scenarios = {s.name: s for s in discover()}

    catalog = scenarios["catalog_reads"]
    assert catalog.description
    assert callable(catalog.module.run)
    assert [s.name for s in discover()][0] == "catalog_reads"  # ORDER 10 runs first


def test_quick_shortens_the_runs_and_explicit_values_win():
    quick = parse_args(["--quick"])
    assert (quick.duration, quick.warmup, quick.workers) == (2.0, 0.5, 4)
    full = parse_args(["--duration", "5", "--scenario", "catalog_reads"])
    assert (full.duration, full.warmup, full.scenario) == (5.0, 1.0, ["catalog_reads"])


def _bench_env() -> tuple[dict, PgTarget]:
    """Return an environment whose bench databases are this test's own, and their base."""
    base = PgTarget.from_url(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
    base = base.sibling(f"t{uuid.uuid4().hex[:6]}")
    env = {**os.environ, "DATABASE_URL": base.url}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env, base


def _existing_databases(base: PgTarget) -> set[str]:
    with psycopg.connect(**base.maintenance_conninfo()) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [base.dbname + "%"]
        ).fetchall()
    return {row[0] for row in rows}


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _needs_tcp_servers_and_tools():
    """Skip where make bench cannot run: reference tools missing or servers not on TCP."""
    missing = [tool for tool in ("pgbench", "redis-benchmark") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    try:
        PgTarget.from_url(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
        RedisTarget.from_url(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL)
    except ValueError as exc:
        pytest.skip(str(exc))


@pytest.mark.tcp_servers  # make bench needs TCP PostgreSQL and Redis
@pytest.mark.slow
def test_quick_run_writes_results_and_leaves_nothing_behind(tmp_path):
    _needs_tcp_servers_and_tools()
    env, base = _bench_env()

    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--duration", "1"]
        + ["--scenario", "catalog_reads", "--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result_file] = tmp_path.glob("*-quick.json")
    assert result_file.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(result_file.read_text())
    assert data["reference"]["pgbench_tps"] > 0
    assert data["reference"]["redis_ops_per_s"] > 0
    runs = data["scenarios"]["catalog_reads"]["runs"]
    assert {run["label"] for run in runs} == {"list", "detail"}
    for run in runs:
        assert run["rps"] > 0 and run["errors"] == {} and run["unexpected"] == 0
        assert run["rps_per_pgbench_tps"] == pytest.approx(
            run["rps"] / data["reference"]["pgbench_tps"], abs=1e-4
        )
    port = int(re.search(r"listening on http://127.0.0.1:(\d+)", proc.stdout).group(1))
    assert _refuses(port)
    assert _existing_databases(base) == set()


@pytest.mark.tcp_servers  # make bench needs TCP PostgreSQL and Redis
@pytest.mark.slow
def test_ctrl_c_stops_gunicorn_and_drops_the_databases(tmp_path):
    _needs_tcp_servers_and_tools()
    env, base = _bench_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", "--quick", "--no-reference", "--duration", "60"]
        + ["--scenario", "catalog_reads", "--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C must reach it even from a background run that ignores SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        port = None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            found = re.search(r"listening on http://127.0.0.1:(\d+)", line)
            port = port or (int(found.group(1)) if found else None)
            if "scenario catalog_reads" in line or time.monotonic() > deadline:
                break
        assert port is not None, "gunicorn never started"
        assert not _refuses(port)  # under load right now

        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 130, rest
    assert "interrupted" in rest
    assert _refuses(port)
    assert _existing_databases(base) == set()
    assert list(tmp_path.glob("*.json")) == []


def test_urls_without_a_host_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="TCP PostgreSQL"):
        PgTarget.from_url("postgres://postgres@/shop?host=/tmp/pg")
    with pytest.raises(ValueError, match="TCP Redis"):
        RedisTarget.from_url("unix:///tmp/redis.sock")
    assert RedisTarget.from_url("redis://127.0.0.1:6380/7") == RedisTarget("127.0.0.1", 6380, 7, "")


def test_gunicorn_gets_the_callers_environment_not_the_harness_settings(monkeypatch):
    monkeypatch.delenv("DB_POOL", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/shop_x")
    bench = Bench(parse_args([]), [])
    # What prepare_database sets for the harness process itself.
    monkeypatch.setenv("DB_POOL", "false")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "bench.settings")

    env = bench.gunicorn_env()

    assert "DB_POOL" not in env  # the shop's default: pooled connections
    assert env["DJANGO_SETTINGS_MODULE"] == "bench.gunicorn_settings"
    assert env["DATABASE_URL"].endswith("/shop_x_bench")
