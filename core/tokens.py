"""Password-reset links timed by the database clock.

Django's `PasswordResetTokenGenerator` stamps a link with the host's clock and
checks its age (`PASSWORD_RESET_TIMEOUT`) against the host's clock again: a
link made on a host ahead looks younger on the others, one made on a host
behind older. Here both readings are the database's clock, which every host
shares (core.db.database_now).
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.tokens import PasswordResetTokenGenerator

from core.db import database_now


class DatabaseClockTokenGenerator(PasswordResetTokenGenerator):
    def _now(self) -> datetime:
        # Naive local time, as Django's own `_now` (datetime.now()) gives it.
        return database_now().astimezone().replace(tzinfo=None)


password_reset_token_generator = DatabaseClockTokenGenerator()
