"""The storefront's return form: the API's keyed `return.create` under the form's own name.

`/orders/{id}/return/` runs `orders.operations.return_create_keyed` — the
operation behind `POST /api/v1/orders/{id}/returns/` — under the operation
name `shop.return.create`, declared on its presenter answering `303 See
Other` (`return_redirect`), so the completer finishes an abandoned form key with a
redirect too (one phase: an unfinished key committed nothing and is forgotten).

The request key is put in the rendered form and is derived from the business
scope, like the admin's refund form: the order and its returns as they are
when the form is rendered (`return_form_key`). So:

- a double click, a refresh and "resubmit the form?", the back button and
  sending again all carry the same key: one return (the others replay it);
- two tabs opened on the same order before either was sent carry the same
  key too: the second submit replays the first return (same quantities) or
  is refused as `idempotency_key_reused` (other quantities), never a second
  return made by accident;
- once a return is made the order's state moves, so the next form rendered
  gets a new key (asking for another return is a new request);
- the same form sent after its key was purged is still that one return: the
  return keeps the form's scope (`ReturnRequest.form_scope`, docs/idempotency.md,
  "Business scopes that outlive request keys");
- a refusal (`return_exceeds_order`, `line_not_shipped`) is stored under its
  key like an answer; the form shown after it names the refused key
  (`after`), which gives it a fresh one, so the corrected form can be sent.

Whatever the keys, the service counts returnable units under the order's row
lock (shipped − returned − in open returns): two different requests never
return more units than were shipped.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlencode

from django.urls import reverse

from idempotency.keys import Reply, Result, keyed_operation
from orders import selectors as order_selectors

CREATE = "shop.return.create"


def return_form_key(order, *, after: str = "") -> str:
    """The return form's request key: the order and its returns as they are now (+ `after`)."""
    returns, units = order_selectors.returns_and_units_of(order_id=order.id)
    seed = f"{order.id}:{returns}:{units}:{after}"
    return "return-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def return_url(order_id) -> str:
    return reverse("order-return", args=[order_id])


@keyed_operation(CREATE)
def return_redirect(result: Result, *, order_id=None, form_key: str = "") -> Reply:
    """The return form's answer: 303 to the order page (which lists its returns); a refusal
    back to the form naming its code (and the refused key, for a fresh one)."""
    if result.refusal is None:
        return Reply(
            status=303, headers={"Location": reverse("order", args=[result.value.order_id])}
        )
    query = urlencode({"problem": result.refusal.code, "after": form_key})
    url = return_url(order_id) if order_id else reverse("orders")
    return Reply(status=303, headers={"Location": f"{url}?{query}"})
