"""API tokens: hashed, expiring, revoked with the password (docs/security.md, "API tokens").

`Authorization: Token <token>` is looked up by the token's SHA-256 (the table
holds nothing else of it: core/api_tokens.py). One query finds the row, its
user, whether it is older than `API_TOKEN_LIFETIME` by the database clock,
like every other age in the shop, and whether the user is a courier. A token
whose `auth_hash` no longer matches the user's (the password was changed or
reset since it was issued) or whose age is past the lifetime answers 401
`not_authenticated` with a problem body saying why; `POST /api/v1/auth/token/`
gives a new one (shop/services.py::token_obtain).
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q
from django.db.models.functions import Now
from django.utils.crypto import constant_time_compare
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .api_tokens import token_digest, token_lifetime
from .models import ApiToken
from .permissions import COURIER_ATTR, COURIERS_GROUP


def _password_unchanged(token: ApiToken) -> bool:
    """The user's session auth hash still the one the token was issued with.

    The fallback secrets count too (`SECRET_KEY_FALLBACKS`), as for sessions:
    rotating the secret key does not end the tokens before their fallback goes.
    """
    user = token.user
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(token.auth_hash, current) for current in hashes)


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF's `Token` header, with the token found by its digest and judged in one query.

    The same query says whether the user is a courier (core.permissions reads
    it instead of a query of its own): the role as of this request's start.
    """

    model = ApiToken

    def authenticate_credentials(self, key):
        expired = ExpressionWrapper(
            Q(created__lte=Now() - token_lifetime()), output_field=BooleanField()
        )
        courier = Exists(Group.objects.filter(user=OuterRef("user_id"), name=COURIERS_GROUP))
        found = (
            ApiToken.objects.select_related("user")
            .annotate(expired=expired, courier=courier)
            .filter(digest=token_digest(key))
            .first()
        )
        if found is None:
            raise AuthenticationFailed("Invalid token.")
        if not found.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        if not _password_unchanged(found):
            raise AuthenticationFailed(
                "Token revoked: the password changed since it was issued;"
                " ask POST /api/v1/auth/token/ for a new one."
            )
        if found.expired:
            raise AuthenticationFailed("Token expired: ask POST /api/v1/auth/token/ for a new one.")
        setattr(found.user, COURIER_ATTR, found.courier)
        return (found.user, found)
