"""The model permission each staff action on orders requires.

Named once here (docs/security.md "One permission map"); the API's views
(`core.permissions.staff_with`) and the admin's actions and forms read these
names. An owner acts on their own order without a permission (cancel it, ask
for a return); staff acting on someone else's need the one the action changes.
"""

from __future__ import annotations

REFUND = "orders.refund_order"  # a custom permission: refunds move money
CANCEL = "orders.change_order"
SHIP = "orders.change_order"
RECEIVE_RETURN = "orders.change_returnrequest"
ASK_RETURN = "orders.add_returnrequest"
# Staff posting a tracking event; a courier posts by being in the couriers group.
POST_TRACKING_EVENT = "orders.add_trackingevent"

STAFF_ACTIONS = {
    "refund an order": REFUND,
    "cancel someone else's order": CANCEL,
    "create a shipment": SHIP,
    "mark a return received": RECEIVE_RETURN,
    "ask for a return on someone else's order": ASK_RETURN,
    "post a tracking event (staff)": POST_TRACKING_EVENT,
}
