"""Payment services against the real simulator and PostgreSQL."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from core.due import countdown
from core.errors import ApplicationError
from payments.capture import (
    SUPPORTED_METHODS,
    payment_capture,
    payment_create,
    payment_lookup_once,
    validate_payment_method,
)
from payments.errors import TransactionOpen
from payments.keys import install_id
from payments.models import Payment, PaymentEvent, PaymentSettlement, PaymentStatus
from payments.settlement import payment_settle, settlement_retry_now, settlements_lease_due

from .conftest import assert_reconciled, settle_due

pytestmark = pytest.mark.django_db(transaction=True)


def make_payment(method="pm_card_ok", reference="order-1", amount="19.99"):
    return payment_create(
        reference=reference, amount=Decimal(amount), currency="EUR", payment_method=method
    )


def settlement_of(payment) -> PaymentSettlement:
    return PaymentSettlement.objects.get(transaction__payment=payment)


# -- create ----------------------------------------------------------------------------


def test_create_is_idempotent_per_reference(make_user):
    owner = make_user()
    first = payment_create(
        reference="order-1",
        amount=Decimal("5.00"),
        currency="EUR",
        payment_method="pm_card_ok",
        owner=owner,
    )
    again = payment_create(
        reference="order-1",
        amount=Decimal("5.00"),
        currency="EUR",
        payment_method="pm_card_ok",
        owner=owner,
    )
    assert again.id == first.id
    assert first.status == PaymentStatus.NONE
    with pytest.raises(ApplicationError) as info:
        payment_create(
            reference="order-1",
            amount=Decimal("6.00"),
            currency="EUR",
            payment_method="pm_card_ok",
            owner=owner,
        )
    assert info.value.code == "payment_reference_conflict"


def test_create_inside_the_callers_transaction_rolls_back_with_it():
    with pytest.raises(RuntimeError), transaction.atomic():
        make_payment()
        raise RuntimeError("the caller's phase failed")
    assert not Payment.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"payment_method": "pm_card_stolen"}, "invalid_request"),
        ({"currency": "USD"}, "currency_mismatch"),
        ({"amount": Decimal("0")}, "invalid_request"),
        ({"amount": Decimal("1.001")}, "invalid_request"),
        # Not finite: a 400 like any bad amount (were a TypeError and an InvalidOperation).
        ({"amount": Decimal("Infinity")}, "invalid_request"),
        ({"amount": Decimal("NaN")}, "invalid_request"),
    ],
)
def test_create_refuses_bad_input(kwargs, code):
    params = {
        "reference": "order-1",
        "amount": Decimal("5.00"),
        "currency": "EUR",
        "payment_method": "pm_card_ok",
        **kwargs,
    }
    with pytest.raises(ApplicationError) as info:
        payment_create(**params)
    assert info.value.code == code
    assert not Payment.objects.exists()


def test_supported_methods_are_the_contracts_test_methods():
    assert SUPPORTED_METHODS == {
        "pm_card_ok",
        "pm_card_declined",
        "pm_card_timeout",
        "pm_card_unavailable",
    }
    with pytest.raises(ApplicationError) as info:
        validate_payment_method("tok_visa")
    assert info.value.errors["payment_method"]


# -- capture ---------------------------------------------------------------------------


def test_capture_ok(provider, settled_calls):
    payment = make_payment()
    result = payment_capture(payment_id=payment.id)
    assert result.outcome == "succeeded"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_authorized == payment.amount_captured == Decimal("19.99")
    txn = payment.transactions.get()
    assert txn.provider_key == f"{install_id()}:order-1:capture"
    assert txn.status == "succeeded" and txn.provider_operation_id.startswith("op_")
    assert settlement_of(payment).settled_at is not None
    assert [(e.from_status, e.to_status) for e in payment.events.all()] == [
        ("none", "pending"),
        ("pending", "captured"),
    ]
    assert settled_calls == []  # the caller acts on the returned outcome
    assert len(provider.charges(txn.provider_key)) == 1
    assert_reconciled()


def test_capture_again_does_not_call_the_provider(provider):
    payment = make_payment()
    payment_capture(payment_id=payment.id)
    requests_before = provider.state()["stats"]["requests"]
    again = payment_capture(payment_id=payment.id)
    assert again.outcome == "succeeded"
    assert provider.state()["stats"]["requests"] == requests_before
    assert payment.transactions.count() == 1


def test_capture_declined_is_final(provider):
    payment = make_payment("pm_card_declined")
    result = payment_capture(payment_id=payment.id)
    assert result.outcome == "declined"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.FAILED
    assert payment.amount_captured == 0
    assert settlement_of(payment).settled_at is not None
    assert payment_capture(payment_id=payment.id).outcome == "declined"
    assert_reconciled()


def test_capture_refuses_to_run_inside_a_transaction(provider):
    payment = make_payment()
    with pytest.raises(TransactionOpen), transaction.atomic():
        payment_capture(payment_id=payment.id)
    assert provider.state()["stats"].get("requests", 0) == 0


def test_unknown_outcome_leaves_a_due_soon_settlement_row(provider, settings):
    settings.PAYMENTS_SETTLE_FIRST_DELAY = 30
    payment = make_payment("pm_card_unavailable")
    result = payment_capture(payment_id=payment.id)
    assert result.outcome == "unknown"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.PENDING
    settlement = settlement_of(payment)
    assert settlement.settled_at is None and settlement.attempts == 0
    assert "503" in settlement.last_error
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    assert timedelta(seconds=25) < settlement.next_attempt_at - db_now <= timedelta(seconds=30)


def test_lookup_once_records_a_final_answer_but_sends_nothing(provider, settled_calls):
    payment = make_payment("pm_card_timeout")
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    result = payment_lookup_once(payment_id=payment.id)
    assert result.outcome == "succeeded"
    assert result.payment.status == PaymentStatus.CAPTURED
    assert settled_calls == []
    # A capture that never reached the provider stays unknown: lookup sends nothing.
    lost = make_payment("pm_card_unavailable", reference="order-2")
    payment_capture(payment_id=lost.id)
    assert payment_lookup_once(payment_id=lost.id).outcome == "unknown"
    assert provider.charges(lost.transactions.get().provider_key) == []
    assert_reconciled()


# -- settlement ------------------------------------------------------------------------


def test_settle_is_a_no_op_until_due_and_after_settled(provider, settled_calls):
    payment = make_payment("pm_card_timeout")
    payment_capture(payment_id=payment.id)
    settlement = settlement_of(payment)
    PaymentSettlement.objects.filter(id=settlement.id).update(
        next_attempt_at=Now() + timedelta(minutes=5)
    )
    assert payment_settle(settlement_id=settlement.id).attempts == 0  # not due
    settle_due(payment)
    assert settled_calls == [
        {
            "reference": "order-1",
            "outcome": "succeeded",
            "status": "captured",
            "in_transaction": True,
            "status_in_db": "captured",
        }
    ]
    settled = settle_due(payment)  # due again, but settled: nothing happens
    assert settled.attempts == 1 and settled.settled_at is not None
    assert len(settled_calls) == 1


def test_settle_records_a_decline_and_tells_the_handler(provider, settled_calls, settings):
    payment = make_payment("pm_card_declined")
    settings.PAYMENTS_PROVIDER_URL = "http://127.0.0.1:9"  # the first call cannot connect
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    settings.PAYMENTS_PROVIDER_URL = provider.url
    settle_due(payment)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.FAILED
    assert [c["outcome"] for c in settled_calls] == ["declined"]
    assert_reconciled()


def test_settlement_gives_up_after_the_budget_and_needs_attention(provider, settings):
    settings.PAYMENTS_SETTLE_MAX_ATTEMPTS = 2
    payment = make_payment()
    provider.faults(refuse_connections=True)
    payment_capture(payment_id=payment.id)
    first = settle_due(payment)
    assert (first.attempts, first.needs_attention) == (1, False)
    second = settle_due(payment)
    assert (second.attempts, second.needs_attention) == (2, True)
    assert settle_due(payment).attempts == 2  # no third attempt
    assert PaymentEvent.objects.filter(payment=payment, kind="needs_attention").count() == 1
    assert settlements_lease_due() == []
    # Staff retry: a fresh budget, due now; the provider is back.
    provider.faults(refuse_connections=False)
    retried = settlement_retry_now(settlement_id=second.id)
    assert (retried.attempts, retried.needs_attention) == (0, False)
    payment_settle(settlement_id=second.id)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert_reconciled()


def test_each_attempt_schedules_the_next_with_backoff_before_calling(provider, settings):
    settings.PAYMENTS_SETTLE_BACKOFF_BASE = 100
    payment = make_payment()
    provider.faults(refuse_connections=True)
    payment_capture(payment_id=payment.id)
    settlement = settle_due(payment)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    # Attempt 1 waits between 50 and 100 s (equal jitter), judged from the DB clock.
    assert timedelta(seconds=45) < settlement.next_attempt_at - db_now <= timedelta(seconds=100)


def test_backoff_grows_is_capped_and_jittered(settings):
    settings.PAYMENTS_SETTLE_BACKOFF_BASE = 2
    settings.PAYMENTS_SETTLE_BACKOFF_MAX = 60
    for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (6, 60), (40, 60)]:
        delays = {PaymentSettlement.due_policy().backoff(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jitter


def test_countdowns_never_exceed_celery_max(settings):
    assert countdown(10_000) == settings.CELERY_MAX_COUNTDOWN
    assert countdown(settings.PAYMENTS_SETTLE_GRACE) <= settings.CELERY_MAX_COUNTDOWN
    assert countdown(-1) == 0


def test_lease_due_leases_rows_so_a_second_sweep_skips_them(provider):
    payment = make_payment("pm_card_unavailable")
    payment_capture(payment_id=payment.id)
    settlement = settlement_of(payment)
    assert settlements_lease_due() == []  # not due yet
    # Due now, and the capture's ring for later (its lease) lost.
    PaymentSettlement.objects.filter(id=settlement.id).update(
        next_attempt_at=Now(), lease_owner="", lease_expires_at=None
    )
    assert settlements_lease_due() == [settlement.id]
    assert settlements_lease_due() == []
    # The lease does not stop the attempt itself.
    assert payment_settle(settlement_id=settlement.id).attempts == 1
