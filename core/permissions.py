"""Roles shared by every app: shoppers, staff and couriers; the model permission of a staff action.

Each staff action requires the model permission it changes, in the API as in
the admin (docs/security.md "One permission map"): each app names its actions'
permissions once (`orders.permissions`, `inventory.permissions`,
`reports.permissions`), and its API views and admin read those names.
`staff_with(...)` makes the DRF permission class of a view; it is checked in
DRF's `initial()`, before the request key is read, so a refusal stores nothing.
"""

import functools

from rest_framework.permissions import BasePermission

COURIERS_GROUP = "couriers"
# Set on a user by token authentication, read in the token's own query
# (core.authentication): the role check then costs no query of its own.
COURIER_ATTR = "in_couriers_group"


def is_courier(user) -> bool:
    if not (user and user.is_authenticated):
        return False
    known = getattr(user, COURIER_ATTR, None)
    if known is not None:
        return known
    return user.groups.filter(name=COURIERS_GROUP).exists()


class StaffWith(BasePermission):
    """Staff holding every model permission in `required` (a class made by `staff_with`)."""

    required: tuple[str, ...] = ()
    message = "Only staff with the permission this action changes may do this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(
            user and user.is_authenticated and user.is_staff and user.has_perms(self.required)
        )


@functools.cache  # one class per permission set, however often a view asks
def staff_with(*required: str) -> type[StaffWith]:
    """The permission class of a staff action: `staff_with(permissions.REFUND)`."""
    return type(f"StaffWith({', '.join(required)})", (StaffWith,), {"required": required})


class OwnerOrStaffWith(BasePermission):
    """On an object with an `owner_id`: its owner, or staff holding `required`.

    An object-level check (the view calls `check_object_permissions` with the
    object it found, before claiming the request key): a shopper acts on their
    own order with no model permission; staff acting on someone else's need
    the one the action changes.
    """

    required: tuple[str, ...] = ()
    message = "Only the owner, or staff with the permission this action changes, may do this."

    def has_object_permission(self, request, view, obj) -> bool:
        user = request.user
        if getattr(obj, "owner_id", None) == user.pk:
            return True
        return bool(user.is_staff and user.has_perms(self.required))


@functools.cache
def owner_or_staff_with(*required: str) -> type[OwnerOrStaffWith]:
    """The object permission class of an action an owner may take and staff need `required` for."""
    name = f"OwnerOrStaffWith({', '.join(required)})"
    return type(name, (OwnerOrStaffWith,), {"required": required})


class IsCourierOrStaff(BasePermission):
    """Allow couriers (by their group) and staff holding `required` (model permissions)."""

    message = "Only couriers, and staff with the permission this action changes, may do this."

    def __init__(self, *required: str) -> None:
        self.required = required

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if user.is_staff and user.has_perms(self.required):
            return True
        return is_courier(user)


class IsNotCourier(BasePermission):
    """Refuse couriers who are not staff: the contract lets them only post tracking events.

    Staff pass without a query; anyone else costs one indexed look-up of the group,
    unless token authentication read it with the token (then none).
    """

    message = "Couriers may only post tracking events."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and (user.is_staff or not is_courier(user)))
