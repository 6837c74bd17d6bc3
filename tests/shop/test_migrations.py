"""shop/0005 gives the orders in flight the scope their checkout key names.

Run on a database as the previous release left it: shop migrated back to
0004, an order placed from a cart (its key `checkout:<cart>:<version>` still
there) and one through the API, migrated forward, read again.
"""

from __future__ import annotations

import pytest

from tests.support.migrating import migrate, migrate_to_latest

BEFORE = ("shop", "0004_mail")
AFTER = ("shop", "0005_order_scope_from_checkout_keys")
# The other apps as 0005 needs them (their historical models, in both states).
WITH = (("orders", "0008_order_scope"), ("idempotency", "0008_hot_table_autovacuum"))


@pytest.fixture
def at_0004(transactional_db):
    apps = migrate(BEFORE, *WITH)
    yield apps
    migrate_to_latest()


def _order(apps, owner_id: int):
    return apps.get_model("orders", "Order").objects.create(
        owner_id=owner_id,
        status="payment_pending",
        on_shortage="reject",
        payment_method="pm_card_timeout",
        shipping_address={},
        currency="EUR",
        total="19.99",
    )


def _key(apps, owner_id: int, key: str, operation: str, order) -> None:
    apps.get_model("idempotency", "IdempotencyKey").objects.create(
        owner_id=owner_id,
        key=key,
        operation=operation,
        request_method="POST",
        request_path="/checkout/",
        request_fingerprint="0" * 64,
        recovery_point="payment_unknown",
        data={"order_id": str(order.id)},
    )


def test_an_order_in_flight_gets_the_scope_of_its_checkout_key(at_0004, shopper, make_user):
    other = make_user()
    from_cart = _order(at_0004, shopper.pk)
    _key(at_0004, shopper.pk, "checkout:5:3", "shop.order.create", from_cart)
    from_api = _order(at_0004, shopper.pk)
    _key(at_0004, shopper.pk, "checkout:5:4", "order.create", from_api)  # an API client's key
    not_theirs = _order(at_0004, other.pk)
    _key(at_0004, shopper.pk, "checkout:5:5", "shop.order.create", not_theirs)
    keyless = _order(at_0004, shopper.pk)

    after = migrate(AFTER, *WITH)
    scopes = dict(after.get_model("orders", "Order").objects.values_list("id", "scope"))
    assert scopes == {
        from_cart.id: "cart:5:3",
        from_api.id: None,
        not_theirs.id: None,
        keyless.id: None,
    }
