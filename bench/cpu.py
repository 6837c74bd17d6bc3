"""CPU seconds of whole process trees, read from /proc: the capacity model's samples.

A process tree's CPU is the user + system time of every live process in it
plus the time of the children they have already reaped (`cutime` + `cstime`
of /proc/<pid>/stat): a PostgreSQL backend or a Celery child that exits
between two samples still counts, in its parent's reaped time. The same
reading works for any user's processes when the harness runs as root (or as
their owner): the bench reads PostgreSQL's postmaster, found from the
server's data directory (`SHOW data_directory`, first line of its
`postmaster.pid`), so it must run on the database's machine; where it cannot
read them the source says why and gives None.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children), None once it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after its last ")".
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
    ppid = int(fields[1])
    ticks = sum(int(value) for value in fields[11:15])
    return ppid, ticks / _TICKS


def _stats() -> dict[int, tuple[int, float]]:
    """(parent pid, CPU seconds) of every live process, by pid."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    return stats


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds (user + system, reaped children included) of `root` and its descendants."""
    stats = _stats()
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total


def postmaster_pid(conninfo: dict) -> int | None:
    """The PostgreSQL server's postmaster pid, from its data directory's postmaster.pid."""
    import psycopg

    try:
        with psycopg.connect(**conninfo) as conn:
            data_directory = conn.execute("SHOW data_directory").fetchone()[0]
        return int((Path(data_directory) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError, psycopg.Error):
        return None


def tree_source(root: int | None) -> Callable[[], float | None]:
    """A CPU source for `tree_cpu_seconds(root)`; None on every read when root is unknown."""
    return lambda: tree_cpu_seconds(root) if root is not None else None


def backends_source(conninfo: dict, dbnames: tuple[str, ...]) -> Callable[[], float | None]:
    """A CPU source for the backends of some databases only: the server's share of one run.

    The whole server's tree (`tree_source(postmaster_pid(...))`) also counts
    every other database's work, which on a shared server is not the run's.
    Each read lists the backends connected to `dbnames` (pg_stat_activity) and
    adds what each spent since the read before (all of it for a backend new
    since then); a backend that exits between two reads loses what it spent
    after the first (the shop's processes keep pooled connections). The
    server's own processes (WAL writer, checkpointer, autovacuum) are not
    counted: alone on the server, the tree is the whole cost.
    """
    import psycopg

    seen: dict[int, float] = {}
    total = [0.0]

    def read_now() -> float | None:
        try:
            with psycopg.connect(**conninfo) as conn:
                pids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)"
                        " AND pid <> pg_backend_pid()",
                        [list(dbnames)],
                    )
                ]
        except psycopg.Error:
            return None
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            total[0] += max(0.0, stat[1] - seen.get(pid, 0.0))
            seen[pid] = stat[1]
        return total[0]

    return read_now


def read(sources: dict[str, Callable[[], float | None]]) -> dict[str, float | None]:
    """Read every source now."""
    return {name: source() for name, source in sources.items()}


def spent(
    before: dict[str, float | None], after: dict[str, float | None]
) -> dict[str, float | None]:
    """CPU seconds each source spent between two reads (None where either read had none)."""
    out: dict[str, float | None] = {}
    for name, start in before.items():
        end = after.get(name)
        out[name] = round(end - start, 3) if start is not None and end is not None else None
    return out


def per_unit_ms(cpu_s: dict[str, float | None], units: float) -> dict[str, float | None]:
    """Milliseconds of CPU per unit (order, delivery) of each source; None without units."""
    return {
        name: round(1000 * seconds / units, 3) if seconds is not None and units else None
        for name, seconds in cpu_s.items()
    }


def self_source() -> Callable[[], float | None]:
    """This process's own CPU (every thread, no child): the harness and its load generator."""
    import resource

    def read_now() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    return read_now


def child_source(fragment: str) -> Callable[[], float | None]:
    """The CPU of this process's live children whose command line holds `fragment`."""
    me = os.getpid()

    def read_now() -> float | None:
        total, found = 0.0, False
        for pid, (ppid, seconds) in _stats().items():
            if ppid != me:
                continue
            try:
                cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if fragment in cmdline.decode():
                total, found = total + seconds, True
        return total if found else None

    return read_now
