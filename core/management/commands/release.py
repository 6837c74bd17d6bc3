"""`manage.py release`: migrate under the release lock, one host at a time.

The release step of every host (deploy/systemd/shop-release.service, the
Procfile's `release`) runs this instead of a bare `migrate`: Django's
migrations are not safe to run on two hosts at once (both create the same
table; one fails, or both record the same migration). The command takes a
PostgreSQL session advisory lock on the connection `migrate` then uses, so a
second host's release waits, then finds nothing left to migrate
(docs/deployment.md, "The release step"). The lock is the supervisor's setup
lock too (runner/setup_lock.py), so a host under `make run`'s supervisor and
a host's release unit never migrate together either. A release that dies
releases the lock with its connection.
"""

from __future__ import annotations

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections

# "shop" in ASCII: the same key as runner/setup_lock.py's SETUP_LOCK_KEY
# (tests/config/test_release.py checks that they agree).
RELEASE_LOCK_KEY = 0x73686F70


class Command(BaseCommand):
    help = "Migrate the database under the release lock (one host at a time)."
    # `migrate` runs the system checks (its database's too) once the lock is held;
    # call_command would skip them unless told (skip_checks=False below).
    requires_system_checks: list[str] = []

    def handle(self, *args, **options) -> None:
        connection = connections[DEFAULT_DB_ALIAS]
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [RELEASE_LOCK_KEY])
            (held,) = cursor.fetchone()
            if not held:
                self.stderr.write("waiting for the release lock: another host is migrating")
                cursor.execute("SELECT pg_advisory_lock(%s)", [RELEASE_LOCK_KEY])
        try:
            call_command(
                "migrate", interactive=False, verbosity=options["verbosity"], skip_checks=False
            )
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [RELEASE_LOCK_KEY])
