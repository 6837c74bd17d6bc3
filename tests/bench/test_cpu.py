"""bench/cpu.py: CPU of process trees from /proc, reaped children included."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from psycopg.conninfo import conninfo_to_dict

from bench import cpu
from bench.dbs import DEFAULT_DATABASE_URL, PgTarget

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_tree_counts_its_children_also_after_they_exit():
    # A parent that starts a child burning 0.3 s of CPU, waits for it, then sleeps.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time\n"
            f"subprocess.run([sys.executable, '-c', {BURN!r}])\n"
            "print('done', flush=True)\ntime.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout.readline() == b"done\n"  # the child has exited and been reaped
        spent = cpu.tree_cpu_seconds(parent.pid)
    finally:
        parent.kill()
        parent.wait()

    assert spent is not None and spent >= 0.25
    assert cpu.tree_cpu_seconds(parent.pid) is None  # gone


def test_spent_and_per_unit_say_none_where_a_source_could_not_be_read():
    before = {"web": 1.0, "postgres": None}
    after = {"web": 1.5, "postgres": 3.0}

    spent = cpu.spent(before, after)

    assert spent == {"web": 0.5, "postgres": None}
    assert cpu.per_unit_ms(spent, 100) == {"web": 5.0, "postgres": None}
    assert cpu.per_unit_ms(spent, 0) == {"web": None, "postgres": None}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_the_postmaster_is_found_from_the_servers_data_directory():
    url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    if urlsplit(url).hostname:
        conninfo = PgTarget.from_url(url).maintenance_conninfo()
    else:  # the embedded server (runner/pytest_plugin.py): its socket folder, no host
        conninfo = {**conninfo_to_dict(url), "dbname": "postgres"}
    pid = cpu.postmaster_pid(conninfo)
    if pid is None:
        pytest.skip("the server's data directory is not readable here (another machine?)")

    with open(f"/proc/{pid}/comm") as comm:
        assert comm.read().strip() in ("postgres", "postmaster")
    assert cpu.tree_cpu_seconds(pid) > 0


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_the_backends_of_one_database_count_their_work_and_no_other_databases():
    import psycopg

    url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    if not urlsplit(url).hostname:
        pytest.skip("needs a TCP server whose backends this machine can read")
    conninfo = PgTarget.from_url(url).maintenance_conninfo()
    dbname = PgTarget.from_url(url).dbname
    mine = cpu.backends_source(conninfo, (dbname,))
    nobody = cpu.backends_source(conninfo, ("no_such_database",))
    if cpu.postmaster_pid(conninfo) is None:
        pytest.skip("the server's processes are not readable here (another machine?)")
    start_mine, start_nobody = mine(), nobody()

    with psycopg.connect(**{**conninfo, "dbname": dbname}) as conn:
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        spent = mine() - start_mine  # read while the backend is still there

    assert spent >= 0.05
    assert nobody() - start_nobody == 0.0
