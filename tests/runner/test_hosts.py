"""One host of several (docs/deployment.md): which programs and steps, and setup under a lock."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from types import SimpleNamespace
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from runner.setup_lock import setup_lock
from runner.supervisor import SETUP, Program, run_setup, select_programs, select_setup


def _names(programs: list[Program]) -> list[str]:
    return [program.name for program in programs]


def test_every_program_by_default_with_one_named_worker():
    programs = select_programs({})
    assert _names(programs) == ["web", "worker-1", "beat", "relay", "payments-simulator"]
    worker = programs[1].argv
    assert worker[worker.index("--hostname") + 1] == "worker-1-{host_name}@%h"
    assert worker[worker.index("--concurrency") + 1] == "{worker_concurrency}"


def test_shop_programs_and_shop_workers_choose_what_this_host_runs():
    env = {"SHOP_PROGRAMS": "web, worker,beat,relay", "SHOP_WORKERS": "3"}
    assert _names(select_programs(env)) == [
        "web", "worker-1", "worker-2", "worker-3", "beat", "relay",
    ]  # fmt: skip
    assert _names(select_programs({"SHOP_PROGRAMS": "worker-2", "SHOP_WORKERS": "2"})) == [
        "worker-2"
    ]
    hostnames = {
        p.argv[p.argv.index("--hostname") + 1] for p in select_programs({"SHOP_WORKERS": "2"})[1:3]
    }
    assert hostnames == {"worker-1-{host_name}@%h", "worker-2-{host_name}@%h"}


@pytest.mark.parametrize(
    "env",
    [{"SHOP_PROGRAMS": "web,wokrer"}, {"SHOP_WORKERS": "0"}, {"SHOP_WORKERS": "two"}],
)
def test_a_wrong_program_name_or_worker_count_stops_the_run(env):
    with pytest.raises(SystemExit):
        select_programs(env)


def test_shop_setup_chooses_the_steps_in_their_order():
    all_steps = [step.name for step in SETUP]
    assert _names(select_setup({})) == all_steps
    assert _names(select_setup({"SHOP_SETUP": "seed_demo,migrate"})) == ["migrate", "seed_demo"]
    assert _names(select_setup({"SHOP_SETUP": "none"})) == []
    assert _names(select_setup({"SHOP_SETUP": ""})) == []
    # SHOP_DEMO_DATA=0 keeps working, with or without SHOP_SETUP.
    assert "seed_demo" not in _names(select_setup({"SHOP_DEMO_DATA": "0"}))
    assert _names(select_setup({"SHOP_SETUP": "migrate,seed_demo", "SHOP_DEMO_DATA": "0"})) == [
        "migrate"
    ]
    with pytest.raises(SystemExit):
        select_setup({"SHOP_SETUP": "migrate,seed"})


def _url(dbname: str | None = None) -> str:
    """The session's DATABASE_URL, or the same server's database `dbname`."""
    url = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(url._replace(path=f"/{dbname}")) if dbname else url.geturl()


def test_the_setup_lock_lets_one_holder_in_at_a_time():
    url = _url()
    inside: list[str] = []
    overlap: list[bool] = []
    first_in = threading.Event()
    waited: list[str] = []

    def hold(name: str, *, after: threading.Event | None = None) -> None:
        if after is not None:
            after.wait(10)
        with setup_lock(url, say=waited.append):
            inside.append(name)
            overlap.append(len(inside) > 1)
            first_in.set()
            time.sleep(1.0)
            inside.remove(name)

    threads = [
        threading.Thread(target=hold, args=("a",)),
        threading.Thread(target=hold, args=("b",), kwargs={"after": first_in}),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert overlap == [False, False]
    assert waited and "another host is running setup" in waited[0]


@pytest.mark.slow
def test_two_hosts_starting_at_once_migrate_and_seed_one_database_once(tmp_path):
    """Two supervisors' setup (migrate, seed_demo) at the same moment on a fresh database."""
    dbname = f"hosts_setup_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(_url(), autocommit=True)
    admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        env = {
            **os.environ,
            "DATABASE_URL": _url(dbname),
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DB_POOL": "false",
            "SHOP_DEMO": "1",  # what the supervisor sets when it seeds
        }
        steps = [step for step in SETUP if step.name in ("migrate", "seed_demo")]
        ctx = {"python": sys.executable}
        signals = SimpleNamespace(received=None, check=lambda: None)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def host() -> None:
            barrier.wait()
            try:
                run_setup(steps, ctx, env, signals)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=host) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        assert errors == []
        with psycopg.connect(_url(dbname)) as conn:
            products = conn.execute("SELECT count(*) FROM inventory_product").fetchone()[0]
            users = conn.execute("SELECT count(*) FROM auth_user").fetchone()[0]
        assert (products, users) == (7, 3)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()


def test_demo_data_only_on_the_embedded_database_or_when_asked():
    from runner.supervisor import demo_wanted

    assert demo_wanted({}, embedded_database=True)
    assert not demo_wanted({}, embedded_database=False)  # a DATABASE_URL others may share
    assert demo_wanted({"SHOP_DEMO": "1"}, embedded_database=False)
    assert not demo_wanted({"SHOP_DEMO": "0"}, embedded_database=True)


def test_make_run_leaves_demo_data_to_the_run_command(tmp_path):
    """`make run` exports no SHOP_DEMO, so on a shared DATABASE_URL the supervisor seeds
    nothing unless SHOP_DEMO=1 is asked for (demo_wanted above decides)."""
    import subprocess
    from pathlib import Path

    python = tmp_path / "python"  # stands in for the venv's: prints what the recipe passes
    python.write_text('#!/bin/sh\necho "SHOP_DEMO=${SHOP_DEMO-unset} $*"\n')
    python.chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    # A stamp newer than the requirements files, so make installs nothing (a checkout's
    # Makefile may be older than them: STAMP=Makefile then ran the venv's pip).
    stamp = tmp_path / "installed"
    stamp.touch()

    def run(**extra: str) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("SHOP_DEMO", "MAKEFLAGS")}
        argv = ["make", "-s", "run", f"BIN={tmp_path}", f"STAMP={stamp}"]
        done = subprocess.run(
            argv, cwd=root, env={**env, **extra}, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "SHOP_DEMO=unset -m runner"
    assert run(SHOP_DEMO="1") == "SHOP_DEMO=1 -m runner"
