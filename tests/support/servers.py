"""Test helpers: real server processes on the test database, and a loopback stub service.

Used by the idempotency, checkout and payments tests (fixtures in
tests/conftest.py wrap them). Everything binds to a port chosen at runtime.

- `server_env(**extra)`: the environment for a child process that must use the
  TEST database pytest-django created (its name comes from the live
  connection), the same Redis, test settings (which install the test-only routes).
- `gunicorn_server(env=..., workers=N)`: a real gunicorn on a free port
  (the listening socket is opened here and handed over as `fd://`, so no
  port race); waits for /healthz; stops the whole process group afterwards.
- `database_behind_proxy(env)`: a fault proxy (tools/chaos) in front of a
  child's database; `web_behind_db_proxy(tmp_path, ...)`: the run command's
  `web` program (its real argv) behind one, for the tests that partition it.
- `celery_worker(env=...)`: a real celery worker subprocess; waits for "ready".
- `StubService`: a tiny HTTP server in a thread that applies "effects" once
  per reference, counts every call, and can answer "pending" or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

import requests

from runner.processes import die_with_parent

if TYPE_CHECKING:
    from tools.chaos.faultproxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]


def database_url_for_current_connection() -> str:
    """Return a DATABASE_URL naming the database this process is connected to (the test DB).

    Built from the connection's effective parameters, so a Unix-socket server
    (the embedded PostgreSQL of a fresh machine) is named by its socket folder
    (`?host=/path`), a TCP one by host and port.
    """
    from django.db import connection

    params = connection.get_connection_params()
    user = quote(params.get("user") or "", safe="")
    password = quote(params.get("password") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = params.get("host") or "127.0.0.1"
    name = quote(connection.settings_dict["NAME"], safe="")
    if host.startswith("/"):
        return f"postgres://{auth}/{name}?host={quote(host, safe='/')}"
    port = params.get("port") or 5432
    return f"postgres://{auth}{host}:{port}/{name}"


def server_env(**extra: str) -> dict[str, str]:
    """Build the environment of a child server process bound to the test database."""
    from django.conf import settings

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHOP_FAILPOINTS", "PYTEST_", "DJANGO_SETTINGS_MODULE"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=database_url_for_current_connection(),
        REDIS_URL=settings.REDIS_URL,
        DB_POOL_MAX=env.get("DB_POOL_MAX", "4"),
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def _stop_group(proc: subprocess.Popen, *, grace: float = 10.0) -> None:
    """Stop the process group this helper started (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    def log(self) -> str:
        return _tail(self.log_path)


@contextlib.contextmanager
def gunicorn_server(
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    timeout: int = 60,
    startup_timeout: float = 60.0,
    log_dir: str | Path | None = None,
) -> Iterator[Server]:
    """Run a real gunicorn on a free port with `env` (see server_env) until the block ends."""
    full_env = dict(env) if env is not None else server_env()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="shop-gunicorn-"))
    log_path = log_dir / f"gunicorn-{uuid.uuid4().hex[:8]}.log"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "config.wsgi:application",
        "--bind",
        f"fd://{fd}",
        "--workers",
        str(workers),
        "--worker-class",
        "sync",
        "--timeout",
        str(timeout),
        "--graceful-timeout",
        "5",
        "--log-level",
        "info",
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=full_env,
            pass_fds=(fd,),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Ended with pytest, even a pytest killed outright (no fixture teardown).
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
    listener.close()
    url = f"http://127.0.0.1:{port}"
    server = Server(url=url, process=proc, log_path=log_path, env=full_env)
    try:
        _wait_http_ok(f"{url}/healthz", proc, log_path, startup_timeout)
        yield server
    finally:
        _stop_group(proc)


def database_behind_proxy(env: dict[str, str]) -> FaultProxy:
    """Start a fault proxy in front of `env`'s DATABASE_URL and point the URL at it
    (the caller stops the proxy); skip the test when the database has no TCP port."""
    import pytest

    from tools.chaos.faultproxy import FaultProxy, via

    target = urlsplit(env["DATABASE_URL"])
    if not target.port:
        pytest.skip("the database answers on a Unix socket: no TCP for the fault proxy")
    proxy = FaultProxy(target=(target.hostname or "127.0.0.1", target.port)).start()
    env["DATABASE_URL"] = via(env["DATABASE_URL"], proxy.port)
    return proxy


@contextlib.contextmanager
def web_behind_db_proxy(
    tmp_path: Path,
    argv_tail: tuple[str, ...] = (),
    *,
    workers: int,
    threads: int,
    **env_extra: str,
) -> Iterator[tuple[str, FaultProxy]]:
    """The run command's web program, its database reached through a fault proxy:
    yields (base URL, proxy); heals the proxy and stops the server afterwards."""
    from runner.processes import free_port
    from runner.supervisor import PROGRAMS, context

    env = server_env(**env_extra)
    proxy = database_behind_proxy(env)
    port = free_port()
    (web,) = [p for p in PROGRAMS if p.name == "web"]
    ctx = {**context(), "host": "127.0.0.1", "port": str(port), "web_workers": str(workers),
           "web_threads": str(threads), "run": str(tmp_path)}  # fmt: skip
    argv = [part.format(**ctx) for part in web.argv] + list(argv_tail)
    log = tmp_path / "web.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(f"{url}/healthz", proc, log, 60)
        yield url, proxy
    finally:
        proxy.heal()
        _stop_group(proc)
        proxy.stop()


def _wait_http_ok(url: str, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not healthy after {timeout} s:\n{_tail(log_path)}")


@contextlib.contextmanager
def celery_worker(
    *,
    env: dict[str, str] | None = None,
    queues: tuple[str, ...] = (),
    concurrency: int = 1,
    pool: str = "prefork",
    startup_timeout: float = 60.0,
    log_dir: str | Path | None = None,
    extra_args: tuple[str, ...] = (),
    app: str = "config",
) -> Iterator[Server]:
    """Run a real celery worker subprocess (app `config` unless `app`) until the block ends.

    Without `queues` it consumes every queue of CELERY_TASK_QUEUES, as make run's do.
    """
    full_env = dict(env) if env is not None else server_env()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="shop-celery-"))
    log_path = log_dir / f"celery-{uuid.uuid4().hex[:8]}.log"
    name = f"test-{uuid.uuid4().hex[:8]}@%h"
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "--loglevel",
        "info",
        "--concurrency",
        str(concurrency),
        "--pool",
        pool,
        *(("--queues", ",".join(queues)) if queues else ()),
        "--hostname",
        name,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra_args,
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Ended with pytest, even a pytest killed outright (no fixture teardown).
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
    worker = Server(url="", process=proc, log_path=log_path, env=full_env)
    try:
        deadline = time.monotonic() + startup_timeout
        while " ready." not in _tail(log_path, 100_000):
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker not ready after {startup_timeout} s:\n{_tail(log_path)}"
                )
            time.sleep(0.1)
        yield worker
    finally:
        _stop_group(proc, grace=15.0)


def wait_until(predicate, *, timeout: float = 30.0, interval: float = 0.05, message: str = ""):
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {message}")
        time.sleep(interval)


class StubService:
    """A loopback HTTP service standing in for an outside system.

    `POST /effects {"reference", "amount"}` applies the effect for `reference`
    once (a repeated reference answers the first outcome, as a provider with
    its own idempotency keys does). `mode` decides fresh outcomes: "ok",
    "pending" (answer pending, apply nothing yet) or "fail" (answer 503).
    """

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls: list[dict] = []
        self.effects: dict[str, str] = {}
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"{}")
                status, body = stub._apply(self.path, payload)
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _apply(self, path: str, payload: dict) -> tuple[int, dict]:
        with self._lock:
            self.calls.append({"path": path, **payload})
            if path != "/effects":
                return 404, {"error": "not found"}
            reference = str(payload.get("reference"))
            if reference in self.effects:
                return 200, {"status": "done", "confirmation": self.effects[reference]}
            if self.mode == "fail":
                return 503, {"error": "unavailable"}
            if self.mode == "pending":
                return 200, {"status": "pending"}
            confirmation = f"conf-{len(self.effects) + 1}"
            self.effects[reference] = confirmation
            return 200, {"status": "done", "confirmation": confirmation}

    def start(self) -> StubService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StubService:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def key_hold(
    *, owner_id: int, key: str, operation: str, path: str, body=None, method: str = "POST"
):
    """Claim `key` and commit a first phase ("held"), leaving it locked like a running request."""
    from idempotency.keys import KeyRun, body_fingerprint, key_claim

    run = key_claim(
        owner_id=owner_id,
        key=key,
        operation=operation,
        method=method,
        path=path,
        fingerprint=body_fingerprint(body),
    )
    assert isinstance(run, KeyRun), run
    with run.phase(next_point="held"):
        pass
    return run
