"""The unkeyed twin: the real checkout without its request key (the bench's baseline).

`UnkeyedRun` has KeyRun's phase / finish / leave_open interface but claims,
fences, stores and replays nothing, so a retry runs the operation again.
Test-only: installed by the test settings and the bench's gunicorn settings,
never by production.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView

from core.errors import ApplicationError
from idempotency.keys import Answer, answer_for_problem, answer_new
from idempotency.models import FINISHED, STARTED
from idempotency.views import answer_response
from orders import operations
from orders.api import presenters
from orders.api.serializers import OrderIn
from orders.api.views import ORDER_PERMISSIONS


class UnkeyedRun:
    """The run interface of KeyRun without a key: for measuring what the key machinery costs.

    Phases are plain durable transactions; `finish()` / `leave_open()` only
    keep the answer for the caller. Nothing is claimed, fenced, stored or
    replayed, so a retry runs the operation again: never use it for a real
    endpoint (the bench mounts one test-only variant with it).
    """

    def __init__(self, *, operation: str) -> None:
        self.operation = operation
        self.recovery_point = STARTED
        self.resumed = False
        self._data: dict[str, Any] = {}
        self._answer: Answer | None = None
        self.in_phase = False

    @property
    def data(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    @property
    def answer(self) -> Answer | None:
        return self._answer

    @property
    def closed(self) -> bool:
        return self._answer is not None

    @contextlib.contextmanager
    def phase(self, *, next_point: str) -> Iterator[dict[str, Any]]:
        """Run one phase as one transaction; move to `next_point` (or `finished`) on commit."""
        data = copy.deepcopy(self._data)
        self.in_phase = True
        try:
            with transaction.atomic(durable=True):
                yield data
        finally:
            self.in_phase = False
        self._data = data
        self.recovery_point = FINISHED if self.closed else next_point

    def finish(self, *, status: int, body: Any = None, **options: Any) -> None:
        self._answer = answer_new(status=status, body=body, **options)

    def finish_problem(self, exc: ApplicationError) -> None:
        self._answer = answer_for_problem(exc)

    def leave_open(self, *, status: int, body: Any = None, **options: Any) -> None:
        self._answer = answer_new(status=status, body=body, **options)


class OrderPlaceUnkeyedView(GenericAPIView):
    """Test-only: place an order exactly as POST /orders/ does, without the request key.

    Mounted only with SHOP_TEST_ENDPOINTS (the bench's baseline for "keyed
    vs unkeyed"); a retry places a second order.
    """

    permission_classes = ORDER_PERMISSIONS

    @extend_schema(exclude=True)
    def post(self, request):
        data = OrderIn(data=request.data)
        data.is_valid(raise_exception=True)
        run = UnkeyedRun(operation=operations.CREATE)
        operations.order_place_keyed(
            run=run, present=presenters.order_created, user=request.user, **data.validated_data
        )
        return answer_response(run.answer, replayed=False)
