"""Concurrent identical requests: one effect, every caller gets the stored answer or 409.

Threads are released together by a barrier right before the contested step,
and each test asserts that the overlap really happened.
"""

import threading

import pytest
from django.db import IntegrityError, connection
from django.db.models.functions import Now
from django.test import override_settings
from rest_framework.test import APIClient

from core.api_tokens import api_token_issue
from idempotency import failpoints
from idempotency.keys import body_fingerprint
from idempotency.models import FINISHED, IdempotencyKey, OutboxMessage
from tests.support import probe
from tests.support.models import ProbeRecord
from tests.support.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/_test/probe/"
BODY = {"label": "race", "amount": 5}


@pytest.fixture
def stub(stub_service):
    with override_settings(SHOP_PROBE_STUB_URL=stub_service.url):
        yield stub_service


def _client(user) -> APIClient:
    token = api_token_issue(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _post(client: APIClient, key: str):
    try:
        return client.post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY=key)
    finally:
        connection.close()


def _run_threads(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)


def test_twenty_concurrent_identical_requests_make_one_effect(shopper, stub):
    n = 20
    clients = [_client(shopper) for _ in range(n)]
    barrier = threading.Barrier(n, timeout=30)
    answered = threading.Semaphore(0)
    others_answered = threading.Event()
    first: list = [None] * n
    held = []

    def hold_the_winner(name: str) -> None:
        # The one request that got the key holds it (its first phase committed,
        # the key locked) until every other request has been answered.
        held.append(name)
        others_answered.wait(timeout=60)

    def request(i: int) -> None:
        barrier.wait()
        first[i] = _post(clients[i], "race-key")
        answered.release()

    def counter() -> None:
        for _ in range(n - 1):
            if not answered.acquire(timeout=60):
                return
        others_answered.set()

    with failpoints.hook("probe.run.recorded.after_commit", hold_the_winner):
        _run_threads([counter] + [lambda i=i: request(i) for i in range(n)])

    statuses = sorted(r.status_code for r in first)
    assert statuses == [201] + [409] * (n - 1), statuses  # the overlap really happened
    assert held == ["probe.run.recorded.after_commit"]
    for r in first:
        if r.status_code == 409:
            assert r.json()["code"] == "idempotency_key_in_use" and r["Retry-After"]
    winner = next(r for r in first if r.status_code == 201)

    # Every caller retries and gets the one stored answer, replayed.
    retries: list = [None] * n
    _run_threads(
        [lambda i=i: retries.__setitem__(i, _post(clients[i], "race-key")) for i in range(n)]
    )
    for r in retries:
        assert r.status_code == 201 and r["Idempotent-Replayed"] == "true"
        assert r.content == winner.content
    assert ProbeRecord.objects.count() == 1
    assert len(stub.effects) == 1 and len(stub.calls) == 1
    assert OutboxMessage.objects.count() == 1


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _lock_waiters(pids: list[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = ANY(%s)", [pids])
        return cursor.fetchone()[0]


def test_simultaneous_inserts_one_claim_wins(shopper, stub):
    """Both requests saw no key; the unique constraint lets exactly one insert win.

    The winner is held right after its insert (uncommitted) until the loser is
    seen in pg_locks waiting on it: the two inserts really overlapped.
    """
    clients = [_client(shopper) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=30)
    pids: list[int] = []
    loser_waits = threading.Event()
    winners = []
    results: list = [None, None]

    def both_saw_no_key(name: str) -> None:
        pids.append(_backend_pid())
        barrier.wait()

    def hold_the_inserter(name: str) -> None:
        winners.append(name)
        loser_waits.wait(timeout=30)

    with (
        failpoints.hook("idempotency.claim.before_insert", both_saw_no_key),
        failpoints.hook("idempotency.claim.after_insert", hold_the_inserter),
    ):
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, _post(clients[i], "dup")))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(pids) == 2 and _lock_waiters(pids) > 0, timeout=30)
        finally:
            loser_waits.set()
            for t in threads:
                t.join(timeout=60)
    assert len(winners) == 1  # one insert went through; the other waited, then lost
    codes = sorted(r.status_code for r in results)
    assert codes in ([201, 201], [201, 409]), codes
    if codes == [201, 201]:
        assert {r.get("Idempotent-Replayed") for r in results} == {None, "true"}
    assert ProbeRecord.objects.count() == 1
    assert len(stub.effects) == 1


def _check_then_act(*, owner, key: str, barrier: threading.Barrier) -> str:
    """THE USUAL, WRONG IMPLEMENTATION (kept to show it fails): look up, act, then save.

    It is what per-request "key store" libraries do: check whether the key is
    known; if not, run the handler and save the result afterwards.
    """
    try:
        if IdempotencyKey.objects.filter(owner=owner, key=key).exists():
            return "replayed"
        barrier.wait()  # the same interleaving as above: both saw no key
        record = probe.probe_run_unkeyed(owner_id=owner.pk, label="race", amount=5)
        try:
            IdempotencyKey.objects.create(
                owner=owner,
                key=key,
                operation=probe.OPERATION,
                request_method="POST",
                request_path=URL,
                request_fingerprint=body_fingerprint(BODY),
                recovery_point=FINISHED,
                response_status=201,
                response_body=str(record.id),
                finished_at=Now(),
            )
        except IntegrityError:
            return "saved-late"
        return "created"
    finally:
        connection.close()


def test_check_then_act_variant_loses_the_same_interleaving(shopper, stub):
    barrier = threading.Barrier(2, timeout=30)
    outcomes: list = [None, None]
    _run_threads(
        [
            lambda i=i: outcomes.__setitem__(
                i, _check_then_act(owner=shopper, key="dup", barrier=barrier)
            )
            for i in range(2)
        ]
    )
    assert sorted(outcomes) == ["created", "saved-late"]
    # The effect happened twice: exactly what the insert-first claim prevents.
    assert ProbeRecord.objects.count() == 2
    assert len(stub.effects) == 2
