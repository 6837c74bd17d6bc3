"""A stand-in for autovacuum on a server that runs with it off (CI's PostgreSQL does).

The shop's PostgreSQL runs autovacuum (docs/deployment.md, "Supported server
versions"): its analyze keeps the planner's statistics up with tables that
grow from nothing, and a new statistic replans every prepared statement
that reads the table. With autovacuum off, a connection keeps the generic
plan it made when a table held a few rows (a scan of the whole table) while
the table grows by thousands of rows a minute, and every run slows down the
longer it runs (docs/performance.md, "Autovacuum").

`Autovacuum` does autovacuum's job for the bench database while a run
lasts: every `autovacuum_naptime` (the launcher's visit of a lone database;
or `every` seconds) it reads `pg_stat_user_tables` and runs
`VACUUM (ANALYZE)` or `ANALYZE` on each table past autovacuum's thresholds
(the server's `autovacuum_*_threshold` and `_scale_factor`, or the table's
own storage parameters, as `core.db.HOT_TABLE_AUTOVACUUM` sets them), at
autovacuum's pace (its cost delay and limit). On a server with autovacuum on
it does nothing.
"""

from __future__ import annotations

import threading

import psycopg
from psycopg import sql


def server_runs_autovacuum(conninfo: str) -> bool:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute("SHOW autovacuum").fetchone()[0] == "on"


class Autovacuum(threading.Thread):
    """Vacuum and analyze the bench database's tables past autovacuum's thresholds."""

    def __init__(self, conninfo: str, *, every: float | None = None) -> None:
        super().__init__(daemon=True, name="autovacuum-stand-in")
        self.conninfo = conninfo
        self.every = every
        self.halt = threading.Event()
        self.vacuums = 0
        self.analyzes = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                pace(conn)
                if self.every is None:  # the launcher visits a lone database once a naptime
                    self.every = float(
                        conn.execute(
                            "SELECT setting FROM pg_settings WHERE name = 'autovacuum_naptime'"
                        ).fetchone()[0]
                    )
                while not self.halt.wait(self.every):
                    self.round(conn)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            self.error = repr(exc)

    def round(self, conn: psycopg.Connection) -> list[tuple[str, str]]:
        """One pass of autovacuum's launcher over the database: (table, what ran) each."""
        done = []
        for table, vacuum, analyze in conn.execute(_DUE).fetchall():
            name = sql.Identifier(table)
            if vacuum:
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(name))
                self.vacuums += 1
                done.append((table, "vacuum"))
            elif analyze:
                conn.execute(sql.SQL("ANALYZE {}").format(name))
                self.analyzes += 1
                done.append((table, "analyze"))
        return done

    def stop(self) -> dict:
        self.halt.set()
        self.join(60)
        return {
            "stand_in": True,
            "every_s": self.every,
            "vacuums": self.vacuums,
            "analyzes": self.analyzes,
            "error": self.error,
        }


def pace(conn: psycopg.Connection) -> None:
    """Make this session's VACUUM and ANALYZE sleep as autovacuum's workers do."""
    conn.execute(_THROTTLE)


def _setting(name: str) -> str:
    """SQL for autovacuum's `name` on a table: its storage parameter, else the server's."""
    return (
        f"coalesce((SELECT split_part(o, '=', 2)::float FROM unnest(c.reloptions) AS o"
        f" WHERE o LIKE '{name}=%'), current_setting('{name}')::float)"
    )


# autovacuum's pace: a VACUUM or ANALYZE typed in runs unthrottled (vacuum_cost_delay 0),
# autovacuum's workers sleep autovacuum_vacuum_cost_delay each time they have spent
# autovacuum_vacuum_cost_limit of page costs (-1: the vacuum_* setting), so that they
# never take the disk and a core from the load beside them in one go.
_THROTTLE = """
SELECT set_config('vacuum_cost_delay', CASE current_setting('autovacuum_vacuum_cost_delay')
         WHEN '-1' THEN current_setting('vacuum_cost_delay')
         ELSE current_setting('autovacuum_vacuum_cost_delay') END, false),
       set_config('vacuum_cost_limit', CASE current_setting('autovacuum_vacuum_cost_limit')
         WHEN '-1' THEN current_setting('vacuum_cost_limit')
         ELSE current_setting('autovacuum_vacuum_cost_limit') END, false)
"""

# autovacuum's rules (PostgreSQL's autovacuum.c, relation_needs_vacanalyze): vacuum when
# dead tuples pass threshold + scale x reltuples, or inserts since the last vacuum pass
# the insert threshold + scale x reltuples; analyze when changes since the last analyze
# pass threshold + scale x reltuples. A table never analyzed counts reltuples as 0.
_DUE = f"""
SELECT s.relname,
       s.n_dead_tup > {_setting("autovacuum_vacuum_threshold")}
         + {_setting("autovacuum_vacuum_scale_factor")} * greatest(c.reltuples, 0)
       OR s.n_ins_since_vacuum > {_setting("autovacuum_vacuum_insert_threshold")}
         + {_setting("autovacuum_vacuum_insert_scale_factor")} * greatest(c.reltuples, 0)
         AS vacuum,
       s.n_mod_since_analyze > {_setting("autovacuum_analyze_threshold")}
         + {_setting("autovacuum_analyze_scale_factor")} * greatest(c.reltuples, 0)
         AS analyze
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 ORDER BY s.relname
"""  # noqa: S608 - the names are autovacuum's own settings, written here
