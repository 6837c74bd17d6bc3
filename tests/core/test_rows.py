"""`core.rows.raw`: what `Model.objects.raw` makes, without a `RawQuerySet` per call."""

from decimal import Decimal

import pytest
from django.core.exceptions import FieldDoesNotExist
from django.db.models.functions import Now

from core import rows
from idempotency.models import FINISHED, IdempotencyKey
from tests.support.compiles import orm_compiles

pytestmark = pytest.mark.django_db

TABLE = IdempotencyKey._meta.db_table


def _state(instance) -> dict:
    fields = {
        f.attname: instance.__dict__.get(f.attname, "deferred") for f in instance._meta.fields
    }
    return {**fields, "extra": getattr(instance, "extra", None), "db": instance._state.db}


@pytest.fixture
def key(django_user_model):
    owner = django_user_model.objects.create_user(username="raw", password=None)
    return IdempotencyKey.objects.create(
        owner=owner,
        key="k",
        operation="probe",
        request_method="POST",
        request_path="/p/",
        request_fingerprint="f" * 64,
        recovery_point=FINISHED,
        data={"amount": "1.50", "n": [1, 2]},
        response_status=201,
        response_body="{}",
        response_headers={"Location": "/x/"},
        finished_at=Now(),
    )


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT *, %s::numeric AS extra FROM {TABLE} WHERE id = %s",  # JSON, an annotation
        f"SELECT id, data, key FROM {TABLE} WHERE id = %s AND %s::numeric > 0",  # deferred
        f"SELECT * FROM {TABLE} WHERE id = -1 AND %s::numeric > %s",  # no row
    ],
)
def test_raw_makes_the_instances_of_the_orms_raw(key, sql):
    params = [Decimal("2.50"), key.pk] if "extra" in sql else [key.pk, Decimal("2.50")]
    if "-1" in sql:
        params = [Decimal("1"), 0]

    with orm_compiles() as compiles:
        found = rows.raw(IdempotencyKey, sql, params)
    orm = list(IdempotencyKey.objects.raw(sql, params))

    assert compiles == []
    assert [_state(i) for i in found] == [_state(i) for i in orm]
    assert [i.get_deferred_fields() for i in found] == [i.get_deferred_fields() for i in orm]


def test_raw_without_the_primary_key_is_refused_as_by_the_orm(key):
    sql = f"SELECT key FROM {TABLE} WHERE id = %s"
    with pytest.raises(FieldDoesNotExist):
        list(IdempotencyKey.objects.raw(sql, [key.pk]))
    with pytest.raises(FieldDoesNotExist):
        rows.raw(IdempotencyKey, sql, [key.pk])
