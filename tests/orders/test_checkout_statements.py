"""The SQL statements of one keyed checkout's happy path, counted (at most 15, in two
transactions: docs/checkout.md, "Two transactions").

Every statement is a round trip and ORM work on the web worker: the count is
pinned, so a change that adds one shows here (and says why in this file).
"""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.orders.conftest import ADDRESS
from tests.support.compiles import orm_compiles

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {
    "lines": [{"sku": "TEE-M", "quantity": 1}],
    "on_shortage": "reject",
    "payment_method": "pm_card_ok",
    "shipping_address": ADDRESS,
}


# Transaction control the driver sends as commands of their own (each a round trip too).
CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")
# Outside any transaction (3): the token (with the courier check), the key read, the
# catalog read. Transaction 1 (7): the key's claim (its lock wait set and reset in the
# same statement), the owner's row lock, the owner's recent and holding orders
# (orders.limits), stock and flags (one UPDATE feeding the flags' INSERT), the order
# with its lines and placed events, the payment prepared for its capture (its event,
# the call's transaction and settlement rows), the key's `reserved` point. The
# provider call, no transaction open. Transaction 2 (5): the capture recorded (the
# payment, its event, the call's row, its settlement), the order's transition (its
# lines, its events), the flags committed, the outbox row, the key's stored answer.
STATEMENTS = 15
TRANSACTIONS = 2  # what must exist before the provider call; what records its outcome


def _place(client):
    return client.post(
        "/api/v1/orders/", BODY, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex
    )


def test_one_keyed_checkout_statements(shopper_client, provider, make_product):
    make_product("TEE-M", price="19.99", stock=5)
    assert _place(shopper_client).status_code == 201  # warm: the token, the content types

    with CaptureQueriesContext(connection) as queries:
        response = _place(shopper_client)

    assert response.status_code == 201, response.content
    statements = [q["sql"] for q in queries if not q["sql"].startswith(CONTROL)]
    assert len(statements) == STATEMENTS, "\n".join(sql[:160] for sql in statements)
    assert sum(q["sql"] == "BEGIN" for q in queries) == TRANSACTIONS


def test_one_keyed_checkout_compiles(shopper_client, provider, make_product):
    make_product("TEE-M", price="19.99", stock=5)
    assert _place(shopper_client).status_code == 201  # warm: SQL written once per process

    with orm_compiles() as compiles:
        response = _place(shopper_client)

    assert response.status_code == 201, response.content
    assert compiles == [], compiles
