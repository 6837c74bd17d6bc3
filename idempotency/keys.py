"""Request keys: claim, match, atomic phases, finish, takeover, the completer and the purge.

The design (docs/idempotency.md) in short:

- A request first reads its (owner, key) row: a finished key is replayed
  from that one indexed read. An existing row is matched: another request
  (422), a stored answer (replay), a live lock (409), or an expired lock /
  open key (taken over with a conditional UPDATE and a fresh fencing token).
- A fresh key is claimed by INSERTing its row, with a fresh fencing token in
  `locked_by`, as the first statement of the operation's first phase, under
  `ON CONFLICT ON CONSTRAINT <the (owner, key) unique constraint> DO NOTHING`:
  exactly that constraint decides who runs; the loser rolls back before any
  effect and is answered from the winner's row (409 / replay / 422).
- An operation runs in phases. Each phase is one transaction that commits the
  phase's effects together with the key's next `recovery_point` and `data`,
  through `UPDATE ... WHERE locked_by = <my token>`: a request whose lock was
  taken over cannot commit anything.
- The final answer is stored in the same transaction as the effect that
  decided it (the last phase) and replayed byte for byte.
- Lock ages are judged by the database clock (`now()`), never the process's.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now
from rest_framework.utils.encoders import JSONEncoder

from core.errors import ApplicationError
from core.problems import PROBLEM_CONTENT_TYPE, exception_to_problem

from . import metrics
from .failpoints import failpoint
from .models import FINISHED, STARTED, IdempotencyKey

logger = logging.getLogger(__name__)

OWNER_KEY_CONSTRAINT = "idempotency_idempotencykey_owner_key_uniq"
MAX_KEY_LENGTH = 255
JSON_CONTENT_TYPE = "application/json"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_not_available (lock_timeout expired)

# Refusals raised before the first committed phase that are NOT the domain's
# decision about this request: nothing is kept (a fresh key was never
# inserted; a key taken over at "started" is deleted), so the same key can be
# sent again, e.g. with a corrected body. Every other 4xx
# ApplicationError raised before the first committed phase (402, 404, 409,
# 410, 422, ...) is stored as the final answer and replayed; 5xx are not
# stored (the key is unlocked and a retry runs again).
RELEASE_STATUSES = frozenset({400, 401, 403, 405, 406, 413, 415, 429})


# --- Errors -----------------------------------------------------------------


class IdempotencyKeyMissing(ApplicationError):
    status = 400
    code = "idempotency_key_missing"
    title = "Idempotency key missing"


class IdempotencyKeyInvalid(ApplicationError):
    status = 400
    code = "idempotency_key_invalid"
    title = "Idempotency key invalid"


class IdempotencyKeyInUse(ApplicationError):
    status = 409
    code = "idempotency_key_in_use"
    title = "Idempotency key in use"


class IdempotencyKeyReused(ApplicationError):
    status = 422
    code = "idempotency_key_reused"
    title = "Idempotency key reused"


class KeyLockLost(Exception):
    """Raised when a run's fencing token no longer holds its key: another run took it over."""


class KeyClaimLost(KeyLockLost):
    """Raised when a fresh run's insert finds the key taken by another request."""


# --- Key and fingerprint ----------------------------------------------------


def key_validate(value: str | None) -> str:
    """Return the key from an `Idempotency-Key` value, or refuse it with a 400 problem.

    A value wrapped in double quotes (the IETF draft's structured-field string)
    is accepted without its quotes.
    """
    if value is None:
        raise IdempotencyKeyMissing("This endpoint needs an Idempotency-Key header.")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if (
        not value
        or len(value) > MAX_KEY_LENGTH
        or not value.isascii()
        or not value.isprintable()
        or " " in value
    ):
        raise IdempotencyKeyInvalid(
            f"An idempotency key is 1 to {MAX_KEY_LENGTH} visible ASCII characters."
        )
    return value


def canonical_json(data: Any) -> bytes:
    """Render `data` as canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def body_fingerprint(data: Any) -> str:
    """Return the SHA-256 (hex) of the parsed body's canonical JSON.

    An empty body counts as the empty object `{}` (both carry no parameters).
    A form body (a QueryDict) counts as {field: [values...]}.
    """
    if data is None:
        data = {}
    elif hasattr(data, "getlist") and isinstance(data, Mapping):
        data = {name: data.getlist(name) for name in data}
    return hashlib.sha256(canonical_json(data)).hexdigest()


# --- Answers ----------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A response as stored: status, the exact body text, the headers that matter."""

    status: int
    body: str | None
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return None if self.body is None else json.loads(self.body)


def _render(body: Any) -> str | None:
    if body is None:
        return None
    return json.dumps(body, cls=JSONEncoder, ensure_ascii=False, separators=(",", ":"))


def answer_new(
    *,
    status: int,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    content_type: str = JSON_CONTENT_TYPE,
) -> Answer:
    """Build an answer; `body` is rendered once to JSON text so replays are identical."""
    stored = dict(headers or {})
    if body is not None:
        stored["Content-Type"] = content_type
    return Answer(status=status, body=_render(body), headers=stored)


def answer_for_problem(exc: ApplicationError) -> Answer:
    """Build the answer for a refusal exactly as the problem handler would render it."""
    mapped = exception_to_problem(exc)
    assert mapped is not None
    body, status, headers = mapped
    return answer_new(status=status, body=body, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def _stored_answer(row: IdempotencyKey) -> Answer:
    return Answer(
        status=row.response_status, body=row.response_body, headers=dict(row.response_headers)
    )


# --- Database clock helpers -------------------------------------------------


def _db_ago(seconds: float) -> ExpressionWrapper:
    """`now() - seconds`, computed by the database."""
    return ExpressionWrapper(
        Now() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def _lock_ttl() -> float:
    return float(settings.IDEMPOTENCY_LOCK_TTL)


def _claim_lock_timeout() -> str:
    """The claim's `lock_timeout` (IDEMPOTENCY_CLAIM_WAIT); at least 1 ms (0 would mean none)."""
    return f"{max(1, round(float(settings.IDEMPOTENCY_CLAIM_WAIT) * 1000))}ms"


def _unlocked_or_expired() -> Q:
    return Q(locked_by__isnull=True) | Q(locked_at__lt=_db_ago(_lock_ttl()))


# --- The run handle ---------------------------------------------------------


@dataclass(frozen=True)
class KeyIdentity:
    """What a fresh key's row records about the request that claims it."""

    owner_id: int
    key: str
    operation: str
    method: str
    path: str
    fingerprint: str


class KeyRun:
    """The handle a domain service gets to run one keyed operation in atomic phases.

    `recovery_point` says where to resume ("started" for a fresh run), `data`
    holds the operation's committed references. Declare each phase with
    `with run.phase(next_point=...) as data:`; end with `finish()` (stored,
    replayed forever) or `leave_open()` (answered now, key stays open).

    A fresh run's key row does not exist yet: the first phase inserts it,
    before its effects, in its own transaction (so the claim and the first
    effects commit together, and a crash before that commit leaves nothing).
    """

    def __init__(
        self,
        *,
        key_id: int | None,
        owner_id: int,
        key: str,
        operation: str,
        token: uuid.UUID,
        recovery_point: str,
        data: dict[str, Any],
        resumed: bool,
        identity: KeyIdentity | None = None,
    ) -> None:
        self.key_id = key_id
        self.owner_id = owner_id
        self.key = key
        self.operation = operation
        self.token = token
        self.resumed = resumed
        self._identity = identity
        self._recovery_point = recovery_point
        self._data = data
        self._answer: Answer | None = None
        self._pending: tuple[str, Answer] | None = None
        self._in_phase = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<KeyRun {self.operation} key={self.key!r} at {self._recovery_point}>"

    @property
    def recovery_point(self) -> str:
        return self._recovery_point

    @property
    def data(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    @property
    def answer(self) -> Answer | None:
        """The answer given by finish() or leave_open(), once committed."""
        return self._answer

    @property
    def closed(self) -> bool:
        """True once the run has finished, left the key open, released or unlocked it."""
        return self._closed

    @property
    def in_phase(self) -> bool:
        return self._in_phase

    @property
    def claimed(self) -> bool:
        """True once the key's row exists (committed by a phase, or taken over)."""
        return self.key_id is not None

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    @contextlib.contextmanager
    def phase(self, *, next_point: str) -> Iterator[dict[str, Any]]:
        """Run one atomic phase: effects, `next_point` and `data` commit together or not at all.

        Yields a copy of `data` to update. The phase commits only if this run's
        fencing token still holds the key; otherwise it rolls back and raises
        KeyLockLost. A fresh run's first phase first inserts the key (insert
        first; KeyClaimLost if another request holds it). Calling finish() or
        leave_open() inside the phase stores that answer in the same
        transaction (finish() makes the point "finished"). Must be called with
        no transaction open (the commit must be real).
        """
        self._require_open()
        if self._in_phase:
            raise RuntimeError("phases do not nest")
        if not next_point or next_point == STARTED:
            raise ValueError(f"a phase cannot move the key to {next_point!r}")
        data = copy.deepcopy(self._data)
        self._in_phase = True
        self._pending = None
        inserted_here = False
        try:
            with transaction.atomic(durable=True):
                if self.key_id is None:
                    self._insert(recovery_point=STARTED, locked=True)
                    inserted_here = True
                    failpoint("idempotency.claim.after_insert")
                yield data
                kind, answer = self._pending or (None, None)
                point = FINISHED if kind == "finish" else next_point
                if point == FINISHED and kind != "finish":
                    raise RuntimeError("a phase to 'finished' must call run.finish()")
                failpoint(f"{self.operation}.{point}.before_commit")
                self._fenced_update(point=point, data=data, kind=kind, answer=answer)
        except BaseException:
            if inserted_here:
                self.key_id = None  # the insert rolled back with the phase
            raise
        finally:
            self._in_phase = False
            self._pending = None
        self._committed(point=point, data=data, kind=kind, answer=answer)

    def finish(
        self,
        *,
        status: int,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        content_type: str = JSON_CONTENT_TYPE,
    ) -> None:
        """Store the final answer and unlock; inside a phase, in that phase's transaction."""
        self._settle(
            "finish",
            answer_new(status=status, body=body, headers=headers, content_type=content_type),
        )

    def finish_problem(self, exc: ApplicationError) -> None:
        """Store a domain refusal as the final answer (rendered as its problem response)."""
        self._settle("finish", answer_for_problem(exc))

    def leave_open(
        self,
        *,
        status: int,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        content_type: str = JSON_CONTENT_TYPE,
    ) -> None:
        """Answer now without storing the answer; unlock; a retry resumes at the recovery point."""
        self._settle(
            "open",
            answer_new(status=status, body=body, headers=headers, content_type=content_type),
        )

    def _settle(self, kind: str, answer: Answer) -> None:
        self._require_open()
        if self._in_phase:
            if self._pending is not None:
                raise RuntimeError("the run already has an answer")
            self._pending = (kind, answer)
            return
        point = FINISHED if kind == "finish" else self._recovery_point
        with transaction.atomic(durable=True):
            failpoint(f"{self.operation}.{point}.before_commit")
            if self.key_id is None:
                # Nothing ran yet: the key is inserted already settled.
                self._insert(recovery_point=point, locked=False, answer=answer)
            else:
                self._fenced_update(point=point, data=self._data, kind=kind, answer=answer)
        self._committed(point=point, data=self._data, kind=kind, answer=answer)

    def _insert(self, *, recovery_point: str, locked: bool, answer: Answer | None = None) -> None:
        """INSERT the key's row first; KeyClaimLost if the (owner, key) constraint says it exists.

        `ON CONFLICT ON CONSTRAINT <name> DO NOTHING` lets exactly that
        constraint decide; any other violation still raises.
        """
        identity = self._identity
        assert identity is not None
        failpoint("idempotency.claim.before_insert")
        finished = recovery_point == FINISHED
        assert answer is not None or not finished
        table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
        sql = (
            f"INSERT INTO {table} (owner_id, key, operation, request_method, request_path,"
            " request_fingerprint, recovery_point, data, locked_by, locked_at, runs,"
            " response_status, response_body, response_headers, finished_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, '{}'::jsonb, %s,"
            " CASE WHEN %s THEN now() END, 1, %s, %s, %s::jsonb, CASE WHEN %s THEN now() END)"
            f" ON CONFLICT ON CONSTRAINT {OWNER_KEY_CONSTRAINT} DO NOTHING RETURNING id"
        )
        params = [
            identity.owner_id,
            identity.key,
            identity.operation,
            identity.method,
            identity.path,
            identity.fingerprint,
            recovery_point,
            self.token if locked else None,
            locked,
            answer.status if finished else None,
            answer.body if finished else None,
            json.dumps(answer.headers if finished else {}),
            finished,
        ]
        with connection.cursor() as cursor:
            # Bound the wait on a concurrent identical request's uncommitted
            # insert (its phase may be queued behind a busy row): past the
            # claim wait it is "in use" (409), not a sync worker held. The
            # timeout covers this statement alone; the previous value is put
            # back before the phase's own statements.
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                [_claim_lock_timeout()],
            )
            previous = cursor.fetchone()[0]
            try:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                raise KeyClaimLost(f"{self!r}: another request is claiming this key") from exc
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
        if row is None:
            raise KeyClaimLost(f"{self!r}: another request holds this key")
        self.key_id = row[0]

    def _fenced_update(
        self, *, point: str, data: dict[str, Any], kind: str | None, answer: Answer | None
    ) -> None:
        fields: dict[str, Any] = {"recovery_point": point, "data": data}
        if kind == "finish":
            assert answer is not None
            fields.update(
                response_status=answer.status,
                response_body=answer.body,
                response_headers=answer.headers,
                finished_at=Now(),
                locked_by=None,
                locked_at=None,
            )
        elif kind == "open":
            fields.update(locked_by=None, locked_at=None)
        else:
            # Each committed phase renews the lock: the TTL bounds one phase
            # plus one outside call, not the whole operation.
            fields["locked_at"] = Now()
        updated = IdempotencyKey.objects.filter(pk=self.key_id, locked_by=self.token).update(
            **fields
        )
        if updated != 1:
            raise KeyLockLost(f"{self!r} lost its lock; its phase is rolled back")

    def _committed(
        self, *, point: str, data: dict[str, Any], kind: str | None, answer: Answer | None
    ) -> None:
        self._recovery_point = point
        self._data = data
        if kind is not None:
            self._answer = answer
            self._closed = True
        failpoint(f"{self.operation}.{point}.after_commit")

    def abandon(self) -> None:
        """Forget the key as if it never came: only allowed while no phase has committed."""
        self._require_open()
        if self._recovery_point != STARTED or self._in_phase:
            raise RuntimeError("only a key with no committed phase can be abandoned")
        if self.key_id is not None:
            deleted, _ = IdempotencyKey.objects.filter(
                pk=self.key_id, locked_by=self.token, recovery_point=STARTED
            ).delete()
            if deleted != 1:
                raise KeyLockLost(f"{self!r} lost its lock")
        self._closed = True

    def unlock(self) -> None:
        """Give the key up at its current recovery point, so a retry may resume at once."""
        self._closed = True
        if self.key_id is not None:
            IdempotencyKey.objects.filter(pk=self.key_id, locked_by=self.token).update(
                locked_by=None, locked_at=None
            )

    def unlock_quietly(self) -> None:
        """Unlock, logging instead of raising (the lock's TTL covers a failure here)."""
        try:
            self.unlock()
        except DatabaseError:
            logger.warning("could not unlock %r; its lock will expire", self, exc_info=True)


# --- Claim ------------------------------------------------------------------


def key_lookup(*, owner_id: int, key: str) -> IdempotencyKey | None:
    """Read the key's row (one indexed read), annotated with the database's `now()`."""
    rows = list(IdempotencyKey.objects.annotate(db_now=Now()).filter(owner_id=owner_id, key=key))
    return rows[0] if rows else None


_key_read = key_lookup
_UNREAD: Any = object()


def key_stored_answer(
    *, row: IdempotencyKey, method: str, path: str, fingerprint: str
) -> Answer | None:
    """Return the stored answer if `row` is finished and was made by this same request."""
    if row.recovery_point != FINISHED or (
        row.request_method,
        row.request_path,
        row.request_fingerprint,
    ) != (method, path, fingerprint):
        return None
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY, key=row.key)
    return _stored_answer(row)


def _key_take_over(*, key_id: int, abandoned: bool = False) -> KeyRun | None:
    """Lock an open key whose lock is free or expired with a fresh token; None if another won."""
    token = uuid.uuid4()
    candidates = IdempotencyKey.objects.filter(pk=key_id).exclude(recovery_point=FINISHED)
    candidates = candidates.filter(_unlocked_or_expired())
    if abandoned:
        candidates = candidates.filter(
            last_run_at__lt=_db_ago(float(settings.IDEMPOTENCY_ABANDON_AFTER))
        )
    updated = candidates.update(
        locked_by=token, locked_at=Now(), last_run_at=Now(), runs=F("runs") + 1
    )
    if updated != 1:
        return None
    row = IdempotencyKey.objects.filter(pk=key_id, locked_by=token).first()
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
    remaining = _lock_ttl()
    if row is not None and row.locked_at is not None:
        remaining -= (row.db_now - row.locked_at).total_seconds()
    retry_after = max(1, min(int(settings.IDEMPOTENCY_RETRY_AFTER), math.ceil(remaining)))
    metrics.duplicate_suppressed(mechanism=metrics.KEY_IN_USE, key=row and row.key)
    return IdempotencyKeyInUse(
        "A request with this idempotency key is still being processed; retry shortly.",
        headers={"Retry-After": str(retry_after)},
    )


def _lock_live(row: IdempotencyKey) -> bool:
    return (
        row.locked_by is not None
        and row.locked_at is not None
        and row.locked_at > row.db_now - timedelta(seconds=_lock_ttl())
    )


def _match(row: IdempotencyKey, identity: KeyIdentity) -> Answer | None:
    """Refuse another request under this key (422); return the stored answer if finished."""
    if (row.request_method, row.request_path, row.request_fingerprint) != (
        identity.method,
        identity.path,
        identity.fingerprint,
    ):
        metrics.duplicate_suppressed(mechanism=metrics.KEY_REUSED, suspicious=True, key=row.key)
        raise IdempotencyKeyReused(
            "This idempotency key was used for a different request "
            "(method, path or body); use a new key for a new request."
        )
    if row.recovery_point == FINISHED:
        metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY, key=row.key)
        return _stored_answer(row)
    return None


def _after_takeover(run: KeyRun) -> None:
    """Pass the failpoint after a takeover; a raise there must not leave the key locked."""
    try:
        failpoint("idempotency.claim.after_takeover")
    except BaseException:
        run.unlock_quietly()
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
    phase inserts the key under the unique constraint), or resumed at its
    recovery point after an expired lock or an open key. Raise
    IdempotencyKeyReused (422) for another request under the same key and
    IdempotencyKeyInUse (409, Retry-After) while another run holds it.

    The read only spares a replay any write; the insert decides who runs.
    `row` is the result of a `key_lookup` the caller just made (read once).
    """
    identity = KeyIdentity(
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
                identity=identity,
            )
        answer = _match(row, identity)
        if answer is not None:
            return answer
        if _lock_live(row):
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
    """Answer a request that lost its claim or lock: 422, the stored answer, or 409 in use."""
    row = _key_read(owner_id=owner_id, key=key)
    if row is None:
        raise _in_use()
    identity = KeyIdentity(
        owner_id=owner_id,
        key=key,
        operation=operation,
        method=method,
        path=path,
        fingerprint=fingerprint,
    )
    answer = _match(row, identity)
    if answer is None:
        raise _in_use(row)
    return answer


def key_run_failed(*, run: KeyRun, exc: BaseException) -> Answer | None:
    """Settle the key after the operation raised `exc`; return the answer if it was stored.

    Before the first committed phase an ApplicationError is the domain's
    decision and is stored (402/404/409/422...), except input-like refusals
    (RELEASE_STATUSES: nothing is kept, so a corrected retry may use the
    key). Anything else unlocks the key at its recovery point: a retry
    resumes there. KeyClaimLost propagates when another request stored first.
    """
    if run.closed:
        return None
    if isinstance(exc, ApplicationError) and run.recovery_point == STARTED and not run.in_phase:
        if exc.status in RELEASE_STATUSES:
            run.abandon()
            return None
        if exc.status < 500:
            run.finish_problem(exc)
            return run.answer
    run.unlock_quietly()
    return None


# --- Completer --------------------------------------------------------------

_registry: dict[str, Callable[[KeyRun], None]] = {}


def register_operation(name: str, *, resume: Callable[[KeyRun], None]) -> None:
    """Register how the completer drives an abandoned key of operation `name` to its end.

    `resume(run)` gets a locked KeyRun at the key's recovery point and must
    finish it (drive forward or roll back, then `run.finish(...)`), leave it
    open, or `run.abandon()` it when no phase has committed.
    """
    existing = _registry.get(name)
    if existing is not None and existing is not resume:
        raise ValueError(f"operation {name!r} is already registered")
    _registry[name] = resume


def registered_operations() -> dict[str, Callable[[KeyRun], None]]:
    return dict(_registry)


def keys_complete_abandoned(*, limit: int | None = None, budget: float | None = None) -> int:
    """Finish, roll back or re-open keys abandoned mid-way; return how many were settled.

    Abandoned = not finished, lock free or expired, and `last_run_at` older than
    IDEMPOTENCY_ABANDON_AFTER (database clock). Each is taken over with a fresh
    fencing token, so a client retry and the completer never both run it.

    No key is started once `budget` seconds (IDEMPOTENCY_COMPLETER_BUDGET) have
    passed since the run began: each key may make a provider call, and a run
    must end well inside the broker's visibility timeout (docs/celery.md).
    The keys left over are the next run's.
    """
    if not _registry:
        return 0
    limit = limit or int(settings.IDEMPOTENCY_COMPLETER_BATCH)
    budget = float(settings.IDEMPOTENCY_COMPLETER_BUDGET if budget is None else budget)
    deadline = time.monotonic() + budget
    key_ids = list(
        IdempotencyKey.objects.exclude(recovery_point=FINISHED)
        .filter(operation__in=list(_registry))
        .filter(_unlocked_or_expired())
        .filter(last_run_at__lt=_db_ago(float(settings.IDEMPOTENCY_ABANDON_AFTER)))
        .order_by("last_run_at")
        .values_list("pk", flat=True)[:limit]
    )
    settled = 0
    for index, key_id in enumerate(key_ids):
        if time.monotonic() >= deadline:
            logger.info(
                "completer budget spent; %d keys left to the next run", len(key_ids) - index
            )
            break
        run = _key_take_over(key_id=key_id, abandoned=True)
        if run is None:
            continue
        try:
            _registry[run.operation](run)
        except Exception:
            logger.exception("completer could not settle %r; it will try again", run)
            run.unlock_quietly()
            continue
        if not run.closed:
            run.unlock_quietly()
        settled += 1
        logger.info("completer settled %r", run)
    return settled


# --- Purge ------------------------------------------------------------------


def keys_purge(
    *,
    retention: float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
) -> int:
    """Delete finished keys older than the retention, in bounded batches; never an open key."""
    retention = float(settings.IDEMPOTENCY_KEY_RETENTION if retention is None else retention)
    batch_size = batch_size or int(settings.IDEMPOTENCY_PURGE_BATCH)
    max_batches = max_batches or int(settings.IDEMPOTENCY_PURGE_MAX_BATCHES)
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    sql = (
        f"DELETE FROM {table} WHERE id IN ("
        f" SELECT id FROM {table}"
        "  WHERE recovery_point = %s AND finished_at < now() - make_interval(secs => %s)"
        "  ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql, [FINISHED, retention, batch_size])
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch_size:
            break
    return total
