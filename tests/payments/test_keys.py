"""Provider keys: derived from the operation, prefixed by the installation id in the database."""

import threading
import time

import pytest
from django.db import connection, transaction

from payments.keys import install_id, provider_key
from payments.models import PaymentInstallation


@pytest.mark.django_db
def test_install_id_is_created_once_and_kept():
    first = install_id()
    assert install_id() == first
    assert PaymentInstallation.objects.count() == 1
    assert len(first) == 16


def test_key_is_derived_from_the_operation_identity():
    assert provider_key(install="abc", reference="order-7", kind="capture") == "abc:order-7:capture"
    assert provider_key(install="abc", reference="order-7", kind="capture") == provider_key(
        install="abc", reference="order-7", kind="capture"
    )
    assert provider_key(install="other", reference="order-7", kind="capture") != provider_key(
        install="abc", reference="order-7", kind="capture"
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_calls_agree_on_one_install_id():
    """The second first-caller waits on the first's uncommitted insert, then reads its row."""
    inserted = threading.Event()
    release = threading.Event()
    seen: dict[str, str] = {}

    def first():
        try:
            with transaction.atomic():
                seen["first"] = install_id()
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    def second():
        try:
            inserted.wait(10)
            seen["second_pid"] = str(connection.cursor().connection.info.backend_pid)
            seen["second"] = install_id()
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    # The overlap really happened: the second session waits on a lock held by the first.
    deadline = time.monotonic() + 10
    waiting = False
    while time.monotonic() < deadline and not waiting:
        pid = seen.get("second_pid")
        if pid:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [int(pid)]
                )
                waiting = cursor.fetchone()[0] > 0
        time.sleep(0.02)
    release.set()
    for t in threads:
        t.join(10)
    assert waiting, "the second caller never waited on the first insert"
    assert seen["first"] == seen["second"]
    assert PaymentInstallation.objects.count() == 1
