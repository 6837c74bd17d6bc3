"""Keyed operations apart from HTTP: domain results, the caller's presenter, the one registry.

A keyed operation (orders/operations.py, inventory/operations.py) decides a
domain `Result` — an order, a stock item, a refusal; final or still open —
and never builds an answer itself. The caller passes a `present` function
that turns the result into a `Reply` (status, body, headers): the API a JSON
body, a storefront form a 303 redirect, an admin action whatever its page
needs. `close_run()` gives the run that reply **inside the phase that decided
it**, so the stored answer still commits with the effect; `keyed_phase()` is
a phase whose refusals are results too:

    def thing_create_keyed(*, run: KeyRun, present: Presenter, **params) -> None:
        with keyed_phase(run, present, next_point="finished"):
            thing = services.thing_create(**params)
            close_run(run, Result.done(thing), present)

    # the API view                                    # a form view
    thing_create_keyed(run=key.claim(),               thing_create_keyed(run=key.claim(),
        present=presenters.thing_created, ...)            present=thing_redirect, ...)

The completer (a beat task, no caller) must store what the caller would
have, so each operation name is declared once, on the presenter of the
caller that uses it: `@keyed_operation(name, resume=...)` above the
presenter, in the module that defines it (imported by its app's `ready()`).
A key's `operation` column therefore names a (domain operation, caller)
pair: a storefront form placing orders uses its own name (e.g.
`shop.order.create`) declared on its own presenter with the same resume, so
an abandoned form key is completed with the form's redirect, never with the
API's JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from core.errors import ApplicationError

from ..models import STARTED
from .answers import JSON_CONTENT_TYPE
from .claim import UNSTORED_STATUSES
from .run import KeyRun


@dataclass(frozen=True)
class Result:
    """What a keyed operation decided, before any caller turned it into an answer.

    `value` is the domain object (an Order, a StockItem); `refusal` a domain
    refusal (it may come with a value, e.g. the declined order); `final`
    False means not decided yet (the key stays open and a retry resumes).
    """

    value: Any = None
    refusal: ApplicationError | None = None
    final: bool = True

    @classmethod
    def done(cls, value: Any) -> Result:
        return cls(value=value)

    @classmethod
    def pending(cls, value: Any) -> Result:
        return cls(value=value, final=False)

    @classmethod
    def refused(cls, refusal: ApplicationError, *, value: Any = None) -> Result:
        return cls(value=value, refusal=refusal)


@dataclass(frozen=True)
class Reply:
    """An answer as a caller chose it: what `run.finish()` / `run.leave_open()` get.

    `problem` set: the answer is that refusal's problem+json response
    (`run.finish_problem`), exactly as the API's error handler renders it.
    """

    status: int
    body: Any = None
    headers: Mapping[str, str] | None = None
    content_type: str = JSON_CONTENT_TYPE
    problem: ApplicationError | None = None

    @classmethod
    def for_problem(cls, exc: ApplicationError) -> Reply:
        return cls(status=exc.status, problem=exc)


Presenter = Callable[[Result], Reply]
Resume = Callable[[KeyRun, Presenter], None]


def close_run(run: KeyRun, result: Result, present: Presenter) -> None:
    """Give the run the answer `present` makes of `result`: stored if final, else left open.

    Inside a phase the answer commits in that phase's transaction (with the
    effect that decided it); outside, in its own fenced transaction.
    """
    reply = present(result)
    if reply.problem is not None:
        if not result.final:
            raise ValueError("an open result cannot be answered with a stored problem")
        run.finish_problem(reply.problem)
        return
    answer = run.finish if result.final else run.leave_open
    answer(
        status=reply.status,
        body=reply.body,
        headers=reply.headers,
        content_type=reply.content_type,
    )


def _refusal_is_stored(run: KeyRun, exc: ApplicationError) -> bool:
    # The request-key rule (key_run_failed): a domain refusal
    # raised before the first committed phase is the final answer; input-like
    # refusals and 5xx are not stored, nor anything after a committed phase.
    return (
        not run.closed
        and not run.in_phase
        and run.recovery_point == STARTED
        and exc.status < 500
        and exc.status not in UNSTORED_STATUSES
    )


@contextmanager
def refusals_presented(run: KeyRun, present: Presenter) -> Iterator[None]:
    """Answer a refusal raised before any committed phase through the caller's presenter.

    The refusal's phase has rolled back; the answer is stored on its own,
    exactly when the request-key machinery would have stored it. Anything
    else propagates unchanged (and is settled by the machinery).
    """
    try:
        yield
    except ApplicationError as exc:
        if not _refusal_is_stored(run, exc):
            raise
        close_run(run, Result.refused(exc), present)


@contextmanager
def keyed_phase(run: KeyRun, present: Presenter, *, next_point: str) -> Iterator[dict[str, Any]]:
    """One phase of `run` (`run.phase(next_point=...)`) whose refusals are answered by `present`.

    Yields the phase's copy of `data`. A refusal raised before any committed
    phase is stored through the caller's presenter (`refusals_presented`);
    anything else propagates as from `run.phase`.
    """
    with refusals_presented(run, present), run.phase(next_point=next_point) as data:
        yield data


def single_phase_resume(run: KeyRun, present: Presenter) -> None:
    """Forget an abandoned key of a one-phase operation: its one phase stores the answer,
    so an unfinished key committed nothing."""
    if run.recovery_point == STARTED:
        run.abandon()


# --- The registry: each operation name, its resume and its caller's presenter ---------


@dataclass(frozen=True)
class KeyedOperation:
    """A declared operation name: how the completer resumes its keys and renders the result.

    `resume(run, present)` gets a leased KeyRun at the key's recovery point
    and must finish it (drive forward or roll back, then close it with
    `present`'s answer), leave it open, or `run.abandon()` it when no phase
    has committed. `present` is the presenter of the caller using this name,
    so the completer stores the answer that caller would have stored.
    """

    name: str
    resume: Resume
    present: Presenter

    def complete(self, run: KeyRun) -> None:
        """Drive an abandoned key of this operation to its end (the completer)."""
        self.resume(run, self.present)


_operations: dict[str, KeyedOperation] = {}

P = TypeVar("P", bound=Callable[..., Reply])


def keyed_operation(*names: str, resume: Resume = single_phase_resume) -> Callable[[P], P]:
    """Declare operation `names`, answered by the decorated presenter and resumed by `resume`.

    Put it above the caller's presenter, in the module that defines it:

        @keyed_operation(CREATE, resume=order_resume)
        def order_created(result: Result) -> Reply: ...

    `resume` defaults to `single_phase_resume` (one phase: an abandoned key
    committed nothing). Declaring a name again with the same pair is a
    no-op; with another pair it raises ValueError.
    """

    def declare(present: P) -> P:
        for name in names:
            operation = KeyedOperation(name=name, resume=resume, present=present)
            existing = _operations.get(name)
            if existing is not None and existing != operation:
                raise ValueError(f"operation {name!r} is already registered")
            _operations[name] = operation
        return present

    return declare


def registered_operations() -> dict[str, KeyedOperation]:
    """The declared operations by name (a copy)."""
    return dict(_operations)


def registered_presenter(name: str) -> Presenter:
    """Return the presenter declared for operation `name` (KeyError if none)."""
    return _operations[name].present
