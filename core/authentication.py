"""API tokens that expire (docs/security.md, "API tokens").

A token older than `API_TOKEN_LIFETIME` seconds, judged by the database's
clock like every other age in the shop, no longer authenticates: 401
`not_authenticated` with a problem body saying it expired. Asking
`POST /api/v1/auth/token/` again gives a new one (shop/services.py::token_obtain).
Expired tokens are deleted by beat's `core.purge_expired_tokens`
(`tokens_purge_expired`; docs/operations.md, "Retention").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q
from django.db.models.functions import Now
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .permissions import COURIER_ATTR, COURIERS_GROUP


def token_lifetime() -> timedelta:
    return timedelta(seconds=settings.API_TOKEN_LIFETIME)


def expired_tokens(model):
    """The tokens of `model` older than the lifetime by the database clock."""
    return model.objects.filter(created__lte=Now() - token_lifetime())


def tokens_purge_expired(*, batch: int | None = None, max_batches: int | None = None) -> int:
    """Delete the API tokens past their lifetime (database clock), in bounded batches.

    Each batch its own short transaction, skipping rows another purge holds;
    return how many were deleted.
    """
    from rest_framework.authtoken.models import Token

    batch = batch or settings.API_TOKEN_PURGE_BATCH
    max_batches = max_batches or settings.API_TOKEN_PURGE_MAX_BATCHES
    total = 0
    for _ in range(max_batches):
        with transaction.atomic():
            keys = list(
                expired_tokens(Token)
                .select_for_update(skip_locked=True)
                .order_by("created")
                .values_list("pk", flat=True)[:batch]
            )
            total += Token.objects.filter(pk__in=keys).delete()[0]
        if len(keys) < batch:
            break
    return total


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF's token authentication, with the token's age checked in the same query.

    The same query says whether the user is a courier (core.permissions reads
    it instead of a query of its own): the role as of this request's start.
    """

    def authenticate_credentials(self, key):
        model: Any = self.get_model()  # DRF's Token (or a subclass's `model`)
        expired = ExpressionWrapper(
            Q(created__lte=Now() - token_lifetime()), output_field=BooleanField()
        )
        courier = Exists(Group.objects.filter(user=OuterRef("user_id"), name=COURIERS_GROUP))
        found = (
            model.objects.select_related("user")
            .annotate(expired=expired, courier=courier)
            .filter(key=key)
            .first()
        )
        if found is None:
            raise AuthenticationFailed("Invalid token.")
        if not found.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        if found.expired:
            raise AuthenticationFailed("Token expired: ask POST /api/v1/auth/token/ for a new one.")
        setattr(found.user, COURIER_ATTR, found.courier)
        return (found.user, found)
