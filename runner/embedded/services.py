"""Both embedded servers under one data folder, started for what the environment lacks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..processes import ensure_owned_dir, run_dir_for
from .postgres import EmbeddedPostgres
from .redis import EmbeddedRedis


class EmbeddedServices:
    """PostgreSQL and Redis for one data folder (`var/` for the run command).

    Data lives in `<root>/postgres` and `<root>/redis`; sockets, pid and lock
    files in a short folder under /tmp named after `root`.
    """

    def __init__(self, *, root: Path, durable: bool = True) -> None:
        self.root = Path(root).resolve()
        self.run_dir = run_dir_for(self.root)
        self.postgres = EmbeddedPostgres(
            data_dir=self.root / "postgres",
            socket_dir=self.run_dir / "pg",
            durable=durable,
        )
        self.redis = EmbeddedRedis(
            data_dir=self.root / "redis", run_dir=self.run_dir, appendonly=durable
        )
        self.started: list[EmbeddedPostgres | EmbeddedRedis] = []

    def start(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Start the servers whose URL `env` does not set; return the URLs to set."""
        env = os.environ if env is None else env
        urls: dict[str, str] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        ensure_owned_dir(self.run_dir)
        try:
            if not env.get("DATABASE_URL"):
                self.started.append(self.postgres)
                urls["DATABASE_URL"] = self.postgres.start()
            if not env.get("REDIS_URL"):
                self.started.append(self.redis)
                urls["REDIS_URL"] = self.redis.start()
        except BaseException:
            self.stop()
            raise
        return urls

    def stop(self) -> None:
        """Stop what `start` started, Redis first (the clients of both are gone by now)."""
        while self.started:
            self.started.pop().stop()
