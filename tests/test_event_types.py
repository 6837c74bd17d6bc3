"""Event types have one owner, the producer, and both sides agree on them.

Each producing app names the types it writes to the outbox in one enum
(`orders.event_types.OrderEventType`, `payments.event_types.PaymentEventType`);
consumers import those. The rules: every type a consumer subscribes to is one
some producer emits (a rename on the producer's side cannot leave a consumer
silently ignoring the new name), every emitted type has a consumer or is
declared unconsumed (the producer's `UNCONSUMED`), and no production module
spells an emitted type as a literal string outside its owner.
"""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

from idempotency.messaging import relay
from orders.event_types import UNCONSUMED as ORDERS_UNCONSUMED
from orders.event_types import OrderEventType
from payments.event_types import UNCONSUMED as PAYMENTS_UNCONSUMED
from payments.event_types import PaymentEventType
from shop import emails, events

ROOT = Path(__file__).resolve().parent.parent

OWNERS = {
    Path("orders/event_types.py"): OrderEventType,
    Path("payments/event_types.py"): PaymentEventType,
}
EMITTED = frozenset(str(member) for enum in OWNERS.values() for member in enum)
DECLARED_UNCONSUMED = frozenset(str(t) for t in (*ORDERS_UNCONSUMED, *PAYMENTS_UNCONSUMED))
# The provider's webhook type names (what the provider sends the shop, not what the
# shop publishes): `refund.succeeded` is spelled the same there, as the provider names it.
PROVIDER_NAMES = {Path("payments/provider_events.py"), Path("devtools/simulator/ledger.py")}


def _subscriptions() -> dict[str, frozenset[str]]:
    """Every consumer of the outbox and the types it handles.

    The relay's registry, plus the e-mails consumer, which the test settings
    leave unregistered (SHOP_EMAILS off) but production registers.
    """
    found = {name: consumer.event_types for name, consumer in relay.consumers().items()}
    found.setdefault("emails", emails.EVENT_TYPES)
    return found


def _production_modules() -> list[Path]:
    tops = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    packages = sorted(t for t in tops | {"config", "runner"} if (ROOT / t / "__init__.py").exists())
    paths = [
        path.relative_to(ROOT)
        for package in packages
        if package != "tests"
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]
    # The test settings install the test-support app; they are not production.
    return [path for path in paths if path != Path("config/settings/test.py")]


def test_the_registry_holds_the_shops_consumers():
    # The rules below are vacuous if no consumer is found.
    assert {"loyalty", "purchase_history", "emails"} <= set(_subscriptions())


def test_every_type_a_consumer_handles_is_one_a_producer_emits():
    unknown = {
        name: sorted(types - EMITTED - {relay.ALL_TYPES})
        for name, types in _subscriptions().items()
        if types - EMITTED - {relay.ALL_TYPES}
    }
    assert unknown == {}
    # What the parsers and the mail table switch on, not only what they subscribe to.
    assert events.HANDLED_TYPES <= EMITTED
    assert set(emails.MAILS) <= EMITTED


def test_every_emitted_type_has_a_consumer_or_is_declared_unconsumed():
    consumed = frozenset().union(*_subscriptions().values())
    assert EMITTED - consumed == DECLARED_UNCONSUMED
    # A declared-unconsumed type that someone consumes now is a stale declaration.
    assert DECLARED_UNCONSUMED & consumed == set()


def test_no_production_module_spells_an_emitted_type_outside_its_owner():
    literal = []
    for path in _production_modules():
        if path in OWNERS or path in PROVIDER_NAMES:
            continue
        tree = ast.parse((ROOT / path).read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in EMITTED:
                literal.append(f"{path}:{node.lineno} {node.value!r}")
            # `event_type=f"order.{...}"`: a name built at run time has no owner either.
            if isinstance(node, ast.keyword) and node.arg == "event_type":
                if isinstance(node.value, ast.JoinedStr | ast.Constant):
                    literal.append(
                        f"{path}:{node.value.lineno} event_type={ast.unparse(node.value)}"
                    )
    assert literal == []


def test_the_walk_finds_the_producers():
    found = set(_production_modules())
    assert set(OWNERS) <= found
    assert {Path("orders/services.py"), Path("orders/shipments.py")} <= found
