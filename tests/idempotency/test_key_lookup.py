"""The key's read before the view (`key_lookup`): the ORM's instance, not its compile."""

import pytest
from django.db.models.functions import Now

from idempotency.keys import FINISHED, key_lookup
from idempotency.models import IdempotencyKey
from tests.support.compiles import orm_compiles


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


@pytest.fixture
def finished_key(django_user_model):
    owner = django_user_model.objects.create_user(username="keyed", password=None)
    IdempotencyKey.objects.create(
        owner=owner,
        key="k-1",
        operation="probe",
        request_method="POST",
        request_path="/api/v1/orders/",
        request_fingerprint="f" * 64,
        recovery_point=FINISHED,
        data={"order_id": "a", "amounts": ["1.00", 2]},
        response_status=201,
        response_body='{"id": "a"}',
        response_headers={"Location": "/api/v1/orders/a/"},
        finished_at=Now(),
    )
    return owner


@pytest.mark.django_db
def test_the_row_is_the_orms_with_the_database_clock(finished_key):
    orm = IdempotencyKey.objects.annotate(db_now=Now()).get(owner=finished_key, key="k-1")

    found = key_lookup(owner_id=finished_key.pk, key="k-1")

    assert found is not None and _fields(found) == _fields(orm)
    assert found.data == {"order_id": "a", "amounts": ["1.00", 2]}
    assert found.response_headers == {"Location": "/api/v1/orders/a/"}
    assert found.db_now.tzinfo is not None and found.db_now >= orm.finished_at
    assert found._state.adding is False
    assert key_lookup(owner_id=finished_key.pk, key="k-2") is None


@pytest.mark.django_db
def test_the_read_compiles_no_orm_query(finished_key):
    key_lookup(owner_id=finished_key.pk, key="k-1")  # the SQL is written on a process's first read

    with orm_compiles() as compiles:
        assert key_lookup(owner_id=finished_key.pk, key="k-1") is not None
    assert compiles == []
