"""The chaos run's own PostgreSQL cluster, which the run may crash and hang (dev tooling).

The shared server on DATABASE_URL must never be crashed, so the run makes a
cluster of its own in RUN_DIR/postgres (runner/embedded/postgres.py: initdb,
the server as our child that dies with us, run as the `pgserver` user when we
are root), listening on a free loopback port; the hosts reach it through
their fault proxies. Durable settings (fsync and synchronous_commit on, as
docs/deployment.md asks of production), so a crash loses no acknowledged
commit and every 2xx answer can be checked for after the run.

- `crash()`: SIGKILL the postmaster and every backend at once (a server
  crash as the operating system sees it: no shutdown checkpoint), then start
  it again on the same data folder; the start replays the WAL (crash recovery).
- `hang(seconds)`: SIGSTOP the postmaster first (no new backend is forked),
  then every backend; after `seconds` SIGCONT the backends, then the postmaster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from runner.embedded.postgres import EmbeddedPostgres
from runner.processes import free_port, run_dir_for

DATABASE = "shop"


class ChaosPostgres:
    def __init__(self, run_dir: Path) -> None:
        self.port = free_port()
        data = run_dir / "postgres"
        # A short socket folder of its own (Unix socket paths are limited).
        self.server = EmbeddedPostgres(
            data_dir=data / "data",
            socket_dir=run_dir_for(data) / "pg",
            database=DATABASE,
            durable=True,
            log_file=run_dir / "postgres.log",
            tcp_port=self.port,
            # Two hosts of threaded web workers and prefork Celery children, each
            # process with a pool of up to 8, plus the checker: more than 100 at peak.
            settings={"max_connections": "300"},
        )
        self.host = "127.0.0.1"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"
        self.name = f"{DATABASE} on 127.0.0.1:{self.port} ({data})"
        self.crashes = 0
        self.recoveries: list[float] = []  # seconds from the kill to accepting connections

    def create(self) -> None:
        self.server.start()

    def _family(self) -> tuple[psutil.Process | None, list[psutil.Process]]:
        pid = self.server.pid
        if pid is None:
            return None, []
        try:
            postmaster = psutil.Process(pid)
            return postmaster, postmaster.children(recursive=True)
        except psutil.NoSuchProcess:
            return None, []

    def crash(self) -> float:
        """SIGKILL the whole server, start it again; return seconds until it accepted again."""
        started = time.monotonic()
        postmaster, backends = self._family()
        for proc in [p for p in (postmaster,) if p is not None] + backends:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs([p for p in (postmaster, *backends) if p is not None], timeout=10)
        self.crashes += 1
        self.server.restart(timeout=120)
        took = time.monotonic() - started
        self.recoveries.append(took)
        return took

    def pause(self) -> list[int]:
        """SIGSTOP the postmaster, then its backends; return the pids stopped."""
        postmaster, _ = self._family()
        if postmaster is None:
            return []
        stopped = [postmaster.pid]
        os.kill(postmaster.pid, signal.SIGSTOP)
        # The postmaster is stopped: no backend is forked after this listing.
        for proc in postmaster.children(recursive=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGSTOP)
                stopped.append(proc.pid)
        return stopped

    def resume(self, stopped: list[int]) -> None:
        """SIGCONT what pause() stopped: the backends first, the postmaster last."""
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def drop(self) -> None:
        """Stop the server (the data folder stays in the run folder)."""
        postmaster, backends = self._family()
        self.resume(([postmaster.pid] if postmaster else []) + [p.pid for p in backends])
        self.server.stop()
