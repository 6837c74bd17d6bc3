"""Compensation steps as due work under stalls and crashes: one attempt at a time, fenced.

Finding 3 of issue 20: the flag (`needs_attention`) and the step's `failed`
commit together or not at all, and "Retry failed steps" takes up a step
left flagged but `running` by the old two-transaction flag. Finding 4: no
second attempt begins while the first's lease runs (no second e-mail), and
a stale runner (its lease run out, another attempt begun) writes nothing:
its `step_wait` cannot set a flagged step back to pending. Each guarantee has a
deliberately wrong twin here that shows the bug.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import OperationalError, connection
from django.db.models import F
from django.db.models.functions import Greatest, Now

from core import due
from idempotency.failpoints import hook
from orders.compensation import refund as compensation_refund
from orders.compensation import return_retry_failed_steps, step_run
from orders.compensation import run as compensation_run
from orders.compensation import state as compensation_state
from orders.models import CompensationStep, OrderEvent, ReturnRequest
from orders.states import StepStatus
from payments.models import Refund, RefundStatus
from payments.refunds import refund_run
from tests.concurrency import Workers, wait_for_lock_waiters
from tests.orders.compensation_support import ask_return, drive, receive, shipped_order, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

# The fast backoffs and the captured bell of the compensation tests (autouse there, here too).
from tests.orders.test_compensation import bells  # noqa: E402,F401

TIMEOUT = 20


@pytest.fixture
def received(provider, make_product, shopper_client, staff_client):
    """A shipped order with a received return of one of its two TEE-M (10.00)."""
    make_product("TEE-M", price="10.00", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 2})
    return_id = ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    assert receive(staff_client, return_id).status_code == 202
    return ReturnRequest.objects.get(id=return_id)


def step(ret, name: str) -> CompensationStep:
    return steps_of(order_return=ret).get(name=name)


def make_due(row: CompensationStep) -> None:
    CompensationStep.objects.filter(id=row.id).update(next_attempt_at=Now())


def lease_over(row: CompensationStep) -> None:
    """The running attempt's lease ran out (its runner stalled or died past its worst case)."""
    CompensationStep.objects.filter(id=row.id).update(
        next_attempt_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
    )


def provider_down(_name):
    raise ConnectionError("provider down")


# -- finding 3: the flag and the status in one transaction ----------------------------------------


def test_flag_and_failed_commit_together_when_the_status_write_fails(
    received, settings, monkeypatch
):
    settings.COMPENSATION_MAX_ATTEMPTS = 1
    refund = step(received, "refund")
    real_event = compensation_state.step_event
    broken: list = []

    def event_once_broken(**kwargs):
        # Between the flag and the rest: the database goes away once.
        if kwargs.get("target") == StepStatus.FAILED and not broken:
            broken.append(kwargs)
            raise OperationalError("server closed the connection unexpectedly")
        return real_event(**kwargs)

    monkeypatch.setattr(compensation_state, "step_event", event_once_broken)
    with hook("compensation.refund.before_effect", provider_down):
        make_due(refund)
        with pytest.raises(OperationalError):
            step_run(step_id=refund.id)
        assert broken  # the failure really came between the flag and the status
        row = step(received, "refund")
        # Never flagged while its status says otherwise: both rolled back together.
        assert not (row.needs_attention and row.status != StepStatus.FAILED), row.status
        assert not row.needs_attention and row.attempts == 1
        # So the row is not a dead end: once the failed worker's lease runs out the next
        # attempt finds the budget spent and flags it, failed, with its return.
        lease_over(row)
        assert step_run(step_id=refund.id) == "needs attention"
    row = step(received, "refund")
    assert row.needs_attention and row.status == StepStatus.FAILED
    received.refresh_from_db()
    assert received.status == "needs_attention"
    assert return_retry_failed_steps(return_id=received.id) == 1
    drive(order_return=received)
    received.refresh_from_db()
    assert received.status == "completed"


def test_retry_failed_steps_takes_up_a_step_left_flagged_but_running(received):
    """The state the old two transactions left in live databases: flagged, `running`."""
    refund = step(received, "refund")
    CompensationStep.objects.filter(id=refund.id).update(
        needs_attention=True,
        status=StepStatus.RUNNING,
        attempts=10,
        last_error="attempt budget spent (10 attempts): provider down",
    )
    assert step_run(step_id=refund.id) == "not due"  # nothing else can ever pick it up
    assert return_retry_failed_steps(return_id=received.id) == 1
    row = step(received, "refund")
    assert (row.status, row.needs_attention, row.attempts) == (StepStatus.PENDING, False, 0)
    retry = OrderEvent.objects.get(kind="compensation_retry")
    assert (retry.from_status, retry.to_status) == (StepStatus.RUNNING, StepStatus.PENDING)
    assert return_retry_failed_steps(return_id=received.id) == 0  # a double click
    drive(order_return=received)
    received.refresh_from_db()
    assert received.status == "completed"
    assert Refund.objects.count() == 1


# -- finding 4: one attempt at a time, and a stale runner writes nothing ------------------------


def unfenced_wait(*, step_id, attempt, seconds: float, note: str, ring: bool = True) -> bool:
    """WRONG (the earlier `step_wait`): filtered on `done_at` only, so a stale runner sets a step
    that another attempt flagged for staff back to pending."""
    CompensationStep.objects.filter(id=step_id, done_at__isnull=True).update(
        attempts=Greatest(F("attempts") - 1, 0),
        next_attempt_at=Now() + timedelta(seconds=seconds),
        status=StepStatus.PENDING,
        last_error=note,
        lease_owner="",
        lease_expires_at=None,
    )
    return True


def unfenced_attempt_begin(model, *, pk, values=None):
    """WRONG (the earlier `attempt_begin`): the attempt's only lease is its backoff."""
    row = model.objects.filter(pk=pk).values("attempts").first()
    number = row["attempts"] + 1
    taken = (
        model.objects.filter(pk=pk, attempts=row["attempts"], next_attempt_at__lte=Now())
        .pending()
        .update(attempts=number, next_attempt_at=Now() + timedelta(seconds=1), **(values or {}))
    )
    return due.Attempt(number=number, pk=pk) if taken else due.Attempt()


class Stall:
    """Make the worker thread that reaches failpoint `name` stall there until released."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stalled = threading.Event()
        self.release = threading.Event()

    def __call__(self, _name: str) -> None:
        if threading.current_thread() is threading.main_thread():
            return  # the second runner (this test's thread) goes on
        self.stalled.set()
        assert self.release.wait(TIMEOUT)


def _stale_refund_runner(received):
    """Runner a (a thread) stalls inside the refund step after requesting the refund; the
    provider refuses it meanwhile; a's lease runs out and runner b (this thread) takes the next
    attempt and flags the step for staff; then a goes on with what it saw (pending)."""
    refund = step(received, "refund")
    stall = Stall("compensation.refund.after_effect")
    workers = Workers()
    with hook(stall.name, stall):
        make_due(refund)
        workers.start(step_run, step_id=refund.id)
        assert stall.stalled.wait(TIMEOUT)
        a_attempt = step(received, "refund").attempts
        Refund.objects.filter(id=compensation_refund.return_refund_id(received.id)).update(
            status="needs_attention", needs_attention=True, last_error="declined"
        )
        lease_over(refund)
        b = step_run(step_id=refund.id)  # a is still in its attempt: the overlap
        assert (b, step(received, "refund").attempts) == ("needs attention", a_attempt + 1)
        stall.release.set()
        (a,) = workers.join()
    return a, step(received, "refund")


def test_a_stale_runners_wait_cannot_set_a_flagged_step_back_to_pending(received):
    _, row = _stale_refund_runner(received)
    # a's `step_wait` had row count 0 (fenced): it stopped quietly, the step stays failed.
    assert row.status == StepStatus.FAILED and row.needs_attention
    received.refresh_from_db()
    assert received.status == "needs_attention"


def test_wrong_twin_unfenced_wait_sets_the_flagged_step_back_to_pending(received, monkeypatch):
    monkeypatch.setattr(compensation_refund, "step_wait", unfenced_wait)
    a, row = _stale_refund_runner(received)
    assert a == "waiting"
    # Flagged for staff yet `pending`: not failed, so "Retry failed steps" never showed it.
    assert row.needs_attention and row.status == StepStatus.PENDING


def _notify_while_the_first_attempt_runs(received) -> str:
    """Runner a (a thread) sent the e-mail and stalls before its done commits; its backoff is
    over; runner b (this thread) is rung for the same step. Return b's outcome."""
    CompensationStep.objects.filter(order_return=received, name="refund").update(
        status=StepStatus.DONE, done_at=Now()
    )
    notify = step(received, "notify")
    stall = Stall("compensation.notify.after_effect")
    workers = Workers()
    with hook(stall.name, stall):
        make_due(notify)
        workers.start(step_run, step_id=notify.id)
        assert stall.stalled.wait(TIMEOUT)
        assert len(mail.outbox) == 1
        make_due(notify)  # attempt 1's backoff (1-2 s by default) is over
        b = step_run(step_id=notify.id)
        stall.release.set()
        workers.join()
    return b


def test_no_second_attempt_begins_while_the_first_attempts_lease_runs(received):
    assert _notify_while_the_first_attempt_runs(received) == "not due"
    assert len(mail.outbox) == 1
    row = step(received, "notify")
    assert row.done_at is not None and row.attempts == 1


def test_wrong_twin_without_an_attempt_lease_sends_the_email_twice(received, monkeypatch):
    monkeypatch.setattr(due, "attempt_begin", unfenced_attempt_begin)
    assert _notify_while_the_first_attempt_runs(received) == "done"
    assert len(mail.outbox) == 2  # no crash at all, and the shopper got two e-mails


# -- a step waiting for the one before: no polling, and no lost wake-up ---------------------------


def unlocked_held_by_the_step_before(step_row: CompensationStep, attempt) -> str | None:
    """Wrong twin: the look at the step before without the parent's lock (the code before)."""
    before = (
        steps_of(order_return=step_row.order_return_id)
        .filter(name=step_row.after)
        .values("done_at")[0]
    )
    if before["done_at"] is not None:
        return None
    waited = compensation_run.step_wait(
        step_id=step_row.id, attempt=attempt, seconds=60.0, note="w", ring=False
    )
    return "waiting" if waited else "stale"


def _refund_step_done_between_historys_look_and_wait(monkeypatch, rung: list) -> dict:
    """History's runner (thread d) has seen the refund step not done and stalls before it
    waits; the refund step's done transaction (`_finishing`, thread f) runs meanwhile.
    Return d's outcome, whether f had to wait for a lock d held, history's row, its rings."""
    looked, release = threading.Event(), threading.Event()
    wait = compensation_run.step_wait

    def stall_then_wait(**kwargs):
        looked.set()
        assert release.wait(TIMEOUT)
        return wait(**kwargs)

    monkeypatch.setattr(compensation_run, "step_wait", stall_then_wait)
    ret = ReturnRequest.objects.get()
    refund_step, history = step(ret, "refund"), step(ret, "history")
    make_due(history)
    rung.clear()

    def finish_refund_step() -> bool:
        with connection.cursor() as cursor:
            # The wait for history's lock lasts as long as this test makes it (the
            # main thread's join and poll, then history's wait), however slow the
            # machine: the session's 15 s bound (DB_LOCK_TIMEOUT) is not under test.
            cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{TIMEOUT * 3}s"])
        with compensation_state.finishing(refund_step) as won:
            return won

    running, finishing = Workers(), Workers()
    running.start(step_run, step_id=history.id)
    assert looked.wait(TIMEOUT)
    thread = finishing.start(finish_refund_step)
    thread.join(3)  # done at once unless it waits for a lock history's runner holds
    f_waited = thread.is_alive()
    if f_waited:
        wait_for_lock_waiters(1, timeout=TIMEOUT)  # the overlap: f waits for d's lock
    release.set()
    (outcome,) = running.join()
    assert finishing.join() == [True]
    with connection.cursor() as cursor:
        cursor.execute("SELECT next_attempt_at <= now() FROM orders_compensationstep"
                       " WHERE id = %s", [history.id])  # fmt: skip
        due_now = cursor.fetchone()[0]
    return {"outcome": outcome, "f_waited": f_waited, "due_now": due_now,
            "rung": [history.id] in rung}  # fmt: skip


def _finish_the_refund_step(ret) -> None:
    """Play the worker for the refund step (and its refund) only, until it is done."""
    refund_step = step(ret, "refund")
    for _ in range(10):
        make_due(refund_step)
        step_run(step_id=refund_step.id)
        for refund in Refund.objects.filter(status=RefundStatus.PENDING):
            Refund.objects.filter(id=refund.id).update(next_attempt_at=Now())
            refund_run(refund_id=refund.id)
        if step(ret, "refund").done_at is not None:
            return
    raise AssertionError(step(ret, "refund").last_error)


def test_a_waiting_step_is_not_polled_and_the_step_before_wakes_it(received, bells, provider):  # noqa: F811
    history = step(received, "history")
    make_due(history)
    bells.clear()
    assert step_run(step_id=history.id) == "waiting"
    history.refresh_from_db()
    assert bells == []  # no ring for later: nothing looks again every few seconds
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s - now()", [history.next_attempt_at])
        assert cursor.fetchone()[0] > timedelta(seconds=50)  # COMPENSATION_AFTER_RECHECK
    _finish_the_refund_step(received)
    history.refresh_from_db()
    assert history.done_at is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s <= now()", [history.next_attempt_at])
        assert cursor.fetchone()[0]  # the refund step's done made it due now ...
    assert [history.id] in bells  # ... and rang it


def test_a_step_before_done_while_its_dependent_looks_wakes_it(received, monkeypatch, bells):  # noqa: F811
    seen = _refund_step_done_between_historys_look_and_wait(monkeypatch, bells)
    # The done transaction waited for the parent's lock until history's wait had
    # committed, then made history due now and rang it.
    assert seen == {"outcome": "waiting", "f_waited": True, "due_now": True, "rung": True}


def test_wrong_twin_an_unlocked_look_loses_the_wake_up(received, monkeypatch, bells):  # noqa: F811
    monkeypatch.setattr(
        compensation_run, "_held_by_the_step_before", unlocked_held_by_the_step_before
    )
    seen = _refund_step_done_between_historys_look_and_wait(monkeypatch, bells)
    # The done transaction committed in between and made history due and rang it; then
    # the wait pushed history back a whole re-check, though nothing holds it any more,
    # and that ring finds it not due.
    assert seen == {"outcome": "waiting", "f_waited": False, "due_now": False, "rung": True}
    assert step_run(step_id=step(received, "history").id) == "not due"
