"""Django's database sessions, their expiry judged by the database clock (SESSION_ENGINE).

Django's own `db` backend sets `expire_date` from the host's clock and reads
a session only while `expire_date > timezone.now()`, the host's clock again.
With hosts whose clocks differ, a session written on a host behind expires
early everywhere, and one read on a host ahead is refused early by as much
as that host is ahead (docs/failure-model.md, "What broke, and what fixed
it"); on a host behind, a session past its end is still accepted. Here
both the end written and the end checked are the database's `now()`, the
clock every host shares: the same decision on every host.

A session ended by a date (`set_expiry(datetime)`) keeps that date: it was
decided by whoever chose it.

Ended sessions are deleted by `clear_expired` (beat's `core.clear_expired_sessions`,
and `manage.py clearsessions`), in bounded batches (docs/operations.md, "Retention").

The rows are `core.models.Session`: Django's with the logged-in user's id in
an indexed column, written from the session's `_auth_user_id` on every save,
so that `sessions_end` ("Log out everywhere") deletes a user's sessions with
one indexed DELETE instead of decoding every session (docs/security.md, "API
tokens").
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.db.models.functions import Now

from .db import delete_in_batches


class SessionStore(db.SessionStore):
    @classmethod
    def get_model_class(cls):
        from .models import Session  # the models load after the engine is imported

        return Session

    def _get_session_from_db(self):
        try:
            return self.model.objects.get(session_key=self.session_key, expire_date__gt=Now())
        except (self.model.DoesNotExist, SuspiciousOperation) as exc:
            return self._not_found(exc)

    async def _aget_session_from_db(self):
        try:
            return await self.model.objects.aget(
                session_key=self.session_key, expire_date__gt=Now()
            )
        except (self.model.DoesNotExist, SuspiciousOperation) as exc:
            return self._not_found(exc)

    def _not_found(self, exc: Exception) -> None:
        """As Django's store: a tampered key is logged as a security warning; no session."""
        if isinstance(exc, SuspiciousOperation):
            logging.getLogger(f"django.security.{type(exc).__name__}").warning(str(exc))
        self._session_key = None

    def _row(self, instance, data):
        """The row to save: its end by the database clock and its user's id (a guest: none)."""
        user_id = data.get(SESSION_KEY)
        instance.user_id = int(user_id) if user_id is not None else None
        return self._database_clock_end(instance, data)

    def _database_clock_end(self, instance, data):
        expiry = data.get("_session_expiry")
        if not isinstance(expiry, (datetime, str)):  # an age in seconds (or the default age)
            age = expiry or self.get_session_cookie_age()
            instance.expire_date = Now() + timedelta(seconds=age)
        return instance

    def create_model_instance(self, data):
        return self._row(super().create_model_instance(data), data)

    async def acreate_model_instance(self, data):
        return self._row(await super().acreate_model_instance(data), data)

    @classmethod
    def clear_expired(cls) -> int:  # type: ignore[override]  # Django's callers ignore it
        """Delete sessions ended by the database clock, in bounded batches; return how many.

        At most SESSION_CLEAR_MAX_BATCHES of SESSION_CLEAR_BATCH rows, each batch
        its own short transaction (`expire_date` is indexed); the next run goes on.
        """
        table = cls.get_model_class()._meta.db_table
        return delete_in_batches(
            f"WITH ended AS (SELECT session_key FROM {table} WHERE expire_date < now()"
            " ORDER BY expire_date LIMIT %s FOR UPDATE SKIP LOCKED)"
            f" DELETE FROM {table} s USING ended WHERE s.session_key = ended.session_key",
            [],
            batch=settings.SESSION_CLEAR_BATCH,
            max_batches=settings.SESSION_CLEAR_MAX_BATCHES,
        )

    @classmethod
    async def aclear_expired(cls) -> int:  # type: ignore[override]  # as clear_expired
        return await sync_to_async(cls.clear_expired)()


def sessions_end(*, user_id: int) -> int:
    """Delete every session of the user (their `user_id` column); how many."""
    from .models import Session

    deleted, _ = Session.objects.filter(user_id=user_id).delete()
    return deleted
