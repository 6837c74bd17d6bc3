"""Roles shared by every app: shoppers, staff and couriers."""

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


class IsStaff(BasePermission):
    """Allow staff users only."""

    message = "Only staff may do this."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class IsCourierOrStaff(BasePermission):
    """Allow couriers and staff."""

    message = "Only couriers and staff may do this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and (user.is_staff or is_courier(user)))


class IsNotCourier(BasePermission):
    """Refuse couriers who are not staff: the contract lets them only post tracking events.

    Staff pass without a query; anyone else costs one indexed look-up of the group,
    unless token authentication read it with the token (then none).
    """

    message = "Couriers may only post tracking events."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and (user.is_staff or not is_courier(user)))
