"""The run command on embedded services: up, restarts, SIGKILL recovery, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests

from runner.processes import free_port, port_is_free, run_dir_for
from tests.runner.conftest import (
    ROOT,
    embedded_env,
    leftovers,
    sockets_under,
    start_run,
    wait_for,
    wait_up,
)

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def _children(run_dir) -> dict[str, int]:
    try:
        state = json.loads((run_dir / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}
    return {entry["name"]: entry["pid"] for entry in state["children"]}


def test_run_restarts_children_recovers_from_sigkill_and_leaves_nothing(short_tmp, marker):
    var = short_tmp / "var"
    run_dir = run_dir_for(var)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = embedded_env(marker=marker, var=var, PORT=str(port), WEB_CONCURRENCY="1")

    # 1. First start, as on a platform without the parent-death signal.
    first_log = short_tmp / "first.log"
    with open(first_log, "wb") as log:
        first = start_run({**env, "SHOP_NO_PDEATHSIG": "1"}, log)
    try:
        wait_up(base, first, first_log)
        assert "created 7 products and 3 users" in first_log.read_text()

        # A second run on the same data folder is refused; the first goes on.
        second_try = subprocess.run(
            [sys.executable, "-m", "runner"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert second_try.returncode == 1
        assert "already running" in second_try.stderr
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200

        # A crashed child is restarted.
        beat = _children(run_dir)["beat"]
        os.killpg(beat, signal.SIGKILL)
        restarted = wait_for(
            lambda: (pid := _children(run_dir).get("beat")) not in (None, beat) and pid,
            timeout=60,
            message="beat was not restarted",
        )
        assert psutil.Process(restarted).is_running()

        # SIGKILL of the supervisor: no chance to clean up, and here nothing
        # stops its children and servers either.
        first.kill()
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert len(leftovers(marker=marker, under=var)) > 5  # web, worker, beat, servers
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200

    # 2. The next start stops all that (children from the state file, servers
    # from their pid files) and reuses the data.
    second_log = short_tmp / "second.log"
    with open(second_log, "wb") as log:
        second = start_run(env, log)
    try:
        wait_up(base, second, second_log)
        output = second_log.read_text()
        assert "stopping web left by a killed run" in output
        assert "embedded postgres: stopping leftover server" in output
        assert "embedded redis: stopping leftover server" in output
        assert "created nothing new" in output
        # 3. SIGKILL again, now with the parent-death signal: everything stops.
        second.kill()
        second.wait()
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    wait_for(
        lambda: not leftovers(marker=marker, under=var),
        timeout=60,
        message="children outlived the killed supervisor",
    )

    # 4. A last start and Ctrl-C: a clean stop, nothing left.
    third_log = short_tmp / "third.log"
    with open(third_log, "wb") as log:
        third = start_run(env, log)
    try:
        wait_up(base, third, third_log)
        third.send_signal(signal.SIGINT)
        assert third.wait(timeout=90) == 0, third_log.read_text()[-3000:]
    finally:
        if third.poll() is None:
            third.kill()
            third.wait()
    assert leftovers(marker=marker, under=var) == []
    assert sockets_under(run_dir) == []
    assert port_is_free(port)


def test_run_refuses_a_taken_port_and_stops_the_embedded_servers(short_tmp, marker):
    var = short_tmp / "var"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = embedded_env(marker=marker, var=var, PORT=str(port))
        result = subprocess.run(
            [sys.executable, "-m", "runner"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert f"port {port} is in use" in result.stderr
    assert leftovers(marker=marker, under=var) == []
    assert sockets_under(run_dir_for(var)) == []


def test_a_killed_supervisor_leaves_no_celery_worker_running_a_task(short_tmp, marker):
    # A supervisor SIGKILLed while a Celery worker runs a long task. With
    # SIGTERM as the parent-death signal the worker begins a warm shutdown that
    # waits for the task (no time bound), so it outlives the supervisor still
    # holding its work. With SIGKILL the worker dies at once, its pool child with it (Celery's
    # own parent-death signal), and the task's message, acknowledged late, is
    # delivered again (docs/failure-model.md, "Dependency faults").
    from config.celery import app
    from tests.support.redis_server import redis_server
    from tests.support.servers import server_env

    var = short_tmp / "var"
    started = short_tmp / "task-started"
    log_path = short_tmp / "run.log"
    with redis_server() as broker:
        env = server_env(
            SHOP_PROGRAMS="worker",
            SHOP_SETUP="none",
            SHOP_VAR_DIR=str(var),
            SHOP_TEST_MARKER=marker,
            SIMULATOR_PORT=str(free_port()),
            CELERY_BROKER_URL=broker.url(1),
            WORKER_CONCURRENCY="1",
        )
        with open(log_path, "wb") as log:
            supervisor = start_run(env, log)
        try:
            wait_for(
                lambda: " ready." in log_path.read_text(errors="replace"),
                timeout=60,
                message=f"the worker never got ready:\n{log_path.read_text()[-3000:]}",
            )
            with app.connection_for_write(broker.url(1)) as conn:
                app.send_task(
                    "testsupport.linger", args=[str(started), 300], connection=conn, expires=60
                )
            wait_for(started.exists, timeout=30, message="the task never started")
            # the worker's main process and its pool child
            _kill_and_assert_no_child_left(supervisor, at_least=2)
        finally:
            if supervisor.poll() is None:
                supervisor.kill()
                supervisor.wait()


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
def test_a_killed_supervisor_leaves_no_gunicorn_worker_holding_a_request(short_tmp, marker):
    # A supervisor SIGKILLed while a web request waits on a hung (partitioned)
    # database. gunicorn's master dies of its parent-death signal; without more,
    # its worker notices, then finishes its request for up to the 10 s graceful
    # timeout and exits only with its threads, outliving the supervisor. Each
    # worker dies with its master instead (gunicorn.conf.py's post_fork).
    import threading

    from tests.support.servers import database_behind_proxy, server_env

    var = short_tmp / "var"
    port = free_port()
    log_path = short_tmp / "run.log"
    env = server_env(
        SHOP_PROGRAMS="web",
        SHOP_SETUP="none",
        SHOP_VAR_DIR=str(var),
        SHOP_TEST_MARKER=marker,
        SIMULATOR_PORT=str(free_port()),
        PORT=str(port),
        WEB_CONCURRENCY="1",
    )
    # Skipped on the embedded stage (a Unix socket); the main run makes it.
    proxy = database_behind_proxy(env)
    with open(log_path, "wb") as log:
        supervisor = start_run(env, log)
    try:
        wait_for(
            lambda: _answers(f"http://127.0.0.1:{port}/healthz"),
            timeout=60,
            message=f"the web never came up:\n{log_path.read_text()[-3000:]}",
        )
        proxy.drop()
        threading.Thread(
            target=_answers, args=(f"http://127.0.0.1:{port}/api/v1/products/", 30), daemon=True
        ).start()
        wait_for(lambda: proxy.open_connections > 0, timeout=10, message="no request hung")
        time.sleep(1.0)  # the request is in the worker, waiting on the database
        _kill_and_assert_no_child_left(supervisor, at_least=2)  # gunicorn's master and worker
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        proxy.heal()
        proxy.stop()


def _kill_and_assert_no_child_left(supervisor, *, at_least: int) -> None:
    """SIGKILL the supervisor; every process below it must be gone within 5 s."""
    family = psutil.Process(supervisor.pid).children(recursive=True)
    assert len(family) >= at_least
    supervisor.kill()
    supervisor.wait()
    _, alive = psutil.wait_procs(family, timeout=5)
    left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [" ".join(p.cmdline())[:100] for p in left]


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False
