"""The SQL statements of one keyed checkout's happy path, counted (issue 21 aims at ≤ 20).

Every statement is a round trip and ORM work on the web worker: the count is
pinned, so a change that adds one shows here (and says why in this file).
"""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.orders.conftest import ADDRESS

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {
    "lines": [{"sku": "TEE-M", "quantity": 1}],
    "on_shortage": "reject",
    "payment_method": "pm_card_ok",
    "shipping_address": ADDRESS,
}


# Transaction control the driver sends as commands of their own (each a round trip too).
CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")
# Outside any transaction: token (with the courier check), key read, catalog read (3);
# phase 1 (key insert with its lock_timeout set and reset, the owner's row lock and the
# read of their recent and holding orders (orders.limits), reserve, order, payment: 13);
# the capture's two payment transactions (5, payments/capture.py); phase 3 (order with
# its payment lock, lines, transition, reservation commit, outbox, answer: 8). 30 before
# issue 21: the courier check, the payment lock and the stock update were statements
# of their own (docs/runs/bench.md, "Statements of one keyed checkout"); 29 since the
# limits per shopper (docs/checkout.md, "Limits per shopper").
STATEMENTS = 29
TRANSACTIONS = 4  # phase 1, the capture's two, phase 3


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
