"""API tokens: issued per log-in, stored hashed, revoked with the password (docs/security.md).

A client holds 40 random hexadecimal characters (160 bits, the shape DRF's
tokens had, so `Authorization: Token <token>` and the log masks stay). The
table holds their SHA-256 only: a secret this random needs no salt or slow
hash (nobody can guess one to test against a digest), and the digest is the
primary key, so a request finds its token with one index look-up.

Each log-in inserts a new row (one per device); a token ends when its age by
the database clock passes `API_TOKEN_LIFETIME`, when the user's password
hash changes (the row's `auth_hash` no longer matches: core/authentication.py),
or when its row is deleted (account deletion, "Log out everywhere").
`api_tokens_purge` deletes the rows past their lifetime.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from .db import delete_in_batches
from .models import ApiToken

if TYPE_CHECKING:  # the default user model (AUTH_USER_MODEL is not set)
    from django.contrib.auth.models import User


def token_lifetime() -> timedelta:
    return timedelta(seconds=settings.API_TOKEN_LIFETIME)


def token_digest(token: str) -> str:
    """The stored form of a token: its SHA-256 in hexadecimal."""
    return hashlib.sha256(token.encode()).hexdigest()


def expired_tokens() -> QuerySet[ApiToken]:
    """The tokens older than the lifetime by the database clock."""
    return ApiToken.objects.filter(created__lte=Now() - token_lifetime())


@dataclass(frozen=True)
class IssuedToken:
    """A token as given to a client, once: `key` is the text (the name DRF's tokens
    had), `row` the stored row, which holds only its digest."""

    key: str
    row: ApiToken


@transaction.atomic
def api_token_issue(*, user: User) -> IssuedToken:
    """Insert a new token row for `user` and return the token (never stored as given)."""
    key = secrets.token_hex(20)
    row = ApiToken.objects.create(
        digest=token_digest(key), user=user, auth_hash=user.get_session_auth_hash()
    )
    return IssuedToken(key=key, row=row)


@transaction.atomic
def api_tokens_revoke(*, user: User) -> int:
    """Delete every token of `user` (account deletion, "Log out everywhere"); how many."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    return deleted


def api_tokens_purge(*, batch: int = 1000, max_batches: int = 100) -> int:
    """Delete the token rows past `API_TOKEN_LIFETIME` (database clock), in bounded batches.

    A token past its lifetime authenticates nobody (core/authentication.py):
    its row is only growth. Returns how many rows went.
    """
    return delete_in_batches(
        "WITH old AS (SELECT digest FROM core_apitoken"
        " WHERE created <= now() - make_interval(secs => %s)"
        " ORDER BY created LIMIT %s FOR UPDATE SKIP LOCKED)"
        " DELETE FROM core_apitoken t USING old WHERE t.digest = old.digest",
        [float(settings.API_TOKEN_LIFETIME)],
        batch=batch,
        max_batches=max_batches,
    )


def api_tokens_of(keys: list[str]) -> QuerySet[ApiToken]:
    """The rows of the tokens as given to clients (found by their digests)."""
    return ApiToken.objects.filter(digest__in=[token_digest(key) for key in keys])
