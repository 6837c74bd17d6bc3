"""Statuses in words, for the storefront's pages (the contract's values stay in the API).

Words follow docs/glossary.md: an order is confirmed, a payment captured or
declined, a reservation held until it expires, a shipment tracked by the
courier's tracking events.
"""

from __future__ import annotations

ORDER_STATUS = {
    "awaiting_decision": "Waiting for your decision",
    "payment_pending": "Payment pending",
    "confirmed": "Confirmed",
    "partially_confirmed": "Partially confirmed",
    "payment_failed": "Payment declined",
    "cancelling": "Being cancelled",
    "cancelled": "Cancelled",
    "expired": "Reservation expired",
}

ORDER_STATUS_HINT = {
    "awaiting_decision": "Some items are short. The available ones are held for you: "
    "confirm them or cancel the order.",
    "payment_pending": "We are waiting for the payment provider's answer. Nothing will be "
    "charged twice.",
    "confirmed": "Thank you! Your payment was captured; your items will ship soon.",
    "partially_confirmed": "We confirmed and charged the items that were available; the "
    "others were not charged.",
    "payment_failed": "Your card was declined. Nothing was charged and the items were released.",
    "cancelling": "The order is being cancelled; any payment will be refunded.",
    "cancelled": "This order was cancelled. Nothing more will be charged.",
    "expired": "You did not decide in time, so the held items were released. Nothing was charged.",
}

LINE_STATUS = {
    "reserved": "Held for you",
    "confirmed": "Confirmed",
    "unavailable": "Unavailable",
    "released": "Released",
    "cancelled": "Cancelled",
}

PAYMENT_STATUS = {
    "none": "No payment taken",
    "pending": "Pending",
    "captured": "Captured",
    "partially_refunded": "Partially refunded",
    "refunded": "Refunded",
    "failed": "Declined",
}

FULFILLMENT = {
    "unfulfilled": "Not shipped yet",
    "partially_shipped": "Partially shipped",
    "shipped": "Shipped",
}

TRACKING_STATUS = {
    "label_created": "Label created",
    "picked_up": "Picked up",
    "in_transit": "In transit",
    "out_for_delivery": "Out for delivery",
    "delivered": "Delivered",
    "exception": "Delivery problem",
}

RETURN_STATUS = {
    "requested": "Requested: send the items back",
    "processing": "Received: being refunded",
    "completed": "Completed: refunded",
    "needs_attention": "Received: our staff are looking into it",
}

STEP_NAME = {
    "restock": "Items back in stock",
    "refund": "Refund",
    "history": "Purchase history updated",
    "loyalty": "Points adjusted",
    "notify": "Email sent",
}

STEP_STATUS = {
    "pending": "Waiting",
    "running": "In progress",
    "done": "Done",
    "failed": "Delayed: our staff are looking into it",
}

REFUND_STATUS = {
    "pending": "On its way",
    "succeeded": "Refunded",
    "failed": "Not refunded",
    "needs_attention": "Delayed: our staff are looking into it",
}

REFUND_ORIGIN = {
    "goodwill": "Goodwill refund",
    "return": "Return",
    "cancellation": "Cancelled order",
}

PROBLEMS = {
    "insufficient_stock": "Some items are not in stock in the quantity you asked for. "
    "Check the availability below, change your cart or choose what to do if some items "
    "are short, then place the order again.",
    "price_changed": "Prices changed since you opened this page. Check the new total, then "
    "place the order again.",
    "cart_changed": "Your cart changed since this page was shown (in another tab?). Check it, "
    "then place the order again.",
    "reservation_expired": "The reservation expired before you confirmed, so nothing was charged.",
    "payment_declined": "The payment was declined; nothing was charged.",
    "payment_pending": "The payment's outcome is not known yet; try again once it is.",
    "invalid_state": "This order cannot be changed that way any more.",
    "return_exceeds_order": "You asked to return more than was shipped and is not already "
    "returned or in another return. Check the quantities below.",
    "line_not_shipped": "Only shipped items can be returned; an item you chose has not shipped.",
}


def words(table: dict[str, str], value: str) -> str:
    return table.get(value, value.replace("_", " ").capitalize())


# A keyed form the request-key machinery refused (idempotency.views.form_refusal):
# the shopper is pointed at their orders, where the first submission's result shows.
FORM_REFUSALS = {
    "idempotency_key_in_use": "This form is being sent already. Wait a moment, then open "
    "your orders to see the result.",
    "idempotency_key_reused": "This form was already sent with other details. Your orders "
    "show what became of it; open the form again to start over.",
    "idempotency_key_missing": "This form is out of date. Open it again and resend it.",
    "idempotency_key_invalid": "This form is out of date. Open it again and resend it.",
}


# The storefront's answer to a courier on a page that changes something (views.common).
COURIER_REFUSAL = (
    "Couriers may only post tracking events, so nothing was changed. Shopping, returns and "
    "account changes are for shoppers' accounts."
)
