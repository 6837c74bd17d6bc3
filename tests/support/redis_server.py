"""A private redis-server for tests that stop, hang or kill it (never the shared one).

`redis_server()` starts an empty server (no persistence) on a free loopback
port and yields it; `hang()` stops it with SIGSTOP — what a hung broker looks
like to a client: connecting succeeds (the kernel still completes the
handshake), every reply waits — and `resume()` sends SIGCONT.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from runner.processes import die_with_parent, free_port

from .servers import wait_until


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def hang(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    """Run an empty redis-server of the test's own until the block ends (then SIGKILL)."""
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
         "--appendonly", "no", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(signal.SIGKILL),  # ended with pytest, even a killed one
    )  # fmt: skip
    client = redis.Redis(port=port, socket_timeout=1)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        wait_until(up, timeout=10, message="own redis-server up")
        yield RedisServer(port=port, proc=proc)
    finally:
        proc.kill()  # a stopped process dies of SIGKILL too
        proc.wait(5)
