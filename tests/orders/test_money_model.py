"""A model-based test of ONE order's money life (issue 20), on PostgreSQL and the real simulator.

A hypothesis `RuleBasedStateMachine` plays everyone around one paid order
(2 × 10.00 + 1 × 5.50 = 25.50 captured): staff refund goodwill (the keyed
API), the provider approves, declines or loses the answer (the simulator's
control port), the order ships, the shopper asks for partial returns and
staff receive them, the shopper cancels, workers run the refunds and the
compensation steps (the task bodies, called here one at a time, never
through a broker) and die at failpoints or at any SQL statement, the
provider's webhooks arrive (again), staff retry, record "outside the shop" or
"failed", and time passes. Now and then the provider captures another amount
than the one asked (more or less): the order waits in `payment_pending` until
staff "Record what the provider captured" or "Refund the difference"
(docs/payments.md, "A captured amount that differs").

After every rule:
- refunded ≤ reserved ≤ captured, and both are the sums of the refund rows;
- a `cancelled` order has refunded everything it captured;
- reservations are held only while the order is `payment_pending`;
- the shop agrees with the provider's ledger (`payments.reconciliation`),
  up to refunds whose answer was lost and is not recorded yet.

At the end of every run (teardown), the liveness promise: "run all due
work, then take an action offered for each needs-attention item" reaches,
within `ROUNDS` rounds, a state where nothing is pending or needs attention
(a needs-attention item no action ends is a dead end), with
`cancelled` ⇒ refunded = captured, the order out of `payment_pending` with
nothing held, every completed return's refund =
min(its lines' value, what was refundable when its refund step ran), and
reconciliation clean.

`make test` runs the bounded form (`test_money_life`); `make fuzz-money`
(`SHOP_FUZZ_MONEY=<seconds>`, marker `fuzz_money`) runs it for as long as
asked (docs/testing.md, "The model-based test of an order's money life").
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import ClassVar

import pytest
import requests
from celery import current_app
from django.core.cache import cache
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from rest_framework.test import APIClient

from core.errors import ApplicationError
from inventory.models import Reservation
from inventory.services import product_create
from orders.compensation import step_run
from orders.models import CompensationStep, Order, OrderLine, ReturnRequest
from orders.shipments import shipment_create
from payments.models import Payment, PaymentSettlement, Refund, RefundStatus
from payments.reconciliation import (
    DIFFERENT_TOTAL,
    REFUND_DIFFERENT,
    UNRECORDED,
    reconcile_payments,
)
from payments.refunds import refund_run
from payments.selectors import install_id_or_none
from payments.settlement import payment_settle
from tests.orders.compensation_support import ask_return, paid_order, receive
from tests.orders.conftest import ADDRESS
from tests.orders.money_model_support import (
    WorkerKilled,
    attention_items,
    deliver_webhook,
    failpoint_raises,
    money,
    offered_actions,
    reset_database,
    take,
    time_passes,
    worker_dies_at_failpoint,
    worker_dies_at_statement,
)
from tests.support.simulator import Simulator

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"TEE-M": Decimal("10.00"), "CAP": Decimal("5.50")}
ORDERED = {"TEE-M": 2, "CAP": 1}
CAPTURED = sum(PRICES[sku] * q for sku, q in ORDERED.items())  # 25.50
STAFF_ACTIONS = ("retry", "outside", "failed")
# What the provider captured of the 25.50 asked: mostly that, now and then more or less.
CAPTURES = {"asked": None, "more": "1.25", "less": "-0.75"}
CAPTURE_ACTIONS = ("record", "refund_difference", "retry")
REFUND_OUTCOMES = (
    "approved",
    "declined",
    "timed_out_applied",  # the answer is lost; the call reaches the provider after the timeout
    "timed_out_unreached",  # the connection is refused: the provider never got it
    "dies_before_provider",  # the worker dies at `payments.refund.before_provider`
    "dies_after_provider",  # ... at `payments.refund.after_provider`: money moved, not recorded
)
STEP_FAILPOINTS = ("before_effect", "after_effect")
ROUNDS = 6  # staff rounds the liveness phase may take
WAVES = 30  # waves of due work one "run all due work" may take
RETURNS_API = "/api/v1/orders/{}/refunds/"
CANCEL = "/api/v1/orders/{}/cancel/"
# A refund amount: the amounts and anything else up to the captured total.
CENTS = st.one_of(st.sampled_from([2000, 2550, 550, 1000, 1]), st.integers(1, 2550))


@dataclass
class World:
    """What outlives one example: the simulator process and pytest's settings fixture."""

    simulator: Simulator
    settings: object
    examples: int = 0
    keys: itertools.count = field(default_factory=itertools.count)


@dataclass
class StepRun:
    """One run of a return's refund step: what was refundable then, what it created."""

    refundable: Decimal
    created: frozenset
    done_after: bool


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


class MoneyLife(RuleBasedStateMachine):
    world: ClassVar[World]

    def __init__(self) -> None:
        super().__init__()
        self.ready = False

    # -- the order ---------------------------------------------------------------------

    @initialize(
        step_budget=st.sampled_from([1, 2, 3]),
        refund_budget=st.sampled_from([1, 2, 3]),
        preference=st.permutations(STAFF_ACTIONS),
        shipped=st.sampled_from(["nothing", "the tees", "everything"]),
        capture=st.sampled_from(["asked", "asked", "asked", "asked", "more", "less"]),
        capture_preference=st.permutations(CAPTURE_ACTIONS),
    )
    def a_paid_order(
        self,
        step_budget,
        refund_budget,
        preference,
        shipped,
        capture="asked",
        capture_preference=CAPTURE_ACTIONS,
    ):
        """A fresh database, a shopper's paid order (25.50 captured), staff's way of working.

        `capture` "more" / "less": the provider captures another amount than the one asked;
        the order waits in `payment_pending` for staff (nothing ships until then)."""
        world = self.world
        world.examples += 1
        reset_database()
        cache.clear()
        requests.post(f"{world.simulator.control_url}/reset", json={}, timeout=10)
        world.settings.COMPENSATION_MAX_ATTEMPTS = step_budget
        world.settings.PAYMENTS_REFUND_MAX_ATTEMPTS = refund_budget
        self.preference = tuple(preference)
        for sku, price in PRICES.items():
            product_create(sku=sku, name=sku, price=price, currency="EUR", stock=10)
        from django.contrib.auth import get_user_model

        users = get_user_model().objects
        self.shopper = users.create_user(username="shopper", email="shopper@example.com")
        self.staff = users.create_user(username="staff", is_staff=True, is_superuser=True)
        self.shopper_client = _client(self.shopper)
        self.staff_client = _client(self.staff)
        self.capture_preference = tuple(capture_preference)
        self.returns: dict = {}  # return id -> its lines' value
        self.runs: dict = {}  # return id -> [StepRun]
        self.declining = self.unreachable = False  # the provider's state between rules
        if capture != "asked":
            self._order_captured_differently(CAPTURES[capture])
            self.ready = True
            return
        order = paid_order(self.shopper_client, ORDERED, key="order")
        self.order_id, self.payment_id = order.id, order.payment.id
        assert order.payment.amount_captured == CAPTURED
        self.ready = True
        if shipped != "nothing":
            self.staff_ship(only_tees=shipped == "the tees")

    def _order_captured_differently(self, delta: str) -> None:
        """The shopper's order, which the provider captures as 25.50 + `delta`: 202 pending,
        its settlement waiting for staff with the provider's amount."""
        sim = self.world.simulator
        sim.faults(capture_amount_delta=delta)
        try:
            response = self.shopper_client.post(
                "/api/v1/orders/",
                {
                    "lines": [{"sku": sku, "quantity": q} for sku, q in ORDERED.items()],
                    "payment_method": "pm_card_ok",
                    "shipping_address": ADDRESS,
                },
                format="json",
                HTTP_IDEMPOTENCY_KEY="order",
            )
        finally:
            sim.faults(capture_amount_delta=None)
        assert response.status_code == 202, response.content
        order = Order.objects.get(id=response.json()["id"])
        self.order_id, self.payment_id = order.id, order.payment_id
        assert order.status == "payment_pending"
        assert PaymentSettlement.objects.get(
            transaction__payment_id=self.payment_id
        ).needs_attention

    def _key(self) -> str:
        return f"k-{next(self.world.keys)}"

    def _payment(self) -> Payment:
        return Payment.objects.get(id=self.payment_id)

    def _order(self) -> Order:
        return Order.objects.get(id=self.order_id)

    def _refunds(self, *statuses: str) -> list[Refund]:
        rows = Refund.objects.filter(payment_id=self.payment_id)
        if statuses:
            rows = rows.filter(status__in=statuses)
        return list(rows.order_by("created_at", "id"))

    def _open_steps(self) -> list[CompensationStep]:
        return list(
            CompensationStep.objects.filter(order_id=self.order_id, done_at__isnull=True).order_by(
                "id"
            )
        )

    def _refundable(self) -> Decimal:
        payment = self._payment()
        return payment.amount_captured - payment.refund_reserved

    # -- staff refund goodwill -----------------------------------------------------------

    @rule(cents=CENTS, then=st.sampled_from([None, *REFUND_OUTCOMES]))
    def staff_refund_goodwill(self, cents, then):
        """Staff refund goodwill (keyed API); the provider answers it now (`then`) or later."""
        amount = money(Decimal(cents) / 100)
        refundable, order = self._refundable(), self._order()
        response = self.staff_client.post(
            RETURNS_API.format(self.order_id),
            {"amount": str(amount), "currency": "EUR", "reason": "goodwill"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=self._key(),
        )
        assert response.status_code in (201, 409, 422), response.content
        if response.status_code == 201:
            assert amount <= refundable, (amount, refundable)
            if then is not None:
                self._provider_answers(Refund.objects.get(id=response.json()["id"]), then)
        elif amount <= refundable and order.status not in ("cancelling", "cancelled"):
            raise AssertionError(f"{amount} of {refundable} refundable refused: {response.content}")

    # -- the provider answers a refund (a worker runs `payments.refund`) ----------------

    @rule(index=st.integers(0, 5), outcome=st.sampled_from(REFUND_OUTCOMES))
    def provider_answers_a_refund(self, index, outcome):
        pending = self._refunds(RefundStatus.PENDING)
        if pending:
            self._provider_answers(pending[index % len(pending)], outcome)

    def _provider_answers(self, refund, outcome) -> None:
        sim = self.world.simulator
        time_passes()
        try:
            if outcome == "declined":
                sim.faults(decline_refunds=True)
            elif outcome == "timed_out_applied":
                sim.faults(pause="before_apply")
            elif outcome == "timed_out_unreached":
                sim.faults(refuse_connections=True)
            point = {
                "dies_before_provider": "payments.refund.before_provider",
                "dies_after_provider": "payments.refund.after_provider",
            }.get(outcome)
            with worker_dies_at_failpoint(point):
                try:
                    refund_run(refund_id=refund.id)
                except WorkerKilled:
                    pass
        finally:
            sim.faults(decline_refunds=self.declining, refuse_connections=self.unreachable)
            if outcome == "timed_out_applied":
                sim.release()  # the held call goes on: the provider applies it, late
                sim.wait_for(lambda s: not s["paused"] and not s["in_flight"])

    @rule(declining=st.booleans(), unreachable=st.booleans())
    def provider_changes(self, declining, unreachable):
        """From now on the provider declines every new refund / refuses connections (or not)."""
        self.declining, self.unreachable = declining, unreachable
        self.world.simulator.faults(decline_refunds=declining, refuse_connections=unreachable)

    # -- shipping, returns, cancellation -------------------------------------------------

    @rule(only_tees=st.booleans())
    def staff_ship(self, only_tees):
        from orders.shipments import ShipmentLineRequest

        lines = None
        if only_tees:
            left = OrderLine.objects.filter(order_id=self.order_id, sku="TEE-M").values_list(
                "quantity_confirmed", "quantity_shipped"
            )
            confirmed, shipped = left.get()
            if confirmed - shipped <= 0:
                return
            lines = [ShipmentLineRequest(sku="TEE-M", quantity=confirmed - shipped)]
        try:
            shipment_create(order_id=self.order_id, lines=lines, carrier=None, tracking_number=None)
        except ApplicationError as exc:  # nothing left to ship, or a cancelling order
            assert exc.status in (409, 422), exc

    @rule(tees=st.integers(0, 2), caps=st.integers(0, 1), received=st.booleans())
    def shopper_asks_a_return(self, tees, caps, received):
        """The shopper asks to return units (API); staff receive the parcel now or later."""
        wanted = {sku: q for sku, q in (("TEE-M", tees), ("CAP", caps)) if q}
        if not wanted:
            return
        returnable = self._returnable()
        response = ask_return(self.shopper_client, self._order(), wanted, key=self._key())
        fits = all(q <= returnable.get(sku, 0) for sku, q in wanted.items())
        if response.status_code == 201:
            assert fits, (wanted, returnable)
            return_id = response.json()["id"]
            self.returns[return_id] = sum(PRICES[s] * q for s, q in wanted.items())
            if received:
                answer = receive(self.staff_client, return_id, key=self._key())
                assert answer.status_code == 202, answer.content
        else:
            assert response.status_code in (409, 422), response.content
            assert not fits, (wanted, returnable, response.content)

    def _returnable(self) -> dict[str, int]:
        open_units: dict[str, int] = {}
        for ret in ReturnRequest.objects.filter(order_id=self.order_id, status="requested"):
            for line in ret.lines.select_related("order_line"):
                open_units[line.order_line.sku] = open_units.get(line.order_line.sku, 0) + (
                    line.quantity
                )
        return {
            line.sku: line.quantity_shipped - line.quantity_returned - open_units.get(line.sku, 0)
            for line in OrderLine.objects.filter(order_id=self.order_id)
        }

    @rule(index=st.integers(0, 3))
    def staff_receive_a_return(self, index):
        ids = sorted(self.returns)
        if not ids:
            return
        response = receive(self.staff_client, ids[index % len(ids)], key=self._key())
        assert response.status_code == 202, response.content

    @rule()
    def shopper_cancels(self):
        order = self._order()
        shipped = any(line.quantity_shipped for line in order.lines.all())
        response = self.shopper_client.post(
            CANCEL.format(self.order_id), format="json", HTTP_IDEMPOTENCY_KEY=self._key()
        )
        if order.status in ("cancelling", "cancelled"):
            assert response.status_code == 200, response.content
        elif order.status == "payment_pending" or shipped:
            assert response.status_code == 409, response.content
        else:
            assert response.status_code == 202, response.content

    # -- workers run compensation steps ---------------------------------------------------

    @rule(
        index=st.integers(0, 9),
        transient=st.sampled_from([None, *STEP_FAILPOINTS]),
        dies_at=st.one_of(
            st.none(),
            st.sampled_from(STEP_FAILPOINTS),
            st.integers(1, 16),  # at that SQL statement of the attempt
        ),
    )
    def worker_runs_a_step(self, index, transient, dies_at):
        """A worker takes one step's attempt; it may fail there (`raise`) or die (kill)."""
        steps = self._open_steps()
        if not steps:
            return
        step = steps[index % len(steps)]
        time_passes()
        self._run_step(step.id, transient=transient, dies_at=dies_at)

    def _run_step(self, step_id, *, transient=None, dies_at=None) -> None:
        step = CompensationStep.objects.get(id=step_id)
        raising = f"compensation.{step.name}.{transient}" if transient else None
        dying = f"compensation.{step.name}.{dies_at}" if isinstance(dies_at, str) else None
        statement = dies_at if isinstance(dies_at, int) else None
        if raising == dying:
            raising = None  # a worker that dies at the failpoint does not also raise there
        tracked = step.name == "refund" and step.order_return_id is not None
        before = {r.id for r in self._refunds()}
        refundable = self._refundable()
        with failpoint_raises(raising), worker_dies_at_failpoint(dying):
            try:
                with worker_dies_at_statement(statement):
                    step_run(step_id=step_id)
            except WorkerKilled:
                pass
        if tracked:
            created = frozenset({r.id for r in self._refunds()} - before)
            done = CompensationStep.objects.filter(id=step_id, done_at__isnull=False).exists()
            self.runs.setdefault(str(step.order_return_id), []).append(
                StepRun(refundable=refundable, created=created, done_after=done)
            )

    # -- the provider's webhooks -----------------------------------------------------------

    @rule(index=st.integers(0, 9))
    def provider_delivers_a_webhook(self, index):
        """One of the provider's stored events for this shop, delivered (again, or late)."""
        install = install_id_or_none()
        events = [
            e
            for e in self.world.simulator.webhook_events()
            if install and e["operation_key"].startswith(f"{install}:")
        ]
        if events:
            assert deliver_webhook(events[index % len(events)]) == 200

    # -- staff --------------------------------------------------------------------------------

    @rule(index=st.integers(0, 3), action=st.sampled_from(STAFF_ACTIONS))
    def staff_decide_a_refund(self, index, action):
        items = [i for i in self._items() if i.kind == "refund"]
        if not items:
            return
        item = items[index % len(items)]
        with self._ledger_readable():
            offered = offered_actions(
                item, simulator=self.world.simulator, by=self.staff, preference=STAFF_ACTIONS
            )
        for choice in offered:
            if choice.name == action:
                take(choice)

    @rule(index=st.integers(0, 3))
    def staff_retry_a_step(self, index):
        items = [i for i in self._items() if i.kind == "step"]
        if not items:
            return
        item = items[index % len(items)]
        for offered in offered_actions(
            item, simulator=self.world.simulator, by=self.staff, preference=STAFF_ACTIONS
        ):
            take(offered)

    @rule(action=st.sampled_from(CAPTURE_ACTIONS), twice=st.booleans())
    def staff_decide_a_capture(self, action, twice):
        """Staff take one action offered for the settlement (a capture that differs, or one
        past its budget); `twice`: the same decision again (a second tab)."""
        for item in [i for i in self._items() if i.kind == "settlement"]:
            for offered in offered_actions(
                item, simulator=self.world.simulator, by=self.staff, preference=CAPTURE_ACTIONS
            ):
                if offered.name == action:
                    changed = take(offered)
                    if twice and action != "retry":
                        assert not take(offered) or not changed, "decided twice"

    def _items(self):
        return attention_items(payment_id=self.payment_id, order_id=self.order_id)

    @rule()
    def time_passes_and_workers_catch_up(self):
        self._drain()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def money_adds_up(self):
        if not self.ready:
            return
        payment = self._payment()
        assert 0 <= payment.amount_refunded <= payment.refund_reserved <= payment.amount_captured
        refunds = self._refunds()
        succeeded = sum((r.amount for r in refunds if r.status == "succeeded"), Decimal(0))
        held = sum((r.amount for r in refunds if r.status != "failed"), Decimal(0))
        assert payment.amount_refunded == succeeded, (payment.amount_refunded, succeeded)
        assert payment.refund_reserved == held, (payment.refund_reserved, held)

    @invariant()
    def cancelled_means_refunded_everything(self):
        if not self.ready:
            return
        if self._order().status == "cancelled":
            payment = self._payment()
            assert payment.amount_refunded == payment.amount_captured, (
                f"cancelled, but refunded {payment.amount_refunded} of {payment.amount_captured}"
            )

    @invariant()
    def nothing_held_once_decided(self):
        if not self.ready:
            return
        held = Reservation.objects.filter(
            order_line__order_id=self.order_id, state=Reservation.State.HELD
        ).exists()
        assert not held or self._order().status == "payment_pending", self._order().status

    @invariant()
    def shop_agrees_with_provider(self):
        if not self.ready:
            return
        self._reconciled(strict=False)

    @contextlib.contextmanager
    def _ledger_readable(self):
        """The ledger is read on the provider's API port: open it for the look (an observer's
        read, not a call of the shop) while the provider refuses the shop's connections."""
        if self.unreachable:
            self.world.simulator.faults(refuse_connections=False)
        try:
            yield
        finally:
            if self.unreachable:
                self.world.simulator.faults(refuse_connections=True)

    def _reconciled(self, *, strict: bool) -> None:
        """Reconciliation is clean, except (not strict) refunds the provider made whose lost
        answer the shop has not settled yet (the refund still `pending`, or flagged for staff
        after its budget of unknown answers): those keys, and the payment's total off by them."""
        with self._ledger_readable():
            report = reconcile_payments()
        if strict:
            assert report.clean, report.as_dict()
            return
        pending = {
            r.provider_key: r.amount
            for r in self._refunds(RefundStatus.PENDING, RefundStatus.NEEDS_ATTENTION)
        }
        unrecorded = {d.key for d in report.differences if d.kind in (UNRECORDED, REFUND_DIFFERENT)}
        # A capture the provider made with another amount, waiting for staff: not booked yet.
        waiting = set(
            PaymentSettlement.objects.filter(
                transaction__payment_id=self.payment_id, done_at__isnull=True
            ).values_list("transaction__provider_key", flat=True)
        )
        other = [
            d
            for d in report.differences
            if d.kind != DIFFERENT_TOTAL
            and not (d.key in pending and d.key in unrecorded)
            and not (d.kind == UNRECORDED and d.key in waiting)
        ]
        assert not other, report.as_dict()
        if any(d.kind == DIFFERENT_TOTAL for d in report.differences):
            install = install_id_or_none()
            with self._ledger_readable():
                ledger = self.world.simulator.ledger(f"{install}:")
            provider_refunded = sum(
                (
                    Decimal(op["amount"])
                    for op in ledger
                    if op["kind"] == "refund" and op["status"] == "succeeded"
                ),
                Decimal(0),
            )
            payment = self._payment()
            outside = sum(
                (r.amount for r in self._refunds(RefundStatus.SUCCEEDED) if r.outside_shop),
                Decimal(0),
            )
            lost = sum((pending[k] for k in unrecorded if k in pending), Decimal(0))
            assert provider_refunded == payment.amount_refunded - outside + lost, report.as_dict()

    # -- run all due work -----------------------------------------------------------------------

    def _fingerprint(self) -> tuple:
        payment = self._payment()
        return (
            self._order().status,
            payment.status,
            payment.amount_refunded,
            payment.refund_reserved,
            tuple((r.id, r.status) for r in self._refunds()),
            tuple(
                (pk, status, flagged, done_at is not None)  # times move with the clock
                for pk, status, flagged, done_at in CompensationStep.objects.filter(
                    order_id=self.order_id
                )
                .order_by("id")
                .values_list("id", "status", "needs_attention", "done_at")
            ),
            tuple(
                ReturnRequest.objects.filter(order_id=self.order_id)
                .order_by("id")
                .values_list("id", "status")
            ),
        )

    def _drain(self) -> None:
        """Time passes and workers run everything due, until two waves change nothing."""
        seen, quiet = None, 0
        for _ in range(WAVES):
            time_passes()
            for refund in self._refunds(RefundStatus.PENDING):
                refund_run(refund_id=refund.id)
            for step in self._open_steps():
                if not step.needs_attention:
                    self._run_step(step.id)
            for settlement in PaymentSettlement.objects.filter(
                transaction__payment_id=self.payment_id, done_at__isnull=True, needs_attention=False
            ):
                payment_settle(settlement_id=settlement.id)
            self.money_adds_up()
            self.cancelled_means_refunded_everything()
            self.nothing_held_once_decided()
            now = self._fingerprint()
            quiet = quiet + 1 if now == seen else 0
            if quiet >= 2:
                return
            seen = now
        raise AssertionError(f"due work still changing after {WAVES} waves: {seen}")

    # -- the end of every run: liveness ------------------------------------------------------

    def teardown(self):
        if not self.ready:
            return
        requests.post(f"{self.world.simulator.control_url}/reset", json={}, timeout=10)
        self.declining = self.unreachable = False  # the provider recovers
        tries: dict = {}
        for _ in range(ROUNDS):
            self._drain()
            items = self._items()
            if not items:
                break
            for item in items:
                preference = (
                    self.capture_preference if item.kind == "settlement" else self.preference
                )
                actions = offered_actions(
                    item, simulator=self.world.simulator, by=self.staff, preference=preference
                )
                n = tries.get((item.kind, item.pk), 0)
                # Staff try the actions in their order, a different one each round for
                # the same item (pressing "Retry" on a declined refund forever ends nothing).
                for offset in range(len(actions)):
                    if take(actions[(n + offset) % len(actions)]):
                        tries[(item.kind, item.pk)] = n + offset + 1
                        break
                else:
                    self._dead_end(item, f"no action offered ends it: {[a.name for a in actions]}")
        else:
            self._drain()
            for item in self._items():
                self._dead_end(item, f"still needs attention after {ROUNDS} rounds of actions")
        self._assert_finished()

    def _dead_end(self, item, why: str) -> None:
        """Fail, naming the kind of dead end (each raised from its own line, so hypothesis
        reports distinct dead ends as distinct bugs)."""
        text = f"dead end: {item.kind} {item.pk} ({item.reason}): {why}"
        if item.kind == "step":
            step = CompensationStep.objects.get(id=item.pk)
            refund = Refund.objects.filter(id=step.refund_id).first() if step.refund_id else None
            if step.needs_attention and step.status != "failed":
                raise AssertionError(f"[flagged but {step.status}] {text}")
            if refund is not None and refund.status == RefundStatus.FAILED:
                raise AssertionError(f"[its refund was recorded as failed] {text}")
            if "refused" in step.last_error:
                raise AssertionError(f"[its refund is refused] {text}")
            raise AssertionError(f"[step] {text}")
        if item.kind == "refund":
            raise AssertionError(f"[refund] {text}")
        raise AssertionError(f"[{item.kind}] {text}")

    def _assert_finished(self) -> None:
        assert not self._refunds(RefundStatus.PENDING, RefundStatus.NEEDS_ATTENTION), [
            (r.id, r.status, r.last_error) for r in self._refunds()
        ]
        left = [(s.kind, s.name, s.status, s.last_error) for s in self._open_steps()]
        assert not left, f"steps never finished: {left}"
        order, payment = self._order(), self._payment()
        assert order.status != "cancelling", "the cancellation never finished"
        assert order.status != "payment_pending", "the payment was never decided"
        assert not Reservation.objects.filter(
            order_line__order_id=self.order_id, state=Reservation.State.HELD
        ).exists(), "reservations held for ever"
        if order.status == "cancelled":
            assert payment.amount_refunded == payment.amount_captured, (
                f"cancelled with {payment.amount_refunded} of {payment.amount_captured} refunded"
            )
        for ret in ReturnRequest.objects.filter(order_id=self.order_id):
            assert ret.status in ("requested", "completed"), (ret.id, ret.status)
            if ret.status == "completed":
                self._assert_return_refund(ret)
        self._reconciled(strict=True)

    def _assert_return_refund(self, ret) -> None:
        """Its refund = min(its lines' value, what was refundable when its refund step ran)."""
        value = self.returns[str(ret.id)]
        runs = self.runs.get(str(ret.id), [])
        created = set().union(*(run.created for run in runs)) if runs else set()
        succeeded = [r for r in self._refunds(RefundStatus.SUCCEEDED) if r.id in created]
        assert len(succeeded) <= 1, succeeded
        if succeeded:
            (decisive,) = [run for run in runs if succeeded[0].id in run.created]
        else:
            decisive = next(run for run in runs if run.done_after)
        refunded = sum((r.amount for r in succeeded), Decimal(0))
        expected = min(value, decisive.refundable)
        assert refunded == expected, (
            f"return {ret.id} of {value} refunded {refunded}; "
            f"{decisive.refundable} was refundable when its refund step ran"
        )
        body = self.shopper_client.get(f"/api/v1/returns/{ret.id}/").json()
        assert Decimal(body["refund_amount"]) == refunded, body


@pytest.fixture
def world(tmp_path, settings, monkeypatch):
    """The simulator process, quick provider timeouts, and no broker (the bells ring nothing)."""
    simulator = Simulator(tmp_path).start()
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 1.0
    # The model runs the task bodies itself; a bell would only reach a broker.
    monkeypatch.setattr(current_app, "send_task", lambda *args, **kwargs: None)
    MoneyLife.world = World(simulator=simulator, settings=settings)
    yield MoneyLife.world
    simulator.stop()


def _settings(examples: int, *, shrink: bool) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    return settings(
        max_examples=examples,
        stateful_step_count=10,
        deadline=None,
        # Shrinking a failure takes minutes here (each step is real SQL and HTTP), past the
        # suite's per-test timeout: the bounded form reports the failing run as found;
        # SHOP_MONEY_SHRINK=1 (and the long form) shrink it to the shortest.
        phases=[*phases, Phase.shrink] if shrink else phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


SHRINK = os.environ.get("SHOP_MONEY_SHRINK", "") not in ("", "0")


def test_money_life(world):
    """The bounded form (make test): a few examples of an order's money life."""
    run_state_machine_as_test(
        MoneyLife,
        settings=_settings(int(os.environ.get("SHOP_MONEY_EXAMPLES", 20)), shrink=SHRINK),
    )


@pytest.mark.fuzz_money
@pytest.mark.skipif(
    not os.environ.get("SHOP_FUZZ_MONEY"), reason="the long form: SHOP_FUZZ_MONEY=<seconds>"
)
def test_money_life_for_a_while(world):
    """The long form (make fuzz-money): batches of new examples until the time is spent."""
    deadline = time.monotonic() + float(os.environ["SHOP_FUZZ_MONEY"])
    while time.monotonic() < deadline:
        run_state_machine_as_test(MoneyLife, settings=_settings(50, shrink=True))
    print(f"\nmoney model: {world.examples} examples, no failure")


# -- explicit runs: the dead ends, as rules of the same machine ----------------------
#
# Hypothesis draws these sequences only now and then in the bounded form (each needs four or
# five particular rules in order), so the cases issue 20 names are played here as explicit
# runs of the machine: its rules, then every invariant, then the same liveness teardown. Each
# one ends stuck, or with the money wrong, on the code before the fixes (docs/testing.md,
# "The model-based test of an order's money life").


def _play(*moves) -> MoneyLife:
    """Run `moves` (method name, kwargs) on a fresh machine, the invariants after each."""
    machine = MoneyLife()
    for name, kwargs in moves:
        getattr(machine, name)(**kwargs)
        machine.money_adds_up()
        machine.cancelled_means_refunded_everything()
        machine.nothing_held_once_decided()
        machine.shop_agrees_with_provider()
    machine.teardown()
    return machine


def _paid(**overrides):
    kwargs = {
        "step_budget": 1,
        "refund_budget": 1,
        "preference": STAFF_ACTIONS,
        "shipped": "everything",
    } | overrides
    return ("a_paid_order", kwargs)


def test_explicit_a_return_after_a_goodwill_refund_of_20_refunds_5_50_and_completes(world):
    """The issue's first case: 25.50 captured, 20.00 goodwill, a return worth 15.50."""
    machine = _play(
        _paid(),
        ("staff_refund_goodwill", {"cents": 2000, "then": "approved"}),
        ("shopper_asks_a_return", {"tees": 1, "caps": 1, "received": True}),
        ("time_passes_and_workers_catch_up", {}),
    )
    (ret,) = ReturnRequest.objects.filter(order_id=machine.order_id)
    assert ret.status == "completed"
    assert machine._payment().amount_refunded == CAPTURED


def test_explicit_a_return_after_a_goodwill_refund_of_everything_completes(world):
    """The issue's second case: the whole 25.50 as goodwill, then a return (0.00 to refund)."""
    machine = _play(
        _paid(),
        ("staff_refund_goodwill", {"cents": 2550, "then": "approved"}),
        ("shopper_asks_a_return", {"tees": 2, "caps": 0, "received": True}),
        ("time_passes_and_workers_catch_up", {}),
    )
    (ret,) = ReturnRequest.objects.filter(order_id=machine.order_id)
    assert ret.status == "completed"


def test_explicit_record_as_failed_on_a_return_s_refund_then_the_return_completes(world):
    """Finding 1: the return's refund is declined, staff record it as failed, then retry."""
    machine = _play(
        _paid(preference=("failed", "retry", "outside")),
        ("provider_changes", {"declining": True, "unreachable": False}),
        ("shopper_asks_a_return", {"tees": 1, "caps": 0, "received": True}),
        ("time_passes_and_workers_catch_up", {}),
        ("staff_decide_a_refund", {"index": 0, "action": "failed"}),
        ("provider_changes", {"declining": False, "unreachable": False}),
    )
    (ret,) = ReturnRequest.objects.filter(order_id=machine.order_id)
    assert ret.status == "completed"
    assert machine._payment().amount_refunded == PRICES["TEE-M"]


def test_explicit_record_as_failed_on_a_cancellation_s_refund_then_it_is_cancelled(world):
    """Finding 1, the cancellation's side: `order.cancelled` is reached after all."""
    machine = _play(
        _paid(shipped="nothing", preference=("failed", "retry", "outside")),
        ("provider_changes", {"declining": True, "unreachable": False}),
        ("shopper_cancels", {}),
        ("time_passes_and_workers_catch_up", {}),
        ("staff_decide_a_refund", {"index": 0, "action": "failed"}),
        ("provider_changes", {"declining": False, "unreachable": False}),
    )
    assert machine._order().status == "cancelled"


def test_explicit_a_cancellation_while_a_goodwill_refund_is_pending_then_declined(world):
    """Finding 2: 30 % goodwill pending, the shopper cancels, the goodwill is then declined."""
    moves = [
        _paid(shipped="nothing"),
        ("staff_refund_goodwill", {"cents": 1000, "then": None}),
        ("shopper_cancels", {}),
    ]
    # The cancellation's steps run before the provider answers the goodwill refund.
    moves += [("worker_runs_a_step", {"index": 0, "transient": None, "dies_at": None})] * 4
    moves += [
        ("provider_answers_a_refund", {"index": 0, "outcome": "declined"}),
        ("time_passes_and_workers_catch_up", {}),
    ]
    machine = _play(*moves)
    assert machine._order().status == "cancelled"
    assert machine._payment().amount_refunded == CAPTURED


@pytest.mark.parametrize("statement", [8, 10])
def test_explicit_a_worker_dies_right_after_a_step_spends_its_budget(world, statement):
    """Finding 3: the step's only attempt fails and the worker dies at a later statement of it
    (on e8e6275 statements 7-11 fall between the flag and the status: flagged but `running`,
    which no action took up)."""
    machine = _play(
        _paid(step_budget=1),
        ("shopper_asks_a_return", {"tees": 1, "caps": 0, "received": True}),
        ("worker_runs_a_step", {"index": 0, "transient": "before_effect", "dies_at": statement}),
    )
    (ret,) = ReturnRequest.objects.filter(order_id=machine.order_id)
    assert ret.status == "completed"


@pytest.mark.parametrize(
    ("capture", "action"),
    [("more", "refund_difference"), ("more", "record"), ("less", "record")],
)
def test_explicit_a_capture_that_differs_is_decided_then_the_order_is_cancelled(
    world, capture, action
):
    """Issue 32 finding 6: the provider captures another amount; staff decide (twice, as from
    two tabs), the provider's webhook comes late, then the shopper cancels: everything the
    provider captured goes back, once."""
    machine = _play(
        _paid(capture=capture),
        ("provider_delivers_a_webhook", {"index": 0}),
        ("staff_decide_a_capture", {"action": action, "twice": True}),
        ("provider_delivers_a_webhook", {"index": 0}),
        ("time_passes_and_workers_catch_up", {}),
        ("shopper_cancels", {}),
        ("time_passes_and_workers_catch_up", {}),
    )
    payment = machine._payment()
    assert machine._order().status == "cancelled"
    assert payment.amount_captured == CAPTURED + Decimal(CAPTURES[capture])
    assert payment.amount_refunded == payment.amount_captured


def test_explicit_retry_alone_leaves_a_capture_that_differs_a_dead_end(world):
    """The wrong twin: staff who have only "Retry now" (the page before the fix) never end it."""
    with pytest.raises(AssertionError, match=r"\[settlement\] dead end"):
        _play(_paid(capture="less", capture_preference=("retry",)))
