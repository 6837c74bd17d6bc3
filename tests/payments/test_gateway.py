"""The simulator client classifies every answer: success, declined (final) or unknown."""

import time
from decimal import Decimal

import pytest

from payments.gateway import Outcome, ProviderUnreachable, get_gateway
from payments.gateway.simulator import SimulatorGateway


def capture(gateway, key, method="pm_card_ok", amount="10.00"):
    return gateway.capture(
        key=key, amount=Decimal(amount), currency="EUR", reference="order-1", payment_method=method
    )


@pytest.fixture
def gateway(provider):
    return get_gateway()


def test_configured_gateway_is_the_simulator_client(gateway, provider):
    assert isinstance(gateway, SimulatorGateway)
    assert gateway.base_url == provider.url


def test_success_carries_the_provider_operation(gateway):
    result = capture(gateway, "k1")
    assert result.outcome == Outcome.SUCCEEDED
    assert result.amount == Decimal("10.00") and result.currency == "EUR"
    assert result.operation_id.startswith("op_")
    assert gateway.lookup(key="k1").outcome == Outcome.SUCCEEDED


def test_decline_is_final(gateway):
    assert capture(gateway, "k1", "pm_card_declined").outcome == Outcome.DECLINED
    assert gateway.lookup(key="k1").outcome == Outcome.DECLINED


def test_503_is_unknown_never_declined(gateway):
    result = capture(gateway, "k1", "pm_card_unavailable")
    assert result.outcome == Outcome.UNKNOWN
    assert result.http_status == 503
    assert gateway.lookup(key="k1").outcome == Outcome.NOT_FOUND


def test_timeout_is_unknown(gateway, provider):
    result = capture(gateway, "k1", "pm_card_timeout")
    assert result.outcome == Outcome.UNKNOWN
    assert result.code == "ReadTimeout"
    assert len(provider.charges("k1")) == 1


def test_refused_connection_is_unknown(gateway, provider):
    provider.faults(refuse_connections=True)
    result = capture(gateway, "k1")
    assert result.outcome == Outcome.UNKNOWN
    assert result.code == "ConnectionError"
    assert gateway.lookup(key="k1").outcome == Outcome.UNKNOWN


def test_key_reused_with_other_parameters_is_unknown(gateway):
    """The key already moved money under other parameters: not a decline."""
    assert capture(gateway, "k1").outcome == Outcome.SUCCEEDED
    result = capture(gateway, "k1", amount="11.00")
    assert result.outcome == Outcome.UNKNOWN
    assert result.http_status == 422


def test_request_refused_as_invalid_is_unknown_not_declined(gateway):
    """A 400 is not the provider's decline: only a stored `declined` operation is final."""
    result = gateway.refund(
        key="r1", capture_key="missing", amount=Decimal("1.00"), currency="EUR", reference="ret-1"
    )
    assert result.outcome == Outcome.UNKNOWN
    assert (result.http_status, result.code) == (400, "invalid_parent")


def test_decline_carries_the_providers_decline_code(gateway):
    result = capture(gateway, "k1", "pm_card_declined")
    assert (result.outcome, result.http_status, result.code) == (
        Outcome.DECLINED,
        402,
        "card_declined",
    )
    assert result.operation["status"] == "declined"


# -- a 4xx from in front of the provider is never final (issue 9) -----------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_lookup_answered_4xx_is_unknown(gateway, provider, status):
    """A rotated key, a firewall, a proxy or a misroute says nothing about the charge."""
    result = capture(gateway, "k1", "pm_card_timeout")  # charged; the answer is lost
    assert result.outcome == Outcome.UNKNOWN
    provider.faults(reject_lookups=status)
    result = gateway.lookup(key="k1")
    assert result.outcome == Outcome.UNKNOWN
    assert result.http_status == status
    assert provider.state()["stats"][f"reject_lookups.{status}"] == 1
    assert len(provider.charges("k1")) == 1  # the charge stands


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_lookup_answered_4xx_for_a_key_never_sent_is_unknown_not_not_found(
    gateway, provider, status
):
    """Only the provider's own `not_found` licenses a re-send; a bare 404 does not."""
    provider.faults(reject_lookups=status)
    assert gateway.lookup(key="never-sent").outcome == Outcome.UNKNOWN


def test_lookup_not_found_needs_the_providers_code(gateway, provider):
    result = gateway.lookup(key="never-sent")
    assert (result.outcome, result.http_status, result.code) == (
        Outcome.NOT_FOUND,
        404,
        "not_found",
    )


@pytest.mark.parametrize(
    ("method", "outcome"),
    [("pm_card_ok", Outcome.SUCCEEDED), ("pm_card_declined", Outcome.DECLINED)],
)
def test_lookup_200_with_the_operations_status_is_that_status(gateway, provider, method, outcome):
    capture(gateway, "k1", method)
    provider.faults(reject_lookups=401)
    assert gateway.lookup(key="k1").outcome == Outcome.UNKNOWN
    provider.faults(reject_lookups=None)  # the fault cleared: the provider answers itself
    result = gateway.lookup(key="k1")
    assert (result.outcome, result.http_status) == (outcome, 200)
    assert result.operation["key"] == "k1"


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_charge_answered_4xx_is_unknown_not_declined(gateway, provider, status):
    provider.faults(reject_calls=status)
    result = capture(gateway, "k1", "pm_card_declined")
    assert result.outcome == Outcome.UNKNOWN
    assert result.http_status == status


def test_authorize_capture_void_refund(gateway):
    auth = gateway.authorize(
        key="a1",
        amount=Decimal("10.00"),
        currency="EUR",
        payment_method="pm_card_ok",
        reference="order-2",
    )
    assert auth.outcome == Outcome.SUCCEEDED
    cap = gateway.capture(
        key="c1",
        amount=Decimal("7.00"),
        currency="EUR",
        reference="order-2",
        authorization_key="a1",
    )
    assert cap.outcome == Outcome.SUCCEEDED
    void = gateway.void(key="v1", authorization_key="a1", reference="order-2")
    assert void.outcome == Outcome.SUCCEEDED and void.amount == Decimal("3.00")
    refund = gateway.refund(
        key="r1", capture_key="c1", amount=Decimal("2.00"), currency="EUR", reference="ret-1"
    )
    assert refund.outcome == Outcome.SUCCEEDED


def test_operations_reads_the_whole_ledger(gateway):
    for i in range(3):
        capture(gateway, f"p:{i}")
    assert [op["key"] for op in gateway.operations(key_prefix="p:")] == ["p:0", "p:1", "p:2"]


def test_operations_raises_when_the_ledger_cannot_be_read(gateway, provider):
    provider.faults(refuse_connections=True)
    with pytest.raises(ProviderUnreachable):
        list(gateway.operations(key_prefix=""))


def _seconds_to_classify_a_lost_answer(
    gateway: SimulatorGateway, *, deadline: float | None
) -> float:
    from core.deadline import set_deadline

    set_deadline(deadline)
    started = time.monotonic()
    try:
        result = capture(gateway, f"k-{deadline}", "pm_card_timeout")  # the answer never comes
    finally:
        set_deadline(None)
    assert result.outcome == Outcome.UNKNOWN
    return time.monotonic() - started


def test_a_provider_call_in_a_web_request_waits_no_longer_than_its_deadline(provider):
    """A call made near a request's deadline gets what is left of it, not its whole timeout."""
    gateway = SimulatorGateway(base_url=provider.url, timeout=3.0)
    assert _seconds_to_classify_a_lost_answer(gateway, deadline=0.3) < 1.0
    # Wrong twin: outside a deadline (or before the fix, inside one) the whole timeout.
    assert _seconds_to_classify_a_lost_answer(gateway, deadline=None) >= 2.9
