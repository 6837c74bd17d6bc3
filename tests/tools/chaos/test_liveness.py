"""The chaos run's liveness phase: staff end every needs-attention item through the admin page.

`tools.chaos.liveness.resolve` runs here as in the run: over HTTP (a live
server), logged in as a staff user holding the permissions the run grants,
reading the "Needs attention" page and posting its keyed forms; `wait`
stands for `check wait` (and, where a test needs it, for the provider
refusing again meanwhile).
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models.functions import Now

from idempotency.models import Delivery
from orders.models import CompensationStep
from orders.states import CompensationKind, StepName, StepStatus
from payments.models import PaymentSettlement, Refund
from tests.backoffice.attention_support import (
    captured_payment,
    every_kind,
    flagged_refund,
    grant,
    order_of,
)
from tools.chaos import liveness
from tools.chaos.run import STAFF_SCRIPT

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery"


@pytest.fixture
def staff():
    """The run's staff user, made by the run's own setup script (with its permissions)."""
    exec(STAFF_SCRIPT.format(password=PASSWORD), {})  # noqa: S102 - the run's script


def _resolve(live_server, wait, **kwargs) -> liveness.Outcome:
    return liveness.resolve(
        url=live_server.url,
        username="chaos-staff",
        password=PASSWORD,
        wait=wait,
        say=lambda message: None,
        **kwargs,
    )


def test_every_kind_is_ended_in_one_round_and_reported(live_server, staff, shopper):
    items = every_kind(shopper)
    waits: list[int] = []
    outcome = _resolve(live_server, lambda: waits.append(1) or 0)
    assert outcome.ok, outcome
    assert (outcome.rounds, outcome.resolved, len(waits)) == (1, 4, 2)
    # The provider refused the refund ("declined"): staff record it as failed, not retry it.
    assert outcome.taken == Counter(
        {
            "settlement retry: done": 1,
            "refund failed: done": 1,
            "dead_letter requeue: done": 1,
            "step retry: done": 1,
        }
    )
    assert Refund.objects.get(id=items["refund"].id).status == "failed"
    assert not PaymentSettlement.objects.get(id=items["settlement"].id).needs_attention
    assert CompensationStep.objects.get(id=items["step"].id).status != StepStatus.FAILED
    assert not Delivery.objects.get(id=items["dead_letter"].id).needs_attention
    assert outcome.rows() == [
        ("liveness: items resolved 4, rounds 1, left 0", "4", "0"),
        ("liveness: quiet after resolution", "1", "0"),
    ]


def test_a_step_waits_for_its_refund_and_staff_try_another_action_when_one_ends_nothing(
    live_server, staff, shopper
):
    payment = captured_payment()
    order = order_of(payment, shopper)
    refund = flagged_refund(payment)
    Refund.objects.filter(id=refund.id).update(
        last_error="refund outcome still unknown after 8 attempts: timeout"
    )
    step = CompensationStep.objects.create(
        kind=CompensationKind.CANCELLATION,
        order=order,
        name=StepName.REFUND,
        position=2,
        status=StepStatus.FAILED,
        needs_attention=True,
        attempts=1,
        refund_id=refund.id,
        last_error=f"refund {refund.id} is needs_attention: see the refund",
    )
    waits: list[int] = []

    def wait() -> int:
        waits.append(1)
        if len(waits) == 2:
            # "Retry now" sent it again and the answer is still unknown: flagged again.
            Refund.objects.filter(id=refund.id).update(
                status="needs_attention", needs_attention=True, updated_at=Now()
            )
        return 0

    outcome = _resolve(live_server, wait)
    assert outcome.ok, outcome
    # Round 1: retry the refund (the step waits); round 2: that ended nothing, so
    # record it failed (the step still waits); round 3: retry the step.
    assert outcome.rounds == 3
    assert outcome.taken == Counter(
        {"refund retry: done": 1, "refund failed: done": 1, "step retry: done": 1}
    )
    assert Refund.objects.get(id=refund.id).status == "failed"
    assert CompensationStep.objects.get(id=step.id).status == StepStatus.PENDING


def test_an_item_no_action_ends_is_left_after_the_rounds_and_fails_the_phase(
    live_server, staff, shopper
):
    order = order_of(captured_payment(), shopper)
    # Flagged but running (what finding 3 left): the page offers no action for it.
    CompensationStep.objects.create(
        kind=CompensationKind.CANCELLATION,
        order=order,
        name=StepName.NOTIFY,
        position=5,
        status=StepStatus.RUNNING,
        needs_attention=True,
        attempts=1,
        last_error="flagged, still running",
    )
    waits: list[int] = []
    outcome = _resolve(live_server, lambda: waits.append(1) or 3, rounds=2)
    assert not outcome.ok
    assert (outcome.rounds, outcome.resolved, len(waits)) == (2, 0, 3)
    assert len(outcome.left) == 1 and outcome.left[0].endswith("(no action offered)")
    assert outcome.rows() == [
        ("liveness: items resolved 0, rounds 2, left 1", "1", "1"),
        ("liveness: quiet after resolution", "1", "1"),
    ]


def test_a_page_the_staff_user_may_not_fully_see_is_no_proof(live_server, make_user, shopper):
    user = make_user(staff=True, username="chaos-staff")  # its password is PASSWORD too
    grant(user, "payments.view_refund")  # the other kinds are not listed for it at all
    items = every_kind(shopper)
    outcome = _resolve(live_server, lambda: 0, rounds=1)
    assert not outcome.ok and outcome.taken == Counter()
    assert outcome.left == [
        "the phase could not go on: RuntimeError: chaos-staff may not view dead_letter, "
        "report_day, settlement, step"
    ]
    assert Refund.objects.get(id=items["refund"].id).status == "needs_attention"


def test_work_still_pending_with_nothing_listed_fails_the_phase(live_server, staff):
    waits: list[int] = []
    outcome = _resolve(live_server, lambda: waits.append(1) or 3, rounds=2)
    assert (outcome.ok, outcome.quiet, outcome.rounds, len(waits)) == (False, False, 0, 3)
    assert outcome.rows()[1] == ("liveness: quiet after resolution", "1", "1")
