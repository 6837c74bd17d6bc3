"""The API's answers to the keyed order operations: a domain result → status and body.

The operations (orders/operations.py) decide; these render what the contract
says, byte for byte what the request key stores and replays. Each declares
the API's operation name it answers (`keyed_operation`), so a key the
completer finishes holds the answer the API would have stored.
"""

from __future__ import annotations

from idempotency.keys import Reply, Result, keyed_operation

from .. import operations
from .serializers import order_body, refund_body, return_body, shipment_body

PENDING_STATUS = 202


def _order_reply(result: Result, *, status: int) -> Reply:
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    if not result.final:
        return Reply(status=PENDING_STATUS, body=order_body(result.value))
    return Reply(status=status, body=order_body(result.value))


@keyed_operation(operations.CREATE, resume=operations.order_resume)
def order_created(result: Result) -> Reply:
    """POST /orders/: 201 with the order, 202 while its payment is unknown, or the problem."""
    return _order_reply(result, status=201)


@keyed_operation(operations.CONFIRM, resume=operations.order_resume)
def order_confirmed(result: Result) -> Reply:
    """POST /orders/{id}/confirm/: 200 with the order, 202 while unknown, or the problem."""
    return _order_reply(result, status=200)


@keyed_operation(operations.CANCEL)
def order_cancelled(result: Result) -> Reply:
    """POST /orders/{id}/cancel/: 202 when this request started the cancellation's
    compensation (`cancelling`), 200 with the order otherwise, or the problem."""
    started = getattr(result.value, "cancel_started", False)
    return _order_reply(result, status=202 if started else 200)


@keyed_operation(operations.SHIPMENT_CREATE)
def shipment_created(result: Result) -> Reply:
    """POST /orders/{id}/shipments/: 201 with the shipment, or the problem."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=201, body=shipment_body(result.value))


@keyed_operation(operations.REFUND_CREATE)
def refund_created(result: Result) -> Reply:
    """POST /orders/{id}/refunds/: 201 with the refund, or the problem (409, 422)."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=201, body=refund_body(result.value, order_id=result.value.order_id))


@keyed_operation(operations.RETURN_CREATE)
def return_created(result: Result) -> Reply:
    """POST /orders/{id}/returns/: 201 with the return body, or the problem (422)."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=201, body=return_body(result.value))


@keyed_operation(operations.RETURN_RECEIVE)
def return_received(result: Result) -> Reply:
    """POST /returns/{id}/receive/: 202 with the return body (also when already received)."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=202, body=return_body(result.value))
