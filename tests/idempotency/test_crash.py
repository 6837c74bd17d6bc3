"""Crashes in a real gunicorn (exit failpoints), stalls past the lock TTL, the completer.

The server runs on the test database; the stub service runs in this process.
"""

import threading
import time

import pytest
import requests
from django.db import connection
from django.test import override_settings

from core.api_tokens import api_token_issue
from idempotency import keys
from idempotency.models import FINISHED, IdempotencyKey, OutboxMessage
from tests.support.models import ProbeRecord
from tests.support.servers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PATH = "/api/v1/_test/probe/"
BODY = {"label": "crash", "amount": 7}
LOCK_TTL = 2

BOUNDARIES = [
    # inside phase 1: the key row inserted (not committed) / effects written
    "idempotency.claim.after_insert",
    "probe.run.recorded.before_commit",
    # right after phase 1 committed (key + record), before the outside call
    "probe.run.recorded.after_commit",
    # the stub applied its effect, phase 2 not started
    "probe.run.after_call",
    # inside phase 2 / after the final answer committed, before it was sent
    "probe.run.finished.before_commit",
    "probe.run.finished.after_commit",
]


@pytest.fixture
def token(shopper) -> str:
    return api_token_issue(user=shopper).key


def send(server, token: str, key: str, body=None, timeout: float = 30):
    return requests.post(
        server.url + PATH,
        json=BODY if body is None else body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
        timeout=timeout,
    )


def send_until_answered(server, token: str, key: str, *, within: float = 60):
    """Retry like a well-behaved client: after a dropped connection or a 409, per Retry-After."""
    deadline = time.monotonic() + within
    while True:
        try:
            response = send(server, token, key)
        except requests.ConnectionError:
            response = None
        if response is not None and response.status_code != 409:
            return response
        if time.monotonic() > deadline:
            raise AssertionError(f"no answer within {within} s:\n{server.log()}")
        wait = 0.2 if response is None else float(response.headers["Retry-After"])
        time.sleep(min(wait, 1.0))


def assert_exactly_one_effect(stub) -> ProbeRecord:
    record = ProbeRecord.objects.get()
    assert record.status == "completed"
    assert len(stub.effects) == 1
    assert OutboxMessage.objects.filter(aggregate_id=str(record.id)).count() == 1
    assert OutboxMessage.objects.count() == 1
    return record


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_crash_after_each_boundary_then_retry_gives_one_effect(
    gunicorn, stub_service, token, boundary
):
    server = gunicorn(
        failpoints=f"{boundary}=exit@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    with pytest.raises(requests.ConnectionError):
        send(server, token, "crash-key")  # the worker dies: no answer at all
    assert "failpoint " + boundary in server.log()

    final = send_until_answered(server, token, "crash-key")
    assert final.status_code == 201, final.text
    record = assert_exactly_one_effect(stub_service)
    assert final.json()["id"] == str(record.id)
    replay = send(server, token, "crash-key")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == final.content
    if boundary == "probe.run.finished.after_commit":
        # The answer was stored with the effect before the crash: the retry is a replay.
        assert final.headers["Idempotent-Replayed"] == "true"


def _lock_expired_and_abandoned(key_id: int, seconds: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (leased_at IS NULL OR leased_at < now() - make_interval(secs => %s))"
            " AND last_run_at < now() - make_interval(secs => %s)"
            " FROM idempotency_idempotencykey WHERE id = %s",
            [seconds, seconds, key_id],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize(
    "boundary",
    ["idempotency.claim.after_insert", "probe.run.recorded.after_commit", "probe.run.after_call"],
)
def test_crash_without_retry_is_settled_by_the_completer(gunicorn, stub_service, token, boundary):
    server = gunicorn(
        failpoints=f"{boundary}=exit@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    with pytest.raises(requests.ConnectionError):
        send(server, token, "gone-key")

    if boundary == "idempotency.claim.after_insert":
        # The claim and the first effects commit together: nothing is left to
        # settle, and a later retry simply runs.
        assert not IdempotencyKey.objects.exists() and not ProbeRecord.objects.exists()
        final = send(server, token, "gone-key")
        assert final.status_code == 201 and "Idempotent-Replayed" not in final.headers
    else:
        key_id = IdempotencyKey.objects.get().pk
        wait_until(lambda: _lock_expired_and_abandoned(key_id, LOCK_TTL), timeout=30)
        with override_settings(
            IDEMPOTENCY_LEASE_TTL=LOCK_TTL,
            IDEMPOTENCY_ABANDON_AFTER=LOCK_TTL,
            SHOP_PROBE_STUB_URL=stub_service.url,
        ):
            assert keys.keys_complete_abandoned() == 1
        row = IdempotencyKey.objects.get()
        assert row.recovery_point == FINISHED and row.response_status == 201
        final = send(server, token, "gone-key")
        assert final.status_code == 201 and final.headers["Idempotent-Replayed"] == "true"
    record = assert_exactly_one_effect(stub_service)
    assert final.json()["id"] == str(record.id)


def test_completer_runs_in_a_real_celery_worker(
    gunicorn, celery_worker_process, stub_service, token
):
    from config.celery import app

    server = gunicorn(
        failpoints="probe.run.after_call=exit@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    with pytest.raises(requests.ConnectionError):
        send(server, token, "worker-key")
    worker = celery_worker_process(
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        IDEMPOTENCY_ABANDON_AFTER=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    key_id = IdempotencyKey.objects.get().pk
    wait_until(lambda: _lock_expired_and_abandoned(key_id, LOCK_TTL), timeout=30)
    app.send_task("idempotency.complete_abandoned_keys")
    wait_until(
        lambda: IdempotencyKey.objects.filter(pk=key_id, recovery_point=FINISHED).exists(),
        timeout=60,
        message=worker.log(),
    )
    record = assert_exactly_one_effect(stub_service)
    final = send(server, token, "worker-key")
    assert final.headers["Idempotent-Replayed"] == "true"
    assert final.json()["id"] == str(record.id)


def test_stalled_request_taken_over_after_its_ttl_cannot_commit(gunicorn, stub_service, token):
    """A stalls past its lock TTL; B takes over and finishes; A wakes, runs its last phase
    and must not commit it (without the fencing token A's phase would commit a second
    outbox event and overwrite the stored answer)."""
    server = gunicorn(
        workers=2,
        # A stalls between the outside call and its last phase (holding no row lock).
        failpoints="probe.run.after_call=sleep:5000@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    stalled: dict = {}

    def first_request() -> None:
        stalled["response"] = send(server, token, "stall-key")

    thread = threading.Thread(target=first_request)
    thread.start()
    try:
        key_id = wait_until(
            lambda: IdempotencyKey.objects.values_list("pk", flat=True).first(), timeout=30
        )
        # A committed phase 1 and called the stub; its lock expires (database
        # clock) while A is still stalled.
        wait_until(lambda: _lock_expired_and_abandoned(key_id, LOCK_TTL), timeout=30)
        assert IdempotencyKey.objects.get().recovery_point == "recorded" and thread.is_alive()
        assert not OutboxMessage.objects.exists()

        taker = send(server, token, "stall-key")
        assert taker.status_code == 201 and "Idempotent-Replayed" not in taker.headers
        assert thread.is_alive()  # A is still stalled: B really overtook it
    finally:
        thread.join(timeout=60)
    woke = stalled["response"]
    # A woke, its fenced commit matched no row, its phase rolled back; it answers
    # what the key holds now: B's stored answer.
    assert woke.status_code == 201 and woke.headers["Idempotent-Replayed"] == "true"
    assert woke.content == taker.content
    record = assert_exactly_one_effect(stub_service)
    assert taker.json()["id"] == str(record.id)
    assert IdempotencyKey.objects.get().runs == 2


# Also run on the embedded servers in CI: real server processes must find the
# socket-only PostgreSQL of a fresh machine.
@pytest.mark.embedded
@pytest.mark.serial  # the overlap needs the requests to meet within the winner's 1.5 s
def test_concurrent_requests_to_real_workers_make_one_effect(gunicorn, stub_service, token):
    """Twenty clients released together against four worker processes."""
    n = 20
    server = gunicorn(
        workers=4,
        # The winner lingers after its first phase so the others meet a held key.
        failpoints="probe.run.recorded.after_commit=sleep:1500@1",
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    barrier = threading.Barrier(n, timeout=30)
    first: list = [None] * n

    def request(i: int) -> None:
        barrier.wait()
        first[i] = send(server, token, "many")

    threads = [threading.Thread(target=request, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    codes = [r.status_code for r in first]
    assert set(codes) <= {201, 409}, codes
    assert 409 in codes  # the overlap really happened
    assert codes.count(201) >= 1
    fresh = [r for r in first if r.status_code == 201 and "Idempotent-Replayed" not in r.headers]
    assert len(fresh) == 1
    final = [send_until_answered(server, token, "many") for _ in range(n)]
    assert all(r.content == fresh[0].content for r in final)
    assert all(r.headers["Idempotent-Replayed"] == "true" for r in final)
    assert_exactly_one_effect(stub_service)
