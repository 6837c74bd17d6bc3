"""Each staff action requires the model permission it changes; couriers only post tracking events.

docs/security.md "One permission map". A staff user who holds every "view"
permission and nothing else gets 403 `permission_denied` from each staff
action of the API, before its request key is claimed: nothing changes and no
key is stored. The control is a staff user holding exactly the action's
permission (and the views): the same request gets past the gate. A courier
who has a cart and an order of their own is refused by every storefront page
that changes something (the storefront's 403 page), and nothing changes.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client

from idempotency.models import IdempotencyKey
from inventory.models import Product, StockItem
from orders.models import Order, ReturnRequest, Shipment, TrackingEvent
from payments.models import Refund
from shop import checkout as shop_checkout
from shop import returns as shop_returns
from shop.cart import cart_add, cart_for
from shop.models import CartLine
from tests.backoffice.attention_support import captured_payment
from tests.conftest import assert_problem, grant
from tests.orders.shipping import confirm, ship

from .conftest import ADDRESS, _hold

pytestmark = pytest.mark.django_db

TRACKING = {
    "event_id": "ev-staff-1",
    "status": "in_transit",
    "occurred_at": "2026-05-01T10:00:00Z",
}

# (name, permission that lets it through, method, path, body). Paths are
# formatted with World.ids() plus {paid}: a confirmed order nobody has shipped.
STAFF_ACTIONS = [
    (
        "refund",
        "orders.refund_order",
        "/api/v1/orders/{order}/refunds/",
        {"amount": "5.00", "currency": "EUR", "reason": "goodwill"},
    ),
    ("cancel_paid_order", "orders.change_order", "/api/v1/orders/{paid}/cancel/", None),
    ("stock_adjust", "inventory.change_stockitem", "/api/v1/products/{sku}/stock/", {"delta": 5}),
    ("shipment_create", "orders.change_order", "/api/v1/orders/{paid}/shipments/", {}),
    (
        "product_create",
        "inventory.add_product",
        "/api/v1/products/",
        {"sku": "NEW", "name": "New", "price": "1.00", "currency": "EUR", "stock": 1},
    ),
    ("return_receive", "orders.change_returnrequest", "/api/v1/returns/{return}/receive/", None),
    (
        "return_ask_for_a_shopper",
        "orders.add_returnrequest",
        "/api/v1/orders/{order}/returns/",
        {"lines": [{"sku": "TEE-M", "quantity": 1}], "reason": "staff asks"},
    ),
    (
        "tracking_event_post",
        "orders.add_trackingevent",
        "/api/v1/shipments/{shipment}/tracking-events/",
        TRACKING,
    ),
]


def view_permissions() -> list[str]:
    return [
        f"{app}.{codename}"
        for app, codename in Permission.objects.filter(codename__startswith="view_").values_list(
            "content_type__app_label", "codename"
        )
    ]


def with_payment(order: Order, amount: str) -> Order:
    """Give a confirmed order a captured payment (as the provider's settlement would)."""
    Order.objects.filter(pk=order.pk).update(payment=captured_payment(amount))
    order.refresh_from_db()
    return order


@pytest.fixture
def paid(world):
    """A confirmed order of alice's, captured, that nothing has shipped; her shipped one paid."""
    with_payment(world.shipped, "20.00")
    return with_payment(confirm(_hold(world.alice, {"TEE-M": 1})), "10.00")


@pytest.fixture
def viewer(make_user, client_for):
    user = make_user(staff=True, username="viewer")
    grant(user, *view_permissions())
    return client_for(user)


def state() -> tuple:
    return (
        sorted(Order.objects.values_list("id", "status", "fulfillment")),
        sorted(ReturnRequest.objects.values_list("id", "status")),
        sorted(StockItem.objects.values_list("product__sku", "on_hand", "reserved")),
        Product.objects.count(),
        Shipment.objects.count(),
        Refund.objects.count(),
        TrackingEvent.objects.count(),
        IdempotencyKey.objects.count(),
        CartLine.objects.count(),
    )


def post(client, path, body, key="perm-key-1"):
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize(
    ("name", "permission", "path", "body"), STAFF_ACTIONS, ids=[a[0] for a in STAFF_ACTIONS]
)
def test_a_view_only_staff_user_is_refused_every_staff_action_and_nothing_changes(
    world, paid, viewer, make_user, client_for, name, permission, path, body
):
    path = path.format(**world.ids(), paid=paid.id)
    before = state()
    assert_problem(post(viewer, path, body), 403, "permission_denied")
    assert state() == before

    # The twin: the same request from staff holding exactly this permission gets through.
    holder = make_user(staff=True, username=f"holder-{name}")
    grant(holder, *view_permissions(), permission)
    allowed = post(client_for(holder), path, body, key="perm-key-2")
    assert allowed.status_code in (200, 201, 202), (allowed.status_code, allowed.content[:300])


def test_reading_reports_needs_their_view_permission(world, make_user, client_for):
    reports = "/api/v1/reports/daily-sales/"
    nothing = client_for(make_user(staff=True, username="no-perms"))
    assert_problem(nothing.get(reports), 403, "permission_denied")
    reader = make_user(staff=True, username="reader")
    grant(reader, "reports.view_dailysalesreport")
    assert client_for(reader).get(reports).status_code == 200


def test_staff_read_any_order_without_a_permission(world, make_user, client_for):
    """Contract: "Staff may read any order" (reading changes nothing)."""
    staff = client_for(make_user(staff=True, username="reads"))
    assert staff.get(f"/api/v1/orders/{world.shipped.id}/").status_code == 200


def test_a_shopper_cancels_their_own_order_without_any_permission(world, paid):
    response = post(world.alice_client, f"/api/v1/orders/{paid.id}/cancel/", None)
    assert response.status_code in (200, 202), response.content[:300]


# --- The storefront refuses couriers -------------------------------------------------


@pytest.fixture
def courier_browser(world, make_user):
    """A courier with a cart line and a shipped order of their own (bought before joining)."""
    courier = make_user(username="courier-shopper")
    order = confirm(_hold(courier, {"TEE-M": 1}))
    ship(order)
    paid = confirm(_hold(courier, {"TEE-M": 1}))
    cart = cart_for(user=courier)
    cart_add(cart=cart, version=cart.version, sku="TEE-M", quantity=1)
    # Joined the couriers after shopping (an employee who bought before).
    courier.groups.add(Group.objects.get_or_create(name="couriers")[0])
    browser = Client()
    browser.force_login(courier)
    browser.user = courier
    browser.shipped, browser.paid = order, paid
    return browser


def assert_refused_page(response) -> None:
    assert response.status_code == 403, (response.status_code, response.get("Location"))
    assert response["Content-Type"].startswith("text/html")
    assert "Couriers" in response.content.decode()


def courier_posts(browser) -> dict[str, dict]:
    cart = cart_for(user=browser.user)
    line = browser.shipped.line_list[0]
    return {
        "/products/TEE-M/": {"quantity": "1", "cart_version": str(cart.version)},
        "/cart/": {"cart_version": str(cart.version), "sku": "TEE-M", "action": "remove"},
        "/checkout/": {
            "idempotency_key": shop_checkout.checkout_key(cart),
            "expected_total": "10.00",
            **{k: ADDRESS[k] for k in ("name", "line1", "city", "postal_code", "country")},
            "payment_method": "pm_card_ok",
            "on_shortage": "reject",
        },
        f"/orders/{browser.paid.id}/cancel/": {
            "idempotency_key": shop_checkout.cancel_key(browser.paid)
        },
        f"/orders/{browser.shipped.id}/return/": {
            "idempotency_key": shop_returns.return_form_key(browser.shipped),
            f"quantity_{line.id}": "1",
            "reason": "courier",
        },
        "/account/email/": {
            "email": "courier-new@example.com",
            "current_password": "correct horse battery",
        },
        "/account/delete/": {"confirm": "yes"},
    }


def test_the_storefront_refuses_a_courier_every_page_that_changes_something(courier_browser):
    browser = courier_browser
    email = browser.user.email
    for path, form in courier_posts(browser).items():
        before = state()
        assert_refused_page(browser.post(path, form))
        assert state() == before, path
    browser.user.refresh_from_db()
    assert browser.user.email == email and browser.user.is_active
    # Browsing stays open: the catalog, a product, the courier's own order page.
    for path in ("/", "/products/TEE-M/", f"/orders/{browser.shipped.id}/"):
        assert browser.get(path).status_code == 200, path


def test_a_shopper_is_not_refused_by_the_courier_rule(world):
    """The control: the same add-to-cart from a shopper changes the cart."""
    browser = Client()
    browser.force_login(world.bob)
    cart = cart_for(user=world.bob)
    response = browser.post("/products/TEE-M/", {"quantity": "1", "cart_version": cart.version})
    assert response.status_code == 303
    assert CartLine.objects.filter(cart=cart).count() == 1


def test_the_refusal_page_is_the_storefronts(courier_browser):
    response = courier_browser.post("/products/TEE-M/", {"quantity": "1", "cart_version": "0"})
    assert_refused_page(response)
    assert re.search(r"<title>[^<]*</title>", response.content.decode())
