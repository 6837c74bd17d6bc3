"""The inbox: the message id is inserted first; a duplicate is skipped, even concurrently."""

import threading

import pytest
from django.db import connection, transaction

from idempotency.messaging.inbox import inbox_claim
from idempotency.models import InboxMessage
from tests.support.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_inbox_claim_needs_the_consumers_transaction():
    with pytest.raises(RuntimeError):
        inbox_claim(consumer="c", message_id="m")


def test_duplicate_is_skipped_and_the_transaction_survives():
    with transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m1") is True
        assert inbox_claim(consumer="c", message_id="m1") is False
        # The savepoint kept the consumer's transaction usable.
        assert inbox_claim(consumer="c", message_id="m2") is True
        assert inbox_claim(consumer="other", message_id="m1") is True
    assert InboxMessage.objects.count() == 3


def test_claim_rolls_back_with_a_failed_effect():
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m") is True
        1 / 0  # noqa: B018
    with transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m") is True


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _waiting(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_duplicate_waits_for_the_first_and_then_decides(first_commits):
    """The second consumer blocks on the first one's row (seen in pg_locks), then decides."""
    release = threading.Event()
    first_claimed = threading.Event()
    second_pid: list = []
    results: dict = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = inbox_claim(consumer="c", message_id="m")
                first_claimed.set()
                release.wait(timeout=30)
                if not first_commits:
                    raise RuntimeError("effect failed")
        except RuntimeError:
            pass
        finally:
            connection.close()

    def second() -> None:
        try:
            first_claimed.wait(timeout=30)
            second_pid.append(_backend_pid())
            with transaction.atomic():
                results["second"] = inbox_claim(consumer="c", message_id="m")
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: second_pid and _waiting(second_pid[0]), timeout=30)
    finally:
        release.set()
        for t in threads:
            t.join(timeout=30)
    assert results["first"] is True
    assert results["second"] is (not first_commits)
    assert InboxMessage.objects.count() == 1
