"""Where the benchmark's databases live: parsed from DATABASE_URL and REDIS_URL.

The bench never touches the database DATABASE_URL names: it creates two
siblings on the same server, `<name>_bench` (the shop under load) and
`<name>_pgbench` (pgbench's tables), drops them before use and, unless asked
to keep them, after.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit

import psycopg
from psycopg import sql

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_NAME = re.compile(r"^[A-Za-z0-9_]{1,50}$")


@dataclass(frozen=True)
class PgTarget:
    """A database on a PostgreSQL server reachable over TCP."""

    host: str
    port: int
    user: str
    password: str
    dbname: str

    @classmethod
    def from_url(cls, url: str) -> PgTarget:
        parts = urlsplit(url)
        if parts.scheme not in ("postgres", "postgresql", "pgsql"):
            raise ValueError(f"not a PostgreSQL URL: {url!r}")
        if not parts.hostname:
            # pgbench, the sibling databases and gunicorn's URL are built for TCP.
            raise ValueError(f"make bench needs a TCP PostgreSQL URL with a host, not {url!r}")
        return cls(
            host=parts.hostname,
            port=parts.port or 5432,
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
            dbname=unquote(parts.path.lstrip("/")) or "postgres",
        )

    def sibling(self, suffix: str) -> PgTarget:
        """Return the database named `<this name>_<suffix>` on the same server."""
        name = f"{self.dbname}_{suffix}"
        if not _NAME.match(name):
            raise ValueError(f"unsuitable database name {name!r}")
        return replace(self, dbname=name)

    @property
    def url(self) -> str:
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + quote(self.password, safe="")
        return f"postgres://{auth}@{self.host}:{self.port}/{quote(self.dbname, safe='')}"

    def maintenance_conninfo(self) -> dict:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password or None,
            "dbname": "postgres",
            "autocommit": True,
            "connect_timeout": 10,
        }


@dataclass(frozen=True)
class RedisTarget:
    host: str
    port: int
    db: int
    password: str

    @classmethod
    def from_url(cls, url: str) -> RedisTarget:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(
                f"make bench needs a TCP Redis URL (redis://host:port/db), not {url!r}"
            )
        if not parts.hostname:
            raise ValueError(f"make bench needs a TCP Redis URL with a host, not {url!r}")
        path = parts.path.lstrip("/")
        return cls(
            host=parts.hostname,
            port=parts.port or 6379,
            db=int(path) if path else 0,
            password=unquote(parts.password or ""),
        )


def drop_database(target: PgTarget) -> None:
    """Drop the database if it exists, disconnecting whoever is still on it."""
    with psycopg.connect(**target.maintenance_conninfo()) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target.dbname))
        )


def create_database(target: PgTarget) -> None:
    with psycopg.connect(**target.maintenance_conninfo()) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target.dbname)))
