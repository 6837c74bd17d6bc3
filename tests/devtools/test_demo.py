"""seed_demo: the demo catalog and users, idempotent by the unique constraints."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from devtools.demo.seeding import DEMO_ORDERS, DEMO_PRODUCTS, DEMO_USERS
from inventory.models import Product, StockItem
from orders import tracking
from orders.models import CompensationStep, Order, ReturnRequest, Shipment
from payments.models import Refund

# transaction=True: the demo orders' payments are provider calls, made outside any transaction.
pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

User = get_user_model()


@pytest.fixture(autouse=True)
def _demo_provider(tmp_path, monkeypatch, settings):
    """No provider answers: seeding runs the simulator in-process on a ledger under var/."""
    monkeypatch.setenv("SHOP_VAR_DIR", str(tmp_path))
    settings.PAYMENTS_PROVIDER_URL = "http://127.0.0.1:9"  # discard: nothing listens


def _seed(capsys) -> str:
    call_command("seed_demo", "--demo")
    return capsys.readouterr().out


def test_seed_creates_catalog_with_stock_and_one_user_per_role(capsys, api_client):
    out = _seed(capsys)

    assert Product.objects.count() == len(DEMO_PRODUCTS)
    assert StockItem.objects.get(product__sku="MUG").on_hand == 50  # no demo order has one
    staff = User.objects.get(username="staff")
    assert staff.is_staff and staff.check_password("staff-demo")
    courier = User.objects.get(username="courier")
    assert list(courier.groups.values_list("name", flat=True)) == ["couriers"]
    assert not courier.is_staff
    shopper = User.objects.get(username="shopper")
    assert not shopper.is_staff and not shopper.groups.exists()
    for user in DEMO_USERS:  # credentials are printed
        assert f"{user.username:<8} / {user.password}" in out

    catalog = api_client.get("/api/v1/products/").json()
    skus = {item["sku"]: item for item in catalog["results"]}
    assert set(skus) == {p.sku for p in DEMO_PRODUCTS}
    token = api_client.post(
        "/api/v1/auth/token/", {"username": "shopper", "password": "shopper-demo"}, format="json"
    )
    assert token.status_code == 200


def test_seed_twice_creates_nothing_new(capsys):
    _seed(capsys)
    before = (
        set(Product.objects.values_list("id", flat=True)),
        set(User.objects.values_list("id", "password")),
    )

    out = _seed(capsys)

    assert "created nothing new" in out
    after = (
        set(Product.objects.values_list("id", flat=True)),
        set(User.objects.values_list("id", "password")),
    )
    assert after == before


def test_seed_leaves_existing_rows_alone(capsys, make_user, make_product):
    """A taken username or sku is "already there": no reset password, no restocking."""
    mine = make_user(username="staff")  # not staff, own password
    make_product("MUG", stock=1)

    out = _seed(capsys)

    mine.refresh_from_db()
    assert not mine.is_staff and mine.check_password("correct horse battery")
    assert StockItem.objects.get(product__sku="MUG").on_hand == 1
    assert "existing user, left as is" in out
    assert Product.objects.count() == len(DEMO_PRODUCTS)


def test_seed_gives_the_shopper_an_order_in_each_state_once(capsys, tmp_path):
    out = _seed(capsys)

    statuses = sorted(
        Order.objects.filter(owner__username="shopper").values_list("status", flat=True)
    )
    assert statuses == sorted(
        ["confirmed"] * 4 + ["partially_confirmed", "payment_failed", "awaiting_decision"]
    )
    assert "Demo orders of the shopper:" in out
    shipment = Shipment.objects.get(tracking_number="DP-0001-DEMO", order__lines__sku="TEE-L")
    assert shipment.order.fulfillment == "shipped"
    summary = tracking.tracking_summary(shipment_id=shipment.id)
    assert summary.duplicates_received == 1
    assert len(tracking.tracking_events(shipment_id=shipment.id)) == 4
    # The charges are in the simulator's ledger under var/ (where `make run`'s reads it).
    assert (tmp_path / "payments-simulator.sqlite3").exists()

    before = set(Order.objects.values_list("id", "status"))
    returns_before = set(ReturnRequest.objects.values_list("id", "status"))
    out = _seed(capsys)
    assert set(Order.objects.values_list("id", "status")) == before
    assert set(ReturnRequest.objects.values_list("id", "status")) == returns_before
    assert "created nothing new" in out and "Demo orders" not in out
    assert len(DEMO_ORDERS) == len(before)


def test_seed_gives_the_shopper_a_completed_return_and_one_needing_attention(capsys):
    """Through the real services: the completed one refunded at the provider; the other
    restocked, its refund step stopped for staff (nothing refunded yet)."""
    _seed(capsys)

    completed = ReturnRequest.objects.get(status="completed")
    steps = CompensationStep.objects.filter(order_return=completed)
    assert sorted(steps.values_list("status", flat=True)) == ["done"] * 5
    (refund,) = Refund.objects.filter(payment_id=completed.order.payment_id)
    assert refund.status == "succeeded" and refund.amount == completed.refund_amount

    attention = ReturnRequest.objects.get(status="needs_attention")
    by_name = dict(
        CompensationStep.objects.filter(order_return=attention).values_list("name", "status")
    )
    assert by_name["restock"] == "done" and by_name["refund"] == "failed"
    assert CompensationStep.objects.get(order_return=attention, name="refund").last_error
    assert not Refund.objects.filter(payment_id=attention.order.payment_id).exists()
    assert ReturnRequest.objects.count() == 2


def test_seed_refuses_without_demo_flag_or_shop_demo(monkeypatch):
    """Published passwords never land in a database by accident."""
    from django.core.management.base import CommandError

    monkeypatch.delenv("SHOP_DEMO", raising=False)
    with pytest.raises(CommandError, match="--demo"):
        call_command("seed_demo")
    assert not get_user_model().objects.filter(username="staff").exists()
