"""Request-key service: claim, match, fencing phases, answers, completer and purge."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection
from django.db.models.functions import Now
from django.http import QueryDict
from django.test import override_settings

from core.db import violated_constraint
from core.errors import ApplicationError, Conflict
from idempotency import failpoints, keys
from idempotency.keys import (
    Answer,
    IdempotencyKeyInUse,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    KeyClaimLost,
    KeyLeaseLost,
    KeyRun,
    body_fingerprint,
    key_claim,
    key_run_failed,
    key_validate,
    keys_complete_abandoned,
    keys_purge,
    keys_purge_capacity,
)
from idempotency.models import FINISHED, STARTED, IdempotencyKey
from tests.support.compiles import orm_compiles
from tests.support.models import ProbeRecord
from tests.support.probe import answers_by_itself

pytestmark = pytest.mark.django_db


def claim(owner, key="k", *, method="POST", path="/p/", body=None, operation="test.op"):
    return key_claim(
        owner_id=owner.pk,
        key=key,
        operation=operation,
        method=method,
        path=path,
        fingerprint=body_fingerprint(body if body is not None else {"a": 1}),
    )


def held(owner, key="k", **kwargs) -> KeyRun:
    """Claim and commit a first phase: the key is locked, as by a running request."""
    run = claim(owner, key, **kwargs)
    assert isinstance(run, KeyRun)
    with run.phase(next_point="held"):
        pass
    return run


def age_lock(key_id: int, seconds: float) -> None:
    """Move a key's lock and last run back in time, by the database clock."""
    IdempotencyKey.objects.filter(pk=key_id).update(
        leased_at=Now() - timedelta(seconds=seconds),
        last_run_at=Now() - timedelta(seconds=seconds),
    )


# --- key and fingerprint ------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "x" * 255, "8e03978e-40d5-43e8", "A~!#$%&'()*+,./:;<=>?@"])
def test_valid_keys(value):
    assert key_validate(value) == value


def test_quoted_key_is_the_structured_field_string():
    assert key_validate('"abc"') == "abc"


def test_missing_key():
    with pytest.raises(IdempotencyKeyMissing):
        key_validate(None)


@pytest.mark.parametrize("value", ["", '""', "x" * 256, "a b", "caf\u00e9", "tab\tkey", "nl\n"])
def test_invalid_keys(value):
    with pytest.raises(IdempotencyKeyInvalid):
        key_validate(value)


def test_fingerprint_is_canonical_json():
    a = body_fingerprint({"b": [1, 2], "a": {"y": 1, "x": "\u00e9"}})
    b = body_fingerprint({"a": {"x": "\u00e9", "y": 1}, "b": [1, 2]})
    assert a == b
    assert len(a) == 64
    assert body_fingerprint({"b": [2, 1], "a": {"x": "\u00e9", "y": 1}}) != a
    assert body_fingerprint({"n": 1}) != body_fingerprint({"n": "1"})


def test_empty_body_counts_as_empty_object():
    assert body_fingerprint(None) == body_fingerprint({})


def test_form_body_fingerprint_keeps_repeated_values():
    q = QueryDict("b=2&a=1&a=3")
    assert body_fingerprint(q) == body_fingerprint({"a": ["1", "3"], "b": ["2"]})


# --- claim and match ----------------------------------------------------------


def test_fresh_claim_writes_nothing_until_its_first_phase(shopper):
    run = claim(shopper)
    assert isinstance(run, KeyRun)
    assert run.recovery_point == STARTED and not run.resumed and not run.claimed
    assert not IdempotencyKey.objects.exists()
    with run.phase(next_point="recorded") as data:
        # The key row is inserted first, inside the phase, before any effect.
        row = IdempotencyKey.objects.get()
        assert row.leased_by == run.token and row.recovery_point == STARTED
        data["x"] = 1
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.leased_by == run.token and row.leased_at is not None
    assert row.recovery_point == "recorded" and row.data == {"x": 1}
    assert row.request_method == "POST" and row.request_path == "/p/"
    assert row.operation == "test.op" and row.runs == 1


def test_first_phase_rolled_back_leaves_no_key(shopper):
    run = claim(shopper)
    with pytest.raises(ZeroDivisionError), run.phase(next_point="recorded"):
        1 / 0  # noqa: B018
    assert not IdempotencyKey.objects.exists() and not run.claimed
    with run.phase(next_point="recorded"):
        pass
    assert IdempotencyKey.objects.get().recovery_point == "recorded"


def test_second_claim_while_locked_is_in_use_with_retry_after(shopper):
    held(shopper)
    with pytest.raises(IdempotencyKeyInUse) as info:
        claim(shopper)
    assert int(info.value.headers["Retry-After"]) >= 1


def test_losing_insert_rolls_back_before_any_effect(shopper):
    """Two fresh runs for one key: the second one's first phase finds the key taken."""
    first, second = claim(shopper), claim(shopper)
    with first.phase(next_point="recorded"):
        pass
    ran = []
    with pytest.raises(KeyClaimLost), second.phase(next_point="recorded"):
        ran.append(True)
    assert ran == [] and not second.claimed
    assert IdempotencyKey.objects.get().leased_by == first.token


@pytest.mark.parametrize(
    "change", [{"method": "PUT"}, {"path": "/other/"}, {"body": {"a": 2}}, {"body": {}}]
)
def test_same_key_for_another_request_is_reused(shopper, change):
    held(shopper)
    with pytest.raises(IdempotencyKeyReused):
        claim(shopper, **change)


def test_reuse_is_refused_even_after_finish(shopper):
    run = claim(shopper)
    run.finish(status=201, body={"ok": True})
    with pytest.raises(IdempotencyKeyReused):
        claim(shopper, body={"a": 2})


def test_finished_key_replays_the_stored_answer(shopper):
    run = claim(shopper)
    run.finish(status=201, body={"z": 1, "a": "\u00e9"}, headers={"Location": "/x/"})
    answer = claim(shopper)
    assert isinstance(answer, Answer)
    assert answer == run.answer
    assert answer.status == 201
    assert answer.body == '{"z":1,"a":"\u00e9"}'  # the exact first text, key order kept
    assert answer.headers == {"Location": "/x/", "Content-Type": "application/json"}


def test_keys_are_per_owner(shopper, make_user):
    other = make_user()
    run_a = held(shopper)
    run_b = held(other)
    assert run_a.key_id != run_b.key_id
    run_a.finish(status=201, body={"who": "a"})
    with pytest.raises(IdempotencyKeyInUse):
        claim(other)


@pytest.mark.django_db(transaction=True)
def test_insert_error_on_another_constraint_is_not_taken_for_a_duplicate(shopper):
    """Only the (owner, key) constraint means "already claimed": anything else propagates."""
    run = key_claim(
        owner_id=10**9,  # no such user: the foreign key, not the unique constraint
        key="k",
        operation="test.op",
        method="POST",
        path="/p/",
        fingerprint=body_fingerprint({}),
    )
    with pytest.raises(IntegrityError) as info, run.phase(next_point="x"):
        pass
    name = violated_constraint(info.value)
    assert name and name.startswith("idempotency_idempotencykey_owner_id_") and "fk" in name
    assert not IdempotencyKey.objects.exists()


def test_expired_lock_is_taken_over_at_its_recovery_point(shopper):
    run = claim(shopper)
    with run.phase(next_point="reserved") as data:
        data["thing"] = 7
    age_lock(run.key_id, 3600)
    second = claim(shopper)
    assert isinstance(second, KeyRun) and second.resumed
    assert second.recovery_point == "reserved" and second.data == {"thing": 7}
    assert second.token != run.token
    assert IdempotencyKey.objects.get(pk=run.key_id).runs == 2


@override_settings(IDEMPOTENCY_LEASE_TTL=30)
def test_lock_age_is_judged_against_the_ttl(shopper):
    run = held(shopper)
    age_lock(run.key_id, 20)
    with pytest.raises(IdempotencyKeyInUse):
        claim(shopper)
    age_lock(run.key_id, 31)
    assert isinstance(claim(shopper), KeyRun)


def test_unlocked_open_key_is_resumed_at_once(shopper):
    run = claim(shopper)
    with run.phase(next_point="pending"):
        run.leave_open(status=202, body={"status": "pending"})
    second = claim(shopper)
    assert isinstance(second, KeyRun) and second.recovery_point == "pending"


# --- phases and fencing -------------------------------------------------------


def test_phase_commits_effects_with_point_and_data(shopper):
    run = claim(shopper)
    with run.phase(next_point="recorded") as data:
        record = ProbeRecord.objects.create(owner=shopper, label="x", amount=1, status="r")
        data["probe_id"] = str(record.id)
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.recovery_point == "recorded" and row.data == {"probe_id": str(record.id)}
    assert row.leased_by == run.token
    assert run.recovery_point == "recorded" and run.data["probe_id"] == str(record.id)


def test_failed_phase_rolls_back_effects_and_keeps_the_point(shopper):
    run = held(shopper)
    with pytest.raises(RuntimeError), run.phase(next_point="recorded") as data:
        ProbeRecord.objects.create(owner=shopper, label="x", amount=1, status="r")
        data["probe_id"] = "nope"
        raise RuntimeError("boom")
    assert not ProbeRecord.objects.exists()
    assert IdempotencyKey.objects.get(pk=run.key_id).recovery_point == "held"
    assert run.recovery_point == "held" and run.data == {}


def test_phase_of_a_run_taken_over_cannot_commit(shopper):
    """The fencing token: a stalled run whose lock was taken over commits nothing."""
    stalled = held(shopper)
    age_lock(stalled.key_id, 3600)
    taker = claim(shopper)
    assert isinstance(taker, KeyRun)
    with pytest.raises(KeyLeaseLost), stalled.phase(next_point="recorded") as data:
        ProbeRecord.objects.create(owner=shopper, label="stalled", amount=1, status="r")
        data["probe_id"] = "stalled"
    assert not ProbeRecord.objects.exists()
    row = IdempotencyKey.objects.get(pk=stalled.key_id)
    assert row.recovery_point == "held" and row.leased_by == taker.token
    with pytest.raises(KeyLeaseLost):
        stalled.finish(status=201, body={})


def test_phase_renews_the_lock(shopper):
    run = held(shopper)
    age_lock(run.key_id, 3600)
    with run.phase(next_point="recorded"):
        pass
    with pytest.raises(IdempotencyKeyInUse):
        claim(shopper)


def test_phases_do_not_nest_and_cannot_go_back_to_started(shopper):
    run = claim(shopper)
    with pytest.raises(ValueError), run.phase(next_point=STARTED):
        pass
    with pytest.raises(RuntimeError), run.phase(next_point="a"), run.phase(next_point="b"):
        pass


def test_phase_to_finished_must_finish(shopper):
    run = claim(shopper)
    with pytest.raises(RuntimeError), run.phase(next_point=FINISHED):
        pass


def test_finish_inside_a_phase_commits_with_the_effect(shopper):
    run = claim(shopper)
    with run.phase(next_point="done"):
        ProbeRecord.objects.create(owner=shopper, label="x", amount=1, status="r")
        run.finish(status=201, body={"ok": 1})
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.recovery_point == FINISHED and row.response_status == 201
    assert row.leased_by is None and row.finished_at is not None
    assert run.closed and run.answer.status == 201
    with pytest.raises(RuntimeError):
        run.finish(status=200)


def test_finish_rolled_back_with_its_phase(shopper):
    run = held(shopper)
    with pytest.raises(ZeroDivisionError), run.phase(next_point="done"):
        run.finish(status=201, body={"ok": 1})
        1 / 0  # noqa: B018
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.recovery_point == "held" and row.response_status is None
    assert run.answer is None and not run.closed


def test_leave_open_answers_without_storing(shopper):
    run = claim(shopper)
    with run.phase(next_point="pending"):
        run.leave_open(status=202, body={"status": "pending"})
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.recovery_point == "pending" and row.response_status is None
    assert row.leased_by is None and row.leased_at is None
    assert run.answer.status == 202 and run.closed


def test_phase_ends_write_the_key_with_sql_compiled_once(shopper):
    """Each way a phase ends updates the key without the ORM compiling the UPDATE again."""
    for key in ("warm-phase", "warm-open"):  # a process's first of each shape writes its SQL
        run = held(shopper, key)
        with run.phase(next_point="b"):
            if key == "warm-open":
                run.leave_open(status=202, body={})
        if key == "warm-phase":
            run.finish(status=200, body={})
    phased, finished = held(shopper, "phased"), held(shopper, "finished")

    with orm_compiles() as compiles:
        with phased.phase(next_point="recorded") as data:
            data["amount"] = Decimal("1.50")  # the field's encoder, DjangoJSONEncoder
        with phased.phase(next_point="pending"):
            phased.leave_open(status=202, body={"status": "pending"})
        finished.finish(status=201, body={"ok": 1})
    assert compiles == []

    row = IdempotencyKey.objects.get(pk=phased.key_id)
    assert row.recovery_point == "pending" and row.data == {"amount": "1.50"}
    assert row.leased_by is None and row.leased_at is None and row.response_status is None
    row = IdempotencyKey.objects.get(pk=finished.key_id)
    assert (row.recovery_point, row.response_status, row.leased_by) == (FINISHED, 201, None)
    assert row.finished_at is not None and row.response_headers == finished.answer.headers


def test_abandon_deletes_a_key_without_committed_phase(shopper):
    run = held(shopper)
    IdempotencyKey.objects.update(recovery_point=STARTED)
    age_lock(run.key_id, 3600)
    taken = claim(shopper)
    assert taken.resumed and taken.recovery_point == STARTED
    taken.abandon()
    assert not IdempotencyKey.objects.exists()
    claim(shopper).abandon()  # a fresh run has nothing to forget
    other = claim(shopper)
    with other.phase(next_point="x"):
        pass
    with pytest.raises(RuntimeError):
        other.abandon()


# --- errors raised by the operation ---------------------------------------------


def test_domain_refusal_before_any_phase_is_stored(shopper):
    run = claim(shopper)
    answer = key_run_failed(run=run, exc=Conflict("no", code="insufficient_stock"))
    assert answer.status == 409 and answer.json()["code"] == "insufficient_stock"
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert claim(shopper) == answer


def test_input_refusal_releases_the_key(shopper):
    run = claim(shopper)
    assert key_run_failed(run=run, exc=ApplicationError("bad", status=400)) is None
    assert not IdempotencyKey.objects.exists()
    assert isinstance(claim(shopper, body={"corrected": True}), KeyRun)


def test_server_error_unlocks_for_a_retry(shopper):
    run = held(shopper)
    assert key_run_failed(run=run, exc=RuntimeError("bug")) is None
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.leased_by is None and row.recovery_point == "held"
    assert isinstance(claim(shopper), KeyRun)


def test_server_error_before_any_phase_leaves_nothing(shopper):
    run = claim(shopper)
    assert key_run_failed(run=run, exc=RuntimeError("bug")) is None
    assert not IdempotencyKey.objects.exists()


def test_stored_refusal_loses_to_a_key_inserted_first(shopper):
    first, second = claim(shopper), claim(shopper)
    with first.phase(next_point="recorded"):
        pass
    with pytest.raises(KeyClaimLost):
        key_run_failed(run=second, exc=Conflict("no"))
    assert IdempotencyKey.objects.get().leased_by == first.token


def test_refusal_after_a_committed_phase_is_not_stored(shopper):
    """Effects are committed: only the domain can settle them (in a phase), so retry resumes."""
    run = claim(shopper)
    with run.phase(next_point="reserved"):
        pass
    assert key_run_failed(run=run, exc=Conflict("late")) is None
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.recovery_point == "reserved" and row.leased_by is None


# --- completer ----------------------------------------------------------------


@pytest.fixture
def registered(monkeypatch):
    registry = {}
    monkeypatch.setattr(keys.operations, "_operations", registry)
    return registry


def test_keyed_operation_refuses_a_second_resumer(registered):
    def a(run, present):
        pass

    def b(run, present):
        pass

    keys.keyed_operation("x", resume=a)(answers_by_itself)
    keys.keyed_operation("x", resume=a)(answers_by_itself)
    with pytest.raises(ValueError):
        keys.keyed_operation("x", resume=b)(answers_by_itself)


@override_settings(IDEMPOTENCY_ABANDON_AFTER=60, IDEMPOTENCY_LEASE_TTL=30)
def test_completer_settles_only_abandoned_keys(shopper, registered):
    seen = []

    def resume(run: KeyRun, present) -> None:
        seen.append((run.key, run.recovery_point, run.data))
        with run.phase(next_point="done"):
            run.finish(status=201, body={"completed": run.key})

    keys.keyed_operation("test.op", resume=resume)(answers_by_itself)

    abandoned = claim(shopper, "abandoned")
    assert isinstance(abandoned, KeyRun)
    with abandoned.phase(next_point="reserved") as data:
        data["ref"] = 1
    age_lock(abandoned.key_id, 120)

    recent = held(shopper, "recent")  # lock expired but last run too recent
    IdempotencyKey.objects.filter(pk=recent.key_id).update(
        leased_at=Now() - timedelta(seconds=40), last_run_at=Now() - timedelta(seconds=40)
    )
    live = held(shopper, "live")  # lock still held (renewed by a phase) though old run
    IdempotencyKey.objects.filter(pk=live.key_id).update(last_run_at=Now() - timedelta(seconds=120))
    other_op = held(shopper, "other", operation="unregistered.op")
    age_lock(other_op.key_id, 120)
    done = claim(shopper, "done")
    done.finish(status=200, body={})

    assert keys_complete_abandoned() == 1
    assert seen == [("abandoned", "reserved", {"ref": 1})]
    row = IdempotencyKey.objects.get(pk=abandoned.key_id)
    assert row.recovery_point == FINISHED and row.runs == 2
    assert claim(shopper, "abandoned").json() == {"completed": "abandoned"}
    for run in (recent, live, other_op):
        assert IdempotencyKey.objects.get(pk=run.key_id).recovery_point != FINISHED
    assert keys_complete_abandoned() == 0


@override_settings(IDEMPOTENCY_ABANDON_AFTER=60)
def test_completer_failure_unlocks_and_backs_off(shopper, registered):
    def resume(run, present):
        raise RuntimeError("provider down")

    keys.keyed_operation("test.op", resume=resume)(answers_by_itself)
    run = held(shopper)
    age_lock(run.key_id, 120)
    assert keys_complete_abandoned() == 0
    row = IdempotencyKey.objects.get(pk=run.key_id)
    assert row.leased_by is None and row.runs == 2
    # last_run_at was renewed by the takeover: not tried again before ABANDON_AFTER.
    assert keys_complete_abandoned() == 0


@override_settings(IDEMPOTENCY_ABANDON_AFTER=60)
def test_completer_abandons_a_key_that_never_committed(shopper):
    """The probe's registered resumer forgets a key stuck at "started"; a retry runs afresh."""
    run = held(shopper, operation="probe.run")
    IdempotencyKey.objects.update(recovery_point=STARTED)
    age_lock(run.key_id, 120)
    assert keys_complete_abandoned() == 1
    assert not IdempotencyKey.objects.exists()


# --- purge --------------------------------------------------------------------


def _finished(owner, key: str, *, age_hours: float) -> IdempotencyKey:
    run = claim(owner, key)
    run.finish(status=201, body={})
    IdempotencyKey.objects.filter(pk=run.key_id).update(
        finished_at=Now() - timedelta(hours=age_hours)
    )
    return IdempotencyKey.objects.get(pk=run.key_id)


def test_purge_deletes_finished_keys_past_retention_only(shopper):
    old = _finished(shopper, "old", age_hours=25)
    fresh = _finished(shopper, "fresh", age_hours=23)
    open_old = claim(shopper, "open-old")
    with open_old.phase(next_point="pending"):
        open_old.leave_open(status=202)
    running_old = held(shopper, "running-old")
    IdempotencyKey.objects.filter(pk__in=[open_old.key_id, running_old.key_id]).update(
        created_at=Now() - timedelta(days=30), last_run_at=Now() - timedelta(days=30)
    )
    assert keys_purge() == 1
    remaining = set(IdempotencyKey.objects.values_list("key", flat=True))
    assert remaining == {"fresh", "open-old", "running-old"}
    assert not IdempotencyKey.objects.filter(pk=old.pk).exists()
    assert fresh.pk


def test_purge_works_in_bounded_batches(shopper):
    for i in range(5):
        _finished(shopper, f"k{i}", age_hours=48)
    assert keys_purge(batch_size=2, max_batches=2) == 4
    assert IdempotencyKey.objects.count() == 1
    assert keys_purge(batch_size=2, max_batches=2) == 1


@override_settings(IDEMPOTENCY_KEY_RETENTION=3600)
def test_purge_retention_is_a_setting(shopper):
    _finished(shopper, "two-hours", age_hours=2)
    assert keys_purge() == 1


class _PurgeTime:
    """The purge's clock and sleep: each DELETE batch takes BATCH_S, a sleep only advances it."""

    BATCH_S = 0.1

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def batch(self, execute, sql, params, many, context):
        if sql.startswith("DELETE"):
            self.now += self.BATCH_S
        return execute(sql, params, many, context)


def test_purge_pauses_after_each_full_batch_in_proportion_to_its_time(shopper, monkeypatch):
    for i in range(5):
        _finished(shopper, f"k{i}", age_hours=48)
    clock = _PurgeTime()
    monkeypatch.setattr("core.db.time", clock)
    with connection.execute_wrapper(clock.batch):
        assert keys_purge(batch_size=1, max_batches=10, pace=2.0) == 5
    # Five full batches then a short one: a pause of 2 x 0.1 s after each full one,
    # so the purge took at least (1 + pace) x its work.
    assert clock.sleeps == pytest.approx([0.2] * 5)
    assert clock.now >= 3 * 5 * _PurgeTime.BATCH_S
    assert not IdempotencyKey.objects.exists()


@override_settings(IDEMPOTENCY_PURGE_PACE=0)
def test_purge_without_pace_never_pauses(shopper, monkeypatch):
    for i in range(3):
        _finished(shopper, f"k{i}", age_hours=48)
    clock = _PurgeTime()
    monkeypatch.setattr("core.db.time", clock)
    assert keys_purge(batch_size=1, max_batches=10) == 3
    assert clock.sleeps == []


def test_purge_capacity_at_the_defaults_keeps_up_with_four_times_80_keyed_orders_a_second(
    settings,
):
    # From the settings, not timed: one run's bound every interval, paced. 0.011 s is
    # a batch of 1,000 keys on the growth scenario's full tables beside checkout
    # (docs/performance.md, "The key purge"); the bound holds up to 0.03 s.
    from config.settings import base

    for name in ("BATCH", "MAX_BATCHES", "EVERY", "PACE", "BUDGET"):
        setattr(settings, f"IDEMPOTENCY_PURGE_{name}", getattr(base, f"IDEMPOTENCY_PURGE_{name}"))
    assert keys_purge_capacity() == keys_purge_capacity(batch_seconds=0.03) >= 4 * 80
    assert keys_purge_capacity(batch_seconds=0.011) >= 4 * 80
    # A batch ten times slower than the bound still leaves the shop's 80 keys a second.
    assert keys_purge_capacity(batch_seconds=0.3) >= 80
    # The wrong twin: the old interval (15 minutes) keeps up with about 55 keys a second.
    settings.IDEMPOTENCY_PURGE_EVERY = 900.0
    assert keys_purge_capacity() < 4 * 80


def test_purge_budget_ends_a_run_within_its_task_time_limit_and_its_interval(settings):
    # One more batch after the budget (a batch is short: well under a second) still
    # ends before the task's soft time limit, and before the next run is due.
    assert settings.IDEMPOTENCY_PURGE_BUDGET + 1 < settings.CELERY_TASK_SOFT_TIME_LIMIT
    assert settings.IDEMPOTENCY_PURGE_BUDGET < settings.IDEMPOTENCY_PURGE_EVERY


def test_purge_paces_a_backlog_larger_than_a_run(shopper, monkeypatch):
    for i in range(7):
        _finished(shopper, f"k{i}", age_hours=48)
    clock = _PurgeTime()
    monkeypatch.setattr("core.db.time", clock)
    with connection.execute_wrapper(clock.batch):
        # 7 due, a run deletes at most 2 x 3 = 6, paced after each full batch but its last.
        assert keys_purge(batch_size=2, max_batches=3, pace=2.0) == 6
        assert clock.sleeps == pytest.approx([0.2, 0.2])
        # The next run takes the one left.
        assert keys_purge(batch_size=2, max_batches=3, pace=2.0) == 1
    assert not IdempotencyKey.objects.exists()


@override_settings(IDEMPOTENCY_PURGE_BUDGET=2.5)
def test_purge_run_starts_no_batch_after_its_budget(shopper, monkeypatch):
    """Batches of 0.1 s paced 9 x take 1 s each: a run with a 2.5 s budget starts
    three (at 0, 1 and 2 s) and leaves the rest to the next run."""
    for i in range(10):
        _finished(shopper, f"k{i}", age_hours=48)
    clock = _PurgeTime()
    monkeypatch.setattr("core.db.time", clock)
    with connection.execute_wrapper(clock.batch):
        assert keys_purge(batch_size=1, max_batches=50, pace=9.0) == 3
        assert keys_purge(batch_size=1, max_batches=50, pace=9.0) == 3
    assert IdempotencyKey.objects.count() == 4


class _FakeClock:
    """A monotonic clock the completer reads; each settled key advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@override_settings(IDEMPOTENCY_ABANDON_AFTER=60, IDEMPOTENCY_COMPLETER_BUDGET=25)
def test_completer_starts_no_key_once_its_time_budget_is_spent(shopper, registered, monkeypatch):
    """Ten abandoned keys, each taking 10 s (a provider call): a run with a 25 s budget
    starts three (at 0, 10 and 20 s) and leaves the rest to the next run, so it cannot
    outlast the broker's visibility timeout however many keys are due."""
    clock = _FakeClock()
    monkeypatch.setattr(keys.completer, "time", clock)

    def resume(run: KeyRun, present) -> None:
        clock.now += 10
        with run.phase(next_point="done"):
            run.finish(status=201, body={})

    keys.keyed_operation("test.op", resume=resume)(answers_by_itself)
    for i in range(10):
        age_lock(held(shopper, f"slow-{i}").key_id, 120)
    assert keys_complete_abandoned() == 3
    assert IdempotencyKey.objects.filter(recovery_point=FINISHED).count() == 3
    assert (
        IdempotencyKey.objects.exclude(recovery_point=FINISHED).filter(leased_by=None).count() == 0
    )
    assert keys_complete_abandoned() == 3  # the next run goes on with the rest
    assert IdempotencyKey.objects.filter(recovery_point=FINISHED).count() == 6


def test_completer_budget_is_well_under_the_visibility_timeout(settings):
    # One more key's provider calls (connect + read timeout) on top of the budget
    # still ends before the task's soft time limit.
    worst = settings.IDEMPOTENCY_COMPLETER_BUDGET + 2 * settings.PAYMENTS_PROVIDER_TIMEOUT
    assert worst < settings.CELERY_TASK_SOFT_TIME_LIMIT < settings.CELERY_VISIBILITY_TIMEOUT


def _lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY_CLAIM_WAIT=0.25)
def test_claim_wait_covers_the_insert_alone(shopper):
    """The claim's lock_timeout is back to the session's value for the phase's own work."""
    before = _lock_timeout()
    seen = []
    with failpoints.hook("idempotency.claim.before_insert", lambda name: seen.append(name)):
        run = claim(shopper, "bounded")
        with run.phase(next_point="held"):
            inside = _lock_timeout()
    assert seen and run.claimed
    assert inside == before
    assert _lock_timeout() == before
