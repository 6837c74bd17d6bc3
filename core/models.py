"""The rows every app's users share: API tokens and sessions (docs/security.md, "API tokens").

An API token is stored as the SHA-256 of the token a client holds, so a copy
of the table authenticates nobody; the session model is Django's with the
user's id in a column of its own, so that "Log out everywhere" finds a user's
sessions with an index instead of decoding every session.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.sessions.base_session import AbstractBaseSession
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _


class ApiToken(models.Model):
    """One log-in through `POST /api/v1/auth/token/` (or a sign-up): one device's token.

    `digest` is the SHA-256 (hex) of the token the client was given; the token
    itself is never stored (core/api_tokens.py). `auth_hash` is the user's
    session auth hash when the token was issued (Django's HMAC of the password
    hash, the one Django checks sessions against): a changed or reset password
    no longer matches it, whatever path changed it. `created` is the database
    clock's; the lifetime is judged against it (`API_TOKEN_LIFETIME`).
    """

    digest = models.CharField(max_length=64, primary_key=True, verbose_name=_("digest"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_tokens",
        verbose_name=_("user"),
    )
    auth_hash = models.CharField(max_length=128, verbose_name=_("auth hash"))
    created = models.DateTimeField(db_default=Now(), verbose_name=_("created"))

    class Meta:
        verbose_name = _("api token")
        verbose_name_plural = _("api tokens")
        indexes = [models.Index(fields=["created"], name="core_apitoken_created")]

    def __str__(self) -> str:
        return gettext("API token of user {user} ({digest}…)").format(
            user=self.user_id, digest=self.digest[:8]
        )


class Session(AbstractBaseSession):
    """Django's database session with the logged-in user's id beside it (core/sessions.py).

    `user_id` is the session's `_auth_user_id` as of its last save (none for a
    guest's session): no foreign key, so a session saved as its user is being
    deleted never fails; the index is what "Log out everywhere" reads.
    """

    user_id = models.BigIntegerField(
        null=True, blank=True, db_index=True, verbose_name=_("user id")
    )

    class Meta(AbstractBaseSession.Meta):
        db_table = "core_session"
