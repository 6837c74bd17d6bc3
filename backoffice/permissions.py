"""The one permission map: every staff action and the model permission it changes.

Each app names its own actions' permissions (`orders.permissions`,
`inventory.permissions`, `reports.permissions`); this gathers them for what
looks at all of them at once: the documentation's table (docs/security.md
"One permission map", held to this by tests/security/test_route_roles.py)
and the tools that make a staff user who may do everything.
"""

from __future__ import annotations

from inventory import permissions as inventory
from orders import permissions as orders
from reports import permissions as reports

STAFF_ACTIONS: dict[str, str] = {
    **orders.STAFF_ACTIONS,
    **inventory.STAFF_ACTIONS,
    **reports.STAFF_ACTIONS,
}


def staff_permissions() -> set[str]:
    """Every model permission some staff action requires (`app_label.codename`)."""
    return set(STAFF_ACTIONS.values())
