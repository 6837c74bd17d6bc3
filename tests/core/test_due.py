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
import time
from datetime import timedelta

import pytest
from celery import current_app
from django.apps import apps
from django.db import OperationalError, connection, transaction
from django.db.models.functions import Now

from core import due
from core.db import database_now
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


def unleased_ring_after_commit(model, pk) -> None:
    """Wrong twin: the bell after commit without the ring's lease (the code before)."""
    transaction.on_commit(lambda: current_app.send_task(model.due_policy().task, args=[pk]))


def _rings_of_one_row(ring_after_commit, monkeypatch, rang) -> int:
    """Write a due row and ring for it at commit, then sweep three times: how often it rang."""
    swept = []
    monkeypatch.setattr(work_chore, "delay", lambda pk: swept.append(pk))
    with transaction.atomic():
        chore = DueChore.objects.create(label="rung")
        ring_after_commit(DueChore, chore.pk)
    for _ in range(3):
        due.sweep(DueChore)
    assert [args for _, args in rang] == [[chore.pk]]
    return len(rang) + len(swept)


@pytest.mark.django_db(transaction=True)
def test_a_row_rung_at_commit_is_not_rung_again_by_a_sweep_while_its_ring_is_on_its_way(
    rang, monkeypatch
):
    # Without the ring's lease every sweep rings the row again while its first ring
    # waits behind a backlog, and the broker fills with copies of the same rows.
    assert _rings_of_one_row(due.ring_after_commit, monkeypatch, rang) == 1


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_a_ring_without_its_lease_is_rung_again_by_the_next_sweep(rang, monkeypatch):
    assert _rings_of_one_row(unleased_ring_after_commit, monkeypatch, rang) == 2


@pytest.mark.django_db(transaction=True)
def test_a_ring_that_was_lost_is_rung_by_the_sweep_once_its_lease_runs_out(rang, monkeypatch):
    with transaction.atomic():
        chore = DueChore.objects.create(label="lost")
        due.ring_after_commit(DueChore, chore.pk)
    assert due.lease_due(DueChore) == []
    DueChore.objects.filter(pk=chore.pk).update(lease_expires_at=Now())  # the lease ran out
    assert due.lease_due(DueChore) == [chore.pk]


@pytest.mark.django_db(transaction=True)
def test_a_ring_for_later_leases_the_row_past_its_due_time_and_an_attempt_takes_it_over(rang):
    chore = DueChore.objects.create(label="later")
    DueChore.objects.filter(pk=chore.pk).update(next_attempt_at=Now() + timedelta(seconds=60))
    due.ring(DueChore, chore.pk, delay=60)
    chore.refresh_from_db()
    lease = DueChore.due_policy().lease
    assert chore.lease_owner.startswith(due.RING_OWNER_PREFIX)
    assert chore.lease_expires_at >= chore.next_attempt_at + timedelta(seconds=lease - 1)
    make_due(chore)  # its time comes: the ring arrives, and its attempt is not refused
    assert due.attempt_begin(DueChore, pk=chore.pk).taken


@pytest.mark.django_db(transaction=True)
def test_a_ring_is_not_leased_over_a_running_attempt(rang):
    chore = DueChore.objects.create(label="running")
    attempt = due.attempt_begin(DueChore, pk=chore.pk)
    with transaction.atomic():
        due.ring_after_commit(DueChore, chore.pk)
    chore.refresh_from_db()
    assert chore.lease_owner == attempt.token  # still the attempt's: its fence holds


@pytest.mark.django_db(transaction=True)
def test_a_failed_ring_pauses_this_processs_rings(monkeypatch, settings):
    # A hung broker makes each ring wait its socket timeout; without the pause
    # every request waited in turn and a host's web threads all filled (the
    # chaos run's redis_hang). After one failure the rings stop for a while;
    # the rows stay due for their sweepers.
    settings.BROKER_RING_PAUSE = 30.0
    chore = DueChore.objects.create(label="ok")
    calls = []

    def broker_hung(*args, **kwargs):
        calls.append(args)
        raise TimeoutError("the broker did not answer")

    monkeypatch.setattr(current_app, "send_task", broker_hung)
    for _ in range(5):
        due.ring(DueChore, chore.pk)
    assert len(calls) == 1  # one wait, then no more
    assert due.lease_due(DueChore) == [chore.pk]  # the row is still there for the sweeper

    # The pause ends: the next ring tries the broker again.
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 31)
    due.ring(DueChore, chore.pk)
    assert len(calls) == 2


# -- the sweep's back-pressure: a long queue gets no more rings ----------------------------------


@pytest.fixture
def maintenance_queue(settings):
    """The real Redis broker's queue DueChore's task is routed to, emptied before and after."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = due.queue_of("testsupport.work_chore")
    client.delete(queue)
    yield client, queue
    client.delete(queue)
    client.close()


def sweep_ignoring_the_queue(model, *, limit: int) -> list:
    """Wrong twin: the sweep before `sweep_room`, which rang a full batch whatever waited."""
    ids = due.lease_due(model, limit=limit)
    for pk in ids:
        work_chore.delay(pk)
    return ids


def _rings_waiting_after_their_leases_ran_out(sweep, client, queue) -> list[int]:
    """Ten due rows and no worker: sweep, let every ring's lease run out while the ring
    still waits in the queue (a backlog longer than the lease), three times over;
    return the queue's length after each sweep."""
    for i in range(10):
        DueChore.objects.create(label=f"backlog {i}")
    lengths = []
    for _ in range(3):
        sweep(DueChore, limit=4)
        lengths.append(client.llen(queue))
        DueChore.objects.update(lease_expires_at=Now())  # the rings' leases ran out
    return lengths


@pytest.mark.django_db(transaction=True)
def test_a_sweep_tops_its_queue_up_to_one_batch_and_rings_no_more_while_it_waits(
    maintenance_queue,
):
    # A ring that waits in the queue longer than its lease is rung again by every
    # sweep: without the room check a backlog multiplies itself (docs/due-work.md).
    client, queue = maintenance_queue
    assert _rings_waiting_after_their_leases_ran_out(due.sweep, client, queue) == [4, 4, 4]
    assert due.sweep_room("testsupport.work_chore", limit=4) == 0
    # A worker takes three: the next sweep tops the queue up with three rows.
    for _ in range(3):
        client.rpop(queue)
    assert len(due.sweep(DueChore, limit=4)) == 3
    assert client.llen(queue) == 4
    # The broker restarts empty: every ring was lost, the next sweep has the whole batch.
    client.delete(queue)
    DueChore.objects.update(lease_expires_at=Now())
    assert len(due.sweep(DueChore, limit=4)) == 4


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_a_sweep_that_ignores_its_queue_rings_the_same_rows_again_and_again(
    maintenance_queue,
):
    client, queue = maintenance_queue
    lengths = _rings_waiting_after_their_leases_ran_out(sweep_ignoring_the_queue, client, queue)
    assert lengths == [4, 8, 12]  # one more ring per row per lease, without bound


def test_a_broker_that_is_down_or_hung_leaves_the_sweep_its_whole_batch(monkeypatch, settings):
    from tests.backoffice.test_health import _closed_port
    from tests.support.blackhole import blackhole

    settings.BROKER_PUBLISH_TIMEOUT = 0.5
    down = f"redis://127.0.0.1:{_closed_port()}/0"
    monkeypatch.setattr(current_app.conf, "broker_write_url", down)
    assert due.queued("testsupport.work_chore") is None
    assert due.sweep_room("testsupport.work_chore", limit=7) == 7
    with blackhole() as port:  # connects, never answers: bounded by the timeout
        monkeypatch.setattr(current_app.conf, "broker_write_url", f"redis://127.0.0.1:{port}/0")
        started = time.monotonic()
        assert due.queued("testsupport.work_chore") is None
        assert time.monotonic() - started < 2.5


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
        assert policy.attempt_lease_seconds > 0, model
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


# -- one attempt at a time: the attempt's lease and its fencing token ----------------------------


def unfenced_attempt_begin(model, *, pk):
    """WRONG (the earlier attempt_begin): the attempt's only lease is its backoff, so once the
    backoff is over a second runner begins while the first can still be running."""
    row = model.objects.filter(pk=pk).values("attempts").first()
    number = row["attempts"] + 1
    taken = (
        model.objects.filter(pk=pk, attempts=row["attempts"], next_attempt_at__lte=Now())
        .pending()
        .update(attempts=number, next_attempt_at=Now() + timedelta(seconds=1))
    )
    return due.Attempt(number=number) if taken else due.Attempt()


def unfenced_attempt_failed(model, *, pk, error):
    """WRONG (the earlier attempt_failed): conditional on nothing the attempt holds, so a stale
    runner frees the running attempt's lease and records its error over it."""
    model.objects.filter(pk=pk).pending().update(
        last_error=error, lease_owner="", lease_expires_at=None
    )


def backoff_over(chore: DueChore) -> None:
    """The attempt's backoff is over (database clock); its lease is not touched."""
    DueChore.objects.filter(pk=chore.pk).update(next_attempt_at=Now() - timedelta(seconds=1))


def lease_over(chore: DueChore) -> None:
    """The attempt's lease ran out (its runner stalled past its worst case)."""
    DueChore.objects.filter(pk=chore.pk).update(
        next_attempt_at=Now() - timedelta(seconds=1), lease_expires_at=Now() - timedelta(seconds=1)
    )


@pytest.mark.django_db(transaction=True)
def test_a_second_attempt_is_not_begun_while_the_first_attempts_lease_runs():
    chore = DueChore.objects.create(label="ok")
    # Rung by the bell (no sweeper lease): attempt_begin takes the attempt's own lease.
    first = due.attempt_begin(DueChore, pk=chore.pk)
    assert first.taken and first.number == 1
    # The backoff is over, the first attempt may still be running: no sweep, no second attempt.
    backoff_over(chore)
    assert due.lease_due(DueChore) == []
    assert not due.attempt_begin(DueChore, pk=chore.pk).taken
    chore.refresh_from_db()
    assert chore.attempts == 1 and chore.lease_owner == first.token != ""
    left = chore.lease_expires_at - db_now()
    assert timedelta(seconds=15) < left <= timedelta(seconds=20)  # DueChore's attempt_lease
    # Once the lease has run out (database clock) the row is due: swept, attempt 2 taken over
    # the sweeper's lease (the sweeper's own task must be able to begin it).
    lease_over(chore)
    assert due.lease_due(DueChore, owner="sweeper") == [chore.pk]
    second = due.attempt_begin(DueChore, pk=chore.pk)
    assert second.number == 2 and second.token != first.token
    assert DueChore.objects.get(pk=chore.pk).lease_owner == second.token


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_without_an_attempt_lease_begins_a_second_attempt():
    chore = DueChore.objects.create(label="ok")
    assert unfenced_attempt_begin(DueChore, pk=chore.pk).taken
    backoff_over(chore)  # 1-2 s at attempt 1: shorter than a provider call and its look-up
    assert unfenced_attempt_begin(DueChore, pk=chore.pk).number == 2  # both now running


@pytest.mark.django_db(transaction=True)
def test_the_last_attempt_still_running_is_not_flagged_by_a_stray_bell():
    chore = DueChore.objects.create(label="ok")
    DueChore.objects.filter(pk=chore.pk).update(attempts=2)
    last = due.attempt_begin(DueChore, pk=chore.pk)
    assert last.number == 3  # the budget's last attempt, running
    backoff_over(chore)
    assert due.attempt_begin(DueChore, pk=chore.pk) == due.Attempt()  # not "budget spent"
    lease_over(chore)
    assert due.attempt_begin(DueChore, pk=chore.pk).budget_spent


def _stale_and_current(fenced: bool):
    """Runner a takes attempt 1 and stalls past its lease; b takes attempt 2; a barrier then
    releases both to write at once. Return (a's results, b's results)."""
    chore = DueChore.objects.create(label="ok")
    taken = threading.Barrier(2, timeout=BARRIER_TIMEOUT)
    write = threading.Barrier(2, timeout=BARRIER_TIMEOUT)
    begin = due.attempt_begin if fenced else unfenced_attempt_begin
    workers = Workers()

    def a():
        attempt = begin(DueChore, pk=chore.pk)
        taken.wait()  # a holds attempt 1 ... and stalls while b begins
        write.wait()
        if not fenced:
            unfenced_attempt_failed(DueChore, pk=chore.pk, error="a: stale failure")
            return "a", attempt, None
        ended = due.attempt_failed(DueChore, pk=chore.pk, error="a: stale failure", attempt=attempt)
        flagged = due.flag_attention(DueChore, pk=chore.pk, reason="a: stale", attempt=attempt)
        done = due.mark_done(DueChore, pk=chore.pk, attempt=attempt)
        return "a", attempt, (ended, flagged, done)

    def b():
        taken.wait()
        lease_over(chore)  # a stalled past its worst case
        attempt = begin(DueChore, pk=chore.pk)
        assert attempt.number == 2
        write.wait()
        return "b", attempt, None

    workers.start(a)
    workers.start(b)
    results = {name: (attempt, out) for name, attempt, out in workers.join()}
    return chore, results


@pytest.mark.django_db(transaction=True)
def test_two_runners_at_one_row_the_stale_ones_writes_are_refused():
    chore, results = _stale_and_current(fenced=True)
    (a, a_out), (b, _) = results["a"], results["b"]
    assert (a.number, b.number) == (1, 2)  # the overlap: both held an attempt at once
    assert a_out == (due.Ended.REFUSED, False, False)  # row count 0, every write refused
    row = DueChore.objects.get(pk=chore.pk)
    assert row.lease_owner == b.token and row.last_error == "" and not row.needs_attention
    # b's lease still stands: nobody else begins, and b's own writes land.
    backoff_over(chore)
    assert not due.attempt_begin(DueChore, pk=chore.pk).taken
    assert due.mark_done(DueChore, pk=chore.pk, attempt=b)
    assert DueChore.objects.get(pk=chore.pk).done_at is not None


@pytest.mark.django_db(transaction=True)
def test_wrong_twin_unfenced_the_stale_runner_frees_the_running_attempts_lease():
    chore, results = _stale_and_current(fenced=False)
    assert results["b"][0].number == 2
    row = DueChore.objects.get(pk=chore.pk)
    assert row.last_error == "a: stale failure"  # the stale runner's write landed
    # ... and freed b's lease: once b's backoff is over a third attempt begins beside b.
    backoff_over(chore)
    assert due.attempt_begin(DueChore, pk=chore.pk).number == 3


@pytest.mark.django_db(transaction=True)
def test_the_flag_and_the_kinds_status_are_one_update():
    chore = DueChore.objects.create(label="ok")
    DueChore.objects.filter(pk=chore.pk).update(attempts=2)
    attempt = due.attempt_begin(DueChore, pk=chore.pk, values={"label": "running"})
    assert DueChore.objects.get(pk=chore.pk).label == "running"
    ended = due.attempt_failed(
        DueChore,
        pk=chore.pk,
        error="boom",
        attempt=attempt,
        attention_values={"label": "failed"},
        retry_values={"label": "pending"},
    )
    assert ended is due.Ended.ATTENTION and ended  # truthy: the budget is spent
    row = DueChore.objects.get(pk=chore.pk)
    assert (row.needs_attention, row.label, row.lease_owner) == (True, "failed", "")


# -- a task's own retry ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tasks_own_retry_is_timed_by_the_database_clock(monkeypatch):
    """A task retried after a lost connection sends an ETA by the database clock (the
    offset this process last read), never a countdown: Celery turns a countdown into
    an ETA on this host's clock, which the receiving worker judges by its own. Here
    this process's clock runs 5 minutes ahead of the database's."""
    from django.db import OperationalError as DjangoOperationalError

    from payments import tasks

    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 300)
    db_clock = database_now().timestamp()  # a read: the offset is noted
    sent: list[dict] = []

    def retry(**options):
        sent.append(options)
        return RuntimeError("retried")

    def lost_connection(**kwargs):
        raise DjangoOperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tasks, "payment_settle", lost_connection)
    monkeypatch.setattr(tasks.settle_payment, "retry", retry)
    tasks.settle_payment.apply(args=[1])
    (options,) = sent
    assert "countdown" not in options
    cap = due.RETRY_BACKOFF_CAP + 5
    assert db_clock <= options["eta"].timestamp() < db_clock + cap  # not 5 minutes on
    # Wrong twin: the countdown's ETA, as Celery computes it on this host.
    twin_eta = time.time() + due.retry_countdown(0)
    assert twin_eta - db_clock > 250
