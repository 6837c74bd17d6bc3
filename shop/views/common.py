"""What the storefront's pages share: the 303 answer, the refusals, problems in words.

The refusals: a keyed form's (the request-key machinery's) and a courier's
(`refuse_couriers`, docs/security.md "One permission map").
"""

from __future__ import annotations

import functools

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.translation import gettext as _

from core.permissions import is_courier
from idempotency.views import form_refusal as keyed_form_refusal

from .. import words


def see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


# A keyed form the request-key machinery refused (in use, reused, malformed key),
# in the storefront's words and page.
form_refusal = functools.partial(
    keyed_form_refusal, texts=words.FORM_REFUSALS, template="shop/form_refusal.html"
)


# What a request may do without changing anything: a courier may browse.
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def refuse_couriers(view):
    """Refuse a courier every request of this page that changes something (403, nothing done).

    Couriers may only post tracking events (contract: "Authentication and
    roles"; docs/security.md "One permission map"): every storefront page that
    changes something wears this decorator, and the route × role test
    (tests/security/test_route_roles.py) holds every page to its row.
    """

    @functools.wraps(view)
    def refusing(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method not in SAFE_METHODS and is_courier(request.user):
            return render(
                request,
                "shop/form_refusal.html",
                {"title": _("Permission denied"), "message": words.COURIER_REFUSAL},
                status=403,
            )
        return view(request, *args, **kwargs)

    return refusing


def problem_text(code: str | None) -> str | None:
    if not code:
        return None
    if code in words.PROBLEMS:
        return str(words.PROBLEMS[code])
    return _("Something went wrong; nothing was charged twice.")
