"""Request middleware: the request id, the log context, one log line and metrics per request.

`RequestIdMiddleware` (first in MIDDLEWARE) takes the client's `X-Request-ID`
when it is a short token of safe characters, else makes one; it is echoed
on the response and bound into the log context (core.logging) with the user
and, once the URL is resolved, the order id of `/orders/<order_id>/` routes.
It writes one `shop.request` line per request (method, route, status,
duration). `RequestMetricsMiddleware` counts requests and their duration in
Prometheus (core.instruments) by method, status and the resolved route's
pattern, never the raw path, so label values stay bounded.
`LocaleMiddleware` picks the shopper's language on every page but the API's,
which answers in LANGUAGE_CODE with neither `Content-Language` nor
`Vary: Accept-Language` (docs/storefront.md, "Languages").
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from django.conf import settings
from django.middleware import locale
from django.utils import translation

from . import instruments
from . import logging as shop_logging
from .problems import is_api_path

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
UNMATCHED_ROUTE = "unmatched"

logger = logging.getLogger("shop.request")


def _route(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return UNMATCHED_ROUTE
    return "/" + (match.route or match.view_name or "?")


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = incoming if _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id
        token = shop_logging.bind(request_id=request_id, request=request, method=request.method)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            response[REQUEST_ID_HEADER] = request_id
            logger.info(
                "%s %s %s",
                request.method,
                _route(request),
                response.status_code,
                extra={
                    "event": "request",
                    "route": _route(request),
                    "status": response.status_code,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )
            return response
        finally:
            shop_logging.reset(token)

    def process_view(self, request, view_func, view_args, view_kwargs):
        order_id = view_kwargs.get("order_id")
        shop_logging.bind(route=_route(request), order_id=order_id)
        return None


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        route = _route(request)
        method = request.method if request.method in instruments.METHODS else "other"
        try:
            instruments.HTTP_REQUESTS.labels(
                method=method, status=str(response.status_code), route=route
            ).inc()
            instruments.HTTP_DURATION.labels(route=route).observe(time.perf_counter() - started)
        except OSError:  # the multiprocess folder is gone or full: lose the sample, not the answer
            logger.warning("request not counted in metrics", exc_info=True)
        return response


class LocaleMiddleware(locale.LocaleMiddleware):
    """Django's LocaleMiddleware for the pages; the API keeps LANGUAGE_CODE and its headers."""

    def process_request(self, request):
        if is_api_path(request.path):
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = settings.LANGUAGE_CODE
            return
        super().process_request(request)

    def process_response(self, request, response):
        if is_api_path(request.path):
            return response
        return super().process_response(request, response)
