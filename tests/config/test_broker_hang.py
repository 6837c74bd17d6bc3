"""A hung broker (Redis SIGSTOPped) holds a checkout about a second, not a web thread each.

A real gunicorn whose broker and cache are a redis-server of the test's own;
the server is stopped (SIGSTOP: connections open, nothing answers), and
checkouts whose payment stays pending (they ring the settlement's doorbell
after commit) are answered within a bound, their settlement rows written for
the sweeper. Before: every ring waited the broker's 5 s socket timeout, each
request in turn, and the chaos run's redis_hang filled all of a host's web
threads (docs/failure-model.md, "Dependency faults").
"""

from __future__ import annotations

import shutil
import time

import pytest
import requests

from core.api_tokens import api_token_issue
from payments.models import PaymentSettlement
from tests.orders.conftest import ADDRESS
from tests.support.redis_server import redis_server
from tests.support.simulator import Simulator

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

PROVIDER_TIMEOUT = 1.0  # pm_card_timeout: the provider's answer never comes
# The provider's timeout, one ring's broker timeout (1 s), and room for a loaded machine.
BOUND = PROVIDER_TIMEOUT + 1.0 + 2.0


@pytest.fixture
def provider(tmp_path):
    simulator = Simulator(tmp_path).start()
    yield simulator
    simulator.stop()


def test_checkouts_answer_in_time_while_the_broker_hangs(gunicorn, provider, make_product,
                                                         make_user):  # fmt: skip
    make_product("TEE-M", price="19.99", stock=10)
    token = api_token_issue(user=make_user()).key
    with redis_server() as broker:
        server = gunicorn(
            PAYMENTS_PROVIDER_URL=provider.url,
            PAYMENTS_PROVIDER_TIMEOUT=str(PROVIDER_TIMEOUT),
            REDIS_URL=broker.url(0),
            CELERY_BROKER_URL=broker.url(1),
        )
        broker.hang()
        took = []
        for n in range(3):
            started = time.monotonic()
            response = requests.post(
                f"{server.url}/api/v1/orders/",
                json={
                    "lines": [{"sku": "TEE-M", "quantity": 1}],
                    "on_shortage": "reject",
                    "payment_method": "pm_card_timeout",
                    "shipping_address": ADDRESS,
                },
                headers={"Authorization": f"Token {token}", "Idempotency-Key": f"hang-{n}"},
                timeout=30,
            )
            took.append(time.monotonic() - started)
            assert response.status_code == 202, response.content
        broker.resume()
    assert max(took) < BOUND, [f"{t:.1f}" for t in took]
    # The work is rows: one settlement per pending payment, for the sweeper.
    assert PaymentSettlement.objects.filter(done_at__isnull=True).count() == 3
