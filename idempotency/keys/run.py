"""The run handle: a keyed operation's atomic phases, fenced by the key's lease token."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Field

from core.db import STATEMENT_CLOCK_SQL
from core.errors import ApplicationError
from core.rows import column

from ..failpoints import failpoint
from ..models import FINISHED, STARTED, IdempotencyKey
from .answers import JSON_CONTENT_TYPE, Answer, answer_for_problem, answer_new
from .errors import KeyLeaseLost

logger = logging.getLogger(__name__)


class Claim(Protocol):
    """What a fresh run is handed to claim its key (idempotency/keys/claim.py::KeyClaim)."""

    def insert(
        self, run: KeyRun, *, recovery_point: str, locked: bool, answer: Answer | None = None
    ) -> int:
        """INSERT the key's row in `run`'s transaction and return its id."""
        ...


class KeyRun:
    """The handle a domain service gets to run one keyed operation in atomic phases.

    `recovery_point` says where to resume ("started" for a fresh run), `data`
    holds the operation's committed references. Declare each phase with
    `with run.phase(next_point=...) as data:`; end with `finish()` (stored,
    replayed forever) or `leave_open()` (answered now, key stays open).

    A fresh run's key row does not exist yet: the first phase runs its claim
    (`Claim.insert`, idempotency/keys/claim.py::KeyClaim) before its effects,
    in its own transaction (so the claim and the first effects commit
    together, and a crash before that commit leaves nothing).
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
        claim: Claim | None = None,
    ) -> None:
        self.key_id = key_id
        self.owner_id = owner_id
        self.key = key
        self.operation = operation
        self.token = token
        self.resumed = resumed
        self._fresh_claim = claim
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
        """True once the run has finished, left the key open, released or dropped its lease."""
        return self._closed

    @property
    def in_phase(self) -> bool:
        return self._in_phase

    @property
    def claimed(self) -> bool:
        """True once the key's row exists (committed by a phase, or taken over)."""
        return self.key_id is not None

    def _claim(self) -> Claim:
        assert self._fresh_claim is not None  # a fresh run carries its key's claim
        return self._fresh_claim

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    @contextlib.contextmanager
    def phase(self, *, next_point: str) -> Iterator[dict[str, Any]]:
        """Run one atomic phase: effects, `next_point` and `data` commit together or not at all.

        Yields a copy of `data` to update. The phase commits only if this run's
        fencing token still holds the key; otherwise it rolls back and raises
        KeyLeaseLost. A fresh run's first phase first claims the key (its
        INSERT, `Claim.insert`; KeyClaimLost if another request holds it).
        Calling finish() or leave_open() inside the phase stores that answer
        in the same transaction (finish() makes the point "finished"). Must be called with
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
                    self.key_id = self._claim().insert(self, recovery_point=STARTED, locked=True)
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
        """Store the final answer, drop the lease; inside a phase, in its transaction."""
        self._close(
            "finish",
            answer_new(status=status, body=body, headers=headers, content_type=content_type),
        )

    def finish_problem(self, exc: ApplicationError) -> None:
        """Store a domain refusal as the final answer (rendered as its problem response)."""
        self._close("finish", answer_for_problem(exc))

    def leave_open(
        self,
        *,
        status: int,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        content_type: str = JSON_CONTENT_TYPE,
    ) -> None:
        """Answer without storing it, drop the lease; a retry resumes at the recovery point."""
        self._close(
            "open",
            answer_new(status=status, body=body, headers=headers, content_type=content_type),
        )

    def _close(self, kind: str, answer: Answer) -> None:
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
                # Nothing ran yet: the key is inserted already finished.
                self.key_id = self._claim().insert(
                    self, recovery_point=point, locked=False, answer=answer
                )
            else:
                self._fenced_update(point=point, data=self._data, kind=kind, answer=answer)
        self._committed(point=point, data=self._data, kind=kind, answer=answer)

    def _fenced_update(
        self, *, point: str, data: dict[str, Any], kind: str | None, answer: Answer | None
    ) -> None:
        """Move the key to `point` with `data` (and any answer) while this run's token holds it.

        One UPDATE whose SQL is written once per process and shape
        (`_fenced_update_sql`): every phase of every keyed request makes it,
        and the ORM compiled it anew each time. The values go through the
        fields' own preparation (`get_db_prep_save`: `data` encoded with its
        field's encoder), the clock is the database's.
        """
        values: dict[str, Any] = {"recovery_point": point, "data": data}
        if kind == "finish":
            assert answer is not None
            values.update(
                response_status=answer.status,
                response_body=answer.body,
                response_headers=answer.headers,
                leased_by=None,
                leased_at=None,
            )
        elif kind == "open":
            values.update(leased_by=None, leased_at=None)
        # Otherwise each committed phase renews the lease (leased_at: the
        # statement's clock): the TTL bounds one phase plus one outside call,
        # not the whole operation.
        assert self.key_id is not None  # only a row inserted by an earlier phase is updated
        alias = router.db_for_write(IdempotencyKey)
        connection = connections[alias]
        sql = _fenced_update_sql(alias, kind)
        params = [
            _field(name).get_db_prep_save(values[name], connection) for name in _FENCED_VALUES[kind]
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, self.key_id, self.token])
            updated = cursor.rowcount
        if updated != 1:
            raise KeyLeaseLost(f"{self!r} lost its lease; its phase is rolled back")

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
                pk=self.key_id, leased_by=self.token, recovery_point=STARTED
            ).delete()
            if deleted != 1:
                raise KeyLeaseLost(f"{self!r} lost its lease")
        self._closed = True

    def drop_lease(self) -> None:
        """Give the key up at its current recovery point, so a retry may resume at once."""
        self._closed = True
        if self.key_id is not None:
            IdempotencyKey.objects.filter(pk=self.key_id, leased_by=self.token).update(
                leased_by=None, leased_at=None
            )

    def drop_lease_quietly(self) -> None:
        """Drop the lease, logging instead of raising (the lease's TTL covers a failure here)."""
        try:
            self.drop_lease()
        except DatabaseError:
            logger.warning("could not drop the lease of %r; it will expire", self, exc_info=True)


# The columns `KeyRun._fenced_update` sets from values, in its order, per kind of phase end.
_FENCED_VALUES: dict[str | None, tuple[str, ...]] = {
    "finish": (
        "recovery_point",
        "data",
        "response_status",
        "response_body",
        "response_headers",
        "leased_by",
        "leased_at",
    ),
    "open": ("recovery_point", "data", "leased_by", "leased_at"),
    None: ("recovery_point", "data"),
}
# ... and those it sets to the statement's clock.
_FENCED_CLOCK: dict[str | None, tuple[str, ...]] = {
    "finish": ("finished_at",),
    "open": (),
    None: ("leased_at",),
}


def _field(name: str) -> Field:
    field = IdempotencyKey._meta.get_field(name)
    assert isinstance(field, Field)
    return field


@functools.cache
def _fenced_update_sql(alias: str, kind: str | None) -> str:
    """The fenced UPDATE of a phase ending as `kind` (finish, open, or None: a phase)."""

    def col(name: str) -> str:
        return column(IdempotencyKey, name, alias=alias)

    assignments = [f"{col(name)} = %s" for name in _FENCED_VALUES[kind]]
    assignments += [f"{col(name)} = {STATEMENT_CLOCK_SQL}" for name in _FENCED_CLOCK[kind]]
    table = connections[alias].ops.quote_name(IdempotencyKey._meta.db_table)
    return (
        f"UPDATE {table} SET {', '.join(assignments)}"  # noqa: S608 - the model's own names
        f" WHERE {col('id')} = %s AND {col('leased_by')} = %s"
    )
