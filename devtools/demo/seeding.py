"""Demo data for the run command: a small catalog with stock, one user per role, and
the demo shopper's orders in each state the storefront shows (`demo_orders`).

Seeding is idempotent the way everything in this shop is: each row is
inserted first and the unique constraint (product sku, username) says
"already there". A second run creates nothing and changes nothing: stock
levels and passwords that were changed since stay as they are.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from core.money import minor_units, shop_currency
from core.permissions import COURIERS_GROUP
from devtools.simulator.server import Simulator
from inventory import selectors as inventory_selectors
from inventory.services import SkuExists, product_create
from orders import selectors as order_selectors
from orders import services as order_services
from orders import shipments, tracking
from orders.services import LineRequest
from orders.states import OrderStatus
from payments import selectors as payment_selectors
from payments.capture import payment_capture

User = get_user_model()

USERNAME_CONSTRAINT = "auth_user_username_key"


@dataclass(frozen=True)
class DemoProduct:
    sku: str
    name: str
    price: str
    stock: int


@dataclass(frozen=True)
class DemoUser:
    username: str
    password: str
    role: str
    staff: bool = False
    courier: bool = False


DEMO_PRODUCTS = (
    DemoProduct("TEE-S", "T-shirt, size S", "19.99", 25),
    DemoProduct("TEE-M", "T-shirt, size M", "19.99", 40),
    DemoProduct("TEE-L", "T-shirt, size L", "19.99", 30),
    DemoProduct("MUG", "Enamel mug", "12.50", 50),
    DemoProduct("CAP", "Baseball cap", "15.00", 20),
    DemoProduct("POSTER-A2", "Poster, A2 (last few)", "9.90", 3),
    DemoProduct("SOCKS", "Socks (sold out)", "7.00", 0),
)

DEMO_USERS = (
    DemoUser("shopper", "shopper-demo", "shopper: orders through the API and the storefront"),
    DemoUser("staff", "staff-demo", "staff: staff API actions and the admin (/admin/)", staff=True),
    DemoUser("courier", "courier-demo", "courier: posts tracking events", courier=True),
)


@dataclass
class DemoSeed:
    """What one seeding run created, and what it found already there."""

    products_created: list[str] = field(default_factory=list)
    products_existing: list[str] = field(default_factory=list)
    users_created: list[str] = field(default_factory=list)
    users_existing: list[str] = field(default_factory=list)

    @property
    def created_anything(self) -> bool:
        return bool(self.products_created or self.users_created)


@transaction.atomic
def demo_seed() -> DemoSeed:
    """Create the demo catalog and users that are not there yet; touch nothing else."""
    seed = DemoSeed()
    currency = shop_currency()
    quantum = Decimal(1).scaleb(-minor_units(currency))
    for product in DEMO_PRODUCTS:
        try:
            product_create(
                sku=product.sku,
                name=product.name,
                price=Decimal(product.price).quantize(quantum),
                currency=currency,
                stock=product.stock,
            )
        except SkuExists:
            seed.products_existing.append(product.sku)
        else:
            seed.products_created.append(product.sku)
    for demo_user in DEMO_USERS:
        if _user_create(demo_user):
            seed.users_created.append(demo_user.username)
        else:
            seed.users_existing.append(demo_user.username)
    return seed


def _user_create(demo_user: DemoUser) -> bool:
    """Insert the user; False when the username is taken (then leave that user alone)."""
    user = User(
        username=demo_user.username,
        email=f"{demo_user.username}@demo.invalid",
        is_staff=demo_user.staff,
        # Staff get every permission so that the admin is usable in the demo.
        is_superuser=demo_user.staff,
    )
    user.set_password(demo_user.password)
    try:
        with transaction.atomic():
            user.save(force_insert=True)
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) == (
            USERNAME_CONSTRAINT
        ):
            return False
        raise
    if demo_user.courier:
        user.groups.add(Group.objects.get_or_create(name=COURIERS_GROUP)[0])
    return True


# --- Demo orders --------------------------------------------------------------
# The demo shopper gets one order in each state the storefront shows, placed
# through the same services as a checkout (and the real provider protocol), so
# every page has something to show. They are placed once: a shopper who has any
# order already is left alone (a second run creates nothing).

DEMO_ADDRESS = {
    "name": "Demo Shopper",
    "line1": "1 Example Street",
    "city": "Berlin",
    "postal_code": "10115",
    "country": "DE",
}


@dataclass(frozen=True)
class DemoOrder:
    label: str
    lines: dict[str, int]
    on_shortage: str = "reject"
    payment_method: str = "pm_card_ok"
    ship: bool = False
    # A return of one unit of the first line: "completed" (its steps run here, the
    # refund at the provider) or "attention" (restocked, then its refund step stopped
    # for staff: the admin's Returns page has one to "Retry failed steps" on).
    return_: str = ""


DEMO_ORDERS = (
    DemoOrder("shipped, with tracking events (one sent twice)", {"TEE-L": 1, "CAP": 1}, ship=True),
    DemoOrder("confirmed", {"TEE-S": 2, "CAP": 1}),
    DemoOrder(
        "shipped, one returned: return completed, refunded",
        {"TEE-M": 2},
        ship=True,
        return_="completed",
    ),
    DemoOrder(
        "shipped, one returned: refund step needs attention",
        {"TEE-S": 1, "TEE-M": 1},
        ship=True,
        return_="attention",
    ),
    DemoOrder("partially_confirmed", {"TEE-L": 1, "SOCKS": 1}, on_shortage="partial"),
    DemoOrder("payment_failed", {"TEE-S": 1}, payment_method="pm_card_declined"),
    DemoOrder("awaiting_decision", {"CAP": 2, "SOCKS": 2}, on_shortage="ask"),
)

DEMO_TRACKING = (
    ("demo-1", "label_created", "Berlin warehouse", 0),
    ("demo-2", "picked_up", "Berlin", 3),
    ("demo-2", "picked_up", "Berlin", 3),  # the courier's duplicate: shown once
    ("demo-3", "in_transit", "Leipzig hub", 9),
    ("demo-4", "out_for_delivery", "Berlin", 20),
)


def _provider_answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def _demo_provider() -> Iterator[None]:
    """The configured provider if it answers; else the simulator in this process, on the
    ledger file `make run`'s simulator uses (var/), so that its books hold these charges."""
    if _provider_answers(settings.PAYMENTS_PROVIDER_URL):
        yield
        return
    folder = Path(os.environ.get("SHOP_VAR_DIR") or settings.BASE_DIR / "var")
    folder.mkdir(parents=True, exist_ok=True)
    simulator = Simulator(db_path=str(folder / "payments-simulator.sqlite3"))
    simulator.start(port=0)
    try:
        with override_settings(PAYMENTS_PROVIDER_URL=f"http://127.0.0.1:{simulator.api_port}"):
            yield
    finally:
        simulator.stop()


def _place(shopper, demo: DemoOrder):
    products = {
        p.sku: p for p in inventory_selectors.product_list().filter(sku__in=list(demo.lines))
    }
    with transaction.atomic():
        order = order_services.order_hold(
            owner=shopper,
            lines=[LineRequest(product=products[sku], quantity=q) for sku, q in demo.lines.items()],
            on_shortage=demo.on_shortage,
            payment_method=demo.payment_method,
            shipping_address=DEMO_ADDRESS,
        )
        if order.status == OrderStatus.PAYMENT_PENDING:
            order = order_services.order_payment_start(order=order)
    if order.status == OrderStatus.PAYMENT_PENDING and order.payment_id is not None:
        payment_capture(payment_id=order.payment_id)
        order = order_services.order_payment_apply(order_id=order.id)
    return order


def _ship_with_tracking(order) -> None:
    with transaction.atomic():
        shipment = shipments.shipment_create(
            order_id=order.id, lines=None, carrier="DemoPost", tracking_number="DP-0001-DEMO"
        )
    start = timezone.now() - timedelta(days=2)
    for event_id, status, location, hours in DEMO_TRACKING:
        occurred_at = start + timedelta(hours=hours)
        payload = {
            "event_id": event_id,
            "status": status,
            "occurred_at": occurred_at.isoformat(),
            "location": location,
        }
        tracking.tracking_event_record(
            shipment=shipment,
            event_id=event_id,
            status=status,
            occurred_at=occurred_at,
            location=location,
            payload=payload,
            raw_body=json.dumps(payload),
        )


ATTENTION_REASON = (
    "demo: stopped for staff as if the provider had declined the refund; "
    'use "Retry failed steps" to refund it'
)


def _step_run_now(*, step_id) -> str:
    """Make a step due now and run its attempt in this process (the demo plays the worker)."""
    from orders.compensation import step_run
    from orders.models import CompensationStep

    CompensationStep.objects.filter(id=step_id).update(next_attempt_at=Now())
    return step_run(step_id=step_id)


def _refund_run_now(*, refund_id) -> None:
    """Make a refund due now and run its attempt in this process (the demo plays the worker)."""
    from payments.models import Refund
    from payments.refunds import refund_run

    Refund.objects.filter(id=refund_id).update(next_attempt_at=Now())
    refund_run(refund_id=refund_id)


def _step_flag_attention(*, step_id, reason: str) -> None:
    """Stop a pending step for staff, as a refusal would (`failed`, its return
    `needs_attention`); "Retry failed steps" takes it up again."""
    from orders.compensation.state import step_attention
    from orders.models import CompensationStep

    step = CompensationStep.objects.get(id=step_id)
    step_attention(step=step, reason=reason, flag=True)


def _drive(order_return, *, names=None, timeout: float = 30.0) -> None:
    """Play the worker here: run the return's due steps (and its refund) until none is."""
    import time

    from payments.states import RefundStatus

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = order_selectors.return_steps_open(order_return_id=order_return.id, names=names)
        if not steps.exists():
            return
        pending = payment_selectors.refunds_of_payment(payment_id=order_return.order.payment_id)
        for refund in pending.filter(status=RefundStatus.PENDING):
            _refund_run_now(refund_id=refund.id)
        for step in steps.order_by("position"):
            _step_run_now(step_id=step.id)


def _return_one(order, kind: str, *, staff) -> None:
    """A return of one unit of the order's first line, received, through the services."""
    from orders import returns

    line = min(order.line_list, key=lambda line: line.id)
    order_return = returns.return_request(
        order_id=order.id,
        lines=[returns.ReturnLineRequest(sku=line.sku, quantity=1)],
        reason="Too small" if kind == "completed" else "Arrived damaged",
        requested_by=order.owner,
    )
    order_return = returns.return_receive(return_id=order_return.id, by=staff)
    if kind == "completed":
        _drive(order_return)
        return
    _drive(order_return, names=["restock"])
    # Forced: the state shown is a refund step stopped for staff before any refund
    # exists, so that "Retry failed steps" refunds it. No provider answer leads
    # there (a declined refund is stored and stays declined on a retry), so the
    # step is flagged here, through the step's own needs-attention transition.
    refund_step = order_selectors.return_step(order_return_id=order_return.id, name="refund")
    _step_flag_attention(step_id=refund_step.id, reason=ATTENTION_REASON)


def demo_orders() -> list[str]:
    """Give the demo shopper one order per state shown by the storefront, once.

    Runs outside any transaction (each payment is a provider call). Returns the
    labels of the orders placed; empty when the shopper has orders already.
    """
    shopper = User.objects.filter(username="shopper").first()
    if shopper is None or order_selectors.order_list_for_user(user=shopper).exists():
        return []
    staff = User.objects.filter(username="staff").first()
    placed = []
    with _demo_provider():
        for demo in DEMO_ORDERS:
            order = _place(shopper, demo)
            if demo.ship and order.status == OrderStatus.CONFIRMED:
                _ship_with_tracking(order)
                if demo.return_:
                    order = order_selectors.order_get(order_id=order.id)
                    _return_one(order, demo.return_, staff=staff)
            placed.append(f"{demo.label}: order {order.number} {order.status}")
    return placed
