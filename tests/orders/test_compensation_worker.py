"""A return's compensation through a real Celery worker that is killed; a broker that forgets.

The worker's child exits (`os._exit`, like SIGKILL) at
`compensation.<step>.after_effect`: the step's effect is made and its done
transition not committed. The run still ends `completed` with one refund at
the provider, the stock back once and one `return.completed` outbox row;
only the e-mail may go twice (`notify` is at least once, documented).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings

from idempotency.failpoints import hits
from idempotency.models import OutboxMessage
from inventory.models import StockItem
from orders.compensation import step_run
from orders.models import ReturnRequest
from orders.tasks import sweep_compensation
from payments.models import Refund
from payments.tasks import sweep_refunds
from tests.orders.compensation_support import ask_return, receive, shipped_order, steps_of
from tests.payments.refund_support import provider_refunds
from tests.support.broker import queued
from tests.support.servers import wait_until
from tests.support.simulator import assert_reconciled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def worker_env(provider, tmp_path: Path) -> dict:
    return {
        "PAYMENTS_PROVIDER_URL": provider.url,
        "PAYMENTS_PROVIDER_TIMEOUT": "2",
        "PAYMENTS_REFUND_BACKOFF_BASE": "0.3",
        "COMPENSATION_BACKOFF_BASE": "0.3",
        "COMPENSATION_BACKOFF_MAX": "1",
        "COMPENSATION_WAIT_SECONDS": "0.3",
        # A killed attempt's step is due again when its attempt lease runs out: the worst
        # case of a step here (no provider call, a file e-mail), not the hard time limit.
        "COMPENSATION_ATTEMPT_LEASE": "8",
        "EMAIL_URL": f"file://{tmp_path / 'mail'}",
    }


@pytest.fixture
def return_request(provider, make_product, shopper_client):
    make_product("TEE-M", price="10.00", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 3})
    return_id = ask_return(shopper_client, order, {"TEE-M": 2}).json()["id"]
    return ReturnRequest.objects.get(id=return_id)


def completed_by_worker_and_sweeper(ret: ReturnRequest, timeout: float = 90) -> ReturnRequest:
    """Play beat: sweep steps and refunds until the return is completed."""

    def done():
        row = ReturnRequest.objects.get(id=ret.id)
        if row.status == "completed":
            return row
        sweep_compensation.apply()
        sweep_refunds.apply()
        return None

    return wait_until(done, timeout=timeout, interval=0.5, message="the return completes")


def assert_once(ret: ReturnRequest, provider) -> None:
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 10 - 3 + 2
    refunds = provider_refunds(provider)
    assert len(refunds) == 1 and refunds[0]["amount"] == "20.00"
    assert Refund.objects.count() == 1
    assert OutboxMessage.objects.filter(event_type="return.completed").count() == 1
    assert {s.status for s in steps_of(order_return=ret)} == {"done"}
    assert_reconciled()


def mails(tmp_path: Path) -> int:
    folder = tmp_path / "mail"
    return len(list(folder.iterdir())) if folder.exists() else 0


@pytest.mark.parametrize("step", ["restock", "refund", "history", "loyalty", "notify"])
def test_worker_killed_during_each_step_completes_once(
    step, return_request, provider, celery_worker_process, staff_client, tmp_path
):
    worker = celery_worker_process(
        failpoints=f"compensation.{step}.after_effect=exit@1", **worker_env(provider, tmp_path)
    )
    assert receive(staff_client, return_request.id).status_code == 202  # rings the worker
    name = f"compensation.{step}.after_effect"
    wait_until(
        lambda: hits(name, str(tmp_path / "failpoints")) == 1 and f"{name}: exit" in worker.log(),
        timeout=60,
        message=f"the worker's child died in {step}",
    )
    row = completed_by_worker_and_sweeper(return_request)
    assert row.status == "completed"
    killed = steps_of(order_return=return_request).get(name=step)
    assert killed.attempts >= 2  # the killed attempt, then the one that finished it
    assert_once(return_request, provider)
    # notify is at least once: the killed attempt had sent its e-mail already.
    assert mails(tmp_path) == (2 if step == "notify" else 1)


def test_broker_flushed_mid_run_the_sweeper_rings_again(
    return_request, provider, celery_worker_process, staff_client, tmp_path, settings
):
    # A ring leases its row until the row's due time + the kind's lease, so that no
    # sweep rings it again while the ring is on its way (core.due.lease_for_ring): a
    # lost ring is swept once that lease runs out. 90 s by default; 6 s here.
    settings.COMPENSATION_LEASE = 6.0
    settings.PAYMENTS_REFUND_LEASE = 6.0
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    assert receive(staff_client, return_request.id).status_code == 202  # 5 bells queued
    restock = steps_of(order_return=return_request).get(name="restock")
    assert step_run(step_id=restock.id) == "done"  # the run is under way ...
    broker.flushdb()  # ... and the broker forgets every queued bell
    assert queued(broker) == 0
    celery_worker_process(**worker_env(provider, tmp_path))
    time.sleep(2)
    assert ReturnRequest.objects.get(id=return_request.id).status == "processing"  # nothing rings
    row = completed_by_worker_and_sweeper(return_request)
    assert row.status == "completed"
    assert_once(return_request, provider)
