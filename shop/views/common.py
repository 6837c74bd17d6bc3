"""What the storefront's pages share: the 303 answer, the keyed refusal, problems in words."""

from __future__ import annotations

import functools

from django.http import HttpResponseRedirect

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


def problem_text(code: str | None) -> str | None:
    if not code:
        return None
    return words.PROBLEMS.get(code, "Something went wrong; nothing was charged twice.")
