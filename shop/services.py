"""Writes to shopper accounts."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction

from core.api_tokens import IssuedToken, api_token_issue, api_tokens_revoke
from core.errors import ApplicationError, InvalidRequest
from core.sessions import sessions_end

if TYPE_CHECKING:  # the default user model (AUTH_USER_MODEL is not set)
    from django.contrib.auth.models import User
else:
    User = get_user_model()


class UsernameTaken(ApplicationError):
    status = 409
    code = "username_taken"


class InvalidCredentials(ApplicationError):
    status = 400
    code = "invalid_credentials"
    title = "Invalid credentials"


@transaction.atomic
def user_register(*, username: str, email: str, password: str) -> tuple[User, IssuedToken]:
    """Create a shopper account and its API token; staff are made with createsuperuser."""
    candidate = User(username=username, email=email)
    try:
        validate_password(password, user=candidate)
    except DjangoValidationError as exc:
        raise InvalidRequest(
            "The password is too weak.", errors={"password": list(exc.messages)}
        ) from exc
    candidate.set_password(password)
    try:
        with transaction.atomic():
            candidate.save(force_insert=True)
    except IntegrityError as exc:
        raise UsernameTaken(f"The username {username!r} is taken.") from exc
    return candidate, api_token_issue(user=candidate)


def token_obtain(*, user: User | None) -> IssuedToken:
    """A new API token for an authenticated user: each log-in (each device) its own.

    Earlier tokens stay valid until they expire or are revoked (docs/security.md,
    "API tokens"); the purge deletes the expired rows.
    """
    if user is None or not user.is_active:
        raise InvalidCredentials("Unable to log in with the provided credentials.")
    return api_token_issue(user=user)


@transaction.atomic
def user_anonymise(*, user: User) -> User:
    """Delete a shopper's personal data but keep the account row.

    Orders and payments reference the user with PROTECT: they are business
    records and stay, pointing at an anonymous, inactive user.
    """
    user.username = f"deleted-{uuid.uuid4().hex}"
    user.email = ""
    user.first_name = ""
    user.last_name = ""
    user.is_active = False
    user.set_unusable_password()
    user.save()
    # The new unusable password already ends every token (core/authentication.py);
    # the rows go too, and the sessions (the one asking is logged out by the view).
    user_log_out_everywhere(user=user)
    return user


@transaction.atomic
def user_log_out_everywhere(*, user: User) -> User:
    """Delete every API token and every session of `user` ("Log out everywhere").

    Sessions are found by their `user_id` column (core/models.py::Session). A
    request of another device that saves its session after this finds the row
    gone and is refused (Django's `SessionInterrupted`), never recreates it.
    """
    api_tokens_revoke(user=user)
    sessions_end(user_id=user.pk)
    return user


@transaction.atomic
def user_email_change(*, user: User, email: str) -> User:
    """Set a shopper's e-mail address (validated by the form: the address and their password).

    One UPDATE of the one column: a concurrent change of anything else on the
    row (a password change in another tab) is not overwritten.
    """
    User.objects.filter(pk=user.pk).update(email=email)
    user.email = email
    return user
