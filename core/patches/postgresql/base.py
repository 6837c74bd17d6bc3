"""Django's PostgreSQL backend with two changes: the pool is a `DeadlinePool`, and a
`bulk_create` batch fits the protocol's parameter count.

Upstream: Django 5.2.19 and psycopg-pool 3.3.3. Copies the pool's
construction from Django's `DatabaseWrapper.pool` property
(`django.db.backends.postgresql.base`, and its private `_connection_pools`
and `_configure_connection`), building a `DeadlinePool` where Django builds
a `psycopg_pool.ConnectionPool`; overrides `ConnectionPool.getconn`.
Overrides `DatabaseOperations.bulk_batch_size`, which Django's PostgreSQL
backend inherits unbounded, and relies on
`DatabaseWrapper.get_connection_params` passing `server_side_binding` and
`prepare_threshold` on to psycopg (config/settings/servers.py, DB_PREPARED).

`DeadlineConnection` (core/patches/psycopg_connection.py) bounds every wait on a connection's
socket by the web request's deadline; the wait for a connection from the
pool comes before any socket and has only the pool's own `timeout`
(`DB_POOL_TIMEOUT`, 10 s). A request whose deadline has passed (its
connection closed by it, the error path writing again) would still wait
those 10 s for a new one and answer 503 "the database cannot be reached"
long past its deadline; here that wait is cut to what is left of the
deadline (docs/failure-model.md, "What broke, and what fixed it").
"""

from __future__ import annotations

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base, operations
from psycopg_pool import ConnectionPool

from core.deadline import bounded


class DeadlinePool(ConnectionPool):
    """A pool whose `getconn` waits no longer than what is left of the request's deadline."""

    def getconn(self, timeout: float | None = None):  # noqa: ANN201 - psycopg's own
        return super().getconn(bounded(self.timeout if timeout is None else timeout))


# The protocol counts a statement's parameters in 16 bits.
MAX_QUERY_PARAMS = 65535


class DatabaseOperations(operations.DatabaseOperations):
    def bulk_batch_size(self, fields, objs):  # noqa: ANN001, ANN201 - Django's own
        """With the server binding the values (DB_PREPARED), a batch fits one statement.

        Django's PostgreSQL backend batches a `bulk_create` without bound: with
        the values quoted into the text it has none. Bound by the server, a
        statement carries at most MAX_QUERY_PARAMS of them, as on the backends
        that declare such a limit (Oracle, SQLite).
        """
        if fields and self.connection.settings_dict["OPTIONS"].get("server_side_binding"):
            return max(1, min(len(objs), MAX_QUERY_PARAMS // len(fields)))
        return super().bulk_batch_size(fields, objs)


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations

    @property
    def pool(self) -> ConnectionPool | None:
        options = self.settings_dict["OPTIONS"].get("pool")
        if (
            options
            and self.alias != NO_DB_ALIAS
            and self.alias not in self._connection_pools  # type: ignore[attr-defined]  # no stub
            and not self.settings_dict.get("CONN_MAX_AGE")  # else Django's property refuses it
        ):
            # Django builds a psycopg_pool.ConnectionPool here: the same, as a DeadlinePool.
            kwargs = {**self.get_connection_params(), "autocommit": True}
            checks = self.settings_dict["CONN_HEALTH_CHECKS"]
            pool = DeadlinePool(
                kwargs=kwargs,
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]  # no stub
                check=ConnectionPool.check_connection if checks else None,
                **({} if options is True else options),
            )
            self._connection_pools.setdefault(self.alias, pool)  # type: ignore[attr-defined]
        return super().pool
