import pytest

from orders.states import (
    FULFILLMENT_TRANSITIONS,
    LINE_TRANSITIONS,
    ORDER_TRANSITIONS,
    Fulfillment,
    IllegalTransition,
    LineStatus,
    OrderStatus,
    check_transition,
)


def test_every_status_has_a_row():
    assert set(ORDER_TRANSITIONS) - {None} == set(OrderStatus.values)
    assert set(LINE_TRANSITIONS) - {None} == set(LineStatus.values)
    assert set(FULFILLMENT_TRANSITIONS) == set(Fulfillment.values)


def test_final_states_have_no_way_out():
    for status in ("payment_failed", "cancelled", "expired"):
        assert ORDER_TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize(
    "source, target",
    [("payment_failed", "confirmed"), ("expired", "payment_pending"), ("confirmed", "expired")],
)
def test_illegal_transitions_are_refused(source, target):
    with pytest.raises(IllegalTransition):
        check_transition(ORDER_TRANSITIONS, source, target)


def test_legal_transition_passes():
    check_transition(ORDER_TRANSITIONS, "awaiting_decision", "expired")
    check_transition(LINE_TRANSITIONS, None, "unavailable")
