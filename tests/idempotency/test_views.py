"""Every row of the contract's key table, in its order of checks, on the probe endpoint."""

import pytest
from django.test import override_settings

from idempotency import failpoints, metrics
from idempotency.models import FINISHED, IdempotencyKey, OutboxMessage
from tests.conftest import assert_problem
from tests.support.models import ProbeRecord
from tests.support.servers import key_hold

pytestmark = pytest.mark.django_db

URL = "/api/v1/_test/probe/"
BODY = {"label": "a", "amount": 3}


def post(client, key="key-1", body=None, **extra):
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(URL, BODY if body is None else body, format="json", **headers, **extra)


@pytest.fixture
def stub(stub_service):
    with override_settings(SHOP_PROBE_STUB_URL=stub_service.url):
        yield stub_service


# --- order of checks ------------------------------------------------------------


def test_authentication_comes_first(api_client):
    assert_problem(post(api_client, key=None), 401, "not_authenticated")
    assert_problem(post(api_client, key=""), 401, "not_authenticated")


def test_header_missing(shopper_client):
    assert_problem(post(shopper_client, key=None), 400, "idempotency_key_missing")
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("value", ["", "x" * 256, "two words", "caf\u00e9"])
def test_header_invalid(shopper_client, value):
    assert_problem(post(shopper_client, key=value), 400, "idempotency_key_invalid")
    assert not IdempotencyKey.objects.exists()


def test_header_checked_before_the_body(shopper_client):
    response = shopper_client.post(URL, "{nope", content_type="application/json")
    assert_problem(response, 400, "idempotency_key_missing")


def test_invalid_body_claims_nothing_and_the_key_stays_usable(shopper_client, stub):
    body = assert_problem(post(shopper_client, body={"label": "a"}), 400, "invalid_request")
    assert "amount" in body["errors"]
    assert_problem(
        shopper_client.post(
            URL, "{nope", content_type="application/json", HTTP_IDEMPOTENCY_KEY="key-1"
        ),
        400,
        "malformed_json",
    )
    assert not IdempotencyKey.objects.exists()
    assert post(shopper_client).status_code == 201


# --- first request, replay ---------------------------------------------------------


def test_first_request_stores_its_answer_with_the_effect(shopper_client, stub):
    response = post(shopper_client, key="x" * 255)
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    record = ProbeRecord.objects.get()
    assert response.json() == {
        "id": str(record.id),
        "label": "a",
        "amount": 3,
        "status": "completed",
        "confirmation": "conf-1",
    }
    row = IdempotencyKey.objects.get()
    assert row.recovery_point == FINISHED and row.response_status == 201
    assert row.response_body == response.content.decode()
    assert OutboxMessage.objects.filter(event_type="probe.completed").count() == 1


def test_replay_is_the_same_answer_and_nothing_happens_twice(shopper_client, stub):
    first = post(shopper_client)
    for _ in range(3):
        again = post(shopper_client)
        assert again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert again.content == first.content
        assert again["Content-Type"] == first["Content-Type"]
    assert ProbeRecord.objects.count() == 1
    assert len(stub.effects) == 1 and len(stub.calls) == 1
    assert OutboxMessage.objects.count() == 1
    assert metrics.duplicate_totals()[metrics.KEY_REPLAY] == 3


def test_replay_ignores_key_order_and_whitespace_of_the_body(shopper_client, stub):
    first = post(shopper_client)
    again = shopper_client.post(
        URL,
        '{ "amount": 3,\n  "label": "a" }',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="key-1",
    )
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content


def test_quoted_header_is_the_same_key(shopper_client, stub):
    first = post(shopper_client, key="k9")
    again = post(shopper_client, key='"k9"')
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content


def test_stored_domain_refusal_is_replayed(shopper_client, stub):
    first = post(shopper_client, body={"label": "refuse", "amount": 1})
    assert_problem(first, 409, "probe_refused")
    again = post(shopper_client, body={"label": "refuse", "amount": 1})
    assert_problem(again, 409, "probe_refused")
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert not ProbeRecord.objects.exists()
    assert not stub.calls


# --- reuse, in use ------------------------------------------------------------------


def test_same_key_with_another_body_is_reused(shopper_client, stub):
    post(shopper_client)
    assert_problem(
        post(shopper_client, body={"label": "b", "amount": 3}), 422, "idempotency_key_reused"
    )
    assert ProbeRecord.objects.count() == 1
    assert metrics.suspicious_totals()[metrics.KEY_REUSED] == 1
    assert metrics.conflict_totals()["idempotency_key_reused"] == 1


def test_same_key_on_another_path_is_reused(shopper_client, stub):
    post(shopper_client)
    response = shopper_client.post(URL + "?x=1", BODY, format="json", HTTP_IDEMPOTENCY_KEY="key-1")
    assert response["Idempotent-Replayed"] == "true"  # the query string is not the path
    row = IdempotencyKey.objects.get()
    IdempotencyKey.objects.filter(pk=row.pk).update(request_path="/api/v1/elsewhere/")
    assert_problem(post(shopper_client), 422, "idempotency_key_reused")


def test_running_key_is_in_use_with_retry_after(shopper_client, shopper):
    key_hold(owner_id=shopper.pk, key="key-1", operation="probe.run", path=URL, body=BODY)
    response = post(shopper_client)
    assert_problem(response, 409, "idempotency_key_in_use")
    assert int(response["Retry-After"]) >= 1
    assert metrics.conflict_totals()["idempotency_key_in_use"] == 1
    assert not ProbeRecord.objects.exists()


def test_keys_are_independent_across_users(shopper_client, make_user, client_for, stub):
    other = client_for(make_user())
    mine = post(shopper_client)
    theirs = post(other)
    assert mine.status_code == theirs.status_code == 201
    assert "Idempotent-Replayed" not in theirs
    assert mine.json()["id"] != theirs.json()["id"]
    assert ProbeRecord.objects.count() == 2
    assert post(other).json() == theirs.json()


# --- open keys (payment_pending style) --------------------------------------------


def test_pending_answer_keeps_the_key_open_until_final(shopper_client, stub):
    stub.mode = "pending"
    first = post(shopper_client)
    assert first.status_code == 202 and first.json()["status"] == "pending"
    row = IdempotencyKey.objects.get()
    assert row.recovery_point == "pending" and row.leased_by is None
    assert row.response_status is None

    again = post(shopper_client)
    assert again.status_code == 202 and "Idempotent-Replayed" not in again

    stub.mode = "ok"
    final = post(shopper_client)
    assert final.status_code == 201 and final.json()["status"] == "completed"
    assert "Idempotent-Replayed" not in final
    replay = post(shopper_client)
    assert replay["Idempotent-Replayed"] == "true" and replay.content == final.content
    assert ProbeRecord.objects.count() == 1 and len(stub.effects) == 1


def test_outside_failure_after_a_phase_is_not_stored_and_retry_resumes(shopper_client, stub):
    stub.mode = "fail"
    assert_problem(post(shopper_client), 503, "probe_stub_unavailable")
    row = IdempotencyKey.objects.get()
    assert row.recovery_point == "recorded" and row.leased_by is None
    stub.mode = "ok"
    assert post(shopper_client).status_code == 201
    assert ProbeRecord.objects.count() == 1


@pytest.mark.parametrize(
    "boundary",
    [
        "idempotency.claim.after_insert",
        "probe.run.recorded.before_commit",
        "probe.run.recorded.after_commit",
        "probe.run.after_call",
        "probe.run.finished.before_commit",
        "probe.run.finished.after_commit",
    ],
)
def test_raise_at_each_boundary_then_retry_gives_one_effect(
    shopper_client, stub, monkeypatch, tmp_path, boundary
):
    monkeypatch.setenv(failpoints.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(failpoints.ENV_SPEC, f"{boundary}=raise@1")
    shopper_client.raise_request_exception = False
    assert_problem(post(shopper_client), 500, "internal_error")
    final = post(shopper_client)
    assert final.status_code == 201
    assert ProbeRecord.objects.count() == 1 and len(stub.effects) == 1
    assert OutboxMessage.objects.count() == 1
    assert post(shopper_client).content == final.content


def test_schema_declares_the_header_required(api_client):
    """Keyed views get the Idempotency-Key header parameter in the OpenAPI schema."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.utils import extend_schema
    from rest_framework.views import APIView

    from idempotency.views import idempotent
    from tests.support.probe_views import ProbeIn

    class Keyed(APIView):
        @extend_schema(request=ProbeIn, responses={201: ProbeIn})
        @idempotent(operation="x")
        def post(self, request, *, key):
            pass

    from django.urls import path

    generator = SchemaGenerator(patterns=[path("keyed/", Keyed.as_view())])
    schema = generator.get_schema(request=None, public=True)
    operation = schema["paths"]["/keyed/"]["post"]
    params = operation["parameters"]
    assert "201" in operation["responses"] and "requestBody" in operation
    assert any(
        p["name"] == "Idempotency-Key" and p["in"] == "header" and p["required"] for p in params
    )


def test_replay_is_one_indexed_read_and_one_counter_upsert(shopper_client, stub):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    first = post(shopper_client)
    with CaptureQueriesContext(connection) as queries:
        again = post(shopper_client)
    assert again.content == first.content
    key_queries = [q["sql"] for q in queries if "idempotency_idempotencykey" in q["sql"]]
    assert len(key_queries) == 1
    sql = key_queries[0]
    assert sql.startswith("SELECT") and '"owner_id" =' in sql and '"key" =' in sql
    writes = [
        q["sql"] for q in queries if not q["sql"].startswith(("SELECT", "SAVEPOINT", "RELEASE"))
    ]
    # The one write is the duplicate count (idempotency.metrics), no write on the key.
    assert len(writes) == 1 and writes[0].startswith("INSERT INTO idempotency_duplicatecount")


def test_body_is_validated_before_a_finished_key_is_matched(shopper_client, stub):
    post(shopper_client)
    assert_problem(post(shopper_client, body={"label": "a"}), 400, "invalid_request")
    malformed = shopper_client.post(
        URL, "{nope", content_type="application/json", HTTP_IDEMPOTENCY_KEY="key-1"
    )
    assert_problem(malformed, 400, "malformed_json")
    assert post(shopper_client)["Idempotent-Replayed"] == "true"
