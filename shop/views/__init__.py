"""The storefront's pages: plain Django views over the API's services and keyed operations.

One module per job: `catalog` (catalog, product, cart, checkout), `orders`
(the shopper's orders, decisions, cancellation, returns), `accounts`
(account page, sign-up, log-in/out, passwords), and `common` (what they
share). Every form answers Post/Redirect/Get: a 303 to the page that shows
the outcome, or the form again with a clear message. The keyed forms
(checkout, the decision on a short order, cancellation, returns) run through
`idempotency.views.idempotent_form` under the storefront's own operation
names (shop/checkout.py, shop/returns.py).
"""
