"""Claim a key: read, match, take over, INSERT the fresh key's row; close a failed run."""

from __future__ import annotations

import functools
import json
import math
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, connections, router
from django.db.models import F
from django.db.models.functions import Now

from core.db import STATEMENT_CLOCK_SQL
from core.errors import ApplicationError
from core.rows import RowReader, column, select_list

from .. import metrics
from ..failpoints import failpoint
from ..models import FINISHED, STARTED, IdempotencyKey
from .answers import Answer, _stored_answer
from .clock import _claim_lock_timeout, _db_ago, _lease_free_or_expired, _lease_ttl
from .errors import IdempotencyKeyInUse, IdempotencyKeyReused, KeyClaimLost
from .run import KeyRun

OWNER_KEY_CONSTRAINT = "idempotency_idempotencykey_owner_key_uniq"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_not_available (lock_timeout expired)

# Refusals raised before the first committed phase that are NOT the domain's
# decision about this request: nothing is kept (a fresh key was never
# inserted; a key taken over at "started" is deleted), so the same key can be
# sent again, e.g. with a corrected body. Every other 4xx
# ApplicationError raised before the first committed phase (402, 404, 409,
# 410, 422, ...) is stored as the final answer and replayed; 5xx are not
# stored (the lease is dropped and a retry runs again).
UNSTORED_STATUSES = frozenset({400, 401, 403, 405, 406, 413, 415, 429})


@dataclass(frozen=True)
class KeyClaim:
    """A fresh key's claim: what its row records about the request, and the INSERT that
    claims it (run by the run's first phase, or by its finish before any phase)."""

    owner_id: int
    key: str
    operation: str
    method: str
    path: str
    fingerprint: str

    def insert(
        self, run: KeyRun, *, recovery_point: str, locked: bool, answer: Answer | None = None
    ) -> int:
        """INSERT the key's row first and return its id; KeyClaimLost if the (owner, key)
        constraint says it exists.

        `run` calls it in its transaction: as the first statement of its first
        phase (`locked`: leased by the run's token), or finishing with
        `answer` before any phase. `ON CONFLICT ON CONSTRAINT <name> DO
        NOTHING` lets exactly that constraint decide; any other violation
        still raises.
        """
        failpoint("idempotency.claim.before_insert")
        finished = recovery_point == FINISHED
        assert answer is not None or not finished
        final = answer if finished else None
        table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
        # Bound the wait on a concurrent identical request's uncommitted insert
        # (its phase may be queued behind a busy row): past the claim wait it is
        # "in use" (409), not a sync worker held. One statement: `wait` sets the
        # timeout before the INSERT reads its row, and the outer SELECT puts the
        # previous value back once the INSERT has run (it reads the INSERT's
        # result), before the phase's own statements.
        sql = (
            "WITH wait AS MATERIALIZED (SELECT current_setting('lock_timeout') AS previous,"
            "  set_config('lock_timeout', %s, true) AS claim_wait),"
            f" claimed AS (INSERT INTO {table} (owner_id, key, operation, request_method,"
            "  request_path, request_fingerprint, recovery_point, data, leased_by, leased_at,"
            "  runs, response_status, response_body, response_headers, finished_at)"
            "  SELECT %s, %s, %s, %s, %s, %s, %s, '{}'::jsonb, %s::uuid,"
            "  CASE WHEN %s THEN now() END, 1, %s::integer, %s::text, %s::jsonb,"
            "  CASE WHEN %s THEN now() END FROM wait"
            f"  ON CONFLICT ON CONSTRAINT {OWNER_KEY_CONSTRAINT} DO NOTHING RETURNING id)"
            " SELECT claimed.id, set_config('lock_timeout', wait.previous, true)"
            " FROM wait LEFT JOIN claimed ON true"
        )
        params: list[Any] = [
            _claim_lock_timeout(),
            self.owner_id,
            self.key,
            self.operation,
            self.method,
            self.path,
            self.fingerprint,
            recovery_point,
            run.token if locked else None,
            locked,
            final.status if final else None,
            final.body if final else None,
            json.dumps(final.headers if final else {}),
            finished,
        ]
        with connection.cursor() as cursor:
            try:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                raise KeyClaimLost(f"{run!r}: another request is claiming this key") from exc
        if row[0] is None:
            raise KeyClaimLost(f"{run!r}: another request holds this key")
        return row[0]


@functools.cache
def _key_lookup_sql(alias: str) -> str:
    """`IdempotencyKey.objects.annotate(db_now=Now()).filter(owner_id=, key=)`, written once."""
    return (
        f"SELECT {select_list(IdempotencyKey, 'k', alias=alias)}, {STATEMENT_CLOCK_SQL}"
        f" FROM {connections[alias].ops.quote_name(IdempotencyKey._meta.db_table)} k"
        f" WHERE k.{column(IdempotencyKey, 'owner', alias=alias)} = %s"
        f" AND k.{column(IdempotencyKey, 'key', alias=alias)} = %s"
    )


def key_lookup(*, owner_id: int, key: str) -> IdempotencyKey | None:
    """Read the key's row (one indexed read), annotated with the database's `now()` (`db_now`).

    Every keyed request reads its key here first, the same way: the SQL is
    written once per process and the row becomes the instance the ORM would
    make (`core.rows`: its JSON fields decoded), not compiled again each time.
    """
    alias = router.db_for_read(IdempotencyKey)
    reader = RowReader.of(IdempotencyKey, alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(_key_lookup_sql(alias), [owner_id, key])
        row = cursor.fetchone()
    if row is None:
        return None
    found = reader.read(row[: reader.width])
    found.db_now = row[reader.width]  # type: ignore[attr-defined]  # as annotate() sets it
    return found


_key_read = key_lookup
_UNREAD: Any = object()


def key_stored_answer(
    *, row: IdempotencyKey, method: str, path: str, fingerprint: str
) -> Answer | None:
    """Return the stored answer if `row` is finished and was made by this same request."""
    if row.recovery_point != FINISHED or not _same_request(
        row, method=method, path=path, fingerprint=fingerprint
    ):
        return None
    return _replay(row)


def _same_request(row: IdempotencyKey, *, method: str, path: str, fingerprint: str) -> bool:
    """Whether `row` was claimed by this request (method, path and body fingerprint)."""
    return (row.request_method, row.request_path, row.request_fingerprint) == (
        method,
        path,
        fingerprint,
    )


def _replay(row: IdempotencyKey) -> Answer:
    """Return a finished key's stored answer, counted as a suppressed duplicate."""
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY, key=row.key)
    return _stored_answer(row)


def _key_take_over(*, key_id: int, abandoned: bool = False) -> KeyRun | None:
    """Lease an open key whose lease is free or expired with a fresh token; None if another won."""
    token = uuid.uuid4()
    candidates = IdempotencyKey.objects.filter(pk=key_id).exclude(recovery_point=FINISHED)
    candidates = candidates.filter(_lease_free_or_expired())
    if abandoned:
        candidates = candidates.filter(
            last_run_at__lt=_db_ago(float(settings.IDEMPOTENCY_ABANDON_AFTER))
        )
    updated = candidates.update(
        leased_by=token, leased_at=Now(), last_run_at=Now(), runs=F("runs") + 1
    )
    if updated != 1:
        return None
    row = IdempotencyKey.objects.filter(pk=key_id, leased_by=token).first()
    if row is None:
        return None
    return KeyRun(
        key_id=row.pk,
        owner_id=row.owner_id,
        key=row.key,
        operation=row.operation,
        token=token,
        recovery_point=row.recovery_point,
        data=row.data,
        resumed=True,
    )


def _in_use(row: IdempotencyKey | None = None) -> IdempotencyKeyInUse:
    remaining = _lease_ttl()
    if row is not None and row.leased_at is not None:
        # db_now: key_lookup's annotation, which the model's type does not know.
        remaining -= (row.db_now - row.leased_at).total_seconds()  # type: ignore[attr-defined]
    retry_after = max(1, min(int(settings.IDEMPOTENCY_RETRY_AFTER), math.ceil(remaining)))
    metrics.duplicate_suppressed(mechanism=metrics.KEY_IN_USE, key=row and row.key)
    return IdempotencyKeyInUse(
        "A request with this idempotency key is still being processed; retry shortly.",
        headers={"Retry-After": str(retry_after)},
    )


def _lease_live(row: IdempotencyKey) -> bool:
    return (
        row.leased_by is not None
        and row.leased_at is not None
        and row.leased_at > row.db_now - timedelta(seconds=_lease_ttl())  # type: ignore[attr-defined]
    )


def _match(row: IdempotencyKey, *, method: str, path: str, fingerprint: str) -> Answer | None:
    """Refuse another request under this key (422); return the stored answer if finished."""
    if not _same_request(row, method=method, path=path, fingerprint=fingerprint):
        metrics.duplicate_suppressed(mechanism=metrics.KEY_REUSED, suspicious=True, key=row.key)
        raise IdempotencyKeyReused(
            "This idempotency key was used for a different request "
            "(method, path or body); use a new key for a new request."
        )
    if row.recovery_point == FINISHED:
        return _replay(row)
    return None


def _after_takeover(run: KeyRun) -> None:
    """Pass the failpoint after a takeover; a raise there must not leave the key leased."""
    try:
        failpoint("idempotency.claim.after_takeover")
    except BaseException:
        run.drop_lease_quietly()
        raise


def key_claim(
    *,
    owner_id: int,
    key: str,
    operation: str,
    method: str,
    path: str,
    fingerprint: str,
    row: IdempotencyKey | None = _UNREAD,
) -> KeyRun | Answer:
    """Match `key` to the request that holds it, or prepare this request's claim.

    Return the stored Answer to replay; or a KeyRun to run: fresh (its first
    phase runs this claim's INSERT, `KeyClaim.insert`, under the unique
    constraint), or resumed at its
    recovery point after an expired lease or an open key. Raise
    IdempotencyKeyReused (422) for another request under the same key and
    IdempotencyKeyInUse (409, Retry-After) while another run holds it.

    The read only spares a replay any write; the insert decides who runs.
    `row` is the result of a `key_lookup` the caller just made (read once).
    """
    claim = KeyClaim(
        owner_id=owner_id,
        key=key,
        operation=operation,
        method=method,
        path=path,
        fingerprint=fingerprint,
    )
    for _ in range(5):
        if row is _UNREAD:
            row = _key_read(owner_id=owner_id, key=key)
        if row is None:
            return KeyRun(
                key_id=None,
                owner_id=owner_id,
                key=key,
                operation=operation,
                token=uuid.uuid4(),
                recovery_point=STARTED,
                data={},
                resumed=False,
                claim=claim,
            )
        answer = _match(row, method=method, path=path, fingerprint=fingerprint)
        if answer is not None:
            return answer
        if _lease_live(row):
            raise _in_use(row)
        run = _key_take_over(key_id=row.pk)
        if run is not None:
            _after_takeover(run)
            return run
        # Another request took it over between our read and update: look again.
        row = _UNREAD
    raise _in_use()


def key_answer_existing(
    *, owner_id: int, key: str, operation: str, method: str, path: str, fingerprint: str
) -> Answer:
    """Answer a request that lost its claim or lease: 422, the stored answer, or 409 in use."""
    row = _key_read(owner_id=owner_id, key=key)
    if row is None:
        raise _in_use()
    answer = _match(row, method=method, path=path, fingerprint=fingerprint)
    if answer is None:
        raise _in_use(row)
    return answer


def key_run_failed(*, run: KeyRun, exc: BaseException) -> Answer | None:
    """Close the run after the operation raised `exc`; return the answer if it was stored.

    Before the first committed phase an ApplicationError is the domain's
    decision and is stored (402/404/409/422...), except input-like refusals
    (UNSTORED_STATUSES: nothing is kept, so a corrected retry may use the
    key). Anything else drops the lease at its recovery point: a retry
    resumes there. KeyClaimLost propagates when another request stored first.
    """
    if run.closed:
        return None
    if isinstance(exc, ApplicationError) and run.recovery_point == STARTED and not run.in_phase:
        if exc.status in UNSTORED_STATUSES:
            run.abandon()
            return None
        if exc.status < 500:
            run.finish_problem(exc)
            return run.answer
    run.drop_lease_quietly()
    return None
