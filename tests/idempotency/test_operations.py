"""idempotency.operations: results, the caller's presenter, the completer's registry."""

from __future__ import annotations

import pytest

from core.errors import ApplicationError
from idempotency import keys, operations
from idempotency.operations import (
    Reply,
    Result,
    close_run,
    refusals_presented,
    register_operation,
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


def present(result: Result) -> Reply:
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=200 if result.final else 202, body={"v": result.value})


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(keys.registry, "_registry", {})
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


def test_single_phase_resume_forgets_only_an_unstarted_key():
    run = FakeRun()
    single_phase_resume(run, present)
    assert run.calls == [("abandon",)]
    later = FakeRun(recovery_point="adjusted")
    single_phase_resume(later, present)
    assert later.calls == []


def test_register_operation_wires_the_completer_with_the_presenter(registry):
    seen = []

    def resume(run, present_with):
        seen.append((run, present_with))

    register_operation("test.op", resume=resume, present=present)
    register_operation("test.op", resume=resume, present=present)  # the same pair: fine
    with pytest.raises(ValueError):
        register_operation("test.op", resume=resume, present=lambda result: None)
    assert operations.registered_presenter("test.op") is present
    run = FakeRun()
    keys.registered_operations()["test.op"](run)
    assert seen == [(run, present)]
