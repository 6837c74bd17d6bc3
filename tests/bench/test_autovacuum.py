"""bench/autovacuum.py: the harness does autovacuum's job on a server that runs without it."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from bench.autovacuum import Autovacuum, pace

pytestmark = pytest.mark.django_db(transaction=True)


def _conninfo() -> str:
    params = connection.get_connection_params()
    keys = ("host", "port", "user", "password", "dbname")
    return psycopg.conninfo.make_conninfo(**{k: params[k] for k in keys if params.get(k)})


def _wait_for_inserts(conn: psycopg.Connection, table: str, rows: int) -> None:
    """Until the server's statistics count the table's inserts (flushed asynchronously)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    for _ in range(100):
        count = conn.execute(
            "SELECT n_ins_since_vacuum FROM pg_stat_user_tables WHERE relname = %s", [table]
        ).fetchone()
        if count and count[0] >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f"{table}: statistics never counted {rows} inserts")


def test_a_table_past_autovacuums_thresholds_is_vacuumed_and_a_small_change_is_not():
    conninfo = _conninfo()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE av_grown (id int)")
        conn.execute("CREATE TABLE av_touched (id int)")
        try:
            # 2,000 inserts pass the insert threshold (1,000 + 0.2 x 0 rows analyzed);
            # 10 pass neither it nor the analyze threshold (50).
            conn.execute("INSERT INTO av_grown SELECT generate_series(1, 2000)")
            conn.execute("INSERT INTO av_touched SELECT generate_series(1, 10)")
            _wait_for_inserts(conn, "av_grown", 2000)
            _wait_for_inserts(conn, "av_touched", 10)

            done = dict(Autovacuum(conninfo).round(conn))

            assert done.get("av_grown") == "vacuum"
            assert "av_touched" not in done
            analyzed = conn.execute(
                "SELECT reltuples FROM pg_class WHERE relname = 'av_grown'"
            ).fetchone()
            assert analyzed == (2000,)
        finally:
            conn.execute("DROP TABLE av_grown, av_touched")


def test_the_stand_in_vacuums_at_autovacuums_pace():
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        # A session's own VACUUM is unthrottled: the wrong twin, the stand-in before.
        assert conn.execute("SHOW vacuum_cost_delay").fetchone() == ("0",)
        pace(conn)
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # noqa: S608 - names written here
            for name in ("vacuum_cost_delay", "vacuum_cost_limit",
                         "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit")
        }  # fmt: skip
    for own in ("delay", "limit"):
        autovacuums = shown[f"autovacuum_vacuum_cost_{own}"]
        assert autovacuums == "-1" or shown[f"vacuum_cost_{own}"] == autovacuums
    assert shown["vacuum_cost_delay"] != "0"
