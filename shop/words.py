"""Statuses in words, for the storefront's pages (the contract's values stay in the API).

Every word is a lazy translation: it is looked up in the language active where it
is shown (docs/storefront.md, "Languages"). The models' choices keep the codes
only, so a changed word needs no migration.

Words follow docs/glossary.md: an order is confirmed, a payment captured or
declined, a reservation held until it expires, a shipment tracked by the
courier's tracking events.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

ORDER_STATUS = {
    "awaiting_decision": _("Waiting for your decision"),
    "payment_pending": _("Payment pending"),
    "confirmed": _("Confirmed"),
    "partially_confirmed": _("Partially confirmed"),
    "payment_failed": _("Payment declined"),
    "cancelling": _("Being cancelled"),
    "cancelled": _("Cancelled"),
    "expired": _("Reservation expired"),
}

ORDER_STATUS_HINT = {
    "awaiting_decision": _(
        "Some items are short. The available ones are held for you: "
        "confirm them or cancel the order."
    ),
    "payment_pending": _(
        "We are waiting for the payment provider's answer. Nothing will be charged twice."
    ),
    "confirmed": _("Thank you! Your payment was captured; your items will ship soon."),
    "partially_confirmed": _(
        "We confirmed and charged the items that were available; the others were not charged."
    ),
    "payment_failed": _("Your card was declined. Nothing was charged and the items were released."),
    "cancelling": _("The order is being cancelled; any payment will be refunded."),
    "cancelled": _("This order was cancelled. Nothing more will be charged."),
    "expired": _(
        "You did not decide in time, so the held items were released. Nothing was charged."
    ),
}

LINE_STATUS = {
    "reserved": _("Held for you"),
    "confirmed": _("Confirmed"),
    "unavailable": _("Unavailable"),
    "released": _("Released"),
    "cancelled": _("Cancelled"),
}

PAYMENT_STATUS = {
    "none": _("No payment taken"),
    "pending": _("Pending"),
    "captured": _("Captured"),
    "partially_refunded": _("Partially refunded"),
    "refunded": _("Refunded"),
    "failed": _("Declined"),
}

FULFILLMENT = {
    "unfulfilled": _("Not shipped yet"),
    "partially_shipped": _("Partially shipped"),
    "shipped": _("Shipped"),
}

TRACKING_STATUS = {
    "label_created": _("Label created"),
    "picked_up": _("Picked up"),
    "in_transit": _("In transit"),
    "out_for_delivery": _("Out for delivery"),
    "delivered": _("Delivered"),
    "exception": _("Delivery problem"),
}

RETURN_STATUS = {
    "requested": _("Requested: send the items back"),
    "processing": _("Received: being refunded"),
    "completed": _("Completed: refunded"),
    "needs_attention": _("Received: our staff are looking into it"),
}

STEP_NAME = {
    "restock": _("Items back in stock"),
    "refund": _("Refund"),
    "history": _("Purchase history updated"),
    "loyalty": _("Points adjusted"),
    "notify": _("Email sent"),
}

STEP_STATUS = {
    "pending": _("Waiting"),
    "running": _("In progress"),
    "done": _("Done"),
    "failed": _("Delayed: our staff are looking into it"),
}

REFUND_STATUS = {
    "pending": _("On its way"),
    "succeeded": _("Refunded"),
    "failed": _("Not refunded"),
    "needs_attention": _("Delayed: our staff are looking into it"),
}

REFUND_ORIGIN = {
    "goodwill": _("Goodwill refund"),
    "return": _("Return"),
    "cancellation": _("Cancelled order"),
}

PROBLEMS = {
    "insufficient_stock": _(
        "Some items are not in stock in the quantity you asked for. "
        "Check the availability below, change your cart or choose what to do if some items "
        "are short, then place the order again."
    ),
    "price_changed": _(
        "Prices changed since you opened this page. Check the new total, then "
        "place the order again."
    ),
    "cart_changed": _(
        "Your cart changed since this page was shown (in another tab?). Check it, "
        "then place the order again."
    ),
    "reservation_expired": _(
        "The reservation expired before you confirmed, so nothing was charged."
    ),
    "payment_declined": _("The payment was declined; nothing was charged."),
    "payment_pending": _("The payment's outcome is not known yet; try again once it is."),
    "invalid_state": _("This order cannot be changed that way any more."),
    "return_exceeds_order": _(
        "You asked to return more than was shipped and is not already "
        "returned or in another return. Check the quantities below."
    ),
    "line_not_shipped": _("Only shipped items can be returned; an item you chose has not shipped."),
}


def words(table: Mapping[str, Promise], value: str) -> str:
    if value in table:
        return str(table[value])
    return value.replace("_", " ").capitalize()


# A keyed form the request-key machinery refused (idempotency.views.form_refusal):
# the shopper is pointed at their orders, where the first submission's result shows.
FORM_REFUSALS = {
    "idempotency_key_in_use": _(
        "This form is being sent already. Wait a moment, then open your orders to see the result."
    ),
    "idempotency_key_reused": _(
        "This form was already sent with other details. Your orders "
        "show what became of it; open the form again to start over."
    ),
    "idempotency_key_missing": _("This form is out of date. Open it again and resend it."),
    "idempotency_key_invalid": _("This form is out of date. Open it again and resend it."),
}


# The refused forms' titles (the errors' `title`, English in the API), translated where
# shop/templates/shop/form_refusal.html shows them.
FORM_REFUSAL_TITLES = (
    gettext_noop("Idempotency key missing"),
    gettext_noop("Idempotency key invalid"),
    gettext_noop("Idempotency key in use"),
    gettext_noop("Idempotency key reused"),
)


# The storefront's answer to a courier on a page that changes something (views.common).
COURIER_REFUSAL = _(
    "Couriers may only post tracking events, so nothing was changed. Shopping, returns and "
    "account changes are for shoppers' accounts."
)
