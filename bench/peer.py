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

from idempotency.failpoints import failpoint
from tests.support.unkeyed import OrderPlaceUnkeyedView

PEER_PATH = "/api/v1/_bench/orders-peer/"


class PeerOrderView(DrfIdempotencyKeyMixin, OrderPlaceUnkeyedView):
    """The checkout, keyed the drf-idempotencykey way (its key must be a UUID).

    The unkeyed twin's `post` (the bench's baseline, the same checkout without
    a key) under the peer's mixin, which claims and stores around it.
    """

    require_idempotency_key = True

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
