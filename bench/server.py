"""The shop under load: gunicorn with sync workers on a listening socket we own.

The harness binds 127.0.0.1:0 itself and hands the socket to gunicorn as
`fd://N`, so the port is free and known without a race. Gunicorn runs in its
own session (Ctrl-C in the terminal reaches only the harness, which then
stops gunicorn in order) and, on Linux, receives SIGTERM if the harness dies
without cleaning up.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class ServerError(RuntimeError):
    """Gunicorn did not start or died."""


class Gunicorn:
    """One gunicorn master and its sync workers serving config.wsgi (or `app`).

    `python` and `app` let a peer run its own application from its own
    environment (bench/scenarios/oscar.py); `config` replaces the shop's
    gunicorn.conf.py, which gunicorn would otherwise read from the root.
    `threads` runs the workers as production does (the Procfile's `--threads
    8`): the configuration file's worker class (the shop's: threads with
    health checks ahead of the queue; a peer's: gunicorn's gthread) with that
    many request threads each, instead of sync workers.
    """

    def __init__(
        self,
        *,
        workers: int,
        env: dict[str, str],
        log_path: Path,
        app: str = "config.wsgi:application",
        python: str = sys.executable,
        config: str | None = None,
        threads: int | None = None,
    ):
        self.workers = workers
        self.env = env
        self.log_path = log_path
        self.app = app
        self.python = python
        self.config = config
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 60.0) -> None:
        """Start gunicorn and wait until /healthz answers 200."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(2048)
        self.port = listener.getsockname()[1]
        fd = listener.fileno()
        argv = [
            self.python,
            "-m",
            "gunicorn",
            self.app,
            *(["--config", self.config] if self.config else []),
            "--chdir",
            str(ROOT),
            "--bind",
            f"fd://{fd}",
            "--workers",
            str(self.workers),
            *(["--threads", str(self.threads)] if self.threads else ["--worker-class", "sync"]),
            "--timeout",
            "30",
            "--graceful-timeout",
            "5",
            "--log-level",
            "warning",
            "--error-logfile",
            "-",
        ]
        if os.path.isdir("/dev/shm"):
            # Worker heartbeats go to a tmpfs file, not the disk.
            argv += ["--worker-tmp-dir", "/dev/shm"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,),
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        # Gunicorn holds its own copy of the socket now.
        listener.close()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"gunicorn exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                conn.close()
                if response.status == 200:
                    return
                last = f"status {response.status}"
            except OSError as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise ServerError(f"gunicorn not ready after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """Return the CPU time (user + system) used so far by the master and its workers."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        total = 0.0
        try:
            master = psutil.Process(self.proc.pid)
            processes = [master, *master.children(recursive=True)]
        except psutil.Error:
            return 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, *, grace: float = 15.0) -> None:
        """Stop gunicorn gracefully, then its whole process group by force; idempotent."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            # Whatever is left of the group we started (the master was its leader).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(5)
        finally:
            self.proc = None
