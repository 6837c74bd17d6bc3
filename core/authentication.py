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

import functools
from dataclasses import dataclass

from django.contrib.auth.models import Group, User
from django.db import connections, router
from django.db.models import Field, Model
from django.utils.crypto import constant_time_compare
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .api_tokens import token_digest, token_lifetime
from .models import ApiToken
from .permissions import COURIER_ATTR, COURIERS_GROUP


@dataclass(frozen=True)
class TokenQuery:
    """The token's one query, its SQL written once per process from the models' tables.

    Every request asks the same question, so the ORM does not build and compile
    it again each time (a select_related join, an `Exists` and an expression
    cost more CPU than the rest of a product read: docs/performance.md, "Where
    the checkout's CPU goes"). The rows become model instances as the ORM
    makes them (`Model.from_db`), the user cached on the token as
    `select_related` caches it. The clock is the database's
    (`STATEMENT_TIMESTAMP()`, what `Now()` compiles to on PostgreSQL).
    """

    sql: str
    token_width: int
    user_width: int

    @classmethod
    @functools.cache
    def build(cls, alias: str) -> TokenQuery:
        quote = connections[alias].ops.quote_name
        memberships = User.groups.through

        def column(model: type[Model], name: str) -> str:
            field = model._meta.get_field(name)
            assert isinstance(field, Field) and field.column
            return quote(field.column)

        columns = [f"t.{column(ApiToken, f.name)}" for f in ApiToken._meta.concrete_fields]
        columns += [f"u.{column(User, f.name)}" for f in User._meta.concrete_fields]
        sql = (
            f"SELECT {', '.join(columns)},"
            f" t.{column(ApiToken, 'created')} <= STATEMENT_TIMESTAMP() - %s AS expired,"
            f" EXISTS (SELECT 1 FROM {quote(memberships._meta.db_table)} m"
            f" JOIN {quote(Group._meta.db_table)} g"
            f" ON g.{column(Group, 'id')} = m.{column(memberships, 'group')}"
            f" WHERE m.{column(memberships, 'user')} = t.{column(ApiToken, 'user')}"
            f" AND g.{column(Group, 'name')} = %s) AS courier"
            f" FROM {quote(ApiToken._meta.db_table)} t"
            f" JOIN {quote(User._meta.db_table)} u"
            f" ON u.{column(User, 'id')} = t.{column(ApiToken, 'user')}"
            f" WHERE t.{column(ApiToken, 'digest')} = %s"
        )
        return cls(
            sql=sql,
            token_width=len(ApiToken._meta.concrete_fields),
            user_width=len(User._meta.concrete_fields),
        )


@dataclass(frozen=True)
class FoundToken:
    """A token row with its user, and what the database said of its age and the role."""

    token: ApiToken
    expired: bool
    courier: bool


def token_find(*, digest: str) -> FoundToken | None:
    """The token stored under `digest` with its user, its expiry and the courier role; one query."""
    alias = router.db_for_read(ApiToken)
    query = TokenQuery.build(alias)
    with connections[alias].cursor() as cursor:
        params: list = [token_lifetime(), COURIERS_GROUP, digest]
        cursor.execute(query.sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    width = query.token_width
    token = ApiToken.from_db(alias, _attnames(ApiToken), row[:width])
    user = User.from_db(alias, _attnames(User), row[width : width + query.user_width])
    ApiToken._meta.get_field("user").set_cached_value(token, user)  # as select_related does
    expired, courier = row[-2:]
    return FoundToken(token=token, expired=expired, courier=courier)


def _attnames(model: type[Model]) -> list[str]:
    return [field.attname for field in model._meta.concrete_fields]


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
        result = token_find(digest=token_digest(key))
        if result is None:
            raise AuthenticationFailed("Invalid token.")
        found = result.token
        if not found.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        if not _password_unchanged(found):
            raise AuthenticationFailed(
                "Token revoked: the password changed since it was issued;"
                " ask POST /api/v1/auth/token/ for a new one."
            )
        if result.expired:
            raise AuthenticationFailed("Token expired: ask POST /api/v1/auth/token/ for a new one.")
        setattr(found.user, COURIER_ATTR, result.courier)
        return (found.user, found)
