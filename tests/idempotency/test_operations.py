"""idempotency.keys.operations: results, the caller's presenter, the one registry."""

from __future__ import annotations

import contextlib

import pytest

from core.errors import ApplicationError
from idempotency import keys
from idempotency.keys import (
    Reply,
    Result,
    close_run,
    keyed_operation,
    keyed_phase,
    operations,
    refusals_presented,
    single_phase_resume,
)


class Refused(ApplicationError):
    status = 409
    code = "refused"
    title = "Refused"


class Invalid(ApplicationError):
    status = 400
    code = "invalid_request"
    title = "Invalid"


class FakeRun:
    """Records what an operation asked of its run."""

    operation = "test.op"

    def __init__(self, *, recovery_point: str = "started") -> None:
        self.recovery_point = recovery_point
        self.closed = False
        self.in_phase = False
        self.calls: list[tuple] = []

    def finish(self, **answer) -> None:
        self.calls.append(("finish", answer))
        self.closed = True

    def leave_open(self, **answer) -> None:
        self.calls.append(("open", answer))
        self.closed = True

    def finish_problem(self, exc) -> None:
        self.calls.append(("problem", exc))
        self.closed = True

    def abandon(self) -> None:
        self.calls.append(("abandon",))
        self.closed = True

    @contextlib.contextmanager
    def phase(self, *, next_point: str):
        self.calls.append(("phase", next_point))
        yield {"point": self.recovery_point}


def present(result: Result) -> Reply:
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=200 if result.final else 202, body={"v": result.value})


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(operations, "_operations", {})


def test_settle_stores_a_final_result_and_leaves_an_open_one_open():
    run = FakeRun()
    close_run(run, Result.done(1), present)
    pending = FakeRun()
    close_run(pending, Result.pending(2), present)
    expected = {"headers": None, "content_type": "application/json"}
    assert run.calls == [("finish", {"status": 200, "body": {"v": 1}, **expected})]
    assert pending.calls == [("open", {"status": 202, "body": {"v": 2}, **expected})]


def test_settle_renders_a_refusal_as_its_problem_and_never_leaves_it_open():
    run = FakeRun()
    refusal = Refused("no")
    close_run(run, Result.refused(refusal), present)
    assert run.calls == [("problem", refusal)]
    with pytest.raises(ValueError):
        close_run(FakeRun(), Result(refusal=refusal, final=False), present)


def test_refusals_before_any_phase_are_presented_others_propagate():
    run = FakeRun()
    with refusals_presented(run, present):
        raise Refused("no")
    assert [call[0] for call in run.calls] == ["problem"]

    for raised, at in [(Invalid("bad"), "started"), (Refused("no"), "reserved")]:
        other = FakeRun(recovery_point=at)
        with pytest.raises(type(raised)), refusals_presented(other, present):
            raise raised
        assert other.calls == []


def test_keyed_phase_is_the_phase_with_its_refusals_presented():
    run = FakeRun()
    with keyed_phase(run, present, next_point="done") as data:
        close_run(run, Result.done(data["point"]), present)
    assert [call[0] for call in run.calls] == ["phase", "finish"]

    refused = FakeRun()
    with keyed_phase(refused, present, next_point="done"):
        raise Refused("no")
    assert [call[0] for call in refused.calls] == ["phase", "problem"]

    later = FakeRun(recovery_point="reserved")
    with pytest.raises(Refused), keyed_phase(later, present, next_point="done"):
        raise Refused("no")
    assert later.calls == [("phase", "done")]


def test_single_phase_resume_forgets_only_an_unstarted_key():
    run = FakeRun()
    single_phase_resume(run, present)
    assert run.calls == [("abandon",)]
    later = FakeRun(recovery_point="adjusted")
    single_phase_resume(later, present)
    assert later.calls == []


def test_keyed_operation_wires_the_completer_with_the_presenter(registry):
    seen = []

    def resume(run, present_with):
        seen.append((run, present_with))

    assert keyed_operation("test.op", resume=resume)(present) is present
    keyed_operation("test.op", resume=resume)(present)  # the same pair: fine
    with pytest.raises(ValueError):
        keyed_operation("test.op", resume=resume)(lambda result: None)
    assert operations.registered_presenter("test.op") is present
    run = FakeRun()
    keys.registered_operations()["test.op"].complete(run)
    assert seen == [(run, present)]
    keyed_operation("test.other")(present)
    assert keys.registered_operations()["test.other"].resume is single_phase_resume
