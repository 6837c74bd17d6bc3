"""The shop's background processes as the bench starts them: spawn, stop, the whole pipeline.

`start_pipeline` starts what production runs beside gunicorn (the Procfile,
deploy/systemd; docs/deployment.md, "Production processes"): one Celery
worker per queue of `QUEUES` (`--app config.celery:app worker --queues Q`,
Celery's own concurrency: a prefork child per CPU), the outbox relay
(`manage.py relay_outbox`) and beat. Only the log level (warning) and three
switches that keep an idle worker from chattering on the broker (gossip,
mingle, heartbeat) differ. Each runs in its own session, so `stop` ends the
process and its children together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from bench.server import ROOT

# The Procfile's workers, one per queue (docs/celery.md, "Queues").
QUEUES = ("checkout", "events", "compensation", "reports", "maintenance")
QUIET = ["--loglevel", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"]


def spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    """Start `argv` in its own session from the repository's root, output to `log`.

    Its database sessions carry the log's name as their `application_name`
    (libpq's PGAPPNAME), so `pg_stat_activity` tells the processes apart.
    """
    out = open(log, "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**env, "PGAPPNAME": log.stem},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process's session, SIGKILL it after 20 s; idempotent."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def worker_argv(queue: str, *, concurrency: int | None = None) -> list[str]:
    """A Celery worker of `queue` as the Procfile starts it (a unique node name)."""
    return (
        [sys.executable, "-m", "celery", "--app", "config.celery:app", "worker"]
        + ["--queues", queue, "--hostname", f"{queue}-{uuid.uuid4().hex[:6]}@%h"]
        + (["--concurrency", str(concurrency)] if concurrency else [])
        + QUIET
    )


def start_pipeline(
    stack: contextlib.ExitStack, env: dict, workdir: Path
) -> dict[str, subprocess.Popen]:
    """Start a worker per queue, the relay and beat on `stack`; return name -> Popen."""
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, argv: list[str]) -> None:
        procs[name] = spawn(argv, env, workdir / f"{name}.log")
        stack.callback(stop, procs[name])

    for queue in QUEUES:
        start(f"worker-{queue}", worker_argv(queue))
    start("relay", [sys.executable, "manage.py", "relay_outbox"])
    start(
        "beat",
        [sys.executable, "-m", "celery", "--app", "config.celery:app", "beat"]
        + ["--loglevel", "warning", "--schedule", str(workdir / "beat-schedule")],
    )
    return procs


def exited(procs: dict[str, subprocess.Popen]) -> list[str]:
    """The names of the processes that are no longer running, with their exit codes."""
    return [
        f"{name} ({proc.returncode})" for name, proc in procs.items() if proc.poll() is not None
    ]
