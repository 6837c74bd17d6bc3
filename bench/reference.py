"""The machine's reference figures, measured in the same run as the scenarios.

pgbench's tpcb-like transaction (on a scratch database of its own) and
redis-benchmark's unpipelined commands (in the Redis database of REDIS_URL,
on three fixed keys that are deleted afterwards) say how fast this machine
and these servers are right now; the shop's figures are reported as ratios
to them, so runs on different or differently loaded machines compare.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from .dbs import PgTarget, RedisTarget, create_database, drop_database

PGBENCH_CLIENTS = 8
PGBENCH_THREADS = 2
PGBENCH_SCALE = 8
REDIS_TESTS = ("set", "get", "incr", "lpush")
REDIS_CLIENTS = 50
# Without -r, redis-benchmark uses these literal keys: deleted after each run.
REDIS_KEYS = ("key:__rand_int__", "counter:__rand_int__", "mylist")
# Before each reference run the machine must be quiet: at most SETTLE_RUNNABLE
# runnable tasks (/proc/loadavg's 4th field counts the reader itself) and no
# autovacuum worker on the server, for SETTLE_QUIET_SAMPLES samples in a row,
# SETTLE_INTERVAL_S apart; waited for at most SETTLE_MAX_S (a full run) or
# SETTLE_QUICK_MAX_S (--quick), then measured anyway and recorded as unsettled.
SETTLE_RUNNABLE = 1
SETTLE_QUIET_SAMPLES = 3
SETTLE_INTERVAL_S = 1.0
SETTLE_MAX_S = 90.0
SETTLE_QUICK_MAX_S = 10.0


class ReferenceError(RuntimeError):
    """A reference tool is missing or failed."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ReferenceError(f"{name} is not installed (apt-get install postgresql-client/redis)")
    return path


def _run(argv: list[str], *, env: dict | None = None, timeout: float) -> str:
    proc = subprocess.run(
        argv,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ReferenceError(
            f"{os.path.basename(argv[0])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    return proc.stdout + proc.stderr


@dataclass
class Pgbench:
    """pgbench on its own scratch database: initialise once, run as often as wanted."""

    target: PgTarget
    scale: int = PGBENCH_SCALE

    def _conn_args(self) -> list[str]:
        return ["-h", self.target.host, "-p", str(self.target.port), "-U", self.target.user]

    def _env(self) -> dict:
        return {"PGPASSWORD": self.target.password} if self.target.password else {}

    def init(self) -> None:
        """Create the scratch database afresh and load pgbench's tables."""
        drop_database(self.target)
        create_database(self.target)
        _run(
            [_tool("pgbench"), "-i", "-q", "-s", str(self.scale), *self._conn_args()]
            + [self.target.dbname],
            env=self._env(),
            timeout=300,
        )

    def run(self, *, seconds: int) -> dict:
        """Run tpcb-like with PGBENCH_CLIENTS clients for `seconds`; return tps and latency."""
        out = _run(
            [
                _tool("pgbench"),
                "-b",
                "tpcb-like",
                "-c",
                str(PGBENCH_CLIENTS),
                "-j",
                str(PGBENCH_THREADS),
                "-T",
                str(seconds),
                "-n",
                *self._conn_args(),
                self.target.dbname,
            ],
            env=self._env(),
            timeout=seconds + 120,
        )
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
        latency = re.search(r"latency average = ([0-9.]+) ms", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        if tps is None:
            raise ReferenceError(f"cannot read pgbench's output:\n{out[-800:]}")
        return {
            "tps": float(tps.group(1)),
            "latency_avg_ms": float(latency.group(1)) if latency else None,
            "failed_transactions": int(failed.group(1)) if failed else 0,
            "clients": PGBENCH_CLIENTS,
            "threads": PGBENCH_THREADS,
            "scale": self.scale,
            "seconds": seconds,
            "script": "tpcb-like",
        }

    def drop(self) -> None:
        drop_database(self.target)


def runnable_tasks() -> int | None:
    """Runnable scheduling entities now (/proc/loadavg's 4th field, before the "/")."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def autovacuum_workers(target: PgTarget) -> int:
    """Autovacuum workers running on the server (any database)."""
    import psycopg

    with psycopg.connect(**target.maintenance_conninfo()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
        ).fetchone()
    return int(row[0])


def checkpoint(target: PgTarget) -> float:
    """Run CHECKPOINT on the server; return the seconds it took."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(**target.maintenance_conninfo()) as conn:
        conn.execute("CHECKPOINT")
    return round(time.monotonic() - started, 2)


def settle(
    target: PgTarget,
    *,
    max_wait: float,
    log: Callable[[str], None],
    interval: float = SETTLE_INTERVAL_S,
    quiet_samples: int = SETTLE_QUIET_SAMPLES,
    runnable: Callable[[], int | None] = runnable_tasks,
    autovacuum: Callable[[PgTarget], int] | None = None,
) -> dict:
    """Wait (at most `max_wait` s) until the machine is quiet; return what was waited for.

    Quiet: `runnable()` <= SETTLE_RUNNABLE and no autovacuum worker, for
    `quiet_samples` samples in a row. Progress is logged every ten samples.
    """
    autovacuum = autovacuum or autovacuum_workers
    started = time.monotonic()
    quiet = samples = 0
    last: dict = {}
    while True:
        samples += 1
        last = {"runnable": runnable(), "autovacuum_workers": autovacuum(target)}
        calm = (last["runnable"] is None or last["runnable"] <= SETTLE_RUNNABLE) and not last[
            "autovacuum_workers"
        ]
        quiet = quiet + 1 if calm else 0
        waited = time.monotonic() - started
        if quiet >= quiet_samples or waited >= max_wait:
            break
        if samples % 10 == 0:
            log(
                f"  settling: {waited:.0f} s, runnable {last['runnable']}, autovacuum workers "
                f"{last['autovacuum_workers']} (quiet {quiet}/{quiet_samples})"
            )
        time.sleep(interval)
    return {
        "settled": quiet >= quiet_samples,
        "waited_s": round(time.monotonic() - started, 1),
        "max_wait_s": max_wait,
        "samples": samples,
        "last": last,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def redis_benchmark(target: RedisTarget, *, requests: int) -> dict:
    """Run redis-benchmark unpipelined on a few commands; return ops/s per command and the mean."""
    argv = [
        _tool("redis-benchmark"),
        "-h",
        target.host,
        "-p",
        str(target.port),
        "--dbnum",
        str(target.db),
        "-c",
        str(REDIS_CLIENTS),
        "-n",
        str(requests),
        "-P",
        "1",
        "-t",
        ",".join(REDIS_TESTS),
        "--csv",
    ]
    if target.password:
        argv[1:1] = ["-a", target.password, "--no-auth-warning"]
    try:
        out = _run(argv, timeout=300)
    finally:
        _delete_keys(target)
    per_command = {}
    for row in csv.reader(io.StringIO(out)):
        if len(row) >= 2 and row[0] != "test":
            try:
                per_command[row[0].lower()] = float(row[1])
            except ValueError:
                continue
    if not per_command:
        raise ReferenceError(f"cannot read redis-benchmark's output:\n{out[-800:]}")
    return {
        "ops_per_s": round(sum(per_command.values()) / len(per_command), 1),
        "per_command": per_command,
        "clients": REDIS_CLIENTS,
        "requests_per_command": requests,
        "pipeline": 1,
        "db": target.db,
    }


def _delete_keys(target: RedisTarget) -> None:
    import redis

    client = redis.Redis(
        host=target.host, port=target.port, db=target.db, password=target.password or None
    )
    try:
        client.delete(*REDIS_KEYS)
    finally:
        client.close()
