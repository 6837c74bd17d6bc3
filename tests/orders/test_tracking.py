"""Tracking events: stored raw (duplicates included), read once each through one selector."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.test import APIClient

from idempotency import metrics
from orders import tracking
from orders.models import TrackingEvent
from tests.concurrency import Workers
from tests.conftest import assert_problem
from tests.orders.shipping import confirm, ship

ROOT = Path(__file__).resolve().parents[2]


def url(shipment) -> str:
    return f"/api/v1/shipments/{shipment.id}/tracking-events/"


def event(event_id: str, occurred_at: str = "2026-05-01T10:00:00Z", **extra) -> dict:
    return {
        "event_id": event_id,
        "status": extra.pop("status", "in_transit"),
        "occurred_at": occurred_at,
        "location": extra.pop("location", "Hub A"),
        **extra,
    }


@pytest.fixture
def courier(make_user, client_for):
    return client_for(make_user(courier=True))


@pytest.fixture
def shipment(make_product, reserve, shopper):
    make_product("TEE-M", stock=10)
    return ship(confirm(reserve({"TEE-M": 2}, owner=shopper)))


def read_all(client, shipment, page_size: int = 50) -> tuple[list[dict], list[dict]]:
    """Follow `next` to the end; return (every result, every page body)."""
    results, pages = [], []
    link = f"{url(shipment)}?page_size={page_size}"
    while link:
        response = client.get(link)
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append(body)
        results += body["results"]
        link = body["next"]
    return results, pages


@pytest.mark.django_db
def test_same_event_three_times_kept_raw_read_once(courier, shopper_client, shipment):
    for _ in range(3):
        response = courier.post(url(shipment), event("ev-1"), format="json")
        assert response.status_code == 202, response.content
    raw = list(TrackingEvent.objects.filter(shipment=shipment).order_by("id"))
    assert len(raw) == 3
    assert raw[0].payload == event("ev-1")
    assert json.loads(raw[0].raw_body) == event("ev-1")

    body = shopper_client.get(url(shipment)).json()
    assert [e["event_id"] for e in body["results"]] == ["ev-1"]
    assert body["results"][0]["status"] == "in_transit"
    assert body["results"][0]["occurred_at"] == "2026-05-01T10:00:00Z"
    assert body["duplicates_received"] == 2 and body["next"] is None


@pytest.mark.django_db
def test_first_received_wins_and_a_different_payload_is_suspicious(courier, staff_client, shipment):
    courier.post(url(shipment), event("ev-1", location="Hub A"), format="json")
    courier.post(url(shipment), event("ev-1", location="Hub B"), format="json")
    courier.post(url(shipment), event("ev-2"), format="json")
    courier.post(url(shipment), event("ev-2"), format="json")
    body = staff_client.get(url(shipment)).json()
    assert [(e["event_id"], e["location"]) for e in body["results"]] == [
        ("ev-1", "Hub A"),
        ("ev-2", "Hub A"),
    ]
    summary = tracking.tracking_summary(shipment_id=shipment.id)
    assert (summary.received, summary.distinct, summary.suspicious) == (4, 2, 1)
    assert body["duplicates_received"] == 2
    # Duplicate monitoring: two repeats suppressed on read, one of them suspicious.
    assert metrics.duplicate_totals()[metrics.ON_READ_DEDUP] == 2
    assert metrics.suspicious_totals()[metrics.ON_READ_DEDUP] == 1


@pytest.mark.django_db
def test_events_posted_out_of_order_come_back_in_occurred_at_order(courier, staff_client, shipment):
    times = ["2026-05-01T12:00:00Z", "2026-05-01T09:00:00+02:00", "2026-05-01T08:30:00Z"]
    for index, when in enumerate(times):
        courier.post(url(shipment), event(f"ev-{index}", when), format="json")
    body = staff_client.get(url(shipment)).json()
    assert [e["event_id"] for e in body["results"]] == ["ev-1", "ev-2", "ev-0"]


@pytest.mark.django_db
def test_pagination_over_the_deduplicated_list_is_stable(courier, staff_client, shipment):
    # 30 events, many sharing an instant (ties broken by first-received id), each sent 1-3 times.
    for index in range(30):
        when = f"2026-05-01T10:{index // 4:02d}:00Z"
        for _ in range(1 + index % 3):
            courier.post(url(shipment), event(f"ev-{index:02d}", when), format="json")
    whole = staff_client.get(f"{url(shipment)}?page_size=200").json()["results"]
    assert len(whole) == 30 and len({e["event_id"] for e in whole}) == 30

    paged, pages = read_all(staff_client, shipment, page_size=7)
    assert paged == whole
    assert [len(p["results"]) for p in pages] == [7, 7, 7, 7, 2]
    assert all(p["duplicates_received"] == 30 for p in pages)  # 0+1+2 per 3 events, ×10

    # Duplicates arriving between two pages change nothing that follows.
    first = staff_client.get(f"{url(shipment)}?page_size=7").json()
    for e in whole[:10]:
        courier.post(url(shipment), event(e["event_id"], e["occurred_at"]), format="json")
    second = staff_client.get(first["next"]).json()
    assert second["results"] == whole[7:14]

    assert_problem(staff_client.get(f"{url(shipment)}?cursor=garbage"), 400, "invalid_request")


@pytest.mark.django_db(transaction=True)
def test_same_event_five_times_concurrently(make_user, client_for, shipment, staff_browser_for):
    """No uniqueness check on write: five racing copies are all kept, one is read."""
    couriers = [client_for(make_user(courier=True)) for _ in range(5)]
    barrier = threading.Barrier(5)

    def send(client: APIClient):
        barrier.wait(timeout=10)
        try:
            return client.post(url(shipment), event("ev-race"), format="json").status_code
        finally:
            connection.close()

    workers = Workers()
    for client in couriers:
        workers.start(send, client)
    assert workers.join() == [202] * 5
    assert TrackingEvent.objects.filter(shipment=shipment, event_id="ev-race").count() == 5

    owner = client_for(shipment.order.owner)
    body = owner.get(url(shipment)).json()
    assert [e["event_id"] for e in body["results"]] == ["ev-race"]
    assert body["duplicates_received"] == 4

    page = staff_browser_for().get(f"/admin/orders/shipment/{shipment.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="tracking-event"') == 1
    assert "4 duplicates received" in html


@pytest.fixture
def staff_browser_for(client, make_user):
    def login():
        staff = make_user(staff=True)
        staff.is_superuser = True
        staff.save()
        client.force_login(staff)
        return client

    return login


@pytest.mark.django_db
def test_admin_shows_events_deduplicated(courier, shipment, staff_browser_for):
    for _ in range(3):
        courier.post(url(shipment), event("ev-1", "2026-05-01T11:00:00Z"), format="json")
    courier.post(url(shipment), event("ev-0", "2026-05-01T09:00:00Z"), format="json")
    browser = staff_browser_for()
    html = browser.get(f"/admin/orders/shipment/{shipment.pk}/change/").content.decode()
    assert html.count('class="tracking-event"') == 2
    assert html.index("ev-0") < html.index("ev-1")
    assert "2 duplicates received" in html
    order_page = browser.get(f"/admin/orders/order/{shipment.order_id}/change/").content.decode()
    assert f"/admin/orders/shipment/{shipment.pk}/change/" in order_page
    assert browser.get("/admin/orders/shipment/").status_code == 200
    # The raw table has no admin of its own.
    assert browser.get("/admin/orders/trackingevent/").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"status": "in_transit", "occurred_at": "2026-05-01T10:00:00Z"},
        {"event_id": "", "status": "in_transit", "occurred_at": "2026-05-01T10:00:00Z"},
        {"event_id": 7, "status": "in_transit", "occurred_at": "2026-05-01T10:00:00Z"},
        {"event_id": "e", "status": "in_transit", "occurred_at": "yesterday"},
        {"event_id": "e", "status": "in_transit", "occurred_at": "2026-13-01T10:00:00Z"},
        {"event_id": "e", "status": "in_transit", "occurred_at": "2026-05-01T10:00:00"},
        {"event_id": "e", "status": "in_transit", "occurred_at": 1714557600},
        {"event_id": "e", "status": "teleported", "occurred_at": "2026-05-01T10:00:00Z"},
        {"event_id": "e", "occurred_at": "2026-05-01T10:00:00Z"},
        ["event_id", "e"],
        "just a string",
    ],
)
def test_bad_tracking_events_are_400_nothing_stored(courier, shipment, body):
    response = courier.post(url(shipment), body, format="json")
    assert_problem(response, 400, "invalid_request")
    assert not TrackingEvent.objects.exists()


@pytest.mark.django_db
def test_malformed_json_is_400(courier, shipment):
    response = courier.post(url(shipment), "{not json", content_type="application/json")
    assert_problem(response, 400, "malformed_json")
    assert not TrackingEvent.objects.exists()


@pytest.mark.django_db
def test_who_may_post_and_read(
    courier, shopper_client, staff_client, shipment, make_user, client_for
):
    assert_problem(
        shopper_client.post(url(shipment), event("e"), format="json"), 403, "permission_denied"
    )
    assert staff_client.post(url(shipment), event("e"), format="json").status_code == 202
    assert TrackingEvent.objects.count() == 1
    unknown = "/api/v1/shipments/00000000-0000-0000-0000-000000000000/tracking-events/"
    assert_problem(courier.post(unknown, event("e"), format="json"), 404, "not_found")
    assert_problem(
        courier.post("/api/v1/shipments/nope/tracking-events/", event("e"), format="json"),
        404,
        "not_found",
    )

    other = client_for(make_user())
    assert_problem(other.get(url(shipment)), 404, "not_found")
    assert shopper_client.get(url(shipment)).status_code == 200
    assert staff_client.get(url(shipment)).status_code == 200
    assert_problem(courier.get(url(shipment)), 403, "permission_denied")
    assert_problem(APIClient().get(url(shipment)), 401, "not_authenticated")


# Production code that may use the raw rows' manager: the selector module only.
# (or its table in SQL).
RAW_READER = re.compile(
    r"TrackingEvent\s*\.\s*(objects|_default_manager|_base_manager)\b|\borders_trackingevent\b(?!_)"
)
ALLOWED = {Path("orders/tracking.py")}


def test_nothing_but_the_selector_module_reads_the_raw_rows():
    offenders = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if (
            relative.parts[0] in {"tests", ".venv", "node_modules"}
            or "migrations" in relative.parts
        ):
            continue
        if relative.parts[0].startswith("."):
            continue
        if relative in ALLOWED:
            continue
        text = path.read_text(errors="replace")
        if RAW_READER.search(text):
            offenders.append(str(relative))
    assert offenders == [], f"read tracking events through orders.tracking, not: {offenders}"
    assert RAW_READER.search((ROOT / "orders/tracking.py").read_text())  # the check can match


def test_an_event_without_its_optional_location_is_accepted_not_a_500(shipment, staff_client):
    """Found by the API fuzzer (issue 16): `location` is optional in the schema; omitted, 500."""
    body = {"event_id": "0", "occurred_at": "2000-01-01T00:00:00Z", "status": "delivered"}
    response = staff_client.post(url(shipment), body, format="json")
    assert response.status_code == 202, response.content
    assert TrackingEvent.objects.get(shipment=shipment, event_id="0").location is None


@pytest.mark.parametrize(
    ("occurred_at", "status"),
    [
        (
            "0420-01-17T12:09:34.5383+19:57",
            202,
        ),  # RFC 3339 allows it; PostgreSQL's offsets stop at 15:59
        ("2026-05-01T12:00:00-23:59", 202),
        ("0001-01-01T00:00:00+01:00", 400),  # before year 1 in UTC
        ("9999-12-31T23:59:59-01:00", 400),  # after year 9999 in UTC
    ],
)
def test_any_rfc3339_offset_is_stored_in_utc_or_refused_never_a_500(
    shipment, staff_client, occurred_at, status
):
    """Found by the API fuzzer (issue 16): a +19:57 offset was a 500 (DataError)."""
    body = {"event_id": "e1", "occurred_at": occurred_at, "status": "in_transit"}
    response = staff_client.post(url(shipment), body, format="json")
    assert response.status_code == status, response.content
    if status == 400:
        assert_problem(response, 400, "invalid_request")


def test_a_nul_anywhere_in_an_event_is_a_400_not_a_500(shipment, staff_client):
    """Found by the API fuzzer (issue 16): extra members are kept in the jsonb payload,
    which PostgreSQL cannot hold a NUL in (DataError, 500)."""
    for extra in ({"note\x00": 1}, {"note": ["a\x00b"]}):
        body = {**event("e-nul"), **extra}
        response = staff_client.post(url(shipment), body, format="json")
        assert_problem(response, 400, "invalid_request")
    assert not TrackingEvent.objects.filter(event_id="e-nul").exists()
