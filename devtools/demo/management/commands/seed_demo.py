import os

from django.core.management.base import BaseCommand, CommandError

from devtools.demo.seeding import DEMO_USERS, demo_orders, demo_seed


class Command(BaseCommand):
    help = "Load the demo catalog and one user per role; a second run creates nothing."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--demo",
            action="store_true",
            help="yes, load demo users with published passwords into this database",
        )

    def handle(self, *args, **options) -> None:
        # Demo users have published passwords (a superuser among them): never
        # on a database by accident. The run command sets SHOP_DEMO=1 for its
        # embedded PostgreSQL (runner/supervisor.py::demo_wanted).
        if not (options["demo"] or os.environ.get("SHOP_DEMO") == "1"):
            raise CommandError(
                "seed_demo loads users with published passwords: pass --demo or set "
                "SHOP_DEMO=1 to load them into this database"
            )
        seed = demo_seed()
        if seed.created_anything:
            self.stdout.write(
                f"Demo data: created {len(seed.products_created)} products and "
                f"{len(seed.users_created)} users "
                f"({len(seed.products_existing) + len(seed.users_existing)} already there)."
            )
        else:
            self.stdout.write("Demo data: already there, created nothing new.")
        placed = demo_orders()
        if placed:
            self.stdout.write("Demo orders of the shopper:")
            for line in placed:
                self.stdout.write(f"  {line}")
        self.stdout.write("Demo users (username / password):")
        for user in DEMO_USERS:
            note = "" if user.username in seed.users_created else "  (existing user, left as is)"
            self.stdout.write(f"  {user.username:<8} / {user.password:<13} {user.role}{note}")
        self.stdout.write(
            "API token: POST /api/v1/auth/token/ with "
            '{"username": "shopper", "password": "shopper-demo"}'
        )
