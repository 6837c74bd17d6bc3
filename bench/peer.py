"""The peer: the shop's checkout keyed by drf-idempotencykey 0.2.0 instead of ours (bench only).

`POST /api/v1/_bench/orders-peer/` places an order exactly as
`POST /api/v1/orders/` does (same serializer, same services, same phases
committed as plain transactions by `UnkeyedRun`), but the request key is
handled by `drf_idempotencykey.mixins.DrfIdempotencyKeyMixin`: its own key
table, claimed in a transaction of its own before the view runs, the
response stored in another transaction after it. Mounted only by the
bench's gunicorn settings (`bench.gunicorn_settings`), never by production.

Failpoints for the crash measurements (inert unless SHOP_FAILPOINTS names them):

- `bench.peer.before_save_answer`: the order's effects are committed, the
  peer has not stored the response yet;
- `bench.before_answer` (`CrashBeforeAnswer`, any endpoint): the view has
  returned (ours: the last phase committed the effects and the stored
  answer in one transaction; the peer: the response stored), nothing sent.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from drf_idempotencykey.mixins import DrfIdempotencyKeyMixin
from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView

from idempotency.failpoints import failpoint
from idempotency.views import answer_response
from orders import operations
from orders.api import presenters
from orders.api.serializers import OrderIn
from orders.api.views import ORDER_PERMISSIONS
from tests.support.unkeyed import UnkeyedRun

PEER_PATH = "/api/v1/_bench/orders-peer/"


class PeerOrderView(DrfIdempotencyKeyMixin, GenericAPIView):
    """The checkout, keyed the drf-idempotencykey way (its key must be a UUID)."""

    permission_classes = ORDER_PERMISSIONS
    require_idempotency_key = True

    @extend_schema(exclude=True)
    def post(self, request):
        data = OrderIn(data=request.data)
        data.is_valid(raise_exception=True)
        run = UnkeyedRun(operation=operations.CREATE)
        operations.order_place_keyed(
            run=run, present=presenters.order_created, user=request.user, **data.validated_data
        )
        return answer_response(run.answer, replayed=False)

    def _post_idempotent_response(self, response: HttpResponse) -> None:
        failpoint("bench.peer.before_save_answer")
        super()._post_idempotent_response(response)


class CrashBeforeAnswer:
    """Middleware: `failpoint("bench.before_answer")` after the view, before the answer leaves."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.method == "POST":
            failpoint("bench.before_answer")
        return response
