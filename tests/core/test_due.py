"""The one due-work mechanism (core.due), once, generically, on a real PostgreSQL.

A tiny kind of due work (`tests.support.models.DueChore`, test-only) is
driven through claim, lease expiry, failure, backoff (judged by the database
clock), the attempt budget, needs attention, the admin's "retry now" and
done. The race tests release two claimers with a barrier: the real claim
never hands one row to both; deliberately wrong twins (check-then-act, no
lease, no SKIP LOCKED) are shown to double-claim or to wait.
"""

from __future__ import annotations

import random
import threading
from datetime import timedelta

import pytest
from celery import current_app
from django.apps import apps
from django.db import OperationalError, connection, transaction
from django.db.models.functions import Now

from core import due
from core.due import DueWork
from tests.concurrency import Workers
from tests.support.models import DueChore
from tests.support.tasks import work_chore

BARRIER_TIMEOUT = 20


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def make_due(chore: DueChore) -> None:
    DueChore.objects.filter(pk=chore.pk).update(next_attempt_at=Now())


@pytest.fixture
def rang(monkeypatch):
    """Record the doorbell instead of sending to the broker."""
    calls: list[tuple[str, list]] = []

    def send_task(name, args=None, **options):
        calls.append((name, list(args or [])))

    monkeypatch.setattr(current_app, "send_task", send_task)
    return calls


@pytest.fixture
def staff_client(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


# -- backoff -------------------------------------------------------------------------------


def test_backoff_doubles_is_capped_and_has_equal_jitter(monkeypatch):
    for attempt, ceiling in [(1, 10), (2, 20), (3, 40), (4, 60), (200, 60)]:
        delays = {due.backoff(attempt, base=10, cap=60) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempt, delays)
        assert len(delays) > 1  # jitter
    monkeypatch.setattr(random, "uniform", lambda a, b: b)
    assert due.backoff(10**6, base=1, cap=300) == 300  # no overflow, the cap holds


def test_a_countdown_plus_the_hard_limit_stays_below_the_visibility_timeout(settings):
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert due.countdown(10**9) == settings.CELERY_MAX_COUNTDOWN
    assert due.countdown(-5) == 0
    # Even a careless CELERY_MAX_COUNTDOWN cannot push countdown + run past it.
    settings.CELERY_MAX_COUNTDOWN = 10**6
    assert due.countdown(10**9) + settings.CELERY_TASK_TIME_LIMIT < visibility
    for retries in range(200):
        assert due.retry_countdown(retries) + settings.CELERY_TASK_TIME_LIMIT < visibility


# -- one row through its whole life ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_due_row_through_claim_failure_backoff_budget_and_admin_retry(staff_client, rang):
    chore = DueChore.objects.create(label="fail")  # next_attempt_at = the database's now()

    # Claim: leased to its owner until now() + the policy's lease.
    assert due.lease_due(DueChore, owner="sweeper-a") == [chore.pk]
    chore.refresh_from_db()
    assert chore.lease_owner == "sweeper-a"
    assert timedelta(seconds=25) < chore.lease_expires_at - db_now() <= timedelta(seconds=30)
    assert due.lease_due(DueChore) == []  # leased: the next sweep skips it
    # An expired lease (database clock) makes the row claimable again.
    DueChore.objects.filter(pk=chore.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert due.lease_due(DueChore, owner="sweeper-b") == [chore.pk]

    # Attempt 1 fails: counted, the next attempt pushed back by the backoff, lease freed.
    assert work_chore.apply(args=[chore.pk]).get() == "failed"
    chore.refresh_from_db()
    assert (chore.attempts, chore.last_error, chore.needs_attention) == (1, "chore failed", False)
    assert (chore.lease_owner, chore.lease_expires_at) == ("", None)
    # Attempt 1 waits between 5 and 10 s (base 10, equal jitter) past the database's now().
    assert timedelta(seconds=4) < chore.next_attempt_at - db_now() <= timedelta(seconds=10)
    # Not due yet: no claim, and a stray message (redelivery, bell) takes no attempt.
    assert due.lease_due(DueChore) == []
    assert work_chore.apply(args=[chore.pk]).get() == "not due"
    assert DueChore.objects.get(pk=chore.pk).attempts == 1

    # Attempts 2 and 3 fail too: the budget (3) is spent, the row needs attention.
    for attempt in (2, 3):
        make_due(chore)
        assert work_chore.apply(args=[chore.pk]).get() == "failed"
        assert DueChore.objects.get(pk=chore.pk).attempts == attempt
    chore.refresh_from_db()
    assert chore.attempts == 3 and chore.needs_attention
    assert "attempt budget spent (3 attempts)" in chore.last_error
    assert "chore failed" in chore.last_error
    make_due(chore)
    assert due.lease_due(DueChore) == []  # staff decide now
    assert work_chore.apply(args=[chore.pk]).get() == "not due"
    assert DueChore.objects.get(pk=chore.pk).attempts == 3
    assert rang == []

    # The admin's "retry now": fresh budget, due now, the bell rung by id after commit.
    response = staff_client.post(
        "/admin/testsupport/duechore/", {"action": "retry_now", "_selected_action": [chore.pk]}
    )
    assert response.status_code == 302
    chore.refresh_from_db()
    assert (chore.needs_attention, chore.attempts) == (False, 0)
    assert chore.next_attempt_at <= db_now()
    assert rang == [("testsupport.work_chore", [chore.pk])]

    # Done: never due again.
    DueChore.objects.filter(pk=chore.pk).update(label="ok")
    assert work_chore.apply(args=[chore.pk]).get() == "done"
    chore.refresh_from_db()
    assert chore.done_at is not None and chore.attempts == 1
    make_due(chore)
    assert due.lease_due(DueChore) == []
    assert due.retry_now(DueChore, pk=chore.pk) is False  # a done row stays done
    assert work_chore.apply(args=[chore.pk]).get() == "not due"


@pytest.mark.django_db(transaction=True)
def test_sweep_enqueues_each_due_id_once(monkeypatch):
    chores = [DueChore.objects.create(label=f"c{i}") for i in range(3)]
    DueChore.objects.filter(pk=chores[2].pk).update(next_attempt_at=Now() + timedelta(hours=1))
    enqueued = []
    monkeypatch.setattr(work_chore, "delay", lambda pk: enqueued.append(pk))
    assert due.sweep(DueChore) == [chores[0].pk, chores[1].pk]
    assert due.sweep(DueChore) == []  # leased
    assert enqueued == [chores[0].pk, chores[1].pk]


@pytest.mark.django_db(transaction=True)
def test_the_bell_rings_only_after_commit_and_a_broker_outage_loses_nothing(rang, monkeypatch):
    chore = DueChore.objects.create(label="ok")
    with transaction.atomic():
        due.ring_after_commit(DueChore, chore.pk, delay=10**6)
        assert rang == []  # nothing leaves before the commit
    assert rang == [("testsupport.work_chore", [chore.pk])]

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(current_app, "send_task", broker_down)
    due.ring(DueChore, chore.pk)  # logged, not raised: the row is still due
    assert due.lease_due(DueChore) == [chore.pk]


def test_every_due_work_kind_is_indexed_and_has_a_policy():
    """A new kind plugs in by inheriting DueWork, defining due_policy() and due_index()."""
    # A proxy (the admin's DeadLetter list of deliveries) shares its table's indexes.
    kinds = [m for m in apps.get_models() if issubclass(m, DueWork) and not m._meta.proxy]
    assert {m._meta.label for m in kinds} >= {
        "payments.PaymentSettlement",
        "payments.Refund",
        "idempotency.OutboxMessage",
        "idempotency.Delivery",
        "testsupport.DueChore",
    }
    current_app.loader.import_default_modules()
    for model in kinds:
        policy = model.due_policy()
        assert policy.max_attempts > 0 and policy.lease > 0, model
        assert policy.task is None or policy.task in current_app.tasks, model
        conditions = {str(index.condition) for index in model._meta.indexes if index.condition}
        assert str(due.due_index(name="x").condition) in conditions, model


# -- races: two claimers released together ------------------------------------------------------


def _claim_together(claim, *, rows: int = 10) -> tuple[list, list]:
    """Two threads (own connections) released by a barrier each claim; return both results."""
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT)
    workers = Workers()
    for name in ("a", "b"):
        workers.start(lambda n=name: (n, claim(barrier, owner=n)))
    results = dict(workers.join())
    return results["a"], results["b"]


def real_claim(barrier, *, owner):
    barrier.wait()
    return due.lease_due(DueChore, owner=owner)


def check_then_act_twin(barrier, *, owner):
    """WRONG: read the due rows, then lease them by id — both readers lease the same rows."""
    due_ids = list(DueChore.objects.due().order_by("pk").values_list("pk", flat=True))
    barrier.wait()  # both have checked; now both act
    DueChore.objects.filter(pk__in=due_ids).update(
        lease_owner=owner, lease_expires_at=Now() + timedelta(seconds=30)
    )
    return due_ids


def no_lease_twin(barrier, *, owner):
    """WRONG: FOR UPDATE SKIP LOCKED but no lease: the locks end with the claim's transaction,
    while the work runs later (a queued task), so the next claimer takes the same rows."""
    if owner == "b":
        barrier.wait()  # b claims after a's claim committed (its task still queued)
    with transaction.atomic():
        ids = list(
            DueChore.objects.select_for_update(skip_locked=True)
            .due()
            .order_by("pk")
            .values_list("pk", flat=True)
        )
    if owner == "a":
        barrier.wait()
    return ids


@pytest.mark.django_db(transaction=True)
def test_two_claimers_released_together_never_claim_the_same_row():
    for _ in range(5):
        DueChore.objects.all().delete()
        chores = {DueChore.objects.create(label=f"c{i}").pk for i in range(10)}
        a, b = _claim_together(real_claim)
        assert not set(a) & set(b)
        assert set(a) | set(b) == chores
        assert due.lease_due(DueChore) == []


@pytest.mark.django_db(transaction=True)
def test_a_claimer_skips_rows_another_claimer_holds_instead_of_waiting():
    chores = {DueChore.objects.create(label=f"c{i}").pk for i in range(10)}
    held = threading.Event()
    release = threading.Event()
    workers = Workers()

    def first():
        with transaction.atomic():
            ids = due.lease_due(DueChore, limit=5, owner="a")
            held.set()  # a's row locks are held (uncommitted) until release
            assert release.wait(BARRIER_TIMEOUT)
        return ids

    workers.start(first)
    assert held.wait(BARRIER_TIMEOUT)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")  # waiting would fail here
    try:
        second = due.lease_due(DueChore, owner="b")
    finally:
        release.set()
    (first_ids,) = workers.join()
    assert len(first_ids) == 5 and len(second) == 5
    assert set(first_ids) | set(second) == chores


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_check_then_act_double_claims():
    chores = {DueChore.objects.create(label=f"c{i}").pk for i in range(10)}
    a, b = _claim_together(check_then_act_twin)
    assert set(a) == set(b) == chores  # every row handed out twice


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_without_a_lease_double_claims():
    chores = {DueChore.objects.create(label=f"c{i}").pk for i in range(10)}
    a, b = _claim_together(no_lease_twin)
    assert set(a) == set(b) == chores


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_without_skip_locked_waits_for_the_other_claimer():
    DueChore.objects.create(label="c")
    held = threading.Event()
    release = threading.Event()
    workers = Workers()

    def first():
        with transaction.atomic():
            due.lease_due(DueChore, owner="a")
            held.set()
            assert release.wait(BARRIER_TIMEOUT)

    workers.start(first)
    assert held.wait(BARRIER_TIMEOUT)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '500ms'")
            with pytest.raises(OperationalError, match="lock timeout"):
                list(DueChore.objects.select_for_update().values_list("pk", flat=True))
    finally:
        release.set()
    workers.join()
