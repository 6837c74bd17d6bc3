"""The model permission each staff action on the catalogue requires.

Named once here (docs/security.md "One permission map"); the API's views
(`core.permissions.staff_with`) and the admin's forms read these names.
"""

from __future__ import annotations

ADD_PRODUCT = "inventory.add_product"
ADJUST_STOCK = "inventory.change_stockitem"

STAFF_ACTIONS = {
    "create a product": ADD_PRODUCT,
    "adjust stock": ADJUST_STOCK,
}
