"""acknowledged_writes_kept: every 2xx the clients got is still in the database at the end."""

from __future__ import annotations

import uuid

import pytest

from tools.chaos import invariants
from tools.chaos.invariants import check_acknowledged_writes


def _answer(kind: str, status: int | None, body: dict | None, t: float = 1.0) -> dict:
    return {"kind": kind, "status": status, "body": body, "actor": "chaos0", "t": t}


@pytest.fixture
def database(monkeypatch):
    """The rows the check reads, per table: {table: {id: status}}."""
    tables: dict[str, dict[str, str]] = {}
    asked: list[str] = []

    def rows(sql: str, params=()) -> list[tuple]:
        table = sql.split(" FROM ")[1].split()[0]
        asked.append(table)
        (ids,) = params
        return [(i, s) for i, s in tables.get(table, {}).items() if i in ids]

    monkeypatch.setattr(invariants, "rows", rows)
    return tables


def test_every_acknowledged_write_found_is_no_violation(database):
    order, refund, shipment, ret = (str(uuid.uuid4()) for _ in range(4))
    database.update(
        orders_order={order: "cancelled"},
        payments_refund={refund: "succeeded"},
        orders_shipment={shipment: ""},
        orders_returnrequest={ret: "completed"},
    )
    answers = [
        _answer("checkout", 201, {"id": order, "status": "confirmed"}),
        _answer("checkout", 201, {"id": order, "status": "confirmed"}),  # a replay
        _answer("refund", 201, {"id": refund, "status": "pending"}),
        _answer("shipment", 201, {"id": shipment}),
        _answer("return_request", 201, {"id": ret, "status": "requested"}),
        _answer("return_receive", 202, {"id": ret, "status": "processing"}),
        _answer("cancel", 202, {"id": order, "status": "cancelling"}),
        # Not acknowledged writes: no answer, an error, a 4xx, a read.
        _answer("checkout", None, None),
        _answer("checkout", 503, {"code": "unavailable"}),
        _answer("checkout", 409, {"code": "insufficient_stock"}),
        _answer("courier_event", 202, {}),
    ]
    result = check_acknowledged_writes(answers=answers)
    assert result.violations == [] and result.checked == 7


@pytest.mark.parametrize(
    ("kind", "status", "body_status", "table", "row_status", "why"),
    [
        ("checkout", 201, "confirmed", "orders_order", None, "does not exist"),
        ("checkout", 201, "confirmed", "orders_order", "awaiting_decision", "not one of"),
        ("decide", 200, "partially_confirmed", "orders_order", "expired", "not one of"),
        ("cancel", 200, "cancelled", "orders_order", "confirmed", "not one of"),
        ("refund", 201, "pending", "payments_refund", None, "does not exist"),
        ("shipment", 201, None, "orders_shipment", None, "does not exist"),
        ("return_request", 201, "requested", "orders_returnrequest", None, "does not exist"),
        ("return_receive", 202, "processing", "orders_returnrequest", "requested", "not one of"),
    ],
)
def test_a_write_lost_or_undone_after_its_2xx_is_a_violation(
    database, kind, status, body_status, table, row_status, why
):
    row_id = str(uuid.uuid4())
    if row_status is not None:
        database[table] = {row_id: row_status}
    answers = [_answer(kind, status, {"id": row_id, "status": body_status})]
    result = check_acknowledged_writes(answers=answers)
    assert result.checked == 1
    assert len(result.violations) == 1 and why in result.violations[0], result.violations


@pytest.mark.django_db
def test_the_check_reads_every_table_it_names_on_the_real_schema():
    """The first chaos run's check could not run: it asked orders_shipment for a status."""
    kinds = ("checkout", "refund", "shipment", "return_request", "return_receive")
    answers = [_answer(kind, 201, {"id": str(uuid.uuid4()), "status": "x"}) for kind in kinds]
    result = check_acknowledged_writes(answers=answers)
    assert result.checked == len(kinds)
    assert all("does not exist" in line for line in result.violations), result.violations
